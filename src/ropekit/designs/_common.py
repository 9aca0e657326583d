"""Small helpers shared by the position designs."""
from __future__ import annotations

import math
import numbers

import numpy as np
import torch

from ..layout import Grid, Image, Segment, Video


def positive_number(value: object, name: str, design: str) -> float:
    """``value`` as a finite float > 0, or a ValueError/TypeError naming the design's option ``name``.

    Ints too large for a float (``10**400``) and strings are refused with the option's name, never with
    Python's bare "could not convert" / OverflowError.
    """
    if isinstance(value, (bool, str, bytes)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{design}: `{name}` must be a finite number > 0, got {type(value).__name__} ({value!r:.40})")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{design}: `{name}` must be a finite number > 0, got {str(value)[:40]}")
    return number


def diagonal(start: float, n: int, axes: int) -> torch.Tensor:
    """``n`` text tokens on the diagonal: ``start, start+1, …`` repeated on every axis, ``(n, axes)``."""
    idx = torch.arange(n, dtype=torch.float64) + start
    return idx[:, None].expand(n, axes)


def as_video(seg: Segment, design: str) -> Video:
    """View an image as a one-frame video and a 2-/3-D grid as an image/video (for 3-axis designs)."""
    if isinstance(seg, Video):
        return seg
    if isinstance(seg, Image):
        return Video(1, seg.h, seg.w, 0.0)
    if isinstance(seg, Grid) and len(seg.sizes) == 2:
        return Video(1, seg.sizes[0], seg.sizes[1], 0.0)
    if isinstance(seg, Grid) and len(seg.sizes) == 3:
        return Video(*seg.sizes)
    raise ValueError(
        f"design {design!r} places images and videos; segment {seg} is not supported "
        f"(use I{{h}}x{{w}}, V{{t}}x{{h}}x{{w}} or a 2-/3-D grid)"
    )


def frame_grid(h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column index of every token of an ``h × w`` frame, row-major, float64."""
    rows = torch.arange(h, dtype=torch.float64).repeat_interleave(w)
    cols = torch.arange(w, dtype=torch.float64).repeat(h)
    return rows, cols


def gather_rows(per_row: "list[np.ndarray]", token_row: np.ndarray) -> np.ndarray:
    """Per-row values of each axis taken for every token: ``(A, Σ n)`` float64, one contiguous row per axis.

    Rules return its transpose ``(Σ n, A)``; the batched index reads each axis as one contiguous vector.
    (``mode="clip"``: the rows are in range by construction, and numpy's checked default stages ``out=``
    through a buffer, 1.5× slower.)"""
    out = np.empty((len(per_row), token_row.shape[0]))
    for a, values in enumerate(per_row):
        np.take(values, token_row, out=out[a], mode="clip")
    return out
