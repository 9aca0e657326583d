"""Triton kernel for the planar rotary apply: one read of q/k and cos/sin, one write (CUDA only).

Same maths as :func:`ropekit.apply.planar.apply_rotary` (RoPE, Su et al. eq. 34): pair (x1, x2) becomes
``(x1·cos − x2·sin, x2·cos + x1·sin)`` in float32, rounded once to the input dtype; channels past the
rotary width are copied. Strided inputs are read in place (no ``.contiguous()``), so ``(B, L, H, D)``
tensors cost the same as ``(B, H, L, D)``. Training works: the backward pass is the same kernel with
``sin`` negated (a rotation's inverse is its transpose).

Triton is optional. This module imports without it; :func:`available` says whether the kernel can
run, and the kernel is only built on first use. With ``TRITON_INTERPRET=1`` the kernel also runs on
CPU tensors through Triton's interpreter, which is how it is tested on machines without a GPU.
"""
from __future__ import annotations

import functools
import os

import torch

__all__ = ["available", "supports", "apply_rotary_triton"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@functools.lru_cache(maxsize=None)
def _triton_importable() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # ImportError, or a broken install that fails while loading its backends
        return False
    return True


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def available(device: torch.device | str | None = None) -> bool:
    """True when the Triton kernel can run on ``device`` (CUDA with triton, or any device when interpreting)."""
    if not _triton_importable():
        return False
    if _interpreting():
        return True
    dev = torch.device(device) if device is not None else None
    return dev is not None and dev.type == "cuda" and torch.cuda.is_available()


def supports(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether these (already validated) tensors can take the Triton path; otherwise use the torch path."""
    tensors = (q, k, cos, sin)
    if any(t.device != q.device for t in tensors) or not available(q.device):
        return False
    if q.dtype not in _DTYPES or k.dtype not in _DTYPES:
        return False  # float64 keeps float64 maths on the torch path
    if cos.dtype not in _DTYPES or sin.dtype not in _DTYPES:
        return False
    return not (cos.requires_grad or sin.requires_grad)  # the kernel differentiates w.r.t. x only


@functools.lru_cache(maxsize=None)
def _kernel(interpret: bool):
    """Build the jitted kernel once per mode (Triton reads TRITON_INTERPRET when a kernel is defined)."""
    import triton
    import triton.language as tl

    @triton.jit
    def rope_kernel(
        x_ptr, c_ptr, s_ptr, o_ptr,
        n_rows, d1, d2,
        sx0, sx1, sx2, sx3,
        sc0, sc1, sc2, sc3,
        ss0, ss1, ss2, ss3,
        so0, so1, so2, so3,
        HALF: tl.constexpr, ROT: tl.constexpr, D: tl.constexpr,
        INTERLEAVED: tl.constexpr, NEG_SIN: tl.constexpr,
        BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_P: tl.constexpr,
    ):
        rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
        row_ok = rows < n_rows
        i2 = rows % d2
        rest = rows // d2
        i1 = rest % d1
        i0 = rest // d1
        x_row = (i0 * sx0 + i1 * sx1 + i2 * sx2)[:, None]
        c_row = (i0 * sc0 + i1 * sc1 + i2 * sc2)[:, None]
        s_row = (i0 * ss0 + i1 * ss1 + i2 * ss2)[:, None]
        o_row = (i0 * so0 + i1 * so1 + i2 * so2)[:, None]

        j = tl.arange(0, BLOCK_H)
        mask = row_ok[:, None] & (j < HALF)[None, :]
        if INTERLEAVED:
            ch1 = 2 * j
            ch2 = 2 * j + 1
        else:
            ch1 = j
            ch2 = j + HALF
        ch1 = ch1[None, :]
        ch2 = ch2[None, :]
        x1 = tl.load(x_ptr + x_row + ch1 * sx3, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_ptr + x_row + ch2 * sx3, mask=mask, other=0.0).to(tl.float32)
        c = tl.load(c_ptr + c_row + j[None, :] * sc3, mask=mask, other=0.0).to(tl.float32)
        s = tl.load(s_ptr + s_row + j[None, :] * ss3, mask=mask, other=0.0).to(tl.float32)
        if NEG_SIN:
            s = -s
        out_ty = o_ptr.dtype.element_ty
        tl.store(o_ptr + o_row + ch1 * so3, (x1 * c - x2 * s).to(out_ty), mask=mask)
        tl.store(o_ptr + o_row + ch2 * so3, (x2 * c + x1 * s).to(out_ty), mask=mask)
        if ROT < D:  # partial rotary: the tail channels pass through unchanged
            p = ROT + tl.arange(0, BLOCK_P)
            pmask = row_ok[:, None] & (p < D)[None, :]
            tail = tl.load(x_ptr + x_row + p[None, :] * sx3, mask=pmask, other=0.0)
            tl.store(o_ptr + o_row + p[None, :] * so3, tail.to(out_ty), mask=pmask)

    return rope_kernel


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _canonical(t: torch.Tensor, seq_dim: int) -> torch.Tensor:
    """View a ``(B, H, L, ·)``, ``(H, L, ·)`` or ``(B, L, H, ·)`` tensor as 4-D ``(B, H, L, ·)`` (no copy)."""
    if t.ndim == 3:
        t = t[None]
    return t.transpose(1, 2) if seq_dim == 1 else t


def _launch(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, channels: str, seq_dim: int, neg_sin: bool):
    """Rotate ``x`` with cos/sin already expanded to ``x.shape[:-1] + (R/2,)``; returns a new tensor."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    x4, c4, s4, o4 = (_canonical(t, seq_dim) for t in (x, c, s, out))
    B, H, L, D = x4.shape
    half = c4.shape[-1]
    n_rows = B * H * L
    if n_rows == 0 or D == 0:
        return out
    block_h = _next_pow2(half)
    block_p = _next_pow2(max(1, D - 2 * half))
    block_r = max(1, min(64, 4096 // max(block_h, block_p)))
    grid = (-(-n_rows // block_r),)
    _kernel(_interpreting())[grid](
        x4, c4, s4, o4,
        n_rows, H, L,
        *x4.stride(), *c4.stride(), *s4.stride(), *o4.stride(),
        HALF=half, ROT=2 * half, D=D,
        INTERLEAVED=channels == "interleaved", NEG_SIN=neg_sin,
        BLOCK_R=block_r, BLOCK_H=block_h, BLOCK_P=block_p,
    )
    return out


class _RotaryTriton(torch.autograd.Function):
    """Autograd wrapper: forward rotates by +θ, backward rotates the incoming gradient by −θ."""

    @staticmethod
    def forward(ctx, x, c, s, channels, seq_dim):  # type: ignore[override]
        ctx.save_for_backward(c, s)
        ctx.channels, ctx.seq_dim = channels, seq_dim
        return _launch(x, c, s, channels, seq_dim, neg_sin=False)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        c, s = ctx.saved_tensors
        return _launch(grad, c, s, ctx.channels, ctx.seq_dim, neg_sin=True), None, None, None, None


def expand_cos_sin(t: torch.Tensor, x: torch.Tensor, seq_dim: int) -> torch.Tensor | None:
    """Broadcast cos/sin to ``x.shape[:-1] + (R/2,)`` as a stride-0 view, or None if that would grow ``x``."""
    from .planar import _broadcast

    b = _broadcast(t, x, seq_dim)
    target = tuple(x.shape[:-1]) + (t.shape[-1],)
    try:
        if tuple(torch.broadcast_shapes(b.shape, target)) != target:
            return None
    except RuntimeError:
        return None
    return b.expand(target)


def apply_rotary_triton(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    channels: str = "half",
    seq_dim: int = -2,
) -> torch.Tensor:
    """Rotate one tensor with the Triton kernel (same arguments and checks as :func:`ropekit.apply_rotary`).

    Raises ``RuntimeError`` when Triton cannot run here (see :func:`available`); callers that want an
    automatic fallback use :func:`ropekit.apply.fused.apply_rotary_qk_fused`.
    """
    if not available(x.device):
        raise RuntimeError(
            "apply_rotary_triton needs triton and a CUDA tensor (or TRITON_INTERPRET=1); "
            "use ropekit.apply.fused.apply_rotary_qk_fused for an automatic fallback"
        )
    from .planar import _validate

    _, seq_dim = _validate(x, cos, sin, channels, seq_dim)
    c = expand_cos_sin(cos, x, seq_dim)
    s = expand_cos_sin(sin, x, seq_dim)
    if c is None or s is None:
        raise ValueError(
            f"cos/sin of shape {tuple(cos.shape)} would broadcast `x` {tuple(x.shape)} to a larger shape; "
            f"give cos/sin as (L, R/2), (B, L, R/2) or (B, H, L, R/2) matching `x`"
        )
    return _RotaryTriton.apply(x, c, s, channels, seq_dim)
