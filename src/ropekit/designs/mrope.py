"""M-RoPE ("spatial", RoPE-3D; Qwen2-VL / Qwen2.5-VL): vision tokens get (t, h, w) indices.

A vision block that starts at ``s`` places token (frame f, row i, col j) at
``(s + floor(f·Δt), s + i, s + j)``. Text sits on the diagonal. Two rules for
where text resumes after a block exist in the wild; both are offered through ``continuation``.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..layout import Layout, Segment, Video, check_token_count
from ._common import frame_grid
from .registry import block_rows_np, register, video_blocks, walk

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
    t, h, w = t.numpy(), h.numpy(), w.numpy()
    row_block, row_frame, row_index, token_row, token_col = block_rows_np(t, h, w)
    # floor(f·Δt) in float32, like temporal_index (and transformers); numpy's float32 product and floor
    # are torch's (IEEE), at a fraction of the per-call cost
    dt = interval.to(torch.float32).numpy()
    time = np.floor(row_frame.astype(np.float32) * dt[row_block]).astype(np.float64)
    # built axis by axis as (3, Σ n) and returned transposed: contiguous gathers, and the batched index
    # reads each axis of the result as one contiguous row
    offsets = np.empty((3, token_row.shape[0]))
    np.take(time, token_row, out=offsets[0], mode="clip")
    np.take(row_index.astype(np.float64), token_row, out=offsets[1], mode="clip")
    offsets[2] = token_col
    last = np.floor((t - 1).astype(np.float32) * dt).astype(np.float64)  # Δt >= 0: the last frame is the max
    top = np.stack([last, (h - 1).astype(np.float64), (w - 1).astype(np.float64)], axis=1)
    return torch.from_numpy(offsets).T, torch.from_numpy(top)


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
