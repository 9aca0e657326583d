"""ropekit position designs, allocations and AGE schedules inside Hugging Face multimodal models: the 3-axis
(M-RoPE) families and the 1-D (LLaVA-style) ones that :func:`supported_models` lists (one adapter each in
:mod:`ropekit.hf.adapters`; docs/hf.md describes each family's native positions).

:func:`patch_model` rewires one model *instance* (never the transformers classes) so that

- its multimodal positions come from a ropekit design (float coordinates allowed), computed with
  :func:`ropekit.index.rope_index` from the same inputs transformers uses (``mm_token_type_ids``,
  ``image_grid_thw``, ``video_grid_thw``, ``attention_mask``);
- its rotation is the frequency matrix of a ropekit allocation (docs/hf.md), evaluated once per geometry
  per forward (Circle-RoPE paper §4.2: AGE gives each decoder layer one of several geometries);
- cached decoding reads every geometry's positions for the text after the prompt from the design
  itself, so ``generate`` sees exactly the positions one teacher-forced forward over the whole
  sequence gives.

The hooks (:mod:`ropekit.hf.hooks`) are instance attributes that :func:`unpatch_model` removes again;
the position state lives in :mod:`ropekit.hf.state`; what differs between model families is in one
small adapter per family (:mod:`ropekit.hf.adapters`).
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Union

import torch
from torch import nn

from ..age import age_schedule
from ..designs import get_design, positions
from ..designs.registry import check_options, design_axes
from ..rotations.planar import frequency_matrix
from ..rotations.scaling import attention_factor, parse_scaling, scale_frequencies, scaling_from_config, spectrum_dim
from .adapters import ADAPTERS, REFUSED, Adapter
from . import auto, boundary, hooks, persist
from .state import _Geometry, _State

__all__ = ["patch_model", "unpatch_model", "position_ids", "position_rows", "last_positions", "layer_designs",
           "is_patched", "supported_models", "SUPPORTED_MODEL_TYPES"]

# model_type -> (native allocation for a 3-axis design, default mrope_section in the config's own order)
SUPPORTED_MODEL_TYPES: dict[str, tuple[str, tuple[int, ...]]] = {
    name: (a.native_allocation, a.default_sections) for name, a in ADAPTERS.items()
}


def supported_models() -> list[str]:
    """The transformers model types :func:`patch_model` supports (their ``...ForConditionalGeneration`` or
    bare ``...Model`` classes), sorted."""
    return sorted(ADAPTERS)

_STATE_ATTR = "_ropekit_patch"
_FROM_CONFIG = "<from model.config.ropekit>"  # no design given: restore the patch the config records


# --------------------------------------------------------------------------------------------------
# locating the parts of a model


def _parts(model: nn.Module) -> tuple[Optional[nn.Module], nn.Module, nn.Module, Adapter]:
    """(generation wrapper or None, bare model, text model, family adapter) of a supported model."""
    supported = ", ".join(supported_models())
    if not isinstance(model, nn.Module):
        raise TypeError(f"patch_model: `model` must be a transformers model (nn.Module), got {type(model).__name__}")
    mtype = getattr(getattr(model, "config", None), "model_type", None)
    if mtype in REFUSED:
        raise ValueError(
            f"patch_model: model type {mtype!r} ({type(model).__name__}) is refused: {REFUSED[mtype]} (docs/hf.md, "
            f"\"Families ropekit refuses\"); supported: {supported}"
        )
    if mtype not in ADAPTERS:
        raise ValueError(
            f"patch_model: unsupported model type {mtype!r} ({type(model).__name__}); supported: {supported} "
            f"(their ...ForConditionalGeneration or bare ...Model classes)"
        )
    adapter = ADAPTERS[mtype]
    top, inner, text = adapter.parts(model)
    hooked = "forward" if adapter.one_d else "compute_3d_position_ids"
    if not hasattr(inner, hooked) or text is None or not hasattr(text, "rotary_emb"):
        raise ValueError(
            f"patch_model: {type(model).__name__} is not a supported multimodal model; pass the "
            f"...ForConditionalGeneration or the bare ...Model of: {supported}"
        )
    return top, inner, text, adapter


def _check_boundary(top: Optional[nn.Module], inner: nn.Module, text: nn.Module, adapter: Adapter) -> None:
    """Refuse, before anything is changed, a transformers whose hooked methods take parameters the hooks do not
    know (:mod:`ropekit.hf.boundary`): the methods the patch replaces, and the forwards whose arguments
    ``generate`` hands on as model kwargs."""
    boundary.check_version("patch_model")
    checks = [(t, "forward", _rotary_contract(adapter))
              for t in dict.fromkeys(type(m) for m, _ in _rotaries(adapter, text))]
    checks += [(t, "forward", _layer_contract(adapter)) for t in dict.fromkeys(map(type, text.layers))]
    checks += [(type(text), "forward", _text_contract(adapter))]
    forward = _forward_contract(adapter)
    checks += [(type(inner), "forward", forward), (type(top) if top else None, "forward", forward)]
    if hasattr(inner, "get_rope_index"):
        checks.append((type(inner), "get_rope_index", hooks.contract(hooks.get_rope_index, adapter)))
    if top is not None and hasattr(top, "_prepare_position_ids_for_generation"):
        checks.append((type(top), "_prepare_position_ids_for_generation",
                       hooks.CONTRACTS[hooks.prepare_position_ids_for_generation]))
    if top is not None and adapter.generate_drops_positions:
        checks.append((type(top), "prepare_inputs_for_generation", hooks.CONTRACTS[hooks.keep_generate_positions]))
    boundary.check_all(checks)


def _rotaries(adapter: Adapter, text: nn.Module) -> list[tuple[nn.Module, Optional[str]]]:
    """The text model's rotary modules with the table each one builds (:attr:`Adapter.rotary_modules`; None: the one
    ``rotary_emb``, whose calls name their table by :attr:`Adapter.rotary_params` where the model has several)."""
    if not adapter.rotary_modules:
        return [(text.rotary_emb, None)]
    return [(getattr(text, attr), key) for attr, key in adapter.rotary_modules]


def _layer_contract(adapter: Adapter) -> boundary.Contract:
    """The decoder-layer hook's contract, with the parameters the family's layers add (handed on unread)."""
    return hooks.CONTRACTS[hooks.layer_forward].widened(adapter.layer_params)


def _forward_contract(adapter: Adapter) -> boundary.Contract:
    """The bare model's forward hook contract (also what ``generate`` hands the generation model), with the
    parameters the family's forwards add (handed on unread) and its own position parameters."""
    base = hooks.LM_FORWARD if adapter.one_d else hooks.MULTIMODAL_FORWARD
    return base.widened(adapter.forward_params | adapter.position_params)


def _text_contract(adapter: Adapter) -> boundary.Contract:
    """The language model's forward hook contract, with the parameters the family's forwards add."""
    return hooks.CONTRACTS[hooks.text_forward].widened(adapter.forward_params | adapter.text_params)


def _rotary_contract(adapter: Adapter) -> boundary.Contract:
    """The rotary hook's contract, with the parameters by which the family's rotary picks one of its tables
    (read: they select the table's frequencies) required too."""
    base = hooks.CONTRACTS[hooks.rotary_forward]
    if not adapter.rotary_params:
        return base
    return boundary.Contract(base.known | adapter.rotary_params,
                             base.required + tuple((p,) for p in sorted(adapter.rotary_params)), base.var_keyword)


def _state(model: nn.Module) -> Optional[_State]:
    if _STATE_ATTR in model.__dict__:  # the bare model, or a generation class that is its own bare model
        return model.__dict__[_STATE_ATTR]
    inner = model.model if hasattr(model, "lm_head") and hasattr(model, "model") else model
    return inner.__dict__.get(_STATE_ATTR)


def is_patched(model: nn.Module) -> bool:
    """Whether :func:`patch_model` is in effect on ``model``."""
    return _state(model) is not None


# --------------------------------------------------------------------------------------------------
# configuration → geometries


def _resolve_layers(design: Union[str, Sequence[str]], age: Any, num_layers: int) -> list[str]:
    """Design name per decoder layer: ``design`` everywhere, or an AGE schedule (paper §4.2)."""
    if not isinstance(design, (str, tuple, list)):
        raise TypeError(
            f"patch_model: `design` must be a design name (see ropekit.designs()) or, with `age=`, a pair of "
            f"names; got {type(design).__name__} {design!r}"
        )
    if age is not None and not isinstance(age, (str, tuple, list)):
        raise TypeError(
            f"patch_model: `age` must be an AGE schedule name (e.g. 'alternate') or one bool/design name per "
            f"layer; got {type(age).__name__} {age!r}"
        )
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
    native: str, scaling: Any = None, rotated: Optional[int] = None,
) -> _Geometry:
    """``rotated``: the table is proportional RoPE (Gemma 4's full-attention layers): only the first ``rotated``
    frequency pairs of the ``head_dim`` spectrum turn, the others are 0. A 1-axis design takes that table as it is;
    a multi-axis design shares the ``rotated`` pairs among its axes by its allocation (``sections`` then split those
    pairs), keeping their frequencies ``base^(-2j/head_dim)``."""
    d = get_design(name)
    check_options(d, options)
    num_axes = design_axes(name, **options)
    own = d.allocation_for(options)
    alloc = allocation or (native if own == "mrope" else own)
    secs = list(sections) if _uses_sections(alloc, num_axes, sections, native) else None
    try:
        if rotated is None:
            W = frequency_matrix(alloc, head_dim, num_axes, base=base, sections=secs)
        else:
            W = _proportional(alloc, head_dim, num_axes, base, secs, rotated)
    except (ValueError, TypeError) as e:
        raise ValueError(
            f"patch_model: design {name!r} ({num_axes} axes) with allocation {alloc!r} does not fit the model's "
            f"head_dim={head_dim}: {e}"
        ) from None
    if W.ndim == 3:
        raise ValueError(
            f"patch_model: design {name!r} uses the per-head allocation {alloc!r}, which patched models (Qwen-VL "
            f"and LLaVA alike) cannot apply (their rotary tables are shared by all heads); pass "
            f"allocation='mrope-interleave' for its positions with a shared allocation, or use ropekit.RoPE for "
            f"per-head rotation"
        )
    dim = spectrum_dim(alloc, head_dim, num_axes)  # what the scaling reads, as ropekit.RoPE reads it
    if scaling is None or scaling.rope_type == "default":
        return _Geometry(name, dict(options), alloc, W, dim=dim, base=base)
    if scaling.depends_on_length:  # rescaled each forward from its length (hooks → state.frequencies)
        return _Geometry(name, dict(options), alloc, W, scaling=scaling, dim=dim, base=base)
    return _Geometry(name, dict(options), alloc, scale_frequencies(W, scaling, base=base, dim=dim)[0],
                     dim=dim, base=base)


def _proportional(alloc: str, head_dim: int, num_axes: int, base: float, sections: Optional[list], rotated: int
                  ) -> torch.Tensor:
    """:func:`_geometry`'s frequency matrix on a proportional-RoPE table (``rotated`` of the ``head_dim / 2`` pairs
    turn)."""
    half = head_dim // 2
    if alloc == "1d":  # the model's own table: the spectrum over the head, zero past the rotated pairs
        return frequency_matrix("proportional", head_dim, 1, base=base, sections=[rotated, half - rotated])
    W = torch.zeros(num_axes, half)
    if rotated:  # base^(-2j/head_dim) for j < rotated is the spectrum of 2 * rotated channels at this base
        W[:, :rotated] = frequency_matrix(alloc, 2 * rotated, num_axes, base=base ** (2 * rotated / head_dim),
                                          sections=sections)
    return W


class _RopeConfig:
    """One rotary table's rope parameters with the text config's context lengths, as scaling_from_config reads them."""

    def __init__(self, config: Any, rope: dict):
        self.rope_parameters = rope
        self.max_position_embeddings = getattr(config, "max_position_embeddings", None)
        self.original_max_position_embeddings = getattr(config, "original_max_position_embeddings", None)


def _rope_tables(adapter: Adapter, text: nn.Module) -> dict[Optional[str], dict]:
    """The text model's rotary tables: ``{key: rope parameters}``, the first one the table of the first decoder
    layer; ``{None: rope_parameters}`` when one table serves every layer."""
    found = adapter.rope_variants(text)
    if found is None:
        cfg = text.config
        return {None: dict(getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {})}
    tables, per_layer = found
    order = list(dict.fromkeys(per_layer)) + [k for k in tables if k not in per_layer]
    return {k: dict(tables[k]) for k in order}


def _rotated_pairs(rope: dict, dim: int) -> Optional[int]:
    """Frequency pairs that turn on a proportional-RoPE table (transformers' ``rope_type="proportional"``, Gemma 4:
    ``int(partial_rotary_factor * head_dim // 2)``), None for any other table."""
    if rope.get("rope_type", rope.get("type")) != "proportional":
        return None
    return int(float(rope.get("partial_rotary_factor", 1.0)) * dim // 2)


def _scaling_part(rope: dict) -> dict:
    """The rope scaling of a table: a proportional table's ``factor`` divides its frequencies (linear scaling)."""
    if rope.get("rope_type", rope.get("type")) != "proportional":
        return rope
    out = {k: v for k, v in rope.items() if k not in ("rope_type", "type", "factor", "partial_rotary_factor")}
    factor = rope.get("factor", 1.0)
    return dict(out, rope_type="default") if factor == 1.0 else dict(out, rope_type="linear", factor=factor)


#: keys of ``rope_parameters`` that name a model's M-RoPE layout (interleaved or chunked sections) without changing it
_LAYOUT_FLAGS = ("interleaved", "mrope_interleaved")


def _without_layout_flags(native: str, config: Any, rope: dict) -> dict:
    """``rope`` without the layout flags the text config's class tells transformers' rope validation to skip
    (``ignore_keys_at_rope_validation``: Qwen3-Omni's ``interleaved``, Qwen3-VL's and Qwen3.5's
    ``mrope_interleaved``). transformers' rotary reads neither: those models interleave their sections whatever the
    flag says, and so does the patch (their adapter's native allocation). A flag that says otherwise describes
    tables the model does not build: refused, rather than read one way by the config and another by the model."""
    skipped = set(getattr(config, "ignore_keys_at_rope_validation", None) or ())
    out = dict(rope)
    for key in _LAYOUT_FLAGS:
        if key not in out or key not in skipped:
            continue
        value = out.pop(key)
        interleaves = native == "interleaved"
        if value is not interleaves:
            raise ValueError(
                f"rope_parameters[{key!r}] is {value!r}, but {type(config).__name__}'s model "
                f"{'interleaves' if interleaves else 'does not interleave'} its mrope_section whatever this key says "
                f"(transformers does not read it); set it to {interleaves} or remove it"
            )
    return out


def _native(adapter: Adapter, saved: Optional[Mapping], names: Sequence[str], options: Mapping[str, dict]) -> str:
    """The layout of the family's own M-RoPE that 3-axis designs take by default: the installed transformers
    release's (the adapter's ``native_allocation``), or, restoring a checkpoint of a family whose layout changed
    within the tested releases, the one it was patched with, so it rotates as it was trained on either side of the
    change: the record's ``native``, or in a record without one, the recorded allocation of a design that took the
    native layout. A recorded layout the family never had is not taken (the restore then refuses the mismatch)."""
    native = adapter.native_allocation
    if saved is None or not adapter.native_layouts:
        return native
    if saved.get("native") is not None:
        return saved["native"] if saved["native"] in adapter.native_layouts else native
    recorded = {a for n, a in (saved.get("allocations") or {}).items()
                if n in names and _pick(saved.get("allocation"), n) is None
                and get_design(n).allocation_for(options.get(n, {})) == "mrope"}
    return recorded.pop() if len(recorded) == 1 and recorded <= set(adapter.native_layouts) else native


def _uses_sections(allocation: str, num_axes: int, sections: Sequence[int], native: str) -> bool:
    """Whether a geometry with this allocation and axis count splits its frequency pairs by ``sections``: the
    chunked and interleaved layouts, and the model's native layout (ERNIE-4.5-VL's ``videorope``, whose temporal
    tail the model's ``mrope_section`` sets)."""
    return allocation in ("mrope", "interleaved", native) and len(sections) == num_axes


def _check_sections(sections: Any, head_dim: int) -> list[int]:
    """``sections=``: frequency pairs per axis of a multi-axis design, summing to ``head_dim / 2``."""
    if isinstance(sections, (str, bytes)) or not isinstance(sections, Sequence) or not all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in sections
    ):
        raise TypeError(f"patch_model: `sections` must be a list of non-negative ints (pairs per axis), got {sections!r}")
    if sum(sections) != head_dim // 2:
        raise ValueError(
            f"patch_model: `sections` {list(sections)} sum to {sum(sections)} but the model rotates "
            f"{head_dim // 2} frequency pairs per head (rotary dim {head_dim}); make them sum to {head_dim // 2}"
        )
    return list(sections)


# --------------------------------------------------------------------------------------------------
# public API


def patch_model(
    model: nn.Module,
    design: Union[str, Sequence[str]] = _FROM_CONFIG,
    *,
    age: Union[None, str, Sequence[Union[bool, str]]] = None,
    allocation: Union[None, str, Mapping[str, str]] = None,
    options: Optional[Mapping[str, Mapping[str, Any]]] = None,
    sections: Optional[Sequence[int]] = None,
    **design_options: Any,
) -> nn.Module:
    """Make an instance of a supported family (:func:`supported_models` lists them by ``model_type``) use ropekit
    positions and rotations.

    ``design`` names the position design. With ``age`` (an AGE schedule, Circle-RoPE paper
    §4.2: ``"all"``, ``"lower"``, ``"upper"``, ``"alternate"``, ``"none"``, ``"strategy_1…4"`` or one
    bool/design name per layer) layers on the schedule get ``design`` (or the first of a pair of names)
    and the others the second design (M-RoPE by default). ``allocation`` overrides the frequency
    layout (a name, or a mapping design → name); by default each design uses its own, and 3-axis
    designs use the family's native M-RoPE layout (its adapter's ``native_allocation``: chunked, interleaved or
    VideoRoPE's) with the model's ``mrope_section``; ``sections`` overrides those sections (frequency pairs per
    axis, summing to the rotary half-dim). On the 1-D families 3-axis designs default to chunked M-RoPE with
    Qwen2-VL's split scaled to the head. The model config's rope scaling
    (``rope_parameters``: linear, dynamic, yarn, longrope, llama3) is applied to every geometry's
    frequencies, with its attention factor. ``design_options`` go to ``design`` (the first of a
    pair); ``options`` maps any design name to its options. Patching again replaces the old patch.
    Returns ``model`` (patched in place).

    The patch is recorded under ``model.config.ropekit`` (:mod:`ropekit.hf.persist`), so it is saved
    by ``save_pretrained``; ``patch_model(model)`` with no design restores the recorded patch (a
    ValueError when the config holds none).
    """
    # the patch's own tables are built on the CPU (the hooks move them to the activations' device), also when
    # it is called under a default-device context such as `with torch.device("meta")`
    with torch.device("cpu"):
        return _patch(model, design, age, allocation, options, sections, design_options)


def _patch(model, design, age, allocation, options, sections, design_options) -> nn.Module:
    top, inner, text, adapter = _parts(model)
    restoring = design is _FROM_CONFIG
    if restoring:
        if age is not None or allocation is not None or options is not None or sections is not None or design_options:
            raise TypeError(
                "patch_model: age/allocation/options/sections were given without a design; pass the design too, or "
                "nothing at all to restore the patch recorded in model.config.ropekit"
            )
        restored = persist.arguments(model, inner.config)
        saved = dict(getattr(inner.config, persist.CONFIG_KEY))
        design, age, allocation, options = (restored[k] for k in ("design", "age", "allocation", "options"))
    adapter.check(inner)
    _check_boundary(top, inner, text, adapter)
    layers = list(text.layers)
    names = _resolve_layers(design, age, len(layers))
    primary = names[0] if age is None else get_design(design if isinstance(design, str) else design[0]).name
    per_design: dict[str, dict] = {}
    if options is not None and not isinstance(options, Mapping):
        raise TypeError(f"patch_model: `options` maps a design name to a dict of its options, got {options!r}")
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
    unused = [k for k in (get_design(k).name for k in allocation or {}) if k not in names] if isinstance(
        allocation, Mapping) else []
    if unused:
        raise ValueError(f"patch_model: `allocation` given for design(s) {unused} that no layer uses (layers use "
                         f"{sorted(set(names))})")

    tcfg = text.config
    tables = _rope_tables(adapter, text)  # {table key: rope parameters} (key None: one table for every layer)
    dims = {key: adapter.table_dim(text, key) for key in tables}  # rotary channels of each table's layers
    rotated = {key: _rotated_pairs(rope, dims[key]) for key, rope in tables.items()}  # proportional tables
    native = _native(adapter, saved if restoring else None, names, per_design)
    given_sections = sections is not None
    first = next(iter(tables.values()))
    turning = {key: dims[key] // 2 if rotated[key] is None else rotated[key] for key in tables}  # pairs that turn
    if given_sections and len(set(turning.values())) > 1:
        raise ValueError(
            f"patch_model: `sections` split one head's frequency pairs, but this model's layer types rotate "
            f"{sorted(set(turning.values()))} pairs ({turning}); drop `sections` (each table then takes the "
            f"default split of its own pairs)"
        )
    half = next(iter(turning.values()))
    if restoring and saved.get("sections") is not None:  # the split the checkpoint was patched with
        sections = _check_sections(saved["sections"], 2 * half)
    else:
        sections = adapter.sections(first, half) if sections is None else _check_sections(sections, 2 * half)
    variants = {}
    for key, rope in tables.items():
        secs = sections if turning[key] == half else adapter.sections(rope, turning[key])
        try:
            rope = _without_layout_flags(native, tcfg, rope)
            scaling = parse_scaling(scaling_from_config(_RopeConfig(tcfg, _scaling_part(rope))))
        except (ValueError, TypeError) as e:
            where = "" if key is None else f" ({key!r} layers)"
            raise ValueError(f"patch_model: the model's rope_parameters{where} cannot be applied: {e}") from None
        base = float(rope.get("rope_theta", 10000.0))
        variants[key] = ({
            n: _geometry(n, per_design.get(n, {}), _pick(allocation, n), dims[key], base, secs, native, scaling,
                         rotated[key])
            for n in dict.fromkeys(names)
        }, attention_factor(scaling))
    geometries, factor = next(iter(variants.values()))
    allocations = {n: g.allocation for n, g in geometries.items()}
    if given_sections and not any(_uses_sections(g.allocation, g.W.shape[0], sections, native)
                                  for g in geometries.values()):
        raise ValueError(
            f"patch_model: `sections` {sections} would be ignored: no layer's design splits its frequencies by "
            f"sections (allocation 'mrope' or 'interleaved' with {len(sections)} axes); the layers use "
            f"{allocations}. Drop `sections`, or use a 3-axis design such as 'mrope' or 'circle'"
        )
    if any(g.allocation == native for g in geometries.values()):
        adapter.check_layout(native, tables)
    if restoring:
        persist.check_restored(saved, names, allocations, sections)
    persist.record(inner.config, design=design, age=age, allocation=allocation, options=per_design,
                   layers=names, allocations=allocations, sections=sections,
                   native=native if adapter.native_layouts else None)
    if is_patched(inner):  # only now: a refused argument above leaves the old patch (and its record) in place
        _remove(top, inner, text, erase=False)
    vcfg = getattr(inner.config, "vision_config", None)
    state = _State(
        adapter=adapter,
        geometries=geometries,
        layer_geometry=names,
        scaling=factor,
        variants=variants if len(variants) > 1 or None not in variants else {},
        origin=adapter.position_origin,
        counts_padding=adapter.counts_padding,
        merge=adapter.merge_of(inner.config),
        markers=adapter.markers(inner.config),
        tokens_per_second=adapter.time_rate(inner.config),
        temporal_merge=adapter.temporal_merge(vcfg),
        layout=adapter.table_layout(text),
        float32_tables=adapter.float32_tables,
        complex_tables=adapter.complex_tables,
        image_token_id=getattr(inner.config, "image_token_id", None),
        video_token_id=getattr(inner.config, "video_token_id", None),
        audio_token_id=getattr(inner.config, "audio_token_id", None),
        interleave=adapter.interleave(inner.config),
        plan_tokens=adapter.plan_tokens(inner.config),
        vision_start_token_id=(None if adapter.takes_token_types
                               else getattr(inner.config, "vision_start_token_id", None)),
    )
    hooks.install(inner, "forward", hooks.model_forward, state, contract=_forward_contract(adapter),
                  text_config=text.config)
    hooks.install(text, "forward", hooks.text_forward, state, contract=_text_contract(adapter))
    for rotary, key in _rotaries(adapter, text):
        hooks.install(rotary, "forward", hooks.rotary_forward, state, contract=_rotary_contract(adapter), table=key)
    blocks = list(geometries)
    for i, layer in enumerate(layers):
        hooks.install(layer, "forward", hooks.layer_forward, state, contract=_layer_contract(adapter), index=i,
                      geometry=names[i], block=blocks.index(names[i]), blocks=len(blocks))
    if hasattr(inner, "get_rope_index"):
        hooks.install(inner, "get_rope_index", hooks.get_rope_index, state,
                      contract=hooks.contract(hooks.get_rope_index, adapter))
    if top is not None and hasattr(top, "_prepare_position_ids_for_generation"):
        hooks.install(top, "_prepare_position_ids_for_generation", hooks.prepare_position_ids_for_generation, state,
                      inner=inner)
    if top is not None and adapter.generate_drops_positions:
        hooks.install(top, "prepare_inputs_for_generation", hooks.keep_generate_positions, state)
    # saved in ropekit's form: loads patched, never silently as the stock model; the stock-equivalent patch is the
    # stock model, so its checkpoint is the stock model's and loads as one (the record kept, for patch_model(model))
    stock = _is_stock_equivalent(adapter, names, per_design, age, allocation, given_sections) and (
        native == adapter.native_allocation)  # a layout restored across a release change is not the stock model
    for config in [inner.config] + ([top.config] if top is not None and top.config is not inner.config else []):
        (auto.unmark if stock else auto.mark)(config)
    if getattr(inner, "rope_deltas", None) is not None:
        inner.rope_deltas = None  # the stock model's last deltas: nothing of the patched model reads or keeps them
    inner.__dict__[_STATE_ATTR] = state
    return model


def unpatch_model(model: nn.Module) -> nn.Module:
    """Remove :func:`patch_model`'s hooks: the instance behaves as the stock model again."""
    top, inner, text, _ = _parts(model)
    state = inner.__dict__.get(_STATE_ATTR)
    if state is None:
        raise ValueError("unpatch_model: the model is not patched (call patch_model first)")
    _remove(top, inner, text)
    return model


def _is_stock_equivalent(adapter: Adapter, names: list[str], per_design: dict, age: Any, allocation: Any,
                         given_sections: bool) -> bool:
    """Whether the patch is the family's stock-equivalent one (:meth:`Adapter.stock_design`, with its options and
    nothing else: no AGE schedule, no allocation or sections of its own), whose every layer is the stock model's."""
    design, options = adapter.stock_design()
    return (age is None and allocation is None and not given_sections and set(names) == {design}
            and per_design.get(design, {}) == options)


def _remove(top: Optional[nn.Module], inner: nn.Module, text: nn.Module, erase: bool = True) -> None:
    hooks.remove(top, "_prepare_position_ids_for_generation")
    hooks.remove(top, "prepare_inputs_for_generation")
    for layer in text.layers:
        hooks.remove(layer, "forward")
    state = inner.__dict__.get(_STATE_ATTR)
    for rotary, _ in _rotaries(state.adapter, text) if state is not None else [(text.rotary_emb, None)]:
        hooks.remove(rotary, "forward")
    hooks.remove(text, "forward")
    hooks.remove(inner, "get_rope_index")
    hooks.remove(inner, "forward")
    inner.__dict__.pop(_STATE_ATTR, None)
    if erase:
        persist.erase(inner.config)
        for config in (inner.config, getattr(top, "config", None)):
            if config is not None:
                auto.unmark(config)


def last_positions(model: nn.Module) -> dict[int, torch.Tensor]:
    """Positions ``(A, B, L)`` float32 each decoder layer used in the model's last eager forward (for inspection;
    no forward reads them: the positions a forward uses are its ``position_ids``, see :func:`position_ids`)."""
    state = _state(model)
    if state is None:
        raise ValueError("last_positions: the model is not patched (call ropekit.hf.patch_model first)")
    if not state.observed:
        return {}
    return {i: state.observed[name] for i, name in enumerate(state.layer_geometry)}


def position_ids(model: nn.Module, input_ids: Optional[torch.Tensor] = None, **inputs: Any) -> torch.Tensor:
    """The position tensor a patched ``model`` uses for a batch: what its forward computes when given no
    ``position_ids``, and what it takes as ``position_ids`` unchanged.

    ``inputs`` are what the processor returns (``attention_mask``, ``image_grid_thw``, ``video_grid_thw``,
    ``mm_token_type_ids``, ``pixel_values``, ``image_sizes``, audio lengths …; ``inputs_embeds`` instead of
    ``input_ids``). The tensor is ``(R, B, L)`` float32: row 0 the 1-D text position of each token (the count of
    unmasked tokens before it; transformers builds attention masks and packed-sequence boundaries from it), then
    the rows of each geometry the layers use, in :func:`position_rows` order (with AGE, one block per design).
    With one 3-axis design this is transformers' own ``[text; t; h; w]`` form. Padding sits at 0.
    """
    state = _state(model)
    if state is None:
        raise ValueError("position_ids: the model is not patched (call ropekit.hf.patch_model first)")
    _, inner, _, _ = _parts(model)
    given = dict(inputs, input_ids=input_ids)
    return hooks.placement(inner, state, given)[0]


def position_rows(model: nn.Module) -> list[tuple[str, int]]:
    """The rows of a patched model's position tensor after the text row: ``(design, axes)`` per geometry, in order."""
    state = _state(model)
    if state is None:
        raise ValueError("position_rows: the model is not patched (call ropekit.hf.patch_model first)")
    return list(state.rows)


def layer_designs(model: nn.Module) -> list[str]:
    """The design each decoder layer of a patched model uses (the resolved AGE schedule)."""
    state = _state(model)
    if state is None:
        raise ValueError("layer_designs: the model is not patched (call ropekit.hf.patch_model first)")
    return list(state.layer_geometry)
