"""Stage 4 — apply block-diagonal rotations (LieRE, ComRoPE) and orthogonally conjugated RoPE (GRAPE).

Both take q/k of shape ``(B, H, L, D)`` (``seq_dim=-2``) or ``(B, L, H, D)`` (``seq_dim=1``). The maths
runs in float32 (float64 when the input or the rotation is float64); the output has the input's dtype.

- :func:`apply_block_rotation`: channels ``[i·b, (i+1)·b)`` form block i; each token's block i is
  multiplied by its own ``b × b`` rotation matrix. Channels after the last block pass through.
- :func:`apply_plane_rotation`: rotation in learned, mutually orthogonal planes. With ``basis`` ``U (D, R)``
  (orthonormal columns; plane j is spanned by ``U[:, j]`` and ``U[:, j + R/2]``) the result is
  ``x + U (RoPE(Uᵀ x) − Uᵀ x)``: RoPE on the plane coordinates, identity on the orthogonal complement.
"""
from __future__ import annotations

import torch

from .planar import apply_rotary

__all__ = ["apply_block_rotation", "apply_plane_rotation"]


def _check_x(x: torch.Tensor, seq_dim: int, fn: str) -> None:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"{fn}: `x` must be a floating-point tensor, got {getattr(x, 'dtype', type(x))}")
    if x.ndim != 4:
        raise ValueError(f"{fn}: `x` must be (B, H, L, D) or (B, L, H, D), got shape {tuple(x.shape)}")
    if seq_dim not in (-2, 1):
        raise ValueError(f"{fn}: `seq_dim` must be -2 for (B, H, L, D) or 1 for (B, L, H, D), got {seq_dim}")


def _work_dtype(*tensors: torch.Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def apply_block_rotation(x: torch.Tensor, rotation: torch.Tensor, *, seq_dim: int = -2) -> torch.Tensor:
    """Rotate ``x`` block by block: ``rotation`` is ``(L, n, b, b)``, ``(H, L, n, b, b)`` (per head) or
    ``(B, H, L, n, b, b)``; block i of token l is ``rotation[..., l, i] @ x[..., l, i·b:(i+1)·b]``."""
    _check_x(x, seq_dim, "apply_block_rotation")
    if not isinstance(rotation, torch.Tensor) or rotation.ndim < 4 or rotation.shape[-1] != rotation.shape[-2]:
        raise ValueError("apply_block_rotation: `rotation` must be (..., L, n, b, b) square blocks, got "
                         f"{tuple(getattr(rotation, 'shape', ()))}")
    xt = x.transpose(1, 2) if seq_dim == 1 else x  # (B, H, L, D)
    L, D = xt.shape[-2], xt.shape[-1]
    n, b = rotation.shape[-3], rotation.shape[-1]
    if rotation.shape[-4] != L:
        raise ValueError(f"apply_block_rotation: the rotation has {rotation.shape[-4]} positions but `x` has "
                         f"sequence length {L}")
    if n * b > D:
        raise ValueError(f"apply_block_rotation: {n} blocks of {b} channels exceed head_dim {D}")
    work = _work_dtype(x, rotation)
    blocks = xt[..., : n * b].to(work).unflatten(-1, (n, b))  # (B, H, L, n, b)
    out = _blockwise_matmul(rotation.to(work), blocks).flatten(-2).to(x.dtype)
    if n * b < D:
        out = torch.cat((out, xt[..., n * b:].expand(*out.shape[:-1], D - n * b)), dim=-1)
    return out.transpose(1, 2) if seq_dim == 1 else out


def _blockwise_matmul(R: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """``R (…, L, n, b, b) @ blocks (B, H, L, n, b)`` without expanding R over the batch or heads it shares.

    The (B, H) dims that R broadcasts over become the columns of one matrix product per (token, block), so
    the cost is that of the rotation matrices times the data, with no per-(B, H) copy of R.
    """
    while R.ndim < 6:
        R = R[None]
    if R.ndim != 6:
        raise ValueError(f"apply_block_rotation: `rotation` must be (L, n, b, b), (H, L, n, b, b) or "
                         f"(B, H, L, n, b, b), got {tuple(R.shape)}")
    for i in (0, 1):
        if R.shape[i] not in (1, blocks.shape[i]) and blocks.shape[i] != 1:
            raise ValueError(f"apply_block_rotation: `rotation` {tuple(R.shape)} does not broadcast against "
                             f"x's (B, H) = {tuple(blocks.shape[:2])}")
    shared = [i for i in (0, 1) if R.shape[i] == 1]  # dims R does not vary along: matrix columns
    own = [i for i in (0, 1) if R.shape[i] != 1]
    perm = [*own, 2, 3, 4, *shared]
    X = blocks.permute(*perm)
    cols = X.shape[len(own) + 3:]
    X = X.reshape(*X.shape[: len(own) + 3], -1)  # (*own, L, n, b, columns)
    Rk = R.reshape(*[R.shape[i] for i in own], *R.shape[2:])
    out = Rk @ X
    out = out.reshape(*out.shape[:-1], *cols)
    inverse = [perm.index(d) for d in range(5)]
    return out.permute(*inverse)


def apply_plane_rotation(
    x: torch.Tensor, basis: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, seq_dim: int = -2
) -> torch.Tensor:
    """Rotate ``x`` in the planes of ``basis`` ``(D, R)`` or per head ``(H, D, R)`` by angles with the given
    ``cos``/``sin`` ``(..., L, R/2)``: ``x + U (RoPE(Uᵀx) − Uᵀx)`` (plane j = span(U[:, j], U[:, j + R/2]))."""
    _check_x(x, seq_dim, "apply_plane_rotation")
    if not isinstance(basis, torch.Tensor) or basis.ndim not in (2, 3):
        raise ValueError("apply_plane_rotation: `basis` must be (D, R) or per head (H, D, R)")
    xt = x.transpose(1, 2) if seq_dim == 1 else x
    if basis.shape[-2] != xt.shape[-1] or basis.shape[-1] != 2 * cos.shape[-1]:
        raise ValueError(f"apply_plane_rotation: `basis` {tuple(basis.shape)} must be (head_dim={xt.shape[-1]}, "
                         f"R={2 * cos.shape[-1]}) to match x and cos/sin")
    work = _work_dtype(x, basis, cos)
    U = basis.to(work)
    if U.ndim == 3:
        U = U[None]  # (1, H, D, R) against (B, H, L, D)
    xw = xt.to(work)
    y = xw @ U  # plane coordinates (B, H, L, R)
    delta = apply_rotary(y, cos.to(work), sin.to(work), channels="half") - y
    out = (xw + delta @ U.transpose(-1, -2)).to(x.dtype)
    return out.transpose(1, 2) if seq_dim == 1 else out
