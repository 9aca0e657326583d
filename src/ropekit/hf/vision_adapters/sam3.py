"""SAM 3's ViT backbone: every layer has its own rotary, whose (x, y) patch positions the config fixes:
windowed layers the (column, row) inside a ``window_size`` window, global layers the image's (column, row)
scaled by ``window_size / grid`` (so they span a window's range). Pairs are adjacent channels (2j, 2j + 1);
the first D/4 pairs turn with the column, the rest with the row, both at ``θ^(-4j/D)``. Tokens arrive as
``(B, H, W, C)`` maps (windows for windowed layers)."""
from __future__ import annotations

import torch
from torch import nn

from .base import COORDS_ATTR, VisionAdapter


class Sam3ViTAdapter(VisionAdapter):
    name = "sam3_vit"
    rotary_classes = ("Sam3ViTRotaryEmbedding",)
    attention_classes = ("Sam3ViTRoPEAttention",)
    rotary_params = ("x", "position_ids")
    rotary_per_layer = True
    stock_channels = "interleaved"

    def num_heads(self, attention: nn.Module) -> int:
        return attention.num_attention_heads

    def coords(self, rotary: nn.Module, x: torch.Tensor, position_ids: torch.Tensor):
        return position_ids.flip(-1).float(), position_ids.new_empty((), dtype=torch.float32)  # (row, column)

    def identity(self, coords: torch.Tensor, like: torch.Tensor, head_dim: int):
        shape = (1, coords.shape[0], head_dim)  # the stock tables are (1, P, D)
        cos = torch.ones(shape, dtype=like.dtype, device=like.device)
        setattr(cos, COORDS_ATTR, coords)
        return cos, torch.zeros(shape, dtype=like.dtype, device=like.device)

    def stock_frequencies(self, rotary: nn.Module) -> torch.Tensor:
        n = rotary.inv_freq.numel()
        W = torch.zeros(2, 2 * n, dtype=torch.float32)
        W[1, :n] = rotary.inv_freq.float()  # the column (x) turns the first pairs, as in the stock table
        W[0, n:] = rotary.inv_freq.float()
        return W
