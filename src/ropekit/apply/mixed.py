"""RoPE-Mixed as a rotary object: :class:`MixedFrequencies`, a layer's learnable per-head frequency matrix
that rotates q and k (Heo et al. "Rotary Position Embedding for Vision Transformer").

Its initialisation, :func:`ropekit.rotations.mixed.mixed_init`, is in the rotations stage; this module adds
what applying it needs (placing a layout, cos/sin, the fused rotation), as :mod:`ropekit.apply.geope` does for
GeoPE.
"""
from __future__ import annotations

import torch
from torch import nn

from ..designs.registry import positions
from ..rotations.mixed import mixed_init
from ..rotations.planar import angles
from ._inputs import canonical_seq_dim, check_qk, match_coords_batch, resolve_coords
from .fused import apply_rotary_qk_fused
from .planar import cos_sin

__all__ = ["MixedFrequencies"]


class MixedFrequencies(nn.Module):
    """Learnable per-head frequency matrix of one layer; ``forward(coords)`` gives the rotation angles.

    ``coords (L, A)`` or ``(B, L, A)`` → angles ``(H, L, R/2)`` or ``(B, H, L, R/2)`` via
    :func:`ropekit.angles`. As a rotary object, ``rotate(q, k, coords)`` rotates ``(B, H, L, D)`` q/k
    (``H = num_heads``, ``D >= rotary_dim``) like :meth:`ropekit.RoPE.rotate`; a Layout or layout string
    is placed by ``design`` (default ``"rope2d"``, the (row, col) of each grid).
    """

    def __init__(
        self,
        rotary_dim: int,
        num_heads: int,
        num_axes: int = 2,
        *,
        theta: float = 10.0,
        seed: int | None = None,
        design: str = "rope2d",
        design_options: dict | None = None,
    ) -> None:
        super().__init__()
        self.design_options = {} if design_options is None else dict(design_options)
        positions("T1", design, **self.design_options)  # checks the design and its options
        self.design = design
        self.rotary_dim = rotary_dim
        self.num_heads = num_heads
        self.num_axes = num_axes
        self.freqs = nn.Parameter(mixed_init(rotary_dim, num_heads, num_axes, theta=theta, seed=seed))

    def forward(self, coords: torch.Tensor) -> torch.Tensor:
        if not isinstance(coords, torch.Tensor):
            raise TypeError(f"MixedFrequencies: `coords` must be a tensor (L, A) or (B, L, A), got {type(coords).__name__}")
        if coords.ndim not in (2, 3):
            raise ValueError(f"MixedFrequencies: `coords` must be (L, A) or (B, L, A), got shape {tuple(coords.shape)}")
        return angles(coords, self.freqs)

    def rotate(self, q: torch.Tensor, k: torch.Tensor, coords, *, seq_dim: int = -2):
        """Rotate q and k ``(B, H, L, D)`` (``seq_dim`` -2/2) or ``(B, L, H, D)`` (1/-3) with each head's
        own frequencies; differentiable in the frequencies."""
        check_qk(q, k)
        seq_dim = canonical_seq_dim(seq_dim, q.ndim)
        if q.ndim != 4:
            raise ValueError(f"MixedFrequencies.rotate: `q` must be 4-D (B, H, L, D) or (B, L, H, D), got {tuple(q.shape)}")
        hdim = 1 if seq_dim == -2 else 2
        for name, t in (("q", q), ("k", k)):
            if t.shape[hdim] != self.num_heads:
                raise ValueError(f"`{name}` has {t.shape[hdim]} heads but these frequencies have num_heads={self.num_heads}")
        c, s = cos_sin(self(match_coords_batch(resolve_coords(coords, self.design, self.design_options, q.device), q)))
        if c.ndim == 3:  # (H, L, R/2): one batch entry shared by all
            c, s = c[None], s[None]
        return apply_rotary_qk_fused(q, k, c, s, seq_dim=seq_dim)

    def extra_repr(self) -> str:
        return f"rotary_dim={self.rotary_dim}, num_heads={self.num_heads}, num_axes={self.num_axes}"
