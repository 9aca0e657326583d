"""Kimi K2.5 (``kimi_k25``): a MoonViT tower over each image's own patch grid, merged ``merge_kernel_size`` (2 × 2)
into tokens, in a DeepSeek-V3 language model (1-D RoPE on the ``qk_rope_head_dim`` part of each head).

How the model fills the tokens (``Kimi_K25VisionModel``): an image of ``image_grid_thw`` ``(1, h, w)`` patches
becomes an ``h / kh × w / kw`` grid (each token a ``kh × kw`` window), row by row; a video chunk (a row of
``video_grid_thw``, ``t`` frames) is averaged over its frames into one such grid. The processor writes an image as
its tokens alone, and each video chunk as a timestamp, ``<|media_begin|>video<|media_content|>``, the chunk's tokens,
``<|media_end|>``. ropekit places each image, and each video chunk (as a one-frame video block), as a block of its
own grid; the grids are read from ``image_grid_thw`` / ``video_grid_thw`` (the encoded features carry only token
counts).

Rotation: the language model rotates only the ``qk_rope_head_dim`` channels of each head (its config's
``head_dim``), with rotate-half tables; with ``rope_interleave`` it reorders those channels before rotating, which
leaves the tables' layout as it is.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .base import partial_rotary_dim
from .llava import Llava, encoded_images, place_items


class KimiK25(Llava):
    model_type = "kimi_k25"
    name = "Kimi K2.5"
    forward_params = frozenset({"image_grid_thw", "video_grid_thw"})

    def check(self, inner: nn.Module) -> None:
        self.kernel(inner.config)

    def kernel(self, config: Any) -> tuple[int, int]:
        k = tuple(getattr(config.vision_config, "merge_kernel_size", ()) or ())
        if len(k) != 2 or not all(isinstance(v, int) and v >= 1 for v in k):
            raise ValueError(f"patch_model: Kimi K2.5's merge_kernel_size {k!r}; two ints >= 1 are the window each "
                             f"image token holds")
        return int(k[0]), int(k[1])

    def rotary_dim(self, text: nn.Module) -> int:
        return partial_rotary_dim(text)  # qk_rope_head_dim, the config's head_dim

    def vision_inputs(self, inner: nn.Module, types: torch.Tensor, kwargs: dict) -> tuple[torch.Tensor, Any, Any]:
        encoded = kwargs.get("mm_encoder_outputs") or {}
        kh, kw = self.kernel(inner.config)
        found = []
        for kind, what, pixels, enc in ((1, "image", "pixel_values", encoded_images(kwargs)),
                                        (2, "video", "pixel_values_videos", encoded.get("video"))):
            items = None
            if kwargs.get(pixels) is not None or enc is not None:
                grids = kwargs.get(f"{what}_grid_thw")
                if grids is None:
                    raise ValueError(
                        f"patched Kimi K2.5: {what}s were given without `{what}_grid_thw`; pass the processor's (it "
                        f"decides each {what}'s token grid; encoded features carry only token counts)"
                    )
                items = []
                for i, (t, h, w) in enumerate(torch.as_tensor(grids).reshape(-1, 3).tolist()):
                    if h % kh or w % kw:
                        raise ValueError(f"patched Kimi K2.5: {what} {i} of {h} x {w} patches is no whole number of "
                                         f"{kh} x {kw} windows (merge_kernel_size)")
                    items.append([(1, h // kh, w // kw)])
            types, g = place_items(types, kind, items, what)
            found.append(g)
        return types, found[0], found[1]
