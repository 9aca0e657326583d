"""Circle-RoPE (CIP, paper §4.1): image tokens on a ring orthogonal to the text direction.

Every image token sits at the same distance from every text token (PTD = 0, paper eq. 1): the grid is
centred (eqs. 2–3), each token gets a mixed angle of its spatial-origin angle and its grid-index
angle (eqs. 4–8), a radius (fixed, or auto-k eq. 9), and the ring is placed in the plane orthogonal to
the text vector (eqs. 10–12), centred where the block starts on the text diagonal.
"""
from __future__ import annotations

import functools
import math
import numbers
from typing import Sequence, Union

import numpy as np
import torch

from ..layout import _FLOAT32_MAX, Image, Layout, Segment, _show, check_token_count
from .registry import _ragged, block_rows_np, register, video_blocks, walk

__all__ = ["circle", "circle_blocks", "ring_offsets", "MEASURES"]

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


def _dff(dff_rate: Union[float, bool]) -> float:
    """``dff_rate`` as a weight in [0, 1] (``True`` is 1, ``False`` 0, as the released code reads it)."""
    if isinstance(dff_rate, bool):
        return float(dff_rate)
    rate = _real(dff_rate)
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"circle: `dff_rate` must be a number in [0, 1] or a bool (True = 1), got {_show(dff_rate)}")
    return rate


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
        n = [_real(c) for c in text_vector]
    except TypeError:
        raise ValueError(f"circle: `text_vector` must be 3 finite numbers, got {_show(text_vector)}") from None
    if len(n) != 3 or not all(math.isfinite(c) for c in n) or max(abs(c) for c in n) == 0.0:
        raise ValueError(f"circle: `text_vector` must be 3 finite numbers, not all zero, got {_show(text_vector)}")
    return torch.tensor(n, dtype=torch.float64)


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
    u, v = _basis_of(tuple(text_vector.tolist()))
    return u.clone(), v.clone()


@functools.lru_cache(maxsize=64)
def _basis_of(text_vector: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_basis` of a text vector given as a tuple of floats, computed once per vector."""
    text_vector = torch.tensor(text_vector, dtype=torch.float64)
    n = text_vector / text_vector.abs().max()  # scaled first: the norm of huge components would overflow
    n = n / n.norm()
    u = torch.stack([-n[1], n[0], torch.zeros((), dtype=n.dtype)])
    u = u / u.norm() if float(u.norm()) > 0 else torch.tensor([1.0, 0.0, 0.0], dtype=n.dtype)
    return u, torch.linalg.cross(n, u)


def _rings(h, w, *, alpha, radius, k, measure, u, v, dff_rate=0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Ring coordinates of many ``h × w`` grids, concatenated ``(Σ h·w, 3)`` float64 on axes (t, h, w), and
    each grid's largest coordinate ``(G,)``.

    Every token-sized step is elementwise or a per-grid min/max, so each grid's ring is exactly the one it
    would get alone; whatever depends on the grid only is computed once per grid. The arithmetic runs in
    numpy (IEEE: the same bits as torch, at a fraction of the per-call cost); sqrt, atan2, cos and sin stay
    torch's (its vectorised sqrt is not always numpy's correctly rounded one).
    """
    as_np = lambda x: x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)  # noqa: E731
    h, w = as_np(h).astype(np.int64), as_np(w).astype(np.int64)
    lengths = h * w
    first = np.cumsum(lengths) - lengths
    # tokens are grid-major and rows row-major, so a per-grid (per-row) value of every token is a repeat
    _, row_index = _ragged(h)
    row_w = np.repeat(w, h)
    _, token_col = _ragged(row_w)
    # eqs. 2–3: centre at the midpoint of the extent, ((w−1)/2, (h−1)/2); x − x is +0.0, so no −0.0 arises
    cx, cy = (w - 1).astype(np.float64) / 2, (h - 1).astype(np.float64) / 2
    x = token_col.astype(np.float64)
    x -= np.repeat(cx, lengths)
    y = np.repeat(row_index.astype(np.float64) - np.repeat(cy, h), row_w)
    # eqs. 4–6: spatial-origin angle, min–max normalised to [0, 2π] within each grid (a 1 × 1 grid: 0)
    theta = torch.atan2(torch.from_numpy(y), torch.from_numpy(x)).numpy()
    low = np.minimum.reduceat(theta, first)
    span = np.maximum.reduceat(theta, first) - low
    span = np.where(span > 0, span, 1.0)  # only a single token has no span, and its θ − θmin is 0
    sa = theta - np.repeat(low, lengths)
    sa /= np.repeat(span, lengths)
    sa *= 2 * math.pi  # × 2π is × 2 then × π: doubling is exact
    # eq. 7: grid-index angle; eq. 8: mix (the weights as torch forms them: 1 − alpha in alpha's own type)
    ga = np.arange(theta.shape[0], dtype=np.float64)
    ga -= np.repeat(first, lengths)
    ga /= np.repeat(lengths.astype(np.float64), lengths)
    ga *= 2 * math.pi
    sa *= float(alpha)
    ga *= float(1 - alpha)
    mixed = sa
    mixed += ga
    # eq. 9 (l2) or the reference code's max |coordinate|: both largest at a corner of the centred grid
    spread = torch.sqrt(torch.from_numpy(cx * cx + cy * cy)).numpy() if measure == "l2" else np.maximum(cx, cy)
    if radius == "auto":
        R = float(k) * spread
        bad = ~(R <= _FLOAT32_MAX)
        if bad.any():
            _radius(radius, k, float(spread[np.flatnonzero(bad)[0]]))  # raises, naming `k`
        R = np.repeat(R, lengths)
    else:
        R = _radius(radius, k, 0.0)
    # eq. 12, with the components (first, second, third) on the axes (w, h, t); built axis by axis as
    # (3, Σ h·w), so that every operation runs on contiguous vectors
    mixed = torch.from_numpy(mixed)
    a, b = R * torch.cos(mixed).numpy(), R * torch.sin(mixed).numpy()
    if dff_rate:  # blend the ring with the centred grid itself laid in the same plane (the released code's dff_rate)
        a, b = (1 - dff_rate) * a + dff_rate * x, (1 - dff_rate) * b + dff_rate * y
    (u0, u1, u2), (v0, v1, v2) = u.tolist(), v.tolist()
    ring = np.empty((3, a.shape[0]))
    for i, (ui, vi) in enumerate(((u2, v2), (u1, v1), (u0, v0))):
        np.multiply(a, ui, out=ring[i])
        ring[i] += b * vi
    return torch.from_numpy(ring).T, torch.from_numpy(np.maximum.reduceat(ring.max(axis=0), first))


def ring_offsets(
    h: int,
    w: int,
    *,
    alpha: float = 0.5,
    radius: Union[float, str] = 10.0,
    k: float = 1.0,
    measure: str = "l2",
    text_vector: Sequence[float] = (1.0, 1.0, 1.0),
    dff_rate: Union[float, bool] = 0.0,
) -> torch.Tensor:
    """Ring coordinates of an ``h × w`` grid relative to the ring centre: ``(h·w, 3)`` float64, axes (t, h, w)."""
    n = _check(alpha, radius, k, measure, text_vector, 0.0)
    rate = _dff(dff_rate)
    grid = Image(h, w)  # checks h and w
    check_token_count(grid.num_tokens, "ring_offsets")
    u, v = _basis(n)
    return _rings(torch.tensor([h]), torch.tensor([w]), alpha=alpha, radius=radius, k=k, measure=measure, u=u, v=v,
                  dff_rate=rate)[0]


def circle_blocks(
    segments: Sequence[Segment],
    alpha: float = 0.5,
    radius: Union[float, str] = 10.0,
    k: float = 1.0,
    measure: str = "l2",
    text_vector: Sequence[float] = (1.0, 1.0, 1.0),
    delta: float = 0.0,
    dff_rate: Union[float, bool] = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, None, torch.Tensor]:
    """Circle-RoPE block rule: frame f of a block holds the ring of its ``h × w`` grid moved by ``f·Δt`` on
    every axis; the start advances on every axis by the block's largest coordinate + 1; every block after
    the first of its sample starts one more ``delta`` further on every axis (the rule's gap).

    Each distinct ``(h, w)`` ring is computed once per call and gathered for every block and frame.
    """
    n = _check(alpha, radius, k, measure, text_vector, delta)
    rate = _dff(dff_rate)
    t, h, w, interval = video_blocks(segments, "circle")
    gap = torch.full((3,), float(delta), dtype=torch.float64)
    if not len(segments):
        return torch.zeros(0, 3, dtype=torch.float64), torch.zeros(0, 3, dtype=torch.float64), None, gap
    t, h, w, interval = t.numpy(), h.numpy(), w.numpy(), interval.numpy()
    if h.max() < 2**31 and w.max() < 2**31:  # one int64 key per (h, w): a 1-D unique, sorted as (h, w)
        keys, grid_of_block = np.unique(h * 2**31 + w, return_inverse=True)
        grids = np.stack([keys >> 31, keys & (2**31 - 1)], axis=1)
    else:
        grids, grid_of_block = np.unique(np.stack([h, w], 1), axis=0, return_inverse=True)
    grid_of_block = grid_of_block.reshape(-1)
    u, v = _basis(n)
    rings, ring_top = _rings(grids[:, 0], grids[:, 1], alpha=alpha, radius=radius, k=k, measure=measure, u=u, v=v,
                             dff_rate=rate)
    rings, ring_top = rings.numpy().T, ring_top.numpy()
    sizes = grids[:, 0] * grids[:, 1]
    ring_start = np.cumsum(sizes) - sizes
    row_block, row_frame, row_index, token_row, token_col = block_rows_np(t, h, w)
    row_first = ring_start[grid_of_block[row_block]] + row_index * w[row_block]  # ring index of each row's first token
    index = row_first[token_row] + token_col
    offsets = np.empty((3, index.shape[0]))
    for i in range(3):  # (3, Σ n): contiguous per axis
        np.take(rings[i], index, out=offsets[i], mode="clip")
    if (t > 1).any():  # frame f moves by f·Δt on every axis
        offsets += (row_frame.astype(np.float64) * interval[row_block])[token_row]
    # Δt >= 0 and rounding is monotonic: the largest coordinate is the last frame's ring maximum
    top = (t - 1).astype(np.float64) * interval + ring_top[grid_of_block]
    return (torch.from_numpy(offsets).T, torch.from_numpy(top + 1.0)[:, None].expand(-1, 3).contiguous(), None,
            gap)


@register("circle", summary="Circle-RoPE: image tokens on a ring orthogonal to the text axis (PTD = 0)",
          allocation="mrope", aliases=("circle_rope", "cip"), block_rule=circle_blocks, axes=3)
def circle(
    layout: Layout,
    *,
    alpha: float = 0.5,
    radius: Union[float, str] = 10.0,
    k: float = 1.0,
    measure: str = "l2",
    text_vector: Sequence[float] = (1.0, 1.0, 1.0),
    delta: float = 0.0,
    dff_rate: Union[float, bool] = 0.0,
) -> torch.Tensor:
    """Circle-RoPE positions ``(L, 3)`` on axes (t, h, w) (axis conventions: docs/conventions.md).

    A ring is centred at ``s·(1,1,1)`` (s: the running index, where the block's first token would sit on
    the text diagonal); a video gets one ring per frame, frame f centred at ``s + f·Δt``. Text after a
    block resumes at the block's largest coordinate + 1.

    Multi-image order (paper §4.3): the i-th vision block (images and videos, 1-based, in layout order)
    is moved by ``(i−1)·delta·(1,1,1)`` from where it sits with ``delta=0``. The text after a block
    follows the moved block, so it already carries that block's shift; the next block therefore adds
    only one more ``delta`` to the running index, and shifts never compound.

    ``dff_rate`` (the released Circle-RoPE code's option; 0 by default, ``True`` = 1) blends each ring with
    the centred grid laid flat in the same plane: ``(1 − r)·ring + r·grid``, where the grid's column and row
    offsets take the places of the ring's ``R·cos`` and ``R·sin``. Every point stays in the plane
    orthogonal to the text vector but leaves the ring, so PTD is 0 only at ``r = 0``; ``r = 1`` keeps the
    grid's own geometry in that plane.
    """
    return walk(layout, circle_blocks, alpha=alpha, radius=radius, k=k, measure=measure,
                text_vector=text_vector, delta=delta, dff_rate=dff_rate)
