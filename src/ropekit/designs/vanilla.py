"""1-D RoPE ("hard" flattening, LLaVA): every token takes the next integer index."""
from __future__ import annotations

import torch

from ..layout import Layout
from .registry import register


@register("vanilla", summary="1-D RoPE: vision tokens flattened in raster order", allocation="1d", aliases=("hard",))
def vanilla(layout: Layout) -> torch.Tensor:
    """Positions ``0 … L-1`` on one axis (SPEC §3 ``vanilla``)."""
    return torch.arange(layout.num_tokens, dtype=torch.float32)[:, None]
