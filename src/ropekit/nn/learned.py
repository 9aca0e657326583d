"""Learned rotary families as ``nn.Module`` classes: LieRE, ComRoPE (block generators) and GRAPE (learned planes).

Each has ``rotate(q, k, coords)`` for q/k ``(B, H, L, D)`` (``seq_dim=1``: ``(B, L, H, D)``) and coordinates
``(L, A)``, ``(B, L, A)`` or a layout string, like :class:`ropekit.RoPE` and :class:`ropekit.GeoPE`, so they
plug into :class:`ropekit.nn.RotaryAttention` / :class:`ropekit.nn.TinyViT`. Their generators are
parameters: they train, follow ``.to()`` and live in the state dict. The maths is in
``ropekit.rotations.lie`` / ``ropekit.rotations.grape``; ``docs/learned.md`` records the choices.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ..apply._inputs import match_coords_batch
from ..apply.blocks import apply_block_rotation, apply_plane_rotation
from ..apply.fused import apply_rotary_qk_fused
from ..apply.planar import CHANNEL_LAYOUTS, cos_sin
from ..designs.registry import positions
from ..layout import Layout
from ..rotations.grape import grape_frequency_matrix
from ..rotations.lie import (
    COMROPE_VARIANTS,
    block_rotation,
    check_coords,
    check_int,
    comrope_ap_generators,
    comrope_ld_generators,
    skew,
)
from ..rotations.planar import angles

__all__ = ["LieRE", "ComRoPE", "GRAPE"]


def _generator(seed: int | None) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed) if seed is not None else g.seed()
    return g


def _check_scale(value, name: str = "init_scale") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise ValueError(f"`{name}` must be a finite number >= 0, got {value!r}")
    return float(value)


class _LearnedRotary(nn.Module):
    """Shared by the learned families: argument checks, layouts → coordinates, q/k validation."""

    def __init__(self, head_dim: int, num_axes: int, num_heads: int | None, design: str, owner: str) -> None:
        super().__init__()
        check_int(head_dim, "head_dim", 2)
        check_int(num_axes, "num_axes")
        if num_heads is not None:
            check_int(num_heads, "num_heads")
        if not isinstance(design, str):
            raise TypeError(f"{owner}: `design` must be a design name, got {type(design).__name__}")
        self.head_dim, self.num_axes, self.num_heads, self.design = head_dim, num_axes, num_heads, design
        self._owner = owner

    def _shape(self, *trailing: int) -> tuple[int, ...]:
        return ((self.num_heads,) if self.num_heads is not None else ()) + trailing

    def coords(self, layout: "Layout | str") -> torch.Tensor:
        """Coordinates ``(L, A)`` of a layout under ``self.design``."""
        c = positions(layout, self.design)
        if c.shape[-1] != self.num_axes:
            raise ValueError(f"{self._owner}: design {self.design!r} gives {c.shape[-1]} axes but this module has "
                             f"num_axes={self.num_axes}; pass `design=` with {self.num_axes} axes, or coordinates")
        return c

    def _coords(self, coords: "torch.Tensor | Layout | str", device: torch.device) -> torch.Tensor:
        if isinstance(coords, (str, Layout)):
            coords = self.coords(coords)
        return check_coords(coords, self.num_axes, self._owner).to(device)

    @staticmethod
    def _batch(coords: "torch.Tensor | Layout | str", q: torch.Tensor) -> "torch.Tensor | Layout | str":
        return match_coords_batch(coords, q) if isinstance(coords, torch.Tensor) else coords

    def _check_qk(self, q: torch.Tensor, k: torch.Tensor, seq_dim: int) -> None:
        if seq_dim not in (-2, 1):
            raise ValueError(f"{self._owner}: `seq_dim` must be -2 for (B, H, L, D) or 1 for (B, L, H, D), "
                             f"got {seq_dim!r}")
        for name, x in (("q", q), ("k", k)):
            if not isinstance(x, torch.Tensor) or not x.is_floating_point():
                raise TypeError(f"{self._owner}: `{name}` must be a floating-point tensor, got "
                                f"{getattr(x, 'dtype', type(x))}")
            if x.ndim != 4 or x.shape[-1] != self.head_dim:
                raise ValueError(f"{self._owner}: `{name}` must be (B, H, L, {self.head_dim}) "
                                 f"(head_dim={self.head_dim}), got shape {tuple(x.shape)}")
            h = x.shape[1 if seq_dim == -2 else 2]
            if self.num_heads is not None and h not in (1, self.num_heads):
                raise ValueError(f"{self._owner}: `{name}` has {h} heads but the module has per-head weights "
                                 f"for num_heads={self.num_heads}")

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, num_axes={self.num_axes}, num_heads={self.num_heads}"


class _BlockRotary(_LearnedRotary):
    """Block-generator families: ``rotation(coords)`` = ``exp(Σ_a p_a G_a)`` per block, then ``rotate``."""

    def __init__(self, head_dim: int, num_axes: int, block_size: int, num_heads: int | None,
                 design: str, owner: str) -> None:
        super().__init__(head_dim, num_axes, num_heads, design, owner)
        check_int(block_size, "block_size", 2)
        if head_dim % block_size:
            raise ValueError(f"{owner}: `block_size` ({block_size}) must divide `head_dim` ({head_dim}); the "
                             f"head is cut into head_dim / block_size rotation blocks")
        self.block_size, self.num_blocks = block_size, head_dim // block_size

    def generators(self) -> torch.Tensor:
        """Skew-symmetric generators ``(A, n, b, b)`` (or ``(H, A, n, b, b)`` per head)."""
        raise NotImplementedError

    def rotation(self, coords: "torch.Tensor | Layout | str") -> torch.Tensor:
        """Per-token block rotations ``(…, [H,] L, n, b, b)``; compute once per forward, share across q and k."""
        G = self.generators()
        return block_rotation(self._coords(coords, G.device), G)

    def rotate(self, q: torch.Tensor, k: torch.Tensor, coords: "torch.Tensor | Layout | str", *,
               seq_dim: int = -2) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q and k ``(B, H, L, D)`` (``seq_dim=1``: ``(B, L, H, D)``) at ``coords`` ``(L, A)``,
        ``(B, L, A)`` or a layout string."""
        self._check_qk(q, k, seq_dim)
        R = self.rotation(self._batch(coords, q))
        if self.num_heads is None and R.ndim == 5:  # (B, L, n, b, b): broadcast over heads
            R = R[:, None]
        return apply_block_rotation(q, R, seq_dim=seq_dim), apply_block_rotation(k, R, seq_dim=seq_dim)

    forward = rotate

    def extra_repr(self) -> str:
        return super().extra_repr() + f", block_size={self.block_size}"


class LieRE(_BlockRotary):
    """LieRE: ``R(p) = exp(Σ_a p_a G_a)`` with free learned skew-symmetric generators (module docstring).

    - ``head_dim``: channels of q/k. ``block_size`` (default: ``head_dim``, the paper's dense generator)
      must divide it; smaller blocks cost less (``O(L·D·b²)``) and couple fewer channels.
    - ``num_heads``: one set of generators per head (q/k must then have that many heads); ``None`` shares
      them across heads.
    - ``init_scale``: generator entries start normal with standard deviation ``init_scale / √(2b)``
      (seeded by ``seed``), so a unit step along an axis turns by angles of order ``init_scale``.
    - ``design``: the position design used when ``rotate`` gets a layout string.

    Not exactly relative: ``relative_error(rotary_score(LieRE(...)), ...)`` is well above rounding.
    """

    def __init__(self, head_dim: int, num_axes: int = 2, *, block_size: int | None = None,
                 num_heads: int | None = None, init_scale: float = 0.5, seed: int | None = None,
                 design: str = "rope2d") -> None:
        block_size = head_dim if block_size is None else block_size
        super().__init__(head_dim, num_axes, block_size, num_heads, design, "LieRE")
        scale = _check_scale(init_scale) / (2.0 * block_size ** 0.5)  # skew(M) doubles the variance
        shape = self._shape(num_axes, self.num_blocks, block_size, block_size)
        self.weight = nn.Parameter(torch.randn(shape, generator=_generator(seed)) * scale)

    def generators(self) -> torch.Tensor:
        return skew(self.weight)


class ComRoPE(_BlockRotary):
    """ComRoPE: commuting learned generators, exactly relative (module docstring).

    - ``variant="ld"`` (default, linearly dependent): per block one skew-symmetric ``P`` and per axis a
      scalar ``λ_a`` per block (initially ``N(0, 1)``), ``G_a = λ_a P``. ``block_size`` default 8.
    - ``variant="ap"`` (axial partition): block of size ``b`` split into ``A`` diagonal sub-blocks of
      ``b / A``; axis a owns sub-block a. ``block_size`` default ``4·A`` (a 4 × 4 sub-block per axis).
    - ``num_heads``, ``init_scale``, ``seed``, ``design``: as in :class:`LieRE`.
    """

    def __init__(self, head_dim: int, num_axes: int = 2, *, variant: str = "ld", block_size: int | None = None,
                 num_heads: int | None = None, init_scale: float = 0.5, seed: int | None = None,
                 design: str = "rope2d") -> None:
        if variant not in COMROPE_VARIANTS:
            raise ValueError(f"ComRoPE: `variant` must be one of {COMROPE_VARIANTS} ('ap' axial partition, "
                             f"'ld' linearly dependent), got {variant!r}")
        check_int(num_axes, "num_axes")
        if block_size is None:
            block_size = 8 if variant == "ld" else 4 * num_axes
        super().__init__(head_dim, num_axes, block_size, num_heads, design, "ComRoPE")
        self.variant = variant
        gen = _generator(seed)
        scale = _check_scale(init_scale)
        if variant == "ap":
            if block_size % num_axes or block_size // num_axes < 2:
                raise ValueError(f"ComRoPE 'ap': `block_size` ({block_size}) must split into num_axes={num_axes} "
                                 f"sub-blocks of >= 2 channels; use a multiple of {num_axes} that is >= "
                                 f"{2 * num_axes}")
            s = block_size // num_axes
            shape = self._shape(num_axes, self.num_blocks, s, s)
            self.weight = nn.Parameter(torch.randn(shape, generator=gen) * scale / (2.0 * s ** 0.5))
        else:
            b = block_size
            self.weight = nn.Parameter(torch.randn(self._shape(self.num_blocks, b, b), generator=gen)
                                       * scale / (2.0 * b ** 0.5))
            self.axis_scale = nn.Parameter(torch.randn(self._shape(num_axes, self.num_blocks), generator=gen))

    def generators(self) -> torch.Tensor:
        if self.variant == "ld":
            return comrope_ld_generators(self.weight, self.axis_scale)
        return comrope_ap_generators(self.weight, self.block_size)

    def extra_repr(self) -> str:
        return f"variant={self.variant!r}, " + super().extra_repr()


class GRAPE(_LearnedRotary):
    """Multiplicative GRAPE with canonical or learned commuting planes (``ropekit.rotations.grape``).

    - ``mode``: axis map of the planes, ``"chunked"`` (M-RoPE sections, ``sections`` default ``[16, 24, 24]``
      scaled) or ``"interleaved"`` (plane j → axis ``j mod A``); ``base`` and ``log_freq_scale`` set the
      log-uniform spectrum ``ω_j = base^{−2j/R / log_freq_scale}``; ``rotary_dim`` (default ``head_dim``)
      is ``R``, twice the number of planes.
    - ``learned=False``: canonical planes, the channel pairs ``(j, j + R/2)``: exactly RoPE with this axis
      map (the fused planar path, bit-for-bit ropekit's M-RoPE / interleaved rotation).
    - ``channels``: ``"half"`` (default) pairs ``(j, j + R/2)`` as Hugging Face models do; ``"interleaved"``
      pairs ``(2j, 2j + 1)``, the starting planes of the public multimodal GRAPE code. Learned planes use the
      same pairing of Q's columns, so both start from their canonical planes.
    - ``learned=True`` (default): the planes are the columns of ``Q = exp(K − Kᵀ)`` with a learned ``K``
      (``(H, D, D)`` with ``num_heads``): plane j = span(Q[:, j], Q[:, j + R/2]), so the rotation is
      ``Q · RoPE · Qᵀ`` on them and the identity on the rest — mutually orthogonal planes, exactly relative.
      ``K`` starts at ``init_scale · N(0, 1)/√D`` (``init_scale=0``, the default: the canonical planes, so a
      model starts from RoPE).
    - ``learn_frequencies``: make ``W (A, R/2)`` (axis map × spectrum) a parameter too (still exactly
      relative: every angle stays linear in the position).
    """

    def __init__(self, head_dim: int, num_axes: int = 3, *, mode: str = "chunked", rotary_dim: int | None = None,
                 base: float = 10000.0, sections: Sequence[int] | None = None, log_freq_scale: float = 1.0,
                 learned: bool = True, learn_frequencies: bool = False, num_heads: int | None = None,
                 init_scale: float = 0.0, seed: int | None = None, design: str = "mrope",
                 channels: str = "half") -> None:
        super().__init__(head_dim, num_axes, num_heads, design, "GRAPE")
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        check_int(rotary_dim, "rotary_dim", 2)
        if rotary_dim % 2 or rotary_dim > head_dim:
            raise ValueError(f"GRAPE: `rotary_dim` must be even and <= head_dim={head_dim}, got {rotary_dim}")
        for name, flag in (("learned", learned), ("learn_frequencies", learn_frequencies)):
            if not isinstance(flag, bool):
                raise TypeError(f"GRAPE: `{name}` must be True or False, got {flag!r}")
        if not learned and num_heads is not None:
            raise ValueError("GRAPE: `num_heads` gives each head its own learned planes; canonical planes "
                             "(learned=False) are shared, so leave num_heads=None")
        if channels not in CHANNEL_LAYOUTS:
            raise ValueError(f"GRAPE: `channels` must be 'half' (pairs j, j + R/2) or 'interleaved' (pairs 2j, "
                             f"2j + 1), got {channels!r}")
        self.mode, self.rotary_dim, self.learned, self.channels = mode, rotary_dim, learned, channels
        half = torch.arange(rotary_dim // 2)  # plane j's two columns of Q, in the order apply_plane_rotation takes
        pairs = (half, half + rotary_dim // 2) if channels == "half" else (2 * half, 2 * half + 1)
        self.register_buffer("_columns", torch.cat(pairs), persistent=False)
        W = grape_frequency_matrix(mode, rotary_dim, num_axes, base=base, sections=sections,
                                   log_freq_scale=log_freq_scale)
        if learn_frequencies:
            self.freqs = nn.Parameter(W)
        else:
            self.register_buffer("freqs", W, persistent=False)  # a function of the arguments, not a weight
        if learned:
            scale = _check_scale(init_scale) / head_dim ** 0.5
            self.weight = nn.Parameter(torch.randn(self._shape(head_dim, head_dim), generator=_generator(seed))
                                       * scale)

    def basis(self) -> torch.Tensor:
        """Orthonormal plane vectors ``U (D, R)`` (``(H, D, R)`` per head); the identity columns if canonical."""
        if not self.learned:
            return torch.eye(self.head_dim, device=self.freqs.device)[:, self._columns]
        return torch.linalg.matrix_exp(skew(self.weight))[..., self._columns]

    def cos_sin(self, coords: "torch.Tensor | Layout | str") -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``(…, L, R/2)`` of the plane angles ``θ_j = Σ_a p_a W[a, j]``."""
        return cos_sin(angles(self._coords(coords, self.freqs.device), self.freqs))

    def rotate(self, q: torch.Tensor, k: torch.Tensor, coords: "torch.Tensor | Layout | str", *,
               seq_dim: int = -2) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q and k ``(B, H, L, D)`` (``seq_dim=1``: ``(B, L, H, D)``) at ``coords`` ``(L, A)``,
        ``(B, L, A)`` or a layout string."""
        self._check_qk(q, k, seq_dim)
        cos, sin = self.cos_sin(self._batch(coords, q))
        if not self.learned:
            return apply_rotary_qk_fused(q, k, cos, sin, channels=self.channels, seq_dim=seq_dim)
        U = self.basis()
        return (apply_plane_rotation(q, U, cos, sin, seq_dim=seq_dim),
                apply_plane_rotation(k, U, cos, sin, seq_dim=seq_dim))

    forward = rotate

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", mode={self.mode!r}, rotary_dim={self.rotary_dim}, learned={self.learned}, "
                f"channels={self.channels!r}")
