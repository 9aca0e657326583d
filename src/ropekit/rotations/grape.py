"""Stage 3 — GRAPE's multiplicative rotations (Zhang et al., "Group Representational Position Encoding").

Multiplicative GRAPE acts on q/k with ``G(p) = exp(Σ_j θ_j(p) L_j)``, a sum of rank-2 skew-symmetric
generators ``L_j = b_j a_jᵀ − a_j b_jᵀ`` for orthonormal ``a_j, b_j`` (``exp(θ L_j)`` turns ``a_j`` towards
``b_j`` by θ and leaves the orthogonal complement of the plane alone). When the planes are mutually
orthogonal the ``L_j`` commute and ``G(n − m) = G(m)ᵀ G(n)``: exactly relative.

- **Canonical** planes are coordinate pairs; with ``θ_j = ω_j · p_{axis(j)}`` and a log-uniform spectrum
  ``ω_j = base^{−2j/R}`` this is RoPE. GRAPE's multimodal canonical modes differ only in the axis map:
  ``"chunked"`` gives consecutive sections of planes to t, h, w (default sections ``[16, 24, 24]`` scaled to
  ``R/2``, M-RoPE) and ``"interleaved"`` gives plane j to axis ``j mod A`` (MRoPE-Interleave).
  ``log_freq_scale = s`` replaces ``ω`` by ``ω^{1/s}``.
- **Learned commuting planes**: the planes are the columns of a learned orthogonal matrix ``Q``; plane j is
  ``span(Q[:, j], Q[:, j + R/2])`` (ropekit's ``"half"`` channel pairing), so ``G(p) = Q · RoPE(p) · Qᵀ`` on
  those R dimensions and the identity on the rest (``ropekit.apply.blocks.apply_plane_rotation``).

This module builds the axis map and spectrum (:func:`grape_frequency_matrix`, a ``W (A, R/2)`` as for every
planar family, from GRAPE's own description rather than ropekit's allocations) and the rank-2 generators.
"""
from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["GRAPE_MODES", "grape_axis_map", "grape_spectrum", "grape_frequency_matrix", "plane_generator"]

GRAPE_MODES = ("chunked", "interleaved")


def _half(rotary_dim) -> int:
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int):
        raise TypeError(f"`rotary_dim` must be an int, got {type(rotary_dim).__name__}")
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(f"`rotary_dim` must be a positive even number (one plane per channel pair), got {rotary_dim}")
    return rotary_dim // 2


def grape_axis_map(mode: str, rotary_dim: int, num_axes: int = 3,
                   sections: Sequence[int] | None = None) -> torch.Tensor:
    """Axis of each of the ``R/2`` canonical planes (int64): ``"chunked"`` sections or ``"interleaved"``."""
    half = _half(rotary_dim)
    if isinstance(num_axes, bool) or not isinstance(num_axes, int) or num_axes < 1:
        raise ValueError(f"`num_axes` must be an int >= 1, got {num_axes!r}")
    if mode not in GRAPE_MODES:
        raise ValueError(f"GRAPE `mode` must be one of {GRAPE_MODES}, got {mode!r}")
    if mode == "interleaved":
        if sections is not None:
            raise ValueError("GRAPE mode 'interleaved' gives plane j to axis j mod A; `sections` apply to 'chunked'")
        return torch.arange(half) % num_axes
    if sections is None:
        if half % 8:
            raise ValueError(f"GRAPE 'chunked' needs `sections` for rotary_dim={rotary_dim}; the default "
                             f"[16, 24, 24] scales only to rotary_dim divisible by 16")
        sections = [half // 4, 3 * half // 8, 3 * half // 8]
    secs = [int(s) for s in sections]
    if any(s < 0 for s in secs) or sum(secs) != half:
        raise ValueError(f"`sections` {list(sections)} must be non-negative and sum to rotary_dim/2 = {half}")
    return torch.cat([torch.full((s,), i % num_axes) for i, s in enumerate(secs)]).long()


def grape_spectrum(rotary_dim: int, base: float = 10000.0, log_freq_scale: float = 1.0) -> torch.Tensor:
    """Log-uniform plane frequencies ``ω_j = (base^{−2j/R})^{1/s}`` (float32).

    ``base^{−2j/R}`` is evaluated as ``1 / base^{(2j)/R}`` in float32, the expression of the Hugging Face
    and multimodal reference code, so canonical GRAPE reproduces their cos/sin bit for bit.
    """
    half = _half(rotary_dim)
    for name, v in (("base", base), ("log_freq_scale", log_freq_scale)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
            raise ValueError(f"`{name}` must be a finite number > 0, got {v!r}")
    omega = 1.0 / (float(base) ** (2 * torch.arange(half, dtype=torch.int64).float() / rotary_dim))
    return omega if log_freq_scale == 1 else omega ** (1.0 / float(log_freq_scale))


def grape_frequency_matrix(mode: str, rotary_dim: int, num_axes: int = 3, *, base: float = 10000.0,
                           sections: Sequence[int] | None = None, log_freq_scale: float = 1.0) -> torch.Tensor:
    """``W (num_axes, R/2)``: plane j turns by ``θ_j = ω_j · p_{axis(j)}`` (``W[axis(j), j] = ω_j``)."""
    axis = grape_axis_map(mode, rotary_dim, num_axes, sections)
    omega = grape_spectrum(rotary_dim, base, log_freq_scale)
    W = torch.zeros(num_axes, omega.numel())
    W[axis, torch.arange(omega.numel())] = omega
    return W


def plane_generator(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Rank-2 skew generator ``L = b aᵀ − a bᵀ`` of the plane spanned by orthonormal ``a, b (D,)``.

    ``exp(θ L) = I + sin θ · L + (1 − cos θ) · L²`` rotates ``a`` to ``cos θ a + sin θ b``.
    """
    return torch.outer(b, a) - torch.outer(a, b)
