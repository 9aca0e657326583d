"""Fused apply path: the planar rotary apply with fewer passes over memory, same results.

:func:`apply_rotary_qk_fused` has the semantics of :func:`ropekit.apply.planar.apply_rotary_qk`
(RoPE, Su et al. eq. 34; ``"half"``/``"interleaved"`` pairs, partial rotary, float32 maths, output in
the input dtype, ``seq_dim`` read as a dim index: -2/2 for ``(B, H, L, D)``, 1/-3 for ``(B, L, H, D)``)
and picks the cheapest backend:

- CUDA tensors with triton installed: one Triton kernel per tensor (:mod:`.triton_rope`), which reads
  q/k and cos/sin once and writes the result once.
- inside ``torch.compile``: a purely functional formulation with no data-dependent branches, which
  Inductor fuses into a single loop (``fullgraph=True`` compiles it without graph breaks).
- otherwise (eager CPU, float64, gradients w.r.t. cos/sin): the reference's operations run block by
  block along the sequence, so float32 temporaries stay in cache, writing straight into the output.

All three give the eager reference's float32 results (bit-for-bit on the torch paths; the Triton
kernel may fuse a multiply-add, a difference of one float32 rounding).
"""
from __future__ import annotations

import torch

from . import triton_rope
from ._parallel import run_blocks
from .planar import _broadcast, _validate, check_finite

__all__ = ["apply_rotary_fused", "apply_rotary_qk_fused", "rotate_functional"]


def _work_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def rotate_functional(
    x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, channels: str, rot: int
) -> torch.Tensor:
    """Out-of-place rotation of validated input with cos/sin broadcastable to ``x[..., :R/2]``.

    Written for tracing: only shape-static branches, no in-place writes, so a compiler can fuse it.
    """
    work = _work_dtype(x)
    c = c.to(work)
    s = s.to(work)
    xr = x[..., :rot].to(work)
    if channels == "half":
        x1, x2 = xr[..., : rot // 2], xr[..., rot // 2 :]
        out = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    else:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        out = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    out = out.to(x.dtype)
    if rot == x.shape[-1]:
        return out
    return torch.cat((out, x[..., rot:]), dim=-1)


# Elements of x per eager block: float32 temporaries of this size (1 MiB) stay in a core's cache.
_BLOCK_ELEMS = 1 << 18


def _rotate_block(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, out: torch.Tensor, channels: str, rot: int):
    """Rotate one block of ``x`` into the matching block of ``out`` (float32 maths, one rounding)."""
    xf = x[..., :rot].to(c.dtype)
    if channels == "half":
        x1, x2 = xf[..., : rot // 2], xf[..., rot // 2 :]
        o1, o2 = out[..., : rot // 2], out[..., rot // 2 : rot]
    else:
        x1, x2 = xf[..., 0::2], xf[..., 1::2]
        o1, o2 = out[..., 0:rot:2], out[..., 1:rot:2]
    torch.sub(x1 * c, x2 * s, out=o1)
    torch.add(x2 * c, x1 * s, out=o2)
    if rot < x.shape[-1]:
        out[..., rot:] = x[..., rot:]


def _rotate_eager(
    x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, channels: str, rot: int, seq_dim: int,
    jobs: list | None = None,
) -> torch.Tensor:
    """Eager rotation in cache-sized blocks along the sequence, written straight into the output.

    The reference makes about ten full passes over float32 temporaries; here each block's temporaries
    stay in cache, so memory sees roughly one read of x and one write of the output. With several torch
    threads the blocks run concurrently (:func:`._parallel.run_blocks`), each block single-threaded. The
    operations and their order are the reference's, so results are identical bit for bit. With ``jobs``
    the blocks are appended there for the caller to run (q's and k's blocks in one pool pass) and
    ``out`` is only complete after that.
    """
    work = _work_dtype(x)
    c = c.to(work)
    s = s.to(work)
    shape = torch.broadcast_shapes(x.shape[:-1] + (rot // 2,), c.shape, s.shape)
    if shape != x.shape[:-1] + (rot // 2,) or x.requires_grad or c.requires_grad or s.requires_grad:
        return rotate_functional(x, c, s, channels, rot)  # broadcasting grows x, or autograd: stay functional
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    ldim = x.ndim - 2 if seq_dim == -2 else 1
    cdim, sdim = ldim - (x.ndim - c.ndim), ldim - (x.ndim - s.ndim)
    L = x.shape[ldim]
    step = max(1, (_BLOCK_ELEMS * L) // max(1, x.numel()))
    if x.device.type != "cpu" or step >= L:
        _rotate_block(x, c, s, out, channels, rot)
        return out
    def block(i: int, n: int):
        return lambda: _rotate_block(x.narrow(ldim, i, n), c.narrow(cdim, i, n), s.narrow(sdim, i, n),
                                     out.narrow(ldim, i, n), channels, rot)

    blocks = [block(i, min(step, L - i)) for i in range(0, L, step)]
    if jobs is None:
        run_blocks(blocks)
    else:
        jobs.extend(blocks)
    return out


def _rotate_one(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, channels: str, seq_dim: int, rot: int,
                use_triton: bool, jobs: list | None = None) -> torch.Tensor:
    if use_triton:
        return triton_rope.apply_rotary_triton(x, cos, sin, channels=channels, seq_dim=seq_dim)
    c = _broadcast(cos, x, seq_dim)
    s = _broadcast(sin, x, seq_dim)
    if torch.compiler.is_compiling():
        return rotate_functional(x, c, s, channels, rot)
    return _rotate_eager(x, c, s, channels, rot, seq_dim, jobs)


def _triton_ok(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, seq_dim: int) -> bool:
    if torch.compiler.is_compiling() or not triton_rope.supports(q, k, cos, sin):
        return False
    return all(triton_rope.expand_cos_sin(t, x, seq_dim) is not None for x in (q, k) for t in (cos, sin))


def apply_rotary_qk_fused(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    channels: str = "half",
    seq_dim: int = -2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries and keys like :func:`ropekit.apply_rotary_qk`, on the fastest available backend.

    ``q``/``k`` are ``(B, H, L, D)`` (``seq_dim=-2`` or ``2``) or ``(B, L, H, D)`` (``seq_dim=1`` or ``-3``) and may have
    different head counts (grouped-query attention); ``cos``/``sin`` are ``(L, R/2)``, ``(B, L, R/2)``
    or ``(B, H, L, R/2)`` with ``R <= D`` rotary channels, their batch q's or 1 (see :func:`ropekit.apply_rotary`).
    """
    rot, seq_dim = _validate(q, cos, sin, channels, seq_dim, "q", finite=False)
    if _validate(k, cos, sin, channels, seq_dim, "k", finite=False)[1] != seq_dim:
        raise ValueError(f"`k` {tuple(k.shape)} must have the rank of `q` {tuple(q.shape)}")
    return _apply((q, k), cos, sin, channels, seq_dim, rot)


def _apply(xs: tuple, cos: torch.Tensor, sin: torch.Tensor, channels: str, seq_dim: int, rot: int) -> tuple:
    """Rotate the validated tensors ``xs`` (one or q and k) with cos/sin whose values are not yet checked."""
    use_triton = _triton_ok(xs[0], xs[-1], cos, sin, seq_dim)
    jobs: list = []  # eager CPU blocks of every tensor, run together on the worker threads
    out = tuple(_rotate_one(x, cos, sin, channels, seq_dim, rot, use_triton, jobs) for x in xs)
    # cos/sin are checked once for all tensors, in the working dtype of any (float32 unless all are float64)
    dtype = torch.float64 if all(x.dtype == torch.float64 for x in xs) else torch.float32
    if jobs:  # never under torch.compile or on accelerators: nothing there is deferred
        # the checks run as jobs too, so no multi-threaded op runs out here
        run_blocks(_finite_checks(cos, sin, dtype, pieces=max(1, len(jobs) // 8)) + jobs)
    else:
        check_finite(cos, "cos", dtype)
        check_finite(sin, "sin", dtype)
    return out


def _finite_checks(cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype, pieces: int) -> list:
    """Jobs checking that cos/sin are finite (:func:`.planar.check_finite`), each over a slice of positions.

    With several torch threads a multi-threaded reduction over the tables would be one more fork/join
    (each costing milliseconds when a sibling thread is descheduled); as jobs they share the block pool."""
    return [lambda arg=arg, part=part: check_finite(part, arg, dtype)
            for arg, t in (("cos", cos), ("sin", sin))
            for part in t.tensor_split(min(pieces, max(1, t.shape[-2])), dim=-2)]


def apply_rotary_fused(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    channels: str = "half",
    seq_dim: int = -2,
) -> torch.Tensor:
    """Single-tensor form of :func:`apply_rotary_qk_fused` (same backends, same semantics)."""
    rot, seq_dim = _validate(x, cos, sin, channels, seq_dim, finite=False)
    return _apply((x,), cos, sin, channels, seq_dim, rot)[0]
