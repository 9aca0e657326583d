"""PyPE (Chen et al. 2025, "Advancing General Multimodal Capability of Vision-language Models with
Pyramid-descent Visual Position Encoding", arXiv 2501.10967, ACL Findings 2025): 1-D positions that number
an image's rings from the border inwards, with fewer distinct rings in deeper layers.

Ring of token (i, j) of an ``h × w`` image: its Chebyshev distance to the border,
``d = min(i, j, h−1−i, w−1−j)`` (0 on the border). At decoder layer ``l`` with descent interval ``J`` the image
has ``P = max(K − ⌊l / J⌋, 1)`` distinct positions, ``K = ⌊min(h, w) / 2⌋``: token (i, j) sits at
``s + min(d, P − 1)`` and the text after the image continues at ``s + P``. So the border is farthest from the
text that follows and the centre nearest; every ``J`` layers the innermost two levels merge (the central
region sharing one position grows) until, from layer ``(K − 1)·J`` on, the whole image shares one position.

The rule is the one of the authors' released code (``pype_utils/pype.py`` for LLaVA-1.5, ``jump_num`` = J),
which places square ``H × H`` images with ``K = ⌊H/2⌋``; ropekit generalises ``H`` to ``min(h, w)``. For an odd
side the centre ring (d = K) therefore already shares ring ``K − 1``'s position at layer 0, as in that code.
What the code and the paper define is one image per sample; ropekit places every image on its own (the next
starts where the text after the previous one would) and a video frame by frame, each frame an image (PyPE
defines no video; its ``interval`` is not used). A 2-D ``Grid`` is an image, a 3-D one a video.

PyPE also changes the causal mask inside an image (a token sees the tokens of its own and of outer rings,
the "concentric causal" rule it builds on): :func:`pype_attention_mask` builds it. ``positions`` gives the
table of one layer (``layer``); a model applies PyPE by giving each layer its own table and mask.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..layout import Audio, Layout, Segment, Text, _show
from .registry import block_rows_np, positions, register, video_blocks, walk

__all__ = ["pype", "pype_blocks", "pype_levels", "pype_attention_mask", "MAX_MASK_TOKENS"]

#: Most tokens :func:`pype_attention_mask` builds an ``(L, L)`` mask for (2**15: 1 GiB of bool).
MAX_MASK_TOKENS = 2**15


def _count(value: object, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"pype: `{name}` must be an int, got {type(value).__name__} ({_show(value)})")
    if int(value) < low:
        what = "the 0-based decoder layer" if name == "layer" else "layers per descent step (the code's jump_num)"
        raise ValueError(f"pype: `{name}` ({what}) must be an int >= {low}, got {value}")
    return int(value)


def descent_steps(layer: int = 0, interval: int = 1) -> int:
    """How many times the pyramid has descended by decoder layer ``layer``: ``⌊layer / interval⌋``."""
    return _count(layer, "layer", 0) // _count(interval, "interval", 1)


def pype_levels(h, w, layer: int = 0, interval: int = 1):
    """Distinct positions of an ``h × w`` image at ``layer``: ``max(⌊min(h, w)/2⌋ − ⌊layer/interval⌋, 1)``
    (ints or int64 arrays, element-wise)."""
    steps = descent_steps(layer, interval)
    return np.maximum(np.minimum(h, w) // 2 - steps, 1)


def pype_blocks(segments: Sequence[Segment], layer: int = 0, interval: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """PyPE block rule (1 axis): frame f's token (i, j) at ``f·P + min(i, j, h−1−i, w−1−j, P−1)``, the start
    advancing by ``t·P`` (P: :func:`pype_levels`)."""
    steps = descent_steps(layer, interval)
    t, h, w, _ = video_blocks(segments, "pype")
    t, h, w = (x.numpy() for x in (t, h, w))
    levels = np.maximum(np.minimum(h, w) // 2 - steps, 1)
    row_block, row_frame, row_index, token_row, col = block_rows_np(t, h, w)
    # per row: distance of the row to the top/bottom border, capped at the top level; then per token the columns
    top = levels[row_block] - 1
    row_ring = np.minimum(np.minimum(row_index, h[row_block] - 1 - row_index), top)
    ring = np.minimum(np.minimum(row_ring[token_row], col), (w[row_block] - 1)[token_row] - col)
    offsets = (row_frame * levels[row_block])[token_row] + ring
    return (torch.from_numpy(offsets.astype(np.float64))[:, None],
            torch.from_numpy((t * levels).astype(np.float64))[:, None])


@register(
    "pype",
    summary="PyPE: 1-D image positions by ring, border first, centre next to the text; fewer rings in deeper layers",
    allocation="1d",
    aliases=("pyramid-descent",),
    block_rule=pype_blocks,
    axes=1,
)
def pype(layout: Layout, layer: int = 0, interval: int = 1) -> torch.Tensor:
    """PyPE positions ``(L, 1)`` at decoder layer ``layer`` (0-based) with descent interval ``interval`` (J)."""
    return walk(layout, pype_blocks, layer=layer, interval=interval)


def pype_attention_mask(layout: "Layout | str", layer: int = 0, interval: int = 1) -> torch.Tensor:
    """PyPE's attention mask ``(L, L)`` bool, True where query i may attend to key j.

    Causal (``j <= i``) everywhere except between two tokens of the same image (or video frame): there a token
    attends to every token of its own ring level and of the levels outside it (``ring_j <= ring_i`` at this
    layer), whatever their order in the sequence; so tokens of one level see each other. At the last layers,
    where an image has one level, every image token sees the whole image. This is the mask of the authors'
    released code. Refused above :data:`MAX_MASK_TOKENS` tokens.
    """
    lay = Layout.coerce(layout)
    n = lay.num_tokens
    if n > MAX_MASK_TOKENS:
        raise ValueError(
            f"pype_attention_mask: layout {str(lay)[:60]!r} has {n} tokens; an (L, L) mask is built only up to "
            f"{MAX_MASK_TOKENS} tokens (ropekit.designs.pype.MAX_MASK_TOKENS); use a smaller layout or raise the "
            f"limit knowingly"
        )
    pos = positions(lay, "pype", layer=layer, interval=interval)[:, 0].double()  # checks the layout and options
    block = torch.full((n,), -1, dtype=torch.int64)  # image / frame id of each token, -1 for text
    start, k = 0, 0
    for seg in lay:
        m = seg.num_tokens
        if not isinstance(seg, (Text, Audio)):
            t = int(video_blocks([seg], "pype")[0][0])
            block[start: start + m] = k + torch.arange(t).repeat_interleave(m // t)
            k += t
        start += m
    idx = torch.arange(n)
    mask = idx[None, :] <= idx[:, None]
    same = (block[:, None] == block[None, :]) & (block[:, None] >= 0)
    return torch.where(same, pos[None, :] <= pos[:, None], mask)
