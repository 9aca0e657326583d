"""Stage 4 — apply planar rotations to q and k (eager reference path).

Conventions: q/k are ``(B, H, L, D)`` (``seq_dim=-2`` or ``2``) or ``(B, L, H, D)`` (``seq_dim=1`` or ``-3``);
``seq_dim`` is read as a PyTorch dim index and any other value is an error;
channel layout ``"half"`` pairs (j, j + R/2), ``"interleaved"`` pairs (2j, 2j+1); ``R = 2·cos.shape[-1]``
may be smaller than D (partial rotary: the tail passes through). Maths in float32 (or float64 for
float64 input); the output has the input's dtype.
"""
from __future__ import annotations

import math

import torch

from ._inputs import canonical_seq_dim

__all__ = ["cos_sin", "apply_rotary", "apply_rotary_qk", "CHANNEL_LAYOUTS"]

CHANNEL_LAYOUTS = ("half", "interleaved")


def cos_sin(angles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of float32 angles (computed once, shared by every layer that uses them)."""
    if not isinstance(angles, torch.Tensor):
        raise TypeError(f"cos_sin: `angles` must be a tensor (e.g. from ropekit.angles), got {type(angles).__name__}")
    if not angles.is_floating_point():
        raise TypeError(f"cos_sin: `angles` must be a floating-point tensor, got {angles.dtype}")
    a = angles.float() if angles.dtype != torch.float64 else angles
    return torch.cos(a), torch.sin(a)


def _broadcast(t: torch.Tensor, x: torch.Tensor, seq_dim: int) -> torch.Tensor:
    """Shape cos/sin ``(L, R/2)``, ``(B, L, R/2)`` or ``(B, H, L, R/2)`` to broadcast against ``x``.

    A 3-D ``x`` is one ``(H, L, D)`` sample: the tables' batch (checked to be 1) is dropped."""
    if x.ndim == 3 and t.ndim > 2:
        return t[0]
    if t.ndim == 2:
        return t if seq_dim == -2 else t[:, None, :]
    if t.ndim == 3:
        return t[:, None] if seq_dim == -2 else t[:, :, None]
    if t.ndim == 4:
        return t if seq_dim == -2 else t.transpose(1, 2)
    raise ValueError(f"cos/sin must have 2, 3 or 4 dims ((L,R/2), (B,L,R/2), (B,H,L,R/2)), got {tuple(t.shape)}")


def _validate(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, channels: str, seq_dim, name: str = "x",
    *, finite: bool = True,
) -> tuple[int, int]:
    """Check one apply call on tensor ``name``; returns the rotary width and the canonical ``seq_dim`` (-2 or 1).

    ``finite=False`` leaves the values of cos/sin to the caller (:func:`check_finite` on each of them)."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"apply_rotary: `{name}` must be a floating-point tensor, got {getattr(x, 'dtype', type(x))}")
    for arg, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(
                f"apply_rotary: `{arg}` must be a floating-point tensor (L, R/2), (B, L, R/2) or (B, H, L, R/2) "
                f"(from ropekit.cos_sin), got {getattr(t, 'dtype', type(t).__name__)}"
            )
        if t.ndim not in (2, 3, 4):
            raise ValueError(
                f"apply_rotary: `{arg}` must have 2, 3 or 4 dims ((L, R/2), (B, L, R/2), (B, H, L, R/2)), "
                f"got shape {tuple(t.shape)}"
            )
    if channels not in CHANNEL_LAYOUTS:
        raise ValueError(f"`channels` must be 'half' or 'interleaved', got {channels!r}")
    seq_dim = canonical_seq_dim(seq_dim, x.ndim)
    if cos.shape != sin.shape:
        raise ValueError(f"cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must have the same shape")
    if finite:
        for arg, t in (("cos", cos), ("sin", sin)):
            check_finite(t, arg, x.dtype)
    D = x.shape[-1]
    rot = 2 * cos.shape[-1]
    if D % 2:
        raise ValueError(f"head_dim must be even to rotate channel pairs, got head_dim={D} (last dim of `{name}`)")
    if rot > D:
        raise ValueError(
            f"cos/sin cover {rot} channels but head_dim is {D} (last dim of `{name}`); build the frequencies "
            f"with rotary_dim <= head_dim"
        )
    _check_table_batch(x, cos, name)
    heads = x.shape[0] if x.ndim == 3 else x.shape[1] if seq_dim == -2 else x.shape[2]
    if cos.ndim == 4 and cos.shape[1] not in (1, heads):
        raise ValueError(
            f"cos/sin have {cos.shape[1]} per-head tables but `x` has {heads} heads; give one table per head "
            f"(repeat each KV head's table over its query group, as ropekit.RoPE.rotate does) or a single one"
        )
    L = x.shape[seq_dim]
    if cos.shape[-2] != L:
        raise ValueError(
            f"cos/sin have {cos.shape[-2]} positions but `{name}` has sequence length {L} at dim {seq_dim} "
            f"(`seq_dim`: -2/2 for (B, H, L, D), 1/-3 for (B, L, H, D))"
        )
    return rot, seq_dim


def _check_table_batch(x: torch.Tensor, cos: torch.Tensor, name: str) -> None:
    """Batched cos/sin must have x's batch or 1: broadcasting would silently return a tensor of another shape."""
    if cos.ndim == 2 or cos.shape[0] == 1:
        return
    if x.ndim == 3:
        raise ValueError(
            f"apply_rotary: `cos`/`sin` {tuple(cos.shape)} hold tables for {cos.shape[0]} samples but `{name}` "
            f"{tuple(x.shape)} is one (H, L, D) sample; pass `{name}` as (B, H, L, D), or cos/sin as (L, R/2) "
            f"(per-head tables as (1, H, L, R/2))"
        )
    if cos.shape[0] != x.shape[0]:
        raise ValueError(
            f"apply_rotary: `cos`/`sin` {tuple(cos.shape)} hold tables for {cos.shape[0]} samples but `{name}` has "
            f"batch {x.shape[0]}; give one table per sample ((B, L, R/2) or (B, H, L, R/2)) or one shared "
            f"((L, R/2), or batch 1)"
        )


def check_finite(t: torch.Tensor, arg: str, dtype: torch.dtype) -> None:
    """cos/sin ``t`` must be finite in the working precision of input ``dtype`` (checked on CPU only, where it
    costs no device sync). One pass, no temporary: the smallest and largest value are finite in the working
    dtype exactly when every value is (NaN propagates into both; the cast is monotonic)."""
    if torch.compiler.is_compiling() or t.device.type != "cpu" or t.numel() == 0:
        return
    work = torch.float64 if dtype == torch.float64 else torch.float32
    if not all(math.isfinite(float(v.to(work))) for v in torch.aminmax(t.detach())):
        raise ValueError(f"apply_rotary: `{arg}` holds NaN or inf in {work}; positions or angles are not finite")


def apply_rotary(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    channels: str = "half",
    seq_dim: int = -2,
) -> torch.Tensor:
    """Rotate channel pairs of ``x`` by the angles whose cos/sin are given (RoPE, Su et al. eq. 34).

    ``seq_dim`` is the sequence dim of ``x``: ``-2``/``2`` for ``(B, H, L, D)``, ``1``/``-3`` for
    ``(B, L, H, D)``; other values raise ``ValueError``. A 3-D ``x`` is one sample ``(H, L, D)`` (``seq_dim``
    ``-2`` or ``1``).

    ``cos``/``sin`` (from :func:`cos_sin`) are ``(L, R/2)`` shared by every sample, ``(B, L, R/2)`` one table
    per sample, or ``(B, H, L, R/2)`` one per sample and head (``H`` may be 1). Their batch ``B`` must be x's
    batch or 1; for a 3-D ``x`` it must be 1. A 3-D table is always read as per sample: per-head tables
    ``(H, L, R/2)`` (e.g. RoPE-Mixed's) must be passed as ``(1, H, L, R/2)`` (``cos[None]``), since by shape
    alone they cannot be told from a batch. Anything else raises ``ValueError``; the output has x's shape.
    """
    rot, seq_dim = _validate(x, cos, sin, channels, seq_dim)
    dtype = x.dtype
    work = torch.float64 if dtype == torch.float64 else torch.float32
    c = _broadcast(cos.to(work), x, seq_dim)
    s = _broadcast(sin.to(work), x, seq_dim)
    xr = x[..., :rot].to(work)
    if channels == "half":
        x1, x2 = xr[..., : rot // 2], xr[..., rot // 2 :]
        out = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    else:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        out = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    out = out.to(dtype)
    if rot == x.shape[-1]:
        return out
    return torch.cat((out, x[..., rot:]), dim=-1)


def apply_rotary_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    channels: str = "half",
    seq_dim: int = -2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries and keys with the same cos/sin."""
    _validate(q, cos, sin, channels, seq_dim, "q")
    _validate(k, cos, sin, channels, seq_dim, "k")
    return (
        apply_rotary(q, cos, sin, channels=channels, seq_dim=seq_dim),
        apply_rotary(k, cos, sin, channels=channels, seq_dim=seq_dim),
    )
