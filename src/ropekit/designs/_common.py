"""Small helpers shared by the position designs."""
from __future__ import annotations

import torch

from ..layout import Grid, Image, Segment, Video


def diagonal(start: float, n: int, axes: int) -> torch.Tensor:
    """``n`` text tokens on the diagonal: ``start, start+1, …`` repeated on every axis, ``(n, axes)``."""
    idx = torch.arange(n, dtype=torch.float64) + start
    return idx[:, None].expand(n, axes)


def as_video(seg: Segment, design: str) -> Video:
    """View an image as a one-frame video and a 2-/3-D grid as an image/video (for 3-axis designs)."""
    if isinstance(seg, Video):
        return seg
    if isinstance(seg, Image):
        return Video(1, seg.h, seg.w, 0.0)
    if isinstance(seg, Grid) and len(seg.sizes) == 2:
        return Video(1, seg.sizes[0], seg.sizes[1], 0.0)
    if isinstance(seg, Grid) and len(seg.sizes) == 3:
        return Video(*seg.sizes)
    raise ValueError(
        f"design {design!r} places images and videos; segment {seg} is not supported "
        f"(use I{{h}}x{{w}}, V{{t}}x{{h}}x{{w}} or a 2-/3-D grid)"
    )


def frame_grid(h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column index of every token of an ``h × w`` frame, row-major, float64."""
    rows = torch.arange(h, dtype=torch.float64).repeat_interleave(w)
    cols = torch.arange(w, dtype=torch.float64).repeat(h)
    return rows, cols


def frame_tokens(segments, design: str):
    """Every vision segment as a run of ``h × w`` frames (an image is one frame), token by token.

    Returns, per token, its segment, frame, row and column ``(Σ n,)`` (segment int64, the rest
    float64), and per segment its frames ``t``, rows ``h`` and columns ``w`` ``(S,)`` int64. The
    designs of the Multimodal-RoPEs collection treat each video frame as a block of its own.
    """
    from .registry import block_rows, video_blocks  # registry imports this module

    t, h, w, _ = video_blocks(segments, design)
    row_block, row_frame, row_index, token_row, token_col = block_rows(t, h, w)
    seg = row_block.index_select(0, token_row)
    frame = row_frame.index_select(0, token_row).to(torch.float64)
    row = row_index.index_select(0, token_row).to(torch.float64)
    return seg, frame, row, token_col.to(torch.float64), t, h, w
