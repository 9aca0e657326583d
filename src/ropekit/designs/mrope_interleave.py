"""MRoPE-I (MRoPE-Interleave; Huang et al., "Revisiting Multimodal Positional Encoding in Vision-Language
Models", the Qwen3-VL layout): M-RoPE positions with each video frame its own block, and an optional
*spatial reset*.

A frame (or image) of ``h × w`` tokens whose block starts at ``s`` places token (row r, col c) at
``(s, s + r, s + c)``; with ``spatial_reset=True`` at ``(s, r, c)``: height and width restart from 0
in every image, only the temporal axis carries the sequence position. Either way the token after
the block (the vision-end token) sits at ``s + max(h, w)`` and text continues from there, so text and
the temporal axis are the same with and without the reset. A video of ``t`` frames is ``t`` such
blocks one after another (Qwen3-VL separates frames with timestamp text; its ``Δt`` is not used).
Pair with the ``"mrope-interleave"`` allocation (h on pairs ≡ 1, w on pairs ≡ 2 mod 3 over the first
60 of 64, t on the rest).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..layout import Layout, Segment
from ._common import gather_rows
from .registry import frame_rows_np, register, walk

__all__ = ["mrope_interleave", "mrope_interleave_blocks"]


def _check_reset(spatial_reset: bool, design: str) -> bool:
    if not isinstance(spatial_reset, bool):
        raise TypeError(f"{design}: `spatial_reset` must be True or False, got {spatial_reset!r}")
    return spatial_reset


def interleave_blocks(segments: Sequence[Segment], spatial_reset: bool, design: str):
    """Block rule shared by MRoPE-I, MHRoPE, IL-RoPE and Omni-RoPE: frame f of a block starts ``f·max(h, w)``
    after it; token (r, c) at ``(0, r, c)`` from the frame start, h and w absolute under the reset."""
    reset = _check_reset(spatial_reset, design)
    seg, frame, row, token_row, col, t, h, w = frame_rows_np(segments, design)
    side = np.maximum(h, w)
    start = frame * side.astype(np.float64)[seg]
    spatial = row if reset else start + row
    across = np.zeros_like(start) if reset else start  # where columns count from
    offsets = gather_rows([start, spatial, across], token_row)
    offsets[2] += col
    advance = torch.from_numpy((t * side).astype(np.float64))[:, None].expand(-1, 3).contiguous()
    return torch.from_numpy(offsets).T, advance, torch.tensor([False, reset, reset])


def mrope_interleave_blocks(segments: Sequence[Segment], spatial_reset: bool = False):
    """MRoPE-I block rule (see :func:`interleave_blocks`)."""
    return interleave_blocks(segments, spatial_reset, "mrope-i")


@register(
    "mrope-i",
    summary="MRoPE-Interleave (Qwen3-VL): M-RoPE per frame, optional spatial reset of h, w per image",
    allocation="mrope-interleave",
    aliases=("mrope-interleave", "mrope_interleave", "mropei"),
    block_rule=mrope_interleave_blocks,
    axes=3,
)
def mrope_interleave(layout: Layout, spatial_reset: bool = False) -> torch.Tensor:
    """MRoPE-I positions ``(L, 3)`` (t, h, w); ``spatial_reset=True`` restarts h and w at 0 in every image."""
    return walk(layout, mrope_interleave_blocks, spatial_reset=spatial_reset)
