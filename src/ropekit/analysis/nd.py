"""Numbers behind the N-D rotary figures: kernels over a token grid and the spread of directions.

Kernels are the exact expectation ``E[q·R(Δ)q] / E[q·q]`` for isotropic q (:func:`expected_kernel`);
``num_samples=N`` switches to the Monte-Carlo average over N random q, the estimator the N-D paper's
script plots. The grid is the integer token grid centred on token ``grid_size // 2`` (relative offsets
``−⌊G/2⌋ … G−1−⌊G/2⌋``), i.e. what a ViT with that grid sees.

Axis convention (every kernel map in ropekit): entry ``[i, j]`` of a 2-D map is the offset whose first
coordinate (axis 0, Δh, the row of an image) is ``offsets[i]`` and whose second (axis 1, Δw, the column)
is ``offsets[j]``; figures draw it as an image, Δh increasing downward and Δw to the right.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from .kernel import expected_kernel, monte_carlo_kernel

__all__ = ["grid_offsets", "similarity_grid", "max_angular_gap", "check_int", "kernel_along_lines", "LINES"]

# Monte-Carlo chunks keep num_samples × positions × rotary_dim below this many float64 numbers
_MC_CHUNK = 1 << 22


def check_int(value: int, name: str, low: int = 1) -> int:
    """``value`` as an int ``>= low``, or a TypeError/ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"`{name}` must be >= {low}, got {value}")
    return value


def grid_offsets(grid_size: int) -> torch.Tensor:
    """Offsets of the integer grid positions from the centre token ``grid_size // 2`` (float64)."""
    check_int(grid_size, "grid_size")
    return torch.arange(grid_size, dtype=torch.float64) - grid_size // 2


def _kernel(delta: torch.Tensor, W: torch.Tensor, num_samples: int | None, seed: int) -> torch.Tensor:
    """Kernel for ``delta (P, A)``; a per-head ``W (H, A, R/2)`` is averaged over its heads."""
    if W.ndim == 3:
        return torch.stack([_kernel(delta, w, num_samples, seed) for w in W]).mean(0)
    if num_samples is None:
        return expected_kernel(delta, W)
    chunk = max(1, _MC_CHUNK // (num_samples * 2 * W.shape[-1]))
    parts = [monte_carlo_kernel(delta[i : i + chunk], W, num_samples=num_samples, seed=seed)
             for i in range(0, delta.shape[0], chunk)]
    return torch.cat(parts)


def similarity_grid(
    W: torch.Tensor,
    grid_size: int,
    *,
    extra: Sequence[float] = (),
    num_samples: int | None = None,
    seed: int = 0,
) -> torch.Tensor:
    """Kernel between the centre token and every position of a ``grid_size²`` grid: ``(G, G)`` float64.

    Entry ``[i, j]`` is the offset ``(axis 0, axis 1) = (offsets[i], offsets[j])`` with
    ``offsets = grid_offsets(grid_size)`` (rows = axis 0, columns = axis 1); axes beyond the second are
    held at the offsets in ``extra`` (one per extra axis of ``W``).
    """
    if not isinstance(W, torch.Tensor) or W.ndim not in (2, 3):
        raise TypeError("similarity_grid: `W` must be a frequency matrix (A, R/2) or per-head (H, A, R/2)")
    A = W.shape[-2]
    if A < 2 or len(extra) != A - 2:
        raise ValueError(
            f"similarity_grid: W has {A} axes; a 2-D grid needs A >= 2 and one `extra` offset per axis "
            f"beyond the second (got {len(extra)})"
        )
    if num_samples is not None:
        check_int(num_samples, "num_samples")
    r = grid_offsets(grid_size)
    rows, cols = torch.meshgrid(r, r, indexing="ij")
    parts = [rows.reshape(-1), cols.reshape(-1)] + [torch.full_like(rows.reshape(-1), float(z)) for z in extra]
    delta = torch.stack(parts, dim=-1)
    return _kernel(delta, W.to(torch.float64), num_samples, seed).reshape(grid_size, grid_size)


def max_angular_gap(directions: torch.Tensor) -> float:
    """Largest gap between consecutive 2-D directions, in units of the even spacing ``2π/N`` (1 = ideal)."""
    if directions.ndim != 2 or directions.shape[1] != 2:
        raise ValueError(f"max_angular_gap needs 2-D directions (N, 2), got shape {tuple(directions.shape)}")
    a = torch.sort(torch.atan2(directions[:, 1], directions[:, 0])).values
    gaps = torch.diff(torch.cat([a, a[:1] + 2 * math.pi]))
    return float(gaps.max() / (2 * math.pi / directions.shape[0]))


LINES = ("Δh axis", "Δw axis", "diagonal Δh = Δw", "anti-diagonal Δh = −Δw")


def kernel_along_lines(kmap: torch.Tensor, offsets: torch.Tensor, distance: int) -> dict[str, float]:
    """Kernel ``kmap`` (rows = Δh, columns = Δw, both ``offsets``) on four lines through the query.

    The lines (:data:`LINES`) are compared at the same Euclidean distance ``d√2``: the diagonals at the
    cells ``(±d, ±d)``, the axes interpolated linearly between the two cells on either side of ``d√2``.
    Each line's value is the mean of its two points on either side of the query, so a kernel that is
    not symmetric about the query is still summarised by one number per line.
    """
    if kmap.ndim != 2 or kmap.shape[0] != kmap.shape[1] or kmap.shape[0] != offsets.numel():
        raise ValueError(f"kernel_along_lines: `kmap` must be (G, G) over `offsets` (G,), got "
                         f"{tuple(kmap.shape)} and {tuple(offsets.shape)}")
    index = {float(v): i for i, v in enumerate(offsets.tolist())}
    d = float(distance)
    t = d * math.sqrt(2)
    lo, hi = float(math.floor(t)), float(math.ceil(t))
    if not all(v in index for v in (d, -d, hi, -hi, 0.0)):
        raise ValueError(f"kernel_along_lines: offsets 0, ±{distance} and ±{hi:g} must be on the grid")

    def at(dh: float, dw: float) -> float:
        return float(kmap[index[dh], index[dw]])

    def on_axis(sign: float, axis: int) -> float:
        cell = (lambda r: at(sign * r, 0.0)) if axis == 0 else (lambda r: at(0.0, sign * r))
        return cell(lo) + (t - lo) * (cell(hi) - cell(lo))

    return {
        LINES[0]: 0.5 * (on_axis(1, 0) + on_axis(-1, 0)),
        LINES[1]: 0.5 * (on_axis(1, 1) + on_axis(-1, 1)),
        LINES[2]: 0.5 * (at(d, d) + at(-d, -d)),
        LINES[3]: 0.5 * (at(d, -d) + at(-d, d)),
    }
