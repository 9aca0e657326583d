"""The design registry: a position design is one function ``layout -> (L, A) float32`` plus an entry here.

Most designs are *translation-structured*: a running start vector ``p`` (one entry
per axis) places a text run of ``n`` tokens at ``p + k`` on every axis and advances ``p`` by ``n``; a
vision segment sits at ``p + offsets`` and advances ``p`` by a vector, both depending only on the
segment itself. Such a design registers a *block rule* that returns the offsets and advances of many
segments at once; :func:`walk` turns a rule into the design's positions and
:func:`ropekit.index.rope_index` uses it to place whole batches without a per-block Python loop.
"""
from __future__ import annotations

import difflib
import functools
import inspect
from collections import abc
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from .. import layout as _layout
from ..layout import Audio, Image, Layout, Segment, Text, Video, VideoAudio
from ._common import as_video

__all__ = ["Design", "register", "get_design", "designs", "positions", "walk", "ragged_arange", "video_blocks",
           "block_rows", "unpack_placed", "segment_tokens", "BlockTable", "MAX_WORK"]

#: Most coordinates (tokens × axes) one :func:`positions` call may build; checked, with the token count
#: (:data:`ropekit.layout.MAX_TOKENS`), before the design runs. 2**26 coordinates are 256 MiB as float32;
#: the designs work in float64 with a few temporaries, so a call at the limit peaks near 2 GiB.
#: Raise it (``ropekit.designs.registry.MAX_WORK = ...``) on purpose for bigger layouts.
MAX_WORK = 2**26

#: ``rule(segments, **options) -> (offsets, advance)``: for vision segments ``s_0 … s_{S-1}``, the
#: coordinates of their tokens relative to the block start, concatenated in order ``(Σ n_k, A)``, and
#: how far each moves the running start ``(S, A)``, both float64. Called with no segments it must still
#: return ``(0, A)`` tensors (that fixes the number of axes) and check its options.
#: A rule may return a third item, a ``(A,)`` bool mask of *absolute* axes: on those, vision offsets are
#: the coordinates themselves and the running start is not added (MRoPE-I's spatial reset places h, w
#: from 0 in every image); text and the advances are unchanged. ``None`` there means no absolute axis.
#: A rule may return a fourth item, a ``(A,)`` float64 *gap*: every vision segment after the first of its
#: sample starts one more gap further (added to the running start just before it, so the shift carries on
#: to everything after it; Circle-RoPE's multi-image offset). :func:`unpack_placed` reads all four.
BlockRule = Callable[..., "tuple[torch.Tensor, ...]"]

#: how a design may place audio (``Design.audio``)
AUDIO_RULES = ("text", "refuse")


@dataclass(frozen=True)
class Design:
    """A registered position design: its function, one-line summary, usual allocation and optional rule."""

    name: str
    fn: Callable[..., torch.Tensor]
    summary: str
    allocation: str  # the frequency allocation this design is normally paired with
    aliases: tuple = field(default=())
    block_rule: Optional[BlockRule] = None  # set for translation-structured designs (see module doc)
    # axes whose largest coordinate + 1 is where text continues (decoding deltas); None: all axes
    delta_axes: Optional[tuple] = None
    #: number of axes: an int, or ``axes(layout, **options) -> int`` when it depends on them; None: unknown
    axes: "int | Callable[..., int] | None" = None
    #: ``(option, {value: allocation})`` when one of the design's options picks its allocation (GRAPE's
    #: ``frequency_allocation``); ``allocation`` is then the one the option's default picks
    allocation_option: Optional[tuple] = None
    #: how the design places :class:`~ropekit.Audio` segments: ``"text"`` (a run on the text diagonal, one
    #: position per token: :func:`positions` hands the design a ``Text`` segment in its place), or ``"refuse"``
    #: (the design defines no place for audio: :func:`positions` refuses a layout holding audio). Batched and
    #: Hugging Face placement see audio tokens as text (their token types have no audio code), which is where
    #: ``"text"`` puts them; so a rule that places audio elsewhere could not be honoured there, and none exists.
    audio: str = "text"
    #: whether the design places :class:`~ropekit.VideoAudio` segments (a video with its audio track interleaved);
    #: :func:`positions` refuses them for every other design
    audio_in_video: bool = False

    @property
    def options(self) -> tuple:
        """Keyword options the design accepts."""
        return _options_of(self.fn)

    def allocation_for(self, options: "dict | None" = None) -> str:
        """The allocation this design pairs with under ``options`` (:attr:`allocation` unless an option picks it)."""
        if self.allocation_option is None or not options or self.allocation_option[0] not in options:
            return self.allocation
        option, choices = self.allocation_option
        value = options[option]
        if value not in choices:
            raise ValueError(f"{self.name}: `{option}` must be one of {', '.join(map(repr, choices))}, got {value!r}")
        return choices[value]


@functools.lru_cache(maxsize=None)
def _options_of(fn: Callable) -> tuple:
    """Keyword options of a design function (its parameters after the layout); read once per function."""
    return tuple(p.name for p in list(inspect.signature(fn).parameters.values())[1:])


_REGISTRY: dict[str, Design] = {}
_ALIASES: dict[str, str] = {}


def register(
    name: str, *, summary: str, allocation: str, aliases: tuple = (), block_rule: Optional[BlockRule] = None,
    delta_axes: Optional[tuple] = None,
    axes: "int | Callable[..., int] | None" = None,
    allocation_option: Optional[tuple] = None,
    audio: str = "text",
    audio_in_video: bool = False,
) -> Callable:
    """Decorator: add a design function ``fn(layout, **options) -> Tensor (L, A)`` to the registry.

    ``block_rule`` (optional) declares the design translation-structured; it must take the same
    options as ``fn`` and ``fn`` must equal :func:`walk` over it. ``delta_axes`` (optional) names the
    axes whose largest coordinate + 1 is where text continues, for designs where another axis may
    reach further (VideoRoPE's centred rows): :func:`ropekit.rope_index` takes its deltas from them. ``axes``
    (optional) gives ``A``, as an int or as ``axes(layout, **options)``, so that :func:`positions` can
    refuse oversized work before the design allocates anything. ``allocation_option`` (optional)
    ``(option, {value: allocation})`` lets one of the design's options choose its allocation. ``audio`` says how
    the design places audio segments: ``"text"`` (default; a text run, the design never sees ``Audio``) or
    ``"refuse"`` (a layout with audio is refused with a ValueError naming the design). ``audio_in_video`` says
    the design (and its block rule) places :class:`~ropekit.VideoAudio` segments; a layout holding one is refused
    for every other design.
    """
    if audio not in AUDIO_RULES:
        raise ValueError(f"register: `audio` must be one of {', '.join(map(repr, AUDIO_RULES))}, got {audio!r}")
    if block_rule is not None and not callable(block_rule):
        raise TypeError(f"register: `block_rule` must be a function (segments, **options) -> (offsets, advance), "
                        f"got {type(block_rule).__name__}")

    def deco(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        if name in _REGISTRY:
            raise ValueError(f"register: a design named {name!r} already exists")
        _REGISTRY[name] = Design(name, fn, summary, allocation, tuple(aliases), block_rule, delta_axes, axes,
                                 allocation_option, audio, bool(audio_in_video))
        for a in aliases:
            _ALIASES[a] = name
        return fn

    return deco


def alias(name: str, *aliases: str) -> None:
    """Accept more names for a registered design (e.g. the names another library uses for it)."""
    design = get_design(name)
    for a in aliases:
        if a in _REGISTRY or _ALIASES.get(a, design.name) != design.name:
            raise ValueError(f"alias: {a!r} already names another design")
        _ALIASES[a] = design.name


def did_you_mean(word: object, choices: "abc.Iterable[str]", canonical: "dict[str, str] | None" = None) -> str:
    """`` (did you mean 'x'?)`` naming the choices nearest to ``word`` (:func:`difflib.get_close_matches`, case
    ignored, at most three), or ``""`` when none is near or ``word`` is not a string. ``canonical`` maps a
    choice to the name to show for it (an alias to its design), each shown once."""
    if not isinstance(word, str) or not word:
        return ""
    by_lower: dict[str, str] = {}
    for c in choices:
        by_lower.setdefault(c.lower(), c)
    close = difflib.get_close_matches(word.lower(), list(by_lower), n=6, cutoff=0.6)
    shown = list(dict.fromkeys((canonical or {}).get(by_lower[c], by_lower[c]) for c in close))[:3]
    if not shown:
        return ""
    names = [repr(n) for n in shown]
    return f" (did you mean {' or '.join([', '.join(names[:-1]), names[-1]] if len(names) > 1 else names)}?)"


def get_design(name: str) -> Design:
    """Look a design up by name or alias; unknown names get the nearest names and the list of known ones."""
    if not isinstance(name, str):
        raise TypeError(f"`design` must be a design name (str), got {type(name).__name__}")
    key = _ALIASES.get(name, name)
    if key not in _REGISTRY:
        known = ", ".join(sorted(_REGISTRY))
        hint = did_you_mean(name, [*_REGISTRY, *_ALIASES], _ALIASES)
        raise ValueError(f"unknown design {name!r}{hint}; choose one of: {known} (see ropekit.designs())")
    return _REGISTRY[key]


def designs() -> list[str]:
    """Names of all registered position designs."""
    return sorted(_REGISTRY)


def check_options(design: Design, options: dict) -> None:
    """Reject option names the design does not take, suggesting the nearest it does and listing them all."""
    allowed = design.options
    bad = [k for k in options if k not in allowed]
    if bad:
        named = ", ".join(repr(k) + did_you_mean(k, allowed) for k in bad)
        raise TypeError(
            f"design {design.name!r} got unknown option(s) {named}; "
            f"it accepts: {', '.join(allowed) or 'no options'}"
        )


def positions(layout: "Layout | str", design: str = "mrope", **options) -> torch.Tensor:
    """Coordinates of every token of ``layout`` under ``design``: float32 tensor ``(L, A)``.

    ``layout`` is a :class:`~ropekit.Layout` or its string form (``"T3 I4x4 T2"``).

    Refused with a ValueError before anything is allocated: more than :data:`ropekit.layout.MAX_TOKENS`
    tokens or more than :data:`MAX_WORK` coordinates (tokens × axes). Refused after placing: positions
    that are not finite float32 numbers (huge intervals, radii, offsets).
    """
    lay = Layout.coerce(layout)
    d = get_design(design)
    check_options(d, options)
    if d.audio == "text":
        lay = audio_as_text(lay)
    else:
        _refuse_audio(d, lay)
    if not d.audio_in_video:
        _refuse_audio_in_video(d, lay)
    check_work(d, lay, options)
    out = d.fn(lay, **options)
    if out.shape[0] != lay.num_tokens or out.ndim != 2:
        raise RuntimeError(f"design {d.name!r} returned shape {tuple(out.shape)} for {lay.num_tokens} tokens")
    out = out.to(torch.float32)
    if not bool(torch.isfinite(out).all()):
        raise ValueError(
            f"positions: design {d.name!r}{describe_options(options)} on layout {_short(lay)} gives positions that "
            f"are not finite float32 numbers (largest finite: {torch.finfo(torch.float32).max:.4g}); "
            f"use smaller intervals or design options"
        )
    return out


def audio_as_text(layout: Layout) -> Layout:
    """``layout`` with every ``Audio`` segment replaced by a ``Text`` segment of as many tokens (itself when it
    holds no audio): where a design with ``audio="text"`` places audio."""
    if not any(isinstance(s, Audio) for s in layout):
        return layout
    return Layout(Text(s.n) if isinstance(s, Audio) else s for s in layout)


def _refuse_audio(design: Design, layout: Layout) -> None:
    """ValueError when ``layout`` holds audio and ``design`` registered ``audio="refuse"``."""
    audio = next((s for s in layout if isinstance(s, Audio)), None)
    if audio is not None:
        raise ValueError(
            f"positions: design {design.name!r} defines no place for audio (registered with audio='refuse'), but layout "
            f"{_short(layout)} holds audio segment {audio}; write the audio as text (T{audio.n}) to place it as a text "
            f"run, or use a design that places audio (every built-in design does: docs/designs.md, 'Audio')"
        )


def _refuse_audio_in_video(design: Design, layout: Layout) -> None:
    """ValueError when ``layout`` holds a ``VideoAudio`` segment and ``design`` does not place one."""
    seg = next((s for s in layout if isinstance(s, VideoAudio)), None)
    if seg is not None:
        raise ValueError(
            f"positions: design {design.name!r} defines no place for a video with its audio track interleaved, but "
            f"layout {_short(layout)} holds segment {seg}; use design 'tmrope' (Qwen2.5-Omni's and Qwen3-Omni's "
            f"placement), or write the video and its audio as separate segments "
            f"({Video(seg.t, seg.h, seg.w, seg.interval)} A{seg.n}), which is a different token order"
        )


def _short(lay: Layout, limit: int = 80) -> str:
    text = str(lay)
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def describe_options(options: dict) -> str:
    """`` with option=value, …`` for error messages (empty without options)."""
    if not options:
        return ""
    return " with " + ", ".join(f"{k}={v!r}"[:60] for k, v in options.items())


def design_axes(name: str, **options) -> int:
    """How many axes design ``name`` places tokens on with ``options``, for any layout: the one answer
    :class:`ropekit.RoPE`'s wrappers, :func:`ropekit.index.rope_index` and :func:`ropekit.patch_model` ask for.
    Checks the design and its options as placing does."""
    d = get_design(name)
    lay = Layout.parse("T1")
    if isinstance(d.axes, int):
        check_options(d, options)
        return d.axes
    if callable(d.axes):
        check_options(d, options)
        return int(d.axes(lay, **options))
    return int(positions(lay, name, **options).shape[1])


def num_axes(design: Design, layout: Layout, options: dict) -> Optional[int]:
    """The design's number of axes for ``layout`` and ``options`` without placing anything (None: unknown)."""
    if design.axes is None or isinstance(design.axes, int):
        return design.axes
    return design.axes(layout, **options)


def check_work(design: Design, layout: Layout, options: dict) -> None:
    """Refuse layouts over :data:`ropekit.layout.MAX_TOKENS` tokens or :data:`MAX_WORK` coordinates."""
    tokens = layout.num_tokens
    _layout.check_token_count(tokens, f"positions({_short(layout)}, {design.name!r})")
    axes = num_axes(design, layout, options)
    if axes is not None and tokens * axes > MAX_WORK:
        raise ValueError(
            f"positions: design {design.name!r}{describe_options(options)} would build {tokens} tokens × {axes} "
            f"axes = {tokens * axes} coordinates, more than the limit of {MAX_WORK} "
            f"(ropekit.designs.registry.MAX_WORK); use a smaller layout or fewer axes, or raise the limit knowingly"
        )


def ragged_arange(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For consecutive blocks of ``counts[k]`` items: each item's block ``k`` and its index inside the block.

    The vectorised form of ``for k, n in enumerate(counts): for i in range(n): yield k, i``; int64.
    """
    owner, local = _ragged(counts.detach().to("cpu", torch.int64).numpy())
    return torch.from_numpy(owner), torch.from_numpy(local)


def _ragged(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`ragged_arange` on an int64 numpy array; numpy's ``repeat`` costs a fraction of the torch
    equivalents at these sizes (tens of thousands of items)."""
    total = int(counts.sum())
    owner = np.repeat(np.arange(counts.shape[0], dtype=np.int64), counts)
    local = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return owner, local


class BlockTable(abc.Sequence):
    """Images and videos given as columns, a sequence of :class:`~ropekit.Image`/:class:`~ropekit.Video`
    to a block rule.

    :func:`ropekit.rope_index` hands a rule the distinct blocks of a batch this way, so that no segment
    object is built per block: :func:`video_blocks` and :func:`segment_tokens` read the columns directly.
    A rule that iterates or indexes the table gets the segments themselves (built on access), so every
    rule written against ``Sequence[Segment]`` works unchanged. Columns: ``t``, ``h``, ``w`` (int64, all
    >= 1), ``interval`` (float64, finite, >= 0; 0 for images) and ``is_image`` (bool; an image has t = 1).
    The caller guarantees what the segment constructors would check.
    """

    __slots__ = ("t", "h", "w", "interval", "is_image")

    def __init__(self, t: torch.Tensor, h: torch.Tensor, w: torch.Tensor, interval: torch.Tensor,
                 is_image: torch.Tensor) -> None:
        self.t, self.h, self.w, self.interval, self.is_image = t, h, w, interval, is_image

    def __len__(self) -> int:
        return self.t.shape[0]

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("BlockTable index out of range")
        if bool(self.is_image[i]):
            return Image(int(self.h[i]), int(self.w[i]))
        return Video(int(self.t[i]), int(self.h[i]), int(self.w[i]), float(self.interval[i]))

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    @property
    def num_tokens(self) -> torch.Tensor:
        """Tokens of each block, ``t·h·w`` (int64, ``(S,)``)."""
        return self.t * self.h * self.w


def segment_tokens(segments: Sequence[Segment]) -> torch.Tensor:
    """Number of tokens of each segment, int64 ``(S,)``."""
    if isinstance(segments, BlockTable):
        return segments.num_tokens
    return torch.tensor([s.num_tokens for s in segments], dtype=torch.int64)


def video_blocks(segments: Sequence[Segment], design: str) -> tuple[torch.Tensor, ...]:
    """Frames ``t``, height ``h``, width ``w`` (int64) and interval ``Δt`` (float64) of each segment viewed as
    a video (images are one frame with Δt = 0, 2-/3-D grids an image/video), shape ``(S,)`` each."""
    if isinstance(segments, BlockTable):
        return segments.t, segments.h, segments.w, segments.interval
    rows = []
    for s in segments:
        if isinstance(s, Video):
            rows.append((s.t, s.h, s.w, s.interval))
        elif isinstance(s, Image):
            rows.append((1, s.h, s.w, 0.0))
        else:
            v = as_video(s, design)
            rows.append((v.t, v.h, v.w, v.interval))
    table = torch.tensor(rows, dtype=torch.float64).reshape(len(rows), 4)
    thw = table[:, :3].to(torch.int64)
    return thw[:, 0], thw[:, 1], thw[:, 2], table[:, 3]


def block_rows(
    t: torch.Tensor, h: torch.Tensor, w: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raster order of many ``t × h × w`` blocks, one after another (frame-major, then row-major).

    Returns, for every row of every frame, its block, frame and row index (``(Σ t·h,)`` each), and for
    every token the row it lies on and its column (``(Σ t·h·w,)`` each), all int64. Working per row
    keeps the divisions off the (``w`` times longer) token axis.
    """
    as_np = lambda x: x.detach().to("cpu", torch.int64).numpy()  # noqa: E731
    return tuple(torch.from_numpy(x) for x in block_rows_np(as_np(t), as_np(h), as_np(w)))


def block_rows_np(t: np.ndarray, h: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, ...]:
    """:func:`block_rows` on int64 numpy arrays, returning numpy arrays (for rules written in numpy)."""
    row_block, r = _ragged(t * h)
    rows_per_frame = h[row_block]
    row_frame = r // rows_per_frame
    token_row, token_col = _ragged(w[row_block])
    return row_block, row_frame, r - row_frame * rows_per_frame, token_row, token_col


def frame_rows(segments, design: str):
    """Every vision segment as a run of ``h × w`` frames (an image is one frame), row by row.

    Returns ``(seg, frame, row, token_row, col, t, h, w)``: per frame row its segment (int64), frame
    and row index (float64); per token the frame row it lies on (int64) and its column (float64);
    per segment its frames, rows and columns (int64). Rules build a per-row table and expand it
    with one ``index_select`` by ``token_row`` (rows are ``w`` times fewer than tokens). The designs of
    the Multimodal-RoPEs collection treat each video frame as a block of its own.
    """
    seg, frame, row, token_row, col, t, h, w = frame_rows_np(segments, design)
    return tuple(torch.from_numpy(x) for x in (seg, frame, row, token_row, col, t, h, w))


def frame_rows_np(segments, design: str):
    """:func:`frame_rows` as numpy arrays, for rules written in numpy."""
    t, h, w, _ = video_blocks(segments, design)
    t, h, w = (x.detach().to("cpu", torch.int64).numpy() for x in (t, h, w))
    row_block, row_frame, row_index, token_row, token_col = block_rows_np(t, h, w)
    return (row_block, row_frame.astype(np.float64), row_index.astype(np.float64), token_row,
            token_col.astype(np.float64), t, h, w)


def unpack_placed(placed: Sequence) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """A rule's result as ``(offsets, advance, absolute axes or None, gap or None)``; a zero gap is None."""
    absolute = placed[2] if len(placed) > 2 else None
    gap = placed[3] if len(placed) > 3 else None
    if gap is not None and not bool(gap.any()):
        gap = None
    return placed[0], placed[1], absolute, gap


def walk(layout: Layout, rule: BlockRule, **options) -> torch.Tensor:
    """Positions ``(L, A)`` float32 of ``layout`` under a block rule (the walk every translation-structured design shares).

    The running start ``p`` begins at 0 on every axis; text (and audio, placed as text) takes ``p, p+1, …`` (per
    axis) and moves ``p`` by its length, a vision segment takes ``p + offsets`` and moves ``p`` by its advance (after the
    rule's gap, if it has one, for every vision segment but the first). The
    arithmetic is float64, rounded to float32 once at the end.
    """
    vision = [s for s in layout if not isinstance(s, (Text, Audio))]
    offsets, advance, absolute, gap = unpack_placed(rule(vision, **options))
    axes = advance.shape[1]
    relative = torch.ones(axes, dtype=torch.float64) if absolute is None else (~absolute).to(torch.float64)
    parts, p, row, k = [], torch.zeros(axes, dtype=torch.float64), 0, 0
    for seg in layout:
        if isinstance(seg, (Text, Audio)):
            parts.append(p + torch.arange(seg.n, dtype=torch.float64)[:, None])
            p = p + seg.n
            continue
        if k and gap is not None:  # every vision segment after the first
            p = p + gap
        n = seg.num_tokens
        parts.append(p * relative + offsets[row: row + n])
        p = p + advance[k]
        row, k = row + n, k + 1
    return torch.cat(parts).to(torch.float32)
