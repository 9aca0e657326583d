"""Vision blocks placed by a design's block rule, kept across :func:`ropekit.rope_index` calls.

A block rule places a vision block ``(t, h, w, Δt)`` the same way wherever it occurs (the contract of
:mod:`ropekit.designs.registry`: offsets and advance depend on the block and the options only), and the
same image and video shapes recur from batch to batch. So :func:`ropekit.rope_index` looks every distinct
block of a batch up here and calls the rule only for the blocks it has not placed before under the same
rule and options.

Each ``(rule, options)`` pair has an *arena*: one table ``(A, rows)`` of relative coordinates, holding
zero rows (read by padding), the text diagonal ``0, 1, 2, …`` and the offsets of every block placed so far,
from which the batched index gathers every token with one index; and, per block, its first row, its
advance, its largest offset per axis and its largest ``|offset|``. The table is float32 while every value
in it is a whole number below 2**24 (exact there), float64 otherwise.

Options are keyed by type and exact value (``1``, ``1.0`` and ``True`` are three keys; floats by their bits),
so a cached block is never handed to a call whose options differ in any way. Options that are not plain
values (tensors, generators, arrays) are not cached: such a call places its blocks as if nothing were kept.
All arenas together hold at most :data:`MAX_BYTES`; the least recently used go first. :func:`clear` empties
the cache.
"""
from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import NamedTuple, Optional

import numpy as np
import torch

from .designs.registry import BlockTable, unpack_placed

__all__ = ["MAX_BYTES", "clear", "place", "place_columns", "place_specs", "columns", "Placement", "Listed"]

#: Most bytes all arenas together may hold (tables and per-block rows); 0 turns the cache off. The ~2.5k
#: benchmark batch (265 distinct blocks, ~40k block tokens) needs about 0.5 MiB per design with 3 axes.
MAX_BYTES = 32 * 2**20

_LOCK = threading.RLock()
_ARENAS: "OrderedDict[tuple, _Arena]" = OrderedDict()  # least recently used first
_EXACT32 = 2**24  # float32 holds every whole number of magnitude up to here


def clear() -> None:
    """Forget every placed block (the next call of each design places its blocks anew)."""
    with _LOCK:
        _ARENAS.clear()


class Placement(NamedTuple):
    """The distinct blocks of one call, as the batched index reads them.

    ``table``: ``(A, rows)`` float32 or float64, zero rows from row 0, the text diagonal from row ``diag``;
    per block (in the order asked): ``first`` row of its offsets (int64), ``advance`` and ``top`` (largest
    offset per axis), ``(S, A)`` float64; ``absmax``: largest ``|offset|`` over these blocks (NaN if any is);
    ``absolute`` (bool) and ``gap`` (float64), ``(A,)`` numpy arrays or None, as the rule returned them.
    """

    table: np.ndarray
    diag: int
    first: np.ndarray
    advance: np.ndarray
    top: np.ndarray
    absmax: float
    absolute: Optional[np.ndarray]
    gap: Optional[np.ndarray]


def _room(n: int) -> int:
    """Rows to keep for a region that must hold ``n``: the next power of two (at least 256)."""
    return max(256, 1 << max(int(n) - 1, 0).bit_length())


class _Arena:
    """Every block placed under one rule and options; see the module doc."""

    def __init__(self, axes: int, absolute, gap, pad: int, text: int, rows: int = 1024, blocks: int = 64) -> None:
        self.axes, self.absolute, self.gap = axes, absolute, gap
        self.slots: dict = {}  # Δt -> packed sizes -> slot
        self.count = 0
        self.first = np.empty(blocks, dtype=np.int64)
        self.info = np.empty((blocks, 2 * axes + 1))  # per block: advance, largest offset per axis, largest |offset|
        self.zeros, self.diag_len = _room(pad), _room(text)
        base = self.zeros + self.diag_len
        self.table = np.empty((axes, base + rows), dtype=np.float32 if self.diag_len <= _EXACT32 else np.float64)
        self.table[:, : self.zeros] = 0.0
        self.table[:, self.zeros: base] = np.arange(self.diag_len)
        self.used = base
        # per block, as Python numbers for one request's look-ups: first row less the zero and diagonal rows
        # (so that growing those regions leaves it as it is), advance, largest offset per axis, largest |offset|
        self.listed: list = []

    @property
    def nbytes(self) -> int:
        return self.table.nbytes + self.first.nbytes + self.info.nbytes

    def make_room(self, pad: int, text: int) -> None:
        """Grow the zero and diagonal regions to hold ``pad`` and ``text`` rows (moving the blocks' rows)."""
        if pad <= self.zeros and text <= self.diag_len:
            return
        zeros, diag_len = max(self.zeros, _room(pad)), max(self.diag_len, _room(text))
        old_base, base = self.zeros + self.diag_len, zeros + diag_len
        dtype = self.table.dtype if diag_len <= _EXACT32 else np.float64
        table = np.empty((self.axes, base + self.table.shape[1] - old_base), dtype=dtype)
        table[:, :zeros] = 0.0
        table[:, zeros: base] = np.arange(diag_len)
        table[:, base: base + self.used - old_base] = self.table[:, old_base: self.used]
        self.first[: self.count] += base - old_base
        self.table, self.zeros, self.diag_len, self.used = table, zeros, diag_len, self.used + base - old_base

    def add(self, keys: list, offsets: np.ndarray, tokens: np.ndarray, advance: np.ndarray) -> None:
        """Append blocks: their keys ``[(Δt, [packed sizes])]``, offsets ``(A, Σ n)`` float64, token counts and
        advances ``(S, A)``."""
        n, count = offsets.shape[1], tokens.shape[0]
        if not count:
            return
        first = np.zeros(count, dtype=np.int64)
        np.cumsum(tokens[:-1], out=first[1:])
        top = np.maximum.reduceat(offsets, first, axis=1)  # (A, S); NaN stays NaN
        absmax = np.maximum(top, -np.minimum.reduceat(offsets, first, axis=1)).max(axis=0)
        top = top.T
        if self.table.dtype == np.float32 and not (bool((absmax < _EXACT32).all())
                                                   and np.array_equal(offsets, np.rint(offsets))):
            table = np.empty(self.table.shape)  # a value float32 does not hold exactly: float64 from now on
            table[:, : self.used] = self.table[:, : self.used]
            self.table = table
        if self.used + n > self.table.shape[1]:
            table = np.empty((self.axes, max(2 * self.table.shape[1], self.used + n)), dtype=self.table.dtype)
            table[:, : self.used] = self.table[:, : self.used]
            self.table = table
        self.table[:, self.used: self.used + n] = offsets
        if self.count + count > self.first.shape[0]:
            size = max(2 * self.first.shape[0], self.count + count)
            for name in ("first", "info"):
                old = getattr(self, name)
                new = np.empty((size,) + old.shape[1:], dtype=old.dtype)
                new[: self.count] = old[: self.count]
                setattr(self, name, new)
        rows = slice(self.count, self.count + count)
        self.first[rows] = first + self.used
        a = self.axes
        self.info[rows, :a], self.info[rows, a: 2 * a], self.info[rows, 2 * a] = advance, top, absmax
        self.listed.extend(zip((first + (self.used - self.zeros - self.diag_len)).tolist(), advance.tolist(),
                               top.tolist(), absmax.tolist()))
        slot = self.count
        for iv, ks in keys:  # [(Δt, [packed sizes])], in block order
            self.slots.setdefault(iv, {}).update(zip(ks, range(slot, slot + len(ks))))
            slot += len(ks)
        self.count += count
        self.used += n

    def placement(self, slots: np.ndarray) -> Placement:
        info, a = self.info[slots], self.axes
        absmax = float(info[:, 2 * a].max()) if slots.shape[0] else 0.0
        return Placement(self.table, self.zeros, self.first[slots], info[:, :a], info[:, a: 2 * a], absmax,
                         self.absolute, self.gap)


def _freeze(value):
    """``value`` as an exact, hashable key (type and value, floats by their bits); TypeError if it has none."""
    if value is None or isinstance(value, (bool, int, str, bytes)):
        return type(value), value
    if isinstance(value, float):
        return type(value), float.hex(value)
    if isinstance(value, (tuple, list)):
        return type(value), tuple(_freeze(v) for v in value)
    raise TypeError(type(value).__name__)


def _key(rule, options: dict) -> Optional[tuple]:
    try:
        return (rule, tuple(sorted((k, _freeze(v)) for k, v in options.items())))
    except TypeError:
        return None


def _run_rule(rule, options: dict, isv, t, h, w, iv):
    """The rule on the given blocks: offsets ``(A, Σ n)`` float64, token counts, advances, absolute, gap."""
    blocks = BlockTable(*(torch.from_numpy(np.ascontiguousarray(x)) for x in (t, h, w, iv.astype(np.float64))),
                        torch.from_numpy(isv == 0))
    offsets, advance, absolute, gap = unpack_placed(rule(blocks, **options))
    off = np.ascontiguousarray(offsets.detach().to("cpu", torch.float64).numpy().T)
    advance = advance.detach().to("cpu", torch.float64).numpy()
    absolute = None if absolute is None else absolute.detach().cpu().numpy().astype(bool)
    gap = None if gap is None else gap.detach().to("cpu", torch.float64).numpy()
    return off, (t * h * w), advance, absolute, gap


#: Packed block keys: ``level << 47 | is video << 46 | t << 32 | h << 16 | w``, ``level`` the index of the
#: block's Δt among the call's distinct intervals (sorted). Blocks whose sizes do not fit are not kept.
LEVEL_SHIFT, MAX_T, MAX_HW, MAX_LEVELS = 47, 2**14, 2**16, 2**16


def columns(keys: np.ndarray, levels: np.ndarray) -> tuple:
    """``(is video, t, h, w, Δt)`` of packed keys (int64, and float64 for Δt)."""
    return ((keys >> 46) & 1, (keys >> 32) & (MAX_T - 1), (keys >> 16) & (MAX_HW - 1), keys & (MAX_HW - 1),
            levels[keys >> LEVEL_SHIFT])


def place_columns(rule, options: dict, isv, t, h, w, iv, pad: int, text: int) -> Placement:
    """The blocks ``(is video, t, h, w, Δt)`` placed for this call only (blocks that cannot be keyed)."""
    count = t.shape[0]
    return _fresh(rule, options, [], (isv, t, h, w, iv), pad, text).placement(np.arange(count))


def _fresh(rule, options: dict, keys: list, blocks: tuple, pad: int, text: int) -> _Arena:
    off, tokens, advance, absolute, gap = _run_rule(rule, options, *blocks)
    arena = _Arena(advance.shape[1], absolute, gap, pad, text, max(off.shape[1], 1024), max(tokens.shape[0], 64))
    arena.add(keys, off, tokens, advance)
    return arena


def place(rule, options: dict, keys: np.ndarray, levels: np.ndarray, pad: int, text: int) -> Placement:
    """The distinct blocks of a call, given as sorted packed keys (see :data:`LEVEL_SHIFT`) and the sorted
    distinct intervals their levels index, placed by ``rule`` under ``options`` in a table with at least ``pad``
    zero rows and ``text`` diagonal rows; the rule runs only on the blocks not kept from earlier calls."""
    if MAX_BYTES <= 0 and _ARENAS:  # turned off: let go of what was kept
        clear()
    key = _key(rule, options) if MAX_BYTES > 0 else None
    count = keys.shape[0]
    if key is None:  # nothing kept: one arena for this call only
        return place_columns(rule, options, *columns(keys, levels), pad, text)
    # kept blocks are keyed by (Δt, packed sizes): the level of a key is this call's own numbering
    packed = (keys & (2**LEVEL_SHIFT - 1)).tolist()
    bounds = [0, *np.searchsorted(keys, np.arange(1, levels.shape[0]) << LEVEL_SHIFT).tolist(), count]
    names = [(iv, packed[bounds[i]: bounds[i + 1]]) for i, iv in enumerate(levels.tolist())]
    with _LOCK:
        arena = _ARENAS.get(key)
        if arena is None:
            arena = _fresh(rule, options, names, columns(keys, levels), pad, text)
            slots = np.arange(count)
        else:
            _ARENAS.move_to_end(key)
            found = []
            for iv, ks in names:
                get = arena.slots.get(iv, {}).get
                found += [get(k, -1) for k in ks]
            slots = np.array(found, dtype=np.int64)
            miss = np.flatnonzero(slots < 0)
            arena.make_room(pad, text)
            if miss.shape[0]:
                off, tokens, advance, _, _ = _run_rule(rule, options, *columns(keys[miss], levels))
                slots[miss] = np.arange(arena.count, arena.count + miss.shape[0])
                ivs = levels[keys[miss] >> LEVEL_SHIFT].tolist()
                arena.add(_group(ivs, [packed[i] for i in miss.tolist()]), off, tokens, advance)
        _ARENAS[key] = arena
        total = sum(a.nbytes for a in _ARENAS.values())
        while total > MAX_BYTES and len(_ARENAS) > 1:  # the least recently used others go first
            total -= _ARENAS.popitem(last=False)[1].nbytes
        if total > MAX_BYTES:  # this arena alone is too big: keep only this call's blocks, if they fit
            del _ARENAS[key]
            if arena.count > count:
                arena = _fresh(rule, options, names, columns(keys, levels), pad, text)
                slots = np.arange(count)
                if arena.nbytes <= MAX_BYTES:
                    _ARENAS[key] = arena
        return arena.placement(slots)


class Listed(NamedTuple):
    """:class:`Placement` with its per-block parts as Python lists (``first``, ``advance``, ``top``) and
    ``absmax`` a float, for code that walks a few blocks in Python."""

    table: np.ndarray
    diag: int
    first: list
    advance: list
    top: list
    absmax: float
    absolute: Optional[np.ndarray]
    gap: Optional[np.ndarray]


def place_specs(rule, options: dict, specs: list, text: int) -> Listed:
    """:func:`place` for a few blocks given as sorted distinct tuples ``(Δt, is video, t, h, w)`` (one
    request's), with no zero rows asked for: blocks all kept are found with dictionary look-ups alone."""
    key = _key(rule, options) if MAX_BYTES > 0 else None
    if key is not None and specs:
        with _LOCK:
            arena = _ARENAS.get(key)
            if arena is not None and text <= arena.diag_len:
                listed, slots, got = arena.listed, arena.slots, []
                for iv, isv, t, h, w in specs:
                    found = slots.get(iv)
                    found = None if found is None else found.get((isv << 46) | (t << 32) | (h << 16) | w)
                    if found is None or t >= MAX_T or h >= MAX_HW or w >= MAX_HW:
                        break
                    got.append(listed[found])
                else:
                    _ARENAS.move_to_end(key)
                    base = arena.zeros + arena.diag_len
                    absmax = [g[3] for g in got]
                    absmax = max(absmax) if all(x == x for x in absmax) else math.nan  # NaN stays NaN
                    return Listed(arena.table, arena.zeros, [g[0] + base for g in got], [g[1] for g in got],
                                  [g[2] for g in got], absmax, arena.absolute, arena.gap)
    levels = sorted({s[0] for s in specs})
    if (specs and (max(s[2] for s in specs) >= MAX_T or max(max(s[3], s[4]) for s in specs) >= MAX_HW
                   or len(levels) > MAX_LEVELS)):
        cols = np.array([s[1:] for s in specs], dtype=np.int64).T
        placed = place_columns(rule, options, cols[0], cols[1], cols[2], cols[3],
                               np.array([s[0] for s in specs], dtype=np.float64), 0, text)
    else:
        rank = {iv: i for i, iv in enumerate(levels)}
        keys = np.array([(rank[iv] << LEVEL_SHIFT) | (isv << 46) | (t << 32) | (h << 16) | w
                         for iv, isv, t, h, w in specs], dtype=np.int64)
        placed = place(rule, options, keys, np.array(levels, dtype=np.float64), 0, text)
    return Listed(placed.table, placed.diag, placed.first.tolist(), placed.advance.tolist(), placed.top.tolist(),
                  placed.absmax, placed.absolute, placed.gap)


def _group(ivs: list, packed: list) -> list:
    """``[(Δt, [packed keys])]`` of blocks listed one by one (in order, so slots follow them)."""
    out: list = []
    for iv, k in zip(ivs, packed):
        if out and out[-1][0] == iv:
            out[-1][1].append(k)
        else:
            out.append((iv, [k]))
    return out
