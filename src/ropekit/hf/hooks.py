"""The hooks of a patched model, and how they are installed and removed.

Each hook is a :class:`Hook` object set as an instance attribute (never on the transformers class). It
holds the module it sits on, what that attribute was before and the shared patch state, and nothing
else: ``copy.deepcopy`` and ``pickle`` copy it along with the model, so a copy's hooks run the copy's
modules and read the copy's state, and :func:`remove` on the copy restores the copy's own methods.

Hooked: the bare model's ``compute_3d_position_ids`` (positions; ``forward`` on 1-D families) and
``get_rope_index`` (the design's positions when called directly), the text model's ``rotary_emb.forward``
(cos/sin per geometry), each decoder layer's ``forward`` (its geometry's cos/sin) and, on the generation
class, ``_prepare_position_ids_for_generation`` (so ``generate`` lets the model place its tokens itself).

Each hook function comes with a :class:`~ropekit.hf.boundary.Contract`: the parameters it handles of the
method it replaces. :func:`install` checks it against the installed transformers (refusing what it does
not know) and hooks read their arguments through :meth:`Hook.bind`, by the installed signature's names.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Optional

import torch
from torch import nn

from ..apply.planar import cos_sin
from ..rotations.planar import angles
from . import state as st
from .boundary import CACHE_NAMES, Contract, cache_of

_MISSING = "<missing>"  # a picklable marker: the attribute was not set on the instance before


class Hook:
    """``owner.<name>`` replaced by ``fn(hook, *args, **kwargs)``; ``fn`` is a module-level function.

    ``names`` are the replaced method's parameters in the installed transformers (checked against the
    hook's ``contract`` when installed), so :meth:`bind` can name positional arguments.
    """

    def __init__(self, owner: nn.Module, name: str, fn: Callable, state: st._State, contract: Contract,
                 **data: Any):
        self.owner, self.name, self.fn, self.state, self.contract = owner, name, fn, state, contract
        self.names = contract.check(type(owner), name)
        previous = owner.__dict__.get(name, _MISSING)
        self.previous = previous.previous if isinstance(previous, Hook) else previous  # never chain patches
        self.__dict__.update(data)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(self, *args, **kwargs)

    def bind(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        """This call's arguments by parameter name (refusing a keyword outside the contract)."""
        return self.contract.bind(f"{type(self.owner).__name__}.{self.name}", self.names, args, kwargs)

    def call_previous(self, *args: Any, **kwargs: Any) -> Any:
        """What the attribute did before the patch (the class method unless one was set on the instance)."""
        if isinstance(self.previous, str) and self.previous == _MISSING:
            return getattr(type(self.owner), self.name)(self.owner, *args, **kwargs)
        return self.previous(*args, **kwargs)


def install(owner: nn.Module, name: str, fn: Callable, state: Optional[st._State], *,
            contract: Optional[Contract] = None, **data: Any) -> None:
    """Set ``owner.<name>`` to a :class:`Hook` running ``fn`` under ``contract`` (default ``CONTRACTS[fn]``);
    refuses (:class:`~ropekit.hf.boundary.UnsupportedTransformersError`) an installed method the contract
    does not cover."""
    owner.__dict__[name] = Hook(owner, name, fn, state, CONTRACTS[fn] if contract is None else contract, **data)


def remove(owner: Optional[nn.Module], name: str) -> None:
    """Undo :func:`install` on ``owner`` (no-op where no ropekit hook is set)."""
    hook = None if owner is None else owner.__dict__.get(name)
    if not isinstance(hook, Hook):
        return
    if isinstance(hook.previous, str) and hook.previous == _MISSING:
        del owner.__dict__[name]
    else:
        owner.__dict__[name] = hook.previous


class _Embeddings(tuple):
    """``(cos, sin)`` of the first geometry that also carries every geometry's pair and positions.

    Decoder layers receive this object through ``position_embeddings``; patched layers pick their own
    geometry from it, so a re-run under gradient checkpointing sees the same values as the first run.
    """

    geoms: dict[str, tuple[torch.Tensor, torch.Tensor]]
    positions: dict[str, torch.Tensor]


# --------------------------------------------------------------------------------------------------
# positions


def _cache_length(cache: Any) -> tuple[bool, Any]:
    """(whether the cache holds tokens, how many): an int, or a 0-d tensor for static caches."""
    if cache is None:
        return False, 0
    n = cache.get_seq_length()
    if isinstance(n, torch.Tensor):  # static caches count on the device; ask whether they were written
        return bool(getattr(cache, "is_initialized", True)), n
    return n > 0, n


def compute_3d_position_ids(hook: Hook, *args: Any, **kwargs: Any):
    """ropekit replacement: stores every geometry's positions for the rotary hook; returns None."""
    given = hook.state.adapter.position_arguments(hook.bind(args, kwargs))
    _place_forward(hook, given.get("input_ids"), given.get("inputs_embeds"), given.get("image_grid_thw"),
                   given.get("video_grid_thw"), given.get("attention_mask"), cache_of(given),
                   _audio_types(hook.state, given), given.get("second_per_grid_ts"))
    return None


def _audio_types(state: st._State, given: dict, input_ids=None) -> Optional[torch.Tensor]:
    """``mm_token_type_ids`` as given, or, where a video's audio is interleaved with its frames
    (``audio_in_video``, the Omni families' ``use_audio_in_video``), the types read off the ids with the audio
    tokens marked (4), from which the prompt is placed."""
    ids = given.get("input_ids") if input_ids is None else input_ids
    if not given.get("audio_in_video") or given.get("mm_token_type_ids") is not None or ids is None:
        if given.get("audio_in_video") and ids is None:
            raise ValueError("patched model: use_audio_in_video=True needs input_ids: only the ids tell the "
                             "audio tokens interleaved with a video's frames apart")
        return given.get("mm_token_type_ids")
    return st.token_types(state, ids, None, ids.shape[0], ids.shape[1], ids.device, audio=True)


def _place_forward(hook: Hook, input_ids, inputs_embeds, image_grid_thw, video_grid_thw, attention_mask, cache,
                   mm_token_type_ids, second_per_grid_ts) -> None:
    """Every geometry's positions for this forward's tokens (a prompt, or new tokens after ``cache``)."""
    state = hook.state
    state.pending = None
    ref = inputs_embeds if inputs_embeds is not None else input_ids
    batch, length = ref.shape[:2]
    cached, past = _cache_length(cache)
    mask = attention_mask if isinstance(attention_mask, torch.Tensor) and attention_mask.ndim == 2 else None
    has_grids = image_grid_thw is not None or video_grid_thw is not None
    if not cached:
        mask_4d = attention_mask is not None and mask is None  # generate's 4-D mask (or a dict of them)
        _prefill_forward(hook, input_ids, mm_token_type_ids, (image_grid_thw, video_grid_thw, second_per_grid_ts),
                         mask, mask_4d, batch, length, ref.device)
        return
    state.stash = None
    if has_grids and mm_token_type_ids is None and input_ids is None:
        _grids_without_types(state)
    if mm_token_type_ids is None and input_ids is not None:
        new = st.vision_in_ids(state, input_ids[:, -length:])
    elif mm_token_type_ids is not None:
        new = st.token_types(state, None, mm_token_type_ids, batch, length, ref.device)
    else:
        new = _types_from_embeddings(hook, inputs_embeds)
    st.check_no_vision(new[:, -length:])  # types may cover the cached tokens too
    _decode_forward(state, mask, past, batch, length, ref.device)


def _decode_forward(state: st._State, mask: Optional[torch.Tensor], past: Any, batch: int, length: int, device) -> None:
    """Positions of a cached forward's ``length`` new tokens, all text; ``mask`` is a 2-D mask or None."""
    state.stash = None
    if mask is not None and (mask.shape[1] <= length or (isinstance(past, int) and mask.shape[1] != past + length)):
        mask = None  # not a mask over cache + new tokens
    st.decode(state, mask, past, batch, length, device)


def _types_from_embeddings(hook: Hook, inputs_embeds: torch.Tensor) -> torch.Tensor:
    """Vision tokens among ``inputs_embeds`` without ids: rows equal to the image/video token's embedding
    (how transformers finds its placeholders when it has no ids)."""
    state, table = hook.state, hook.owner.get_input_embeddings()
    types = torch.zeros(inputs_embeds.shape[:2], dtype=torch.long, device=inputs_embeds.device)
    for kind, token in ((1, state.image_token_id), (2, state.video_token_id)):
        if token is not None:
            row = table(torch.tensor(token, device=inputs_embeds.device)).to(inputs_embeds.dtype)
            types = types.masked_fill((inputs_embeds == row).all(-1), kind)
    return types


def _grids_without_types(state: st._State) -> None:
    if not state.adapter.takes_token_types:
        raise ValueError(
            f"patched model: image/video grids were given with `inputs_embeds` but no `input_ids`; "
            f"{state.adapter.name} takes no mm_token_type_ids, so only input_ids tell the image and video tokens "
            f"apart: pass input_ids so the design can place the tokens"
        )
    raise ValueError(
        "patched model: image/video grids were given with `inputs_embeds` but no `mm_token_type_ids`; "
        "pass mm_token_type_ids (text 0, image 1, video 2) so the design can place the tokens"
    )


def _videos_without_types(state: st._State, video_grid_thw, mm_token_type_ids) -> None:
    """Refuse video grids without token types where ``input_ids`` cannot tell video tokens from image tokens."""
    if video_grid_thw is not None and mm_token_type_ids is None and not state.adapter.video_ids_distinct:
        raise ValueError(
            f"patched model: video grids were given without `mm_token_type_ids`; {state.adapter.name} writes video "
            f"frames with the image token id, so only mm_token_type_ids (text 0, image 1, video 2) tells them from "
            f"images (the stock model requires it too); pass the processor's mm_token_type_ids"
        )


def _prefill_forward(hook: Hook, input_ids, mm_token_type_ids, grids, mask, mask_4d, batch, length, device) -> None:
    state = hook.state
    typed = length if mm_token_type_ids is None else mm_token_type_ids.shape[1]
    if typed < length:
        return _prefill_with_candidates(hook, input_ids, mm_token_type_ids, grids, mask, mask_4d, batch, length, device)
    if mask is not None:
        mask = (mask != 0).long().cpu() if mask.shape[1] == length else None
    has_grids = grids[0] is not None or grids[1] is not None
    if has_grids and mm_token_type_ids is None and input_ids is None:
        _grids_without_types(state)
    _videos_without_types(state, grids[1], mm_token_type_ids)
    types = st.token_types(state, input_ids, mm_token_type_ids, batch, length, device).cpu()
    placed = not has_grids and (
        st.from_stash(state, types, mask, mask_4d) or st.continue_generated(state, types, mask, device)
    )
    if not placed:
        st.prefill(state, types, grids, mask, device)
        if input_ids is not None and (mm_token_type_ids is not None if state.adapter.takes_token_types
                                      else mask is not None) and (has_grids or not state.adapter.takes_token_types):
            hook.owner.rope_deltas = st.rope_deltas(state)  # as transformers does when it places a prompt


def _prefill_with_candidates(hook: Hook, input_ids, mm_token_type_ids, grids, mask, mask_4d, batch, length,
                             device) -> None:
    """An uncached forward over a prompt followed by tokens the token types do not cover yet: assisted and
    speculative decoding verify candidate tokens with the prompt in one forward, and hand over the prompt's
    ``mm_token_type_ids`` only. The covered tokens are the prompt, placed (or taken from ``generate``'s
    placement) as usual; the rest are text after it, read off the continuation table as a cached step would
    (generated tokens are text by declaration, as ``generate`` extends the token types with zeros).
    """
    state = hook.state
    typed = mm_token_type_ids.shape[1]
    if mask is not None and mask.shape[1] != length:
        mask = None  # not a 2-D mask over these tokens
    if mask is not None and not bool((mask[:, typed:] != 0).all()):
        raise ValueError(
            "patched model: padding among the tokens after the ones mm_token_type_ids covers; pass "
            "mm_token_type_ids for every token of input_ids"
        )
    prompt_mask = None if mask is None else (mask[:, :typed] != 0).long().cpu()
    reused = grids[0] is None and grids[1] is None and st.generated_prompt(
        state, st.token_types(state, None, mm_token_type_ids, batch, typed, device).cpu(), prompt_mask)
    if reused:  # the prompt generate placed, given again without the grids it handed to the vision encoder
        grids = state.prompt.grids
    _prefill_forward(hook, None if input_ids is None else input_ids[:, :typed], mm_token_type_ids, grids,
                     prompt_mask, mask_4d, batch, typed, device)
    state.prompt.generated = state.prompt.generated or reused
    head = state.pending
    st.decode(state, None if mask is None else (mask != 0).long(), typed, batch, length - typed, device)
    state.pending = {n: torch.cat([head[n], p.to(head[n].dtype)], dim=2) for n, p in state.pending.items()}
    state.run = None


def lm_forward(hook: Hook, *args: Any, **kwargs: Any):
    """1-D families (LLaVA, InternVL, Gemma 3, …): place the tokens from the forward's own arguments, then run the
    stock forward.

    The family's adapter reads the image tokens' grids off its vision config; explicit ``position_ids``
    are honoured as given (no placement this forward), except plain text positions with images under a
    design that is not ``vanilla`` (:func:`_refuse_text_positions`).
    """
    given = hook.bind(args, kwargs)
    state = hook.state
    if given.get("position_ids") is not None:
        state.pending = None
        _refuse_text_positions(hook, given)
        return hook.call_previous(*args, **kwargs)
    cache = cache_of(given)
    ref = given.get("inputs_embeds") if given.get("inputs_embeds") is not None else given.get("input_ids")
    cached, past = _cache_length(cache)
    if cached and ref is not None and all(given.get(k) is None for k in _LM_VISION):
        # a cached forward without images or videos (a decoding step): every family reads its tokens as text then
        # (image token ids without images are text, as in stock), which is what the general path below finds
        # after building and checking their token types; this skips those few tensor ops per step
        state.pending = None
        mask = given.get("attention_mask")
        mask = mask if isinstance(mask, torch.Tensor) and mask.ndim == 2 else None
        _decode_forward(state, mask, past, *ref.shape[:2], ref.device)
        return hook.call_previous(*args, **kwargs)
    ref, types, grids, videos = _lm_vision_inputs(hook, given)
    # with the token types given, only the shape and device of `inputs_embeds` are read
    _place_forward(hook, None, ref, grids, videos, given.get("attention_mask"), cache, types, None)
    return hook.call_previous(*args, **kwargs)


#: what a 1-D family's forward takes images or videos by: without all of them its tokens are text
_LM_VISION = ("pixel_values", "pixel_values_videos", "mm_encoder_outputs")


def _lm_vision_inputs(hook: Hook, given: dict) -> tuple:
    """(the ids or embeddings, token types, image grids, video grids) of a 1-D family's forward."""
    state = hook.state
    input_ids, embeds = given.get("input_ids"), given.get("inputs_embeds")
    ref = embeds if embeds is not None else input_ids
    if input_ids is not None:
        types = st.token_types(state, input_ids, None, *ref.shape[:2], ref.device)
    else:
        types = _types_from_embeddings(hook, embeds)
    return (ref, *state.adapter.vision_inputs(hook.owner, types, given))


def _refuse_text_positions(hook: Hook, given: dict) -> None:
    """Refuse plain text ``position_ids`` (each token's count of unmasked tokens before it, from the family's first
    position) on an uncached forward with images under a design other than ``vanilla``: honouring them would
    silently give the stock model. They are what the unpatched ``generate`` of a ``...ForConditionalGeneration``
    hands its bare model when only ``model.model`` was patched; other explicit positions are still honoured."""
    state = hook.state
    if all(geo.design == "vanilla" for geo in state.geometries.values()):
        return
    if _cache_length(cache_of(given))[0]:
        return
    pos = given["position_ids"]
    pos = pos[None] if pos.ndim == 1 else pos
    if pos.ndim != 2:
        return
    ref, types, _, _ = _lm_vision_inputs(hook, given)
    batch, length = ref.shape[:2]
    if pos.shape[-1] != length or not bool(types.any()):
        return
    mask = given.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.ndim == 2 and mask.shape == (batch, length):
        keep = mask != 0
        text = (keep.long().cumsum(-1) - 1).clamp(min=0)
    else:
        keep = torch.ones(batch, length, dtype=torch.bool, device=pos.device)
        text = torch.arange(length, device=pos.device).expand(batch, length)
    text = text + state.origin  # PaliGemma's stock positions count from 1
    if bool((pos.expand(batch, length) == text.to(pos.device))[keep.to(pos.device)].all()):
        raise ValueError(
            f"patched model: {type(hook.owner).__name__} got plain text position_ids together with images, which "
            f"would place the images as stock does instead of by the design. An unpatched generate passes these "
            f"when only the bare model was patched: patch the generation model itself, patch_model(model), not "
            f"patch_model(model.model); when calling the model directly, pass position_ids=None"
        )


def no_generation_position_ids(hook: Hook, *args: Any, **kwargs: Any) -> None:
    """1-D families: ``generate`` passes no position ids, so the patched forward places every token itself."""
    return None


def prepare_position_ids_for_generation(hook: Hook, *args: Any, **kwargs: Any) -> None:
    """Place the prompt while ``generate`` still holds the grids; the model places every later token.

    Returning None keeps ``generate`` from passing (and extending) position ids of its own. Like
    transformers, this sets the bare model's ``rope_deltas``; it also hands ``generate`` the token types,
    so that tokens it generates are text by declaration, whatever their id.
    """
    given = hook.bind(args, kwargs)
    inputs_tensor, model_kwargs = given["inputs_tensor"], given["model_kwargs"]
    state = hook.state
    state.stash = None
    cached, _ = _cache_length(cache_of(model_kwargs))
    if cached:
        return None
    input_ids = model_kwargs.get("input_ids")
    if input_ids is None or input_ids.shape[1] == 0:
        is_ids = inputs_tensor.ndim == 2 and not inputs_tensor.is_floating_point()
        input_ids = inputs_tensor if is_ids else None
    batch, length = inputs_tensor.shape[:2]
    named = state.adapter.position_arguments(model_kwargs)
    grids = (named.get("image_grid_thw"), named.get("video_grid_thw"), named.get("second_per_grid_ts"))
    given = _audio_types(state, named, input_ids)
    if (grids[0] is not None or grids[1] is not None) and given is None and input_ids is None:
        _grids_without_types(state)
    _videos_without_types(state, grids[1], given)
    types = st.token_types(state, input_ids, given, batch, length, inputs_tensor.device)
    mask = model_kwargs.get("attention_mask")
    mask = (mask != 0).long().cpu() if isinstance(mask, torch.Tensor) and mask.ndim == 2 else None
    if (grids[0] is None and grids[1] is None and model_kwargs.get("mm_encoder_outputs")
            and st.generated_prompt(state, types.cpu(), mask)):
        grids = state.prompt.grids  # an assistant sharing this model: its generate got encoded images only
    st.prefill(state, types.cpu(), grids, mask, inputs_tensor.device)
    state.prompt.generated = True  # later uncached forwards of generate come without grids
    hook.owner.model.rope_deltas = st.rope_deltas(state)
    # generate extends these with zeros, so what it generates is declared text
    if named.get("mm_token_type_ids") is None and state.adapter.takes_token_types:
        types = state.prompt.types
        model_kwargs["mm_token_type_ids"] = types.to(inputs_tensor.device)
    state.stash, state.pending = (types.cpu(), mask, state.pending, state.prompt), None
    return None


def _called_by_stock_generate(depth: int = 6) -> bool:
    """Whether a stock ``_prepare_position_ids_for_generation`` is among the nearest callers (a patched
    generation model replaces that method by a hook that never asks for stock positions)."""
    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return False
        if frame.f_code.co_name == "_prepare_position_ids_for_generation":
            return True
        frame = frame.f_back
    return False


def get_rope_index(hook: Hook, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``get_rope_index`` of a patched model: the design's positions ``(3, B, L)`` and ``rope_deltas (B, 1)``,
    in transformers' conventions (padding at 0; integer tensors when every position is a whole number).

    Refused where one position tensor cannot stand for the patch: layers with different geometries (AGE),
    and the call an unpatched ``generate`` around a patched bare model makes (it would pass these positions
    on and extend them with stock rules).
    """
    if _called_by_stock_generate():
        raise ValueError(
            f"patched model: {type(hook.owner).__name__}.get_rope_index was called by the generate of an unpatched "
            f"...ForConditionalGeneration around a bare model patched by ropekit; it would extend the positions "
            f"by stock rules while decoding. Patch the generation model itself: patch_model(model), not "
            f"patch_model(model.model)"
        )
    state = hook.state
    given = state.adapter.position_arguments(hook.bind(args, kwargs))
    if len(state.geometries) > 1:
        raise ValueError(
            f"patched model: get_rope_index cannot describe this patch: its layers use {len(state.geometries)} "
            f"geometries ({', '.join(state.geometries)}; an AGE schedule), each with positions of its own. Run a "
            f"forward and read ropekit.hf.last_positions(model), or ropekit.index.rope_index(..., design=NAME)"
        )
    input_ids = given["input_ids"]
    batch, length = input_ids.shape[:2]
    types = st.token_types(state, input_ids, _audio_types(state, given), batch, length, input_ids.device).cpu()
    mask = given.get("attention_mask")
    mask = (mask != 0).long().cpu() if isinstance(mask, torch.Tensor) and mask.ndim == 2 else None
    grids = (given.get("image_grid_thw"), given.get("video_grid_thw"), given.get("second_per_grid_ts"))
    if ((grids[0] is not None or grids[1] is not None) and given.get("mm_token_type_ids") is None
            and state.adapter.takes_token_types):
        _grids_without_types(state)
    pos, deltas = st.index(state, types, grids, mask, input_ids.device)
    if state.adapter.integer_positions and bool((pos == pos.round()).all()):
        pos = pos.to(input_ids.dtype)
    return pos, deltas


# --------------------------------------------------------------------------------------------------
# rotation


def _fallback_positions(state: st._State, position_ids: torch.Tensor, batch: int, length: int) -> dict:
    """Positions when the model was given ``position_ids`` itself (no design placement this forward)."""
    ids = position_ids if position_ids.ndim == 3 else position_ids[None]
    ids = ids.expand(-1, batch, -1).float()
    out = {}
    for name, geo in state.geometries.items():
        A = geo.W.shape[0]
        if ids.shape[0] == A:
            out[name] = ids
        elif bool((ids == ids[:1]).all()):
            out[name] = ids[:1].expand(A, -1, -1)
        else:
            raise ValueError(
                f"patched model: explicit position_ids with {ids.shape[0]} axes cannot drive design {name!r} "
                f"({A} axes); pass position_ids=None and let the patched model place the tokens"
            )
    return out


def _tables(state: st._State, name: str, pos: torch.Tensor, device, key: Optional[str] = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos/sin ``(B, L, D)`` of geometry ``name`` at positions ``pos (A, B, L)`` with the frequencies of
    rotary table ``key`` (None: the model's one table), in the model's layout."""
    pos = pos.to(device, torch.float32)
    W = st.frequencies(state, name, pos, key)
    factor = st.rotary(state, key)[1]
    c, s = cos_sin(angles(pos.permute(1, 2, 0), W.to(device)))
    if state.layout == "pairs":  # the model rotates channels 2j, 2j + 1 by pair j (GLM-4.1V, ERNIE-4.5-VL, Cohere)
        return c.repeat_interleave(2, dim=-1) * factor, s.repeat_interleave(2, dim=-1) * factor
    # rotate-half tables: pair j on channels j and j + R/2, so each half repeats the pair's value
    return torch.cat([c, c], dim=-1) * factor, torch.cat([s, s], dim=-1) * factor


def _prompt_tables(state: st._State, name: str, pos: torch.Tensor, device, key: Optional[str] = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_tables` of a prompt's positions ``pos``, evaluated together with its continuation table's,
    which are kept for the decoding steps that follow (one evaluation per geometry and rotary table per forward)."""
    table = state.prompt.table[name]
    cos, sin = _tables(state, name, torch.cat([pos, table.to(pos.device)], dim=2), device, key)
    n = pos.shape[2]
    state.prompt.cos_sin[(name, key)] = (table, cos[:, n:], sin[:, n:])
    return cos[:, :n].contiguous(), sin[:, :n].contiguous()  # as stock's tables are (a copy only when B > 1)


def _continuation_tables(state: st._State, name: str, device, key: Optional[str] = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of the whole continuation table of geometry ``name``, built once per table, rotary table and device.

    Every entry is computed elementwise from its own position, so columns of these tables equal the tables
    of those columns' positions bit for bit; a decoding step then slices them instead of evaluating cos/sin.
    """
    table = state.prompt.table[name]
    cached = state.prompt.cos_sin.get((name, key))
    if cached is None or cached[0] is not table or cached[1].device != device:
        cached = state.prompt.cos_sin[(name, key)] = (table, *_tables(state, name, table, device, key))
    return cached[1], cached[2]


def _this_forward(state: st._State, key: Optional[str]) -> tuple[Optional[dict], Optional[tuple]]:
    """(positions, run) placed for this forward, or (None, None) when the model was given ``position_ids``.

    A placement is taken by the first rotary call after it. A text model with several rotary tables calls its
    rotary once per table in the same forward (Gemma 3: once per layer type), so a call for a table not yet
    served in this forward gets the same placement again; a second call for the same table is a new forward.
    """
    pending, state.pending = state.pending, None
    run, state.run = state.run, None
    if not state.variants:  # one table: one rotary call per forward
        return pending, run
    if pending is not None:
        state.current = (pending, run, {key})
        return pending, run
    current = state.current
    if current is not None and key not in current[2]:
        current[2].add(key)
        return current[0], current[1]
    state.current = None
    return None, None


def rotary_forward(hook: Hook, *args: Any, **kwargs: Any) -> _Embeddings:
    """cos/sin of every geometry, once per forward (angles in float32).

    Geometries with fixed frequencies evaluate a prompt's cos/sin together with its continuation table's,
    and a decoding step that continues the prompt's text run (``state.run``) slices the latter
    (:func:`_continuation_tables`).
    """
    given = hook.bind(args, kwargs)
    x, position_ids = given["x"], given.get("position_ids")
    state = hook.state
    key = _rotary_key(state, given)
    batch, length = x.shape[0], x.shape[1]
    pending, run = _this_forward(state, key)
    if run is None or run[0] is not pending:
        run = None
    if pending is None:  # the model was given position_ids: no placement this forward
        pending, run = _fallback_positions(state, position_ids, batch, length), None
    elif any(tuple(p.shape[1:]) != (batch, length) for p in pending.values()):
        shape = tuple(next(iter(pending.values())).shape[1:])
        raise RuntimeError(
            f"patched model: the tokens were placed for a batch of shape {shape} but the language model runs "
            f"{(batch, length)}; this call path is not supported by ropekit's patch (please report it)"
        )
    geoms = {}
    with torch.no_grad():
        for name, geo in st.rotary(state, key)[0].items():
            fixed = run is not None and geo.scaling is None
            if fixed and run[1] is None:
                cos, sin = _prompt_tables(state, name, pending[name], x.device, key)
            elif fixed:
                cos, sin = _continuation_tables(state, name, x.device, key)
                cos, sin = (t[:, run[1]:run[1] + run[2]].contiguous() for t in (cos, sin))
            else:
                cos, sin = _tables(state, name, pending[name], x.device, key)
            geoms[name] = (cos, sin) if state.float32_tables else (cos.to(x.dtype), sin.to(x.dtype))
    first = geoms[state.layer_geometry[0]]
    out = _Embeddings(first)
    out.geoms, out.positions = geoms, pending
    return out


def _rotary_key(state: st._State, given: dict) -> Optional[str]:
    """Which of the model's rotary tables this rotary call asks for (Gemma 3: its ``layer_type``); None for a model
    with one table."""
    keys = [given.get(p) for p in sorted(state.adapter.rotary_params)]
    return keys[0] if len(keys) == 1 else (tuple(keys) if keys else None)


def layer_forward(hook: Hook, *args: Any, **kwargs: Any):
    """Run the layer with the cos/sin of its own geometry."""
    at = hook.names.index("position_embeddings")
    emb = kwargs.get("position_embeddings") if len(args) <= at else args[at]
    if isinstance(emb, _Embeddings):
        own = emb.geoms[hook.geometry]
        if len(args) > at:
            args = args[:at] + (own,) + args[at + 1:]
        else:
            kwargs["position_embeddings"] = own
        hook.state.last[hook.index] = emb.positions[hook.geometry]
    return hook.call_previous(*args, **kwargs)


# --------------------------------------------------------------------------------------------------
# what each hook handles of the method it replaces (checked at patch time: boundary.Contract)

_CACHE = frozenset(CACHE_NAMES)
_GRIDS = frozenset({"image_grid_thw", "video_grid_thw", "second_per_grid_ts", "mm_token_type_ids"})
#: a multimodal forward's arguments (bare and generation model): what generate's model kwargs may hold
MULTIMODAL_FORWARD = Contract(
    frozenset({"input_ids", "attention_mask", "position_ids", "inputs_embeds", "labels", "use_cache", "pixel_values",
               "pixel_values_videos", "logits_to_keep", "mm_encoder_outputs", "rope_deltas", "cache_position",
               "output_attentions", "output_hidden_states", "return_dict"}) | _CACHE | _GRIDS,
    required=(("input_ids",), ("attention_mask",), ("position_ids",), CACHE_NAMES), var_keyword=True,
)
#: a 1-D family's (LLaVA) forward, which the patch hooks to place the tokens
LM_FORWARD = Contract(
    frozenset({"input_ids", "pixel_values", "image_sizes", "pixel_values_videos", "image_sizes_videos",
               "attention_mask", "position_ids", "inputs_embeds", "vision_feature_layer",
               "vision_feature_select_strategy", "vision_aspect_ratio", "batch_num_images", "labels", "use_cache",
               "logits_to_keep", "mm_encoder_outputs", "cache_position", "output_attentions",
               "output_hidden_states", "return_dict"}) | _CACHE,
    required=(("input_ids",), ("inputs_embeds",), ("attention_mask",), ("position_ids",), CACHE_NAMES,
              ("pixel_values",)),
    var_keyword=True,
)
def contract(fn: Callable, adapter: Any) -> Contract:
    """The contract of hook ``fn`` on a model of ``adapter``'s family: the common one, knowing the family's own
    position parameters (:attr:`~ropekit.hf.adapters.Adapter.position_params`, read by its
    ``position_arguments``); ``get_rope_index`` needs no ``mm_token_type_ids`` where the family takes none."""
    base = CONTRACTS[fn]
    if fn is compute_3d_position_ids or fn is get_rope_index:
        base = base.widened(adapter.position_params)
    if fn is get_rope_index and not adapter.takes_token_types:
        base = Contract(base.known, (("input_ids",),), base.var_keyword)
    return base


CONTRACTS: dict[Callable, Contract] = {
    compute_3d_position_ids: Contract(
        frozenset({"input_ids", "inputs_embeds", "attention_mask"}) | _CACHE | _GRIDS,
        required=(("input_ids",), ("inputs_embeds",), ("attention_mask",), CACHE_NAMES),
    ),
    get_rope_index: Contract(
        frozenset({"input_ids", "attention_mask"}) | _GRIDS, required=(("input_ids",), ("mm_token_type_ids",)),
    ),
    lm_forward: LM_FORWARD,
    prepare_position_ids_for_generation: Contract(
        frozenset({"inputs_tensor", "model_kwargs"}), required=(("inputs_tensor",), ("model_kwargs",)),
    ),
    no_generation_position_ids: Contract(
        frozenset({"inputs_tensor", "model_kwargs"}), required=(("inputs_tensor",), ("model_kwargs",)),
    ),
    rotary_forward: Contract(frozenset({"x", "position_ids"}), required=(("x",), ("position_ids",))),
    layer_forward: Contract(
        frozenset({"hidden_states", "attention_mask", "position_ids", "use_cache", "cache_position",
                   "position_embeddings", "output_attentions"}) | _CACHE,
        required=(("position_embeddings",),), var_keyword=True,
    ),
}
