"""V2PE (Ge et al., "V2PE: Improving Multimodal Long-Context Capability of Vision-Language Models with
Variable Visual Position Encoding"): 1-D positions where a visual token advances by ``δ < 1``.

The paper's recurrence: a text token's position is the previous token's + 1, a visual token's the
previous one's + δ (``increment``, default 1/16); the sequence starts as if a token sat at −1, so
text-only input is ``0, 1, 2, …``. A block of n visual tokens after position q therefore spans
``q + δ, …, q + n·δ`` and the next text token is at ``q + n·δ + 1``.

``visual_stride=S`` gives the public Multimodal-RoPEs behaviour instead: every image or video frame
spans S positions whatever its size (step ``S/n``, larger than 1 for frames of fewer than S tokens),
and text resumes at the next integer after the frame (``ceil``) + 1.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
import torch

from ..layout import Layout, Segment
from ._common import gather_rows, positive_number
from .registry import frame_rows_np, ragged_arange, register, segment_tokens, walk

__all__ = ["v2pe", "v2pe_blocks"]


def v2pe_blocks(segments: Sequence[Segment], increment: float = 1 / 16, visual_stride: Optional[float] = None):
    """V2PE block rule: token k of a block at ``(k+1)·δ − 1`` from the start, which advances by ``n·δ``;
    with ``visual_stride`` S, frame f's token i (1-based) at ``f·⌈S⌉ + i·S/n − 1``, advancing ``T·⌈S⌉``."""
    delta = positive_number(increment, "increment", "v2pe")
    if visual_stride is None:
        n = segment_tokens(segments)
        _, k = ragged_arange(n)
        k = (k.numpy() + 1).astype(np.float64)
        return torch.from_numpy(k * delta - 1.0)[:, None], (n.to(torch.float64) * delta)[:, None]
    stride = positive_number(visual_stride, "visual_stride", "v2pe")
    span = float(math.ceil(stride))  # a float: the ceiling of a huge stride is an int too big for a tensor
    seg, frame, row, token_row, col, t, h, w = frame_rows_np(segments, "v2pe")
    first, base, step = gather_rows([frame * span, row * w.astype(np.float64)[seg] + 1.0,
                                     stride / (h * w).astype(np.float64)[seg]], token_row)
    offsets = first + (base + col) * step - 1.0  # frame start + i·S/n − 1
    return torch.from_numpy(offsets)[:, None], torch.from_numpy(t.astype(np.float64) * span)[:, None]


@register(
    "v2pe",
    summary="V2PE: 1-D positions, visual tokens advance by δ < 1 (increment), text by 1",
    allocation="1d",
    block_rule=v2pe_blocks,
    axes=1,
)
def v2pe(layout: Layout, increment: float = 1 / 16, visual_stride: Optional[float] = None) -> torch.Tensor:
    """V2PE positions ``(L, 1)``: visual tokens step by ``increment`` (paper) or, with ``visual_stride``,
    each frame spans that many positions (public code)."""
    return walk(layout, v2pe_blocks, increment=increment, visual_stride=visual_stride)
