"""Qwen2-VL / Qwen2.5-VL vision tower: integer (h, w) patch indices laid out block-major over the spatial-merge
windows; rows and columns share ``f_j = θ^(-4j/D)`` (half-split channels). Qwen2.5-VL reorders the tokens
(and the position embeddings) into attention windows with ``permute_input_for_window_attn``."""
from __future__ import annotations

import torch
from torch import nn

from .base import VisionAdapter, split_axes


class Qwen2VLVisionAdapter(VisionAdapter):
    name = "qwen2_vl"
    rotary_classes = ("Qwen2VLVisionRotaryEmbedding",)
    attention_classes = ("VisionAttention",)
    rotary_params = ("x", "position_ids")
    fused_qkv = True

    def coords(self, rotary: nn.Module, x: torch.Tensor, position_ids: torch.Tensor):
        return position_ids.float(), x.new_empty((), dtype=torch.float32)  # stock cos/sin are float32

    def stock_frequencies(self, rotary: nn.Module) -> torch.Tensor:
        return split_axes(rotary.inv_freq, rotary.inv_freq)


class Qwen25VLVisionAdapter(Qwen2VLVisionAdapter):
    name = "qwen2_5_vl"
    rotary_classes = ("Qwen2_5_VLVisionRotaryEmbedding",)
    attention_classes = ("Qwen2_5_VLVisionAttention",)

    def extra_hooks(self) -> tuple[str, ...]:
        return ("permute_input_for_window_attn",)
