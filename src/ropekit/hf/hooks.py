"""The hooks of a patched model, and how they are installed and removed.

Each hook is a :class:`Hook` object set as an instance attribute (never on the transformers class). It
holds the module it sits on, what that attribute was before and the shared patch state, and nothing
else: ``copy.deepcopy`` and ``pickle`` copy it along with the model, so a copy's hooks run the copy's
modules and read the copy's state, and :func:`remove` on the copy restores the copy's own methods.

Hooked: the bare model's ``forward`` (places the tokens from the call's own arguments and hands the position
tensor on as ``position_ids``) and ``get_rope_index`` (the design's positions when called directly), the text
model's ``forward`` (attention masks from the text row), its ``rotary_emb.forward`` (cos/sin per geometry), each
decoder layer's ``forward`` (its geometry's cos/sin) and, on the generation class,
``_prepare_position_ids_for_generation`` (``generate`` carries the design's position tensor as data) and, on
families whose ``prepare_inputs_for_generation`` drops that tensor, that method (it hands the tensor on).
No hook keeps anything between calls: what a request's decoding needs is kept with the KV cache it passes.

Each hook function comes with a :class:`~ropekit.hf.boundary.Contract`: the parameters it handles of the
method it replaces. :func:`install` checks it against the installed transformers (refusing what it does
not know) and hooks read their arguments through :meth:`Hook.bind`, by the installed signature's names.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

import torch
from torch import nn

from ..rotations.planar import product
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
        #: the keyword the replaced method takes its KV cache by (if it takes one)
        self.cache_name = next((n for n in CACHE_NAMES if n in self.names), CACHE_NAMES[0])
        self.__dict__.update(data)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(self, *args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:
        """The replaced method's signature, so code that reads ``inspect.signature(model.forward)`` (transformers'
        tests, the Trainer's column filter) sees the parameters it had."""
        return inspect.signature(getattr(type(self.owner), self.name).__get__(self.owner))

    def bind(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        """This call's arguments by parameter name (refusing a keyword outside the contract)."""
        return self.contract.bind(f"{type(self.owner).__name__}.{self.name}", self.names, args, kwargs)

    def call_previous(self, *args: Any, **kwargs: Any) -> Any:
        """What the attribute did before the patch (the class method unless one was set on the instance)."""
        if type(self.previous) is str:  # _MISSING (a copy of it, after pickling)
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


# --------------------------------------------------------------------------------------------------
# positions: computed from a forward's own arguments (or the cache it passes), handed on as position_ids


def _cache_length(cache: Any) -> tuple[bool, Any]:
    """(whether the cache holds tokens, how many): an int, or a 0-d tensor for static caches."""
    if cache is None:
        return False, 0
    n = cache.get_seq_length()
    if isinstance(n, torch.Tensor):  # static caches count on the device; ask whether they were written
        return bool(getattr(cache, "is_initialized", True)), n
    return n > 0, n


#: the attribute under which a KV cache keeps the :class:`~ropekit.hf.state.Continuation` of the prompt it holds
CONTINUATION = "ropekit_continuation"


def continuation_of(cache: Any) -> Optional[st.Continuation]:
    """The continuation a patched model kept with ``cache`` when it placed the prompt the cache holds."""
    return None if cache is None else getattr(cache, CONTINUATION, None)


def _keep_with(cache: Any, record: st.Continuation) -> None:
    if cache is not None:
        cache.__dict__[CONTINUATION] = record


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


def _types_from_embeddings(owner: nn.Module, state: st._State, inputs_embeds: torch.Tensor) -> torch.Tensor:
    """Vision tokens among ``inputs_embeds`` without ids: rows equal to the image/video token's embedding
    (how transformers finds its placeholders when it has no ids)."""
    table = owner.get_input_embeddings()
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


#: what a 1-D family's forward takes images or videos by: without all of them its tokens are text
_LM_VISION = ("pixel_values", "pixel_values_videos", "mm_encoder_outputs")


def _inputs(owner: nn.Module, state: st._State, given: dict) -> tuple:
    """(token types ``(B, L)`` on the CPU, grids, 2-D 0/1 mask on the CPU or None, batch, length, device, plan) of
    a fresh sequence, from a forward's (or :func:`ropekit.hf.position_ids`') arguments by name; ``plan`` the
    per-sample layouts of a family whose prompt plans what the model generates (else None)."""
    input_ids, embeds = given.get("input_ids"), given.get("inputs_embeds")
    ref = embeds if embeds is not None else input_ids
    if ref is None:
        raise ValueError("patched model: neither input_ids nor inputs_embeds was given")
    batch, length = ref.shape[:2]
    mask = given.get("attention_mask")
    mask = (mask != 0).long().cpu() if isinstance(mask, torch.Tensor) and mask.ndim == 2 else None
    if mask is not None and mask.shape[1] != length:
        mask = None  # not a mask over these tokens alone
    if state.adapter.one_d:
        if input_ids is not None:
            types = st.token_types(state, input_ids, None, batch, length, ref.device)
        else:
            types = _types_from_embeddings(owner, state, embeds)
        types, images, videos = state.adapter.vision_inputs(owner, types, given)
        return types.cpu(), (images, videos, None), mask, batch, length, ref.device, None
    named = state.adapter.position_arguments(given)
    grids = (named.get("image_grid_thw"), named.get("video_grid_thw"), named.get("second_per_grid_ts"))
    types_given = _audio_types(state, named)
    if (grids[0] is not None or grids[1] is not None) and types_given is None and input_ids is None:
        _grids_without_types(state)
    _videos_without_types(state, grids[1], types_given)
    types = st.token_types(state, input_ids, types_given, batch, length, ref.device)
    if types_given is None:
        types = st.stray_vision_as_text(state, types, input_ids, grids)
    if types.shape[1] != length:
        raise ValueError(
            f"patched model: mm_token_type_ids covers {types.shape[1]} tokens but the input has {length}; give "
            f"mm_token_type_ids for every token"
        )
    return types.cpu(), grids, mask, batch, length, ref.device, _plan(state, input_ids, mask, named, batch, length)


def _plan(state: st._State, input_ids, mask, named: dict, batch: int, length: int) -> Optional[list]:
    """The per-sample layouts of a family whose prompt plans what the model generates (read off the ids by its
    adapter), or None for the other families."""
    if state.plan_tokens is None:
        return None
    ids = None if input_ids is None else input_ids.cpu()
    return state.adapter.plan_layouts(state.plan_tokens, ids, mask, named, batch, length)


@torch.compiler.disable
def placement(owner: nn.Module, state: st._State, given: dict) -> tuple[torch.Tensor, st.Continuation]:
    """The position tensor of a fresh sequence and its continuation, from a forward's arguments by name.

    Run eagerly, also inside ``torch.compile`` (a graph break): placing reads the layout off the tokens."""
    types, grids, mask, _, _, device, plan = _inputs(owner, state, given)
    return st.place(state, types, grids, mask, device, plan)


def _new_tokens_are_text(owner: nn.Module, state: st._State, given: dict, length: int) -> None:
    input_ids, types = given.get("input_ids"), given.get("mm_token_type_ids")
    if state.adapter.one_d and all(given.get(k) is None for k in _LM_VISION):
        return  # image token ids without images are text in 1-D families, as in stock
    if types is not None:
        st.check_no_vision(types[:, -length:])
    elif input_ids is not None:
        st.check_ids_are_text(state, input_ids[:, -length:])
    elif any(given.get(k) is not None for k in ("image_grid_thw", "video_grid_thw", "pixel_values",
                                                  "pixel_values_videos")):
        _grids_without_types(state)
    elif given.get("inputs_embeds") is not None:  # no ids: the image token's embedding gives it away
        st.check_no_vision(_types_from_embeddings(owner, state, given["inputs_embeds"][:, -length:]))


def _positions_of_call(owner: nn.Module, state: st._State, given: dict, cache: Any
                       ) -> tuple[torch.Tensor, Optional[st.Continuation]]:
    """Positions of a forward given no ``position_ids``: a fresh sequence is placed; new tokens after a cache
    continue the prompt that cache holds (its :class:`~ropekit.hf.state.Continuation`)."""
    ref = given.get("inputs_embeds") if given.get("inputs_embeds") is not None else given.get("input_ids")
    cached, past = _cache_length(cache)
    if not cached:
        return placement(owner, state, given)
    batch, length = ref.shape[:2]
    _new_tokens_are_text(owner, state, given, length)
    record = continuation_of(cache)
    if record is None:
        raise ValueError(
            "patched model: this KV cache holds tokens the patched model did not place (it was filled with explicit "
            "position_ids, by generate, or by another model), so where its text continues is not known; pass "
            "position_ids for the new tokens (ropekit.hf.position_ids of the whole sequence, sliced), or prefill "
            "through the patched model without position_ids"
        )
    mask = given.get("attention_mask")
    mask = mask if isinstance(mask, torch.Tensor) and mask.ndim == 2 else None
    if mask is not None and (mask.shape[1] <= length or (isinstance(past, int) and mask.shape[1] != past + length)):
        mask = None  # not a mask over cache + new tokens
    return st.follow(record, mask, past, batch, length, ref.device), None


def check_position_ids(state: st._State, pos: torch.Tensor, has_vision: bool, where: str) -> None:
    """Refuse given ``position_ids`` that cannot drive this patch: not its row count, or 1-D text positions
    for a sequence holding images or videos under a design that places them otherwise."""
    rows = state.num_rows
    if pos.ndim == 3 and pos.shape[0] in (rows, rows - 1):
        return
    layout = " + ".join(f"{name} ({axes})" for name, axes in state.rows)
    fix = ("compute them with ropekit.hf.position_ids(model, **inputs) (packed rows: ropekit.hf.pack or "
           "ropekit.hf.PackingCollator)")
    if pos.ndim == 3:
        raise ValueError(
            f"patched model: {where} got position_ids with {pos.shape[0]} rows, but this patch takes {rows}: the "
            f"text row, then {layout} rows{' (one block per AGE geometry)' if len(state.rows) > 1 else ''}; {fix}"
        )
    text_only = all(geo.design == "vanilla" for geo in state.geometries.values())
    if has_vision and not text_only:
        raise ValueError(
            f"patched model: {where} got 1-D position_ids (text positions, such as DataCollatorWithFlattening's) "
            f"together with images or videos; they would place every image token on the text axis. Pass the "
            f"design's position tensor instead: {fix}. (An unpatched generate passes such positions when only the "
            f"bare model was patched: patch the generation model itself, patch_model(model), not "
            f"patch_model(model.model).)"
        )


def _has_vision(state: st._State, given: dict) -> bool:
    keys = ("image_grid_thw", "video_grid_thw", "pixel_values", "pixel_values_videos", "mm_encoder_outputs")
    return any(given.get(k) is not None for k in keys)


def model_forward(hook: Hook, *args: Any, **kwargs: Any):
    """The bare model's forward: place the tokens from the call's own arguments (or continue the cache's prompt)
    and run the stock forward with that position tensor; given ``position_ids`` are checked and used as given."""
    given = hook.bind(args, kwargs)
    state = hook.state
    pos = given.get("position_ids")
    if pos is not None:
        check_position_ids(state, pos, _has_vision(state, given), type(hook.owner).__name__)
        _forward_masks(state, given, pos)
        return hook.call_previous(**given)
    name = hook.cache_name
    cache = cache_of(given)
    if cache is None and given.get("use_cache") and not torch.jit.is_tracing():
        from transformers import DynamicCache  # the cache the text model would create, made here to keep the
        cache = DynamicCache(config=hook.text_config)  # prompt's continuation with it
    given["position_ids"], record = _positions_of_call(hook.owner, state, given, cache)
    if record is not None:
        _keep_with(cache, record)
    for other in CACHE_NAMES:
        given.pop(other, None)
    if cache is not None:
        given[name] = cache
    _forward_masks(state, given, given["position_ids"])
    return hook.call_previous(**given)


def _forward_masks(state: st._State, given: dict, pos: torch.Tensor) -> None:
    """Families whose bare forward builds the masks (:attr:`~ropekit.hf.adapters.Adapter.masks_in_forward`) read
    packed rows off 1-D positions there: without a mask or cached tokens, an all-ones mask stands for "no padding"
    (the same masks as none); packed rows are refused, their image blocks' two-way masks being the family's own."""
    if not state.adapter.masks_in_forward or given.get("attention_mask") is not None or pos.ndim != 3:
        return
    if _cache_length(cache_of(given))[0]:
        return
    ref = given.get("inputs_embeds") if given.get("inputs_embeds") is not None else given.get("input_ids")
    if pos.shape[0] == state.num_rows and not torch.compiler.is_compiling():
        from transformers.masking_utils import find_packed_sequence_indices
        if find_packed_sequence_indices(pos[0]) is not None:
            raise ValueError(
                f"patched model: packed rows are not supported on {state.adapter.name}: its forward builds the "
                f"attention masks itself (images attend both ways), and not per packed sample; give padded batches"
            )
    given["attention_mask"] = torch.ones(ref.shape[:2], dtype=torch.long, device=ref.device)


def prepare_position_ids_for_generation(hook: Hook, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``generate``'s position ids: the design's position tensor of the prompt, which ``generate`` then carries
    (and extends by one on every row per new token) as data.

    Also hands ``generate`` the token types, so that tokens it generates are text by declaration, whatever their
    id. Continuing from a cache a patched forward filled reads that cache's continuation.
    """
    given = hook.bind(args, kwargs)
    inputs_tensor, model_kwargs = given["inputs_tensor"], given["model_kwargs"]
    state = hook.state
    inner = hook.inner
    cache = cache_of(model_kwargs)
    cached, past = _cache_length(cache)
    input_ids = model_kwargs.get("input_ids")
    if input_ids is None or input_ids.shape[1] == 0:
        is_ids = inputs_tensor.ndim == 2 and not inputs_tensor.is_floating_point()
        input_ids = inputs_tensor if is_ids else None
    batch, length = inputs_tensor.shape[:2]
    mask = model_kwargs.get("attention_mask")
    mask = mask if isinstance(mask, torch.Tensor) and mask.ndim == 2 else None
    named = state.adapter.position_arguments(model_kwargs)
    grids = named.get("image_grid_thw") is not None or named.get("video_grid_thw") is not None
    if cached and input_ids is not None and input_ids.shape[1] > int(past) and (
            grids or (state.adapter.one_d and st.places_grids_as_text(state))):
        # the whole sequence and its grids are given, or on a 1-D family the patch places images as text (vanilla:
        # the positions need no images): place it all (generate keeps the uncached tail)
        cached = False
        types = model_kwargs.get("mm_token_type_ids")
        if isinstance(types, torch.Tensor) and types.ndim == 2 and types.shape[1] < input_ids.shape[1]:
            # the types of the prompt before the tokens a generate made: those are text, as generate extends the
            # types itself at every step
            model_kwargs["mm_token_type_ids"] = torch.nn.functional.pad(types, (0, input_ids.shape[1] - types.shape[1]))
    if cached:
        record = continuation_of(cache)
        if record is None:
            raise ValueError(
                "patched model: generate continues from a cache the patched model did not fill itself (a "
                "generate's own cache, or one filled with explicit position_ids); its text positions are not "
                "known. Prefill the cache with a forward of the patched model, or generate from the whole sequence"
            )
        full = length if input_ids is None else input_ids.shape[1]
        new = full - int(past) if mask is None else mask.shape[1] - int(past)
        tail = st.follow(record, None if mask is None else mask, past, batch, new, inputs_tensor.device)
        head = torch.zeros(tail.shape[0], batch, (full if mask is None else mask.shape[1]) - new,
                           device=tail.device)
        return torch.cat([head, tail], dim=2)
    call = dict(model_kwargs)
    call["input_ids"] = input_ids
    if input_ids is None:
        call["inputs_embeds"] = inputs_tensor if inputs_tensor.is_floating_point() else None
    pos, record = placement(inner, state, call)
    # (a prompt that plans what follows it continues on that plan, which its family's decoding reads off the cache)
    ends_in_text = record.plan is not None or torch.equal(record.start, pos[1:, :, -1] + 1)
    if not ends_in_text:
        raise ValueError(
            "patched model: the prompt ends with an image or video block, so generate's rule for the next "
            "token (the last position + 1 on every axis) would not give the design's own place for the text "
            "after it; end the prompt with text (as chat templates do), or decode with your own loop and a cache"
        )
    if state.adapter.generate_shift:  # the family's prepare_inputs_for_generation adds it back at every step
        pos = pos - state.adapter.generate_shift
    types = state.adapter.takes_token_types and model_kwargs.get("mm_token_type_ids") is None
    if types and not state.adapter.one_d:  # generate extends these with zeros: what it generates is text
        named = state.adapter.position_arguments(model_kwargs)
        if named.get("image_grid_thw") is not None or named.get("video_grid_thw") is not None:
            types_cpu = _inputs(inner, state, call)[0]
            types_cpu = types_cpu.masked_fill(types_cpu >= st.MARKER, 0)  # markers are text to the model
            model_kwargs["mm_token_type_ids"] = types_cpu.to(inputs_tensor.device)
    return pos


def get_rope_index(hook: Hook, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``get_rope_index`` of a patched model: the design's positions ``(A, B, L)`` and ``rope_deltas (B, 1)``,
    in transformers' conventions (padding at 0; integer tensors when every position is a whole number).

    Refused where one position tensor in transformers' form cannot stand for the patch: layers with different
    geometries (AGE); :func:`ropekit.hf.position_ids` gives every geometry's rows.
    """
    state = hook.state
    given = state.adapter.position_arguments(hook.bind(args, kwargs))
    if len(state.geometries) > 1:
        raise ValueError(
            f"patched model: get_rope_index cannot describe this patch: its layers use {len(state.geometries)} "
            f"geometries ({', '.join(state.geometries)}; an AGE schedule), each with positions of its own. Use "
            f"ropekit.hf.position_ids(model, **inputs), which gives every geometry's rows"
        )
    input_ids = given["input_ids"]
    batch, length = input_ids.shape[:2]
    types_given = _audio_types(state, given)
    types = st.token_types(state, input_ids, types_given, batch, length, input_ids.device).cpu()
    mask = given.get("attention_mask")
    mask = (mask != 0).long().cpu() if isinstance(mask, torch.Tensor) and mask.ndim == 2 else None
    grids = (given.get("image_grid_thw"), given.get("video_grid_thw"), given.get("second_per_grid_ts"))
    if types_given is None:
        types = st.stray_vision_as_text(state, types, input_ids, grids)
    if ((grids[0] is not None or grids[1] is not None) and given.get("mm_token_type_ids") is None
            and state.adapter.takes_token_types):
        _grids_without_types(state)
    plan = _plan(state, input_ids, mask, given, batch, length)
    pos, deltas = st.index(state, types, grids, mask, input_ids.device, plan)
    if state.adapter.integer_positions and bool((pos == pos.round()).all()):
        pos = pos.to(input_ids.dtype)
    return pos, deltas


# --------------------------------------------------------------------------------------------------
# the text model: attention masks from the text row


def text_forward(hook: Hook, *args: Any, **kwargs: Any):
    """The language model's forward given a position tensor: the masks transformers would build from 1-D
    positions are built from its text row (row 0), then the stock forward runs with the whole tensor.

    Without an attention mask and cached tokens, transformers reads packed sequences off the positions (an empty cache,
    which a forward given ``use_cache=True`` makes, changes nothing here): packed rows
    (the text row restarting) get a block-diagonal mask made from the text row; otherwise an all-ones mask stands
    for "no padding", which builds the same mask as none.
    """
    given = hook.bind(args, kwargs)
    pos, mask = given.get("position_ids"), given.get("attention_mask")
    state = hook.state
    if not (isinstance(pos, torch.Tensor) and pos.ndim == 3 and pos.shape[0] == state.num_rows) or mask is not None:
        return hook.call_previous(**given)
    if _cache_length(cache_of(given))[0]:  # after cached tokens transformers reads no positions for masks
        return hook.call_previous(**given)
    embeds = given.get("inputs_embeds")
    ref = embeds if embeds is not None else given["input_ids"]
    batch, length = ref.shape[:2]
    text = pos[0]
    from transformers.masking_utils import find_packed_sequence_indices
    config = hook.owner.config
    packed = find_packed_sequence_indices(text) if not torch.compiler.is_compiling() else None
    flash = "flash" in str(getattr(config, "_attn_implementation", ""))
    if packed is not None:
        _packable_layers(config)  # under flash attention too: the layer types below do not read its boundaries
    if packed is None or flash:  # flash attention reads packed rows off the layers' 1-D position_ids
        given["attention_mask"] = torch.ones(batch, length, dtype=torch.long, device=ref.device)
        return hook.call_previous(**given)
    given["attention_mask"] = _packed_masks(hook.owner, text, batch, length, ref)
    return hook.call_previous(**given)


def _packed_masks(text_model: nn.Module, text: torch.Tensor, batch: int, length: int, ref: torch.Tensor):
    """transformers' masks of packed rows from their 1-D text positions: one mask, or one per layer type."""
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    config = text_model.config
    dtype = ref.dtype if ref.is_floating_point() else text_model.get_input_embeddings().weight.dtype
    shape = torch.empty((batch, length, 0), dtype=dtype, device=ref.device)
    from .boundary import cache_keyword

    common = dict(config=config, inputs_embeds=shape, attention_mask=None, position_ids=text.long(),
                  allow_is_causal_skip=False)
    common[cache_keyword(create_causal_mask)] = None  # "cache" since transformers 5.24, "past_key_values" before
    kinds = _packable_layers(config)
    if kinds == {"full_attention"}:
        return create_causal_mask(**common)
    # indexed (sparse) attention layers pick their keys among those a causal mask allows (HY-V4-VL, Qwen4-Exp)
    makers = {"full_attention": create_causal_mask, "sliding_attention": create_sliding_window_causal_mask,
              "indexed_attention": create_causal_mask}
    return {kind: makers[kind](**common) for kind in kinds}


_PACKABLE = frozenset({"full_attention", "sliding_attention", "indexed_attention"})


def _packable_layers(config: Any) -> set:
    """The text model's layer types, refused for packed rows where a type would carry one sample into the next."""
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    unknown = kinds - _PACKABLE
    if unknown:
        raise ValueError(
            f"patched model: packed rows are not supported with attention layer types {sorted(unknown)}"
            + (" (chunked attention cuts a row into chunks by token index, so a packed sample would see other chunks "
               "than it sees alone)" if "chunked_attention" in unknown else "")
            + (" (a short convolution mixes each token with the tokens before it, across the samples' boundaries)"
               if "conv" in unknown else "")
            + (" (a linear-attention layer's short convolution mixes each token with the tokens before it, across "
               "the samples' boundaries, whatever the attention implementation)"
               if "linear_attention" in unknown else "") + "; give padded batches")
    return kinds


# --------------------------------------------------------------------------------------------------
# rotation


def _geometry_rows(state: st._State, position_ids: torch.Tensor, batch: int, length: int) -> dict:
    """Each geometry's positions ``(A, B, L)`` from the position tensor the rotary is given: the whole tensor
    (text row first), its geometry rows (transformers split off the text row), or 1-D text positions of a text-only
    call (every axis of every geometry at the text position)."""
    rows = state.num_rows
    if position_ids.ndim == 3 and position_ids.shape[0] in (rows, rows - 1):
        geo = position_ids[1:] if position_ids.shape[0] == rows else position_ids
        geo = geo.expand(-1, batch, -1)
        return state.split(geo if geo.dtype == torch.float32 else geo.float())
    ids = position_ids if position_ids.ndim == 3 else position_ids[None]
    ids = ids.expand(-1, batch, -1).float()
    if ids.shape[0] != 1 and not torch.compiler.is_compiling() and not bool((ids == ids[:1]).all()):
        raise ValueError(
            f"patched model: the rotary got position_ids with {ids.shape[0]} rows that differ, but this patch takes "
            f"{rows} rows (text, then {', '.join(f'{n} ({a})' for n, a in state.rows)}); compute them with "
            f"ropekit.hf.position_ids(model, **inputs)"
        )
    return {name: ids[:1].expand(axes, -1, -1) for name, axes in state.rows}


def _tables(state: st._State, name: str, pos: torch.Tensor, device, key: Optional[str] = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos/sin ``(B, L, D)`` of geometry ``name`` at positions ``pos (A, B, L)`` with the frequencies of
    rotary table ``key`` (None: the model's one table), in the model's layout; on a model with complex tables
    (``state.complex_tables``) ``(e^{i theta} (B, L, D/2), None)``."""
    if pos.device != device or pos.dtype != torch.float32:  # (a no-op .to still costs a dispatch per step)
        pos = pos.to(device, torch.float32)
    W = st.frequencies(state, name, pos, key)
    factor = st.rotary(state, key)[1]
    # the angles without angles()' finiteness read-back: W is built finite at patch time and the positions come
    # from the patch's placement or the caller (non-finite ones give non-finite logits, as in the stock model)
    a = product(pos.permute(1, 2, 0), W if W.device == pos.device else W.to(pos.device))
    if state.complex_tables:  # one e^{i theta} per pair (Llama 4 multiplies channels 2j, 2j + 1 as complex numbers)
        return torch.polar(torch.ones_like(a), a) * factor, None
    if state.layout == "pairs":  # the model rotates channels 2j, 2j + 1 by pair j (GLM-4.1V, ERNIE-4.5-VL, Cohere)
        a = a.repeat_interleave(2, dim=-1)
    else:  # rotate-half tables: pair j on channels j and j + R/2, so each half repeats the pair's value
        a = torch.cat([a, a], dim=-1)
    c, s = a.cos(), a.sin()  # elementwise: the same bits as the cos/sin of each half, repeated
    if factor != 1.0:  # x * 1.0 is x: skipped, two ops fewer per table
        c, s = c * factor, s * factor
    return c, s


def rotary_forward(hook: Hook, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of every geometry at the positions given (angles in float32).

    One geometry: ``(cos, sin)`` as the stock rotary returns them. Several (AGE): every geometry's tables side by
    side on the last dimension, in the order of the position tensor's blocks; each decoder layer takes its own
    (:func:`layer_forward`); a model whose rotary returns complex tables (Llama 4) gets one complex tensor. Plain
    tensors in a plain tuple, so wrappers that rebuild or cast the layers' arguments
    (FSDP2 mixed precision, activation checkpointing) carry them whole.
    """
    given = hook.bind(args, kwargs)
    x, position_ids = given["x"], given.get("position_ids")
    state = hook.state
    key = _rotary_key(hook, state, given)
    batch, length = x.shape[0], x.shape[1]
    if position_ids is None:
        position_ids = torch.arange(length, device=x.device)[None].expand(batch, -1)
    pos = _geometry_rows(state, position_ids, batch, length)
    if not torch.compiler.is_compiling():
        state.observed = dict(pos)
    if torch.is_grad_enabled():
        with torch.no_grad():
            cos, sin = _all_tables(state, pos, x, key)
    else:  # (generate and inference already run without grad: no context to enter per step)
        cos, sin = _all_tables(state, pos, x, key)
    if not sin:  # complex tables, laid out in memory as the stock rotary lays out its own (which differs between
        # releases): the attention's complex product rounds by its kernel, which follows the layout
        table = cos[0] if len(cos) == 1 else torch.cat(cos, dim=-1)
        stock = hook.call_previous(x, position_ids=torch.zeros(batch, length, dtype=torch.long, device=x.device))
        return torch.empty_like(stock).copy_(table) if stock.shape == table.shape else table
    if len(cos) == 1:
        return cos[0], sin[0]
    return torch.cat(cos, dim=-1), torch.cat(sin, dim=-1)


def _all_tables(state: st._State, pos: dict, x: torch.Tensor, key: Optional[str]) -> tuple[list, list]:
    """Every geometry's cos and sin tables (:func:`_tables`) in the dtype the rotary returns them in."""
    cos, sin = [], []
    for name in st.rotary(state, key)[0]:
        c, s = _tables(state, name, pos[name], x.device, key)
        if s is None:  # complex tables, as the stock rotary returns them
            cos.append(c)
            continue
        cos.append(c if state.float32_tables or c.dtype == x.dtype else c.to(x.dtype))
        sin.append(s if state.float32_tables or s.dtype == x.dtype else s.to(x.dtype))
    return cos, sin


def _rotary_key(hook: Hook, state: st._State, given: dict) -> Optional[str]:
    """Which of the model's rotary tables this rotary call asks for (Gemma 3: its ``layer_type``); None for a model
    with one table. A family with one rotary module per table (Molmo2) names it at install (``table``)."""
    if getattr(hook, "table", None) is not None:
        return hook.table
    params = state.adapter.rotary_params
    if not params:
        return None
    keys = [given.get(p) for p in sorted(params)]
    return keys[0] if len(keys) == 1 else tuple(keys)


def layer_forward(hook: Hook, *args: Any, **kwargs: Any):
    """Run the layer with the cos/sin of its own geometry (its block of the tables the rotary put side by side) and
    the text row as its 1-D ``position_ids`` (what flash attention reads packed rows off)."""
    if hook.blocks == 1 and len(args) == 1 and hook.names[0] == "hidden_states":
        pos = kwargs.get("position_ids")
        if pos is None or pos.ndim != 3:  # one geometry and 1-D positions (as the text models split them off):
            return hook.call_previous(*args, **kwargs)  # nothing to translate
    given = hook.bind(args, kwargs)
    emb = given.get("position_embeddings")
    if isinstance(emb, torch.Tensor) and hook.blocks > 1:  # one complex table (Llama 4)
        width = emb.shape[-1] // hook.blocks
        given["position_embeddings"] = emb[..., hook.block * width:(hook.block + 1) * width]
    elif emb is not None and hook.blocks > 1:
        cos, sin = emb
        width = cos.shape[-1] // hook.blocks
        at = hook.block * width
        given["position_embeddings"] = (cos[..., at:at + width], sin[..., at:at + width])
    pos = given.get("position_ids")
    if isinstance(pos, torch.Tensor) and pos.ndim == 3:
        given["position_ids"] = pos[0].long()
    # hidden_states positionally: transformers' activation checkpointing checkpoints the layer's positional
    # arguments only, and a layer given its input by keyword would drop out of the gradient (use_reentrant=True)
    return hook.call_previous(given.pop("hidden_states"), **given)


def keep_generate_positions(hook: Hook, *args: Any, **kwargs: Any) -> dict:
    """The family's ``prepare_inputs_for_generation``, handing on the position ids ``generate`` carries where the
    family drops them (:attr:`~ropekit.hf.adapters.Adapter.generate_drops_positions`): sliced to the step's tokens,
    as transformers' own ``prepare_inputs_for_generation`` slices them. They are the design's position tensor, and
    the first forward of ``generate`` no longer has the grids it would need to place the prompt again."""
    given = hook.bind(args, kwargs)
    pos = given.get("position_ids")
    out = hook.call_previous(*args, **kwargs)
    if isinstance(pos, torch.Tensor) and out.get("position_ids") is None:
        ref = out.get("input_ids") if out.get("input_ids") is not None else out.get("inputs_embeds")
        out["position_ids"] = pos[..., -ref.shape[1]:].clone(memory_format=torch.contiguous_format)
    return out


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
    if fn is get_rope_index:
        base = base.widened(adapter.position_params)
    if fn is get_rope_index and not adapter.takes_token_types:
        base = Contract(base.known, (("input_ids",),), base.var_keyword)
    return base


CONTRACTS: dict[Callable, Contract] = {
    model_forward: MULTIMODAL_FORWARD,
    # stock get_rope_index ignores the other model kwargs generate hands it (pixel_values, …); so does the hook
    get_rope_index: Contract(
        frozenset({"input_ids", "attention_mask"}) | _GRIDS, required=(("input_ids",), ("mm_token_type_ids",)),
        var_keyword=True,
    ),
    prepare_position_ids_for_generation: Contract(
        frozenset({"inputs_tensor", "model_kwargs"}), required=(("inputs_tensor",), ("model_kwargs",)),
    ),
    rotary_forward: Contract(frozenset({"x", "position_ids"}), required=(("x",), ("position_ids",))),
    keep_generate_positions: Contract(
        frozenset({"input_ids", "position_ids", "attention_mask", "inputs_embeds", "next_sequence_length",
                   "is_first_iteration"}) | _CACHE, required=(("input_ids",),), var_keyword=True,
    ),
    text_forward: Contract(
        frozenset({"input_ids", "attention_mask", "position_ids", "inputs_embeds", "use_cache", "cache_position",
                   "output_attentions", "output_hidden_states", "return_dict"}) | _CACHE,
        required=(("attention_mask",), ("position_ids",), ("inputs_embeds",)), var_keyword=True,
    ),
    layer_forward: Contract(
        frozenset({"hidden_states", "attention_mask", "position_ids", "use_cache", "cache_position",
                   "position_embeddings", "output_attentions"}) | _CACHE,
        required=(("position_embeddings",),), var_keyword=True,
    ),
}
