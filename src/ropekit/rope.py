"""One object tying the four stages together: layout → design → frequency matrix → apply.

>>> rope = RoPE("circle", head_dim=64)
>>> coords = rope.coords("T3 I4x4 T2")            # (L, 3) float32
>>> q, k = rope.rotate(q, k, coords)             # q, k: (B, H, L, 64)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from .apply.fused import apply_rotary_fused, apply_rotary_qk_fused
from .apply.planar import CHANNEL_LAYOUTS, cos_sin
from .designs.registry import check_options, get_design, positions
from .layout import Layout
from .rotations.planar import ALLOCATIONS, angles, frequency_matrix

__all__ = ["RoPE", "design_frequencies"]


def design_frequencies(
    design: str,
    rotary_dim: int,
    num_axes: int,
    *,
    allocation: str | None = None,
    base: float = 10000.0,
    sections: Sequence[int] | None = None,
) -> torch.Tensor:
    """Frequency matrix ``W (num_axes, rotary_dim/2)`` for a design, using its paired allocation by default.

    A 1-axis design with a multi-axis allocation is not possible; a multi-axis design whose natural
    allocation is ``"1d"`` is rejected with advice.
    """
    alloc = allocation or get_design(design).allocation
    if alloc == "1d" and num_axes != 1:
        raise ValueError(
            f"design {design!r} gives {num_axes} axes; pass allocation='mrope', 'interleaved' or 'axial'"
        )
    if alloc == "mrope" and num_axes != 3 and sections is None:
        alloc = "interleaved" if num_axes > 1 else "1d"
    return frequency_matrix(alloc, rotary_dim, num_axes, base=base, sections=sections)


@dataclass
class RoPE:
    """A rotary embedding: a position design paired with a frequency allocation (SPEC §1).

    ``allocation`` defaults to the design's own (``mrope`` sections for M-RoPE/Circle-RoPE, VRoPE's
    groups for VRoPE, plain 1-D for vanilla/shared). ``rotary_dim`` < ``head_dim`` rotates only the
    first channels (partial rotary).
    """

    design: str = "mrope"
    head_dim: int = 128
    rotary_dim: int | None = None
    allocation: str | None = None
    base: float = 10000.0
    sections: Sequence[int] | None = None
    channels: str = "half"
    design_options: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        d = get_design(self.design)
        check_options(d, self.design_options)
        if isinstance(self.head_dim, bool) or not isinstance(self.head_dim, int) or self.head_dim < 2:
            raise ValueError(f"`head_dim` must be an int >= 2, got {self.head_dim!r}")
        if self.head_dim % 2:
            raise ValueError(f"`head_dim` must be even (channels rotate in pairs), got {self.head_dim}")
        rd = self.head_dim if self.rotary_dim is None else self.rotary_dim
        if isinstance(rd, bool) or not isinstance(rd, int) or rd < 2 or rd % 2 or rd > self.head_dim:
            raise ValueError(f"`rotary_dim` must be an even int in [2, head_dim={self.head_dim}], got {rd!r}")
        self.rotary_dim = rd
        if self.allocation is not None and self.allocation not in ALLOCATIONS:
            raise ValueError(f"unknown allocation {self.allocation!r}; choose one of {', '.join(ALLOCATIONS)}")
        if self.channels not in CHANNEL_LAYOUTS:
            raise ValueError(f"`channels` must be 'half' or 'interleaved', got {self.channels!r}")
        self._W: dict[int, torch.Tensor] = {}

    def coords(self, layout: "Layout | str") -> torch.Tensor:
        """Token coordinates ``(L, A)`` of the layout under this design."""
        return positions(layout, self.design, **self.design_options)

    def frequencies(self, num_axes: int) -> torch.Tensor:
        """The frequency matrix for coordinates with ``num_axes`` axes (cached)."""
        if num_axes not in self._W:
            self._W[num_axes] = design_frequencies(
                self.design, self.rotary_dim, num_axes,
                allocation=self.allocation, base=self.base, sections=self.sections,
            )
        return self._W[num_axes]

    def cos_sin(self, coords: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 cos/sin ``(..., L, rotary_dim/2)`` for coordinates ``(..., L, A)``; compute once per forward."""
        if torch.isnan(coords).any():
            raise ValueError("`coords` contain NaN; positions must be finite numbers")
        W = self.frequencies(coords.shape[-1]).to(coords.device)
        if W.ndim == 3 and coords.ndim == 2:  # per-head W: keep a batch axis, (1, H, L, R/2)
            coords = coords[None]
        return cos_sin(angles(coords, W))

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, coords: "torch.Tensor | Layout | str", *, seq_dim: int = -2
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q and k ``(B, H, L, D)`` (or ``(B, L, H, D)`` with ``seq_dim=1``) at the given positions.

        Uses the fused path (Triton on CUDA, cache-blocked eager on CPU): same results as the reference
        :func:`ropekit.apply_rotary_qk`, fewer passes over memory.
        """
        if not isinstance(coords, torch.Tensor):
            coords = self.coords(coords).to(q.device)
        cos, sin = self.cos_sin(coords)
        if cos.ndim == 4 and cos.shape[1] != 1:  # per-head tables (MHRoPE): one per KV head, shared by its group
            cq, sq = (_per_head(t, q, seq_dim, "q") for t in (cos, sin))
            ck, sk = (_per_head(t, k, seq_dim, "k") for t in (cos, sin))
            return (apply_rotary_fused(q, cq, sq, channels=self.channels, seq_dim=seq_dim),
                    apply_rotary_fused(k, ck, sk, channels=self.channels, seq_dim=seq_dim))
        return apply_rotary_qk_fused(q, k, cos, sin, channels=self.channels, seq_dim=seq_dim)


def _per_head(table: torch.Tensor, x: torch.Tensor, seq_dim: int, name: str) -> torch.Tensor:
    """Per-head cos/sin ``(B, G, L, R/2)`` for a tensor with ``H`` heads: as is when ``G == H``, each table
    repeated for ``H / G`` consecutive heads otherwise (grouped-query attention: query head i uses KV head
    ``i // (H / G)``)."""
    heads = x.shape[1] if seq_dim == -2 else x.shape[2]
    groups = table.shape[1]
    if groups == heads:
        return table
    if heads % groups:
        raise ValueError(
            f"RoPE.rotate: the frequencies have {groups} per-head tables but `{name}` has {heads} heads; the head "
            f"count must be a multiple of {groups} (set the allocation's head sections to the number of KV heads)"
        )
    return table.repeat_interleave(heads // groups, dim=1)
