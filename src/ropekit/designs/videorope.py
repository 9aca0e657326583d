"""VideoRoPE (Wei et al., "VideoRoPE: What Makes for Good Video Rotary Position Embedding?"): diagonal
layout with adjustable temporal spacing.

A block (image or video) that starts at ``s`` places frame f, row i, col j of an ``H × W`` grid at

    t = s + f·δ,   h = t + i − ⌊(H−1)/2⌋,   w = t + j − ⌊(W−1)/2⌋

so every frame is centred on the diagonal at its own time; text resumes at ``s + (T−1)·δ + 1`` (one
after the last frame's time). ``temporal_stride`` is δ (the paper's default 2). The public
Multimodal-RoPEs code treats every frame as a block of its own, which is δ = 1 for frames that
follow one another (on Qwen3-VL input timestamps separate the frames, so δ never matters there).
Pair with the ``"videorope"`` allocation (low-frequency temporal allocation).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..layout import Layout, Segment
from ._common import gather_rows, positive_number
from .registry import frame_rows_np, register, walk

__all__ = ["videorope", "videorope_blocks", "diagonal_blocks"]


def diagonal_blocks(segments: Sequence[Segment], stride: float, design: str):
    """Centred diagonal block rule: frame f at time ``f·stride``, token (i, j) at ``t + i − ⌊(H−1)/2⌋``,
    ``t + j − ⌊(W−1)/2⌋``; the start advances by ``(T−1)·stride + 1``."""
    seg, frame, row, token_row, col, t, h, w = frame_rows_np(segments, design)
    time = frame * stride
    row_shift = ((h - 1) // 2).astype(np.float64)[seg]
    col_shift = ((w - 1) // 2).astype(np.float64)[seg]
    offsets = gather_rows([time, time + row - row_shift, time - col_shift], token_row)
    offsets[2] += col
    advance = torch.from_numpy((t - 1).astype(np.float64) * stride + 1.0)[:, None].expand(-1, 3).contiguous()
    return torch.from_numpy(offsets).T, advance


def videorope_blocks(segments: Sequence[Segment], temporal_stride: float = 2.0):
    """VideoRoPE block rule (see :func:`diagonal_blocks`)."""
    return diagonal_blocks(segments, positive_number(temporal_stride, "temporal_stride", "videorope"), "videorope")


@register(
    "videorope",
    summary="VideoRoPE: frames centred on the diagonal at t = s + f·δ, low-frequency temporal allocation",
    allocation="videorope",
    aliases=("video-rope",),
    block_rule=videorope_blocks,
    delta_axes=(0,),
    axes=3,
)
def videorope(layout: Layout, temporal_stride: float = 2.0) -> torch.Tensor:
    """VideoRoPE positions ``(L, 3)`` (t, h, w); ``temporal_stride`` is the paper's δ (2 by default)."""
    return walk(layout, videorope_blocks, temporal_stride=temporal_stride)
