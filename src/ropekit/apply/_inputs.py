"""Argument checks shared by every apply path and rotary object (one place, one set of messages).

``seq_dim`` names a dimension of q/k exactly as PyTorch does: for 4-D tensors ``-2`` and ``2`` are the
sequence dim of ``(B, H, L, D)`` and ``1`` and ``-3`` that of ``(B, L, H, D)``; a 3-D ``(H, L, D)``
tensor takes ``-2`` or ``1``. Every other value is an error, never a guess.
"""
from __future__ import annotations

import torch

from ..designs.registry import positions
from ..layout import Layout

__all__ = ["canonical_seq_dim", "check_qk", "match_coords_batch", "resolve_coords"]

# accepted values per tensor rank → the canonical value the kernels use (-2: (…, H, L, D), 1: (B, L, H, D))
_SEQ_DIMS = {4: {-2: -2, 2: -2, 1: 1, -3: 1}, 3: {-2: -2, 1: -2}}


def canonical_seq_dim(seq_dim, ndim: int) -> int:
    """``-2`` for ``(B, H, L, D)``/``(H, L, D)`` or ``1`` for ``(B, L, H, D)`` from a user's ``seq_dim``."""
    if isinstance(seq_dim, bool) or not isinstance(seq_dim, int):
        raise TypeError(f"`seq_dim` must be an int naming the sequence dim, got {seq_dim!r}")
    accepted = _SEQ_DIMS.get(ndim)
    if accepted is None:
        raise ValueError(
            f"`seq_dim`: q/k must be (B, H, L, D) or (B, L, H, D) (or (H, L, D)), got a {ndim}-D tensor"
        )
    if seq_dim not in accepted:
        raise ValueError(
            f"`seq_dim` must be -2 or 2 for (B, H, L, D) tensors, or 1 or -3 for (B, L, H, D) tensors "
            f"(-2 or 1 for (H, L, D)); got {seq_dim} for a {ndim}-D tensor"
        )
    return accepted[seq_dim]


def check_qk(q, k, head_dim: int | None = None) -> None:
    """q and k are floating tensors of one rank, batch and sequence length; their last dim is ``head_dim``.

    Head counts may differ (grouped-query attention); everything else must agree.
    """
    for name, t in (("q", q), ("k", k)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"`{name}` must be a floating-point tensor, got {getattr(t, 'dtype', type(t).__name__)}")
        if t.ndim not in (3, 4):
            raise ValueError(f"`{name}` must be (B, H, L, D) or (B, L, H, D) (or (H, L, D)), got shape {tuple(t.shape)}")
        if head_dim is not None and t.shape[-1] != head_dim:
            raise ValueError(
                f"`{name}` has last dim {t.shape[-1]} but this rotary was built for head_dim={head_dim}; "
                f"build it with head_dim={t.shape[-1]} (use rotary_dim < head_dim for partial rotary)"
            )
    if k.ndim != q.ndim or k.shape[-1] != q.shape[-1]:
        raise ValueError(f"`k` {tuple(k.shape)} must have the rank and head_dim of `q` {tuple(q.shape)}")
    if q.ndim == 4 and k.shape[0] != q.shape[0]:
        raise ValueError(f"`k` has batch {k.shape[0]} but `q` has batch {q.shape[0]}")


def resolve_coords(coords, design: str, design_options: dict, device: torch.device) -> torch.Tensor:
    """Token coordinates from a tensor ``(L, A)``/``(B, L, A)``, a :class:`~ropekit.Layout` or its string."""
    if isinstance(coords, (str, Layout)):
        try:
            coords = positions(coords, design, **design_options)
        except (ValueError, TypeError) as e:
            raise type(e)(f"`coords` {str(coords)!r} cannot be placed by design {design!r}: {e}") from None
    if not isinstance(coords, torch.Tensor):
        raise TypeError(
            f"`coords` must be a tensor (L, A) or (B, L, A), a Layout or a layout string, got {type(coords).__name__}"
        )
    if coords.ndim not in (2, 3):
        raise ValueError(
            f"`coords` must have shape (L, A) or (B, L, A) (one row of A coordinates per token), "
            f"got shape {tuple(coords.shape)}; for 1-D positions use coords[:, None]"
        )
    if coords.is_complex() or coords.dtype == torch.bool:
        raise TypeError(f"`coords` must hold real numbers, got {coords.dtype}")
    return coords.to(device)


def check_finite_coords(coords: torch.Tensor) -> None:
    """Positions must be finite (skipped while tracing, where a data-dependent branch would break the graph)."""
    if torch.compiler.is_compiling():
        return
    if not bool(torch.isfinite(coords).all()):
        raise ValueError("`coords` contain NaN or inf; positions must be finite numbers")


def match_coords_batch(coords: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Batched coordinates ``(B, L, A)`` must have q's batch (or 1, shared), so the output keeps q's shape.

    Broadcasting a batch-1 q against ``B`` samples' coordinates, or a 3-D ``(H, L, D)`` q against any
    batched coordinates, would silently return a tensor of another shape. A 3-D q takes ``(1, L, A)`` as
    ``(L, A)``.
    """
    if coords.ndim != 3:
        return coords
    if q.ndim == 3:
        if coords.shape[0] != 1:
            raise ValueError(
                f"`coords` hold {coords.shape[0]} samples {tuple(coords.shape)} but `q` {tuple(q.shape)} is a single "
                f"(H, L, D) sample; pass q/k as (B, H, L, D) or coordinates (L, A)"
            )
        return coords[0]
    if coords.shape[0] not in (1, q.shape[0]):
        raise ValueError(
            f"`coords` {tuple(coords.shape)} hold {coords.shape[0]} samples but q/k have batch {q.shape[0]}; give "
            f"one row of coordinates per sample (B, L, A) or one shared (L, A)"
        )
    return coords
