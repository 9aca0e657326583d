"""Mixed / learned RoPE (RoPE-Mixed, Heo et al. "Rotary Position Embedding for Vision Transformer").

The frequency matrix ``W (heads, A, R/2)`` is a learnable parameter of each layer (docs/conventions.md, "Directional N-D RoPE and RoPE-Mixed"). Its
initialisation gives every head its own random rotation ``Q_h ∈ SO(A)`` of the axis directions: the
R/2 frequency pairs split into A contiguous groups of ``n = R/(2A)`` pairs, group g points along the
column ``Q_h[:, g]`` and pair j of a group has magnitude ``θ^{-j/n}`` (θ = 10). For the 2-D case this is
rope-vit's initialisation: two orthogonal directions at a random angle per head, magnitudes
``θ^{-4j/R}``, j = 0 … R/4-1.

This module holds the frequencies; the learnable rotary object that applies them,
:class:`ropekit.MixedFrequencies`, is in :mod:`ropekit.apply.mixed` (rotations sit below apply).
"""
from __future__ import annotations

import math

import torch

from .planar import _check_dim, check_base, check_count, check_seed

__all__ = ["mixed_init"]


# per-layer sizes beyond any model's: a random rotation per head is a QR of num_axes × num_axes
_MAX_HEADS = 1 << 12
_MAX_AXES = 1 << 8


def _random_rotation(dims: int, generator: torch.Generator) -> torch.Tensor:
    """A uniformly random rotation of R^dims (float64): an angle for 2-D, sign-fixed QR otherwise."""
    if dims == 2:
        a = float(torch.rand((), generator=generator, dtype=torch.float64)) * 2 * math.pi
        return torch.tensor([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]], dtype=torch.float64)
    g = torch.randn(dims, dims, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(g)
    q = q * torch.sign(torch.diagonal(r))[None, :]  # Haar-distributed on O(dims)
    if torch.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


def mixed_init(
    rotary_dim: int,
    num_heads: int,
    num_axes: int = 2,
    *,
    theta: float = 10.0,
    seed: int | None = None,
) -> torch.Tensor:
    """Initial RoPE-Mixed frequencies ``W (num_heads, num_axes, rotary_dim/2)`` float32 (module docstring).

    ``W[h, :, g·n + j] = θ^{-j/n} · Q_h[:, g]`` with ``n = rotary_dim / (2·num_axes)`` and a random
    rotation ``Q_h`` per head (seeded by ``seed``).
    """
    _check_dim(rotary_dim)
    check_count(num_heads, "num_heads", _MAX_HEADS)
    check_count(num_axes, "num_axes", _MAX_AXES)
    check_base(theta, "theta")
    check_seed(seed)
    half = rotary_dim // 2
    if half % num_axes:
        raise ValueError(
            f"RoPE-Mixed splits rotary_dim/2 = {half} pairs evenly over num_axes = {num_axes} axis directions; "
            f"choose rotary_dim divisible by {2 * num_axes}"
        )
    n = half // num_axes
    gen = torch.Generator()
    gen.manual_seed(seed) if seed is not None else gen.seed()
    mag = float(theta) ** (-torch.arange(n, dtype=torch.float64) / n)  # (n,)
    if float(mag[-1]) < torch.finfo(torch.float32).tiny:
        raise ValueError(f"`theta` = {theta!r} is too large: its frequencies underflow float32")
    heads = []
    for _ in range(num_heads):
        q = _random_rotation(num_axes, gen)  # columns: the head's orthonormal directions
        heads.append((q[:, :, None] * mag[None, None, :]).reshape(num_axes, half))
    return torch.stack(heads).float()
