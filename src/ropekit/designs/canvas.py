"""Canvas M-RoPE (MiniCPM-V 4.7): every picture and every video frame is laid out on a canvas of its own.

MiniCPM-V feeds a picture (or a video frame) as *crops*: a thumbnail of the whole picture, then, for large
pictures, a grid of ``rows × cols`` detail *slices* that tile it at higher resolution. Its processor wraps the
crops in marker tokens, ``<image>`` thumbnail ``</image>``, then ``<slice>`` slice ``</slice>`` for every slice,
row after row, with a newline token between two rows of slices. transformers' MiniCPM-V 4.7 places them with
3-axis (t, h, w) positions on a *canvas*:

- A *frame* (one picture, or one video frame: a thumbnail and its slices) starts at the origin ``c``, the
  position the next text token would take. Every token of the frame has ``t = c``.
- The canvas is ``H × W`` with ``H = rows·h₀``, ``W = cols·w₀`` (``h₀ × w₀`` the *first* slice's grid), or the
  thumbnail's own grid when the frame has no slices.
- Slice ``k`` (row ``i = k // cols``, column ``j = k % cols``, grid ``hₖ × wₖ``) sits at ``(i·h₀, j·w₀)``: its token
  ``(r, q)`` at ``(c, c + i·h₀ + r, c + j·w₀ + q)``.
- The thumbnail (``h × w``) is spread over the whole canvas: its token ``(r, q)`` at ``(c, c + ⌊y_r⌉, c + ⌊x_q⌉)``,
  ``y = linspace(0, H − 1, h)`` and ``x = linspace(0, W − 1, w)`` in float32, rounded half to even (without slices
  that is the plain grid ``(c, c + r, c + q)``).
- Markers: ``<image>`` at the halo ``(c, c − 1, c − 1)`` (``(0, 0, 0)`` when ``c = 0``); ``</image>`` at the far
  corner ``(c, c + H, c + W)``; ``<slice>`` at its slice's top-left ``(c, c + i·h₀, c + j·w₀)``, ``</slice>`` at its
  bottom-right ``(c, c + i·h₀ + hₖ − 1, c + j·w₀ + wₖ − 1)``; the newline ending slice row ``i`` at
  ``(c, c + (i + 1)·h₀ − 1, c + cols·w₀)``. Marker tokens that directly follow a frame's closing marker (a newline
  right after the picture) are the frame's too, at ``(c, c, c)``.
- Text after the frame continues at ``c + max(H, W) + 1``; text is 1-D (``p`` on every axis) as in every design.

Layout convention (ropekit's; a layout has no marker or slice segment): every crop is its own segment, an
``Image`` (``I{h}x{w}``) or a one-frame ``Video`` (``V1x{h}x{w}``, a video frame's crops; MiniCPM-V's token type 2),
in the order the model sees them; a 2-D grid is read as an image. Options say how to read them:

- ``slices``: the slice grid of each frame, in order, ``(rows, cols)`` or ``0``/``None`` for none (string form
  ``"2x3,0,1x2"``). The first crop is a thumbnail; a thumbnail whose entry is ``(rows, cols)`` is followed by its
  ``rows·cols`` slices (row-major), and the crop after them is the next thumbnail. Left unset, no frame has slices.
- ``markers=True``: the layout's text holds the markers as the processor writes them, and they get the marker
  positions above: the last text token before a thumbnail is its ``<image>``; the text between a thumbnail and its
  first slice is exactly ``</image><slice>`` (2 tokens), between two slices of a row ``</slice><slice>`` (2), between
  two rows ``</slice>\\n<slice>`` (3); the first text token after a frame is its closing marker (``</image>``, or the
  last ``</slice>``). A video of ``t`` frames is ``t`` one-frame crops with ``</image><image>`` (``T2``) between them.
- ``trailing``: with markers, how many tokens after each frame's closing marker are marker tokens too (an int for
  every frame, or one per frame; default 0). The processor writes none, but a prompt often puts a newline right
  after a picture, and the newline token is one of the markers: transformers then places it at ``(c, c, c)``. At
  most the tokens before the next frame's ``<image>`` count.

Without markers (the default) the layout holds the crops alone, and each token gets the position it would have with
the markers around every crop, the markers taken out (they take no index of their own). With neither markers nor
slices every crop is a frame without slices, ``(s, s + r, s + q)``, advancing ``max(h, w) + 1``, and a multi-frame
video is that many frames: the design's block rule, used by :func:`ropekit.rope_index`. Markers and slices make a
token's place depend on the crops and text around it, which a block rule cannot see: such layouts are placed by
:func:`ropekit.positions` only (the Hugging Face patch of MiniCPM-V 4.7 reads each sample's layout, slices and
trailing markers off the marker ids and places it so).
"""
from __future__ import annotations

import numbers
import re
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np
import torch

from ..layout import Audio, Layout, Segment, Text, _show
from ._common import as_video, gather_rows
from .registry import frame_rows_np, register, walk

__all__ = ["canvas_mrope", "canvas_blocks", "check_slices", "thumbnail_spread"]

DESIGN = "canvas-mrope"

Slices = Optional[Union[str, Sequence[object]]]
Trailing = Union[int, Sequence[int]]

#: Largest number of slice rows or columns accepted (keeps every product inside int64).
MAX_GRID = 2**31 - 1


# ------------------------------------------------------------------------------------------------ options

def _check_markers(markers: object) -> bool:
    if not isinstance(markers, bool):
        raise TypeError(f"{DESIGN}: `markers` must be True (the layout's text holds MiniCPM-V's markers around every "
                        f"crop) or False (the crops alone), got {_show(markers)}")
    return markers


def _grid_size(value: object) -> Optional[int]:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None
    value = int(value)
    return value if 0 <= value <= MAX_GRID else None


def _slice_entry(entry: object, index: int) -> tuple:
    """One frame's slice grid as ``(rows, cols)``; ``(0, 0)`` for a frame without slices."""
    if entry is None:
        return (0, 0)
    rows = cols = None
    if isinstance(entry, str):
        text = entry.strip()
        if text in ("0", "-"):
            return (0, 0)
        m = re.fullmatch(r"(\d+)\s*[xX×]\s*(\d+)", text, re.ASCII)
        if m is not None:
            rows, cols = _grid_size(int(m.group(1))), _grid_size(int(m.group(2)))
    elif isinstance(entry, numbers.Integral) and not isinstance(entry, bool):
        if int(entry) == 0:
            return (0, 0)
    else:
        try:
            pair = tuple(entry)
        except TypeError:
            pair = ()
        if len(pair) == 2:
            rows, cols = _grid_size(pair[0]), _grid_size(pair[1])
    if rows is None or cols is None or (rows == 0) != (cols == 0):
        raise ValueError(
            f"{DESIGN}: `slices` entry {index} must be a frame's slice grid (rows, cols) of two ints >= 1 (or '2x3'), "
            f"or 0 / None / (0, 0) for a frame without slices, got {_show(entry)}; `slices` lists one entry per frame, "
            f"so one frame's grid is written [(2, 3)]"
        )
    return (rows, cols)


def check_slices(slices: Slices) -> Optional[tuple]:
    """``slices`` as a tuple of ``(rows, cols)`` per frame (``(0, 0)``: no slices); None stays None.

    Accepts a sequence of entries (``(rows, cols)``, ``"RxC"``, ``0``, ``None``) or a string of entries separated by
    commas or spaces (``"2x3,0,1x2"``)."""
    if slices is None:
        return None
    if isinstance(slices, str):
        entries = [e for e in re.split(r"[\s,;]+", slices.strip()) if e]
    elif isinstance(slices, (bytes, dict)) or not isinstance(slices, (Sequence, np.ndarray, torch.Tensor)):
        raise TypeError(f"{DESIGN}: `slices` must be a sequence with one slice grid (rows, cols) per frame (0 or None "
                        f"for a frame without slices), or a string like '2x3,0,1x2', got {type(slices).__name__} "
                        f"({_show(slices)})")
    else:
        entries = list(slices.tolist() if isinstance(slices, (np.ndarray, torch.Tensor)) else slices)
    return tuple(_slice_entry(e, i) for i, e in enumerate(entries))


def _check_trailing(trailing: object) -> Union[int, tuple]:
    """``trailing`` as an int >= 0 (every frame) or a tuple of them (one per frame)."""
    def one(v: object) -> Optional[int]:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not 0 <= int(v) <= MAX_GRID:
            return None
        return int(v)

    if isinstance(trailing, (str, bytes)):
        got = None
    elif isinstance(trailing, numbers.Integral) and not isinstance(trailing, bool):
        got = one(trailing)
    else:
        try:
            values = tuple(trailing)
        except TypeError:
            values = None
        got = None if values is None or any(one(v) is None for v in values) else tuple(int(v) for v in values)
    if got is None:
        raise ValueError(f"{DESIGN}: `trailing` must be an int >= 0 (for every frame) or one int >= 0 per frame: how "
                         f"many tokens after a frame's closing marker are marker tokens too (a newline right after "
                         f"the picture), got {_show(trailing)}")
    return got


def _check_options(markers: object, slices: Slices, trailing: object) -> tuple:
    markers = _check_markers(markers)
    grids = check_slices(slices)
    trail = _check_trailing(trailing)
    if not markers and trail != 0 and (not isinstance(trail, tuple) or any(trail)):
        raise ValueError(f"{DESIGN}: `trailing` counts marker tokens after each frame, so it needs markers=True "
                         f"(the layout's text holding MiniCPM-V's markers), got trailing={_show(trailing)} with "
                         f"markers=False")
    return markers, grids, trail


# ----------------------------------------------------------------------------------------------- the rule

def canvas_blocks(segments: Sequence[Segment], markers: bool = False, slices: Slices = None,
                  trailing: Trailing = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Block rule of the crops-only reading (no markers, no slices): frame f of a block (an image is one frame)
    starts ``f·(max(h, w) + 1)`` after the block, its token (r, q) at ``(0, r, q)`` from the frame start; the block
    advances ``t·(max(h, w) + 1)`` on every axis. Markers and slices place tokens from the crops and text around
    them, which no rule sees: with either, a rule given any segment refuses (ValueError)."""
    markers, grids, trail = _check_options(markers, slices, trailing)
    if (markers or grids is not None) and len(segments):
        raise ValueError(
            f"{DESIGN}: with markers=True or `slices`, a token's position depends on the crops and marker tokens "
            f"around it, which a block rule (and so ropekit.rope_index, which sees token types only) cannot see; "
            f"place each sample's layout with ropekit.positions(layout, {DESIGN!r}, ...)"
        )
    seg, frame, row, token_row, col, t, h, w = frame_rows_np(segments, DESIGN)
    step = (np.maximum(h, w) + 1).astype(np.float64)
    start = frame * step[seg]
    offsets = gather_rows([start, start + row, start], token_row)
    offsets[2] += col
    advance = torch.from_numpy(t * step)[:, None].expand(-1, 3).contiguous()
    return torch.from_numpy(offsets).T, advance


# ------------------------------------------------------------------------------------------ the placement

def thumbnail_spread(canvas: int, size: int) -> np.ndarray:
    """Where the ``size`` rows (or columns) of a thumbnail land on a canvas of ``canvas`` rows: float32
    ``linspace(0, canvas − 1, size)`` rounded half to even, as float64 (``size`` values)."""
    spread = torch.linspace(0, canvas - 1, size, dtype=torch.float32).round()
    return spread.to(torch.float64).numpy()


@dataclass
class _Frame:
    thumb: int  # index of the thumbnail among the crops
    slices: list  # indices of its slices, row-major
    cols: int
    trailing: int


def _crops_and_runs(layout: Layout, single: bool) -> tuple[list, list]:
    """The crops ``(h, w)`` in order and the text runs around them: ``runs[k]`` text tokens before crop k,
    ``runs[K]`` after the last. A multi-frame video is refused when ``single`` (markers or slices)."""
    crops, runs = [], [0]
    for seg in layout:
        if isinstance(seg, (Text, Audio)):
            runs[-1] += seg.n
            continue
        v = as_video(seg, DESIGN)
        if v.t != 1 and single:
            raise ValueError(
                f"{DESIGN}: segment {seg} holds {v.t} frames in a row, but with markers or slices every crop is its "
                f"own segment: write a video frame by frame as V1x{v.h}x{v.w}, with its markers between the frames "
                f"(MiniCPM-V's '</image><image>': 'V1x{v.h}x{v.w} T2 V1x{v.h}x{v.w}')"
            )
        for _ in range(v.t):
            crops.append((v.h, v.w))
            runs.append(0)
    return crops, runs


def _frames(crops: list, grids: Optional[tuple], trail: Union[int, tuple]) -> list:
    """Group the crops into frames (thumbnail + slices) by ``slices``; check ``trailing`` has one entry per frame."""
    if grids is None:
        grids = ((0, 0),) * len(crops)
    frames, k = [], 0
    for f, (rows, cols) in enumerate(grids):
        need = 1 + rows * cols
        if k + need > len(crops):
            raise ValueError(
                f"{DESIGN}: `slices` describes frame {f} as a thumbnail with {rows}x{cols} slices ({need} crops from "
                f"crop {k}), but the layout holds {len(crops)} crops in all; give one slices entry per frame "
                f"(thumbnail), in order"
            )
        frames.append(_Frame(k, list(range(k + 1, k + need)), cols, 0))
        k += need
    if k != len(crops):
        raise ValueError(
            f"{DESIGN}: `slices` describes {len(grids)} frame(s) covering {k} crops, but the layout holds {len(crops)} "
            f"crops (images and video frames); give one slices entry per frame (thumbnail), in order"
        )
    if isinstance(trail, tuple):
        if len(trail) != len(frames):
            raise ValueError(f"{DESIGN}: `trailing` gives {len(trail)} entries for {len(frames)} frames; give one per "
                             f"frame, or one int for all")
        for fr, n in zip(frames, trail):
            fr.trailing = n
    else:
        for fr in frames:
            fr.trailing = trail
    return frames


def _general(layout: Layout, markers: bool, grids: Optional[tuple], trail: Union[int, tuple]) -> torch.Tensor:
    crops, runs = _crops_and_runs(layout, single=True)
    frames = _frames(crops, grids, trail)
    # token index where each run and each crop starts
    run_at, crop_at, i = [], [], 0
    for k, n in enumerate(runs):
        run_at.append(i)
        i += n
        if k < len(crops):
            crop_at.append(i)
            i += crops[k][0] * crops[k][1]
    pos = np.zeros((i, 3), dtype=np.float64)

    def text(at: int, n: int, p: float) -> float:
        pos[at:at + n] = (p + np.arange(n, dtype=np.float64))[:, None]
        return p + n

    def crop(k: int, t: float, rows: np.ndarray, cols: np.ndarray) -> None:
        h, w = crops[k]
        at = crop_at[k]
        block = pos[at:at + h * w].reshape(h, w, 3)
        block[..., 0] = t
        block[..., 1] = rows[:, None]
        block[..., 2] = cols[None, :]

    def marker_error(k: int, what: str, want: str, got: int) -> ValueError:
        return ValueError(
            f"{DESIGN}: with markers=True the text {what} crop {k} must be {want} as MiniCPM-V's processor writes it, "
            f"but the layout has {got} text token(s) there; write the markers in the text runs (see docs/designs.md, "
            f"'Canvas M-RoPE'), or check `slices`"
        )

    p, closing = 0.0, None  # closing: (origin, h, w) of the marker that closes the previous frame, its trailing
    for fr in frames:
        # the run before the thumbnail: the previous frame's closing marker and trailing markers, text, <image>
        k = fr.thumb
        at, n = run_at[k], runs[k]
        if markers:
            need = (closing is not None) + 1
            if n < need:
                raise marker_error(k, "before", "the previous frame's closing marker and this thumbnail's <image>"
                                   if closing is not None else "at least this thumbnail's <image>", n)
            if closing is not None:
                c0, ch, cw, tr = closing
                pos[at] = (c0, ch, cw)
                a = min(tr, n - need)
                pos[at + 1:at + 1 + a] = c0
                at, n = at + 1 + a, n - 1 - a
            p = text(at, n - 1, p)
            c = p
            halo = max(c - 1.0, 0.0)
            pos[at + n - 1] = (c, halo, halo)
        else:
            p = text(at, n, p)
            c = p
        # the canvas
        th, tw = crops[k]
        if fr.slices:
            h0, w0 = crops[fr.slices[0]]
            rows_n = len(fr.slices) // fr.cols
            H, W = rows_n * h0, fr.cols * w0
        else:
            H, W = th, tw
        crop(k, c, c + thumbnail_spread(H, th), c + thumbnail_spread(W, tw))
        corner = (c + H, c + W)  # </image>
        for s, k2 in enumerate(fr.slices):
            i_row, j_col = divmod(s, fr.cols)
            top, left = i_row * h0, j_col * w0
            new_row = s > 0 and j_col == 0
            at, n = run_at[k2], runs[k2]
            if markers:
                want = 3 if new_row else 2
                if n != want:
                    want_text = ("'</slice>\\n<slice>' (3 tokens: a new row of slices)" if new_row
                                 else "'</image><slice>' (2 tokens)" if s == 0 else "'</slice><slice>' (2 tokens)")
                    raise marker_error(k2, "before", want_text, n)
                pos[at] = (c, *corner)
                if new_row:
                    pos[at + 1] = (c, c + i_row * h0 - 1, c + fr.cols * w0)
                pos[at + n - 1] = (c, c + top, c + left)
            elif n:
                raise ValueError(f"{DESIGN}: crop {k2} is a slice of the frame of crop {k} (`slices`), but {n} text "
                                 f"token(s) come before it; without markers the crops of one frame follow one another")
            sh, sw = crops[k2]
            crop(k2, c, c + top + np.arange(sh, dtype=np.float64), c + left + np.arange(sw, dtype=np.float64))
            corner = (c + top + sh - 1, c + left + sw - 1)  # </slice>
        closing = (c, *corner, fr.trailing)
        p = c + max(H, W) + 1
    # the run after the last crop: the closing marker and trailing markers, then text
    at, n = run_at[-1], runs[-1]
    if markers and closing is not None:
        if n < 1:
            raise marker_error(len(crops) - 1, "after", "at least its frame's closing marker", n)
        c0, ch, cw, tr = closing
        pos[at] = (c0, ch, cw)
        a = min(tr, n - 1)
        pos[at + 1:at + 1 + a] = c0
        at, n = at + 1 + a, n - 1 - a
    text(at, n, p)
    return torch.from_numpy(pos).to(torch.float32)


@register(
    DESIGN,
    summary="Canvas M-RoPE (MiniCPM-V 4.7): each picture or video frame on its own canvas, the thumbnail spread over "
            "its slices, markers at the canvas corners (markers=True, slices=[(rows, cols), ...])",
    allocation="interleaved",
    aliases=("canvas", "canvas_mrope"),
    block_rule=canvas_blocks,
    axes=3,
)
def canvas_mrope(layout: Layout, markers: bool = False, slices: Slices = None, trailing: Trailing = 0) -> torch.Tensor:
    """Canvas M-RoPE positions ``(L, 3)`` (t, h, w) of MiniCPM-V 4.7 (see the module doc for the rule and the layout
    convention).

    ``slices``: one slice grid ``(rows, cols)`` (or 0/None) per frame, in order; ``markers=True``: the layout's text
    holds the processor's markers around every crop; ``trailing``: with markers, how many tokens after each frame's
    closing marker are markers too (int, or one per frame). With none of them: the block rule's crops-only reading.
    """
    markers, grids, trail = _check_options(markers, slices, trailing)
    if not markers and grids is None:
        return walk(layout, canvas_blocks)
    return _general(layout, markers, grids, trail)
