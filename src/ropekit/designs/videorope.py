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

import torch

from ..layout import _FLOAT32_MAX, Layout, Segment
from ._common import frame_rows
from .registry import register, walk

__all__ = ["videorope", "videorope_blocks", "diagonal_blocks"]


def _check_positive(value: float, name: str, design: str) -> float:
    # compared, not converted: a huge int must be refused, not overflow float()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= _FLOAT32_MAX:
        raise ValueError(f"{design}: `{name}` must be a number > 0 within the float32 range, got {value!r}"[:300])
    return float(value)


def diagonal_blocks(segments: Sequence[Segment], stride: float, design: str):
    """Centred diagonal block rule: frame f at time ``f·stride``, token (i, j) at ``t + i − ⌊(H−1)/2⌋``,
    ``t + j − ⌊(W−1)/2⌋``; the start advances by ``(T−1)·stride + 1``."""
    seg, frame, row, token_row, col, t, h, w = frame_rows(segments, design)
    time = frame * stride
    row_shift = torch.div(h - 1, 2, rounding_mode="floor").to(torch.float64).index_select(0, seg)
    col_shift = torch.div(w - 1, 2, rounding_mode="floor").to(torch.float64).index_select(0, seg)
    offsets = torch.stack([time, time + row - row_shift, time - col_shift], dim=1).index_select(0, token_row)
    offsets[:, 2] += col
    advance = ((t - 1).to(torch.float64) * stride + 1.0)[:, None].expand(-1, 3).contiguous()
    return offsets, advance


def videorope_blocks(segments: Sequence[Segment], temporal_stride: float = 2.0):
    """VideoRoPE block rule (see :func:`diagonal_blocks`)."""
    return diagonal_blocks(segments, _check_positive(temporal_stride, "temporal_stride", "videorope"), "videorope")


@register(
    "videorope",
    summary="VideoRoPE: frames centred on the diagonal at t = s + f·δ, low-frequency temporal allocation",
    allocation="videorope",
    aliases=("video-rope",),
    block_rule=videorope_blocks,
    delta_axes=(0,),
)
def videorope(layout: Layout, temporal_stride: float = 2.0) -> torch.Tensor:
    """VideoRoPE positions ``(L, 3)`` (t, h, w); ``temporal_stride`` is the paper's δ (2 by default)."""
    return walk(layout, videorope_blocks, temporal_stride=temporal_stride)
