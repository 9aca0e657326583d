"""A small pre-norm decoder-only transformer for multimodal token sequences, one rotary design per layer.

Design names: any registered ropekit position design (``vanilla``, ``mrope``, ``circle`` …), ``none`` (no
position embedding at all) and ``circle-age-<schedule>`` (Alternating Geometry Encoding: each layer's
design from :func:`ropekit.age_schedule` over Circle-RoPE and M-RoPE, schedule ``all | lower | upper |
alternate``). Positions come from :func:`ropekit.positions` of the batch's layout (cached per layout).
"""
from __future__ import annotations

from functools import lru_cache

import torch
from torch import nn

from ..age import SCHEDULES, age_schedule
from ..designs.registry import designs as registered_designs
from ..designs.registry import positions
from ..nn.attention import RotaryAttention
from ..rope import RoPE

__all__ = ["layer_designs", "Decoder", "layout_positions"]

AGE_PREFIX = "circle-age-"


def layer_designs(design: str, depth: int) -> list[str]:
    """The position design of each of ``depth`` layers for an experiment design name."""
    if design.startswith(AGE_PREFIX):
        schedule = design[len(AGE_PREFIX):]
        if schedule not in SCHEDULES:
            raise ValueError(f"unknown AGE schedule in {design!r}; use {AGE_PREFIX}{{{','.join(SCHEDULES)}}}")
        return age_schedule(schedule, depth, ("circle", "mrope"))
    if design != "none" and design not in registered_designs():
        raise ValueError(
            f"unknown design {design!r}; choose one of {', '.join(registered_designs())}, 'none', "
            f"or {AGE_PREFIX}<schedule>"
        )
    return [design] * depth


@lru_cache(maxsize=512)
def layout_positions(layout: str, design: str) -> torch.Tensor:
    """float32 coordinates ``(L, A)`` of ``layout`` under ``design`` (cached; batches share a layout)."""
    return positions(layout, design)


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int, design: str, mlp_ratio: float, base: float) -> None:
        super().__init__()
        self.design = design
        rotary = None if design == "none" else RoPE(design, head_dim=dim // heads, base=base)
        self.n1, self.n2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = RotaryAttention(dim, heads, rotary)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor, coords: torch.Tensor | None) -> torch.Tensor:
        x = x + self.attn(self.n1(x), coords, causal=True)
        return x + self.mlp(self.n2(x))


class Decoder(nn.Module):
    """Token embedding → ``depth`` causal pre-norm blocks → logits of the next token after the last one.

    ``forward(tokens, layout)`` returns ``(B, vocab)`` logits at the last position (the answer slot).
    """

    def __init__(self, vocab: int, design: str = "vanilla", *, dim: int = 64, depth: int = 4, heads: int = 4,
                 mlp_ratio: float = 2.0, base: float = 10000.0) -> None:
        super().__init__()
        if dim % heads or (dim // heads) % 2:
            raise ValueError(f"`dim` ({dim}) / `heads` ({heads}) must be an even head size")
        self.design = design
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(_Block(dim, heads, d, mlp_ratio, base) for d in layer_designs(design, depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor, layout: str) -> torch.Tensor:
        coords = {b.design: layout_positions(layout, b.design).to(tokens.device)
                  for b in self.blocks if b.design != "none"}
        if coords and next(iter(coords.values())).shape[0] != tokens.shape[1]:
            raise ValueError(f"layout {layout!r} has {next(iter(coords.values())).shape[0]} tokens but the "
                             f"batch has {tokens.shape[1]}; the layout must describe the token sequence")
        x = self.embed(tokens)
        for blk in self.blocks:
            x = blk(x, coords.get(blk.design))
        return self.head(self.norm(x[:, -1]))
