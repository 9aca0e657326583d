"""A small pre-norm decoder-only transformer for multimodal token sequences, one rotary design per layer.

Design names: any registered ropekit position design (``vanilla``, ``mrope``, ``circle`` …), ``none`` (no
position embedding at all) and ``circle-age-<schedule>`` (Alternating Geometry Encoding: each layer's
design from :func:`ropekit.age_schedule` over Circle-RoPE and M-RoPE, schedule ``all | lower | upper |
alternate``). Positions come from :func:`ropekit.positions` of the batch's layout (cached per layout).
"""
from __future__ import annotations

from functools import lru_cache

import torch
from torch import nn

from ..age import SCHEDULES, age_schedule
from ..designs.registry import designs as registered_designs
from ..designs.registry import positions
from ..nn.attention import RotaryAttention
from ..apply._inputs import canonical_seq_dim, check_qk, match_coords_batch, resolve_coords
from ..apply.geope import GeoPE, apply_geope_qk
from ..rope import RoPE, _PlanarRotary, rotate_qk_tables

__all__ = ["layer_designs", "Decoder", "layout_positions", "TableCache", "cached_tables"]

AGE_PREFIX = "circle-age-"


def layer_designs(design: str, depth: int) -> list[str]:
    """The position design of each of ``depth`` layers for an experiment design name."""
    if design.startswith(AGE_PREFIX):
        schedule = design[len(AGE_PREFIX):]
        if schedule not in SCHEDULES:
            raise ValueError(f"unknown AGE schedule in {design!r}; use {AGE_PREFIX}{{{','.join(SCHEDULES)}}}")
        return age_schedule(schedule, depth, ("circle", "mrope"))
    if design != "none" and design not in registered_designs():
        raise ValueError(
            f"unknown design {design!r}; choose one of {', '.join(registered_designs())}, 'none', "
            f"or {AGE_PREFIX}<schedule>"
        )
    return [design] * depth


class TableCache:
    """``rotate(q, k, coords)`` of a fixed-frequency rotary (:class:`ropekit.RoPE`, :class:`ropekit.DirectionalRoPE`,
    :class:`ropekit.GeoPE`) whose tables (cos/sin, or GeoPE's rotation) are built once per coordinate table.

    In these experiments a batch shares one coordinate table ``(L, A)`` (a layout, a patch grid), so every
    layer of every step would rebuild the same tables. Here they are built once per table, outside any
    ``torch.compile`` graph (building them looks up the design, which a graph cannot trace), and the
    rotary's own rotation is applied with them, so results are bit for bit those of ``rotary.rotate``.
    Per-sample coordinates ``(B, L, A)`` (point clouds) are built afresh every call."""

    MAX = 64

    def __init__(self, rotary) -> None:
        self.rotary = rotary
        self._tables: dict = {}

    def __repr__(self) -> str:
        return f"TableCache({self.rotary!r})"

    def __getattr__(self, name: str):  # everything else (head_dim, design, lam …) is the rotary's
        if name in ("rotary", "_tables"):
            raise AttributeError(name)
        return getattr(self.rotary, name)

    @torch.compiler.disable
    def _table(self, q: torch.Tensor, coords):
        r = self.rotary
        coords = match_coords_batch(resolve_coords(coords, r.design, r.design_options, q.device), q)
        make = r.rotation if isinstance(r, GeoPE) else r.cos_sin
        if coords.ndim != 2:
            return make(coords)
        key = (coords.device, coords.dtype, tuple(coords.shape), coords.detach().cpu().numpy().tobytes())
        table = self._tables.get(key)
        if table is None:
            if len(self._tables) >= self.MAX:
                self._tables.pop(next(iter(self._tables)))
            table = self._tables[key] = make(coords)
        return table

    def rotate(self, q: torch.Tensor, k: torch.Tensor, coords, *, seq_dim: int = -2):
        r = self.rotary
        check_qk(q, k, r.head_dim)
        seq_dim = canonical_seq_dim(seq_dim, q.ndim)
        table = self._table(q, coords)
        if isinstance(r, GeoPE):
            return apply_geope_qk(q, k, table, seq_dim=seq_dim, channels=r.channels)
        return rotate_qk_tables(q, k, table[0], table[1], channels=r.channels, seq_dim=seq_dim)


def cached_tables(rotary):
    """``rotary`` wrapped in a :class:`TableCache` when its tables depend on the coordinates only (None and
    learned-frequency rotaries such as RoPE-Mixed are returned as they are)."""
    if isinstance(rotary, (GeoPE, _PlanarRotary)) and not isinstance(rotary, nn.Module):
        return TableCache(rotary)
    return rotary


@lru_cache(maxsize=512)
def layout_positions(layout: str, design: str) -> torch.Tensor:
    """float32 coordinates ``(L, A)`` of ``layout`` under ``design`` (cached; batches share a layout)."""
    return positions(layout, design)


@torch.compiler.disable
def _block_coords(designs: tuple, layout: str, device: torch.device) -> dict:
    """Coordinates of ``layout`` per block design (outside any torch.compile graph: a layout is a string)."""
    return {d: layout_positions(layout, d).to(device) for d in designs if d != "none"}


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int, design: str, mlp_ratio: float, base: float) -> None:
        super().__init__()
        self.design = design
        rotary = None if design == "none" else RoPE(design, head_dim=dim // heads, base=base)
        self.n1, self.n2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = RotaryAttention(dim, heads, cached_tables(rotary))
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor, coords: torch.Tensor | None) -> torch.Tensor:
        x = x + self.attn(self.n1(x), coords, causal=True)
        return x + self.mlp(self.n2(x))


class Decoder(nn.Module):
    """Token embedding → ``depth`` causal pre-norm blocks → logits of the next token after the last one.

    ``forward(tokens, layout)`` returns ``(B, vocab)`` logits at the last position (the answer slot).
    """

    def __init__(self, vocab: int, design: str = "vanilla", *, dim: int = 64, depth: int = 4, heads: int = 4,
                 mlp_ratio: float = 2.0, base: float = 10000.0) -> None:
        super().__init__()
        if dim % heads or (dim // heads) % 2:
            raise ValueError(f"`dim` ({dim}) / `heads` ({heads}) must be an even head size")
        self.design = design
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(_Block(dim, heads, d, mlp_ratio, base) for d in layer_designs(design, depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor, layout: str) -> torch.Tensor:
        coords = _block_coords(tuple(b.design for b in self.blocks), layout, tokens.device)
        if coords and next(iter(coords.values())).shape[0] != tokens.shape[1]:
            raise ValueError(f"layout {layout!r} has {next(iter(coords.values())).shape[0]} tokens but the "
                             f"batch has {tokens.shape[1]}; the layout must describe the token sequence")
        x = self.embed(tokens)
        for blk in self.blocks:
            x = blk(x, coords.get(blk.design))
        return self.head(self.norm(x[:, -1]))
