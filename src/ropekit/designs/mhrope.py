"""MHRoPE (Multi-Head RoPE; Huang et al., "Revisiting Multimodal Positional Encoding in Vision-Language
Models"): MRoPE-I positions, with the axes split over whole attention heads instead of frequency pairs.

Positions are those of ``mrope-i``; the spatial reset is on by default, as in the paper and the
authors' README (the public code's default is off: ``spatial_reset=False``). The head split is the
per-head ``"mhrope"`` allocation: ``frequency_matrix("mhrope", R, 3, sections=[n_t, n_h, n_w(, n_none)])``
is ``(H, 3, R/2)``; head group a rotates every pair by axis a, extra heads are not rotated.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..layout import Layout, Segment
from .mrope_interleave import interleave_blocks
from .registry import register, walk

__all__ = ["mhrope", "mhrope_blocks"]


def mhrope_blocks(segments: Sequence[Segment], spatial_reset: bool = True):
    """MHRoPE block rule: MRoPE-I's, reset on by default."""
    return interleave_blocks(segments, spatial_reset, "mhrope")


@register(
    "mhrope",
    summary="MHRoPE: MRoPE-I positions (spatial reset on), t/h/w assigned to whole heads",
    allocation="mhrope",
    aliases=("multi-head-rope",),
    block_rule=mhrope_blocks,
    axes=3,
)
def mhrope(layout: Layout, spatial_reset: bool = True) -> torch.Tensor:
    """MHRoPE positions ``(L, 3)``: ``mrope-i`` with ``spatial_reset=True`` unless told otherwise."""
    return walk(layout, mhrope_blocks, spatial_reset=spatial_reset)
