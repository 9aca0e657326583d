"""Stage 4 — apply GeoPE rotations to q and k (GeoPE eq. 2, as Rodrigues' formula on triples).

``x`` is ``(B, H, L, D)`` (``seq_dim=-2``) or ``(B, L, H, D)`` (``seq_dim=1``). Triple i is channels
``3i, 3i+1, 3i+2``; channels beyond ``3n`` pass through unchanged. Each triple ``v`` becomes
``v cos Θ + sinc · (φ × v) + versc · φ (φ · v)`` — the sandwich product ``r v r*`` without building
quaternions or 3×3 matrices. Maths in float32 (float64 for float64 input); output has the input's dtype.
"""
from __future__ import annotations

import torch

from ..rotations.geope import GeoPERotation, geope_rotation

__all__ = ["apply_geope", "apply_geope_qk", "rotate_triples", "GeoPE"]


def rotate_triples(
    v: torch.Tensor, vector: torch.Tensor, cos: torch.Tensor, sinc: torch.Tensor, versc: torch.Tensor
) -> torch.Tensor:
    """Rodrigues' rotation of ``v (..., 3)`` by rotation vectors ``vector (..., 3)`` (broadcasting).

    ``cos``, ``sinc``, ``versc`` are the coefficients of :func:`ropekit.rotations.geope.rodrigues_coefficients`
    with the shape of ``vector`` minus its last axis.
    """
    a0, a1, a2 = vector.unbind(-1)
    v0, v1, v2 = v.unbind(-1)
    cross = torch.stack((a1 * v2 - a2 * v1, a2 * v0 - a0 * v2, a0 * v1 - a1 * v0), dim=-1)
    dot = (vector * v).sum(-1, keepdim=True)
    return v * cos[..., None] + cross * sinc[..., None] + vector * (dot * versc[..., None])


def _broadcast(t: torch.Tensor, extra: int, seq_dim: int, x_ndim: int) -> torch.Tensor:
    """Shape a rotation tensor ``(L, n, …)`` or ``(B, L, n, …)`` to broadcast against ``x``'s triples."""
    # t has `extra` trailing axes after (L, n): 1 for vectors, 0 for coefficients
    lead = t.ndim - 2 - extra  # 0 -> (L, …), 1 -> (B, L, …)
    if lead not in (0, 1):
        raise ValueError(
            "the rotation must be per token (L, n, 3) or per batch and token (B, L, n, 3), "
            f"got vector shape with {lead} leading axes"
        )
    if seq_dim == -2:
        if lead == 1 and x_ndim == 4:
            t = t[:, None]  # (B, 1, L, n, …)
        return t
    # (B, L, H, D): insert the head axis after L
    return t.unsqueeze(lead + 1)


def _validate(x: torch.Tensor, rotation: GeoPERotation, seq_dim: int) -> int:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"apply_geope: `x` must be a floating-point tensor, got {getattr(x, 'dtype', type(x))}")
    if not isinstance(rotation, GeoPERotation):
        raise TypeError(
            "apply_geope: `rotation` must be a GeoPERotation; build it with "
            "ropekit.rotations.geope.geope_rotation(coords, head_dim)"
        )
    if seq_dim not in (-2, 1):
        raise ValueError(f"`seq_dim` must be -2 (B,H,L,D) or 1 (B,L,H,D), got {seq_dim}")
    if x.ndim != 4 and not (x.ndim == 3 and seq_dim == -2):
        raise ValueError(f"`x` must be (B, H, L, D) or (B, L, H, D), got shape {tuple(x.shape)}")
    n = rotation.num_triples
    D = x.shape[-1]
    if D < 3:
        raise ValueError(f"GeoPE rotates channel triples: head_dim must be >= 3, got {D}")
    if 3 * n > D:
        raise ValueError(
            f"the rotation covers {n} triples ({3 * n} channels) but head_dim is {D}; "
            f"build it with geope_rotation(coords, head_dim={D})"
        )
    L = x.shape[seq_dim]
    if rotation.seq_len != L:
        raise ValueError(f"the rotation has {rotation.seq_len} positions but `x` has sequence length {L}")
    return n


def apply_geope(x: torch.Tensor, rotation: GeoPERotation, *, seq_dim: int = -2) -> torch.Tensor:
    """Rotate every channel triple of ``x`` by its token's GeoPE rotation (GeoPE eqs. 2-4).

    ``rotation`` comes from :func:`ropekit.rotations.geope.geope_rotation` with coordinates ``(L, A)``
    (shared by the batch) or ``(B, L, A)``. Channels beyond ``3n`` pass through.
    """
    n = _validate(x, rotation, seq_dim)
    dtype = x.dtype
    work = torch.float64 if dtype == torch.float64 else torch.float32
    vec = _broadcast(rotation.vector.to(work), 1, seq_dim, x.ndim)
    cos, sinc, versc = (_broadcast(t.to(work), 0, seq_dim, x.ndim) for t in rotation[1:])
    v = x[..., : 3 * n].to(work).unflatten(-1, (n, 3))
    out = rotate_triples(v, vec, cos, sinc, versc).flatten(-2).to(dtype)
    if 3 * n == x.shape[-1]:
        return out
    return torch.cat((out, x[..., 3 * n :]), dim=-1)


def apply_geope_qk(
    q: torch.Tensor, k: torch.Tensor, rotation: GeoPERotation, *, seq_dim: int = -2
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries and keys with the same GeoPE rotation."""
    return apply_geope(q, rotation, seq_dim=seq_dim), apply_geope(k, rotation, seq_dim=seq_dim)


class GeoPE:
    """GeoPE as a rotary object (``rotate(q, k, coords)``), usable wherever a :class:`ropekit.RoPE` is.

    Not exactly relative (GeoPE §3.4); see :func:`ropekit.linear_geope_attention` for the variant that is.
    """

    def __init__(self, head_dim: int, *, lam: float = 100.0, freq_style: str = "decreasing") -> None:
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 3:
            raise ValueError(f"GeoPE: `head_dim` must be an int >= 3 (one channel triple), got {head_dim!r}")
        self.head_dim, self.lam, self.freq_style = head_dim, lam, freq_style

    def rotation(self, coords: torch.Tensor) -> GeoPERotation:
        """Per-token, per-triple rotations for coordinates ``(..., L, A)``; compute once per forward."""
        return geope_rotation(coords, self.head_dim, lam=self.lam, freq_style=self.freq_style)

    def rotate(self, q: torch.Tensor, k: torch.Tensor, coords: torch.Tensor, *, seq_dim: int = -2):
        return apply_geope_qk(q, k, self.rotation(coords.to(q.device)), seq_dim=seq_dim)
