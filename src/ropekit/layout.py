"""Stage 1 — layouts: which tokens a multimodal sequence holds, in order.

A layout is a tuple of segments: ``Text(n)``, ``Image(h, w)``, ``Video(t, h, w)``, ``Audio(n)`` and the
N-D ``Grid(*sizes)``. Sizes count *tokens* (after any patch merging). The compact string form is
``"T3 I4x4 T2"``, ``"T5 V8x3x3 T1"``, ``"T2 A50 T1"``, ``"G4x4x4"``; a video may carry its temporal interval
(M-RoPE ``Δt``, Qwen2.5-VL) as ``"V8x3x3@2.5"``, an audio segment its seconds per token as ``"A50@0.02"``
(default 0.04: the 40 ms tokens of Qwen2.5-Omni's and Qwen3-Omni's audio encoders). A video with its audio
track interleaved (the Omni families' ``use_audio_in_video=True``) is one ``VideoAudio`` segment, written
``"V8x3x3@25+A200:chunks50"`` (Qwen2.5-Omni's 2-second chunks) or ``"V8x3x3@25+A200:time"`` (Qwen3-Omni).
``str(layout)`` writes intervals exactly, so ``Layout.parse(str(layout)) == layout`` for every layout.

Sizes may be any int up to ``2**63 - 1`` (a layout is only a description); what may actually be
*placed* is bounded by :data:`MAX_TOKENS`, checked before anything token-sized is allocated.
"""
from __future__ import annotations

import math
import numbers
import re
import unicodedata
from dataclasses import dataclass
from typing import Iterable, Sequence, Union

import torch

__all__ = ["Text", "Image", "Video", "Audio", "VideoAudio", "Grid", "Layout", "Segment", "TEXT", "IMAGE", "VIDEO",
           "GRID", "AUDIO", "MAX_TOKENS", "check_token_count", "AUDIO_SECONDS", "INTERLEAVINGS"]

# token-type codes, shared with Hugging Face's ``mm_token_type_ids`` (text 0, image 1, video 2); grid and audio
# tokens have codes of their own in ``Layout.token_types`` (``mm_token_type_ids`` has none for them)
TEXT, IMAGE, VIDEO, GRID, AUDIO = 0, 1, 2, 3, 4

#: Seconds per audio token when an ``Audio`` segment does not say: Qwen2.5-Omni's and Qwen3-Omni's audio encoders
#: give one token per 40 ms (TMRoPE's 25 temporal positions per second).
AUDIO_SECONDS = 0.04

#: Most tokens one sequence may have when its positions (or token types) are built. Above ``2**24`` a
#: float32 position can no longer hold every integer index, so neighbouring tokens would share a
#: position. Raise it (``ropekit.layout.MAX_TOKENS = ...``) only for designs whose positions stay small.
MAX_TOKENS = 2**24

_INT64_MAX = 2**63 - 1
_FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def _check_size(value: object, name: str, what: str) -> int:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = int(value)  # numpy integers too
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point() \
                and value.dtype != torch.bool:
            value = int(value)
        else:
            raise TypeError(f"{what}: `{name}` must be an int, got {type(value).__name__} ({_show(value)})")
    if value < 1:
        raise ValueError(f"{what}: `{name}` must be >= 1, got {value}; an empty or negative grid has no tokens")
    if value > _INT64_MAX:
        raise ValueError(f"{what}: `{name}` = {_show(value)} is too large; sizes are token counts and must be < 2**63")
    return value


def _show(value: object) -> str:
    """``repr`` of a value for an error message, with huge numbers cut to their first digits."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"


def _check_total(count: int, what: str, names: str = "") -> None:
    """Refuse more than 2**63 - 1 tokens; ``names`` (e.g. "`t` × `h` × `w`") says which arguments multiply up."""
    if count > _INT64_MAX:
        product = f" ({names})" if names else ""
        raise ValueError(f"{what} holds {_show(count)} tokens{product}, more than 2**63 - 1; a sequence this long "
                         f"cannot be indexed: use smaller sizes")


def check_token_count(count: int, what: str) -> None:
    """Refuse to build per-token tensors for more than :data:`MAX_TOKENS` tokens (ValueError with the count)."""
    if count > MAX_TOKENS:
        raise ValueError(
            f"{what}: {count} tokens exceed the limit of {MAX_TOKENS} (ropekit.layout.MAX_TOKENS); float32 "
            f"positions are exact integers only up to 2**24. Use a smaller layout, or raise the limit knowingly"
        )


def _check_interval(value: object, what: str = "Video", name: str = "interval", positive: bool = False) -> float:
    """``value`` as a finite float >= 0 (> 0 with ``positive``) within the float32 range, or a TypeError/ValueError
    naming ``what``'s argument ``name``."""
    if isinstance(value, (bool, str, bytes)) or not isinstance(value, (int, float, numbers.Real, torch.Tensor)):
        raise TypeError(f"{what}: `{name}` must be a number, got {type(value).__name__} ({_show(value)})")
    if isinstance(value, torch.Tensor) and (value.numel() != 1 or value.dtype == torch.bool or value.is_complex()):
        raise TypeError(f"{what}: `{name}` must be a number or a one-element tensor, got a tensor of shape "
                        f"{tuple(value.shape)} and dtype {value.dtype}")
    try:
        iv = float(value)
    except OverflowError:
        raise ValueError(f"{what}: `{name}` = {_show(value)} is too large; positions are float32 "
                         f"(largest finite {_FLOAT32_MAX:.4g})") from None
    if not math.isfinite(iv) or iv < 0 or (positive and iv == 0):
        raise ValueError(f"{what}: `{name}` must be a finite number {'>' if positive else '>='} 0, got {value!r}")
    if iv > _FLOAT32_MAX:
        raise ValueError(f"{what}: `{name}` = {iv!r} would make positions that are not finite float32 numbers "
                         f"(largest finite float32: {_FLOAT32_MAX:.4g}); use a smaller {name}")
    return iv


def _format_float(x: float) -> str:
    """Shortest text that reads back as exactly ``x`` (``2.5``, ``0.3333333333333333``, ``1e-05``)."""
    short = f"{x:g}"
    return short if float(short) == x else repr(x)


@dataclass(frozen=True)
class Text:
    """``n`` text tokens."""

    n: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "n", _check_size(self.n, "n", "Text"))

    @property
    def num_tokens(self) -> int:
        return self.n

    kind = TEXT

    def __str__(self) -> str:
        return f"T{self.n}"


@dataclass(frozen=True)
class Image:
    """An ``h × w`` grid of image tokens, row-major."""

    h: int
    w: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "h", _check_size(self.h, "h", "Image"))
        object.__setattr__(self, "w", _check_size(self.w, "w", "Image"))
        _check_total(self.h * self.w, f"Image({self.h}, {self.w})", "`h` × `w`")

    @property
    def num_tokens(self) -> int:
        return self.h * self.w

    kind = IMAGE

    def __str__(self) -> str:
        return f"I{self.h}x{self.w}"


@dataclass(frozen=True)
class Video:
    """``t`` frames of ``h × w`` tokens (frame-major, then row-major); ``interval`` is M-RoPE's Δt."""

    t: int
    h: int
    w: int
    interval: float = 1.0

    def __post_init__(self) -> None:
        for name in ("t", "h", "w"):
            object.__setattr__(self, name, _check_size(getattr(self, name), name, "Video"))
        _check_total(self.t * self.h * self.w, f"Video({self.t}, {self.h}, {self.w})", "`t` × `h` × `w`")
        object.__setattr__(self, "interval", _check_interval(self.interval))

    @property
    def num_tokens(self) -> int:
        return self.t * self.h * self.w

    kind = VIDEO

    def __str__(self) -> str:
        tail = "" if self.interval == 1.0 else f"@{_format_float(self.interval)}"
        return f"V{self.t}x{self.h}x{self.w}{tail}"


@dataclass(frozen=True)
class Audio:
    """``n`` audio tokens, one every ``seconds`` seconds (40 ms by default, :data:`AUDIO_SECONDS`).

    Audio is a 1-D sequence in time. Each position design says where its tokens go (docs/designs.md, "Audio"):
    most place them as a text run; TMRoPE (``tmrope``) on its absolute-time axis.
    """

    n: int
    seconds: float = AUDIO_SECONDS

    def __post_init__(self) -> None:
        object.__setattr__(self, "n", _check_size(self.n, "n", "Audio"))
        object.__setattr__(self, "seconds", _check_interval(self.seconds, "Audio", "seconds", positive=True))

    @property
    def num_tokens(self) -> int:
        return self.n

    kind = AUDIO

    def __str__(self) -> str:
        tail = "" if self.seconds == AUDIO_SECONDS else f"@{_format_float(self.seconds)}"
        return f"A{self.n}{tail}"


#: ``VideoAudio.order`` → the family whose token order it is
INTERLEAVINGS = {"chunks": "Qwen2.5-Omni", "time": "Qwen3-Omni"}


@dataclass(frozen=True)
class VideoAudio:
    """A video of ``t`` frames of ``h × w`` tokens with its audio track of ``n`` tokens interleaved in time: the
    block the Omni families build with ``use_audio_in_video=True``, start and end markers included.

    Its ``4 + t·h·w + n`` tokens are two start markers (``<|vision_bos|><|audio_bos|>``), the video and audio
    tokens in the family's order, and two end markers (``<|audio_eos|><|vision_eos|>``). Times are in positions:
    frame ``f`` at ``f · interval`` (M-RoPE's Δt, as for :class:`Video`), audio token ``k`` at ``k`` (one position
    per token, as the families place audio). ``order`` is required, since the families differ:

    - ``"chunks"`` (Qwen2.5-Omni): the times are cut into chunks of ``chunk`` positions (the config's
      ``position_id_per_seconds · seconds_per_chunk``, default 50 = 25 · 2 s); chunk ``j`` of the video, then
      chunk ``j`` of the audio, for every ``j``. Chunks follow transformers' ``get_chunked_index``: a token whose
      time reaches the next chunk's threshold opens a new chunk, one threshold per token (so a frame more than
      one chunk after the previous one opens one-token chunks; the families' own behaviour);
    - ``"time"`` (Qwen3-Omni): video and audio tokens merged by time, a frame before an audio token of the same
      time; ``chunk`` must be left out.
    """

    t: int
    h: int
    w: int
    n: int
    order: str
    interval: float = 1.0
    chunk: "int | None" = None

    def __post_init__(self) -> None:
        for name in ("t", "h", "w", "n"):
            object.__setattr__(self, name, _check_size(getattr(self, name), name, "VideoAudio"))
        _check_total(self.t * self.h * self.w + self.n + 4, f"VideoAudio({self.t}, {self.h}, {self.w}, {self.n})",
                     "`t` × `h` × `w` + `n` + 4")
        object.__setattr__(self, "interval", _check_interval(self.interval, "VideoAudio"))
        if not isinstance(self.order, str) or self.order not in INTERLEAVINGS:
            raise ValueError(f"VideoAudio: `order` must be 'chunks' (Qwen2.5-Omni: 2-second chunks, video then audio) "
                             f"or 'time' (Qwen3-Omni: merged by time), got {self.order!r}")
        if self.order == "time":
            if self.chunk is not None:
                raise ValueError(f"VideoAudio: `chunk` is for order='chunks' (Qwen2.5-Omni); order='time' merges "
                                 f"by time and takes no chunk, got chunk={self.chunk!r}")
        else:
            chunk = 50 if self.chunk is None else _check_size(self.chunk, "chunk", "VideoAudio")
            object.__setattr__(self, "chunk", chunk)

    @property
    def num_tokens(self) -> int:
        return self.t * self.h * self.w + self.n + 4

    kind = VIDEO  # its token_types() are per token: markers TEXT, video VIDEO, audio AUDIO

    def __str__(self) -> str:
        tail = "" if self.interval == 1.0 else f"@{_format_float(self.interval)}"
        order = "time" if self.order == "time" else f"chunks{self.chunk}"
        return f"V{self.t}x{self.h}x{self.w}{tail}+A{self.n}:{order}"

    def frame_times(self) -> "list[float]":
        """Time of each frame in positions, ``f · interval`` (float64)."""
        return [f * self.interval for f in range(self.t)]

    def interleave(self, frame_times: "Sequence[float] | None" = None) -> "tuple[torch.Tensor, torch.Tensor, int]":
        """The order of the video and audio tokens (markers excluded).

        Returns ``(is_audio, index, last)``: per token (``t·h·w + n``, in order) whether it is audio and its
        index in the video (raster order) or the audio; and where the last piece transformers appends starts
        (its end markers follow that piece's largest position). ``frame_times`` (nondecreasing) replace
        :meth:`frame_times`: a design checks with its own times that the order is the one it places."""
        check_token_count(self.num_tokens, f"VideoAudio.interleave ({self})")
        times = self.frame_times() if frame_times is None else list(frame_times)
        m, video = self.h * self.w, self.t * self.h * self.w
        if self.order == "time":
            audio_at = torch.arange(self.n, dtype=torch.float64)
            frame_t = torch.tensor(times, dtype=torch.float64)
            # audio tokens before frame f: those earlier than its time (a frame goes first at equal times)
            before = torch.searchsorted(audio_at, frame_t, side="left")
            video_slots = before.repeat_interleave(m) + torch.arange(video)  # video and audio tokens before it
            is_audio = torch.ones(video + self.n, dtype=torch.bool)
            is_audio[video_slots] = False
            index = torch.empty(video + self.n, dtype=torch.int64)
            index[video_slots] = torch.arange(video)
            index[is_audio] = torch.arange(self.n)
            kinds = is_audio.to(torch.int8)
            change = torch.nonzero(kinds[1:] != kinds[:-1]).flatten()
            last = int(change[-1]) + 1 if change.numel() else 0
            return is_audio, index, last
        video_chunks = _chunk_runs(times, m, self.chunk)
        audio_chunks = [(a, min(a + self.chunk, self.n)) for a in range(0, self.n, self.chunk)]
        is_audio, index, start = [], [], 0
        for j in range(max(len(video_chunks), len(audio_chunks))):
            for audio, chunks in ((False, video_chunks), (True, audio_chunks)):
                if j < len(chunks):
                    a, b = chunks[j]
                    start = len(index)
                    is_audio.extend([audio] * (b - a))
                    index.extend(range(a, b))
        return torch.tensor(is_audio, dtype=torch.bool), torch.tensor(index, dtype=torch.int64), start

    def token_types(self) -> torch.Tensor:
        """Per-token modality code: markers text (0), video tokens video (2), audio tokens audio (4)."""
        is_audio = self.interleave()[0]
        inner = torch.where(is_audio, AUDIO, VIDEO)
        marks = torch.full((2,), TEXT, dtype=torch.long)
        return torch.cat([marks, inner.to(torch.long), marks])


def _chunk_runs(times: "Sequence[float]", run: int, chunk: int) -> "list[tuple[int, int]]":
    """transformers' chunking of nondecreasing token times (frame ``f``'s ``run`` tokens all at ``times[f]``)
    into ``[start, end)`` pieces: a token whose time is at least ``c · chunk`` (``c`` counting from 1, one step per
    token that opens a piece) opens the next piece."""
    cuts, c = [], 1
    for f, time in enumerate(times):
        k = 0
        while k < run and time >= c * chunk:
            cuts.append(f * run + k)
            k, c = k + 1, c + 1
    bounds = [0, *cuts, len(times) * run]
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


@dataclass(frozen=True)
class Grid:
    """An N-D grid of tokens (ViT patches, volumes), row-major over ``sizes``."""

    sizes: tuple

    def __init__(self, *sizes: int) -> None:
        if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
            sizes = tuple(sizes[0])
        if not sizes:
            raise ValueError("Grid: give at least one size, e.g. Grid(14, 14)")
        checked = tuple(_check_size(s, f"sizes[{i}]", "Grid") for i, s in enumerate(sizes))
        _check_total(math.prod(checked), f"Grid: sizes {checked}", "the product of `sizes`")
        object.__setattr__(self, "sizes", checked)

    @property
    def num_tokens(self) -> int:
        return math.prod(self.sizes)

    kind = GRID

    def __str__(self) -> str:
        return "G" + "x".join(str(s) for s in self.sizes)


Segment = Union[Text, Image, Video, Audio, VideoAudio, Grid]
_SEGMENTS = (Text, Image, Video, Audio, VideoAudio, Grid)

# re.ASCII: \d is 0-9 only (by default it matches any Unicode decimal digit, which int() reads: 'T３' was T3)
_TOKEN = re.compile(r"^(?:T(\d+)|I(\d+)x(\d+)|V(\d+)x(\d+)x(\d+)(?:@([0-9.eE+-]+))?|G(\d+(?:x\d+)*)"
                    r"|A(\d+)(?:@([0-9.eE+-]+))?)$", re.ASCII)


_VIDEO_AUDIO = re.compile(r"^V(\d+)x(\d+)x(\d+)(?:@([0-9.eE+-]+))?\+A(\d+)(?::(?:(time)|chunks(\d+)?))?$", re.ASCII)


def _parse_video_audio(tok: str) -> "VideoAudio":
    m = _VIDEO_AUDIO.match(tok)
    missing = m is not None and m.group(6) is None and m.group(7) is None and not tok.endswith(":chunks")
    if m is None or missing:
        why = ("it has no order after ':', which is required as the families interleave differently" if missing
               else "cannot read it")
        raise ValueError(
            f"Layout.parse: segment {tok!r}: {why}; a video with its audio interleaved is written "
            f"V{{t}}x{{h}}x{{w}}[@interval]+A{{n}}:chunks[{{positions per chunk}}] (Qwen2.5-Omni, e.g. "
            f"'V4x2x2@25+A100:chunks50') or V{{t}}x{{h}}x{{w}}[@interval]+A{{n}}:time (Qwen3-Omni)"
        )
    t, h, w, iv, n, time, chunk = m.groups()
    interval = 1.0 if iv is None else _parse_interval(iv, tok, example="V4x2x2@25+A100:time")
    if time is not None:
        return VideoAudio(int(t), int(h), int(w), int(n), "time", interval)
    return VideoAudio(int(t), int(h), int(w), int(n), "chunks", interval, None if chunk is None else int(chunk))


def _check_ascii_digits(tok: str) -> None:
    """Refuse a segment with digits other than 0-9 (full-width ``３``, Arabic-Indic ``٣``, ...), naming the digit
    and the segment written with ASCII digits."""
    odd = [c for c in tok if c.isdigit() and not c.isascii()]
    if odd:
        fixed = "".join(str(unicodedata.digit(c)) if c in odd and unicodedata.digit(c, None) is not None else c
                        for c in tok)
        raise ValueError(
            f"Layout.parse: segment {tok!r} holds the non-ASCII digit {odd[0]!r} "
            f"({unicodedata.name(odd[0], f'U+{ord(odd[0]):04X}')}); write sizes with the ASCII digits 0-9"
            + (f", e.g. {fixed!r}" if fixed != tok and fixed.isascii() else "")
        )


def _parse_segment(tok: str) -> Segment:
    _check_ascii_digits(tok)
    if "+A" in tok and tok.startswith("V"):
        return _parse_video_audio(tok)
    m = _TOKEN.match(tok)
    if m is None:
        raise ValueError(
            f"Layout.parse: cannot read segment {tok!r}; use T{{n}} (text), I{{h}}x{{w}} (image), "
            f"V{{t}}x{{h}}x{{w}}[@interval] (video), A{{n}}[@seconds] (audio), "
            f"V{{t}}x{{h}}x{{w}}[@interval]+A{{n}}:time or :chunks{{c}} (video with its audio interleaved) "
            f"or G{{a}}x{{b}}[x...] (N-D grid), "
            f"e.g. 'T3 I4x4 T2'"
        )
    g = m.groups()
    if g[8] is not None:
        seconds = AUDIO_SECONDS if g[9] is None else _parse_interval(g[9], tok, "seconds per token", "A50@0.02")
        return Audio(int(g[8]), seconds)
    if g[0] is not None:
        return Text(int(g[0]))
    if g[1] is not None:
        return Image(int(g[1]), int(g[2]))
    if g[3] is not None:
        return Video(int(g[3]), int(g[4]), int(g[5]), _parse_interval(g[6], tok) if g[6] is not None else 1.0)
    return Grid(*(int(s) for s in g[7].split("x")))


def _parse_interval(text: str, tok: str, what: str = "interval", example: str = "V8x3x3@2.5") -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(
            f"Layout.parse: segment {tok!r} has {what} {text!r}, which is not a number; "
            f"write the {what} after '@' as a decimal number, e.g. {example!r} or '{example.split('@')[0]}@1e-3'"
        ) from None


@dataclass(frozen=True)
class Layout:
    """An ordered multimodal sequence of segments (hashable, so designs can cache on it)."""

    segments: tuple

    def __init__(self, segments: Iterable[Segment]) -> None:
        segs = tuple(segments)
        if not segs:
            raise ValueError("Layout: a layout needs at least one segment, e.g. Layout.parse('T3 I4x4 T2')")
        for i, s in enumerate(segs):
            if not isinstance(s, _SEGMENTS):
                raise TypeError(
                    f"Layout: segments[{i}] is a {type(s).__name__}; use ropekit.Text, Image, Video, Audio, "
                    f"VideoAudio or Grid"
                )
        _check_total(sum(s.num_tokens for s in segs), "Layout")
        object.__setattr__(self, "segments", segs)

    @classmethod
    def parse(cls, text: str) -> "Layout":
        """Read the compact form, e.g. ``"T3 I4x4 T2"``, ``"T5 V8x3x3 T1"`` or ``"T2 A50@0.04 T1"``."""
        if not isinstance(text, str):
            raise TypeError(f"Layout.parse: `text` must be a str, got {type(text).__name__}")
        toks = text.replace(",", " ").split()
        if not toks:
            raise ValueError("Layout.parse: empty layout string; give e.g. 'T3 I4x4 T2'")
        return cls(_parse_segment(t) for t in toks)

    @classmethod
    def coerce(cls, layout: "Layout | str | Iterable[Segment]") -> "Layout":
        """Accept a Layout, its string form, or a sequence of segments."""
        if isinstance(layout, Layout):
            return layout
        if isinstance(layout, str):
            return cls.parse(layout)
        if isinstance(layout, _SEGMENTS):
            return cls([layout])
        try:
            return cls(layout)
        except TypeError as e:
            if "segments[" in str(e):
                raise
            raise TypeError(
                f"`layout` must be a ropekit.Layout, a string like 'T3 I4x4 T2' or a list of segments, "
                f"got {type(layout).__name__}"
            ) from None

    def __str__(self) -> str:
        return " ".join(str(s) for s in self.segments)

    def __repr__(self) -> str:
        return f"Layout({str(self)!r})"

    def __len__(self) -> int:
        return self.num_tokens

    def __iter__(self):
        return iter(self.segments)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.segments)

    def token_types(self) -> torch.Tensor:
        """Per-token modality code (text 0, image 1, video 2, grid 3, audio 4), shape ``(L,)``; a ``VideoAudio``
        segment's markers are text, its video and audio tokens video and audio, in its order."""
        check_token_count(self.num_tokens, "Layout.token_types")
        return torch.cat([s.token_types() if isinstance(s, VideoAudio)
                          else torch.full((s.num_tokens,), s.kind, dtype=torch.long) for s in self.segments])
