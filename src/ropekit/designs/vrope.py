"""VRoPE (VRoPE paper §4): symmetric, continuity-preserving positions for video frames and N-D grids.

On a 2-D ``H × W`` frame the paper rotates (row i, col j) into ``u = i + j``, ``v = j - i + H - 1``
(eq. 6) and gives each token both signs of each, ``u± , v±`` (eq. 7), shifted so that the frame
starts at ``P_f`` and ends at ``P_f + H + W - 2``. Written per axis, every one of the four
coordinates is ``P_f`` plus, for each spatial axis, either the index or its reflection:

    u+ = P + i + j            v- = P + i + (W-1-j)
    v+ = P + (H-1-i) + j      u- = P + (H-1-i) + (W-1-j)

**N spatial axes.** The same rule gives ``2^N`` coordinates, one per *flip pattern*
``b ∈ {0,1}^N`` (``b_a = 1``: axis a contributes ``size_a - 1 - x_a`` instead of ``x_a``).
Coordinates are listed by the binary number ``b_0 b_1 … b_{N-1}`` (first axis most significant),
which for N = 2 is exactly the released reference order ``(u+, v-, v+, u-)`` above (the default).
``order="paper"`` lists them as eq. 8 does, ``(u+, u-, v+, v-)``: for N axes, the patterns whose last
bit is 0 in binary order, each followed by its complement. A frame spans ``sum(sizes) - N + 1``
indices; the next frame, or the text after the block, starts right after it (text after a
``T``-frame block starts at ``s + T·(H + W - 1)``). Text repeats its index on every axis.

Properties (tested): reflecting any set of axes only permutes a token's coordinates (index
``c ↦ c XOR mask``), so every token of a frame has the same mean coordinate; each axis of a frame
covers ``P_f … P_f + sum(sizes) - N`` so the sequence is continuous on every axis; a grid with a
size-1 axis degrades to the lower-dimensional form (``H = 1`` gives the paper's ``(w, -w, w, -w)``).

Segments: ``Image``/``Video`` frames are 2-D grids (a video's frames follow one another; VRoPE has
no temporal axis, so a video's ``interval`` is ignored); a ``Grid`` of rank N is one N-D frame. All
vision segments of a layout must share one spatial rank, since the number of axes is ``2^N``.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from ..layout import Grid, Image, Layout, Segment, Text, Video, check_token_count
from .registry import BlockTable, block_rows_np, ragged_arange, register, walk

__all__ = ["vrope", "vrope_blocks", "flip_patterns", "frame_coordinates", "frame_length", "ORDERS",
           "MAX_SPATIAL_DIMS"]

ORDERS = ("reference", "paper")

#: Largest N accepted: VRoPE gives every token 2^N coordinates and each needs at least one frequency pair,
#: so N = 10 (1024 coordinates) already needs a rotary dimension of 2048.
MAX_SPATIAL_DIMS = 10


def _check_rank(spatial_dims: int, name: str = "`spatial_dims`") -> int:
    if isinstance(spatial_dims, bool) or not isinstance(spatial_dims, int) or spatial_dims < 1:
        raise ValueError(f"vrope: {name} must be an int >= 1 (2 for images/videos), got {spatial_dims!r}")
    if spatial_dims > MAX_SPATIAL_DIMS:
        raise ValueError(
            f"vrope: {name} is {spatial_dims}, which gives 2**{spatial_dims} coordinates per token; each needs at "
            f"least one frequency pair, so at most {MAX_SPATIAL_DIMS} spatial axes are accepted "
            f"(ropekit.designs.vrope.MAX_SPATIAL_DIMS)"
        )
    return spatial_dims


def _check_order(order: str) -> None:
    if order not in ORDERS:
        raise ValueError(
            f"vrope: `order` must be 'reference' (released code: u+, v-, v+, u-) or 'paper' "
            f"(eq. 8: u+, u-, v+, v-), got {order!r}"
        )


def flip_patterns(spatial_dims: int, order: str = "reference") -> torch.Tensor:
    """Flip bits of the ``2^N`` VRoPE coordinates, ``(2^N, N)`` long, in the chosen order.

    Row c of the ``"reference"`` order is the binary expansion of c, first axis most significant.
    """
    n = _check_rank(spatial_dims)
    _check_order(order)
    idx = torch.arange(2**n)
    if order == "paper":
        evens = idx[0::2]
        idx = torch.stack([evens, evens ^ (2**n - 1)], dim=1).flatten()
    shifts = torch.arange(n - 1, -1, -1)
    return (idx[:, None] >> shifts) & 1


def frame_length(sizes: Sequence[int]) -> int:
    """Number of indices one frame occupies on every axis: ``sum(sizes) - N + 1`` (``H + W - 1`` in 2-D)."""
    return int(sum(sizes)) - len(sizes) + 1


def frame_coordinates(sizes: Sequence[int], start: float = 0.0, order: str = "reference") -> torch.Tensor:
    """VRoPE coordinates of one N-D frame starting at ``start``: ``(prod(sizes), 2^N)`` float64, row-major tokens.

    Coordinate c of token ``x`` is ``start + Σ_a (size_a - 1 - x_a if flip[c, a] else x_a)`` (paper eq. 6-7
    for N = 2, generalised to N axes).
    """
    sizes = list(sizes)
    if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
        raise ValueError(f"vrope: frame `sizes` must be a non-empty list of ints >= 1, got {sizes}")
    _check_rank(len(sizes), "the number of frame `sizes`")
    check_token_count(math.prod(sizes), "vrope: frame_coordinates")
    grids = torch.meshgrid(*(torch.arange(s, dtype=torch.float64) for s in sizes), indexing="ij")
    x = torch.stack([g.reshape(-1) for g in grids], dim=1)  # (n, N)
    reflected = torch.tensor(sizes, dtype=torch.float64) - 1.0 - x
    return _pick(x, reflected, flip_patterns(len(sizes), order)) + float(start)


def _pick(x: torch.Tensor, reflected: torch.Tensor, flips: torch.Tensor) -> torch.Tensor:
    """``Σ_a (reflected[:, a] if flips[c, a] else x[:, a])`` for every coordinate c: ``(tokens, 2^N)`` float64.

    Summed one axis at a time, so no ``(tokens, 2^N, N)`` temporary is built.
    """
    out = torch.zeros(x.shape[0], flips.shape[0], dtype=torch.float64)
    for a in range(flips.shape[1]):
        out += torch.where(flips[:, a].to(torch.bool)[None], reflected[:, a: a + 1], x[:, a: a + 1])
    return out


def _frames(seg: Segment) -> tuple[int, tuple]:
    """(number of frames, spatial sizes of one frame) for a vision segment."""
    if isinstance(seg, Video):
        return seg.t, (seg.h, seg.w)
    if isinstance(seg, Image):
        return 1, (seg.h, seg.w)
    if isinstance(seg, Grid):
        return 1, tuple(seg.sizes)
    raise TypeError(f"vrope: unsupported segment {seg!r}")


def _spatial_rank(segments: Sequence[Segment], spatial_dims: int | None) -> int:
    ranks = {}
    for seg in segments:
        if not isinstance(seg, Text):
            ranks.setdefault(len(_frames(seg)[1]), str(seg))
    if spatial_dims is not None:
        _check_rank(spatial_dims)
        bad = {r: s for r, s in ranks.items() if r != spatial_dims}
        if bad:
            r, s = next(iter(bad.items()))
            raise ValueError(
                f"vrope: segment {s} has {r} spatial axes but `spatial_dims={spatial_dims}`; "
                f"leave `spatial_dims` unset or use grids of rank {spatial_dims}"
            )
        return spatial_dims
    if len(ranks) > 1:
        desc = ", ".join(f"{s} ({r}-D)" for r, s in sorted(ranks.items()))
        raise ValueError(
            f"vrope: the layout mixes spatial grids of different rank ({desc}); VRoPE gives 2^N axes for "
            f"N-D grids, so every vision segment of one sequence must have the same number of spatial axes "
            f"(images/videos are 2-D)"
        )
    rank, seg = next(iter(ranks.items()), (2, None))
    return _check_rank(rank, f"the rank of segment {seg}")


def vrope_axes(layout: Layout, spatial_dims: int | None = None, order: str = "reference") -> int:
    """Number of VRoPE axes for ``layout``: ``2^N`` (checks the options, places nothing)."""
    _check_order(order)
    return 2 ** _spatial_rank([s for s in layout if not isinstance(s, Text)], spatial_dims)


def vrope_blocks(
    segments: Sequence[Segment], spatial_dims: int | None = None, order: str = "reference"
) -> tuple[torch.Tensor, torch.Tensor]:
    """VRoPE block rule: frame f of a block at ``f·(Σ sizes − N + 1)`` plus :func:`frame_coordinates`; the
    start advances by ``T·(Σ sizes − N + 1)`` on all ``2^N`` axes. All blocks must share the rank N."""
    _check_order(order)
    if isinstance(segments, BlockTable) and len(segments) and spatial_dims in (None, 2):
        return _image_blocks(segments.t.numpy(), segments.h.numpy(), segments.w.numpy(), flip_patterns(2, order))
    n = _spatial_rank(segments, spatial_dims)
    frames, sizes = zip(*(_frames(s) for s in segments)) if segments else ((), ())
    t = torch.tensor(frames, dtype=torch.int64)
    size = torch.tensor(sizes, dtype=torch.int64).reshape(len(segments), n)
    area = size.prod(dim=1)
    step = size.sum(dim=1) - n + 1  # frame_length
    owner, local = ragged_arange(t * area)
    frame = local // area[owner]
    rest = local - frame * area[owner]
    # row-major digits of the in-frame index, last axis fastest
    digits, tok_size = [], size[owner]
    for a in range(n - 1, -1, -1):
        digits.append(rest % tok_size[:, a])
        rest = rest // tok_size[:, a]
    x = torch.stack(digits[::-1], dim=1).to(torch.float64)  # (tokens, N)
    reflected = tok_size.to(torch.float64) - 1.0 - x
    offsets = _pick(x, reflected, flip_patterns(n, order)) + (frame * step[owner]).to(torch.float64)[:, None]
    return offsets, (t * step).to(torch.float64)[:, None].expand(-1, 2**n).contiguous()


def _image_blocks(t: np.ndarray, h: np.ndarray, w: np.ndarray, flips: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`vrope_blocks` for images and videos (2-D frames, the batched index's blocks), row by row.

    Coordinate c of token (f, i, j) is ``f·(h + w − 1) + (h−1−i or i) + (w−1−j or j)``: the frame and row
    terms are taken once per row, the column term per token. Whole numbers throughout (exact in int64,
    and in float64 below 2**53), so the values are those of the general path."""
    row_block, row_frame, row_index, token_row, token_col = block_rows_np(t, h, w)
    step = h + w - 1  # frame_length
    frame_start = row_frame * step[row_block]
    rows = [(frame_start + row_index).astype(np.float64),  # per row: i, reflected i
            (frame_start + (h[row_block] - 1 - row_index)).astype(np.float64)]
    col = token_col.astype(np.float64)
    cols = (col, (w[row_block] - 1).astype(np.float64)[token_row] - col)  # per token: j, reflected j
    offsets = np.empty((flips.shape[0], token_row.shape[0]))
    for c, (flip_i, flip_j) in enumerate(flips.tolist()):
        np.take(rows[flip_i], token_row, out=offsets[c], mode="clip")
        offsets[c] += cols[flip_j]
    advance = torch.from_numpy((t * step).astype(np.float64))[:, None].expand(-1, flips.shape[0]).contiguous()
    return torch.from_numpy(offsets).T, advance


@register(
    "vrope",
    summary="VRoPE: 2^N symmetric rotated coordinates per token (4 on video frames), text continues seamlessly",
    allocation="vrope",
    block_rule=vrope_blocks,
    axes=vrope_axes,
)
def vrope(layout: Layout, spatial_dims: int | None = None, order: str = "reference") -> torch.Tensor:
    """VRoPE positions ``(L, 2^N)`` (paper §4.1-4.2, eq. 6-7).

    ``spatial_dims`` (N) is read from the layout's vision segments (2 for images/videos, the rank for
    a ``Grid``); give it to fix the number of axes of a text-only layout (default 2, i.e. 4 axes).
    ``order`` chooses the coordinate order: ``"reference"`` (released code, the default) or ``"paper"`` (eq. 8).
    Pair with ``frequency_matrix("vrope", D, 2**N)``: frequency k uses coordinate ``k mod 2^N``.
    """
    return walk(layout, vrope_blocks, spatial_dims=spatial_dims, order=order)
