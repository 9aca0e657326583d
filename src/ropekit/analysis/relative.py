"""Relative-position error of every rotary family and GeoPE's expected kernel.

A rotary embedding is *exactly relative* when the score ``⟨R_m q, R_n k⟩`` depends on the positions only
through ``n − m``. :func:`relative_error` measures ``max |s(q, k, m, n) − s(q, k, m + δ, n + δ)|`` over
random q, k, positions and shifts δ, for any score function ``s``. Planar families (one ``W``, any
allocation) are exactly relative, so only float32 rounding remains; GeoPE is not (its rotations about
different axes do not commute) except for 1-D positions; Linear GeoPE is, by construction.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from ..apply.geope import apply_geope
from ..apply.linear_geope import linear_geope_scores
from ..apply.planar import apply_rotary, cos_sin
from ..rotations.geope import geope_frequencies, geope_rotation, rotation_vectors
from ..rotations.planar import angles, frequency_matrix
from .kernel import expected_kernel

__all__ = [
    "ScoreFn",
    "planar_score",
    "geope_score",
    "linear_geope_score",
    "rotary_score",
    "relative_error",
    "score_scale",
    "relative_table",
    "geope_expected_kernel",
    "kernel_maps",
]

# score(q (N, D), k (N, D), pos_q (N, A), pos_k (N, A)) -> scores of the N pairs, shape (..., N)
ScoreFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def planar_score(W: torch.Tensor, *, channels: str = "half") -> ScoreFn:
    """Score of a planar family with frequency matrix ``W (A, R/2)`` or per-head ``(H, A, R/2)``.

    Per-head ``W`` scores every pair once per head (output ``(H, 1, N)``); ``R`` may be below head_dim.
    """
    if not isinstance(W, torch.Tensor) or W.ndim not in (2, 3):
        raise ValueError("planar_score: `W` must be a tensor (A, R/2) or per-head (H, A, R/2)")

    def rotate(x, pos):
        cos, sin = cos_sin(angles(pos, W))  # per-head W: (H, N, R/2), one table per copy of x
        x = x[None, None].expand(cos.shape[0] if W.ndim == 3 else 1, 1, -1, -1)
        return apply_rotary(x, cos, sin, channels=channels)

    def score(q, k, pos_q, pos_k):
        return (rotate(q, pos_q) * rotate(k, pos_k)).sum(-1)

    return score


def geope_score(head_dim: int, *, lam: float = 100.0, freq_style: str = "decreasing") -> ScoreFn:
    """Score ``⟨R_m q, R_n k⟩`` of GeoPE with per-token quaternion rotations (not exactly relative)."""
    freqs = geope_frequencies(head_dim, lam, freq_style)

    def score(q, k, pos_q, pos_k):
        rq = apply_geope(q[None, None], geope_rotation(pos_q, head_dim, freqs=freqs))
        rk = apply_geope(k[None, None], geope_rotation(pos_k, head_dim, freqs=freqs))
        return (rq * rk).sum(-1)

    return score


def linear_geope_score(head_dim: int, *, lam: float = 100.0, freq_style: str = "decreasing") -> ScoreFn:
    """Score of Linear GeoPE through the attention routine's own score function (each pair a batch)."""
    freqs = geope_frequencies(head_dim, lam, freq_style)

    def score(q, k, pos_q, pos_k):
        s = linear_geope_scores(q[:, None, None], k[:, None, None], pos_q[:, None], pos_k[:, None], freqs)
        return s[:, 0, 0, 0]

    return score


def rotary_score(rotary) -> ScoreFn:
    """Score of any rotary object with ``rotate(q, k, coords)`` (``RoPE``, ``GeoPE``, ``LieRE``, ``ComRoPE``,
    ``GRAPE`` …): the N pairs are N tokens of one sequence; per-head modules score once per head."""
    if not callable(getattr(rotary, "rotate", None)):
        raise TypeError(f"rotary_score: `rotary` needs a rotate(q, k, coords) method, got {type(rotary).__name__}")

    def score(q, k, pos_q, pos_k):
        rq, _ = rotary.rotate(q[None, None], q[None, None], pos_q)
        _, rk = rotary.rotate(k[None, None], k[None, None], pos_k)
        return (rq * rk).sum(-1)

    return score


def _draw(num_trials: int, num_axes: int, head_dim: int, max_position: float, max_shift: float,
          integer_positions: bool, seed: int):
    if isinstance(num_trials, bool) or not isinstance(num_trials, int) or num_trials < 1:
        raise ValueError(f"`num_trials` must be a positive int, got {num_trials!r}")
    if isinstance(num_axes, bool) or not isinstance(num_axes, int) or num_axes < 1:
        raise ValueError(f"`num_axes` must be a positive int, got {num_axes!r}")
    if not (max_position > 0 and max_shift >= 0):
        raise ValueError(f"`max_position` must be > 0 and `max_shift` >= 0, got {max_position}, {max_shift}")
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(num_trials, head_dim, generator=g)
    k = torch.randn(num_trials, head_dim, generator=g)
    shape = (num_trials, num_axes)
    if integer_positions:
        pq = torch.randint(0, int(max_position) + 1, shape, generator=g).float()
        pk = torch.randint(0, int(max_position) + 1, shape, generator=g).float()
        d = torch.randint(-int(max_shift), int(max_shift) + 1, shape, generator=g).float()
    else:
        pq = torch.rand(shape, generator=g) * max_position
        pk = torch.rand(shape, generator=g) * max_position
        d = (torch.rand(shape, generator=g) * 2 - 1) * max_shift
    return q, k, pq, pk, d


def relative_error(
    score: ScoreFn,
    *,
    num_axes: int,
    head_dim: int,
    num_trials: int = 256,
    max_position: float = 32.0,
    max_shift: float = 32.0,
    integer_positions: bool = True,
    seed: int = 0,
) -> float:
    """``max |⟨R_m q, R_n k⟩ − ⟨R_{m+δ} q, R_{n+δ} k⟩|`` over random pairs.

    q, k have standard normal entries (scores of order ``√head_dim``); positions are drawn in
    ``[0, max_position]`` per axis and shifts δ in ``[−max_shift, max_shift]`` (integers by default, so
    shifted positions are exact in float32 and only the rotation maths rounds). Returns a float.
    """
    q, k, pq, pk, d = _draw(num_trials, num_axes, head_dim, max_position, max_shift, integer_positions, seed)
    with torch.no_grad():
        a = score(q, k, pq, pk).double()
        b = score(q, k, pq + d, pk + d).double()
    return float((a - b).abs().max())


def score_scale(score: ScoreFn, *, num_axes: int, head_dim: int, num_trials: int = 256,
                max_position: float = 32.0, seed: int = 0) -> float:
    """Root-mean-square score over the same kind of random pairs, to put errors on a relative scale."""
    q, k, pq, pk, _ = _draw(num_trials, num_axes, head_dim, max_position, 0.0, True, seed)
    with torch.no_grad():
        return float(score(q, k, pq, pk).double().square().mean().sqrt())


def _families(head_dim: int) -> list[tuple[str, str, int, ScoreFn, bool]]:
    """(name, family, num_axes, score, exactly relative in theory) for every family ropekit has."""
    D = head_dim
    rows = [
        ("1-D RoPE", "planar", 1, planar_score(frequency_matrix("1d", D)), True),
        ("axial 2-D (base 100)", "planar", 2, planar_score(frequency_matrix("axial", D, 2, base=100.0)), True),
        ("M-RoPE sections (t, h, w)", "planar", 3, planar_score(frequency_matrix("mrope", D, 3)), True),
        ("interleaved (t, h, w)", "planar", 3, planar_score(frequency_matrix("interleaved", D, 3)), True),
        ("VRoPE groups (4 coordinates)", "planar", 4, planar_score(frequency_matrix("vrope", D, 4)), True),
    ]
    try:  # directional N-D RoPE, when the library provides it
        from ..rotations.directional import directional_matrix
    except ImportError:
        directional_matrix = None
    if directional_matrix is not None:
        try:
            W = directional_matrix(D, 2, "weyl", base=100.0)
        except (TypeError, ValueError):
            W = None
        if W is not None:
            rows.append(("directional 2-D (weyl)", "planar", 2, planar_score(W), True))
    g = torch.Generator().manual_seed(0)
    dense = torch.randn(4, 2, D // 2, generator=g) * (10.0 ** (-4.0 * torch.arange(D // 2) / D))
    rows.append(("dense per-head W (mixed/learned)", "planar", 2, planar_score(dense), True))
    rows += [
        ("GeoPE 1-D (app. F)", "geope", 1, geope_score(D), True),
        ("GeoPE 2-D", "geope", 2, geope_score(D), False),
        ("GeoPE 3-D", "geope", 3, geope_score(D), False),
        ("Linear GeoPE 2-D", "linear_geope", 2, linear_geope_score(D), True),
        ("Linear GeoPE 3-D", "linear_geope", 3, linear_geope_score(D), True),
    ]
    from ..nn.learned import GRAPE, ComRoPE, LieRE  # learned families, random weights (seeded)

    rows += [
        ("LieRE 2-D (random generators, blocks of 8)", "lie", 2, rotary_score(LieRE(D, block_size=8, seed=0)), False),
        ("ComRoPE-AP 2-D", "lie", 2, rotary_score(ComRoPE(D, variant="ap", seed=0)), True),
        ("ComRoPE-LD 2-D", "lie", 2, rotary_score(ComRoPE(D, variant="ld", seed=0)), True),
        ("GRAPE learned planes (t, h, w)", "grape", 3, rotary_score(GRAPE(D, 3, init_scale=0.5, seed=0)), True),
    ]
    return rows


def relative_table(
    head_dim: int = 96,
    *,
    num_trials: int = 256,
    max_position: float = 32.0,
    max_shift: float = 32.0,
    seed: int = 0,
    tolerance: float = 1e-4,
) -> list[dict]:
    """One row per family: max relative-position error, RMS score, their ratio and the verdict.

    ``exact`` is ``ratio <= tolerance`` (float32 rounding leaves about 1e-6 of the score scale);
    ``expected_exact`` is what the maths says, so a row where the two differ is a bug.
    """
    if head_dim % 16:
        raise ValueError(f"relative_table: `head_dim` must be divisible by 16 (M-RoPE sections), got {head_dim}")
    out = []
    for name, family, A, fn, expected in _families(head_dim):
        kw = dict(num_axes=A, head_dim=head_dim, num_trials=num_trials, max_position=max_position, seed=seed)
        err = relative_error(fn, max_shift=max_shift, **kw)
        scale = score_scale(fn, **kw)
        ratio = err / scale
        out.append({"name": name, "family": family, "num_axes": A, "max_error": err, "score_rms": scale,
                    "ratio": ratio, "exact": ratio <= tolerance, "expected_exact": expected})
    return out


def _quaternion(vec: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit quaternion (w, v) of rotation vectors ``vec (..., 3)``: ``cos(Θ/2) + sin(Θ/2) · axis``."""
    theta = vec.norm(dim=-1, keepdim=True)
    half = 0.5 * theta
    return torch.cos(half)[..., 0], 0.5 * torch.sinc(half / math.pi) * vec  # sin(Θ/2)/Θ = ½ sinc(Θ/2)


def geope_expected_kernel(
    pos_q: torch.Tensor,
    pos_k: torch.Tensor,
    head_dim: int,
    *,
    linear: bool = False,
    lam: float = 100.0,
    freq_style: str = "decreasing",
) -> torch.Tensor:
    """Exact ``E[⟨R_m q, R_n q⟩] / E[q·q]`` for isotropic q, GeoPE (or Linear GeoPE), float64.

    Per triple the expectation is ``tr(R_rel)/3 = (1 + 2 cos Θ_rel)/3`` with ``R_rel = R_mᵀ R_n``; from the
    quaternions, ``tr(R_rel) = 4 w² − 1`` with ``w`` the scalar part of ``r_m* r_n``. Pass-through channels
    count 1 each. ``linear=True`` uses Linear GeoPE's ``R(φ(n) − φ(m))``. Shapes broadcast: ``(..., A)``.
    """
    f = geope_frequencies(head_dim, lam, freq_style).double()
    pq, pk = torch.broadcast_tensors(pos_q.double(), pos_k.double())
    if linear:
        w = torch.cos(0.5 * rotation_vectors(pk - pq, f).norm(dim=-1))
    else:
        wm, vm = _quaternion(rotation_vectors(pq, f))
        wn, vn = _quaternion(rotation_vectors(pk, f))
        w = wm * wn + (vm * vn).sum(-1)  # scalar part of r_m* r_n
    n = f.numel()
    return ((4 * w * w - 1).sum(-1) + (head_dim - 3 * n)) / head_dim


def kernel_maps(head_dim: int = 96, radius: int = 15, move: tuple[float, float] = (40.0, 40.0)) -> dict:
    """Expected kernels (isotropic q) from a query to a ``(2r+1)²`` grid of offsets around it.

    Returns ``{name: (at_origin, moved)}`` for axial RoPE (base 100), GeoPE and Linear GeoPE (λ = 100):
    the query at ``(r, r)`` of a grid starting at 0, and the same offsets with the query moved by
    ``move``. Entry ``[i, j]`` is the offset ``(Δh, Δw) = (i − r, j − r)`` (rows = axis 0). A relative
    embedding gives identical maps.
    """
    off = torch.arange(-radius, radius + 1, dtype=torch.float64)
    grid = torch.stack(torch.meshgrid(off, off, indexing="ij"), -1)  # (2r+1, 2r+1, 2) offsets (h, w)
    centre = torch.tensor([float(radius), float(radius)], dtype=torch.float64)
    moved = centre + torch.tensor(move, dtype=torch.float64)
    W = frequency_matrix("axial", head_dim, 2, base=100.0)
    axial = expected_kernel(grid, W)
    out = {"axial RoPE (base 100)": (axial, axial)}  # depends on the offset only, by construction
    for name, linear in (("GeoPE", False), ("Linear GeoPE", True)):
        out[name] = tuple(geope_expected_kernel(c, c + grid, head_dim, linear=linear) for c in (centre, moved))
    return out
