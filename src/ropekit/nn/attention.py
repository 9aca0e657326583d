"""Multi-head self-attention with any ropekit rotary embedding, and a tiny ViT for experiments."""
from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn


__all__ = ["Rotary", "RotaryAttention", "TinyViT"]


class Rotary(Protocol):
    """Anything that rotates q/k ``(B, H, L, D)`` at coordinates ``(L, A)`` or ``(B, L, A)``: ropekit's
    :class:`~ropekit.RoPE`, :class:`~ropekit.DirectionalRoPE`, :class:`~ropekit.MixedFrequencies` and
    :class:`~ropekit.GeoPE` all do."""

    def rotate(self, q: torch.Tensor, k: torch.Tensor, coords: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


class RotaryAttention(nn.Module):
    """Self-attention whose q and k are rotated by ``rotary`` before scaled dot-product attention."""

    def __init__(self, dim: int, heads: int, rotary: Rotary | None = None, *, bias: bool = True) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"`dim` ({dim}) must be divisible by `heads` ({heads})")
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=bias)
        self.proj = nn.Linear(dim, dim, bias=bias)
        self.rotary = rotary

    def forward(self, x: torch.Tensor, coords: torch.Tensor | None = None, *, causal: bool = False,
                attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        B, L, _ = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.rotary is not None:
            if coords is None:
                raise ValueError("RotaryAttention: pass `coords` (L, A) for the rotary embedding")
            q, k = self.rotary.rotate(q, k, coords)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal)
        return self.proj(out.transpose(1, 2).reshape(B, L, -1))


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int, rotary: Rotary | None, mlp_ratio: float) -> None:
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = RotaryAttention(dim, heads, rotary)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.n1(x), coords)
        return x + self.mlp(self.n2(x))


class TinyViT(nn.Module):
    """A small ViT (patchify → pre-norm blocks → mean pool → head) with a rotary embedding per layer.

    ``rotary_factory(layer_idx)`` returns the layer's rotary (so mixed RoPE gets its own parameters per
    layer); patch coordinates are the plain ``(row, col)`` grid of the patches (buffer ``coords``, ``(N, 2)``).
    """

    def __init__(self, image_size: int = 32, patch: int = 4, dim: int = 96, depth: int = 4, heads: int = 4,
                 num_classes: int = 10, in_chans: int = 3, rotary_factory=None, mlp_ratio: float = 2.0) -> None:
        super().__init__()
        if image_size % patch:
            raise ValueError(f"`image_size` ({image_size}) must be a multiple of `patch` ({patch})")
        self.grid = image_size // patch
        self.embed = nn.Conv2d(in_chans, dim, patch, stride=patch)
        self.blocks = nn.ModuleList(
            _Block(dim, heads, rotary_factory(i) if rotary_factory else None, mlp_ratio) for i in range(depth)
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)
        g = torch.arange(self.grid, dtype=torch.float32)
        self.register_buffer("coords", torch.stack(torch.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2),
                             persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.embed(images).flatten(2).transpose(1, 2)
        for blk in self.blocks:
            x = blk(x, self.coords)
        return self.head(self.norm(x).mean(1))

