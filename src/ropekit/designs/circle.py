"""Circle-RoPE (CIP, paper §4.1): image tokens on a ring orthogonal to the text direction.

Every image token sits at the same distance from every text token (PTD = 0, paper eq. 1): the grid is
centred (eqs. 2–3), each token gets a mixed angle of its spatial-origin angle and its grid-index
angle (eqs. 4–8), a radius (fixed, or auto-k eq. 9), and the ring is placed in the plane orthogonal to
the text vector (eqs. 10–12), centred where the block starts on the text diagonal.
"""
from __future__ import annotations

import math
from typing import Sequence, Union

import torch

from ..layout import Layout, Text
from ._common import as_video, diagonal
from .registry import register

__all__ = ["circle", "ring_offsets", "MEASURES"]

MEASURES = ("l2", "max_abs")


def _check(alpha: float, radius: Union[float, str], k: float, measure: str, text_vector: Sequence[float],
           delta: float) -> torch.Tensor:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"circle: `alpha` must be a number in [0, 1] (paper eq. 8), got {alpha!r}")
    if radius != "auto" and (isinstance(radius, bool) or not isinstance(radius, (int, float))
                             or not math.isfinite(radius) or radius <= 0):
        raise ValueError(f"circle: `radius` must be a number > 0 or 'auto' (paper eq. 9), got {radius!r}")
    if isinstance(k, bool) or not isinstance(k, (int, float)) or not math.isfinite(k) or k <= 0:
        raise ValueError(f"circle: `k` (auto-k radius factor) must be a number > 0, got {k!r}")
    if measure not in MEASURES:
        raise ValueError(f"circle: `measure` must be 'l2' (paper) or 'max_abs' (reference code), got {measure!r}")
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not math.isfinite(delta) or delta < 0:
        raise ValueError(f"circle: `delta` (multi-image offset, paper §4.3) must be a number >= 0, got {delta!r}")
    try:
        n = torch.as_tensor([float(c) for c in text_vector], dtype=torch.float64)
    except (TypeError, ValueError):
        raise ValueError(f"circle: `text_vector` must be 3 finite numbers, got {text_vector!r}") from None
    if n.numel() != 3 or not torch.isfinite(n).all() or float(n.norm()) == 0.0:
        raise ValueError(f"circle: `text_vector` must be 3 finite numbers, not all zero, got {text_vector!r}")
    return n


def _basis(text_vector: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Orthonormal (u, v) spanning the plane orthogonal to n (paper eqs. 10–11)."""
    n = text_vector / text_vector.norm()
    u = torch.stack([-n[1], n[0], torch.zeros((), dtype=n.dtype)])
    u = u / u.norm() if float(u.norm()) > 0 else torch.tensor([1.0, 0.0, 0.0], dtype=n.dtype)
    return u, torch.linalg.cross(n, u)


def ring_offsets(
    h: int,
    w: int,
    *,
    alpha: float = 0.5,
    radius: Union[float, str] = 10.0,
    k: float = 1.0,
    measure: str = "l2",
    text_vector: Sequence[float] = (1.0, 1.0, 1.0),
) -> torch.Tensor:
    """Ring coordinates of an ``h × w`` grid relative to the ring centre: ``(h·w, 3)`` float64, axes (t, h, w)."""
    n = _check(alpha, radius, k, measure, text_vector, 0.0)
    rows = torch.arange(h, dtype=torch.float64).repeat_interleave(w)
    cols = torch.arange(w, dtype=torch.float64).repeat(h)
    # eqs. 2–3: centre at the midpoint of the extent; + 0.0 turns a -0.0 offset into +0.0
    x = cols - (cols.max() + cols.min()) / 2 + 0.0
    y = rows - (rows.max() + rows.min()) / 2 + 0.0
    # eqs. 4–6: spatial-origin angle, min–max normalised to [0, 2π]
    theta = torch.atan2(y, x)
    span = theta.max() - theta.min()
    sa = (theta - theta.min()) / span * 2 * math.pi if float(span) > 0 else torch.zeros_like(theta)
    # eq. 7: grid-index angle; eq. 8: mix
    ga = torch.arange(h * w, dtype=torch.float64) / (h * w) * 2 * math.pi
    mixed = alpha * sa + (1 - alpha) * ga
    if radius == "auto":  # eq. 9 (l2) or the reference code's max |coordinate|
        spread = torch.sqrt(x * x + y * y).max() if measure == "l2" else torch.maximum(x.abs(), y.abs()).max()
        R = k * float(spread)
    else:
        R = float(radius)
    u, v = _basis(n)
    pts = (R * torch.cos(mixed))[:, None] * u + (R * torch.sin(mixed))[:, None] * v  # eq. 12
    return pts.flip(-1)  # components (first, second, third) → axes (w, h, t)


@register("circle", summary="Circle-RoPE: image tokens on a ring orthogonal to the text axis (PTD = 0)",
          allocation="mrope", aliases=("circle_rope", "cip"))
def circle(
    layout: Layout,
    *,
    alpha: float = 0.5,
    radius: Union[float, str] = 10.0,
    k: float = 1.0,
    measure: str = "l2",
    text_vector: Sequence[float] = (1.0, 1.0, 1.0),
    delta: float = 0.0,
) -> torch.Tensor:
    """Circle-RoPE positions ``(L, 3)`` on axes (t, h, w) (SPEC §3).

    A ring is centred at ``s·(1,1,1)`` (s: the index its first token would get under 1-D RoPE), plus
    ``(i−1)·delta·(1,1,1)`` for the i-th vision block (paper §4.3); a video gets one ring per frame, frame f
    centred at ``s + f·Δt``. Text after a block resumes at the block's largest coordinate + 1.
    """
    _check(alpha, radius, k, measure, text_vector, delta)
    parts, p, block_idx = [], 0.0, 0
    for seg in layout:
        if isinstance(seg, Text):
            parts.append(diagonal(p, seg.n, 3))
            p += seg.n
            continue
        vid = as_video(seg, "circle")
        ring = ring_offsets(vid.h, vid.w, alpha=alpha, radius=radius, k=k, measure=measure,
                            text_vector=text_vector)
        centres = p + block_idx * delta + torch.arange(vid.t, dtype=torch.float64) * vid.interval
        block = (centres[:, None, None] + ring[None]).reshape(-1, 3)
        parts.append(block)
        p = float(block.max()) + 1.0
        block_idx += 1
    return torch.cat(parts).to(torch.float32)
