"""DINOv3 ViT: patch centres normalised to [-1, 1] (randomly shifted, jittered and rescaled in training), angle
``2π · c · f`` with the same ``f_j = θ^(-4j/D)`` for rows and columns; the cls and register tokens are not rotated."""
from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from .base import VisionAdapter, split_axes


class DINOv3Adapter(VisionAdapter):
    name = "dinov3_vit"
    rotary_classes = ("DINOv3ViTRopePositionEmbedding",)
    attention_classes = ("DINOv3ViTAttention",)
    rotary_params = ("pixel_values",)

    def base(self, rotary: nn.Module) -> float:
        return float(rotary.base)

    def coords(self, rotary: nn.Module, pixel_values: torch.Tensor):
        from transformers.models.dinov3_vit import modeling_dinov3_vit as m

        config = rotary.config
        ph, pw = config.patch_size if isinstance(config.patch_size, Iterable) else (config.patch_size,) * 2
        h, w = pixel_values.shape[-2] // ph, pixel_values.shape[-1] // pw
        c = m.get_patches_center_coordinates(h, w, dtype=torch.float32, device=pixel_values.device)
        if rotary.training:
            c = m.augment_patches_center_coordinates(
                c, shift=config.pos_embed_shift, jitter=config.pos_embed_jitter, rescale=config.pos_embed_rescale)
        # the stock angle is (2π·c)·f: fold 2π into the coordinates, so W holds the model's own inv_freq
        return 2 * math.pi * c, pixel_values

    def stock_frequencies(self, rotary: nn.Module) -> torch.Tensor:
        return split_axes(rotary.inv_freq, rotary.inv_freq)
