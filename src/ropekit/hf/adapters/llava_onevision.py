"""LLaVA-OneVision, base-grid images only: in a sample with several images each image is the vision
tower's base grid (``image_size / patch_size`` per side) followed by one newline token, placed as text.

A single image per sample is tiled ("anyres": the base grid, then the unpadded tiles with a newline token
per row, possibly resized), and videos are pooled frame grids; neither is placed by this adapter, so they
are refused with a ValueError rather than placed as something they are not.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .llava import Llava, image_runs


class LlavaOnevision(Llava):
    model_type = "llava_onevision"

    def vision_inputs(self, inner: nn.Module, types: torch.Tensor, kwargs: dict) -> tuple[torch.Tensor, Any]:
        encoded = kwargs.get("mm_encoder_outputs") or {}
        if kwargs.get("pixel_values_videos") is not None or encoded.get("video") is not None:
            raise ValueError(
                "patched LLaVA-OneVision: videos are not supported (their pooled frame grids are not placed); "
                "patch a Qwen-VL model for video, or run the stock model"
            )
        types = types.masked_fill(types == 2, 0)  # video token ids without videos are text, as in the stock model
        if kwargs.get("pixel_values") is None and encoded.get("image") is None:
            return torch.zeros_like(types), None
        self._check_base_grids(inner, kwargs, encoded.get("image"))
        strategy = kwargs.get("vision_feature_select_strategy") or inner.config.vision_feature_select_strategy
        side, cls = self.grid(inner.config, strategy)
        return image_runs(types, side, cls, newline=1)

    def _check_base_grids(self, inner: nn.Module, kwargs: dict, encoded: Any) -> None:
        """Refuse tiled (anyres) images: the model tiles every image of a sample holding only one."""
        message = (
            "patched LLaVA-OneVision: only base-grid images are supported (samples with several images, "
            "`batch_num_images` > 1 each); a single image per sample is tiled (anyres), which is not placed"
        )
        if encoded is not None:
            side, cls = self.grid(inner.config, kwargs.get("vision_feature_select_strategy")
                                     or inner.config.vision_feature_select_strategy)
            if any(f.shape[0] != side * side + cls + 1 for f in encoded.pooler_output):
                raise ValueError(message)
            return
        counts = kwargs.get("batch_num_images")
        if counts is None or any(int(n) == 1 for n in torch.as_tensor(counts).reshape(-1)):
            raise ValueError(message)
