"""Omni-RoPE (as collected in Multimodal-RoPEs): IL-RoPE's ``(shift, local row, local col)`` positions
with the chunked M-RoPE frequency allocation (``"mrope"``: t on the highest-frequency quarter of the pairs,
then h, then w)."""
from __future__ import annotations

import torch

from ..layout import Layout
from .ilrope import shift_row_col_blocks
from .registry import register, walk

__all__ = ["omnirope"]


@register(
    "omnirope",
    summary="Omni-RoPE: (shift, local row, local col) per image/frame, chunked M-RoPE allocation",
    allocation="mrope",
    aliases=("omni-rope",),
    block_rule=shift_row_col_blocks,
    axes=3,
)
def omnirope(layout: Layout) -> torch.Tensor:
    """Omni-RoPE positions ``(L, 3)``: the same as ``ilrope``; only the allocation differs."""
    return walk(layout, shift_row_col_blocks)
