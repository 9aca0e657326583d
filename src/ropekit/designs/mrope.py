"""M-RoPE ("spatial", RoPE-3D; Qwen2-VL / Qwen2.5-VL): vision tokens get (t, h, w) indices.

A vision block that starts at ``s`` places token (frame f, row i, col j) at
``(s + floor(f·Δt), s + i, s + j)`` (SPEC §3 "M-RoPE"). Text sits on the diagonal. Two rules for
where text resumes after a block exist in the wild; both are offered through ``continuation``.
"""
from __future__ import annotations

import torch

from ..layout import Layout, Text, Video
from ._common import as_video, diagonal, frame_grid
from .registry import register

__all__ = ["vision_block", "mrope", "CONTINUATIONS"]

CONTINUATIONS = ("max", "spatial")


def temporal_index(frames: int, interval: float) -> torch.Tensor:
    """``floor(f·Δt)`` for ``f = 0 … frames-1``, float64.

    The product is taken in float32 and truncated, exactly as transformers' Qwen2-VL/Qwen2.5-VL
    ``get_vision_position_ids`` does (its ``second_per_grid_ts`` are float32), so that intervals such
    as 0.7 round the same way there and here.
    """
    f = torch.arange(frames, dtype=torch.float32)
    return torch.floor(f * torch.tensor(interval, dtype=torch.float32)).to(torch.float64)


def vision_block(video: Video, start: "float | torch.Tensor") -> torch.Tensor:
    """(t, h, w) coordinates of every token of ``video`` (frame-major, row-major), ``(n, 3)`` float64.

    ``start`` is the block's start index: a number (the usual case, all three axes start together)
    or a ``(3,)`` tensor giving one start per axis (used by RoPE-Compact after a previous block).
    """
    rows, cols = frame_grid(video.h, video.w)
    hw = video.h * video.w
    t = temporal_index(video.t, video.interval).repeat_interleave(hw)
    out = torch.stack([t, rows.repeat(video.t), cols.repeat(video.t)], dim=1)
    return out + torch.as_tensor(start, dtype=torch.float64)


def _check_continuation(continuation: str) -> None:
    if continuation not in CONTINUATIONS:
        raise ValueError(
            f"mrope: `continuation` must be 'max' (text resumes at the block's max + 1, transformers 4.x) "
            f"or 'spatial' (text resumes at s + max(H, W), transformers >= 5.3), got {continuation!r}"
        )


@register(
    "mrope",
    summary="M-RoPE (Qwen2-VL): vision (t, h, w) from the block start, text on the diagonal",
    allocation="mrope",
    aliases=("spatial", "rope3d"),
)
def mrope(layout: Layout, continuation: str = "max") -> torch.Tensor:
    """Qwen2-VL / Qwen2.5-VL multimodal positions, 3 axes (t, h, w) (SPEC §3 "M-RoPE").

    ``continuation="max"`` (default): text after a block starts at the block's largest coordinate
    over all three axes + 1 (the original Qwen code and transformers 4.x).
    ``continuation="spatial"``: it starts at ``s + max(H, W)`` whatever the number of frames
    (transformers >= 5.3, including for videos, whose temporal indices may then overlap the text).
    """
    _check_continuation(continuation)
    parts, p = [], 0.0
    for seg in layout:
        if isinstance(seg, Text):
            parts.append(diagonal(p, seg.n, 3))
            p += seg.n
            continue
        v = as_video(seg, "mrope")
        block = vision_block(v, p)
        parts.append(block)
        p = float(block.max()) + 1.0 if continuation == "max" else p + max(v.h, v.w)
    return torch.cat(parts).to(torch.float32)
