"""Expected positional kernels: what attention sees of position alone.

For q = k drawn isotropically, ``E[q · R(Δ) q] / E[q · q]`` equals the mean over rotated planes of
``cos(angle difference)`` (each 2×2 plane contributes ``cos φ_j``; pass-through channels contribute 1).
It is computed exactly here; Monte-Carlo estimates serve only as a check.
"""
from __future__ import annotations

import torch

from ..rotations.planar import angles

__all__ = ["expected_kernel", "kernel_between", "monte_carlo_kernel"]


def expected_kernel(delta: torch.Tensor, W: torch.Tensor, passthrough: int = 0) -> torch.Tensor:
    """Exact expected kernel for coordinate differences ``delta (..., A)`` under ``W (A, R/2)``.

    ``passthrough`` counts un-rotated channel pairs (partial rotary), each contributing 1. A per-head
    ``W (H, A, R/2)`` (MHRoPE) gives the mean over heads of each head's kernel.
    """
    if W.ndim == 3:
        flat = delta.reshape(-1, delta.shape[-1])
        heads = torch.stack([expected_kernel(flat, Wh, passthrough) for Wh in W])
        return heads.mean(0).reshape(delta.shape[:-1])
    phi = angles(delta.to(torch.float64), W.to(torch.float64))
    n = phi.shape[-1]
    return (torch.cos(phi).sum(-1) + passthrough) / (n + passthrough)


def kernel_between(coords_q: torch.Tensor, coords_k: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """Expected kernel between every query ``(Lq, A)`` and key ``(Lk, A)`` position: ``(Lq, Lk)``."""
    delta = coords_k.to(torch.float64)[None, :, :] - coords_q.to(torch.float64)[:, None, :]
    return expected_kernel(delta, W)


def monte_carlo_kernel(
    delta: torch.Tensor, W: torch.Tensor, num_samples: int = 4096, seed: int = 0, channels: str = "half"
) -> torch.Tensor:
    """Monte-Carlo estimate of the same kernel: mean of ``q · R(Δ) q`` over Gaussian q, over ``E[q·q]``."""
    from ..apply.planar import apply_rotary, cos_sin

    g = torch.Generator().manual_seed(seed)
    R = 2 * W.shape[-1]
    flat = delta.reshape(-1, delta.shape[-1]).to(torch.float64)
    q = torch.randn(num_samples, 1, 1, R, generator=g, dtype=torch.float64)
    cos, sin = cos_sin(angles(flat, W.to(torch.float64)))
    rq = apply_rotary(q.expand(num_samples, 1, flat.shape[0], R), cos, sin, channels=channels)
    num = (rq * q).sum(-1).mean(0)[0]
    return (num / float(R)).reshape(delta.shape[:-1])
