"""Fused Linear GeoPE kernels: each (query, key) pair's rotated score in one pass over the triples.

The eager path in :mod:`ropekit.apply.linear_geope` spends its time moving ``(pair, triple)`` temporaries
through memory. Written as one pointwise expression with a reduction over the triples, the same maths
compiles (``torch.compile``: C++ with SIMD on CPU, Triton on GPU) into a loop that keeps every per-pair
value in registers: per (pair, triple) two sines and about twenty multiply-adds, nothing stored.

Notation: ``q (..., Lq, 3, n)`` and ``k (..., Lk, 3, n)`` hold the triples channel-major (component c of
triple i at ``[c, i]``, so the triples are the contiguous, vectorised axis); ``eq (..., Lq, 3)`` and
``ek (..., Lk, 3)`` are the positions' Lie embeddings ``E p`` (their difference is the pair's displacement
P); ``w (n,)`` the frequencies. With ``r = ‖P‖``, unit axis ``a = P / r`` (0 when r = 0) and ``A_i = ω_i r``
(Rodrigues, GeoPE app. D):

    ⟨q_i, (R_i − I) k_i⟩ = sin A_i · a·(k_i × q_i) + vers A_i · ((a·q_i)(a·k_i) − q_i·k_i)
    (R_i − I) k = sin A · (a × k) + vers A · ((a·k) a − k),    (R_iᵀ − I) q = −sin A · (a × q) + vers A · ((a·q) a − q)

The identity part ``q·k`` is left to a plain matmul. ``vers A = 2 sin²(A/2)`` avoids the cancellation of
``1 − cos A`` near 0. The backward pass recomputes everything from q, k and the positions, so only
``(…, Lq, Lk)`` tensors ever exist: memory stays ``O(block · L)``.
"""
from __future__ import annotations

import functools
import math

import torch

__all__ = ["fused_rotated_scores"]


def _pair_geometry(eq: torch.Tensor, ek: torch.Tensor, planar: bool):
    """Pair distance ``r`` and the axis components, each ``(..., Lq, Lk, 1)``; with ``planar`` (1-D and
    2-D positions, whose embeddings have first component 0) the first axis component is None (zero)."""
    P = [None if planar and c == 0 else ek[..., None, :, c : c + 1] - eq[..., :, None, c : c + 1] for c in range(3)]
    r = _dot(P, P).sqrt()  # written out, not a .sum over a length-3 axis (a masked vector loop when compiled)
    inv = torch.where(r > 0, 1.0 / torch.where(r > 0, r, 1.0), 0.0)
    return r, [None if p is None else p * inv for p in P]


_PI_HI = 3.140625  # π in two parts for the reduction: m·_PI_HI is exact for |m| < 2**16
_PI_LO = math.pi - _PI_HI


def _sin_vers(r: torch.Tensor, w: torch.Tensor):
    """``sin A`` and ``vers A = 2 sin²(A/2)`` for ``A = r ω``, ``(..., Lq, Lk, n)``.

    float32: both from one shared reduction of ``A/2`` modulo π and Taylor polynomials of sin and cos on
    ``[−π/2, π/2]`` (truncation below 6e-8; |error| ≤ 1e-6 against float64 for A up to 50, the size of
    float32's own rounding of A), about 1.5× faster than two library sines when compiled. float64: the
    library sine.
    """
    A = r * w
    if A.dtype == torch.float64:
        half = torch.sin(0.5 * A)
        return torch.sin(A), 2.0 * half * half
    h = 0.5 * A
    m = torch.round(h * (1.0 / math.pi))
    z = (h - m * _PI_HI) - m * _PI_LO  # sin h and cos h flip sign together (m odd): the products s, v do not
    z2 = z * z
    sz = z * (1 + z2 * (-1 / 6 + z2 * (1 / 120 + z2 * (-1 / 5040 + z2 * (1 / 362880 + z2 * (-1 / 39916800))))))
    cz = 1 + z2 * (-1 / 2 + z2 * (1 / 24 + z2 * (-1 / 720 + z2 * (1 / 40320 + z2 * (-1 / 3628800 + z2 / 479001600)))))
    return 2.0 * sz * cz, 2.0 * sz * sz


def _mul(u, v):
    return None if u is None or v is None else u * v


def _sum(*terms):
    terms = [t for t in terms if t is not None]
    out = terms[0]
    for t in terms[1:]:
        out = out + t
    return out


def _neg(u):
    return None if u is None else -u


def _cross(u, v):
    """``u × v`` of component lists; None components are zeros."""
    return [_sum(_mul(u[i], v[j]), _neg(_mul(u[j], v[i]))) for i, j in ((1, 2), (2, 0), (0, 1))]


def _dot(u, v):
    return _sum(*(_mul(a, b) for a, b in zip(u, v)))


def _queries(q):  # components, each (..., Lq, 1, n)
    return [q[..., :, None, c, :] for c in range(3)]


def _keys(k):  # components, each (..., 1, Lk, n)
    return [k[..., None, :, c, :] for c in range(3)]


def rotated_scores(q, k, eq, ek, w, planar: bool = False):
    """``Σ_i ⟨q_i, (R_i − I) k_i⟩`` of every pair, ``(..., Lq, Lk)``."""
    r, a = _pair_geometry(eq, ek, planar)
    s, v = _sin_vers(r, w)
    qc, kc = _queries(q), _keys(k)
    return (s * _dot(a, _cross(kc, qc)) + v * (_dot(a, qc) * _dot(a, kc) - _dot(qc, kc))).sum(-1)


def rotated_query_grad(g, k, eq, ek, w, planar: bool = False):
    """``Σ_n g_mn (R_i − I) k_n`` per query and triple, ``(..., Lq, 3, n)``, for ``g (..., Lq, Lk)``.

    With ``R(P)ᵀ = R(−P)`` the keys' gradient is the same sum with the roles swapped:
    ``rotated_query_grad(gᵀ, q, ek, eq, w)`` (a reduction over the inner axis either way).
    """
    r, a = _pair_geometry(eq, ek, planar)
    s, v = _sin_vers(r, w)
    kc = _keys(k)
    a_k, ak = _cross(a, kc), _dot(a, kc)
    gs, gv = g[..., None] * s, g[..., None] * v
    return torch.stack([_sum(_mul(gs, a_k[c]), gv * _sum(_mul(ak, a[c]), -kc[c])).sum(-2) for c in range(3)], dim=-2)


@functools.lru_cache(maxsize=None)
def _kernels(compiled: bool):
    fns = (rotated_scores, rotated_query_grad)
    if not compiled:
        return fns
    # automatic dynamic shapes: the first shape compiles static (n and the 3 components stay constants,
    # so the triple loop has no tail), a later shape recompiles with only its changed sizes symbolic
    # The polynomial sine is many operations used twice; by default inductor would store it in a buffer
    # (a second pass over memory), a higher threshold keeps it in registers.
    options = {"realize_opcount_threshold": 1000, "realize_reads_threshold": 1000, "realize_acc_reads_threshold": 1000}
    return tuple(torch.compile(f, fullgraph=True, options=options) for f in fns)


class _FusedRotated(torch.autograd.Function):
    """The rotated scores with a backward that recomputes the pair geometry (nothing pair × triple saved)."""

    @staticmethod
    def forward(ctx, q, k, eq, ek, w, planar, compiled):
        ctx.save_for_backward(q, k, eq, ek, w)
        ctx.planar, ctx.compiled = planar, compiled
        return _kernels(compiled)[0](q, k, eq, ek, w, planar)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        q, k, eq, ek, w = ctx.saved_tensors
        grad = _kernels(ctx.compiled)[1]
        gq = gk = None
        if ctx.needs_input_grad[0]:
            gq = grad(g.contiguous(), k, eq, ek, w, ctx.planar).sum_to_size(q.shape)
        if ctx.needs_input_grad[1]:
            gk = grad(g.transpose(-1, -2).contiguous(), q, ek, eq, w, ctx.planar).sum_to_size(k.shape)
        return gq, gk, None, None, None, None, None


def fused_rotated_scores(q, k, eq, ek, w, *, planar: bool = False, compiled: bool = True) -> torch.Tensor:
    """``Σ_i ⟨q_i, (R_i − I) k_i⟩``, ``(B, H, Lq, Lk)``, differentiable in q and k.

    ``q (B, H, Lq, 3, n)``, ``k (B, H, Lk, 3, n)`` channel-major triples, ``eq (Pb, 1, Lq, 3)``,
    ``ek (Pb, 1, Lk, 3)`` Lie embeddings (Pb = 1 or B), ``w (n,)``, all of one floating dtype.
    ``planar=True`` promises that the embeddings' first component is 0 (1-D and 2-D positions) and skips
    it. ``compiled=False`` runs the same expressions eagerly (it then materialises ``(…, Lq, Lk, n)``
    tensors: for checks on small inputs only).
    """
    return _FusedRotated.apply(q.contiguous(), k.contiguous(), eq.contiguous(), ek.contiguous(), w, planar, compiled)
