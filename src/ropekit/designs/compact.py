"""RoPE-Compact (VRoPE paper §5 baseline): M-RoPE blocks, then each axis resumes from its own max + 1.

After a ``T×H×W`` block started at ``s`` the next text token sits at ``s + (T, H, W)`` on the
(t, h, w) axes (for Δt = 1) instead of on the diagonal: the positional gap between the video and
the text disappears, at the price of text leaving the diagonal (no longer plain 1-D RoPE).
"""
from __future__ import annotations

import torch

from ..layout import Layout, Text
from ._common import as_video
from .mrope import vision_block
from .registry import register

__all__ = ["compact"]


@register(
    "compact",
    summary="RoPE-Compact: M-RoPE blocks, text resumes per axis from that axis' max + 1",
    allocation="mrope",
)
def compact(layout: Layout) -> torch.Tensor:
    """Positions ``(L, 3)`` on the (t, h, w) axes (SPEC §3 ``compact``).

    The running index is kept per axis. Text advances all three axes together; a vision block is
    placed as in M-RoPE from the per-axis running index, and afterwards every axis resumes at its
    own largest coordinate + 1. Until the first block this is exactly the diagonal.
    """
    parts, p = [], torch.zeros(3, dtype=torch.float64)
    for seg in layout:
        if isinstance(seg, Text):
            steps = torch.arange(seg.n, dtype=torch.float64)[:, None]
            parts.append(p + steps)
            p = p + seg.n
            continue
        block = vision_block(as_video(seg, "compact"), p)
        parts.append(block)
        p = block.amax(dim=0) + 1.0
    return torch.cat(parts).to(torch.float32)
