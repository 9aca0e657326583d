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

Not covered: the families' *audio-in-video* layout (``use_audio_in_video=True``), where a video's frames and its
audio track are interleaved in 2-second chunks (Qwen2.5-Omni) or merged by time (Qwen3-Omni) inside one block;
the layout has no segment for it yet, and the HF patch refuses it.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..layout import _FLOAT32_MAX, Layout, Segment
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


def tmrope_blocks(segments: Sequence[Segment], position_id_per_seconds: float = 25,
                  temporal_rounding: str = "floor"):
    """TMRoPE block rule: offsets ``(τ_f, i, j)``; the start advances on all axes by the block's max + 1."""
    rate = _check(position_id_per_seconds, temporal_rounding)
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
)
def tmrope(layout: Layout, position_id_per_seconds: float = 25, temporal_rounding: str = "floor") -> torch.Tensor:
    """TMRoPE positions ``(L, 3)`` (t, h, w): ``temporal_rounding="floor"`` is Qwen2.5-Omni's, ``"exact"``
    Qwen3-Omni's (fractional times); ``position_id_per_seconds`` is the config's (25 in both)."""
    return walk(layout, tmrope_blocks, position_id_per_seconds=position_id_per_seconds,
                temporal_rounding=temporal_rounding)
