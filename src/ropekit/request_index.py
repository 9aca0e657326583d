"""Positions of one request, as a server asks for them: :func:`request_positions`.

A serving engine builds the positions of each request once, when the request arrives, from the prompt's
length and where each image and video sits in it (vLLM's ``get_mrope_input_positions`` takes the token
ids and the multimodal items with their offsets). :func:`ropekit.rope_index` does this for a padded batch
of token-type rows; for one request most of its cost is the batch machinery (run-length encoding the
token types, matching the runs to grids, sample bookkeeping). :func:`request_positions` takes the items
with their offsets instead, so nothing per token is read, and places the request with a handful of numpy
operations over its few segments and one gather over its tokens.

Its result is, value for value, ``rope_index``'s for the same request given as a batch of one (the
positions ``pos[:, 0]`` and the delta ``delta[0]``): the same vision blocks kept by
:mod:`ropekit.block_cache`, the same float arithmetic, the same checks. Designs without a block rule are
placed through ``rope_index`` itself.
"""
from __future__ import annotations

import math
import numbers
from typing import Optional, Sequence

import numpy as np
import torch

from . import block_cache as _block_cache
from . import index as _index
from .designs.registry import check_options, get_design
from .layout import IMAGE, MAX_TOKENS, VIDEO

__all__ = ["request_positions"]

_MODALITY = {"image": IMAGE, "video": VIDEO, IMAGE: IMAGE, VIDEO: VIDEO}
_SHIFT = _block_cache.LEVEL_SHIFT


def _whole(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer, torch.Tensor)):
        raise TypeError(f"request_positions: {what} must be a whole number (int), got {type(value).__name__} "
                        f"({value!r})"[:200])
    if isinstance(value, torch.Tensor) and (value.numel() != 1 or value.is_floating_point() or value.is_complex()
                                            or value.dtype == torch.bool):
        raise TypeError(f"request_positions: {what} must be a whole number, got {value!r}"[:200])
    return int(value)


def _grid(value: object, k: int) -> tuple:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        if value.dtype == torch.bool or value.dtype == np.bool_:
            raise TypeError(f"request_positions: `items[{k}]` grid must hold whole numbers (t, h, w), got booleans")
        value = value.reshape(-1).tolist()
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise ValueError(f"request_positions: `items[{k}]` grid must be three whole numbers (t, h, w) of patches, "
                         f"got {value!r}"[:200])
    return tuple(_whole(v, f"`items[{k}]` grid entry") for v in value)


def _item(item: object, k: int) -> tuple:
    """``(offset, kind, (t, h, w), seconds or None)`` of one item, checked (the slow path of :func:`_parse`)."""
    if not isinstance(item, (list, tuple)) or len(item) not in (3, 4):
        raise ValueError(f"request_positions: `items[{k}]` must be (offset, modality, (t, h, w)) or "
                         f"(offset, modality, (t, h, w), second_per_grid_t), got {item!r}"[:200])
    offset = _whole(item[0], f"`items[{k}]` offset")
    modality = item[1]
    kind = None if isinstance(modality, bool) or not isinstance(modality, (str, int)) else _MODALITY.get(modality)
    if kind is None:
        raise ValueError(f"request_positions: `items[{k}]` modality must be 'image' or 'video' (or the token "
                         f"types 1, 2), got {modality!r}"[:200])
    if len(item) == 4 and kind != VIDEO:
        raise ValueError(f"request_positions: `items[{k}]` is an image but gives second_per_grid_t; only videos "
                         f"have frame times")
    return offset, kind, _grid(item[2], k), (item[3] if len(item) == 4 else None)


class _Unsorted(Exception):
    pass


def _parse(num_tokens: int, items: Sequence, merge: int, split: Optional[bool], ordered: bool = False):
    """Validate the items: text lengths before each block and after the last, the vision blocks
    ``(kind, t, h, w, video index)`` (h, w divided by ``merge``; a video split into frames gives ``t``
    blocks ``[1, h, w]``), the patch grids by kind (as ``rope_index`` takes them), the videos' seconds and
    the number of videos. Items out of offset order are sorted first."""
    if not isinstance(items, (list, tuple)):
        raise TypeError(f"request_positions: `items` must be a list of (offset, modality, (t, h, w)"
                        f"[, second_per_grid_t]) tuples, got {type(items).__name__}")
    texts, blocks, seconds, images, videos = [], [], [], [], []
    end = previous = 0
    for k, item in enumerate(items):
        # the usual item, (int, "image"/"video", [int, int, int]), is read with no call; anything else is checked
        if (type(item) is tuple or type(item) is list) and len(item) == 3 and type(item[0]) is int:
            offset, modality, grid = item
            kind = _MODALITY.get(modality) if type(modality) is str else None
            if (kind is None or not (type(grid) is list or type(grid) is tuple) or len(grid) != 3
                    or type(grid[0]) is not int or type(grid[1]) is not int or type(grid[2]) is not int):
                offset, kind, grid, sec = _item(item, k)
            else:
                sec = None
        else:
            offset, kind, grid, sec = _item(item, k)
        if offset < previous and not ordered:
            raise _Unsorted
        previous = offset
        t, h, w = grid
        if t < 1 or h < 1 or w < 1:
            raise ValueError(f"request_positions: `items[{k}]` grid entries must be >= 1, got {list(grid)}")
        if h % merge or w % merge:
            raise ValueError(f"request_positions: `items[{k}]` grid {list(grid)} has an h or w not divisible by "
                             f"spatial_merge_size={merge}; grids are patch grids before merging")
        if offset < end:
            what = "is negative" if end == 0 else f"overlaps the item before it, which ends at token {end}"
            raise ValueError(f"request_positions: `items[{k}]` starts at token {offset}, which {what}")
        h //= merge
        w //= merge
        size = t * h * w
        if offset + size > num_tokens:
            raise ValueError(f"request_positions: `items[{k}]` ({size} tokens from token {offset}) ends past the "
                             f"`num_tokens`={num_tokens} tokens of the request")
        texts.append(offset - end)
        if kind == VIDEO:
            n = len(videos)
            videos.append(grid)
            seconds.append(sec)
            if split and t > 1:
                blocks.extend([(VIDEO, 1, h, w, n)] * t)
                texts.extend([0] * (t - 1))
            else:
                blocks.append((VIDEO, t, h, w, n))
        else:
            images.append(grid)
            blocks.append((IMAGE, t, h, w, -1))
        end = offset + size
    texts.append(num_tokens - end)
    if seconds and seconds[0] is None:
        if any(s is not None for s in seconds):
            raise ValueError("request_positions: give second_per_grid_t for every video item or for none")
        seconds = None
    elif seconds and any(s is None for s in seconds):
        raise ValueError("request_positions: give second_per_grid_t for every video item or for none")
    return texts, blocks, {IMAGE: images, VIDEO: videos}, seconds or None, len(videos)


def request_positions(
    num_tokens: int,
    items: Sequence = (),
    *,
    design: str = "mrope",
    spatial_merge_size: int = 2,
    tokens_per_second: Optional[float] = None,
    per_axis_deltas: bool = False,
    split_video_frames: Optional[bool] = None,
    dtype: torch.dtype = torch.float32,
    **design_options,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions ``(A, num_tokens)`` and delta of one request of ``num_tokens`` tokens under ``design``.

    ``items`` lists the request's images and videos as ``(offset, modality, (t, h, w))`` tuples, or
    ``(offset, modality, (t, h, w), second_per_grid_t)`` for Qwen2.5-VL videos: ``offset`` is the index
    of the item's first token, ``modality`` ``"image"`` or ``"video"``, ``(t, h, w)`` the patch grid
    before merging (a list, tuple or tensor), whose ``t · h · w / spatial_merge_size²`` tokens follow
    ``offset`` back to back. Every other token is text. Items may not overlap; they are taken in offset
    order.

    The result equals :func:`ropekit.rope_index` on the same request as a batch of one — token types
    ``0`` with each item's tokens ``1`` (image) or ``2`` (video), the images' and the videos' grids in
    order, the videos' seconds as ``second_per_grid_ts`` — as ``(positions[:, 0], deltas[0])``: deltas
    ``(1,)``, or ``(A,)`` with ``per_axis_deltas=True``; the other arguments are ``rope_index``'s. The
    items say where each video ends, so ``split_video_frames=None`` splits nothing; ``True`` makes each
    frame of a video its own block (Qwen3-VL's rule, for frames given back to back).
    """
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
        raise ValueError(f"request_positions: `num_tokens` must be an int >= 0, got {num_tokens!r}"[:200])
    if isinstance(spatial_merge_size, bool) or not isinstance(spatial_merge_size, int) or spatial_merge_size < 1:
        raise ValueError(f"request_positions: `spatial_merge_size` must be an int >= 1, got {spatial_merge_size!r}")
    if split_video_frames is not None and not isinstance(split_video_frames, bool):
        raise TypeError(f"request_positions: `split_video_frames` must be True, False or None, "
                        f"got {split_video_frames!r}")
    if not isinstance(per_axis_deltas, bool):
        raise TypeError(f"request_positions: `per_axis_deltas` must be True or False, got {per_axis_deltas!r}")
    if num_tokens > MAX_TOKENS:
        _index._layout.check_token_count(num_tokens, "request_positions: `num_tokens`")
    try:
        texts, blocks, grids, seconds, n_videos = _parse(num_tokens, items, spatial_merge_size, split_video_frames)
    except _Unsorted:  # (vLLM sorts its items by offset too)
        items = sorted(items, key=lambda item: _item(item, 0)[0])
        texts, blocks, grids, seconds, n_videos = _parse(num_tokens, items, spatial_merge_size, split_video_frames,
                                                         ordered=True)
    if seconds is None and tokens_per_second is None:
        intervals = [1.0] * n_videos
    else:
        intervals = _index._intervals(n_videos, seconds, tokens_per_second)
    _index._check_dtype(dtype)
    d = get_design(design)
    check_options(d, design_options)
    if d.block_rule is None or not num_tokens:
        return _through_rope_index(num_tokens, texts, blocks, grids, seconds, split_video_frames, design,
                                   spatial_merge_size, tokens_per_second, per_axis_deltas, dtype, design_options)
    # int64 straight from the placement when the design is whole-valued (rope_index's probe) and the positions are
    # whole by construction; otherwise float32, checked (and refused where fractional) as rope_index does
    int64 = dtype == torch.int64 and _index._probe_fraction(d, design_options) is None
    pos, delta, whole = _place(num_tokens, texts, blocks, intervals, d, design_options, per_axis_deltas, int64)
    if dtype == torch.int64 and not (int64 and whole):
        return _index._as_int64(pos, delta, d, design_options)
    return pos, delta


def _through_rope_index(num_tokens, texts, blocks, grids, seconds, split, design, merge, tps, per_axis_deltas, dtype,
                        options):
    """The request as a batch of one, through :func:`ropekit.rope_index` (designs with no block rule)."""
    types = torch.zeros(1, num_tokens, dtype=torch.int64)
    at = 0
    for n, (kind, t, h, w, _) in zip(texts, blocks):
        at += n
        types[0, at: at + t * h * w] = kind
        at += t * h * w
    pos, delta = _index.rope_index(
        None, types, grids[IMAGE] or None, grids[VIDEO] or None, design=design, spatial_merge_size=merge,
        second_per_grid_ts=seconds, tokens_per_second=tps, per_axis_deltas=per_axis_deltas,
        split_video_frames=split, dtype=dtype, **options)
    return pos[:, 0], delta[0]


def _place(num_tokens, texts, blocks, intervals, d, options, per_axis_deltas, int64=False):
    """A block-rule design on one request: the segments' starts in Python floats, one gather over the tokens.

    The arithmetic is the batched index's (:func:`ropekit.index._index_by_rule`) for a batch of one: the
    same table of kept blocks, the starts summed in the same order in float64, each position rounded
    once to float32."""
    # the vision blocks (Δt, is video, t, h, w), as the batched index keys them (sorted: the order of its
    # packed keys, whose most significant part is the rank of Δt), and their distinct set
    specs = [(intervals[v], 1, t, h, w) if kind == VIDEO else ((1.0, 1, t, h, w) if t > 1 else (0.0, 0, t, h, w))
             for kind, t, h, w, v in blocks]
    distinct = sorted(set(specs))
    text_max = max(texts)
    placed = _block_cache.place_specs(d.block_rule, options, distinct, text_max)
    slot = {spec: k for k, spec in enumerate(distinct)}
    which = [slot[spec] for spec in specs]
    first, advance, top = placed.first, placed.advance, placed.top
    absolute, gap, diag = placed.absolute, placed.gap, placed.diag
    axes = placed.table.shape[0]
    nb = len(blocks)

    # segments in order (text runs, empty ones left out, and vision blocks), each starting at the sum of the
    # steps before it (a text run's length, a block's advance) in float64, in order, as the batched index
    # sums them; each vision block after the first one gap further (the gap a step of its own, just before it)
    if absolute is None and (gap is None or gap.min() == gap.max()) and all(a.count(a[0]) == axes for a in advance):
        return _place_uniform(num_tokens, texts, blocks, which, first, [a[0] for a in advance], top,
                              None if gap is None else float(gap[0]), placed, text_max, d, options, per_axis_deltas,
                              int64)
    seg_len, seg_base, seg_start, tops = [], [], [], []
    gap = None if gap is None else gap.tolist()
    keep = None if absolute is None else [not a for a in absolute.tolist()]
    at = [0.0] * axes
    for k in range(nb + 1):
        n = texts[k]
        if n:
            seg_len.append(n)
            seg_base.append(diag)
            seg_start.append(at)
            tops.append([a + (n - 1) for a in at])
            at = [a + n for a in at]
        if k == nb:
            break
        b = which[k]
        if gap is not None and k:
            at = [a + g for a, g in zip(at, gap)]
        _, t, h, w, _ = blocks[k]
        seg_len.append(t * h * w)
        seg_base.append(first[b])
        here = at if keep is None else [a if kp else 0.0 for a, kp in zip(at, keep)]
        seg_start.append(here)
        tops.append([a + o for a, o in zip(here, top[b])])
        at = [a + s for a, s in zip(at, advance[b])]
    starts = np.array(seg_start)  # (S, A) float64
    start_max = float(np.abs(starts).max())  # (NaN stays NaN, and is refused next)
    _index._check_finite(placed.absmax + max(text_max, 0) + start_max, d.block_rule, options)

    # every token: its segment's table row plus its index inside the segment, plus its segment's start
    lengths = np.array(seg_len, dtype=np.int64)
    offset, shift = [], 0
    for base, n in zip(seg_base, seg_len):
        offset.append(base - shift)
        shift += n
    row = np.repeat(np.array(offset, dtype=np.int64), lengths)
    row += np.arange(num_tokens, dtype=np.int64)
    table = placed.table
    pos = table.take(row, axis=1)  # (A, L)
    # float32 sums are exact (and so equal to float64 sums rounded once) for whole numbers below 2**24
    exact32 = (table.dtype == np.float32 and max(placed.absmax, text_max) + start_max < 2**24
               and bool((starts == np.rint(starts)).all()))
    if not exact32:
        pos = pos.astype(np.float64)
    starts = starts.astype(pos.dtype, copy=False)
    pos += np.repeat(starts.T, lengths, axis=1)
    out = torch.from_numpy(pos if exact32 else pos.astype(np.float32))

    # delta: the largest coordinate (each segment's start plus its largest offset), as float32, + 1 - tokens
    best = np.array(tops).max(axis=0).astype(np.float32).astype(np.float64)
    if not per_axis_deltas:
        best = (best if d.delta_axes is None else best[list(d.delta_axes)]).max(keepdims=True)
    delta = (best + 1.0 - float(num_tokens)).astype(np.float32)
    if int64 and exact32:
        return out.to(torch.int64), torch.from_numpy(delta.astype(np.int64)), True
    return out, torch.from_numpy(delta), exact32


def _place_uniform(num_tokens, texts, blocks, which, first, step, top, gap, placed, text_max, d, options,
                   per_axis_deltas, int64=False):
    """:func:`_place` when every axis of every segment starts at the same place (no absolute axes, one
    advance and one gap for all axes): one float per segment, the per-token work in five numpy calls."""
    axes = len(top[0]) if top else placed.table.shape[0]
    diag = placed.diag
    nb = len(blocks)
    lens, offs, starts, vis = [], [], [], []  # per segment: tokens, table row - first token, start
    at, shift, best_text = 0.0, 0, -math.inf
    for k in range(nb + 1):
        n = texts[k]
        if n:
            lens.append(n)
            offs.append(diag - shift)
            starts.append(at)
            shift += n
            if at + (n - 1) > best_text:
                best_text = at + (n - 1)
            at += n
        if k == nb:
            break
        if gap is not None and k:
            at += gap
        b = which[k]
        _, t, h, w, _ = blocks[k]
        n = t * h * w
        lens.append(n)
        offs.append(first[b] - shift)
        starts.append(at)
        vis.append((at, b))
        shift += n
        at += step[b]
    start_max = max(map(abs, starts))
    if any(x != x for x in starts):  # NaN (which max() would pass over) is refused next
        start_max = math.nan
    _index._check_finite(placed.absmax + max(text_max, 0) + start_max, d.block_rule, options)

    lengths = np.array(lens, dtype=np.int64)
    row = np.repeat(np.array(offs, dtype=np.int64), lengths)
    row += np.arange(num_tokens, dtype=np.int64)
    table = placed.table
    pos = table.take(row, axis=1)  # (A, L)
    # float32 sums are exact (and so equal to float64 sums rounded once) for whole numbers below 2**24
    whole = (table.dtype == np.float32 and max(placed.absmax, text_max) + start_max < 2**24
             and all(x.is_integer() for x in starts))
    if whole and int64:  # (a float32 table holds whole numbers only: see block_cache) summed into int64 at once
        pos = np.add(pos, np.repeat(np.array(starts, dtype=np.float32), lengths), out=np.empty(pos.shape, np.int64),
                     casting="unsafe")
    elif whole:
        pos += np.repeat(np.array(starts, dtype=np.float32), lengths)
    else:
        pos = pos.astype(np.float64)
        pos += np.repeat(np.array(starts, dtype=np.float64), lengths)
        pos = pos.astype(np.float32)

    # delta: the largest coordinate (each segment's start plus its largest offset), as float32, + 1 - tokens
    best = [best_text] * axes
    for at, b in vis:
        for a, o in enumerate(top[b]):
            if at + o > best[a]:
                best[a] = at + o
    best = [float(np.float32(x)) for x in best]
    if not per_axis_deltas:
        best = [max(best) if d.delta_axes is None else max(best[a] for a in d.delta_axes)]
    delta = np.array([x + 1.0 - num_tokens for x in best], dtype=np.float32)
    return torch.from_numpy(pos), torch.from_numpy(delta.astype(np.int64) if whole and int64 else delta), whole
