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

import torch

from . import layout as _layout
from .designs import positions
from .designs.registry import check_options, describe_options, get_design, num_axes as design_axes, unpack_placed
from .layout import _FLOAT32_MAX, IMAGE, TEXT, VIDEO, Image, Layout, Text, Video

__all__ = ["rope_index", "decode_positions", "MAX_BATCH_COORDINATES"]

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
        _check_intervals(out, None, tokens_per_second)
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
    # same arithmetic (and dtype) as transformers: number times the tensor element
    out = [float(tokens_per_second * s[v]) for v in range(num_videos)]
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


def _assign(run_len: torch.Tensor, grids: Optional[torch.Tensor], name: str, kind: str) -> torch.Tensor:
    """Split the runs of one modality into whole grids (in order); returns the run index of each grid."""
    if run_len.numel() == 0:
        if grids is not None and grids.shape[0]:
            raise ValueError(
                f"rope_index: `{name}` describes {grids.shape[0]} {kind}(s) but `mm_token_type_ids` "
                f"holds no {kind} tokens (after the attention mask)"
            )
        return torch.zeros(0, dtype=torch.int64)
    if grids is None or grids.shape[0] == 0:
        raise ValueError(f"rope_index: `mm_token_type_ids` holds {kind} tokens but `{name}` is missing; pass the grids")
    tokens = grids.prod(dim=1)
    cum_g, cum_r = tokens.cumsum(0), run_len.cumsum(0)
    if int(cum_g[-1]) != int(cum_r[-1]):
        raise ValueError(
            f"rope_index: `{name}` describes {int(cum_g[-1])} {kind} tokens (t·h·w / merge² per grid: "
            f"{tokens.tolist()}) but `mm_token_type_ids` holds {int(cum_r[-1])}; the grids must match the tokens"
        )
    if not torch.isin(cum_r, cum_g).all():
        raise ValueError(
            f"rope_index: the runs of {kind} tokens in `mm_token_type_ids` (lengths {run_len.tolist()}) do not split "
            f"into whole {kind}s of `{name}` (tokens per {kind}: {tokens.tolist()})"
        )
    return torch.searchsorted(cum_r, cum_g)


def _grids_of_runs(owner: torch.Tensor, num_runs: int) -> list[list[int]]:
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
    low, high = torch.aminmax(types) if types.numel() else (torch.tensor(TEXT), torch.tensor(VIDEO))
    if low < TEXT or high > VIDEO:
        raise ValueError(
            f"rope_index: `mm_token_type_ids` values must be 0 (text), 1 (image) or 2 (video), "
            f"got {sorted(set(types.unique().tolist()))}"
        )
    if attention_mask is None:
        valid = torch.ones(shape, dtype=torch.bool)
    else:
        mask = _check_2d(attention_mask, "attention_mask", shape).cpu()
        if mask.dtype == torch.bool:
            bad = False
        elif mask.is_floating_point() or not mask.numel():
            bad = bool(((mask != 0) & (mask != 1)).any())
        else:  # integers: one pass
            low, high = torch.aminmax(mask)
            bad = bool(low < 0 or high > 1)
        if bad:
            raise ValueError("rope_index: `attention_mask` must hold only 0 (padding) and 1 (token)")
        valid = mask.bool().contiguous()
    if not isinstance(per_axis_deltas, bool):
        raise TypeError(f"rope_index: `per_axis_deltas` must be True or False, got {per_axis_deltas!r}")
    images = _token_grids(image_grid_thw, "image_grid_thw", spatial_merge_size, types.numel())
    videos = _token_grids(video_grid_thw, "video_grid_thw", spatial_merge_size, types.numel())
    intervals = _intervals(0 if videos is None else videos.shape[0], second_per_grid_ts, tokens_per_second)
    videos, intervals = _split_frames(types, valid, videos, intervals, split_video_frames)
    _check_dtype(dtype)

    d = get_design(design)
    rule = d.block_rule
    check_options(d, design_options)
    axes = design_axes(d, Layout([Text(1)]), design_options)  # images and videos are 2-D in every design
    if axes is not None:
        _check_coordinates(axes, shape[0], shape[1], f"rope_index: design {d.name!r}")
    if rule is not None and types.numel():
        pos, delta = _index_by_rule(types, valid, images, videos, intervals, rule, design_options, per_axis_deltas)
    else:
        pos, delta = _index_per_layout(types, valid, images, videos, intervals, design, design_options, per_axis_deltas)
    axes = get_design(design).delta_axes
    if axes is not None and not per_axis_deltas:  # text continues after the max of these axes only
        top = pos[list(axes)].masked_fill(~valid, -torch.inf).amax(dim=(0, 2)).double()
        n_valid = valid.sum(dim=1).double()
        delta = torch.where(n_valid > 0, top + 1.0 - n_valid, 0.0).to(torch.float32)[:, None]
    if dtype == torch.int64:
        pos, delta = _as_int64(pos, delta, d, design_options)
    return pos.to(device), delta.to(device)


def _split_frames(types: torch.Tensor, valid: torch.Tensor, videos: Optional[torch.Tensor], intervals: list[float],
                  split: Optional[bool]) -> tuple[Optional[torch.Tensor], list[float]]:
    """Video grids ``[t, h, w]`` split into ``t`` frames ``[1, h, w]`` (intervals repeated) where ``split`` says:
    always (True), never (False), or (None) for the videos whose token runs break inside them."""
    if split is not None and not isinstance(split, bool):
        raise TypeError(f"rope_index: `split_video_frames` must be True, False or None (auto), got {split!r}")
    if videos is None or split is False or not bool((videos[:, 0] > 1).any()):
        return videos, intervals
    cut = videos[:, 0] > 1
    if split is None:  # a run of video tokens ends strictly inside the video: its frames are separate blocks
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


def _as_int64(pos: torch.Tensor, delta: torch.Tensor, design, design_options: dict):
    """Positions and deltas as int64, refused unless the design (on any input) and this batch are whole numbers."""
    probe = positions(_PROBE, design.name, **design_options)
    if not _whole(probe):
        frac = probe[probe != probe.round()][0].item()
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
    img_of_run = iter(_grids_of_runs(_assign(run_len[is_img], images, "image_grid_thw", "image"), int(is_img.sum())))
    vid_of_run = iter(_grids_of_runs(_assign(run_len[is_vid], videos, "video_grid_thw", "video"), int(is_vid.sum())))

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
        num_axes = positions("T1", design, **design_options).shape[1]

    out = torch.zeros(batch, shape[1], num_axes, dtype=torch.float32)
    if placed:
        out[valid] = torch.cat(placed)
    width = num_axes if per_axis_deltas else 1
    zero = torch.zeros(width, dtype=torch.float64)
    delta = torch.stack([zero if d is None else d for d in deltas]) if deltas else torch.zeros(0, width)
    delta = delta.to(torch.float32)
    return out.permute(2, 0, 1).contiguous(), delta


_PAD = -1  # kind of a padding run (attention mask 0), next to TEXT/IMAGE/VIDEO


def _runs(types: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run-length encode each row of (B, L) token types, padding being its own kind: flat start, length
    and kind of every run. Works on one-byte codes: the batch can be millions of tokens."""
    batch, length = types.shape
    code = types.to(torch.int8).add_(1).mul_(valid)  # padding 0, text 1, image 2, video 3
    change = torch.empty(batch, length, dtype=torch.bool)
    change[:, 0] = True
    torch.ne(code[:, 1:], code[:, :-1], out=change[:, 1:])
    start = change.reshape(-1).nonzero().squeeze(1)
    run_len = torch.diff(start, append=torch.tensor([batch * length]))
    return start, run_len, code.reshape(-1)[start].to(torch.int64) - 1


def _fill_by_segment(first: torch.Tensor, values: torch.Tensor, total: int) -> torch.Tensor:
    """``values[s] + (k - first[s])`` for token k of segment s (segments cover ``0 … total-1`` in order), int32.

    One cumulative sum of ones with a jump at each segment start: no per-token temporaries.
    """
    out = torch.ones(total, dtype=torch.int32)
    prev_end = torch.cat([values.new_zeros(1), values[:-1] + (first[1:] - first[:-1]) - 1])
    out[first] = (values - prev_end).to(torch.int32)
    return out.cumsum_(0)


def _abs_max(x: torch.Tensor) -> float:
    if not x.numel():
        return 0.0
    low, high = torch.aminmax(x)
    return max(-float(low), float(high))


def _whole(x: torch.Tensor) -> bool:
    return torch.equal(x, x.round())


def _exclusive_cumsum(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x.new_zeros(1), x.cumsum(0)[:-1]])


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
    """The distinct vision blocks of the batch as segments and as keys ``(t, h, w, Δt)`` or ``(h, w)``, and
    the index of each grid's block (image grids first, then video grids).

    An image grid with several frames is a unit-interval video (as transformers treats it).
    """
    keys = []
    if images is not None:
        keys += [(t, h, w, 1.0) if t > 1 else (h, w) for t, h, w in images.tolist()]
    if videos is not None:
        keys += [(t, h, w, iv) for (t, h, w), iv in zip(videos.tolist(), intervals)]
    index: dict[tuple, int] = {}
    block_of_grid = torch.tensor([index.setdefault(k, len(index)) for k in keys], dtype=torch.int64)
    blocks = [Video(*k) if len(k) == 4 else Image(*k) for k in index]
    return blocks, list(index), block_of_grid


def _check_finite(offsets: torch.Tensor, start: torch.Tensor, text_max: int, rule, design_options: dict) -> None:
    """Every position is a segment start plus an offset (or a text index): bound both, refuse beyond float32."""
    bound = _abs_max(offsets) + max(text_max, 0) + _abs_max(start)
    if not bound <= _FLOAT32_MAX:
        name = getattr(rule, "__name__", "the design").removesuffix("_blocks")
        raise ValueError(
            f"rope_index: design {name!r}{describe_options(design_options)} gives positions up to {bound:.4g}, "
            f"which are not finite float32 numbers (largest finite: {_FLOAT32_MAX:.4g}); video intervals "
            f"(tokens_per_second × second_per_grid_ts) or design options are too large"
        )


def _index_by_rule(
    types: torch.Tensor,
    valid: torch.Tensor,
    images: Optional[torch.Tensor],
    videos: Optional[torch.Tensor],
    intervals: list[float],
    rule,
    design_options: dict,
    per_axis_deltas: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Translation-structured designs: the whole batch with tensor operations, no loop over blocks or samples.

    Padding runs are segments too (rows of zeros that do not advance the start), so the result is
    produced in place in the padded layout without a scatter. A mask with holes inside a sample is
    first packed to right padding (transformers drops masked tokens before indexing, and so do we).
    """
    batch, length = types.shape
    first_tok, run_len, kind = _runs(types, valid)
    sample = first_tok // length
    inner = (kind[1:-1] == _PAD) & (sample[:-2] == sample[1:-1]) & (sample[2:] == sample[1:-1])
    if inner.any():  # padding between tokens of one sample: index the packed batch, then put it back
        packed_valid, packed_types = _repack(valid, types)
        pos_p, delta = _index_by_rule(packed_types, packed_valid, images, videos, intervals, rule,
                                      design_options, per_axis_deltas)
        pos = pos_p.new_zeros(pos_p.shape[0], batch, length)
        pos[:, valid] = pos_p[:, packed_valid]
        return pos, delta

    # segments: a text or padding run is one, a vision run one per grid it holds (grids in batch order)
    is_img, is_vid = kind == IMAGE, kind == VIDEO
    img_owner = _assign(run_len[is_img], images, "image_grid_thw", "image")
    vid_owner = _assign(run_len[is_vid], videos, "video_grid_thw", "video")
    per_run = torch.ones_like(run_len)
    per_run[is_img] = torch.bincount(img_owner, minlength=int(is_img.sum()))
    per_run[is_vid] = torch.bincount(vid_owner, minlength=int(is_vid.sum()))
    seg_run = torch.repeat_interleave(torch.arange(run_len.numel()), per_run)
    seg_kind, seg_sample, seg_len = kind[seg_run], sample[seg_run], run_len[seg_run]
    seg_text, seg_pad = seg_kind == TEXT, seg_kind == _PAD
    seg_vis = ~(seg_text | seg_pad)
    grid_tokens = [g.prod(dim=1) for g in (images, videos) if g is not None and g.shape[0]]
    blocks, keys, block_of_grid = _distinct_blocks(images, videos, intervals)
    seg_grid = torch.zeros_like(seg_len)  # index into the image grids followed by the video grids
    if grid_tokens:
        n_img = 0 if images is None else images.shape[0]
        seg_grid[seg_kind == IMAGE] = torch.arange(n_img)
        seg_grid[seg_kind == VIDEO] = n_img + torch.arange(int((seg_kind == VIDEO).sum()))
        seg_len[seg_vis] = torch.cat(grid_tokens)[seg_grid[seg_vis]]
    seg_block = torch.zeros_like(seg_len)
    if blocks:
        seg_block[seg_vis] = block_of_grid[seg_grid[seg_vis]]

    # every distinct block placed once by the design's rule
    offsets, advance, absolute, gap = unpack_placed(rule(blocks, **design_options))
    axes = advance.shape[1]
    block_len = torch.tensor([math.prod(k[:3]) for k in keys], dtype=torch.int64)
    if blocks:
        block_top = torch.segment_reduce(offsets, "max", lengths=block_len, axis=0)  # (blocks, A)
    else:
        block_top = offsets.new_zeros(0, axes)

    # start of every segment: exclusive sum of the advances before it in its sample
    step = torch.zeros(seg_len.numel(), axes, dtype=torch.float64)
    step[seg_text] = seg_len[seg_text].to(torch.float64)[:, None]
    step[seg_vis] = advance[seg_block[seg_vis]]
    per_sample = torch.bincount(seg_sample, minlength=batch)
    sample_first = per_sample.cumsum(0) - per_sample
    rank = torch.arange(seg_len.numel()) - sample_first[seg_sample]
    if gap is None:
        steps = torch.zeros(batch, int(per_sample.max()) + 1, axes, dtype=torch.float64)
        steps[seg_sample, rank + 1] = step
        start = steps.cumsum_(dim=1)[seg_sample, rank]  # sequential sums, as the walk does them
    else:  # the gap before a vision segment is its own step, added just before it as the walk does
        vis_before = _exclusive_cumsum(seg_vis.to(torch.int64))
        later = seg_vis & (vis_before > vis_before[sample_first][seg_sample])  # not the first of its sample
        steps = torch.zeros(batch, 2 * int(per_sample.max()) + 1, axes, dtype=torch.float64)
        steps[seg_sample[later], 2 * rank[later] + 1] = gap
        steps[seg_sample, 2 * rank + 2] = step
        start = steps.cumsum_(dim=1)[seg_sample, 2 * rank + 1]
    start[seg_pad] = 0.0
    if absolute is not None:  # absolute axes of vision blocks do not add the start (see designs.registry)
        start[seg_vis] = start[seg_vis] * (~absolute).to(torch.float64)

    # one table of relative coordinates: zeros for padding, the diagonal for text, then every block
    pad_max = int(seg_len[seg_pad].max()) if seg_pad.any() else 0
    text_max = int(seg_len[seg_text].max()) if seg_text.any() else 0
    base = torch.zeros_like(seg_len)
    base[seg_text] = pad_max
    base[seg_vis] = pad_max + text_max + _exclusive_cumsum(block_len)[seg_block[seg_vis]]

    _check_finite(offsets, start, text_max, rule, design_options)

    # float32 arithmetic is exact when every value is an integer below 2**24, which is the usual case
    exact32 = _whole(offsets) and _whole(start) and max(_abs_max(offsets), text_max) + _abs_max(start) < 2**24
    dtype = torch.float32 if exact32 else torch.float64
    ramp = torch.arange(text_max, dtype=dtype)[None].expand(axes, text_max)
    table = torch.cat([torch.zeros(axes, pad_max, dtype=dtype), ramp, offsets.T.to(dtype)], dim=1)  # (A, rows)
    total = batch * length
    seg_first = _exclusive_cumsum(seg_len)
    row = _fill_by_segment(seg_first, base, total)
    tok_seg = torch.zeros(total, dtype=torch.int32)  # segment of every token
    tok_seg[seg_first[1:]] = 1
    tok_seg.cumsum_(0)
    start_t = start.T.to(dtype).contiguous()
    pos = torch.empty(axes, total, dtype=torch.float32)
    rel, tmp = torch.empty(total, dtype=dtype), torch.empty(total, dtype=dtype)
    diagonal = bool((start_t == start_t[:1]).all())  # every axis starts together (all but compact)
    for a in range(axes):  # per axis, so that the token-sized temporaries are reused
        torch.index_select(table[a], 0, row, out=rel)
        if a == 0 or not diagonal:
            torch.index_select(start_t[a], 0, tok_seg, out=tmp)
        torch.add(rel, tmp, out=pos[a])  # summed in `dtype`, rounded to float32 once on the way out
    pos = pos.view(axes, batch, length)

    # deltas: largest coordinate per sample (from each segment's start + its largest offset)
    seg_top = torch.full((seg_len.numel(), axes), -torch.inf, dtype=torch.float64)
    seg_top[seg_text] = start[seg_text] + (seg_len[seg_text] - 1).to(torch.float64)[:, None]
    seg_top[seg_vis] = start[seg_vis] + block_top[seg_block[seg_vis]]
    top = torch.full((batch, axes), -torch.inf, dtype=torch.float64)
    top.scatter_reduce_(0, seg_sample[:, None].expand(-1, axes), seg_top, "amax")
    top = top.to(torch.float32).to(torch.float64)  # the max of the float32 positions
    if not per_axis_deltas:
        top = top.amax(dim=1, keepdim=True)
    n_valid = torch.zeros(batch, dtype=torch.int64).index_add_(0, seg_sample, seg_len * (~seg_pad))[:, None]
    delta = torch.where(n_valid > 0, top + 1.0 - n_valid.to(torch.float64), 0.0).to(torch.float32)
    return pos, delta


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
