"""Stage 3 — learned Lie-algebra rotation families: LieRE and ComRoPE (block-diagonal generators).

A token at coordinates ``p (A,)`` rotates q/k by ``R(p) = exp(Σ_a p_a G_a)`` with ``G_a`` skew-symmetric
``D × D`` matrices, block-diagonal with ``n = D / b`` blocks of size ``b`` (channels ``[i·b, (i+1)·b)``
form block i). ``exp`` of a skew-symmetric matrix is a rotation, so norms are preserved and ``p = 0`` is the
identity. The generators are weights: each family is an ``nn.Module``.

- **LieRE** (Ostmeier et al., "LieRE: Generalizing Rotary Position Encodings"): every ``G_a`` is a free
  skew-symmetric matrix. ``G_a`` and ``G_b`` do not commute in general, so ``R(m)ᵀ R(n)`` is not a function of
  ``n − m``: LieRE is **not exactly relative** (``ropekit.analysis.relative`` measures by how much). With
  ``block_size=2`` every block is a 2-D rotation, they all commute, and LieRE reduces to a learned planar
  (RoPE-Mixed-like) family.
- **ComRoPE** (Yu et al., "ComRoPE: Scalable and Robust Rotary Position Embedding Parameterized by
  Trainable Commuting Angle Matrices"): the generators are constrained to commute, so
  ``exp(Σ p_a G_a) = Π_a exp(p_a G_a)`` and ``R(m)ᵀ R(n) = R(n − m)``: **exactly relative**.
  ``"ap"`` (axial partition): each block is split into A diagonal sub-blocks and ``G_a`` lives only in
  sub-block a. ``"ld"`` (linearly dependent): one skew-symmetric ``P`` per block and a scalar ``λ_a`` per
  axis, ``G_a = λ_a · P``.

The rotations are computed with ``torch.linalg.matrix_exp`` on ``(L, n, b, b)`` stacks: exact (to rounding)
and differentiable. Cost per layer is ``O(L · D · b²)``; see ``docs/learned.md`` for the defaults.
This module holds the maths (generators → rotations); ``ropekit.nn.learned`` wraps it in modules and
``ropekit.apply.blocks`` applies the rotations to q/k.
"""
from __future__ import annotations

import torch

__all__ = ["COMROPE_VARIANTS", "skew", "block_rotation", "commutator_norm", "comrope_ap_generators",
           "comrope_ld_generators", "check_coords", "check_int"]

COMROPE_VARIANTS = ("ap", "ld")


def check_int(value, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"`{name}` must be >= {minimum}, got {value}")
    return value


def skew(m: torch.Tensor) -> torch.Tensor:
    """The skew-symmetric part ``M − Mᵀ`` of square matrices ``(..., b, b)`` (any real matrix is a valid weight)."""
    return m - m.transpose(-1, -2)


def check_coords(coords: torch.Tensor, num_axes: int, owner: str) -> torch.Tensor:
    """Validate coordinates ``(L, A)`` or ``(B, L, A)``: real, finite, ``A == num_axes``."""
    if not isinstance(coords, torch.Tensor):
        raise TypeError(f"{owner}: `coords` must be a tensor (L, {num_axes}) or (B, L, {num_axes}), or a layout "
                        f"string, got {type(coords).__name__}")
    if coords.ndim not in (2, 3) or coords.shape[-1] != num_axes:
        raise ValueError(f"{owner}: `coords` must be (L, {num_axes}) or (B, L, {num_axes}) (num_axes={num_axes}), "
                         f"got shape {tuple(coords.shape)}")
    if coords.is_complex() or not (coords.is_floating_point() or coords.dtype in (torch.int32, torch.int64)):
        raise TypeError(f"{owner}: `coords` must be real numbers, got {coords.dtype}")
    if not torch.isfinite(coords).all():
        raise ValueError(f"{owner}: `coords` contain NaN or inf; positions must be finite")
    return coords


def block_rotation(coords: torch.Tensor, generators: torch.Tensor) -> torch.Tensor:
    """``exp(Σ_a p_a G_a)`` per token and block.

    ``coords (..., L, A)``; ``generators (A, n, b, b)`` or per head ``(H, A, n, b, b)`` (skew-symmetric).
    Returns ``(..., L, n, b, b)`` or ``(..., H, L, n, b, b)``, float32 (float64 if either input is).
    """
    work = torch.float64 if torch.float64 in (coords.dtype, generators.dtype) else torch.float32
    c, G = coords.to(work), generators.to(work)
    if G.ndim == 5:  # per head: (..., 1, L, A) against (H, 1, A, n, b, b)
        c, G = c[..., None, :, :], G[:, None]
    # Σ_a p_a G_a without a reduction that re-associates: sum of A broadcast products
    lin = sum(c[..., a, None, None, None] * G[..., a, :, :, :] for a in range(G.shape[-4]))
    return torch.linalg.matrix_exp(lin)


def commutator_norm(generators: torch.Tensor) -> float:
    """``max_{a<b} ‖G_a G_b − G_b G_a‖_max`` over blocks (and heads): 0 means the family is exactly relative."""
    G = generators.detach()
    A = G.shape[-4]
    worst = 0.0
    for a in range(A):
        for b in range(a + 1, A):
            ga, gb = G[..., a, :, :, :], G[..., b, :, :, :]
            worst = max(worst, float((ga @ gb - gb @ ga).abs().max()))
    return worst




def comrope_ap_generators(weight: torch.Tensor, block_size: int) -> torch.Tensor:
    """ComRoPE-AP generators ``([H,] A, n, b, b)`` from sub-block weights ``([H,] A, n, s, s)``, ``b = A·s``.

    Axis a's generator is ``skew(weight[a])`` placed on the a-th diagonal ``s × s`` sub-block of every block
    and zero elsewhere, so generators of different axes act on disjoint channels and commute.
    """
    A, s = weight.shape[-4], weight.shape[-1]
    if A * s != block_size:
        raise ValueError(f"comrope_ap_generators: {A} sub-blocks of {s} do not fill `block_size` {block_size}")
    S = skew(weight)
    G = S.new_zeros((*S.shape[:-2], block_size, block_size))
    for a in range(A):
        G[..., a, :, a * s:(a + 1) * s, a * s:(a + 1) * s] = S[..., a, :, :, :]
    return G


def comrope_ld_generators(weight: torch.Tensor, axis_scale: torch.Tensor) -> torch.Tensor:
    """ComRoPE-LD generators ``G_a = λ_a · skew(P)``: ``weight ([H,] n, b, b)``, ``axis_scale ([H,] A, n)``.

    All axes of a block share one direction ``skew(P)``, so they commute.
    """
    return axis_scale[..., None, None] * skew(weight).unsqueeze(-4)
