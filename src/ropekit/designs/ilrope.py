"""IL-RoPE (as collected in the public Multimodal-RoPEs code): every image or frame at
``(shift, row, col)`` with ``shift`` the running sequence position; text on the diagonal.

A frame of ``h × w`` tokens whose block starts at ``shift`` places token (r, c) at ``(shift, r, c)``
and moves ``shift`` by ``max(h, w)``; this equals ``mrope-i`` with ``spatial_reset=True``. IL-RoPE
pairs it with the interleaved ``"mrope-interleave"`` allocation (so its cos/sin equal MRoPE-I with
the reset), Omni-RoPE (``omnirope``) with the chunked ``"mrope"`` one.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..layout import Layout, Segment
from .mrope_interleave import interleave_blocks
from .registry import register, walk

__all__ = ["ilrope", "shift_row_col_blocks"]


def shift_row_col_blocks(segments: Sequence[Segment]):
    """(shift, local row, local col) block rule: MRoPE-I's with the spatial reset."""
    return interleave_blocks(segments, True, "ilrope")


@register(
    "ilrope",
    summary="IL-RoPE: (shift, local row, local col) per image/frame, interleaved allocation",
    allocation="mrope-interleave",
    aliases=("il-rope",),
    block_rule=shift_row_col_blocks,
    axes=3,
)
def ilrope(layout: Layout) -> torch.Tensor:
    """IL-RoPE positions ``(L, 3)``: ``(shift, r, c)`` in every image or frame."""
    return walk(layout, shift_row_col_blocks)
