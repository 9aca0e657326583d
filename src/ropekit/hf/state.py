"""Position state of a patched model: the placed prompt, the text that may follow it, decode offsets.

At the prompt every geometry places the prompt followed by ``FOLLOW`` text tokens and keeps the
positions of that run; a cached forward reads the positions of its new tokens off that table, so
``generate`` sees exactly what one teacher-forced forward over the whole sequence gives.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from ..index import rope_index
from .adapters import Adapter

_MISSING = object()


@dataclass
class _Geometry:
    """One position design with its options and frequency matrix ``W (A, D/2)``."""

    design: str
    options: dict
    allocation: str
    W: torch.Tensor


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
    saved: list = field(default_factory=list)  # (object, attribute, previous value or _MISSING)
    prompt: Optional["_Prompt"] = None  # the last prompt placed, for cached decoding
    pending: Optional[dict[str, torch.Tensor]] = None  # positions for the next rotary call, (A, B, L)
    stash: Optional[tuple] = None  # (token types, mask, positions) placed by generate before it drops the grids
    last: dict[int, torch.Tensor] = field(default_factory=dict)



def _token_types(state: _State, input_ids, mm_token_type_ids, batch: int, length: int, has_grids: bool, device):
    if mm_token_type_ids is not None:
        return mm_token_type_ids.to(device=device, dtype=torch.long)
    if input_ids is not None:
        types = torch.zeros_like(input_ids, dtype=torch.long)
        if state.image_token_id is not None:
            types[input_ids == state.image_token_id] = 1
        if state.video_token_id is not None:
            types[input_ids == state.video_token_id] = 2
        return types
    if has_grids:
        raise ValueError(
            "patched model: image/video grids were given with `inputs_embeds` but no `mm_token_type_ids`; "
            "pass mm_token_type_ids (text 0, image 1, video 2) so the design can place the tokens"
        )
    return torch.zeros(batch, length, dtype=torch.long, device=device)


@dataclass
class _Prompt:
    """A placed prompt (un-expanded batch) and the positions of the text that may follow it."""

    types: torch.Tensor  # (B, L) token types on the CPU
    mask: Optional[torch.Tensor]  # (B, L) 0/1 or None
    grids: tuple  # (image_grid_thw, video_grid_thw, second_per_grid_ts)
    counts: torch.Tensor  # (B,) valid prompt tokens
    table: dict[str, torch.Tensor]  # per geometry (A, B, M): positions of the next M text tokens


FOLLOW = 16  # text tokens placed ahead at the prompt; the table doubles when generation runs past it


def _place(state: _State, prompt: _Prompt, extra: int) -> dict[str, torch.Tensor]:
    """Each geometry's positions ``(A, B, L + extra)`` of the prompt followed by ``extra`` text tokens."""
    types, mask = prompt.types, prompt.mask
    batch = types.shape[0]
    ext_types = torch.cat([types, types.new_zeros(batch, extra)], dim=1)
    ext_mask = None if mask is None else torch.cat([mask, mask.new_ones(batch, extra)], dim=1)
    image_grid_thw, video_grid_thw, seconds = prompt.grids
    video_grid_thw = state.adapter.video_grids(video_grid_thw)
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
    return out


def _prefill(state: _State, types, image_grid_thw, video_grid_thw, mask, second_per_grid_ts) -> None:
    """Positions of a fresh sequence for every geometry, plus where the text after it goes.

    The design places the prompt followed by ``FOLLOW`` text tokens, so a generated token gets exactly
    the position a teacher-forced pass over the whole sequence gives it (float designs included).
    """
    length = types.shape[1]
    counts = torch.full((types.shape[0],), length) if mask is None else mask.sum(dim=1)
    prompt = _Prompt(types, mask, (image_grid_thw, video_grid_thw, second_per_grid_ts), counts, {})
    placed = _place(state, prompt, FOLLOW)
    prompt.table = {n: p[:, :, length:] for n, p in placed.items()}
    state.prompt = prompt
    state.pending = {n: p[:, :, :length] for n, p in placed.items()}


def _decode(state: _State, types, mask, past: int, batch: int, length: int) -> None:
    """Positions of ``length`` new text tokens after ``past`` cached ones, read off each geometry's table."""
    prompt = state.prompt
    if prompt is None:
        raise ValueError(
            "patched model: a cached forward needs the prompt to have gone through the patched model first "
            "(call patch_model before the prefill, or rerun without past_key_values)"
        )
    if types is not None and bool((types[:, -length:] != 0).any()):
        raise ValueError(
            "patched model: new image/video tokens after a KV cache are not supported; run the whole "
            "sequence again without past_key_values"
        )
    base = prompt.counts.shape[0]
    if batch % base:
        raise ValueError(f"patched model: a batch of {batch} cannot continue the {base} cached sequences")
    k = batch // base
    if mask is not None and tuple(mask.shape) == (batch, past + length):
        keep = mask != 0
        idx = (keep.long().cumsum(-1) - 1)[:, -length:]
        new = keep[:, -length:]
    else:
        idx = torch.arange(past, past + length).expand(batch, length)
        new = torch.ones(batch, length, dtype=torch.bool)
    after = (idx - prompt.counts.repeat_interleave(k)[:, None]).clamp(min=0)  # text tokens since the prompt
    need = int(after.max()) + 1
    size = next(iter(prompt.table.values())).shape[2]
    if need > size:
        grow = max(2 * size, need)
        placed = _place(state, prompt, grow)
        prompt.table = {n: p[:, :, -grow:] for n, p in placed.items()}
    pending = {}
    for name, table in prompt.table.items():
        t = table.repeat_interleave(k, dim=1) if k > 1 else table
        pos = t.gather(2, after[None].expand(t.shape[0], -1, -1).to(t.device))
        pending[name] = pos.masked_fill(~new[None].to(t.device), 0.0)  # padding sits at 0, as in a full pass
    state.pending = pending


def _from_stash(state: _State, types: torch.Tensor, mask: Optional[torch.Tensor]) -> bool:
    """Use the positions ``generate`` placed for this prompt (it hands the grids to the vision tower only)."""
    stash, state.stash = state.stash, None
    if stash is None:
        return False
    s_types, s_mask, s_pos = stash
    batch = types.shape[0]
    if batch != s_types.shape[0]:
        if batch % s_types.shape[0]:
            return False
        k = batch // s_types.shape[0]
        s_types = s_types.repeat_interleave(k, dim=0)
        s_mask = None if s_mask is None else s_mask.repeat_interleave(k, dim=0)
        s_pos = {n: p.repeat_interleave(k, dim=1) for n, p in s_pos.items()}
    if s_types.shape != types.shape or not torch.equal(s_types, types.cpu()):
        return False
    same_mask = (mask is None and (s_mask is None or bool((s_mask == 1).all()))) or (
        mask is not None and s_mask is not None and torch.equal(mask, s_mask)
    )
    if not same_mask:
        return False
    state.pending = s_pos
    return True


