"""Circle-RoPE (CIP, paper §4.1): image tokens on a ring orthogonal to the text direction.

Every image token sits at the same distance from every text token (PTD = 0, paper eq. 1): the grid is
centred (eqs. 2–3), each token gets a mixed angle of its spatial-origin angle and its grid-index
angle (eqs. 4–8), a radius (fixed, or auto-k eq. 9), and the ring is placed in the plane orthogonal to
the text vector (eqs. 10–12), centred where the block starts on the text diagonal.
"""
from __future__ import annotations

import math
import numbers
from typing import Sequence, Union

import torch

from ..layout import _FLOAT32_MAX, Image, Layout, Text, _show, check_token_count
from ._common import as_video, diagonal
from .registry import register

__all__ = ["circle", "ring_offsets", "MEASURES"]

MEASURES = ("l2", "max_abs")


def _real(value: object) -> float:
    """``value`` as a float (ints too large for a float become inf); NaN for anything that is not a real number."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dtype != torch.bool and not value.is_complex():
        return float(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return math.nan
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _check(alpha: float, radius: Union[float, str], k: float, measure: str, text_vector: Sequence[float],
           delta: float) -> torch.Tensor:
    if not 0.0 <= _real(alpha) <= 1.0:
        raise ValueError(f"circle: `alpha` must be a number in [0, 1] (paper eq. 8), got {_show(alpha)}")
    if not (radius == "auto" if isinstance(radius, str) else 0 < _real(radius) < math.inf):
        raise ValueError(f"circle: `radius` must be a number > 0 or 'auto' (paper eq. 9), got {_show(radius)}")
    if not 0 < _real(k) < math.inf:
        raise ValueError(f"circle: `k` (auto-k radius factor) must be a number > 0, got {_show(k)}")
    if not isinstance(measure, str) or measure not in MEASURES:
        raise ValueError(f"circle: `measure` must be 'l2' (paper) or 'max_abs' (reference code), got {_show(measure)}")
    if not 0 <= _real(delta) < math.inf:
        raise ValueError(f"circle: `delta` (multi-image offset, paper §4.3) must be a number >= 0, got {_show(delta)}")
    try:
        n = torch.as_tensor([_real(c) for c in text_vector], dtype=torch.float64)
    except TypeError:
        raise ValueError(f"circle: `text_vector` must be 3 finite numbers, got {_show(text_vector)}") from None
    if n.numel() != 3 or not torch.isfinite(n).all() or float(n.abs().max()) == 0.0:
        raise ValueError(f"circle: `text_vector` must be 3 finite numbers, not all zero, got {_show(text_vector)}")
    return n


def _radius(radius: Union[float, str], k: float, spread: float) -> float:
    """Ring radius: fixed, or ``k`` times the grid's spread (eq. 9); refused when it is beyond float32."""
    R = k * spread if radius == "auto" else float(radius)
    if not R <= _FLOAT32_MAX:
        name = f"`k` = {k!r} (times the grid's spread {spread:g})" if radius == "auto" else f"`radius` = {radius!r}"
        raise ValueError(
            f"circle: {name} gives a ring radius beyond the float32 range ({_FLOAT32_MAX:.4g}), so the positions "
            f"would not be finite float32 numbers; use a smaller value"
        )
    return R


def _basis(text_vector: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Orthonormal (u, v) spanning the plane orthogonal to n (paper eqs. 10–11)."""
    n = text_vector / text_vector.abs().max()  # scaled first: the norm of huge components would overflow
    n = n / n.norm()
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
    grid = Image(h, w)  # checks h and w
    check_token_count(grid.num_tokens, "ring_offsets")
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
    # eq. 9 (l2) or the reference code's max |coordinate|
    spread = torch.sqrt(x * x + y * y).max() if measure == "l2" else torch.maximum(x.abs(), y.abs()).max()
    R = _radius(radius, k, float(spread))
    u, v = _basis(n)
    pts = (R * torch.cos(mixed))[:, None] * u + (R * torch.sin(mixed))[:, None] * v  # eq. 12
    return pts.flip(-1)  # components (first, second, third) → axes (w, h, t)


@register("circle", summary="Circle-RoPE: image tokens on a ring orthogonal to the text axis (PTD = 0)",
          allocation="mrope", aliases=("circle_rope", "cip"), axes=3)
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
    """Circle-RoPE positions ``(L, 3)`` on axes (t, h, w) (axis conventions: docs/conventions.md).

    A ring is centred at ``s·(1,1,1)`` (s: the running index, where the block's first token would sit on
    the text diagonal); a video gets one ring per frame, frame f centred at ``s + f·Δt``. Text after a
    block resumes at the block's largest coordinate + 1.

    Multi-image order (paper §4.3): the i-th vision block (images and videos, 1-based, in layout order)
    is moved by ``(i−1)·delta·(1,1,1)`` from where it sits with ``delta=0``. The text after a block
    follows the moved block, so it already carries that block's shift; the next block therefore adds
    only one more ``delta`` to the running index, and shifts never compound.
    """
    _check(alpha, radius, k, measure, text_vector, delta)
    parts, p, first = [], 0.0, True
    for seg in layout:
        if isinstance(seg, Text):
            parts.append(diagonal(p, seg.n, 3))
            p += seg.n
            continue
        vid = as_video(seg, "circle")
        ring = ring_offsets(vid.h, vid.w, alpha=alpha, radius=radius, k=k, measure=measure,
                            text_vector=text_vector)
        # p already holds the shift (i−2)·delta of the block before; one more delta makes (i−1)·delta
        start = p if first else p + delta
        centres = start + torch.arange(vid.t, dtype=torch.float64) * vid.interval
        block = (centres[:, None, None] + ring[None]).reshape(-1, 3)
        parts.append(block)
        p = float(block.max()) + 1.0
        first = False
    return torch.cat(parts).to(torch.float32)
