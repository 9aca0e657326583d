"""Pixtral's vision encoder: integer (row, col) patch indices per image; rows turn with the even-indexed
frequencies ``θ^(-4j/D)``, columns with the odd-indexed ``θ^(-(4j+2)/D)`` (half-split channels)."""
from __future__ import annotations

import torch
from torch import nn

from .base import VisionAdapter, split_axes


class PixtralAdapter(VisionAdapter):
    name = "pixtral"
    rotary_classes = ("PixtralVisionRotaryEmbedding",)
    attention_classes = ("PixtralAttention",)
    rotary_params = ("x", "position_ids")

    def coords(self, rotary: nn.Module, x: torch.Tensor, position_ids: torch.Tensor):
        return position_ids.float(), x

    def stock_frequencies(self, rotary: nn.Module) -> torch.Tensor:
        h, w = rotary.inv_freq.chunk(2)
        return split_axes(h, w)
