"""Gemma 4's vision encoder: per-image (x, y) patch indices (padding patches at (-1, -1)), one set per sample;
q and k are RMS-normalised per head before they turn, so the patch rotates the q/k norms' outputs. The head's
first half turns with x (column), its second half with y (row), each half split in its own two halves
(channel i with i + D/4), both with ``θ^(-4j/D)`` at the encoder's own ``rope_theta``. A learned table of x and
y embeddings is added to the patch embeddings before the first layer; the patch leaves it as it is."""
from __future__ import annotations

import torch
from torch import nn

from .base import VisionAdapter


class Gemma4VisionAdapter(VisionAdapter):
    name = "gemma4_vision"
    rotary_classes = ("Gemma4VisionRotaryEmbedding",)
    attention_classes = ("Gemma4VisionAttention",)
    rotary_params = ("x", "position_ids")
    attention_params = ("position_ids",)
    qk_modules = ("q_norm", "k_norm")
    qk_per_head = True

    def num_heads(self, attention: nn.Module) -> int:
        return attention.config.num_attention_heads

    def coords(self, rotary: nn.Module, x: torch.Tensor, position_ids: torch.Tensor):
        return position_ids.flip(-1).float(), x  # (B, P, 2) as (row, column)

    def stock_frequencies(self, rotary: nn.Module) -> torch.Tensor:
        n = rotary.inv_freq.numel()  # D/4
        W = torch.zeros(2, 2 * n, dtype=torch.float32)
        W[1, :n] = rotary.inv_freq.float()  # the column (x) turns the first pairs, as in the stock head
        W[0, n:] = rotary.inv_freq.float()
        return W

    def stock_permutation(self, head_dim: int) -> torch.Tensor:
        q = head_dim // 4  # the stock quarters (x, x, y, y) reordered to the half-split pairs (x, y | x, y)
        return torch.cat([torch.arange(i * q, (i + 1) * q) for i in (0, 2, 1, 3)])
