"""TMRoPE (Time-aligned Multimodal RoPE; Qwen2.5-Omni, Qwen3-Omni): M-RoPE whose temporal axis counts absolute
time, ``position_id_per_seconds`` positions per second (25: one per 40 ms audio token).

Read from transformers' ``get_rope_index`` of both families (the behaviour, not the code):

- text runs along the diagonal, one position per token; vision start/end and audio start/end tokens are text;
- **audio** is a 1-D run, one position per audio token on all three axes. The model's time unit *is* the audio
  token: transformers places audio tokens one apart whatever ``position_id_per_seconds`` says, so an audio
  segment's seconds per token does not move its positions (``Design.audio = "text"``);
- an image (or video) block starting at ``s`` puts token (frame f, row i, col j) at ``(s + τ_f, s + i, s + j)``
  with ``τ_f = (f · seconds_per_grid) · position_id_per_seconds``, both products in float32 in that order, then
  truncated (Qwen2.5-Omni, ``temporal_rounding="floor"``) or kept fractional (Qwen3-Omni, ``"exact"``);
- text after a block resumes at the block's largest coordinate + 1 (M-RoPE's ``"max"`` continuation).

A layout's video interval is M-RoPE's Δt in positions per frame step, ``seconds_per_grid ·
position_id_per_seconds`` (as Qwen2.5-VL's), so the design reads ``seconds_per_grid`` back as the float32 nearest
``Δt / position_id_per_seconds``: exactly the processor's float32 seconds when Δt was formed from them in
float64 (:func:`ropekit.rope_index` does so when given ``second_per_grid_ts`` as float64). An image is one frame
(τ = 0).

A video with its audio track interleaved (``use_audio_in_video=True``; a :class:`~ropekit.VideoAudio` segment) is
one block starting at ``s``:

- Qwen2.5-Omni (``order="chunks"``, ``temporal_rounding="floor"``): both start markers at ``s``; from ``s + 1``
  the video as above and the audio one position per token on all axes, in the segment's chunk order; both end
  markers at ``m + 1``, where ``m`` is the largest coordinate of the *last piece appended* (transformers' rule:
  the last audio or video chunk, not the block's maximum), text after at ``m + 2``;
- Qwen3-Omni (``order="time"``, ``temporal_rounding="exact"``): start markers at ``s, s + 1`` (a text run), the
  video and audio from ``s + 2`` merged by time, end markers at ``m + 1, m + 2`` with ``m`` the largest coordinate
  of the last run of one kind, text after at ``m + 3``.

The segment's token order (its ``token_types``) is computed from ``f · Δt`` in float64, as the processors order
the tokens. transformers' ``get_rope_index`` orders the positions it hands out by its own float32 ``τ_f``
instead; the two differ only when a frame time lies within float32 rounding of an audio token's time or a chunk
threshold (e.g. 0.28 s per grid: 7.0000000298 in float64, 7.0 in float32). The design follows
``get_rope_index`` (positions in its order, given to the block's tokens in sequence), so that it equals
transformers everywhere. Qwen3-Omni's merge compares *absolute* float32 positions; where the block's start would
round a frame time onto an audio token's (a fraction within float32 rounding above an integer), the design
refuses the layout with a ValueError rather than guess.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..layout import _FLOAT32_MAX, INTERLEAVINGS, Layout, Segment, VideoAudio
from ._common import gather_rows, positive_number
from .registry import block_rows_np, register, video_blocks, walk

__all__ = ["tmrope", "tmrope_blocks", "frame_times", "ROUNDINGS"]

#: ``temporal_rounding`` → the family whose position code it follows
ROUNDINGS = {"floor": "Qwen2.5-Omni", "exact": "Qwen3-Omni"}


def _check(position_id_per_seconds: float, temporal_rounding: str) -> np.float32:
    if not isinstance(temporal_rounding, str) or temporal_rounding not in ROUNDINGS:
        raise ValueError(f"tmrope: `temporal_rounding` must be 'floor' (Qwen2.5-Omni) or 'exact' (Qwen3-Omni), "
                         f"got {temporal_rounding!r}")
    rate = positive_number(position_id_per_seconds, "position_id_per_seconds", "tmrope")
    if rate > _FLOAT32_MAX or float(np.float32(rate)) != rate:
        raise ValueError(f"tmrope: `position_id_per_seconds` must be a float32 number (the families' configs hold "
                         f"an int, 25), got {position_id_per_seconds!r}")
    return np.float32(rate)


def frame_times(frames: np.ndarray, interval: np.ndarray, rate: np.float32, floor: bool) -> np.ndarray:
    """``τ_f`` of frame indices ``frames`` (int64) whose blocks have Δt ``interval`` (float64), float64 result.

    ``(f · seconds) · rate`` in float32 with ``seconds = float32(Δt / rate)``, truncated with ``floor``."""
    with np.errstate(over="ignore"):  # an overflow becomes inf, refused by positions() as not finite
        seconds = (interval / np.float64(rate)).astype(np.float32)
        time = (frames.astype(np.float32) * seconds) * rate
    return (np.floor(time) if floor else time).astype(np.float64)


#: ``temporal_rounding`` → the ``VideoAudio.order`` of the same family
_ORDER = {"floor": "chunks", "exact": "time"}


def tmrope_blocks(segments: Sequence[Segment], position_id_per_seconds: float = 25,
                  temporal_rounding: str = "floor"):
    """TMRoPE block rule: offsets ``(τ_f, i, j)``; the start advances on all axes by the block's max + 1.
    A ``VideoAudio`` segment is placed as its family does (module doc)."""
    rate = _check(position_id_per_seconds, temporal_rounding)
    if isinstance(segments, (list, tuple)) and any(isinstance(s, VideoAudio) for s in segments):
        parts, group = [], []
        for seg in [*segments, None]:
            if seg is None or isinstance(seg, VideoAudio):
                if group:
                    parts.append(_blocks(group, rate, temporal_rounding))
                    group = []
                if seg is not None:
                    parts.append(_video_audio_block(seg, rate, temporal_rounding))
            else:
                group.append(seg)
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    return _blocks(segments, rate, temporal_rounding)


def _video_audio_block(seg: VideoAudio, rate: np.float32, temporal_rounding: str):
    """Offsets ``(4 + t·h·w + n, 3)`` and advance ``(1, 3)`` (float64) of a video with its audio interleaved."""
    if seg.order != _ORDER[temporal_rounding]:
        raise ValueError(
            f"tmrope: segment {seg} interleaves in order {seg.order!r} ({INTERLEAVINGS[seg.order]}), but "
            f"temporal_rounding={temporal_rounding!r} is {ROUNDINGS[temporal_rounding]}'s; no family mixes them: use "
            f"temporal_rounding={'floor' if seg.order == 'chunks' else 'exact'!r} or order "
            f"{_ORDER[temporal_rounding]!r}")
    floor = temporal_rounding == "floor"
    times = frame_times(np.arange(seg.t), np.full(seg.t, seg.interval), rate, floor)
    # the order of transformers' get_rope_index: from its float32 frame times (module doc)
    is_audio, index, last = seg.interleave(times.tolist())
    m = seg.h * seg.w
    base = 1.0 if seg.order == "chunks" else 2.0
    is_audio, index = is_audio.numpy(), index.numpy()
    frame = np.where(is_audio, 0, index // m)
    video = np.stack([times[frame], (index % m) // seg.w, index % seg.w], axis=1).astype(np.float64)
    content = np.where(is_audio[:, None], index[:, None].astype(np.float64), video) + base
    top = content[last:].max() + 1.0  # transformers: after the largest coordinate of the last piece appended
    marks = [0.0, 0.0] if seg.order == "chunks" else [0.0, 1.0]
    ends = [top, top] if seg.order == "chunks" else [top, top + 1.0]
    column = lambda v: np.repeat(np.asarray(v, dtype=np.float64)[:, None], 3, axis=1)  # noqa: E731
    offsets = np.concatenate([column(marks), content, column(ends)])
    advance = np.full((1, 3), ends[-1] + 1.0)
    return torch.from_numpy(offsets), torch.from_numpy(advance)


def check_time_order(layout: Layout, placed: torch.Tensor, rate: float) -> None:
    """Qwen3-Omni merges a block's video and audio tokens by comparing their absolute float32 temporal positions;
    refuse (ValueError) a ``VideoAudio`` segment of ``layout`` whose placed order these would not give where it
    lands. ``placed`` are the positions of ``layout`` under ``tmrope`` with ``temporal_rounding="exact"``."""
    start = 0
    for seg in layout:
        if isinstance(seg, VideoAudio) and seg.order == "time":
            time = frame_times(np.arange(seg.t), np.full(seg.t, seg.interval), np.float32(rate), False)
            is_audio = seg.interleave(time.tolist())[0]
            time = placed[start + 2: start + seg.num_tokens - 2, 0]
            a, b, x, y = is_audio[:-1], is_audio[1:], time[:-1], time[1:]
            bad = (~a & b & (x > y)) | (a & ~b & (y <= x))
            if bool(bad.any()):
                raise ValueError(
                    f"tmrope: segment {seg} starts at position {float(placed[start, 0])!r}, where float32 rounding "
                    f"of its frame times changes which of a frame and an audio token comes first in Qwen3-Omni's "
                    f"merge; the segment's order is not the one transformers would place there")
        start += seg.num_tokens


def _blocks(segments: Sequence[Segment], rate: np.float32, temporal_rounding: str):
    t, h, w, interval = video_blocks(segments, "tmrope")
    t, h, w, interval = t.numpy(), h.numpy(), w.numpy(), interval.numpy()
    row_block, row_frame, row_index, token_row, token_col = block_rows_np(t, h, w)
    floor = temporal_rounding == "floor"
    time = frame_times(row_frame, interval[row_block], rate, floor)
    offsets = gather_rows([time, row_index.astype(np.float64)], token_row)
    offsets = np.concatenate([offsets, token_col.astype(np.float64)[None]], axis=0)
    last = frame_times(np.maximum(t - 1, 0), interval, rate, floor)  # τ grows with f: the last frame is the max
    top = np.maximum(np.maximum(last, (h - 1).astype(np.float64)), (w - 1).astype(np.float64))
    return torch.from_numpy(offsets).T, torch.from_numpy(top + 1.0)[:, None].expand(-1, 3).contiguous()


@register(
    "tmrope",
    summary="TMRoPE (Qwen2.5-Omni, Qwen3-Omni): M-RoPE with time in absolute seconds; audio one position per token",
    allocation="mrope",
    aliases=("tm-rope", "time-aligned-mrope"),
    block_rule=tmrope_blocks,
    axes=3,
    audio_in_video=True,
)
def tmrope(layout: Layout, position_id_per_seconds: float = 25, temporal_rounding: str = "floor") -> torch.Tensor:
    """TMRoPE positions ``(L, 3)`` (t, h, w): ``temporal_rounding="floor"`` is Qwen2.5-Omni's, ``"exact"``
    Qwen3-Omni's (fractional times); ``position_id_per_seconds`` is the config's (25 in both)."""
    placed = walk(layout, tmrope_blocks, position_id_per_seconds=position_id_per_seconds,
                  temporal_rounding=temporal_rounding)
    check_time_order(layout, placed, position_id_per_seconds)
    return placed
