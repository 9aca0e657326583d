"""Llama 4's vision encoder: one square image of ``g × g`` patches (``g = image_size / patch_size``) and a class
token after them, which is not rotated (angle 0). The rotary hands a complex table to every attention layer;
the patches sit at (row + 1, column + 1), so the class token is the origin before the grid. Pairs are
adjacent channels (2j, 2j + 1); the first D/4 pairs turn with the column, the rest with the row, both at
``θ^(-4j/D)``."""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from .base import COORDS_ATTR, VisionAdapter


class Llama4VisionAdapter(VisionAdapter):
    name = "llama4_vision"
    rotary_classes = ("Llama4VisionRotaryEmbedding",)
    attention_classes = ("Llama4VisionAttention",)
    rotary_params = ("hidden_states",)
    embedding_param = "freqs_ci"
    attention_params = ("cache", "past_key_values")  # older releases name it past_key_values
    patches_first = True
    stock_channels = "interleaved"

    def coords(self, rotary: nn.Module, hidden_states: torch.Tensor):
        config = rotary.config
        side = config.image_size // config.patch_size
        index = torch.arange(side * side, device=hidden_states.device)
        coords = torch.stack((index // side + 1, index % side + 1), dim=-1).float()  # (row + 1, column + 1)
        return coords, rotary.freqs_ci

    def identity(self, coords: torch.Tensor, like: torch.Tensor, head_dim: int) -> torch.Tensor:
        ones = torch.ones((coords.shape[0] + 1, 1, head_dim // 2), dtype=like.dtype, device=coords.device)
        setattr(ones, COORDS_ATTR, coords)  # the complex 1 for every patch and the class token
        return ones

    def embedded_coords(self, embeddings: Any) -> Optional[torch.Tensor]:
        return getattr(embeddings, COORDS_ATTR, None)

    def stock_frequencies(self, rotary: nn.Module) -> torch.Tensor:
        config = rotary.config
        dim = config.hidden_size // config.num_attention_heads
        n = dim // 4
        freq = 1.0 / (config.rope_parameters["rope_theta"] ** (torch.arange(0, dim // 2, 2)[:n].float() / (dim // 2)))
        W = torch.zeros(2, 2 * n, dtype=torch.float32)
        W[1, :n] = freq  # the column turns the first pairs, as in the stock table
        W[0, n:] = freq
        return W

    def base(self, rotary: nn.Module) -> float:
        return float(rotary.config.rope_parameters["rope_theta"])
