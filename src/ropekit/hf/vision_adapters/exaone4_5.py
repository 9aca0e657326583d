"""EXAONE 4.5's vision tower: Qwen2.5-VL's (integer (row, column) patch indices in spatial-merge windows,
reordered into attention windows, rows and columns sharing ``θ^(-4j/D)``), with grouped-query attention: its
fused ``qkv`` projection holds the query heads, then fewer key and value heads."""
from __future__ import annotations

from torch import nn

from .qwen2_vl import Qwen25VLVisionAdapter


class Exaone45VisionAdapter(Qwen25VLVisionAdapter):
    name = "exaone4_5"
    rotary_classes = ("Exaone4_5_VisionRotaryEmbedding",)
    attention_classes = ("Exaone4_5_VisionAttention",)

    def num_kv_heads(self, attention: nn.Module) -> int:
        return attention.num_key_value_heads
