"""RoPE-2D (VRoPE paper §5.4 baseline, Pixtral-style): each frame gets (row, col), frames in sequence.

Frame f of a block that starts at ``s`` starts at ``s_f = s + f·max(H, W)`` and token (row i, col j)
sits at ``(s_f + i, s_f + j)`` on the (row, col) axes; text sits on the diagonal. There is no
temporal axis: order in time comes only from the frames following one another (a video's
``interval`` is ignored).

**Text after the block** starts at ``s_T = s + T·max(H, W)``, which is the block's largest
coordinate + 1. The paper says RoPE-2D "resolves the cross-modal positional discontinuity of
RoPE-3D" (Table 2 still marks it ✗ for a seamless transition because, for ``H ≠ W``, the shorter
axis keeps a gap of ``|H - W|``): continuing right after the block is the reading that matches both.

**Frequency allocation: ``"interleaved"``** (frequency j uses axis ``j mod 2``). This is Pixtral's
assignment — rows take the even-index frequencies of the standard spectrum, columns the odd ones —
up to the order of the channel pairs (Pixtral stores the row pairs first). Because the two axes split
the ordinary 1-D spectrum between them, text on the diagonal is exactly 1-D RoPE (paper eq. 5), which
a fine-tuned LLM needs. Pixtral's own channel order is ``rope2d_pixtral_permutation``.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..layout import Layout, Segment
from ._common import frame_grid, gather_rows
from .registry import block_rows_np, register, video_blocks, walk

__all__ = ["rope2d", "rope2d_block", "rope2d_blocks", "rope2d_pixtral_permutation"]


def rope2d_block(frames: int, h: int, w: int, start: float = 0.0) -> torch.Tensor:
    """(row, col) coordinates of ``frames`` frames of ``h × w`` tokens from ``start``: ``(frames·h·w, 2)`` float64."""
    rows, cols = frame_grid(h, w)
    one = torch.stack([rows, cols], dim=1)
    offsets = float(start) + max(h, w) * torch.arange(frames, dtype=torch.float64)
    return (one[None] + offsets[:, None, None]).reshape(-1, 2)


def rope2d_pixtral_permutation(rotary_dim: int) -> torch.Tensor:
    """Index of our ``"interleaved"`` pair for each of Pixtral's channel pairs (rows' pairs first, then columns').

    ``cos[..., perm]`` with ``cos`` from ``frequency_matrix("interleaved", rotary_dim, 2)`` is Pixtral's
    layout. ``rotary_dim`` must be a multiple of 4 (Pixtral splits the pairs evenly over rows and columns).
    """
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int) or rotary_dim < 4 or rotary_dim % 4:
        raise ValueError(f"`rotary_dim` must be a positive multiple of 4 for Pixtral's layout, got {rotary_dim!r}")
    half = rotary_dim // 2
    return torch.cat([torch.arange(0, half, 2), torch.arange(1, half, 2)])


def rope2d_blocks(segments: Sequence[Segment]) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE-2D block rule: token (f, i, j) at ``f·max(H, W) + (i, j)``; the start advances by ``T·max(H, W)``
    on both axes — :func:`rope2d_block` for all blocks at once."""
    t, h, w, _ = video_blocks(segments, "rope2d")
    t, h, w = t.numpy(), h.numpy(), w.numpy()
    side = np.maximum(h, w)
    row_block, row_frame, row_index, token_row, token_col = block_rows_np(t, h, w)
    shift = row_frame * side[row_block]
    offsets = gather_rows([(row_index + shift).astype(np.float64), shift.astype(np.float64)], token_row)
    offsets[1] += token_col
    return torch.from_numpy(offsets).T, torch.from_numpy((t * side).astype(np.float64))[:, None].expand(-1, 2).contiguous()


@register(
    "rope2d",
    summary="RoPE-2D (Pixtral-style): per-frame (row, col), frames one after another, text on the diagonal",
    allocation="interleaved",
    block_rule=rope2d_blocks,
    axes=2,
)
def rope2d(layout: Layout) -> torch.Tensor:
    """RoPE-2D positions ``(L, 2)`` on the (row, col) axes.

    Images and 2-D grids are one frame, videos and 3-D grids ``T`` frames; the next frame (or the
    text after the block) starts ``max(H, W)`` after the previous frame's start.
    """
    return walk(layout, rope2d_blocks)
