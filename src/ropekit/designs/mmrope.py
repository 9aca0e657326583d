"""MMRoPE (as collected in Multimodal-RoPEs): M-RoPE positions with per-axis scaling of the spatial
offsets, and a repeating ``t, t, h, w, h, w, h, w`` frequency allocation (``"mmrope"``).

A frame (or image) of ``h × w`` tokens whose block starts at ``s`` places token (r, c) at
``(s, s + σ_h·r, s + σ_w·c)``; the next block or text starts at the block's largest coordinate + 1
(``s + max(σ_h·(h−1), σ_w·(w−1)) + 1``). Each video frame is a block of its own, so the temporal
scale σ_t of ``position_scale = (σ_t, σ_h, σ_w)`` multiplies an offset that is always 0 and has no
effect (as in the public code); it is accepted for parity.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..layout import Layout, Segment
from ._common import gather_rows, positive_number
from .registry import frame_rows_np, register, walk

__all__ = ["mmrope", "mmrope_blocks"]


def _check_scale(position_scale) -> tuple[float, float, float]:
    values = position_scale
    if isinstance(values, torch.Tensor):
        values = values.tolist() if values.ndim == 1 else None
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) != 3:
        raise TypeError(f"mmrope: `position_scale` must be three finite numbers > 0 (σ_t, σ_h, σ_w), "
                        f"got {position_scale!r:.60}")
    return tuple(positive_number(v, "position_scale", "mmrope") for v in values)


def mmrope_blocks(segments: Sequence[Segment], position_scale: Sequence[float] = (1.0, 1.0, 1.0)):
    """MMRoPE block rule: frame f of a block starts ``f`` frame steps after it, a frame step being
    ``max(σ_h·(h−1), σ_w·(w−1)) + 1``; token (r, c) at ``(0, σ_h·r, σ_w·c)`` from the frame start."""
    _, sh, sw = _check_scale(position_scale)
    seg, frame, row, token_row, col, t, h, w = frame_rows_np(segments, "mmrope")
    step = np.maximum(sh * (h - 1).astype(np.float64), sw * (w - 1).astype(np.float64)) + 1.0
    start = frame * step[seg]
    offsets = gather_rows([start, start + sh * row, start], token_row)
    offsets[2] += sw * col
    return torch.from_numpy(offsets).T, torch.from_numpy(t.astype(np.float64) * step)[:, None].expand(-1, 3).contiguous()


@register(
    "mmrope",
    summary="MMRoPE: M-RoPE with per-axis scale of h, w; allocation t,t,h,w,h,w,h,w",
    allocation="mmrope",
    aliases=("mm-rope",),
    block_rule=mmrope_blocks,
    axes=3,
)
def mmrope(layout: Layout, position_scale: Sequence[float] = (1.0, 1.0, 1.0)) -> torch.Tensor:
    """MMRoPE positions ``(L, 3)`` with spatial offsets scaled by ``position_scale[1:]``."""
    return walk(layout, mmrope_blocks, position_scale=position_scale)
