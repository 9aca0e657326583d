"""One object tying the four stages together: layout → design → frequency matrix → apply.

>>> rope = RoPE("circle", head_dim=64)
>>> coords = rope.coords("T3 I4x4 T2")            # (L, 3) float32
>>> q, k = rope.rotate(q, k, coords)             # q, k: (B, H, L, 64)

Every rotary object of ropekit (:class:`RoPE`, :class:`DirectionalRoPE`,
:class:`ropekit.MixedFrequencies`, :class:`ropekit.GeoPE`) has the same ``rotate(q, k, coords, *,
seq_dim=-2)`` contract: ``coords`` is a tensor ``(L, A)``/``(B, L, A)``, a :class:`~ropekit.Layout` or a
layout string; ``seq_dim`` names the sequence dim of q/k as a PyTorch dim index (``-2``/``2`` for
``(B, H, L, D)``, ``1``/``-3`` for ``(B, L, H, D)``) and any other value is an error.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from .apply._inputs import canonical_seq_dim, check_finite_coords, check_qk, match_coords_batch, resolve_coords
from .apply.fused import apply_rotary_fused, apply_rotary_qk_fused
from .apply.planar import CHANNEL_LAYOUTS, cos_sin
from .designs.registry import check_options, get_design, positions
from .layout import Layout
from .rotations.directional import directional_matrix
from .rotations.planar import (
    MAX_AXES, angles, check_allocation, check_base, check_count, check_sections, frequency_matrix,
)
from .rotations.scaling import attention_factor, parse_scaling, scale_frequencies, spectrum_dim

__all__ = ["RoPE", "DirectionalRoPE", "design_frequencies", "design_axes", "rotate_qk_tables", "rotate_table"]

# layouts whose axis counts tell whether a design's count is fixed (it is unless they differ, as for
# VRoPE, whose 2^N axes follow the rank N of the layout's grids)
_PROBES = ("T1", "G2x2x2")


def design_axes(design: str, design_options: dict | None = None) -> int | None:
    """The number of coordinate axes a design gives for every layout, or None when it depends on the layout."""
    counts = set()
    for probe in _PROBES:
        try:
            counts.add(positions(probe, design, **(design_options or {})).shape[1])
        except ValueError:  # a design that cannot place this probe (e.g. VRoPE with a fixed spatial_dims)
            continue
    return counts.pop() if len(counts) == 1 else None


def _allocation_axes(allocation: str, sections: Sequence[int] | None) -> int | None:
    """How many axes an allocation takes (None: any number)."""
    if allocation == "1d":
        return 1
    if allocation == "mrope":
        return 3 if sections is None else len(sections)
    if allocation == "interleaved" and sections is not None:
        return len(sections)
    return None


def design_frequencies(
    design: str,
    rotary_dim: int,
    num_axes: int,
    *,
    allocation: str | None = None,
    base: float = 10000.0,
    sections: Sequence[int] | None = None,
    design_options: dict | None = None,
) -> torch.Tensor:
    """Frequency matrix ``W (num_axes, rotary_dim/2)`` for a design, using its paired allocation by default.

    The allocation is never switched behind the caller's back: coordinates with ``num_axes`` axes must be
    what the allocation takes (``"1d"``: 1; ``"mrope"``: one axis per section, 3 by default;
    ``"interleaved"`` with ``sections``: one per section) and, with the design's own allocation, what the
    design gives (e.g. 3 for Circle-RoPE). Anything else is a ``ValueError`` naming both counts; pass
    ``allocation=`` explicitly to pair coordinates with another allocation.
    """
    check_count(num_axes, "num_axes", MAX_AXES)
    own = allocation is None
    alloc = get_design(design).allocation_for(design_options) if own else allocation
    if sections is not None:
        sections = check_sections(sections)
    needed = _allocation_axes(alloc, sections)
    given = design_axes(design, design_options) if own else None
    if own and given is not None and given != num_axes:
        needed = given
    if needed is not None and needed != num_axes:
        what = f"design {design!r} with allocation {alloc!r}" + (
            f" (sections {list(sections)})" if sections is not None else "")
        raise ValueError(
            f"{what} gives {needed} axes but coords have {num_axes}; pass coordinates of this design "
            f"(rope.coords(layout)) or choose an allocation for {num_axes} axes, e.g. allocation='interleaved'"
        )
    return frequency_matrix(alloc, rotary_dim, num_axes, base=base, sections=sections)


class _PlanarRotary:
    """``rotate(q, k, coords)`` for planar rotaries that give ``cos_sin(coords)`` (see the module docstring)."""

    design: str
    head_dim: int
    channels: str
    design_options: dict

    def coords(self, layout: "Layout | str") -> torch.Tensor:
        """Token coordinates ``(L, A)`` of the layout under this rotary's design."""
        return positions(layout, self.design, **self.design_options)

    #: factor multiplying cos and sin (YaRN / LongRoPE attention factor); 1.0 without context extension
    attention_scaling = 1.0

    def _frequencies_for(self, num_axes: int, seq_len: int | None = None) -> torch.Tensor:
        raise NotImplementedError

    def _seq_len(self, coords: torch.Tensor) -> int | None:
        """Largest position + 1, for length-dependent context extension (None when it does not matter)."""
        return None

    def cos_sin(self, coords: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 cos/sin ``(..., L, rotary_dim/2)`` for coordinates ``(..., L, A)``; compute once per forward.

        With context extension (``scaling``), cos and sin carry its attention factor, as in transformers.
        """
        if not isinstance(coords, torch.Tensor):
            raise TypeError(f"`coords` must be a tensor (L, A) or (B, L, A), got {type(coords).__name__}")
        coords = resolve_coords(coords, self.design, self.design_options, coords.device)
        check_finite_coords(coords)
        W = self._frequencies_for(coords.shape[-1], self._seq_len(coords)).to(coords.device)
        if W.ndim == 3 and coords.ndim == 2:  # per-head W: keep a batch axis, (1, H, L, R/2)
            coords = coords[None]
        cos, sin = cos_sin(angles(coords, W))
        scale = self.attention_scaling
        return (cos, sin) if scale == 1.0 else (cos * scale, sin * scale)

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, coords: "torch.Tensor | Layout | str", *, seq_dim: int = -2
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q and k ``(B, H, L, D)`` (``seq_dim=-2`` or ``2``) or ``(B, L, H, D)`` (``seq_dim=1`` or
        ``-3``) at ``coords``: a tensor ``(L, A)``/``(B, L, A)``, a Layout or a layout string.

        q and k must have last dim ``head_dim`` and agree in rank and batch (head counts may differ).
        Uses the fused path (Triton on CUDA, cache-blocked eager on CPU): same results as the reference
        :func:`ropekit.apply_rotary_qk`, fewer passes over memory.
        """
        check_qk(q, k, self.head_dim)
        seq_dim = canonical_seq_dim(seq_dim, q.ndim)
        coords = match_coords_batch(resolve_coords(coords, self.design, self.design_options, q.device), q)
        cos, sin = self.cos_sin(coords)
        return rotate_qk_tables(q, k, cos, sin, channels=self.channels, seq_dim=seq_dim)


def _check_head_dims(head_dim, rotary_dim) -> int:
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 2:
        raise ValueError(f"`head_dim` must be an int >= 2, got {head_dim!r}")
    if head_dim % 2:
        raise ValueError(f"`head_dim` must be even (channels rotate in pairs), got {head_dim}")
    rd = head_dim if rotary_dim is None else rotary_dim
    if isinstance(rd, bool) or not isinstance(rd, int) or rd < 2 or rd % 2 or rd > head_dim:
        raise ValueError(f"`rotary_dim` must be an even int in [2, head_dim={head_dim}], got {rd!r}")
    return rd


def _check_design(design: str, design_options) -> dict:
    options = {} if design_options is None else design_options
    if not isinstance(options, dict):
        raise TypeError(f"`design_options` must be a dict of the design's options, got {type(options).__name__}")
    check_options(get_design(design), options)
    return options


@dataclass(repr=False)
class RoPE(_PlanarRotary):
    """A rotary embedding: a position design paired with a frequency allocation.

    ``allocation`` defaults to the design's own (``mrope`` sections for M-RoPE/Circle-RoPE, VRoPE's
    groups for VRoPE, plain 1-D for vanilla/shared); coordinates must then have the design's axis count.
    ``rotary_dim`` < ``head_dim`` rotates only the first channels (partial rotary). ``base`` is a finite
    number > 1. ``design_options=None`` means no options.
    """

    design: str = "mrope"
    head_dim: int = 128
    rotary_dim: int | None = None
    allocation: str | None = None
    base: float = 10000.0
    sections: Sequence[int] | None = None
    channels: str = "half"
    design_options: dict = field(default_factory=dict)
    scaling: dict | None = None  # context extension, a rope_parameters-style dict (docs/scaling.md)

    def __post_init__(self) -> None:
        self.design_options = _check_design(self.design, self.design_options)
        self.rotary_dim = _check_head_dims(self.head_dim, self.rotary_dim)
        if self.allocation is not None:
            check_allocation(self.allocation)
        if self.channels not in CHANNEL_LAYOUTS:
            raise ValueError(f"`channels` must be 'half' or 'interleaved', got {self.channels!r}")
        check_base(self.base)
        if self.sections is not None:
            check_sections(self.sections)
        self._W: dict[int, torch.Tensor] = {}
        self._scaling, self._W_scaled = parse_scaling(self.scaling, base=self.base), {}

    @property
    def resolved_allocation(self) -> str:
        """The allocation in use: the one given, or the design's own."""
        return self.allocation or get_design(self.design).allocation_for(self.design_options)

    def __repr__(self) -> str:
        parts = [f"design={get_design(self.design).name!r}", f"head_dim={self.head_dim}",
                 f"rotary_dim={self.rotary_dim}", f"allocation={self.resolved_allocation!r}", f"base={self.base!r}"]
        if self.sections is not None:
            parts.append(f"sections={list(self.sections)!r}")
        parts.append(f"channels={self.channels!r}")
        if self.design_options:
            parts.append(f"design_options={self.design_options!r}")
        if self.scaling is not None:
            parts.append(f"scaling={self.scaling!r}")
        return f"RoPE({', '.join(parts)})"

    def frequencies(self, num_axes: int, seq_len: int | None = None) -> torch.Tensor:
        """The frequency matrix for coordinates with ``num_axes`` axes (cached), after any ``scaling``.

        ``seq_len`` (largest position + 1) matters only to length-dependent scaling (dynamic NTK, LongRoPE).
        """
        if num_axes not in self._W:
            self._W[num_axes] = design_frequencies(
                self.design, self.rotary_dim, num_axes,
                allocation=self.allocation, base=self.base, sections=self.sections,
                design_options=self.design_options,
            )
        if self._scaling.rope_type == "default":
            return self._W[num_axes]
        if self._scaling.depends_on_length or num_axes not in self._W_scaled:
            W, _ = scale_frequencies(self._W[num_axes], self._scaling, base=self.base, seq_len=seq_len,
                                     dim=spectrum_dim(self.resolved_allocation, self.rotary_dim, num_axes))
            if self._scaling.depends_on_length:
                return W
            self._W_scaled[num_axes] = W
        return self._W_scaled[num_axes]

    @property
    def attention_scaling(self) -> float:
        """Factor multiplying cos and sin (YaRN / LongRoPE attention factor; 1.0 without scaling)."""
        return attention_factor(self._scaling)

    def _seq_len(self, coords: torch.Tensor) -> int | None:
        if not (self._scaling.depends_on_length and coords.numel()):
            return None
        return int(coords.max().floor()) + 1

    _frequencies_for = frequencies


class DirectionalRoPE(_PlanarRotary):
    """Directional N-D RoPE as a rotary object: pair j rotates by ``ω_j · (u_j · p)`` (see
    :func:`ropekit.directional_matrix`), with coordinates of ``dims`` axes (layouts placed by ``design``).

    ``seed`` defaults to 0, so two instances with the same arguments rotate alike; ``None`` draws a fresh
    Sobol scramble (methods ``sobol``, ``uniform``, ``random``).
    """

    def __init__(self, head_dim: int, dims: int = 2, method: str = "sobol", *, rotary_dim: int | None = None,
                 base: float = 10000.0, seed: int | None = 0, channels: str = "half", design: str = "rope2d",
                 design_options: dict | None = None) -> None:
        self.head_dim, self.dims, self.method, self.seed = head_dim, dims, method, seed
        self.rotary_dim = _check_head_dims(head_dim, rotary_dim)
        if channels not in CHANNEL_LAYOUTS:
            raise ValueError(f"`channels` must be 'half' or 'interleaved', got {channels!r}")
        self.channels, self.base = channels, check_base(base)
        self.design, self.design_options = design, _check_design(design, design_options)
        self.W = directional_matrix(self.rotary_dim, dims, method, base=base, seed=seed)

    def _frequencies_for(self, num_axes: int, seq_len: int | None = None) -> torch.Tensor:
        if num_axes != self.dims:
            raise ValueError(f"this DirectionalRoPE has dims={self.dims} axes but `coords` have {num_axes}")
        return self.W

    def __repr__(self) -> str:
        return (f"DirectionalRoPE(head_dim={self.head_dim}, dims={self.dims}, method={self.method!r}, "
                f"rotary_dim={self.rotary_dim}, base={self.base!r}, seed={self.seed!r}, channels={self.channels!r})")


def rotate_qk_tables(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, channels: str,
                     seq_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k with cos/sin that may be per-head tables ``(B, G, L, R/2)`` (see :func:`rotate_table`)."""
    if _is_per_head(cos):
        return (rotate_table(q, cos, sin, channels=channels, seq_dim=seq_dim, name="q"),
                rotate_table(k, cos, sin, channels=channels, seq_dim=seq_dim, name="k"))
    return apply_rotary_qk_fused(q, k, cos, sin, channels=channels, seq_dim=seq_dim)


def rotate_table(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, channels: str, seq_dim: int,
                 name: str = "x") -> torch.Tensor:
    """Rotate one tensor; per-head tables ``(B, G, L, R/2)`` (MHRoPE: one per KV head) are repeated over each
    KV head's query group, and a 3-D ``(H, L, D)`` tensor is rotated as one sample."""
    if not _is_per_head(cos):
        return apply_rotary_fused(x, cos, sin, channels=channels, seq_dim=seq_dim)
    if x.ndim == 3:  # (H, L, D): the head axis is the first one
        return rotate_table(x[None], cos, sin, channels=channels, seq_dim=seq_dim, name=name)[0]
    c, s = (_per_head(t, x, seq_dim, name) for t in (cos, sin))
    return apply_rotary_fused(x, c, s, channels=channels, seq_dim=seq_dim)


def _is_per_head(cos: torch.Tensor) -> bool:
    return cos.ndim == 4 and cos.shape[1] != 1


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
