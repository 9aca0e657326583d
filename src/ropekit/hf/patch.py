"""ropekit position designs, allocations and AGE schedules inside Hugging Face Qwen-VL models.

:func:`patch_model` rewires one model *instance* (never the transformers classes) so that

- its multimodal positions come from a ropekit design (float coordinates allowed), computed with
  :func:`ropekit.index.rope_index` from the same inputs transformers uses (``mm_token_type_ids``,
  ``image_grid_thw``, ``video_grid_thw``, ``attention_mask``);
- its rotation is the frequency matrix of a ropekit allocation (SPEC §4), evaluated once per geometry
  per forward (Circle-RoPE paper §4.2: AGE gives each decoder layer one of several geometries);
- cached decoding reads every geometry's positions for the text after the prompt from the design
  itself, so ``generate`` sees exactly the positions one teacher-forced forward over the whole
  sequence gives.

Four hooks are set as instance attributes and removed again by :func:`unpatch_model`: the model's
``compute_3d_position_ids`` (positions), the text model's ``rotary_emb.forward`` (cos/sin per geometry),
each decoder layer's ``forward`` (picks its geometry's cos/sin) and, on the generation class,
``_prepare_position_ids_for_generation`` (so ``generate`` lets the model place its tokens itself).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence, Union

import torch
from torch import nn

from ..age import age_schedule
from ..designs import get_design, positions
from ..designs.registry import check_options
from ..index import rope_index
from ..apply.planar import cos_sin
from ..rotations.planar import angles, frequency_matrix

__all__ = ["patch_model", "unpatch_model", "last_positions", "layer_designs", "is_patched", "SUPPORTED_MODEL_TYPES"]

# model_type -> (native allocation for a 3-axis design, default mrope_section)
SUPPORTED_MODEL_TYPES: dict[str, tuple[str, tuple[int, ...]]] = {
    "qwen2_vl": ("mrope", (16, 24, 24)),
    "qwen2_5_vl": ("mrope", (16, 24, 24)),
    "qwen3_vl": ("interleaved", (24, 20, 20)),
}

_STATE_ATTR = "_ropekit_patch"
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

    model_type: str
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


class _Embeddings(tuple):
    """``(cos, sin)`` of the first geometry that also carries every geometry's pair and positions.

    Decoder layers receive this object through ``position_embeddings``; patched layers pick their own
    geometry from it, so a re-run under gradient checkpointing sees the same values as the first run.
    """

    geoms: dict[str, tuple[torch.Tensor, torch.Tensor]]
    positions: dict[str, torch.Tensor]


# --------------------------------------------------------------------------------------------------
# locating the parts of a model


def _parts(model: nn.Module) -> tuple[Optional[nn.Module], nn.Module, nn.Module, str]:
    """(generation wrapper or None, bare model, text model, model_type) of a supported model."""
    supported = ", ".join(SUPPORTED_MODEL_TYPES)
    if not isinstance(model, nn.Module):
        raise TypeError(f"patch_model: `model` must be a transformers model (nn.Module), got {type(model).__name__}")
    mtype = getattr(getattr(model, "config", None), "model_type", None)
    if mtype not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"patch_model: unsupported model type {mtype!r} ({type(model).__name__}); supported: {supported} "
            f"(their ...ForConditionalGeneration or bare ...Model classes)"
        )
    top, inner = (model, model.model) if hasattr(model, "lm_head") and hasattr(model, "model") else (None, model)
    text = getattr(inner, "language_model", None)
    if not hasattr(inner, "compute_3d_position_ids") or text is None or not hasattr(text, "rotary_emb"):
        raise ValueError(
            f"patch_model: {type(model).__name__} is not a supported multimodal model; pass the "
            f"...ForConditionalGeneration or the bare ...Model of: {supported}"
        )
    return top, inner, text, mtype


def _state(model: nn.Module) -> Optional[_State]:
    inner = model.model if hasattr(model, "lm_head") and hasattr(model, "model") else model
    return inner.__dict__.get(_STATE_ATTR)


def is_patched(model: nn.Module) -> bool:
    """Whether :func:`patch_model` is in effect on ``model``."""
    return _state(model) is not None


# --------------------------------------------------------------------------------------------------
# configuration → geometries


def _resolve_layers(design: Union[str, Sequence[str]], age: Any, num_layers: int) -> list[str]:
    """Design name per decoder layer: ``design`` everywhere, or an AGE schedule (paper §4.2)."""
    if age is None:
        if not isinstance(design, str):
            raise TypeError(
                f"patch_model: `design` must be a design name; a pair {tuple(design)!r} needs an AGE schedule `age=`"
            )
        return [get_design(design).name] * num_layers
    if isinstance(design, str):
        pair = (design, "mrope")
    else:
        pair = tuple(design)
        if len(pair) != 2 or not all(isinstance(d, str) for d in pair):
            raise ValueError(f"patch_model: `design` must be a name or a pair of names for AGE, got {design!r}")
    if not isinstance(age, str) and len(list(age)) != num_layers:
        raise ValueError(
            f"patch_model: the AGE schedule list has {len(list(age))} entries but the model has {num_layers} "
            f"decoder layers; give exactly one entry (bool or design name) per layer"
        )
    return [get_design(n).name for n in age_schedule(age, num_layers, designs=pair)]


def _pick(spec: Any, name: str) -> Any:
    """A per-design setting: one value for all designs, or a mapping design name → value."""
    if isinstance(spec, Mapping):
        known = {get_design(k).name: v for k, v in spec.items()}
        return known.get(name)
    return spec


def _geometry(
    name: str, options: dict, allocation: Optional[str], head_dim: int, base: float, sections: Sequence[int],
    native: str,
) -> _Geometry:
    d = get_design(name)
    check_options(d, options)
    num_axes = positions("T1", name, **options).shape[1]  # a design's axis count is the same for every layout
    alloc = allocation or (native if d.allocation == "mrope" else d.allocation)
    secs = list(sections) if alloc in ("mrope", "interleaved") and len(sections) == num_axes else None
    try:
        W = frequency_matrix(alloc, head_dim, num_axes, base=base, sections=secs)
    except (ValueError, TypeError) as e:
        raise ValueError(
            f"patch_model: design {name!r} ({num_axes} axes) with allocation {alloc!r} does not fit the model's "
            f"head_dim={head_dim}: {e}"
        ) from None
    if W.ndim == 3:
        raise ValueError(
            f"patch_model: design {name!r} uses the per-head allocation {alloc!r}, which the patched Qwen models "
            f"cannot apply (their rotary tables are shared by all heads); pass allocation='mrope-interleave' "
            f"for its positions with a shared allocation, or use ropekit.RoPE for per-head rotation"
        )
    return _Geometry(name, dict(options), alloc, W)


# --------------------------------------------------------------------------------------------------
# the hooks


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
    if state.model_type == "qwen3_vl" and video_grid_thw is not None:
        # Qwen3-VL separates video frames with timestamp text: one grid per frame
        g = torch.as_tensor(video_grid_thw)
        video_grid_thw = torch.repeat_interleave(g, g[:, 0], dim=0)
        video_grid_thw[:, 0] = 1
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


def _make_compute(state: _State):
    def compute_3d_position_ids(
        input_ids=None, inputs_embeds=None, image_grid_thw=None, video_grid_thw=None, attention_mask=None,
        past_key_values=None, mm_token_type_ids=None, second_per_grid_ts=None, **_: Any,
    ):
        """ropekit replacement: stores every geometry's positions for the rotary hook; returns None."""
        state.pending = None
        ref = inputs_embeds if inputs_embeds is not None else input_ids
        batch, length = ref.shape[:2]
        past = 0 if past_key_values is None else int(past_key_values.get_seq_length())
        mask = attention_mask if isinstance(attention_mask, torch.Tensor) and attention_mask.ndim == 2 else None
        if mask is not None:
            mask = (mask != 0).long().cpu()
        has_grids = image_grid_thw is not None or video_grid_thw is not None
        if past == 0:
            if mask is not None and mask.shape[1] != length:
                mask = None
            types = _token_types(state, input_ids, mm_token_type_ids, batch, length, False, ref.device).cpu()
            if has_grids or not _from_stash(state, types, mask):
                if has_grids and mm_token_type_ids is None and input_ids is None:
                    _token_types(state, None, None, batch, length, True, ref.device)  # raises the clear error
                _prefill(state, types, image_grid_thw, video_grid_thw, mask, second_per_grid_ts)
        else:
            state.stash = None
            types = None if mm_token_type_ids is None else mm_token_type_ids
            _decode(state, types, mask, past, batch, length)
        state.pending = {k: v.to(ref.device) for k, v in state.pending.items()}
        return None

    return compute_3d_position_ids


def _make_generation_positions(state: _State):
    def _prepare_position_ids_for_generation(inputs_tensor: torch.Tensor, model_kwargs: dict) -> None:
        """Place the prompt while ``generate`` still holds the grids; the model places every later token.

        Returning None keeps ``generate`` from passing (and extending) 1-D position ids of its own.
        """
        state.stash = None
        cache = model_kwargs.get("past_key_values")
        if cache is not None and cache.get_seq_length() > 0:
            return None
        input_ids = model_kwargs.get("input_ids")
        if input_ids is None or input_ids.shape[1] == 0:
            is_ids = inputs_tensor.ndim == 2 and not inputs_tensor.is_floating_point()
            input_ids = inputs_tensor if is_ids else None
        batch, length = inputs_tensor.shape[:2]
        grids = model_kwargs.get("image_grid_thw"), model_kwargs.get("video_grid_thw")
        has_grids = any(g is not None for g in grids)
        types = _token_types(
            state, input_ids, model_kwargs.get("mm_token_type_ids"), batch, length, has_grids, inputs_tensor.device
        ).cpu()
        mask = model_kwargs.get("attention_mask")
        mask = (mask != 0).long().cpu() if isinstance(mask, torch.Tensor) and mask.ndim == 2 else None
        _prefill(state, types, grids[0], grids[1], mask, model_kwargs.get("second_per_grid_ts"))
        state.stash, state.pending = (types, mask, state.pending), None
        return None

    return _prepare_position_ids_for_generation


def _fallback_positions(state: _State, position_ids: torch.Tensor, batch: int, length: int) -> dict:
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


def _make_rotary(state: _State):
    def forward(x: torch.Tensor, position_ids: torch.Tensor) -> _Embeddings:
        """cos/sin of every geometry, once per forward (float32 angles, SPEC §2)."""
        batch, length = x.shape[0], x.shape[1]
        pending, state.pending = state.pending, None
        if pending is None or any(tuple(p.shape[1:]) != (batch, length) for p in pending.values()):
            pending = _fallback_positions(state, position_ids, batch, length)
        geoms = {}
        with torch.no_grad():
            for name, geo in state.geometries.items():
                pos = pending[name].to(x.device, torch.float32)
                c, s = cos_sin(angles(pos.permute(1, 2, 0), geo.W.to(x.device)))
                # the model's own apply uses rotate-half tables, so each half repeats the pair's value
                cos = torch.cat([c, c], dim=-1) * state.scaling
                sin = torch.cat([s, s], dim=-1) * state.scaling
                geoms[name] = (cos.to(x.dtype), sin.to(x.dtype))
        first = geoms[state.layer_geometry[0]]
        out = _Embeddings(first)
        out.geoms, out.positions = geoms, pending
        return out

    return forward


def _make_layer(state: _State, layer: nn.Module, index: int):
    original = layer.forward  # bound (or previously set instance) forward

    def forward(*args: Any, **kwargs: Any):
        """Run the layer with the cos/sin of its own geometry."""
        emb = kwargs.get("position_embeddings")
        if isinstance(emb, _Embeddings):
            name = state.layer_geometry[index]
            kwargs["position_embeddings"] = emb.geoms[name]
            state.last[index] = emb.positions[name]
        return original(*args, **kwargs)

    return forward


# --------------------------------------------------------------------------------------------------
# public API


def _set(state: _State, obj: Any, name: str, value: Any) -> None:
    state.saved.append((obj, name, obj.__dict__.get(name, _MISSING)))
    obj.__dict__[name] = value


def patch_model(
    model: nn.Module,
    design: Union[str, Sequence[str]] = "mrope",
    *,
    age: Union[None, str, Sequence[Union[bool, str]]] = None,
    allocation: Union[None, str, Mapping[str, str]] = None,
    options: Optional[Mapping[str, Mapping[str, Any]]] = None,
    **design_options: Any,
) -> nn.Module:
    """Make a Qwen2-VL / Qwen2.5-VL / Qwen3-VL instance use ropekit positions and rotations.

    ``design`` names the position design (SPEC §3). With ``age`` (an AGE schedule, Circle-RoPE paper
    §4.2: ``"all"``, ``"lower"``, ``"upper"``, ``"alternate"``, ``"none"``, ``"strategy_1…4"`` or one
    bool/design name per layer) layers on the schedule get ``design`` (or the first of a pair of names)
    and the others the second design (M-RoPE by default). ``allocation`` overrides the frequency
    layout (a name, or a mapping design → name); by default each design uses its own, and 3-axis
    designs use the model's native M-RoPE layout (chunked sections on Qwen2/2.5-VL, interleaved on
    Qwen3-VL) with the model's ``mrope_section``. ``design_options`` go to ``design`` (the first of a
    pair); ``options`` maps any design name to its options. Patching again replaces the old patch.
    Returns ``model`` (patched in place).
    """
    top, inner, text, mtype = _parts(model)
    if is_patched(inner):
        unpatch_model(inner)
    layers = list(text.layers)
    names = _resolve_layers(design, age, len(layers))
    primary = names[0] if age is None else get_design(design if isinstance(design, str) else design[0]).name
    per_design: dict[str, dict] = {}
    for k, v in (options or {}).items():
        if not isinstance(v, Mapping):
            raise TypeError(f"patch_model: `options` maps a design name to a dict of its options, got {k!r}: {v!r}")
        per_design[get_design(k).name] = dict(v)
    if design_options:
        per_design[primary] = {**design_options, **per_design.get(primary, {})}
    unused = [k for k in per_design if k not in names]
    if unused:
        raise ValueError(f"patch_model: options given for design(s) {unused} that no layer uses (layers use {sorted(set(names))})")
    if allocation is not None and not isinstance(allocation, (str, Mapping)):
        raise TypeError(f"patch_model: `allocation` must be a name or a mapping design → name, got {allocation!r}")

    tcfg = text.config
    rope = dict(getattr(tcfg, "rope_parameters", None) or {})
    if rope.get("rope_type", "default") != "default":
        raise ValueError(
            f"patch_model: the model uses rope_type={rope.get('rope_type')!r}; ropekit replaces the rotary "
            f"embedding and supports only rope_type='default'"
        )
    native, default_sections = SUPPORTED_MODEL_TYPES[mtype]
    sections = rope.get("mrope_section") or default_sections
    head_dim = int(layers[0].self_attn.head_dim)
    base = float(rope.get("rope_theta", 10000.0))
    geometries = {
        n: _geometry(n, per_design.get(n, {}), _pick(allocation, n), head_dim, base, sections, native)
        for n in dict.fromkeys(names)
    }
    vcfg = getattr(inner.config, "vision_config", None)
    tps = getattr(vcfg, "tokens_per_second", None) if mtype == "qwen2_5_vl" else None
    state = _State(
        model_type=mtype,
        geometries=geometries,
        layer_geometry=names,
        scaling=float(getattr(text.rotary_emb, "attention_scaling", 1.0)),
        merge=int(getattr(vcfg, "spatial_merge_size", 2)),
        tokens_per_second=None if tps is None else float(tps),
        image_token_id=getattr(inner.config, "image_token_id", None),
        video_token_id=getattr(inner.config, "video_token_id", None),
    )
    _set(state, inner, "compute_3d_position_ids", _make_compute(state))
    _set(state, text.rotary_emb, "forward", _make_rotary(state))
    for i, layer in enumerate(layers):
        _set(state, layer, "forward", _make_layer(state, layer, i))
    if top is not None and hasattr(top, "_prepare_position_ids_for_generation"):
        _set(state, top, "_prepare_position_ids_for_generation", _make_generation_positions(state))
    inner.__dict__[_STATE_ATTR] = state
    return model


def unpatch_model(model: nn.Module) -> nn.Module:
    """Remove :func:`patch_model`'s hooks: the instance behaves as the stock model again."""
    top, inner, _, _ = _parts(model)
    state = inner.__dict__.get(_STATE_ATTR)
    if state is None:
        raise ValueError("unpatch_model: the model is not patched (call patch_model first)")
    for obj, name, previous in reversed(state.saved):
        if previous is _MISSING:
            obj.__dict__.pop(name, None)
        else:
            obj.__dict__[name] = previous
    del inner.__dict__[_STATE_ATTR]
    return model


def last_positions(model: nn.Module) -> dict[int, torch.Tensor]:
    """Positions ``(A, B, L)`` float32 each decoder layer used in the model's last forward."""
    state = _state(model)
    if state is None:
        raise ValueError("last_positions: the model is not patched (call ropekit.hf.patch_model first)")
    return dict(state.last)


def layer_designs(model: nn.Module) -> list[str]:
    """The design each decoder layer of a patched model uses (the resolved AGE schedule)."""
    state = _state(model)
    if state is None:
        raise ValueError("layer_designs: the model is not patched (call ropekit.hf.patch_model first)")
    return list(state.layer_geometry)
