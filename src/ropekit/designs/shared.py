"""Shared index ("unordered", mPLUG-Owl3): all tokens of an image (or of one video frame) share an index."""
from __future__ import annotations

import torch

from ..layout import Layout, Text, Video
from ._common import as_video, diagonal
from .registry import register


@register("shared", summary="one index per image / per video frame", allocation="1d", aliases=("unordered",))
def shared(layout: Layout) -> torch.Tensor:
    """Image → one index ``s``; video frame f → ``s + f``; text after the block ``+1`` (SPEC §3)."""
    parts, p = [], 0.0
    for seg in layout:
        if isinstance(seg, Text):
            parts.append(diagonal(p, seg.n, 1))
            p += seg.n
            continue
        v = as_video(seg, "shared")
        frame = torch.arange(v.t, dtype=torch.float64) + p
        parts.append(frame.repeat_interleave(v.h * v.w)[:, None])
        p += v.t
    return torch.cat(parts).to(torch.float32)
