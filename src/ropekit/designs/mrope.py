"""M-RoPE ("spatial", RoPE-3D; Qwen2-VL / Qwen2.5-VL): vision tokens get (t, h, w) indices.

A vision block that starts at ``s`` places token (frame f, row i, col j) at
``(s + floor(f·Δt), s + i, s + j)``. Text sits on the diagonal. Two rules for
where text resumes after a block exist in the wild; both are offered through ``continuation``.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..layout import Layout, Segment, Video, check_token_count
from ._common import frame_grid
from .registry import block_rows, register, video_blocks, walk

__all__ = ["vision_block", "mrope", "mrope_blocks", "thw_offsets", "CONTINUATIONS"]

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
    if not isinstance(video, Video):
        raise TypeError(f"vision_block: `video` must be a ropekit.Video, got {type(video).__name__}")
    check_token_count(video.num_tokens, "vision_block")
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


def thw_offsets(segments: Sequence[Segment], design: str = "mrope") -> tuple[torch.Tensor, torch.Tensor]:
    """(t, h, w) offsets of the tokens of many vision blocks, concatenated ``(Σ n, 3)`` float64, and each
    block's largest offset per axis ``(S, 3)`` — :func:`vision_block` for all blocks at once."""
    t, h, w, interval = video_blocks(segments, design)
    row_block, row_frame, row_index, token_row, token_col = block_rows(t, h, w)
    # floor(f·Δt) in float32, like temporal_index (and transformers)
    dt = interval.to(torch.float32)
    time = torch.floor(row_frame.to(torch.float32) * dt[row_block])
    per_row = torch.stack([time.to(torch.float64), row_index.to(torch.float64), torch.zeros_like(time, dtype=torch.float64)], 1)
    offsets = per_row.index_select(0, token_row)
    offsets[:, 2] = token_col
    last = torch.floor((t - 1).to(torch.float32) * dt).to(torch.float64)  # Δt >= 0: the last frame is the max
    top = torch.stack([last, (h - 1).to(torch.float64), (w - 1).to(torch.float64)], dim=1)
    return offsets, top


def mrope_blocks(segments: Sequence[Segment], continuation: str = "max") -> tuple[torch.Tensor, torch.Tensor]:
    """M-RoPE block rule: offsets ``(floor(f·Δt), i, j)``; the start advances on all axes by the block's
    max + 1 (``"max"``) or by ``max(H, W)`` (``"spatial"``)."""
    _check_continuation(continuation)
    offsets, top = thw_offsets(segments, "mrope")
    if continuation == "max":
        step = top.amax(dim=1) + 1.0
    else:
        step = top[:, 1:].amax(dim=1) + 1.0  # max(H, W)
    return offsets, step[:, None].expand(-1, 3).contiguous()


@register(
    "mrope",
    summary="M-RoPE (Qwen2-VL): vision (t, h, w) from the block start, text on the diagonal",
    allocation="mrope",
    aliases=("spatial", "rope3d"),
    block_rule=mrope_blocks,
    axes=3,
)
def mrope(layout: Layout, continuation: str = "max") -> torch.Tensor:
    """Qwen2-VL / Qwen2.5-VL multimodal positions, 3 axes (t, h, w).

    ``continuation="max"`` (default): text after a block starts at the block's largest coordinate
    over all three axes + 1 (the original Qwen code and transformers 4.x).
    ``continuation="spatial"``: it starts at ``s + max(H, W)`` whatever the number of frames
    (transformers >= 5.3, including for videos, whose temporal indices may then overlap the text).
    """
    return walk(layout, mrope_blocks, continuation=continuation)
