"""C²RoPE (Ye et al. 2026, "C²RoPE: Causal Continuous Rotary Positional Encoding for 3D Large Multimodal-Models
Reasoning", arXiv 2602.10551, ICRA 2026): an index triplet (m, x, y) per token, a frequency split over the three
components (allocation ``"c2rope"``) and a causal mask inside each image ordered by Chebyshev distance from the
image centre (:func:`c2rope_attention_mask`).

- ``m`` is the 1-D position: text and image tokens are numbered as 1-D RoPE numbers them (an ``h × w`` image
  starting at ``s`` spans ``s … s + h·w − 1`` row by row, the text after it continues at ``s + h·w``).
- ``(x, y)`` are the patch's Cartesian coordinates about the image centre, x growing to the right and y
  upwards; on an even side the two middle columns (rows) both sit at 0, so the coordinates stay integers
  (``x = trunc(c − (w−1)/2)``, ``y = −trunc(r − (h−1)/2)``; the authors' released rotary for 24 × 24 LLaVA
  images does exactly this). ropekit shifts them to start at the image's start ``s``:
  ``x = s + ⌊(w−1)/2⌋ + trunc(c − (w−1)/2)``, ``y = s + ⌊(h−1)/2⌋ − trunc(r − (h−1)/2)``, so only
  differences inside an image carry the centred geometry and text tokens, at ``(p, p, p)``, rotate as 1-D RoPE.
- A video is placed frame by frame, each frame an image (the method is defined on images).

The allocation gives ``m`` the high-frequency pairs and ``x`` then ``y`` the lowest ones (``"c2rope"`` in
:mod:`ropekit.rotations.published`).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..layout import Audio, Layout, Segment, Text
from ._common import gather_rows
from .registry import frame_rows_np, positions, register, video_blocks, walk

__all__ = ["c2rope", "c2rope_blocks", "c2rope_attention_mask", "chebyshev_rings", "MAX_MASK_TOKENS"]

#: Most tokens :func:`c2rope_attention_mask` builds an ``(L, L)`` mask for (2**15: 1 GiB of bool).
MAX_MASK_TOKENS = 2**15


def _centred(index: np.ndarray, size: np.ndarray) -> np.ndarray:
    """``trunc(index − (size−1)/2)``: the signed offset from the centre, 0 for both middle entries of an even side."""
    return np.trunc(index - (size - 1) / 2.0)


def c2rope_blocks(segments: Sequence[Segment]) -> tuple[torch.Tensor, torch.Tensor]:
    """C²RoPE block rule (3 axes m, x, y): frame f's token (r, c) at ``f·h·w + (r·w + c, X(c), Y(r))`` from the
    block start, ``X(c) = ⌊(w−1)/2⌋ + trunc(c − (w−1)/2)``, ``Y(r) = ⌊(h−1)/2⌋ − trunc(r − (h−1)/2)``;
    the block advances by ``t·h·w`` on every axis."""
    seg, frame, row, token_row, col, t, h, w = frame_rows_np(segments, "c2rope")
    hs, ws = h[seg].astype(np.float64), w[seg].astype(np.float64)
    start = frame * hs * ws
    y = start + np.floor((hs - 1) / 2) - _centred(row, hs)
    offsets = gather_rows([start + row * ws, start, y], token_row)
    wt = w[seg][token_row].astype(np.float64)
    offsets[0] += col
    offsets[1] += np.floor((wt - 1) / 2) + _centred(col, wt)
    advance = torch.from_numpy((t * h * w).astype(np.float64))[:, None].expand(-1, 3).contiguous()
    return torch.from_numpy(offsets).T, advance


@register(
    "c2rope",
    summary="C²RoPE: 1-D position plus centred Cartesian (x, y) inside images; m on high, x, y on the lowest pairs",
    allocation="c2rope",
    aliases=("c2-rope",),
    block_rule=c2rope_blocks,
    delta_axes=(0,),
    axes=3,
)
def c2rope(layout: Layout) -> torch.Tensor:
    """C²RoPE positions ``(L, 3)``: (m, x, y) per token (module docstring)."""
    return walk(layout, c2rope_blocks)


def chebyshev_rings(h: int, w: int) -> torch.Tensor:
    """Chebyshev distance of each token of an ``h × w`` image from its centre, ``(h·w,)`` int64 row by row:
    ``max(|trunc(r − (h−1)/2)|, |trunc(c − (w−1)/2)|)`` (0 on the central 1, 2 or 4 tokens)."""
    r = np.abs(_centred(np.arange(h, dtype=np.float64), float(h)))
    c = np.abs(_centred(np.arange(w, dtype=np.float64), float(w)))
    return torch.from_numpy(np.maximum(r[:, None], c[None, :]).astype(np.int64).reshape(-1))


def c2rope_attention_mask(layout: "Layout | str", *, additive: bool = False,
                          dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """C²RoPE's Chebyshev causal mask ``(L, L)``: True (or 0.0 with ``additive``) where query i may attend key j.

    Causal (``j <= i``) everywhere except between two tokens of one image (or video frame): there a token
    attends to every token at least as far from the image centre (Chebyshev distance, :func:`chebyshev_rings`)
    as itself, whatever their order in the sequence; so the border ring is seen first and the centre sees the
    whole image. ``additive=True`` gives the additive form in ``dtype`` (0 allowed, the dtype's most negative
    value blocked), as attention code adds it to the scores. Refused above :data:`MAX_MASK_TOKENS` tokens.
    """
    if not isinstance(additive, bool):
        raise TypeError(f"c2rope_attention_mask: `additive` must be True or False, got {additive!r}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"c2rope_attention_mask: `dtype` must be a floating torch dtype, got {dtype!r}")
    lay = Layout.coerce(layout)
    n = lay.num_tokens
    if n > MAX_MASK_TOKENS:
        raise ValueError(
            f"c2rope_attention_mask: layout {str(lay)[:60]!r} has {n} tokens; an (L, L) mask is built only up to "
            f"{MAX_MASK_TOKENS} tokens (ropekit.designs.c2rope.MAX_MASK_TOKENS); use a smaller layout or raise "
            f"the limit knowingly")
    positions(lay, "c2rope")  # checks the layout
    frame = torch.full((n,), -1, dtype=torch.int64)  # image / frame id of each token, -1 for text
    ring = torch.zeros(n, dtype=torch.int64)
    start, k = 0, 0
    for seg in lay:
        m = seg.num_tokens
        if not isinstance(seg, (Text, Audio)):
            t, h, w, _ = (int(v[0]) for v in video_blocks([seg], "c2rope"))
            frame[start: start + m] = k + torch.arange(t).repeat_interleave(h * w)
            ring[start: start + m] = chebyshev_rings(h, w).repeat(t)
            k += t
        start += m
    idx = torch.arange(n)
    same = (frame[:, None] == frame[None, :]) & (frame[:, None] >= 0)
    allowed = torch.where(same, ring[None, :] >= ring[:, None], idx[None, :] <= idx[:, None])
    if not additive:
        return allowed
    return torch.zeros((n, n), dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
