"""Position state of a patched model: the placed prompt, the text that may follow it, decode offsets.

At the prompt every geometry places the prompt followed by ``FOLLOW`` text tokens and keeps the
positions of that run (the continuation table); a cached forward reads the positions of its new tokens
off that table, so ``generate`` sees exactly what one teacher-forced forward over the whole sequence
gives. Reading the table is plain tensor arithmetic (no data-dependent Python branching), so a decoding
step compiles with ``torch.compile(fullgraph=True)``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from ..designs.registry import positions
from ..index import rope_index
from ..layout import AUDIO, Audio, Image, Layout, Text, VideoAudio
from ..rotations.scaling import scale_frequencies
from .adapters import Adapter

FOLLOW = 64  # text tokens placed ahead at the prompt; eager decoding doubles the table when it runs past


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


@dataclass
class _Prompt:
    """A placed prompt (un-expanded batch) and the positions of the text that may follow it."""

    types: torch.Tensor  # (B, L) token types as placed, on the CPU
    mask: Optional[torch.Tensor]  # (B, L) 0/1 on the CPU, or None
    grids: tuple  # (image_grid_thw, video_grid_thw, second_per_grid_ts) as placed
    counts: torch.Tensor  # (B,) valid prompt tokens, on the model's device
    table: dict[str, torch.Tensor]  # per geometry (A, B, M) on the model's device: the next M text tokens
    positions: dict = field(default_factory=dict)  # per geometry (A, B, L) on the model's device: the prompt's own
    dense: bool = False  # no padding in the prompt: every row's text continues at the same table column
    cos_sin: dict = field(default_factory=dict)  # per geometry (table, cos, sin) of the table (hooks build it)
    generated: bool = False  # placed by ``generate``, which drops the grids after the first forward


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
    prompt: Optional[_Prompt] = None  # the last prompt placed, for cached decoding
    pending: Optional[dict[str, torch.Tensor]] = None  # positions for the next rotary call, (A, B, L)
    stash: Optional[tuple] = None  # (token types, mask, positions) placed by generate before it drops the grids
    run: Optional[tuple] = None  # (pending, start, length): pending is the prompt's table from column start
    # (start None: pending is the prompt itself)
    vision_ids: dict = field(default_factory=dict)  # device -> tensor of the image/video token ids
    last: dict[int, torch.Tensor] = field(default_factory=dict)
    seen: dict[tuple, tuple[int, torch.Tensor]] = field(default_factory=dict)  # dynamic NTK: (length, W) per table
    # families whose text model has several rotary tables (Adapter.rope_variants): key -> (geometries with that
    # table's frequencies, its attention factor); empty: ``geometries`` and ``scaling`` serve every layer
    variants: dict[str, tuple[dict[str, _Geometry], float]] = field(default_factory=dict)
    audio_token_id: Optional[int] = None  # the audio token, marked (AUDIO) only where a video's audio is interleaved
    interleave: Optional[tuple] = None  # (order, chunk) of a VideoAudio block (Adapter.interleave), or None
    origin: float = 0.0  # the model's first 1-D position (Adapter.position_origin), added to every design's
    current: Optional[tuple] = None  # (positions, run, keys served) of this forward, for rotaries called once per key


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


def token_types(state: _State, input_ids, mm_token_type_ids, batch: int, length: int, device,
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
        tokens = g.prod(dim=1) // (state.merge ** 2) if kind == 1 else state.adapter.video_tokens(
            g, state.merge, state.temporal_merge)
        visible = int((is_kind & (mask != 0)).sum())
        used = int((tokens.cumsum(0) <= visible).sum())
        out.append(g[:used])
        if kind == 2 and seconds is not None:
            seconds = torch.as_tensor(seconds)[:used]
    return out[0], out[1], seconds


# --------------------------------------------------------------------------------------------------
# the prompt


def _place(state: _State, prompt: _Prompt, extra: int) -> dict[str, torch.Tensor]:
    """Each geometry's positions ``(A, B, L + extra)`` of the prompt followed by ``extra`` text tokens."""
    types, mask = prompt.types, prompt.mask
    if bool((types == AUDIO).any()):
        return _place_interleaved(state, prompt, extra)
    batch = types.shape[0]
    ext_types = torch.cat([types, types.new_zeros(batch, extra)], dim=1)
    ext_mask = None if mask is None else torch.cat([mask, mask.new_ones(batch, extra)], dim=1)
    image_grid_thw, video_grid_thw, seconds = prompt.grids
    video_grid_thw = state.adapter.video_grids(video_grid_thw, state.temporal_merge)
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
    return out


def _interleaved_layouts(state: _State, prompt: _Prompt, extra: int) -> list:
    """Per sample, the layout of its valid tokens followed by ``extra`` text tokens, where a run of video and
    audio tokens (types 2 and 4) is a ``VideoAudio`` block with the two text tokens on each side as its markers,
    a run of audio tokens alone is audio, and images and videos take their grid rows in order."""
    if state.interleave is None:
        raise ValueError(f"patched model: {state.adapter.name} defines no interleaving of a video's audio track")
    order, chunk = state.interleave
    images, videos, seconds = prompt.grids
    videos = state.adapter.video_grids(videos, state.temporal_merge)
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
    batch, length = prompt.types.shape
    valid = torch.ones(batch, length, dtype=torch.bool) if prompt.mask is None else prompt.mask != 0
    valid = torch.cat([valid, torch.ones(batch, extra, dtype=torch.bool)], dim=1)
    out = {}
    for name, geo in state.geometries.items():
        placed = []
        for lay in layouts:
            try:
                placed.append(None if lay is None else positions(lay, geo.design, **geo.options))
            except ValueError as e:
                raise ValueError(f"patched model (design {name!r}): {e}") from None
        axes = next((p.shape[1] for p in placed if p is not None), geo.W.shape[0])
        pos = torch.zeros(batch, length + extra, axes, dtype=torch.float32)
        for b, p in enumerate(placed):
            if p is not None:
                pos[b, valid[b]] = p
        out[name] = pos.permute(2, 0, 1).contiguous()
        if state.origin:
            out[name] = out[name] + state.origin
    return out


def _prompt(state: _State, types: torch.Tensor, grids: tuple, mask: Optional[torch.Tensor], device) -> _Prompt:
    """A fresh sequence as placed: vision tokens without any grid and hidden tokens become text, grid rows of
    hidden images are dropped (as transformers consumes them). ``types``/``mask`` are on the CPU."""
    if grids[0] is None and grids[1] is None:
        types = torch.zeros_like(types)
    grids = _visible_grids(state, types, mask, grids)
    if mask is not None:
        types = types.masked_fill(mask == 0, 0)  # hidden tokens are skipped, whatever their kind
    length = types.shape[1]
    counts = torch.full((types.shape[0],), length) if mask is None else mask.sum(dim=1)
    return _Prompt(types, mask, grids, counts.to(device), {}, dense=bool((counts == length).all()))


def prefill(state: _State, types: torch.Tensor, grids: tuple, mask: Optional[torch.Tensor], device) -> None:
    """Positions of a fresh sequence for every geometry, plus where the text after it goes.

    ``types``/``mask`` are on the CPU; ``grids`` is (image_grid_thw, video_grid_thw, second_per_grid_ts).
    Without any grid every token is text, as in transformers (image tokens with no grid are placed as text).
    """
    prompt = _prompt(state, types, grids, mask, device)
    length = types.shape[1]
    placed = _place(state, prompt, FOLLOW)
    prompt.table = {n: p[:, :, length:].to(device) for n, p in placed.items()}
    state.prompt = prompt
    state.pending = prompt.positions = {n: p[:, :, :length].to(device) for n, p in placed.items()}
    state.run = (state.pending, None, 0)  # the rotary hook evaluates the continuation's cos/sin with the prompt's


def index(state: _State, types: torch.Tensor, grids: tuple, mask: Optional[torch.Tensor], device) -> tuple:
    """``(positions (A, B, L), rope_deltas (B, 1))`` of a sequence under the first layer's geometry, as
    transformers' ``get_rope_index`` returns its own; the patch state is left as it was."""
    prompt = _prompt(state, types, grids, mask, device)
    pos = _place(state, prompt, 0)[state.layer_geometry[0]].to(device)
    return pos, _deltas(pos, prompt, state.adapter.integer_positions)


def rope_deltas(state: _State) -> Optional[torch.Tensor]:
    """transformers' ``rope_deltas`` of the last prompt: largest position + 1 − valid tokens, ``(B, 1)``.

    Read from the first layer's geometry; integer (as transformers) when the positions are whole numbers.
    """
    if state.prompt is None or state.pending is None:
        return None
    return _deltas(state.pending[state.layer_geometry[0]], state.prompt, state.adapter.integer_positions)


def _deltas(pos: torch.Tensor, prompt: _Prompt, integer: bool = True) -> torch.Tensor:
    valid = torch.ones(pos.shape[1:], dtype=torch.bool) if prompt.mask is None else prompt.mask.bool()
    top = pos.masked_fill(~valid.to(pos.device)[None], float("-inf")).amax(dim=(0, 2))
    top = torch.where(prompt.counts > 0, top, torch.zeros_like(top))  # an all-padding row has delta 0
    delta = (top.double() + 1 - prompt.counts.double())[:, None]
    return delta.long() if integer and bool((delta == delta.round()).all()) else delta.float()


def from_stash(state: _State, types: torch.Tensor, mask: Optional[torch.Tensor], mask_4d: bool = False) -> bool:
    """Use the positions ``generate`` placed for this prompt (it hands the grids to the vision tower only).

    ``mask_4d``: the forward got a 4-D mask or a dict of them (generate builds those from its 2-D mask
    for compileable caches), so only the token types can be compared.
    """
    stash, state.stash = state.stash, None
    if stash is None:
        return False
    s_types, s_mask, s_pos, s_prompt = stash
    batch = types.shape[0]
    k = 1
    if batch != s_types.shape[0]:
        if batch % s_types.shape[0]:
            return False
        k = batch // s_types.shape[0]
        s_types = s_types.repeat_interleave(k, dim=0)
        s_mask = None if s_mask is None else s_mask.repeat_interleave(k, dim=0)
    if s_types.shape != types.shape:
        return False
    if torch.compiler.is_compiling():  # no data-dependent branch in a graph: a mismatch is a device-side error
        _assert_stash(s_types, s_mask, types, mask, mask_4d)
    elif not torch.equal(s_types, types.cpu()):
        return False
    elif mask is None and not mask_4d:
        if not (s_mask is None or bool((s_mask == 1).all())):
            return False
    elif not (mask is None or (s_mask is None and bool((mask == 1).all())) or (
            s_mask is not None and torch.equal(mask, s_mask))):
        return False
    state.prompt = s_prompt
    state.pending = {n: p.repeat_interleave(k, dim=1) for n, p in s_pos.items()} if k > 1 else s_pos
    return True


def _assert_stash(s_types: torch.Tensor, s_mask: Optional[torch.Tensor], types: torch.Tensor,
                  mask: Optional[torch.Tensor], mask_4d: bool) -> None:
    """Inside a compiled forward: check on the device that the prompt is the one ``generate`` placed (as the
    eager comparison in :func:`from_stash` does; a 4-D mask is not compared)."""
    same = (s_types.to(types.device) == types).all()
    if mask_4d:
        pass
    elif mask is not None:
        want = torch.ones_like(mask) if s_mask is None else s_mask.to(mask.device)
        same = same & (mask == want).all()
    elif s_mask is not None:
        same = same & (s_mask == 1).all()
    torch._assert_async(same, "patched model: a compiled forward got a prompt other than the one generate "
                              "placed for it (token types or attention mask differ); run this prompt eagerly")


def generated_prompt(state: _State, types: torch.Tensor, mask: Optional[torch.Tensor]) -> bool:
    """Whether ``types`` and ``mask`` (CPU; mask 0/1 or None) are the prompt the last ``generate`` placed with
    grids. ``generate`` hands the grids to the vision encoder and drops them, so a second look at the same
    prompt within one generation (an assistant model sharing this instance, the verifying forward of assisted
    decoding) comes without them."""
    prompt = state.prompt
    if prompt is None or not prompt.generated or (prompt.grids[0] is None and prompt.grids[1] is None):
        return False
    if types.shape != prompt.types.shape:
        return False
    p_mask = torch.ones_like(prompt.types) if prompt.mask is None else prompt.mask
    mask = torch.ones_like(types) if mask is None else mask
    return torch.equal(mask, p_mask) and torch.equal(types.masked_fill(p_mask == 0, 0), prompt.types)


def continue_generated(state: _State, types: torch.Tensor, mask: Optional[torch.Tensor], device) -> bool:
    """Place an uncached forward of ``generate(use_cache=False)`` that continues its prompt.

    ``generate`` hands the grids over at the first forward only, so every later forward re-reads the whole
    sequence without them. When the prompt came from ``generate`` with grids and this forward's token types
    (``types``, CPU) and 2-D ``mask`` (CPU or None) start with it, the prompt is placed with its own grids
    followed by the new text tokens, which is what a cached step reads off the continuation table. Returns
    whether it did; new image/video tokens or padding after such a prompt are refused (no grids to place
    them with).
    """
    prompt = state.prompt
    if prompt is None or not prompt.generated or (prompt.grids[0] is None and prompt.grids[1] is None):
        return False
    base, size = prompt.types.shape
    batch, length = types.shape
    if batch % base or length <= size:
        return False
    k = batch // base
    p_types, p_mask = prompt.types.repeat_interleave(k, 0), prompt.mask
    p_mask = torch.ones_like(p_types) if p_mask is None else p_mask.repeat_interleave(k, 0)
    head = types[:, :size].masked_fill(p_mask == 0, 0)  # hidden tokens were placed as skipped text
    if not torch.equal(head, p_types) or (mask is not None and not torch.equal(mask[:, :size], p_mask)):
        return False
    if bool(types[:, size:].any()) or (mask is not None and not bool(mask[:, size:].all())):
        raise ValueError(
            "patched model: an uncached forward continues the prompt generate placed, but its new tokens hold "
            "image/video tokens (mm_token_type_ids or the image/video token id) or padding, and generate no "
            "longer passes the grids; pass image_grid_thw/video_grid_thw for the whole sequence"
        )
    placed = _place(state, prompt, length - size)
    state.pending = {n: (p.repeat_interleave(k, dim=1) if k > 1 else p).to(device) for n, p in placed.items()}
    return True


# --------------------------------------------------------------------------------------------------
# cached decoding


def vision_in_ids(state: _State, input_ids: torch.Tensor) -> torch.Tensor:
    """Whether each of ``input_ids`` is the image or video token (bool, same shape): one ``isin``, so a
    decoding step pays one small op for the check instead of building its token types."""
    ids = state.vision_ids.get(input_ids.device)
    if ids is None:
        known = [t for t in (state.image_token_id, state.video_token_id) if t is not None]
        ids = state.vision_ids[input_ids.device] = torch.tensor(known, dtype=input_ids.dtype, device=input_ids.device)
    return torch.isin(input_ids, ids)


def check_no_vision(new_types: Optional[torch.Tensor]) -> None:
    """Refuse image/video tokens after a KV cache: their grids cannot be placed incrementally.

    ``new_types``: the new tokens' types (text 0), or a bool tensor that is True at vision tokens.
    """
    if new_types is None:
        return
    bad = new_types if new_types.dtype == torch.bool else new_types != 0
    message = (
        "patched model: image/video tokens after a KV cache are not supported (the new tokens hold the "
        "image/video token id or a non-zero mm_token_type_ids); run the whole sequence again without "
        "past_key_values"
    )
    if torch.compiler.is_compiling():
        torch._assert_async(~bad.any(), message)  # checked on the device, no graph break
    elif bool(bad.any()):
        raise ValueError(message)


def decode(state: _State, mask: Optional[torch.Tensor], past: Any, batch: int, length: int, device) -> None:
    """Positions of ``length`` new text tokens after ``past`` cached ones, read off each geometry's table.

    ``past`` is an int or a 0-d tensor (static caches); ``mask`` a 2-D 0/1 mask over cache + new tokens
    or None. Without a mask, token ``i`` of this step is text token ``past + i − L`` after a prompt of
    padded length ``L`` (generate's layout); with one, the count of unmasked tokens since the prompt.
    """
    prompt = state.prompt
    if prompt is None:
        raise ValueError(
            "patched model: a cached forward needs the prompt to have gone through the patched model first "
            "(call patch_model before the prefill, or rerun without past_key_values)"
        )
    base = prompt.counts.shape[0]
    if batch % base:
        raise ValueError(f"patched model: a batch of {batch} cannot continue the {base} cached sequences")
    k = batch // base
    size = next(iter(prompt.table.values())).shape[2]
    start = _run_start(prompt, mask, past, k)
    if start is not None and start + length <= size:  # what the general path below gives, as plain slices
        state.pending = {name: table[:, :, start:start + length] for name, table in prompt.table.items()}
        state.run = (state.pending, start, length)
        return
    counts = prompt.counts.repeat_interleave(k) if k > 1 else prompt.counts
    step = torch.arange(length, device=device)
    if mask is not None:
        keep = mask != 0
        after = keep.long().cumsum(-1)[:, -length:] - 1 - counts[:, None]
        new = keep[:, -length:]
    else:
        after = (past - prompt.types.shape[1] + step).expand(batch, length).to(device)
        new = torch.ones(batch, length, dtype=torch.bool, device=device)
    inside = (after < 0) & new  # tokens of the prompt given again (an assistant re-reading its last token)
    after = after.clamp(min=0)  # text tokens since the prompt
    if not torch.compiler.is_compiling():
        need = int(after.max()) + 1 if after.numel() else 0
        if need > size:  # eager only: place further ahead so every position comes from the design itself
            grow = max(2 * size, need)
            placed = _place(state, prompt, grow)
            prompt.table = {n: p[:, :, -grow:].to(device) for n, p in placed.items()}
            size = grow
    state.pending = {name: _read(table, after, new, k) for name, table in prompt.table.items()}
    if torch.compiler.is_compiling() or bool(inside.any()):
        column = (past + step).clamp(max=prompt.types.shape[1] - 1).expand(batch, length).to(device)
        for name, pos in state.pending.items():
            own = prompt.positions[name].repeat_interleave(k, dim=1) if k > 1 else prompt.positions[name]
            own = own.gather(2, column[None].expand(own.shape[0], -1, -1))
            state.pending[name] = torch.where(inside[None], own.to(pos.dtype), pos)


def _run_start(prompt: _Prompt, mask: Optional[torch.Tensor], past: Any, k: int) -> Optional[int]:
    """The table column where this step's tokens start when they are one run of text right after the
    cache for every row (eager, unexpanded batch, no padding anywhere), else None.

    Then token ``i`` of the step is text token ``past − L + i`` after the prompt of length ``L`` in every
    row, which is exactly what the general path computes, so the step can read plain slices of the table.
    """
    if k != 1 or not isinstance(past, int) or torch.compiler.is_compiling():
        return None
    if mask is not None and not (prompt.dense and bool(mask.all())):
        return None
    start = past - prompt.types.shape[1]
    return start if start >= 0 else None


def _read(table: torch.Tensor, after: torch.Tensor, new: torch.Tensor, k: int) -> torch.Tensor:
    """Entries ``after`` of a continuation table ``(A, B, M)``, continued with its last step past the end."""
    t = table.repeat_interleave(k, dim=1) if k > 1 else table
    size = t.shape[2]
    idx = after.clamp(max=size - 1)
    pos = t.gather(2, idx[None].expand(t.shape[0], -1, -1))
    if size > 1:  # compiled decoding past the table: the text run keeps its last step
        slope = (t[:, :, -1] - t[:, :, -2])[:, :, None]
        pos = pos + (after - idx)[None].to(pos.dtype) * slope
    return pos.masked_fill(~new[None], 0.0)  # padding sits at 0, as in a full pass


# --------------------------------------------------------------------------------------------------
# frequencies that follow the sequence length


def frequencies(state: _State, name: str, positions: torch.Tensor, key: Optional[str] = None) -> torch.Tensor:
    """The frequency matrix geometry ``name`` rotates ``positions`` with in this forward (rotary table ``key``).

    Fixed unless the model's rope scaling follows the length ``max position + 1``, as transformers does:
    LongRoPE takes its long factors past the original context; dynamic NTK grows its base when the length
    passes the largest seen so far and goes back to the original frequencies below the original context.
    """
    geo = rotary(state, key)[0][name]
    s = geo.scaling
    if s is None:
        return geo.W
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
