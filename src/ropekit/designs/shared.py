"""Shared index ("unordered", mPLUG-Owl3): all tokens of an image (or of one video frame) share an index."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..layout import Layout, Segment
from .registry import block_rows_np, register, video_blocks, walk

__all__ = ["shared", "shared_blocks"]


def shared_blocks(segments: Sequence[Segment]) -> tuple[torch.Tensor, torch.Tensor]:
    """Shared-index block rule: every token of frame f at offset f; the start advances by the frame count."""
    t, h, w, _ = video_blocks(segments, "shared")
    _, row_frame, _, token_row, _ = block_rows_np(t.numpy(), h.numpy(), w.numpy())
    return torch.from_numpy(row_frame.astype(np.float64)[token_row])[:, None], t.to(torch.float64)[:, None]


@register(
    "shared",
    summary="one index per image / per video frame",
    allocation="1d",
    aliases=("unordered",),
    block_rule=shared_blocks,
    axes=1,
)
def shared(layout: Layout) -> torch.Tensor:
    """Image → one index ``s``; video frame f → ``s + f``; text after the block ``+1``."""
    return walk(layout, shared_blocks)
