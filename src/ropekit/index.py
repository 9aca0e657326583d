"""Batched position ids for Hugging Face-style multimodal inputs, for any ropekit position design.

:func:`rope_index` is a drop-in for the ``get_rope_index`` of transformers' Qwen2-VL / Qwen2.5-VL
models (same arguments, same ``(positions, deltas)`` result), generalised from M-RoPE to every
registered design. Designs with a block rule (see :mod:`ropekit.designs.registry`) are placed for the
whole batch at once with tensor operations: the padded batch is run-length encoded, each distinct
vision block is placed once by the rule, per-sample exclusive sums of the advances give every
segment's start, and one gather writes every token. Other designs fall back to one
:func:`~ropekit.positions` call per distinct sample layout. :func:`decode_positions` continues a
sequence during cached generation.
"""
from __future__ import annotations

import math
import numbers
from typing import Optional, Sequence, Union

import numpy as np
import torch

from . import block_cache as _block_cache
from . import layout as _layout
from .designs import hope as _hope
from .designs import positions
from .designs.registry import check_options, describe_options, design_axes, get_design, num_axes
from .layout import _FLOAT32_MAX, IMAGE, TEXT, VIDEO, Image, Layout, Text, Video

__all__ = ["rope_index", "decode_positions", "hope_index", "MAX_BATCH_COORDINATES"]

GridLike = Union[torch.Tensor, Sequence[Sequence[int]]]

#: Most coordinates (axes × batch × sequence length) one :func:`rope_index` or :func:`decode_positions`
#: call returns: 2**30 float32 values are 4 GiB. Checked before anything that size is allocated; raise it
#: (``ropekit.index.MAX_BATCH_COORDINATES = ...``) on purpose. Each sequence is also bounded by
#: :data:`ropekit.layout.MAX_TOKENS`.
MAX_BATCH_COORDINATES = 2**30


def _check_2d(x: object, name: str, shape: Optional[tuple] = None) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"rope_index: `{name}` must be a torch.Tensor of shape (batch, seq_len), got {type(x).__name__}")
    if x.is_complex():
        raise TypeError(f"rope_index: `{name}` must be a real tensor, got dtype {x.dtype}")
    if x.ndim != 2:
        raise ValueError(f"rope_index: `{name}` must have shape (batch, seq_len), got {tuple(x.shape)}")
    if shape is not None and tuple(x.shape) != shape:
        raise ValueError(
            f"rope_index: `{name}` has shape {tuple(x.shape)} but `mm_token_type_ids` has {shape}; "
            f"give one entry per token of the padded batch"
        )
    if x.is_floating_point() and torch.isnan(x).any():
        raise ValueError(f"rope_index: `{name}` contains NaN")
    return x


def _token_grids(grid: Optional[GridLike], name: str, merge: int, limit: int) -> Optional[torch.Tensor]:
    """Validate a ``(n, 3)`` patch grid and return the token grid ``(t, h/merge, w/merge)`` as int64.

    Checked in Python integers, so no product can wrap around: a grid of more than ``limit`` tokens (the
    whole padded batch) cannot match the token types and is refused with its count.
    """
    if grid is None:
        return None
    if (isinstance(grid, torch.Tensor) and grid.dtype == torch.int64 and grid.ndim == 2 and grid.shape[1] == 3
            and grid.shape[0] and grid.device.type == "cpu" and merge < 2**20):  # the usual case: int64 (n, 3), in numpy
        x = grid.numpy()  # (an int64 tensor has no grad)
        top = x.max(axis=0).tolist()
        if x.min() >= 1 and max(top) < 2**20 and (merge == 1 or not (x[:, 1:] % merge).any()):  # no product wraps
            out = x // np.array([1, merge, merge])
            if (top[0] * (top[1] // merge) * (top[2] // merge) <= limit  # a bound on every grid's tokens
                    or int((out[:, 0] * out[:, 1] * out[:, 2]).max()) <= limit):
                return torch.from_numpy(out)
    try:
        g = torch.as_tensor(grid)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        raise TypeError(f"rope_index: `{name}` must be a tensor or nested list of whole numbers (t, h, w), "
                        f"got {type(grid).__name__}") from None
    if g.dtype == torch.bool or g.is_complex():
        raise TypeError(f"rope_index: `{name}` must hold whole patch counts (t, h, w), got dtype {g.dtype}")
    if g.ndim == 1 and g.numel() == 3:
        g = g[None]
    if g.ndim != 2 or g.shape[1] != 3:
        raise ValueError(f"rope_index: `{name}` must have shape (num_items, 3) holding (t, h, w), got {tuple(g.shape)}")
    if g.is_floating_point():
        if not torch.isfinite(g).all():
            raise ValueError(f"rope_index: `{name}` contains NaN or inf; grids are whole patch counts (t, h, w)")
        if not (g == g.round()).all():
            raise ValueError(f"rope_index: `{name}` must hold whole patch counts, got {g.tolist()}")
    g = g.cpu()
    if not g.shape[0]:
        return torch.zeros(0, 3, dtype=torch.int64)
    # the common case in a few numpy operations; a batch that fails any check is worded by the loop below
    x = g.to(torch.float64).numpy()  # exact up to 2**53; larger values go to the loop
    q = np.floor_divide(x[:, 1:], merge)
    if (x.min() >= 1 and x.max() <= 2**52 and np.array_equal(q * merge, x[:, 1:])
            and bool((x[:, 0] * q[:, 0] * q[:, 1] <= limit).all())):
        return torch.from_numpy(np.column_stack([x[:, 0], q]).astype(np.int64))
    rows = [[int(v) for v in row] for row in g.tolist()]
    tokens = []
    for row in rows:
        if min(row) < 1:
            raise ValueError(f"rope_index: `{name}` entries must be >= 1 (an empty or negative grid has no tokens), "
                             f"got {row}")
        if row[1] % merge or row[2] % merge:
            raise ValueError(
                f"rope_index: `{name}` has a grid {row} whose h or w is not divisible by spatial_merge_size={merge}; "
                f"grids are patch grids before merging"
            )
        tokens.append(row[0] * (row[1] // merge) * (row[2] // merge))
        if tokens[-1] > limit:
            raise ValueError(
                f"rope_index: `{name}` has a grid {row} of {tokens[-1]} tokens (t·h·w / merge²), more than the "
                f"{limit} tokens of the whole batch; the grids must match the tokens"
            )
    return torch.tensor([[t, h // merge, w // merge] for t, h, w in rows], dtype=torch.int64).reshape(-1, 3)


def _number(value: object, name: str) -> None:
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex() and value.dtype != torch.bool:
        return
    if isinstance(value, (bool, str, bytes)) or not isinstance(value, numbers.Real):
        raise TypeError(f"rope_index: `{name}` must be a number, got {type(value).__name__} ({value!r})"[:300])


def _intervals(num_videos: int, second_per_grid_ts, tokens_per_second) -> list[float]:
    """Δt per video: ``tokens_per_second · second_per_grid_ts[v]`` (Qwen2.5-VL) or 1 (Qwen2-VL)."""
    if tokens_per_second is not None:
        _number(tokens_per_second, "tokens_per_second")
        tps = float(tokens_per_second)
        if not math.isfinite(tps) or tps <= 0:
            raise ValueError(f"rope_index: `tokens_per_second` must be a finite number > 0, got {tokens_per_second!r}")
    if second_per_grid_ts is None:
        out = [float(tokens_per_second) if tokens_per_second is not None else 1.0] * num_videos
        _check_intervals(out[:1], None, tokens_per_second)  # one value for every video
        return out
    if tokens_per_second is None:
        raise ValueError(
            "rope_index: `second_per_grid_ts` needs `tokens_per_second` "
            "(Qwen2.5-VL: config.vision_config.tokens_per_second)"
        )
    try:
        s = torch.as_tensor(second_per_grid_ts)
        exact = (s if isinstance(second_per_grid_ts, torch.Tensor) else
                 torch.as_tensor(second_per_grid_ts, dtype=torch.float64)).double().reshape(-1)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        raise TypeError(f"rope_index: `second_per_grid_ts` must be numbers, one per video, "
                        f"got {second_per_grid_ts!r}"[:300]) from None
    if s.dtype == torch.bool or s.is_complex():
        raise TypeError(f"rope_index: `second_per_grid_ts` must be real numbers, got dtype {s.dtype}")
    s = s.reshape(-1)
    if s.numel() != num_videos:
        raise ValueError(
            f"rope_index: `second_per_grid_ts` has {s.numel()} entries but `video_grid_thw` has {num_videos} videos; "
            f"give one per video"
        )
    if not torch.isfinite(exact).all() or (exact < 0).any():
        raise ValueError(f"rope_index: `second_per_grid_ts` must be finite and >= 0, got {exact.tolist()}")
    # same arithmetic (and dtype) as transformers: number times the tensor element (a Python number times
    # the whole tensor promotes as it does with each element; a tensor factor is kept element by element)
    if isinstance(tokens_per_second, torch.Tensor):
        out = [float(tokens_per_second * s[v]) for v in range(num_videos)]
    else:
        out = [float(x) for x in (tokens_per_second * s).tolist()]
    _check_intervals(out, exact.tolist(), tokens_per_second)
    return out


def _check_intervals(intervals: list[float], seconds: Optional[list], tokens_per_second) -> None:
    """Frame intervals must be finite float32 numbers: positions are float32."""
    for v, iv in enumerate(intervals):
        if math.isfinite(iv) and iv <= _FLOAT32_MAX:
            continue
        what = (f"`tokens_per_second` = {tokens_per_second!r}" if seconds is None else
                f"`tokens_per_second` = {tokens_per_second!r} × `second_per_grid_ts[{v}]` = {seconds[v]!r}")
        raise ValueError(
            f"rope_index: video {v}: {what} gives a frame interval beyond the float32 range "
            f"({_FLOAT32_MAX:.4g}), so its positions would not be finite float32 numbers"
        )


def mismatch(kind: str, tokens: int, features: Optional[int] = None) -> str:
    """transformers' words for a count of image (video) tokens that is not the count of features the model has for
    them, which ropekit's refusals of the same inputs begin with (so that code matching the stock message matches);
    ``features`` None where the count the model would have is not known here."""
    counts = f", tokens: {tokens}" + ("" if features is None else f", features: {features}")
    return f"{kind.capitalize()} features and {kind} tokens do not match{counts}"


def _assign(run_len: np.ndarray, grids: Optional[torch.Tensor], name: str, kind: str) -> np.ndarray:
    """Split the runs of one modality into whole grids (in order); returns the run index of each grid."""
    g = None if grids is None else grids.numpy()
    tokens = None if g is None else g[:, 0] * g[:, 1] * g[:, 2]
    if run_len.shape[0] == 0:
        if grids is not None and grids.shape[0]:
            raise ValueError(
                f"{mismatch(kind, 0, int(tokens.sum()))}: rope_index: `{name}` describes {grids.shape[0]} {kind}(s) "
                f"but `mm_token_type_ids` holds no {kind} tokens (after the attention mask)"
            )
        return np.zeros(0, dtype=np.int64)
    if grids is None or grids.shape[0] == 0:
        raise ValueError(f"{mismatch(kind, int(run_len.sum()), 0)}: rope_index: `mm_token_type_ids` holds {kind} "
                         f"tokens but `{name}` is missing; pass the grids")
    cum_g, cum_r = np.cumsum(tokens), np.cumsum(run_len)
    if cum_g.shape[0] == cum_r.shape[0] and np.array_equal(cum_g, cum_r):  # one grid per run, the usual case
        return np.arange(cum_g.shape[0])
    if int(cum_g[-1]) != int(cum_r[-1]):
        raise ValueError(
            f"{mismatch(kind, int(cum_r[-1]), int(cum_g[-1]))}: rope_index: `{name}` describes {int(cum_g[-1])} "
            f"{kind} tokens (t·h·w / merge² per grid: {tokens.tolist()}) but `mm_token_type_ids` holds "
            f"{int(cum_r[-1])}; the grids must match the tokens"
        )
    # every run must end where a grid ends (cum_g is strictly increasing and ends where cum_r does)
    if not np.array_equal(cum_g[np.searchsorted(cum_g, cum_r)], cum_r):
        raise ValueError(
            f"rope_index: the runs of {kind} tokens in `mm_token_type_ids` (lengths {run_len.tolist()}) do not split "
            f"into whole {kind}s of `{name}` (tokens per {kind}: {tokens.tolist()})"
        )
    return np.searchsorted(cum_r, cum_g)


def _grids_of_runs(owner: np.ndarray, num_runs: int) -> list[list[int]]:
    """Grid indices of each run, from the run index of each grid."""
    out: list[list[int]] = [[] for _ in range(num_runs)]
    for k, r in enumerate(owner.tolist()):
        out[r].append(k)
    return out


def rope_index(
    input_ids: Optional[torch.Tensor],
    mm_token_type_ids: torch.Tensor,
    image_grid_thw: Optional[GridLike] = None,
    video_grid_thw: Optional[GridLike] = None,
    attention_mask: Optional[torch.Tensor] = None,
    *,
    design: str = "mrope",
    spatial_merge_size: int = 2,
    second_per_grid_ts: Optional[Union[torch.Tensor, Sequence[float]]] = None,
    tokens_per_second: Optional[float] = None,
    per_axis_deltas: bool = False,
    split_video_frames: Optional[bool] = None,
    dtype: torch.dtype = torch.float32,
    **design_options,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions ``(A, B, L)`` float32 and deltas of a padded multimodal batch under ``design``.

    Arguments follow transformers' Qwen2-VL ``get_rope_index``: ``mm_token_type_ids`` marks text 0,
    image 1, video 2; ``image_grid_thw``/``video_grid_thw`` are patch grids ``(t, h, w)``, one row per
    image/video in batch order, whose h and w are divided by ``spatial_merge_size``; videos get the
    temporal interval ``tokens_per_second · second_per_grid_ts[v]`` (Qwen2.5-VL) or 1. Left or right
    padding is given by ``attention_mask``; padded positions are 0 (as transformers 5.x). Consecutive
    images with no text between them are split by their grids.

    ``deltas`` is ``max position + 1 − number of valid tokens`` per sample, shape ``(B, 1)``
    (transformers' ``rope_deltas``), so decoding continues at ``cache_length + delta``. Designs whose
    text leaves the diagonal (``compact``) need ``per_axis_deltas=True``: deltas ``(B, A)`` from each
    axis' own max, which makes cached decoding match a full pass exactly.

    Qwen3-VL gives one grid ``[t, h, w]`` per video while its text holds ``t`` frame blocks, each after
    its own timestamp text. ``split_video_frames=None`` (default) splits a video grid with ``t > 1`` into
    ``t`` grids ``[1, h, w]`` when the runs of video tokens show frame boundaries inside it; ``True``
    always splits (as Qwen3-VL's ``get_rope_index``), ``False`` never (grids must match the runs).
    A split frame keeps its video's interval.

    ``dtype=torch.int64`` returns positions and deltas as int64, as transformers does, for designs that
    place every token at a whole number; designs with fractional positions (``circle``, ``v2pe``), and
    batches whose video intervals or design options give fractional positions, are refused.
    """
    types = _check_2d(mm_token_type_ids, "mm_token_type_ids")
    if types.is_floating_point() or types.dtype == torch.bool:
        raise TypeError("rope_index: `mm_token_type_ids` must be an integer tensor (text 0, image 1, video 2)")
    shape = tuple(types.shape)
    _layout.check_token_count(shape[1], "rope_index: `mm_token_type_ids` sequence length")
    device = input_ids.device if isinstance(input_ids, torch.Tensor) else types.device
    if input_ids is not None:
        _check_2d(input_ids, "input_ids", shape)
    if isinstance(spatial_merge_size, bool) or not isinstance(spatial_merge_size, int) or spatial_merge_size < 1:
        raise ValueError(f"rope_index: `spatial_merge_size` must be an int >= 1, got {spatial_merge_size!r}")
    types = types.to("cpu", torch.int64).contiguous()  # any strides in, one layout for the run encoding
    mask = None if attention_mask is None else _check_2d(attention_mask, "attention_mask", shape).cpu()
    # the runs (one run-length encoding for everything below) also check every token type and mask value
    runs, mask = _runs(types, mask) if types.numel() else (None, mask)
    if not isinstance(per_axis_deltas, bool):
        raise TypeError(f"rope_index: `per_axis_deltas` must be True or False, got {per_axis_deltas!r}")
    images = _token_grids(image_grid_thw, "image_grid_thw", spatial_merge_size, types.numel())
    videos = _token_grids(video_grid_thw, "video_grid_thw", spatial_merge_size, types.numel())
    intervals = _intervals(0 if videos is None else videos.shape[0], second_per_grid_ts, tokens_per_second)
    videos, intervals = _split_frames(types, mask, videos, intervals, split_video_frames, runs)
    _check_dtype(dtype)

    d = get_design(design)
    rule = d.block_rule
    check_options(d, design_options)
    axes = num_axes(d, _ONE_TEXT, design_options)  # images and videos are 2-D in every design
    if axes is not None:
        _check_coordinates(axes, shape[0], shape[1], f"rope_index: design {d.name!r}")
    if rule is not None and types.numel():
        pos, delta = _index_by_rule(types, mask, images, videos, intervals, rule, design_options, per_axis_deltas,
                                    d.delta_axes, runs)
    else:
        valid = _valid(mask, shape)
        pos, delta = _index_per_layout(types, valid, images, videos, intervals, design, design_options, per_axis_deltas)
    axes = d.delta_axes
    if rule is None and axes is not None and not per_axis_deltas:  # text continues after the max of these axes only
        top = pos[list(axes)].masked_fill(~valid, -torch.inf).amax(dim=(0, 2)).double()
        n_valid = valid.sum(dim=1).double()
        delta = torch.where(n_valid > 0, top + 1.0 - n_valid, 0.0).to(torch.float32)[:, None]
    if dtype == torch.int64:
        pos, delta = _as_int64(pos, delta, d, design_options)
    return pos.to(device), delta.to(device)


def _split_frames(types: torch.Tensor, mask: Optional[torch.Tensor], videos: Optional[torch.Tensor], intervals: list[float],
                  split: Optional[bool], runs: Optional[tuple] = None) -> tuple[Optional[torch.Tensor], list[float]]:
    """Video grids ``[t, h, w]`` split into ``t`` frames ``[1, h, w]`` (intervals repeated) where ``split`` says:
    always (True), never (False), or (None) for the videos whose token runs break inside them.

    ``runs`` (:func:`_runs` of the batch) settles the usual case at once: when every run of video tokens
    ends where a video ends, nothing is split and no token is looked at again."""
    if split is not None and not isinstance(split, bool):
        raise TypeError(f"rope_index: `split_video_frames` must be True, False or None (auto), got {split!r}")
    if videos is None or split is False or not (videos.numpy()[:, 0] > 1).any():
        return videos, intervals
    if split is None and runs is not None:
        run_len, kind = runs[1], runs[2]
        g = videos.numpy()
        run_end, end = np.cumsum(run_len[kind == VIDEO]), np.cumsum(g[:, 0] * g[:, 1] * g[:, 2])
        if run_end.shape[0] == end.shape[0] and np.array_equal(run_end, end):  # one run per video
            return videos, intervals
        # runs here also break at masked tokens, so they end at least wherever the runs of valid tokens end
        if run_end.shape[0] and run_end[-1] == end[-1] and np.array_equal(end[np.searchsorted(end, run_end)], run_end):
            return videos, intervals
    cut = videos[:, 0] > 1
    if split is None:  # a run of video tokens ends strictly inside the video: its frames are separate blocks
        valid = _valid(mask, tuple(types.shape))
        sample = torch.arange(types.shape[0]).repeat_interleave(valid.sum(dim=1))
        keys, run_len = torch.unique_consecutive(sample * 3 + types[valid], return_counts=True)
        run_end = run_len[keys % 3 == VIDEO].cumsum(0)
        end = videos.prod(dim=1).cumsum(0)
        start = end - videos.prod(dim=1)
        inside = torch.searchsorted(run_end, end, right=False) - torch.searchsorted(run_end, start, right=True)
        cut &= inside > 0
    frames = torch.where(cut, videos[:, 0], 1)
    out = videos.repeat_interleave(frames, dim=0)
    out[:, 0] = torch.where(cut, 1, videos[:, 0]).repeat_interleave(frames)
    return out, [x for x, n in zip(intervals, frames.tolist()) for _ in range(n)]


def _check_dtype(dtype: object) -> None:
    if dtype not in (torch.float32, torch.int64):
        raise TypeError(f"rope_index: `dtype` must be torch.float32 (default) or torch.int64 (whole-number "
                        f"positions, as transformers returns), got {dtype!r}")


_PROBE = "T2 I3x4 T1 V3x2x5 T2"  # images, a video and text: shows whether a design places tokens off the integers


#: design function and options (see block_cache) -> None when they place the probe at whole numbers, else one
#: fractional position: what :func:`_as_int64` found before, so that it places the probe once per design
_PROBED: dict = {}


def _probe_fraction(design, design_options: dict) -> Optional[float]:
    key = _block_cache._key(design.fn, design_options)
    if key is not None and key in _PROBED:
        return _PROBED[key]
    probe = positions(_PROBE, design.name, **design_options)
    frac = None if _whole(probe) else probe[probe != probe.round()][0].item()
    if key is not None:
        if len(_PROBED) >= 256:
            _PROBED.clear()
        _PROBED[key] = frac
    return frac


def _as_int64(pos: torch.Tensor, delta: torch.Tensor, design, design_options: dict):
    """Positions and deltas as int64, refused unless the design (on any input) and this batch are whole numbers."""
    frac = _probe_fraction(design, design_options)
    if frac is not None:
        raise ValueError(
            f"rope_index: `dtype`=torch.int64 needs whole-number positions, but design {design.name!r}"
            f"{describe_options(design_options)} places tokens at fractional positions (e.g. {frac:g} for "
            f"'{_PROBE}'); use the default dtype=torch.float32"
        )
    if not (_whole(pos) and _whole(delta)):  # a safety net: the probe above shows every registered design
        raise ValueError(f"rope_index: `dtype`=torch.int64 needs whole-number positions, but design {design.name!r} "
                         f"gives fractional ones on this batch; use the default dtype=torch.float32")
    return pos.to(torch.int64), delta.to(torch.int64)


def _check_coordinates(axes: int, batch: int, length: int, what: str) -> None:
    if axes * batch * length > MAX_BATCH_COORDINATES:
        raise ValueError(
            f"{what} would return {axes} axes × {batch} × {length} = {axes * batch * length} coordinates, more than "
            f"the limit of {MAX_BATCH_COORDINATES} (ropekit.index.MAX_BATCH_COORDINATES); split the batch "
            f"or raise the limit knowingly"
        )


def _index_per_layout(
    types: torch.Tensor,
    valid: torch.Tensor,
    images: Optional[torch.Tensor],
    videos: Optional[torch.Tensor],
    intervals: list[float],
    design: str,
    design_options: dict,
    per_axis_deltas: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Any design: one :func:`positions` call per distinct sample layout, scattered into the batch."""
    shape = tuple(types.shape)
    # run-length encode (sample, token type) over the valid tokens, sample-major
    batch = shape[0]
    counts = valid.sum(dim=1)
    sample = torch.arange(batch).repeat_interleave(counts)
    keys, run_len = torch.unique_consecutive(sample * 3 + types[valid], return_counts=True)
    run_sample, run_type = (keys // 3).tolist(), (keys % 3).tolist()
    is_img, is_vid = (keys % 3) == IMAGE, (keys % 3) == VIDEO
    lengths = run_len.numpy()
    img_of_run = iter(_grids_of_runs(_assign(lengths[is_img.numpy()], images, "image_grid_thw", "image"),
                                     int(is_img.sum())))
    vid_of_run = iter(_grids_of_runs(_assign(lengths[is_vid.numpy()], videos, "video_grid_thw", "video"),
                                     int(is_vid.sum())))

    segments: list[list] = [[] for _ in range(batch)]
    for b, kind, n in zip(run_sample, run_type, run_len.tolist()):
        if kind == TEXT:
            segments[b].append(Text(n))
        elif kind == IMAGE:
            for k in next(img_of_run):
                t, h, w = images[k].tolist()
                segments[b].append(Image(h, w) if t == 1 else Video(t, h, w, 1.0))
        else:
            for k in next(vid_of_run):
                t, h, w = videos[k].tolist()
                segments[b].append(Video(t, h, w, intervals[k]))

    cache: dict[Layout, tuple[torch.Tensor, torch.Tensor]] = {}
    placed, deltas, num_axes = [], [], None
    for b in range(batch):
        if not segments[b]:
            deltas.append(None)
            continue
        lay = Layout(segments[b])
        if lay not in cache:
            pos = positions(lay, design, **design_options)
            top = pos.double().amax(dim=0) if per_axis_deltas else pos.double().max().reshape(1)
            cache[lay] = (pos, top + 1.0)
        pos, nxt = cache[lay]
        num_axes = pos.shape[1] if num_axes is None else num_axes
        placed.append(pos)
        deltas.append(nxt - lay.num_tokens)
    if num_axes is None:  # nothing valid anywhere: ask the design for its number of axes
        num_axes = design_axes(design, **design_options)

    out = torch.zeros(batch, shape[1], num_axes, dtype=torch.float32)
    if placed:
        out[valid] = torch.cat(placed)
    width = num_axes if per_axis_deltas else 1
    zero = torch.zeros(width, dtype=torch.float64)
    delta = torch.stack([zero if d is None else d for d in deltas]) if deltas else torch.zeros(0, width)
    delta = delta.to(torch.float32)
    return out.permute(2, 0, 1).contiguous(), delta


_ONE_TEXT = Layout([Text(1)])
_PAD = -1  # kind of a padding run (attention mask 0), next to TEXT/IMAGE/VIDEO


def _runs(types: torch.Tensor, mask: Optional[torch.Tensor]) -> tuple[tuple[np.ndarray, ...], Optional[torch.Tensor]]:
    """Run-length encode each row of (B, L) int64 token types, padding being its own kind (``_PAD``): flat
    start, length and kind of every run (numpy int64), and the mask as it may be read again (a float mask
    as bool).

    The runs break wherever the type or the mask value changes, so each run holds one value of each and
    its first token checks them for all its tokens: the token types and the mask are validated here, with
    no pass of their own. In numpy, whose element-wise passes and ``flatnonzero`` cost a third of torch's
    at these sizes.
    """
    batch, length = types.shape
    t = types.numpy()
    change = np.empty((batch, length), dtype=bool)
    change[:, 0] = True
    np.not_equal(t[:, 1:], t[:, :-1], out=change[:, 1:])
    bad_mask = False
    if mask is not None:
        if mask.is_floating_point():  # (bfloat16 has no numpy form)
            bad_mask = bool(((mask != 0) & (mask != 1)).any())
            mask = mask.bool()
        m = mask.contiguous().numpy()
        change[:, 1:] |= np.not_equal(m[:, 1:], m[:, :-1])
    start = np.flatnonzero(change)
    run_len = np.empty_like(start)
    np.subtract(start[1:], start[:-1], out=run_len[:-1])
    run_len[-1] = batch * length - start[-1]
    kind = t.reshape(-1)[start]
    if int(kind.view(np.uint64).max()) > VIDEO:  # read as unsigned, a negative value is larger than any valid one
        raise ValueError(
            f"rope_index: `mm_token_type_ids` values must be 0 (text), 1 (image) or 2 (video), "
            f"got {sorted(set(kind.tolist()))}; give audio tokens as text (0): every design places audio as a text "
            f"run (Layout.token_types' audio code 4 is not a Hugging Face token type). A video with its audio "
            f"interleaved (use_audio_in_video) cannot be given as token types: place its layout (a VideoAudio "
            f"segment) with ropekit.positions(layout, 'tmrope')"
        )
    if mask is not None:
        value = m.reshape(-1)[start]
        if bad_mask or (m.dtype != np.bool_ and int(value.view(np.dtype(f"u{m.itemsize}")).max()) > 1):
            raise ValueError("rope_index: `attention_mask` must hold only 0 (padding) and 1 (token)")
        pad = value == 0
        kind[pad] = _PAD
        # masked tokens of different types are runs of their own: one padding run where they meet
        if np.count_nonzero(pad[1:] & pad[:-1]):
            merge = pad[1:] & pad[:-1] & (start[1:] % length != 0)
            keep = np.ones(kind.shape[0], dtype=bool)
            keep[1:] = ~merge
            start, kind = start[keep], kind[keep]
            run_len = np.diff(start, append=batch * length)
    return (start, run_len, kind), mask


def _valid(mask: Optional[torch.Tensor], shape: tuple) -> torch.Tensor:
    """The (B, L) bool mask of valid tokens from a mask checked by :func:`_runs` (or None: all valid)."""
    if mask is None:
        return torch.ones(shape, dtype=torch.bool)
    if mask.dtype == torch.bool or mask.is_floating_point():
        return mask.bool().contiguous()
    return torch.from_numpy(mask.contiguous().numpy() != 0)


def _abs_max(x: torch.Tensor) -> float:
    if not x.numel():
        return 0.0
    low, high = torch.aminmax(x)
    return max(-float(low), float(high))


def _whole(x: torch.Tensor) -> bool:
    return torch.equal(x, x.round())


def _exclusive_cumsum(x: np.ndarray) -> np.ndarray:
    out = np.zeros_like(x)
    np.cumsum(x[:-1], out=out[1:])
    return out


def _repack(valid: torch.Tensor, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Move each row's valid entries to its front (right padding); returns the new mask and the moved tensors."""
    counts = valid.sum(dim=1)
    width = max(int(counts.max()), 1)
    packed_valid = torch.arange(width)[None] < counts[:, None]
    out = [packed_valid]
    for t in tensors:
        p = t.new_zeros(valid.shape[0], width)
        p[packed_valid] = t[valid]
        out.append(p)
    return tuple(out)


def _distinct_blocks(images: Optional[torch.Tensor], videos: Optional[torch.Tensor], intervals: list[float]):
    """The distinct vision blocks of the batch, and the index of each grid's block (image grids first, then
    video grids), int64.

    Blocks come as ``(keys, levels)``: sorted packed keys and the distinct intervals (see
    :data:`ropekit.block_cache.LEVEL_SHIFT`), or, when a size or the number of intervals does not fit a
    key, as ``(None, columns)`` with numpy columns ``(is video, t, h, w, Δt)``. A block is ``(t, h, w, Δt)``,
    or an image ``(h, w)``; an image grid with several frames is a unit-interval video (as transformers
    treats it). No segment object is built.
    """
    grids = [g.numpy() for g in (images, videos) if g is not None and g.shape[0]]
    if not grids:
        return (np.zeros(0, dtype=np.int64), np.zeros(0)), np.zeros(0, dtype=np.int64)
    thw = np.concatenate(grids) if len(grids) > 1 else grids[0]
    n_img = 0 if images is None else images.shape[0]
    is_video = np.ones(thw.shape[0], dtype=np.int64)
    is_video[:n_img] = thw[:n_img, 0] > 1
    interval = np.empty(thw.shape[0])
    interval[:n_img] = is_video[:n_img]  # an image: Δt 0; an image grid with frames: a video of Δt 1
    interval[n_img:] = intervals
    # the distinct intervals, sorted (as np.unique gives them, at a fraction of its cost on a few values)
    levels = set(intervals)
    if n_img:
        framed = int(np.count_nonzero(is_video[:n_img]))
        levels.update(([0.0] if framed < n_img else []) + ([1.0] if framed else []))
    levels = np.array(sorted(levels), dtype=np.float64)
    t, h, w = thw.T
    if (t.max() < _block_cache.MAX_T and max(h.max(), w.max()) < _block_cache.MAX_HW
            and levels.shape[0] <= _block_cache.MAX_LEVELS):  # one int64 key per block
        level = np.searchsorted(levels, interval)
        key = (level << _block_cache.LEVEL_SHIFT) | (is_video << 46) | (t << 32) | (h << 16) | w
        order = np.argsort(key)
        ordered = key[order]
        new = np.empty(ordered.shape[0], dtype=bool)
        new[0] = True
        np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
        block_of_grid = np.empty(ordered.shape[0], dtype=np.int64)
        block_of_grid[order] = np.cumsum(new) - 1
        return (ordered[new], levels), block_of_grid
    keys = np.column_stack([is_video, thw, interval]).astype(np.float64)  # exact: sizes are checked < 2**52
    # distinct rows: sorted (np.unique(axis=0) does the same, several times slower on a few hundred rows)
    order = np.lexsort(keys.T[::-1])
    ordered = keys[order]
    new = np.ones(ordered.shape[0], dtype=bool)
    new[1:] = (ordered[1:] != ordered[:-1]).any(axis=1)
    distinct = ordered[new]
    block_of_grid = np.empty(ordered.shape[0], dtype=np.int64)
    block_of_grid[order] = np.cumsum(new) - 1
    sizes = distinct[:, :4].T.astype(np.int64)
    return (None, (sizes[0], sizes[1], sizes[2], sizes[3], distinct[:, 4].copy())), block_of_grid


def _check_finite(bound: float, rule, design_options: dict) -> None:
    """Every position is a segment start plus an offset (or a text index): refuse a bound beyond float32."""
    if not bound <= _FLOAT32_MAX:
        name = getattr(rule, "__name__", "the design").removesuffix("_blocks")
        raise ValueError(
            f"rope_index: design {name!r}{describe_options(design_options)} gives positions up to {bound:.4g}, "
            f"which are not finite float32 numbers (largest finite: {_FLOAT32_MAX:.4g}); video intervals "
            f"(tokens_per_second × second_per_grid_ts) or design options are too large"
        )


def _index_by_rule(
    types: torch.Tensor,
    mask: Optional[torch.Tensor],
    images: Optional[torch.Tensor],
    videos: Optional[torch.Tensor],
    intervals: list[float],
    rule,
    design_options: dict,
    per_axis_deltas: bool,
    delta_axes: Optional[tuple] = None,
    runs: Optional[tuple] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Translation-structured designs: the whole batch with tensor operations, no loop over blocks or samples.

    Padding runs are segments too (rows of zeros that do not advance the start), so the result is
    produced in place in the padded layout without a scatter. A mask with holes inside a sample is
    first packed to right padding (transformers drops masked tokens before indexing, and so do we).
    Per-segment work (a few hundred to a few thousand segments) is done in numpy, whose calls cost a
    fraction of a torch call; per-token work is a handful of torch operations over the whole batch.
    ``mask`` is the attention mask checked by :func:`_runs` (None: every token valid) and ``runs`` its
    :func:`_runs` of ``types`` when the caller has it.
    """
    batch, length = types.shape
    total = batch * length
    first_tok, run_len, kind = _runs(types, mask)[0] if runs is None else runs
    sample = first_tok // length
    mid = sample[1:-1]
    if ((kind[1:-1] == _PAD) & (sample[:-2] == mid) & (sample[2:] == mid)).any():
        # padding between tokens of one sample: index the packed batch, then put it back
        valid = _valid(mask, (batch, length))
        packed_valid, packed_types = _repack(valid, types)
        pos_p, delta = _index_by_rule(packed_types, packed_valid, images, videos, intervals, rule,
                                      design_options, per_axis_deltas, delta_axes)
        pos = pos_p.new_zeros(pos_p.shape[0], batch, length)
        pos[:, valid] = pos_p[:, packed_valid]
        return pos, delta

    # segments: a text or padding run is one, a vision run one per grid it holds (grids in batch order)
    is_img, is_vid = kind == IMAGE, kind == VIDEO
    img_owner = _assign(run_len[is_img], images, "image_grid_thw", "image")
    vid_owner = _assign(run_len[is_vid], videos, "video_grid_thw", "video")
    n_img, n_vid = img_owner.shape[0], vid_owner.shape[0]
    if n_img + n_vid == int(np.count_nonzero(kind > TEXT)):  # one grid per vision run: the runs are the segments
        seg_kind, seg_sample, seg_len = kind, sample, run_len
    else:
        per_run = np.ones_like(run_len)
        per_run[is_img] = np.bincount(img_owner, minlength=int(is_img.sum()))
        per_run[is_vid] = np.bincount(vid_owner, minlength=int(is_vid.sum()))
        seg_run = np.repeat(np.arange(run_len.shape[0]), per_run)
        seg_kind, seg_sample, seg_len = kind[seg_run], sample[seg_run], run_len[seg_run]
        if n_img:
            seg_len[seg_kind == IMAGE] = images.prod(dim=1).numpy()
        if n_vid:
            seg_len[seg_kind == VIDEO] = videos.prod(dim=1).numpy()
    text_idx, pad_idx = np.flatnonzero(seg_kind == TEXT), np.flatnonzero(seg_kind == _PAD)
    vis_idx = np.flatnonzero(seg_kind > TEXT)
    blocks, block_of_grid = _distinct_blocks(images if n_img else None, videos if n_vid else None, intervals)
    if n_img and n_vid:  # the block of each vision segment, in token order (images and videos interleave)
        vis_block = np.empty(n_img + n_vid, dtype=np.int64)
        is_image = seg_kind[vis_idx] == IMAGE
        vis_block[is_image], vis_block[~is_image] = block_of_grid[:n_img], block_of_grid[n_img:]
    else:
        vis_block = block_of_grid

    # every distinct block placed by the design's rule, once (and kept for later calls: see block_cache),
    # in one table of relative coordinates with zero rows for padding and the diagonal for text
    pad_max = int(seg_len[pad_idx].max()) if pad_idx.shape[0] else 0
    text_max = int(seg_len[text_idx].max()) if text_idx.shape[0] else 0
    if blocks[0] is not None:
        placed = _block_cache.place(rule, design_options, *blocks, pad_max, text_max)
    else:
        placed = _block_cache.place_columns(rule, design_options, *blocks[1], pad_max, text_max)
    advance, absolute, gap = placed.advance, placed.absolute, placed.gap
    axes = advance.shape[1]

    # start of every segment: sum of the advances before it in its sample, in order (as the walk adds them)
    num_seg = seg_len.shape[0]
    step = np.zeros((num_seg, axes))
    step[text_idx] = seg_len[text_idx, None]
    step[vis_idx] = advance[vis_block]
    per_sample = np.bincount(seg_sample, minlength=batch)  # >= 1: every row is at least one run
    sample_first = np.cumsum(per_sample) - per_sample
    rank = np.arange(num_seg) - sample_first[seg_sample]
    width = int(per_sample.max())
    if gap is None:
        steps = np.zeros((batch, width + 1, axes))
        steps[seg_sample, rank + 1] = step
        start = np.cumsum(steps, axis=1, out=steps)[seg_sample, rank]
    else:  # the gap before a vision segment is its own step, added just before it as the walk does
        vis_before = _exclusive_cumsum((seg_kind > TEXT).astype(np.int64))
        later = (seg_kind > TEXT) & (vis_before > vis_before[sample_first][seg_sample])  # not the first of its sample
        steps = np.zeros((batch, 2 * width + 1, axes))
        steps[seg_sample[later], 2 * rank[later] + 1] = gap
        steps[seg_sample, 2 * rank + 2] = step
        start = np.cumsum(steps, axis=1, out=steps)[seg_sample, 2 * rank + 1]
    start[pad_idx] = 0.0
    if absolute is not None:  # absolute axes of vision blocks do not add the start (see designs.registry)
        start[vis_idx] *= ~absolute

    # table row of each segment's first token: 0 for padding (zero rows), the diagonal's first for text
    base = np.zeros_like(seg_len)
    base[text_idx] = placed.diag
    base[vis_idx] = placed.first[vis_block]
    off_max = placed.absmax  # NaN stays NaN and is refused below
    start_max = float(np.abs(start).max())
    _check_finite(off_max + max(text_max, 0) + start_max, rule, design_options)

    # float32 arithmetic is exact when every value is an integer below 2**24, which is the usual case (the
    # table is float32 only when all it holds is such)
    table = placed.table
    exact32 = (table.dtype == np.float32 and max(off_max, text_max) + start_max < 2**24
               and bool((start == np.rint(start)).all()))
    np_dtype = np.float32 if exact32 else np.float64
    block_top = placed.top
    # table row of every token: its segment's row base plus its index inside the segment (numpy's repeat
    # is several times faster than torch's here; int32 when every row number fits)
    index = np.int32 if table.shape[1] + total < 2**31 else np.int64
    row = np.repeat((base - _exclusive_cumsum(seg_len)).astype(index), seg_len)
    row += np.arange(total, dtype=index)
    # start of every token, once per distinct column of segment starts (axes that start together share it:
    # all of them in most designs, the absolute ones among themselves)
    columns, column_of_axis = [], []
    for a in range(axes):
        same = [c for c, b in enumerate(columns) if np.array_equal(start[:, a], start[:, b])]
        column_of_axis.append(same[0] if same else len(columns))
        if not same:
            columns.append(a)
    tok_start = np.repeat(start[:, columns].T.astype(np_dtype), seg_len, axis=1)
    table, row, tok_start = torch.from_numpy(table), torch.from_numpy(row), torch.from_numpy(tok_start)
    if exact32:
        pos = torch.index_select(table, 1, row)
        if len(columns) == 1:
            pos += tok_start
        else:
            for a in range(axes):
                pos[a] += tok_start[column_of_axis[a]]
    else:  # summed in float64 and rounded to float32 once, axis by axis so that one temporary is reused
        pos = torch.empty(axes, total, dtype=torch.float32)
        rel = torch.empty(total, dtype=torch.float64)
        for a in range(axes):
            if table.dtype == torch.float64:
                torch.index_select(table[a], 0, row, out=rel)
            else:  # whole numbers below 2**24: exact in float32 and float64 alike
                rel.copy_(torch.index_select(table[a], 0, row))
            rel += tok_start[column_of_axis[a]]
            pos[a] = rel
    pos = pos.view(axes, batch, length)

    # deltas: largest coordinate per sample (from each segment's start + its largest offset), as float32
    seg_top = np.full((num_seg, axes), -np.inf)
    seg_top[text_idx] = start[text_idx] + (seg_len[text_idx] - 1)[:, None]
    seg_top[vis_idx] = start[vis_idx] + block_top[vis_block]
    top = np.maximum.reduceat(seg_top, sample_first, axis=0).astype(np.float32).astype(np.float64)  # max float32
    if not per_axis_deltas:
        top = (top if delta_axes is None else top[:, list(delta_axes)]).max(axis=1, keepdims=True)
    counted = seg_len.copy()
    counted[pad_idx] = 0
    n_valid = np.add.reduceat(counted, sample_first)[:, None].astype(np.float64)
    delta = np.where(n_valid > 0, top + 1.0 - n_valid, 0.0).astype(np.float32)
    return pos, torch.from_numpy(delta)


def decode_positions(
    deltas: torch.Tensor,
    past_length: int,
    num_new: int,
    num_axes: int,
    attention_mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Positions ``(num_axes, B, num_new)`` of the next ``num_new`` tokens during cached decoding.

    Each new token sits at its 1-D cache index plus the sample's delta from :func:`rope_index`, the
    rule of transformers' Qwen2-VL ``compute_3d_position_ids``. Without ``attention_mask`` the index
    is ``past_length + k``; with it (shape ``(B, past_length + num_new)``, needed for left-padded
    batches) it counts the valid tokens before, and padded new tokens get the bare delta.
    """
    if not isinstance(deltas, torch.Tensor):
        raise TypeError(f"decode_positions: `deltas` must be the (B, 1) or (B, A) tensor returned by rope_index, "
                        f"got {type(deltas).__name__}")
    if deltas.ndim != 2:
        raise ValueError("decode_positions: `deltas` must be the (B, 1) or (B, A) tensor returned by rope_index, "
                         f"got shape {tuple(deltas.shape)}")
    if deltas.is_complex() or deltas.dtype == torch.bool or not bool(torch.isfinite(deltas.double()).all()):
        raise ValueError(f"decode_positions: `deltas` must hold finite real numbers, got dtype {deltas.dtype}")
    for name, v in (("past_length", past_length), ("num_new", num_new), ("num_axes", num_axes)):
        if isinstance(v, bool) or not isinstance(v, int) or v < (1 if name != "past_length" else 0):
            raise ValueError(f"decode_positions: `{name}` must be an int >= {0 if name == 'past_length' else 1}, got {v!r}")
    _layout.check_token_count(past_length + num_new, "decode_positions: `past_length` + `num_new`")
    _check_coordinates(num_axes, deltas.shape[0], num_new, "decode_positions")
    if deltas.shape[1] not in (1, num_axes):
        raise ValueError(
            f"decode_positions: `deltas` has {deltas.shape[1]} columns; expected 1 or num_axes={num_axes}"
        )
    if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"decode_positions: `attention_mask` must be a torch.Tensor of shape "
                        f"(B, past_length + num_new), got {type(attention_mask).__name__}")
    d = deltas.to(torch.float32).T[:, :, None]  # (1 or A, B, 1)
    if attention_mask is None:
        idx = torch.arange(past_length, past_length + num_new, device=deltas.device, dtype=torch.float32)
        idx = idx.expand(deltas.shape[0], num_new)
    else:
        want = (deltas.shape[0], past_length + num_new)
        if attention_mask.ndim != 2 or tuple(attention_mask.shape) != want:
            raise ValueError(
                f"decode_positions: `attention_mask` must have shape (B, past_length + num_new) = {want}, "
                f"got {tuple(attention_mask.shape)}"
            )
        keep = attention_mask.to(deltas.device) != 0
        idx = (keep.long().cumsum(-1) - 1).masked_fill(~keep, 0)[:, -num_new:].to(torch.float32)
    return (idx[None] + d).expand(num_axes, -1, -1).contiguous()


def hope_index(*args, scales: Sequence[float] = _hope.TRAIN_SCALES, generator: "torch.Generator | int", **kwargs):
    """:func:`ropekit.rope_index` for HoPE training: one temporal scale per sample of the batch.

    Takes ``rope_index``'s arguments; draws ``B`` scales from ``scales`` with ``generator`` (in sample
    order, the draws ``positions(..., scales=scales, generator=generator)`` would make sample by
    sample) and returns ``(positions, deltas, scales_drawn (B,))``.
    """
    types = kwargs.get("mm_token_type_ids", args[1] if len(args) > 1 else None)
    if not isinstance(types, torch.Tensor) or types.ndim != 2:
        raise ValueError("hope_index: pass rope_index's arguments, with `mm_token_type_ids` of shape (batch, seq_len)")
    generator = _hope.as_generator(generator)
    drawn = [_hope.draw_temporal_scale(scales, generator) for _ in range(types.shape[0])]
    pos = delta = None
    for gamma in sorted(set(drawn)):  # one batched pass per distinct scale (at most len(scales))
        p, d = rope_index(*args, design="hope", temporal_scale=gamma, **kwargs)
        pick = torch.tensor([g == gamma for g in drawn], device=p.device)
        if pos is None:
            pos, delta = p, d
        pos[:, pick], delta[pick] = p[:, pick], d[pick]
    return pos, delta, torch.tensor(drawn, dtype=torch.float64)
