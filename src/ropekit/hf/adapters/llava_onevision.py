"""LLaVA-OneVision: LLaVA-NeXT's tiled images and pooled videos, with three differences in how the model
fills the tokens (transformers' ``get_image_features`` / ``get_video_features``).

- Only a sample's single image is tiled (``batch_num_images`` of 1, or no ``batch_num_images`` at all);
  in a sample with several images each image is the base view alone followed by one newline feature,
  placed as a text token after its grid.
- The high-resolution view is shrunk (bilinear) when it holds more than ``1.1² · N`` base views' worth of
  patches, ``N`` from the config's ``vision_aspect_ratio`` ``"anyres_max_N"``; the grid placed is the
  shrunk one. (The model's forward reads ``vision_aspect_ratio`` from its config only.)
- A video's frames are pooled to ``ceil(s / 2)`` per side, and one newline feature follows the frames of
  each video: placed as a text token after the video's block.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .llava import Llava
from .llava_next import LlavaNext


class LlavaOnevision(LlavaNext):
    model_type = "llava_onevision"
    name = "LLaVA-OneVision"
    video_newline = 1

    def check(self, inner: nn.Module) -> None:
        Llava.check(self, inner)  # base-view images may keep a CLS feature; tiles are checked when they come

    def tiled(self, kwargs: dict, count: int) -> list[bool]:
        per_sample = kwargs.get("batch_num_images")
        if per_sample is None:
            return [True] * count
        per_sample = [int(n) for n in torch.as_tensor(per_sample).reshape(-1)]
        flags = [n == 1 for n in per_sample for _ in range(n)]
        if len(flags) != count:
            raise ValueError(
                f"patched {self.name}: `batch_num_images` {per_sample} counts {len(flags)} images but `image_sizes` "
                f"holds {count}; give one count per sample, summing to the number of images"
            )
        return flags

    def shrink(self, config: Any, rows: int, cols: int, side: int) -> tuple[int, int]:
        spec = config.vision_aspect_ratio
        try:
            most = int(str(spec).strip("anyres_max_"))  # how transformers reads "anyres_max_N"
            if most < 1:
                raise ValueError
        except ValueError:
            raise ValueError(
                f"patch_model: config.vision_aspect_ratio must look like 'anyres_max_9', got {spec!r}"
            ) from None
        ratio = math.sqrt(rows * cols / (most * side ** 2))
        if ratio > 1.1:
            return int(rows // ratio), int(cols // ratio)
        return rows, cols

    def pooled_side(self, config: Any, side: int) -> int:
        return math.ceil(side / 2)
