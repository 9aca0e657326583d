"""GRAPE, canonical form (Group RAtional Position Encoding, multimodal appendix): three commuting rotation
generators, one per axis (t, h, w), each turning fixed channel planes. With the planes fixed to the RoPE pairs,
the rotation is exactly a planar RoPE whose frequency pairs are shared out among the axes, so GRAPE here is a
position design plus an allocation, as the public multimodal RoPE code builds it:

- positions: M-RoPE with every video frame its own block (Qwen3-VL's layout, no spatial reset; the same
  coordinates as ``mrope-i``);
- ``frequency_allocation="chunked"`` (default): pairs in contiguous chunks per axis, M-RoPE's ``mrope``
  allocation with its sections; ``"interleaved"``: pair j turns with axis ``j mod 3`` over the whole head
  (the ``interleaved`` allocation without sections).

The learned GRAPE modes (trainable planes, mixed axes) rotate q and k directly and are no cos/sin table: they
are :class:`ropekit.GRAPE`. Another frequency scale (the public code's ``log_freq_scale`` s, which raises every
inverse frequency to the power 1/s) is the base ``base ** (1/s)`` of :class:`ropekit.RoPE`.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..layout import Layout, Segment
from .mrope_interleave import interleave_blocks
from .registry import register, walk

__all__ = ["grape", "grape_blocks", "FREQUENCY_ALLOCATIONS"]

#: ``frequency_allocation`` → ropekit allocation
FREQUENCY_ALLOCATIONS = {"chunked": "mrope", "interleaved": "interleaved"}


def _check(frequency_allocation: str) -> None:
    if not isinstance(frequency_allocation, str) or frequency_allocation not in FREQUENCY_ALLOCATIONS:
        raise ValueError(f"grape: `frequency_allocation` must be 'chunked' or 'interleaved', "
                         f"got {frequency_allocation!r}")


def grape_blocks(segments: Sequence[Segment], frequency_allocation: str = "chunked"):
    """GRAPE block rule: M-RoPE per video frame (see :func:`ropekit.designs.mrope_interleave.interleave_blocks`);
    ``frequency_allocation`` picks the allocation only."""
    _check(frequency_allocation)
    return interleave_blocks(segments, False, "grape")


@register(
    "grape",
    summary="GRAPE canonical: commuting per-axis planes = M-RoPE positions, chunked or interleaved pairs",
    allocation="mrope",
    block_rule=grape_blocks,
    axes=3,
    allocation_option=("frequency_allocation", FREQUENCY_ALLOCATIONS),
)
def grape(layout: Layout, frequency_allocation: str = "chunked") -> torch.Tensor:
    """GRAPE positions ``(L, 3)`` (t, h, w): M-RoPE with every video frame its own block."""
    return walk(layout, grape_blocks, frequency_allocation=frequency_allocation)
