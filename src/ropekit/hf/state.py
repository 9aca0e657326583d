"""Placement for a patched model: the position tensor of a batch, and where the text after it goes.

A patched model's positions are data. :func:`place` turns what the processor returns (token types, grids,
attention mask) into one tensor ``(R, B, L)``: row 0 the 1-D text position of every token (what transformers
builds its attention masks and packed-sequence boundaries from), then the rows of every geometry in the order
of :attr:`_State.geometries` (with an AGE schedule, one block of rows per design). The forward takes that
tensor as ``position_ids`` and applies it unchanged. Where the text that follows a prompt goes (every
design continues a text run by one step on every axis) is a :class:`Continuation`, which the patch keeps
with the KV cache the prompt filled, so a cached step of one request never reads another request's positions.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from ..designs.registry import positions
from ..index import rope_index
from ..layout import AUDIO, Audio, Image, Layout, Text, Video, VideoAudio
from ..rotations.scaling import scale_frequencies
from .adapters import Adapter



@dataclass
class _Geometry:
    """One position design with its options and frequency matrix ``W (A, D/2)``."""

    design: str
    options: dict
    allocation: str
    W: torch.Tensor
    scaling: Any = None  # a ropekit Scaling whose frequencies follow the sequence length (dynamic, longrope)
    dim: int = 0  # rotary channels W's spectrum comes from
    base: float = 10000.0
    copies: dict = field(default_factory=dict, repr=False, compare=False)  # device -> W there (see on())

    def on(self, device) -> torch.Tensor:
        """``W`` on ``device``, copied there once and kept (a constant of the patch, like the model's weights): a
        decoding step on an accelerator copies no frequencies to it."""
        W = self.copies.get(device)
        if W is None:
            W = self.copies[device] = self.W.to(device)
        return W


@dataclass
class _Prompt:
    """A prompt as placed (un-expanded batch)."""

    types: torch.Tensor  # (B, L) token types as placed, on the CPU
    mask: Optional[torch.Tensor]  # (B, L) 0/1 on the CPU, or None
    grids: tuple  # (image_grid_thw, video_grid_thw, second_per_grid_ts) as placed
    counts: torch.Tensor  # (B,) valid prompt tokens, on the CPU
    #: families whose prompt plans what the model generates (Adapter.plan_tokens): per sample, (segments of its valid
    #: tokens up to where the generated part begins, the segments generated from there); None for the others
    plan: Optional[list] = None


@dataclass
class Continuation:
    """Where the text after a placed prompt goes, kept with the KV cache that prompt filled.

    Text token ``j`` after the prompt (``j = 0`` the first) sits at ``start + j`` on every geometry row. Where the
    prompt plans what the model generates after it (GLM-Image's image), token ``j`` of the ``planned[b]`` first
    takes ``plan[:, b, j]``, and the text after them starts at ``start``.
    """

    start: torch.Tensor  # (R - 1, B) float32: every geometry row's position of the first text token after it
    counts: torch.Tensor  # (B,) valid tokens of the prompt
    length: int  # the prompt's padded length
    plan: Optional[torch.Tensor] = None  # (R - 1, B, P) float32: the planned tokens' positions, in order; or None
    planned: Optional[torch.Tensor] = None  # (B,) long: how many of plan's columns each sample takes


@dataclass
class _State:
    """Everything a patched model needs between its hooks (kept on the bare model instance)."""

    adapter: Adapter
    geometries: dict[str, _Geometry]
    layer_geometry: list[str]
    scaling: float
    merge: int
    tokens_per_second: Optional[float]
    image_token_id: Optional[int]
    video_token_id: Optional[int]
    temporal_merge: int = 1  # video grid steps per token step (ERNIE-4.5-VL's temporal_merge_size)
    layout: str = "half"  # the model's cos/sin layout of a frequency pair (Adapter.pair_layout)
    float32_tables: bool = False  # hand the layers float32 cos/sin whatever the activations' dtype
    complex_tables: bool = False  # the rotary returns e^{i theta} per pair (Adapter.complex_tables)
    vision_ids: dict = field(default_factory=dict)  # device -> tensor of the image/video token ids
    #: a record for inspection (:func:`ropekit.hf.last_positions`): each geometry's positions in the last eager
    #: forward; written by the rotary, never read by a forward
    observed: dict[str, torch.Tensor] = field(default_factory=dict)
    seen: dict[tuple, tuple[int, torch.Tensor]] = field(default_factory=dict)  # dynamic NTK: (length, W) per table
    # families whose text model has several rotary tables (Adapter.rope_variants): key -> (geometries with that
    # table's frequencies, its attention factor); empty: ``geometries`` and ``scaling`` serve every layer
    variants: dict[str, tuple[dict[str, _Geometry], float]] = field(default_factory=dict)
    audio_token_id: Optional[int] = None  # the audio token, marked (AUDIO) only where a video's audio is interleaved
    interleave: Optional[tuple] = None  # (order, chunk) of a VideoAudio block (Adapter.interleave), or None
    origin: float = 0.0  # the model's first 1-D position (Adapter.position_origin), added to every design's
    #: ids of the marker tokens placed off the diagonal (Adapter.markers: MiniCPM-V 4.7's <image>, </image>,
    #: <slice>, </slice>, newline); typed MARKER + their index, and the prompt placed per sample from them
    markers: Optional[tuple] = None
    counts_padding: bool = False  # a row's leading padding shifts its positions (Adapter.counts_padding)
    #: families typed by their ids alone (no mm_token_type_ids: the Omni thinkers): the token that opens a vision
    #: block, after which the model reads an image or video token as one (see :func:`stray_vision_as_text`)
    vision_start_token_id: Optional[int] = None
    #: families whose prompt plans the positions of what the model generates (Adapter.plan_tokens: GLM-Image's
    #: <image_start> and <image_end> ids); None for the others
    plan_tokens: Optional[tuple] = None

    #: ``(geometry, axes)`` of the position tensor's rows after the text row, in order
    rows: tuple = field(init=False, repr=False)
    #: rows of the position tensor: the text row plus every geometry's axes
    num_rows: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # the geometries are fixed when the patch is made: the row layout is worked out once, not per forward
        self.rows = tuple((name, int(geo.W.shape[0])) for name, geo in self.geometries.items())
        self.num_rows = 1 + sum(a for _, a in self.rows)

    def split(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """The geometry rows ``(R - 1, B, L)`` of a position tensor, by geometry."""
        out, at = {}, 0
        for name, axes in self.rows:
            out[name] = rows[at:at + axes]
            at += axes
        return out


def rotary(state: _State, key: Optional[str]) -> tuple[dict[str, _Geometry], float]:
    """(geometries, attention factor) of the rotary table ``key`` (None: the model's one table)."""
    if not state.variants:
        return state.geometries, state.scaling
    if key not in state.variants:
        raise ValueError(
            f"patched model: the rotary was asked for table {key!r}, but the patch built {sorted(state.variants)} "
            f"from the model config; this call path is not supported by ropekit's patch (please report it)"
        )
    return state.variants[key]


# --------------------------------------------------------------------------------------------------
# token types


#: the type of marker token ``k`` of :attr:`_State.markers` is ``MARKER + k`` (text to every design's layout)
MARKER = 5
IMAGE_START, IMAGE_END, SLICE_START, SLICE_END, NEWLINE = range(MARKER, MARKER + 5)


def token_types(state: _State, input_ids, mm_token_type_ids, batch: int, length: int, device,
                audio: bool = False) -> torch.Tensor:
    """:func:`_token_types`, with the text tokens that are markers (:attr:`_State.markers`) typed ``MARKER + k``."""
    types = _token_types(state, input_ids, mm_token_type_ids, batch, length, device, audio)
    if state.markers is None or input_ids is None:
        return types
    for k, token in enumerate(state.markers):
        types = types.masked_fill((types == 0) & (input_ids.to(types.device) == token), MARKER + k)
    return types


def _token_types(state: _State, input_ids, mm_token_type_ids, batch: int, length: int, device,
                 audio: bool = False) -> torch.Tensor:
    """Token types (text 0, image 1, video 2): ``mm_token_type_ids``, else read off the vision token ids.
    ``audio`` (a video's audio interleaved with its frames) also marks the audio tokens (4, ``AUDIO``), which
    the prompt is then placed from (:func:`_place_interleaved`)."""
    if mm_token_type_ids is not None:
        return mm_token_type_ids.to(device=device, dtype=torch.long)
    if input_ids is not None:
        types = torch.zeros_like(input_ids, dtype=torch.long)
        if state.image_token_id is not None:
            types = types.masked_fill(input_ids == state.image_token_id, 1)
        if state.video_token_id is not None:
            types = types.masked_fill(input_ids == state.video_token_id, 2)
        if audio and state.audio_token_id is not None:
            types = types.masked_fill(input_ids == state.audio_token_id, AUDIO)
        return types
    return torch.zeros(batch, length, dtype=torch.long, device=device)


def stray_vision_as_text(state: _State, types: torch.Tensor, input_ids: Optional[torch.Tensor],
                         grids: tuple) -> torch.Tensor:
    """Types read off the ids of a family typed by its ids alone (:attr:`_State.vision_start_token_id`), with the
    image (video) tokens made text when no image (video) grids are given and none of them opens a vision block.

    transformers' position code of those families counts an image or video by the token right after a vision-start
    token; elsewhere the token id is text to it (the model's feature check then counts only the images and videos
    it is given). A lone video token id in a text-only prompt is thus text, as here. Where such a token does follow
    a vision-start token, the types stay as read, and the missing grids are refused further on (the stock model
    fails there too)."""
    start = state.vision_start_token_id
    if start is None or input_ids is None:
        return types
    opens = torch.zeros_like(types, dtype=torch.bool)
    opens[:, 1:] = input_ids[:, :-1].to(types.device) == start
    for kind, grid in ((1, grids[0]), (2, grids[1])):
        is_kind = types == kind
        if grid is None and bool(is_kind.any()) and not bool((is_kind & opens).any()):
            types = types.masked_fill(is_kind, 0)
    return types


def _visible_grids(state: _State, types: torch.Tensor, mask: Optional[torch.Tensor], grids: tuple) -> tuple:
    """The grid rows of the vision tokens the attention mask keeps, as transformers consumes them.

    transformers places only unmasked tokens and takes grid rows in order as it meets vision blocks, so
    rows of images hidden by the mask are left over at the end. When tokens of a kind are hidden, the
    rows past those the visible tokens fill are dropped; otherwise the grids are used as given (and a
    mismatch is an error further down).
    """
    if mask is None:
        return grids
    images, videos, seconds = grids
    out = []
    for kind, g in ((1, images), (2, videos)):
        is_kind = types == kind
        hidden = bool((is_kind & (mask == 0)).any())
        if g is None or not hidden:
            out.append(g)
            continue
        g = torch.as_tensor(g)
        placed = g if not state.adapter.newline_column else state.adapter.placed_grids(
            g, None, state.merge)[0]  # a newline token per merged row counts too
        tokens = placed.prod(dim=1) // (state.merge ** 2) if kind == 1 else state.adapter.video_tokens(
            placed, state.merge, state.temporal_merge)
        visible = int((is_kind & (mask != 0)).sum())
        used = int((tokens.cumsum(0) <= visible).sum())
        out.append(g[:used])
        if kind == 2 and seconds is not None:
            seconds = torch.as_tensor(seconds)[:used]
    return out[0], out[1], seconds


def _visible_items(state: _State, types: torch.Tensor, mask: Optional[torch.Tensor], grids: tuple) -> tuple:
    """1-D families: (types, grids) without the images and videos the attention mask hides.

    Their models fill every image token with its features whatever the mask, and the grids come from those tokens
    in batch-row order (the adapter's ``vision_inputs``). An image (video) whose tokens are all under mask 0 is
    padding: its grid is dropped and its tokens are skipped with the rest of the hidden tokens. One that is partly
    hidden is no grid the design can place; where every design of the patch places a grid's tokens as it places
    text (``vanilla``), its visible tokens are text, with the positions stock gives them; otherwise it is refused."""
    if mask is None:
        return types, grids
    out = []
    for kind, g in ((1, grids[0]), (2, grids[1])):
        is_kind = types == kind
        if g is None or not bool((is_kind & (mask == 0)).any()):
            out.append(g)
            continue
        g = torch.as_tensor(g)
        tokens = g.prod(dim=1) // (state.merge ** 2) if kind == 1 else state.adapter.video_tokens(
            g, state.merge, state.temporal_merge)
        where = is_kind.reshape(-1).nonzero().squeeze(1)  # the tokens of this kind, in batch-row order
        if int(tokens.sum()) != where.numel():
            out.append(g)  # the grids do not describe these tokens: refused further on
            continue
        visible = mask.reshape(-1)[where] != 0
        keep, flat = [], types.reshape(-1).clone()
        for i, (lo, n) in enumerate(zip((tokens.cumsum(0) - tokens).tolist(), tokens.tolist())):
            seen = int(visible[lo:lo + n].sum())
            if seen == n:
                keep.append(i)
                continue
            if seen:
                t, h, w = (int(v) for v in g[i])
                if not places_grids_as_text(state, (t, h // state.merge, w // state.merge)):
                    what = "image" if kind == 1 else "video"
                    b, at = divmod(int(where[lo]), types.shape[1])
                    raise ValueError(
                        f"patched model: {what} {i} (row {b}, from token {at}) is partly under attention_mask 0 "
                        f"({seen} of its {n} tokens kept); the model fills all its tokens with features whatever "
                        f"the mask, but the design places a {what} as a whole grid and cannot place part of one. "
                        f"Mask whole {what}s or none (left padding, as processors pad, never cuts one)"
                    )
            flat[where[lo:lo + n]] = 0  # a dropped or partly hidden one: padding and text
        types = flat.reshape(types.shape)
        out.append(g[keep])
    seconds = grids[2]
    return types, (out[0], out[1], seconds)


def places_grids_as_text(state: _State, tokens: tuple = (1, 2, 2)) -> bool:
    """Whether every design of the patch gives a block of ``(t, h, w)`` tokens (by default one image of 2 × 2) the
    positions it gives as many text tokens (``vanilla``)."""
    t, h, w = tokens
    block, text = Layout([Image(h, w)] * t), Layout([Text(t * h * w)])
    return all(torch.equal(positions(block, geo.design, **geo.options), positions(text, geo.design, **geo.options))
               for geo in state.geometries.values())


# --------------------------------------------------------------------------------------------------
# the prompt


def _place(state: _State, prompt: _Prompt, extra: int) -> dict[str, torch.Tensor]:
    """Each geometry's positions ``(A, B, L + extra)`` of the prompt followed by ``extra`` text tokens."""
    types, mask = prompt.types, prompt.mask
    if bool((types == AUDIO).any()):
        return _place_interleaved(state, prompt, extra)
    if state.markers is not None:
        return _place_canvas(state, prompt, extra)
    if prompt.plan is not None:
        if extra:
            raise ValueError("patched model: a planned prompt is placed with its continuation (place)")
        return _place_planned(state, prompt)[0]
    batch = types.shape[0]
    ext_types = torch.cat([types, types.new_zeros(batch, extra)], dim=1)
    ext_mask = None if mask is None else torch.cat([mask, mask.new_ones(batch, extra)], dim=1)
    image_grid_thw, video_grid_thw, seconds = prompt.grids
    image_grid_thw, video_grid_thw = state.adapter.placed_grids(image_grid_thw, video_grid_thw, state.merge,
                                                                state.temporal_merge)
    timing = {}
    if state.tokens_per_second is not None:
        timing = dict(tokens_per_second=state.tokens_per_second, second_per_grid_ts=seconds)
    out = {}
    for name, geo in state.geometries.items():
        try:
            out[name], _ = rope_index(
                None, ext_types, image_grid_thw, video_grid_thw, ext_mask, design=name,
                spatial_merge_size=state.merge, **timing, **geo.options,
            )
        except ValueError as e:
            raise ValueError(f"patched model (design {name!r}): {e}") from None
        if state.origin:
            out[name] = out[name] + state.origin
        out[name] = _padding_shift(state, out[name], ext_mask)
    return out


def _interleaved_layouts(state: _State, prompt: _Prompt, extra: int) -> list:
    """Per sample, the layout of its valid tokens followed by ``extra`` text tokens, where a run of video and
    audio tokens (types 2 and 4) is a ``VideoAudio`` block with the two text tokens on each side as its markers,
    a run of audio tokens alone is audio, and images and videos take their grid rows in order."""
    if state.interleave is None:
        raise ValueError(f"patched model: {state.adapter.name} defines no interleaving of a video's audio track")
    order, chunk = state.interleave
    images, videos, seconds = prompt.grids
    images, videos = state.adapter.placed_grids(images, videos, state.merge, state.temporal_merge)
    image_rows = iter([] if images is None else torch.as_tensor(images).tolist())
    video_rows = iter([] if videos is None else torch.as_tensor(videos).tolist())
    second_rows = iter([] if seconds is None else torch.as_tensor(seconds).double().reshape(-1).tolist())
    merge, rate = state.merge, state.tokens_per_second
    out = []
    for b in range(prompt.types.shape[0]):
        row = prompt.types[b] if prompt.mask is None else prompt.types[b][prompt.mask[b] != 0]
        merged = torch.where(row == AUDIO, torch.full_like(row, 2), row)  # one run for a video and its audio
        kinds, lengths = torch.unique_consecutive(merged, return_counts=True)
        segs, at, ends = [], 0, 0  # ends: end tokens of the last block still to take from the text after it
        for kind, n in zip(kinds.tolist(), lengths.tolist()):
            run = row[at: at + n]
            at += n
            if ends and (kind != 0 or n < ends):
                break
            if kind == 0:
                n, ends = n - ends, 0
                if n:
                    segs.append(Text(n))
            elif kind == 1:
                _, h, w = next(image_rows, (None, None, None))
                if h is None or (h // merge) * (w // merge) != n:
                    raise ValueError(f"patched model: sample {b}: an image run of {n} tokens does not match the "
                                     f"next row of image_grid_thw")
                segs.append(Image(h // merge, w // merge))
            elif not bool((run == AUDIO).any()):
                raise ValueError(
                    f"patched model: sample {b} holds a video without audio tokens while use_audio_in_video=True; "
                    f"the family's position code then pairs it with another audio (transformers misplaces it): "
                    f"give every video its audio, or use_audio_in_video=False")
            elif bool((run == 2).any()):
                t, h, w = next(video_rows, (None, None, None))
                sec = next(second_rows, None)
                if t is None or sec is None:
                    raise ValueError(f"patched model: sample {b}: a video with its audio has no row of "
                                     f"video_grid_thw / video_second_per_grid left")
                seg = VideoAudio(t, h // merge, w // merge, int((run == AUDIO).sum()), order, rate * sec,
                                 chunk if order == "chunks" else None)
                before = segs[-1] if segs else None
                if seg.num_tokens - 4 != n or not isinstance(before, Text) or before.n < 2:
                    raise ValueError(f"patched model: sample {b}: a run of {n} video and audio tokens does not "
                                     f"fill {seg} between two start and two end tokens")
                if not torch.equal(seg.token_types()[2:-2], run):
                    raise ValueError(
                        f"patched model: sample {b}: the video and audio tokens are not in {seg}'s order (the "
                        f"processor's, {order!r}); ropekit places only that order")
                segs[-1:] = [Text(before.n - 2)] if before.n > 2 else []
                segs.append(seg)
                ends = 2
            else:
                segs.append(Audio(n))
        if ends:
            raise ValueError(f"patched model: sample {b}: a video with its audio is not followed by its two end "
                             f"tokens")
        if extra:
            segs.append(Text(extra))
        out.append(Layout(_merge_text(segs)) if segs else None)
    return out


def _merge_text(segs: list) -> list:
    out = []
    for seg in segs:
        if isinstance(seg, Text) and out and isinstance(out[-1], Text):
            out[-1] = Text(out[-1].n + seg.n)
        else:
            out.append(seg)
    return out


def _place_interleaved(state: _State, prompt: _Prompt, extra: int) -> dict[str, torch.Tensor]:
    """:func:`_place` for a prompt holding videos with their audio interleaved (audio tokens typed 4): one
    :func:`ropekit.positions` call per sample layout (``rope_index`` takes no audio type)."""
    layouts = _interleaved_layouts(state, prompt, extra)
    out, valid = _place_layouts(state, prompt, extra, [(lay, {}) for lay in layouts])
    for name in out:
        if state.origin:
            out[name] = out[name] + state.origin
        out[name] = _padding_shift(state, out[name], None if prompt.mask is None else valid.long())
    return out


def _place_planned(state: _State, prompt: _Prompt) -> tuple:
    """:func:`_place` for a family whose prompt plans what the model generates (:attr:`_Prompt.plan`): each
    sample's layout is its segments, the planned ones, then text, placed by one :func:`ropekit.positions` call.

    Returns, per geometry, the positions ``(A, B, L)`` of the sequence, ``(A, B)`` of the first text token after it
    and after what is planned, ``(A, B, P)`` of the planned tokens still to come (the given sequence may already hold
    some: a forward over generated tokens), and ``(B,)`` how many of those each sample has."""
    batch, length = prompt.types.shape
    valid = torch.ones(batch, length, dtype=torch.bool) if prompt.mask is None else prompt.mask != 0
    counts = valid.sum(-1).tolist()
    shift = state.adapter.counts_padding_without_images and prompt.grids[0] is None
    leading = (valid.long().cumsum(-1) == 0).sum(-1).float() if shift else torch.zeros(batch)
    layouts, rest = [], []
    for (segs, planned), n in zip(prompt.plan, counts):
        given, coming = sum(s.num_tokens for s in segs), sum(s.num_tokens for s in planned)
        tail = max(n - given - coming, 0) + 1  # the text after the plan, up to one token past the sequence
        layouts.append(Layout(_merge_text(list(segs) + list(planned) + [Text(tail)])))
        rest.append(given + coming + tail - 1 - n)
    most = max(rest, default=0)
    out, starts, plans = {}, {}, {}
    for name, geo in state.geometries.items():
        placed = []
        for lay in layouts:
            try:
                placed.append(positions(lay, geo.design, **geo.options))
            except ValueError as e:
                raise ValueError(f"patched model (design {name!r}): {e}") from None
        axes = placed[0].shape[1]
        pos = torch.zeros(axes, batch, length)
        start, plan = torch.zeros(axes, batch), torch.zeros(axes, batch, most)
        for b, (p, n, r) in enumerate(zip(placed, counts, rest)):
            p = p.float() + (state.origin + leading[b])
            pos[:, b, valid[b]] = p[:n].T
            plan[:, b, :r] = p[n:n + r].T
            start[:, b] = p[-1]
        out[name], starts[name], plans[name] = pos, start, plan
    return out, starts, plans, torch.tensor(rest, dtype=torch.long)


def _padding_shift(state: _State, pos: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """``pos`` ``(A, B, L)`` with each row's valid tokens shifted by the padding before its first valid token, on
    families whose stock model counts padding (:attr:`~ropekit.hf.adapters.Adapter.counts_padding`); padding
    stays at 0."""
    if not state.counts_padding or mask is None:
        return pos
    valid = mask != 0
    leading = (valid.long().cumsum(-1) == 0).sum(-1).to(pos.dtype)  # (B,)
    return torch.where(valid[None], pos + leading[None, :, None], pos)


def _canvas_layouts(state: _State, prompt: _Prompt, extra: int) -> list:
    """Per sample, ``(layout, canvas options)`` of its valid tokens followed by ``extra`` text tokens, read off the
    marker types as MiniCPM-V 4.7's processor writes them: every run of image (video) tokens is one crop, taking the
    next row of the image (video) grids; a crop right after ``<slice>`` is a slice of the open frame, any other
    crop a thumbnail opening a frame; a frame's slices form as many rows as newlines separate them, plus one; the
    markers right after a frame's last crop close it (the first) and trail it (the rest). Markers are text in the
    layout; ``canvas-mrope`` reads them with ``markers=True`` and these ``slices`` and ``trailing``."""
    images, videos, _ = prompt.grids
    rows = {1: iter([] if images is None else torch.as_tensor(images).tolist()),
            2: iter([] if videos is None else torch.as_tensor(videos).tolist())}
    out = []
    for b in range(prompt.types.shape[0]):
        row = prompt.types[b] if prompt.mask is None else prompt.types[b][prompt.mask[b] != 0]
        codes = row.tolist()
        segs, frames, at, text = [], [], 0, 0  # frames: [slice count, newlines between slices, trailing]
        kinds, lengths = torch.unique_consecutive((row == 1).long() + 2 * (row == 2).long(), return_counts=True)
        for kind, n in zip(kinds.tolist(), lengths.tolist()):
            if kind == 0:
                text += n
                at += n
                continue
            grid = next(rows[kind], None)
            if grid is None or (grid[1] // state.merge) * (grid[2] // state.merge) != n:
                name = "image" if kind == 1 else "video"
                raise ValueError(f"patched model: sample {b}: a run of {n} {name} tokens does not match the next "
                                 f"{name} crop size (target_sizes{'' if kind == 1 else '_videos'})")
            if frames and at and codes[at - 1] == SLICE_START:
                frames[-1][0] += 1
                frames[-1][1] += sum(c == NEWLINE for c in codes[at - text:at])
            else:
                frames.append([0, 0, 0])
            if text:
                segs.append(Text(text))
            h, w = grid[1] // state.merge, grid[2] // state.merge
            segs.append(Image(h, w) if kind == 1 else Video(1, h, w))
            at, text = at + n, 0
            closing = 0
            while at + closing < len(codes) and codes[at + closing] >= MARKER:
                closing += 1
            frames[-1][2] = max(closing - 1, 0)
        if text + extra:
            segs.append(Text(text + extra))
        slices = []
        for f, (count, breaks, _) in enumerate(frames):
            if count and count % (breaks + 1):
                raise ValueError(f"patched model: sample {b}: frame {f} has {count} slices in {breaks + 1} rows; "
                                 f"MiniCPM-V's processor writes rows of equal length")
            slices.append((breaks + 1, count // (breaks + 1)) if count else (0, 0))
        out.append((Layout(segs) if segs else None, dict(markers=True, slices=slices,
                                                         trailing=[fr[2] for fr in frames])))
    return out


def _place_canvas(state: _State, prompt: _Prompt, extra: int) -> dict[str, torch.Tensor]:
    """:func:`_place` for a family with markers: one :func:`ropekit.positions` call per sample layout (its crops
    and text, markers included as text); ``canvas-mrope`` also reads the markers and slices
    (:func:`_canvas_layouts`), the family's own position code."""
    return _place_layouts(state, prompt, extra, _canvas_layouts(state, prompt, extra))[0]


def _place_layouts(state: _State, prompt: _Prompt, extra: int,
                   layouts: list) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Each geometry's ``(A, B, L + extra)`` positions from one :func:`ropekit.positions` call per sample:
    ``layouts`` holds ``(layout or None, canvas options)`` per sample (the options go to ``canvas-mrope`` only), a
    sample's positions fill its unmasked tokens; also returns that ``(B, L + extra)`` mask."""
    batch, length = prompt.types.shape
    valid = torch.ones(batch, length, dtype=torch.bool) if prompt.mask is None else prompt.mask != 0
    valid = torch.cat([valid, torch.ones(batch, extra, dtype=torch.bool)], dim=1)
    out = {}
    for name, geo in state.geometries.items():
        placed = []
        for lay, canvas in layouts:
            options = dict(geo.options, **canvas) if geo.design == "canvas-mrope" else geo.options
            try:
                placed.append(None if lay is None else positions(lay, geo.design, **options))
            except ValueError as e:
                raise ValueError(f"patched model (design {name!r}): {e}") from None
        axes = next((p.shape[1] for p in placed if p is not None), geo.W.shape[0])
        pos = torch.zeros(batch, length + extra, axes, dtype=torch.float32)
        for b, p in enumerate(placed):
            if p is not None:
                pos[b, valid[b]] = p
        out[name] = pos.permute(2, 0, 1).contiguous()
    return out, valid


def _prompt(state: _State, types: torch.Tensor, grids: tuple, mask: Optional[torch.Tensor],
            plan: Optional[list] = None) -> _Prompt:
    """A fresh sequence as placed: vision tokens without any grid and hidden tokens become text, grid rows of
    hidden images are dropped (as transformers consumes them). ``types``/``mask`` are on the CPU."""
    if grids[0] is None and grids[1] is None:
        types = torch.zeros_like(types)
    if state.adapter.one_d:
        types, grids = _visible_items(state, types, mask, grids)
    else:
        grids = _visible_grids(state, types, mask, grids)
    if mask is not None:
        types = types.masked_fill(mask == 0, 0)  # hidden tokens are skipped, whatever their kind
    length = types.shape[1]
    counts = torch.full((types.shape[0],), length) if mask is None else mask.sum(dim=1)
    return _Prompt(types, mask, grids, counts, plan)


def text_row(mask: Optional[torch.Tensor], past: Any, batch: int, length: int, device) -> torch.Tensor:
    """The 1-D text positions ``(B, L)`` of ``length`` tokens after ``past`` cached ones, as transformers builds
    them: the count of unmasked tokens before each (padding at 0) with a 2-D ``mask`` over cache and new tokens,
    else ``past + i``."""
    if mask is not None:
        keep = mask != 0
        return (keep.long().cumsum(-1) - 1)[:, -length:].masked_fill(~keep[:, -length:], 0).to(device)
    return (torch.arange(length, device=device) + past).expand(batch, length)


def place(state: _State, types: torch.Tensor, grids: tuple, mask: Optional[torch.Tensor], device,
          plan: Optional[list] = None) -> tuple[torch.Tensor, Continuation]:
    """The position tensor ``(R, B, L)`` float32 of a fresh sequence, and where the text after it goes.

    ``types``/``mask`` are on the CPU; ``grids`` is (image_grid_thw, video_grid_thw, second_per_grid_ts); ``plan``
    the per-sample layouts of a family whose prompt plans what the model generates (:attr:`_Prompt.plan`).
    Without any grid every token is text, as in transformers (image tokens with no grid are placed as text).
    """
    prompt = _prompt(state, types, grids, mask, plan)
    batch, length = types.shape
    planned = coming = None
    if plan is not None:
        placed, starts, plans, planned = _place_planned(state, prompt)
        geo = torch.cat([placed[name] for name in state.geometries], dim=0)
        start = torch.cat([starts[name] for name in state.geometries], dim=0)
        if planned.numel() and int(planned.max()) > 0:
            coming = torch.cat([plans[name] for name in state.geometries], dim=0).to(device)
            planned = planned.to(device)
        else:
            planned = None
    else:
        placed = _place(state, prompt, 1)  # the prompt and one text token after it
        geo = torch.cat([placed[name] for name in state.geometries], dim=0).float()
        start, geo = geo[:, :, length], geo[:, :, :length]
    text = text_row(mask, 0, batch, length, "cpu").float()
    if mask is not None:  # padding after a row's last token sits one step before the text that follows it, so
        # generate's rule for the next token (the last position + 1) gives the design's place (right padding)
        valid = mask != 0
        last = length - 1 - valid.flip(-1).long().argmax(-1)
        trailing = (torch.arange(length)[None] > last[:, None]) & valid.any(-1, keepdim=True)
        geo = torch.where(trailing[None], start[:, :, None] - 1, geo)
        text = torch.where(trailing, prompt.counts[:, None].float() - 1, text)
    pos = torch.cat([text[None], geo], dim=0).to(device)
    return pos, Continuation(start.to(device), prompt.counts.to(device), length, coming, planned)


_FEWER = ("patched model: a cached forward gives tokens the cache already holds (fewer cached tokens than the prompt "
          "placed with it); pass their position_ids (ropekit.hf.position_ids) or rerun without the cache")


def follow(record: Continuation, mask: Optional[torch.Tensor], past: Any, batch: int, length: int, device
           ) -> torch.Tensor:
    """The position tensor ``(R, B, length)`` of text tokens after ``past`` cached ones of a placed prompt.

    With a 2-D ``mask`` over cache and new tokens, token ``i`` is text token (unmasked tokens since the prompt)
    after it; without one, text token ``past + i − L`` after a prompt of padded length ``L`` (generate's layout).
    Plain tensor arithmetic: a decoding step compiles with ``fullgraph=True``. Without a mask, from a cache that
    counts its tokens on the host (an int ``past``), the check that the cache holds the whole prompt is made on the
    host and the step costs three tensor ops, nothing read back from the device; otherwise the check reads one
    boolean back (skipped while compiling).
    """
    base = record.counts.shape[0]
    if batch % base:
        raise ValueError(f"patched model: a batch of {batch} cannot continue the {base} sequences of this cache")
    k = batch // base
    start = record.start.repeat_interleave(k, dim=1) if k > 1 else record.start
    if mask is None and isinstance(past, int):  # a decoding step's usual case: no read-back, three tensor ops
        if past < record.length:
            raise ValueError(_FEWER)
        text = torch.arange(past, past + length, dtype=torch.float32, device=device)
        if record.plan is not None:
            geo = _planned(record, k, start.to(device), (text - record.length).expand(batch, length))
        else:
            geo = start.to(device)[:, :, None] + (text - record.length)
        return torch.cat([text.expand(1, batch, length), geo], dim=0)
    counts = record.counts.repeat_interleave(k) if k > 1 else record.counts
    step = torch.arange(length, device=device)
    text = text_row(mask, past, batch, length, device)
    if mask is not None:
        new = (mask != 0)[:, -length:].to(device)
        after = text - counts[:, None].to(device)
    else:
        new = torch.ones(batch, length, dtype=torch.bool, device=device)
        after = (past - record.length + step).expand(batch, length)
    if not torch.compiler.is_compiling() and bool(((after < 0) & new).any()):
        raise ValueError(_FEWER)
    if record.plan is not None:
        geo = _planned(record, k, start.to(device), after.to(torch.float32))
    else:
        geo = start.to(device)[:, :, None] + after[None].to(torch.float32)
    geo = geo.masked_fill(~new[None], 0.0)  # padding sits at 0, as in a full pass
    return torch.cat([text[None].float(), geo], dim=0)


def _planned(record: Continuation, k: int, start: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """Geometry positions ``(R - 1, B, n)`` of the tokens ``after (B, n)`` steps after a prompt that plans what
    follows it: the planned positions first, then text from ``start``."""
    plan, planned = record.plan, record.planned
    if k > 1:
        plan, planned = plan.repeat_interleave(k, dim=1), planned.repeat_interleave(k)
    plan, planned = plan.to(start.device), planned.to(start.device)[:, None]
    at = after.long().clamp(0, plan.shape[2] - 1)
    taken = plan.gather(2, at[None].expand(plan.shape[0], -1, -1))
    return torch.where((after < planned)[None], taken, start[:, :, None] + (after - planned)[None])


def index(state: _State, types: torch.Tensor, grids: tuple, mask: Optional[torch.Tensor], device,
          plan: Optional[list] = None) -> tuple:
    """``(positions (A, B, L), rope_deltas (B, 1))`` of a sequence under the first layer's geometry, as
    transformers' ``get_rope_index`` returns its own (a family whose prompt plans what the model generates returns
    zero deltas, as its position code does: its decoding reads the plan)."""
    prompt = _prompt(state, types, grids, mask, plan)
    pos = _place(state, prompt, 0)[state.layer_geometry[0]].to(device)
    if plan is not None:
        return pos, torch.zeros(pos.shape[1], 1, dtype=torch.long, device=device)
    return pos, _deltas(pos, prompt, state.adapter.integer_positions)


def _deltas(pos: torch.Tensor, prompt: _Prompt, integer: bool = True) -> torch.Tensor:
    valid = torch.ones(pos.shape[1:], dtype=torch.bool) if prompt.mask is None else prompt.mask.bool()
    top = pos.masked_fill(~valid.to(pos.device)[None], float("-inf")).amax(dim=(0, 2))
    counts = prompt.counts.to(pos.device)
    top = torch.where(counts > 0, top, torch.zeros_like(top))  # an all-padding row has delta 0
    delta = (top.double() + 1 - counts.double())[:, None]
    return delta.long() if integer and bool((delta == delta.round()).all()) else delta.float()


def vision_in_ids(state: _State, input_ids: torch.Tensor) -> torch.Tensor:
    """Whether each of ``input_ids`` is the image or video token (bool, same shape): one ``isin``, so a
    decoding step pays one small op for the check instead of building its token types."""
    ids = state.vision_ids.get(input_ids.device)
    if ids is None:
        known = [t for t in (state.image_token_id, state.video_token_id) if t is not None]
        ids = state.vision_ids[input_ids.device] = torch.tensor(known, dtype=input_ids.dtype, device=input_ids.device)
    return torch.isin(input_ids, ids)


_VISION_AFTER_CACHE = (
    "patched model: image/video tokens after a KV cache are not supported (the new tokens hold the image/video token "
    "id or a non-zero mm_token_type_ids); run the whole sequence again without past_key_values"
)
#: new tokens up to this many are checked for image/video ids on the host (one small copy, no kernels)
_HOST_CHECK = 64


def check_ids_are_text(state: _State, input_ids: torch.Tensor) -> None:
    """Refuse image/video token ids among the new tokens ``input_ids`` after a KV cache (:func:`check_no_vision`).

    A decoding step's few ids are read to the host and checked there (one copy); more ids, or ids inside a
    compiled region, take the tensor check."""
    if input_ids.numel() <= _HOST_CHECK and not torch.compiler.is_compiling():
        known = {t for t in (state.image_token_id, state.video_token_id) if t is not None}
        if known and not known.isdisjoint(input_ids.reshape(-1).tolist()):
            raise ValueError(_VISION_AFTER_CACHE)
        return
    check_no_vision(vision_in_ids(state, input_ids))


def check_no_vision(new_types: Optional[torch.Tensor]) -> None:
    """Refuse image/video tokens after a KV cache: their grids cannot be placed incrementally.

    ``new_types``: the new tokens' types (text 0), or a bool tensor that is True at vision tokens.
    """
    if new_types is None:
        return
    bad = new_types if new_types.dtype == torch.bool else new_types != 0
    message = _VISION_AFTER_CACHE
    if torch.compiler.is_compiling():
        torch._assert_async(~bad.any(), message)  # checked on the device, no graph break
    elif bool(bad.any()):
        raise ValueError(message)


# --------------------------------------------------------------------------------------------------
# frequencies that follow the sequence length


def frequencies(state: _State, name: str, positions: torch.Tensor, key: Optional[str] = None) -> torch.Tensor:
    """The frequency matrix geometry ``name`` rotates ``positions`` with in this forward (rotary table ``key``), on
    the positions' device.

    Fixed unless the model's rope scaling follows the length ``max position + 1``, as transformers does:
    LongRoPE takes its long factors past the original context; dynamic NTK grows its base when the length
    passes the largest seen so far and goes back to the original frequencies below the original context.
    """
    geo = rotary(state, key)[0][name]
    s = geo.scaling
    if s is None:
        return geo.on(positions.device)
    length = int(positions.max()) + 1 if positions.numel() else 1
    if s.rope_type == "longrope":
        return scale_frequencies(geo.W, s, base=geo.base, dim=geo.dim, seq_len=length)[0]
    original = int(s.params["max_position_embeddings"])
    seen, W = state.seen.get((name, key), (original, None))
    if length > seen:
        seen, W = length, scale_frequencies(geo.W, s, base=geo.base, dim=geo.dim, seq_len=length)[0]
    elif length < original and seen > original:
        seen, W = original, None
    if W is None:  # the original length: the base change is the identity
        W = scale_frequencies(geo.W, s, base=geo.base, dim=geo.dim, seq_len=original)[0]
    state.seen[(name, key)] = (seen, W)
    return W
