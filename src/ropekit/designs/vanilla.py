"""1-D RoPE ("hard" flattening, LLaVA): every token takes the next integer index."""
from __future__ import annotations

from typing import Sequence

import torch

from ..layout import Layout, Segment
from .registry import ragged_arange, register, segment_tokens, walk

__all__ = ["vanilla", "vanilla_blocks"]


def vanilla_blocks(segments: Sequence[Segment]) -> tuple[torch.Tensor, torch.Tensor]:
    """Flattening block rule: token k of a segment at offset k (raster order), the start advances by its size."""
    n = segment_tokens(segments)
    _, local = ragged_arange(n)
    return local.to(torch.float64)[:, None], n.to(torch.float64)[:, None]


@register(
    "vanilla",
    summary="1-D RoPE: vision tokens flattened in raster order",
    allocation="1d",
    aliases=("hard",),
    block_rule=vanilla_blocks,
    axes=1,
)
def vanilla(layout: Layout) -> torch.Tensor:
    """Positions ``0 … L-1`` on one axis."""
    return walk(layout, vanilla_blocks)
