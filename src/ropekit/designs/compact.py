"""RoPE-Compact (VRoPE paper §5 baseline): M-RoPE blocks, then each axis resumes from its own max + 1.

After a ``T×H×W`` block started at ``s`` the next text token sits at ``s + (T, H, W)`` on the
(t, h, w) axes (for Δt = 1) instead of on the diagonal: the positional gap between the video and
the text disappears, at the price of text leaving the diagonal (no longer plain 1-D RoPE).
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..layout import Layout, Segment
from .mrope import thw_offsets
from .registry import register, walk

__all__ = ["compact", "compact_blocks"]


def compact_blocks(segments: Sequence[Segment]) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE-Compact block rule: M-RoPE offsets; each axis advances by its own max offset + 1."""
    offsets, top = thw_offsets(segments, "compact")
    return offsets, top + 1.0


@register(
    "compact",
    summary="RoPE-Compact: M-RoPE blocks, text resumes per axis from that axis' max + 1",
    allocation="mrope",
    block_rule=compact_blocks,
    axes=3,
)
def compact(layout: Layout) -> torch.Tensor:
    """Positions ``(L, 3)`` on the (t, h, w) axes (RoPE-Compact).

    The running index is kept per axis. Text advances all three axes together; a vision block is
    placed as in M-RoPE from the per-axis running index, and afterwards every axis resumes at its
    own largest coordinate + 1. Until the first block this is exactly the diagonal.
    """
    return walk(layout, compact_blocks)
