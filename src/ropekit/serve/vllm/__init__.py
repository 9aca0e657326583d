"""vLLM plugin: serve a checkpoint saved from a ropekit-patched model (docs/serving.md).

vLLM loads it through the ``vllm.general_plugins`` entry point (``ropekit-vllm = ropekit.serve.vllm:register``) in
every process it starts. :func:`register` makes transformers' ``AutoConfig`` read ropekit's saved config form
and puts ropekit's classes in vLLM's model registry under the architecture names the checkpoints carry:

- Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE, Qwen3.5, Qwen3.5-MoE, GLM-4.1V, GLM-4.5V, GLM-OCR, PaddleOCR-VL,
  Cosmos3-Edge, ERNIE-4.5-VL and Command A Compass checkpoints are served with their patch (:mod:`.models`; Compass
  with a rotary table per layer type, its NoPE layers unrotated; Cosmos3-Edge's config translated into what vLLM's
  model reads; ERNIE-4.5-VL's config, processing and routing: :mod:`.ernie`), the Qwen2.5-Omni and Qwen3-Omni
  thinkers (vLLM's thinker classes, the config wrapped in the whole model's: :class:`.models.TranslateOmniConfig`),
  and the
  1-D families in :data:`ONE_D` (:mod:`.one_d`), MiniCPM-V 4.6 and 4.7 among them (:data:`MROPE_IN_VLLM`: vLLM's
  models of these carry M-RoPE positions already);
- a ropekit checkpoint of any other family ropekit patches is refused when the model loads, naming why.

A checkpoint without a ropekit record builds vLLM's own model, unchanged (an Omni thinker saved alone, which vLLM
alone does not serve, is refused). Nothing here imports vLLM until
:func:`register` runs, so ropekit's core never needs it.
"""
from __future__ import annotations

#: the vLLM releases this plugin was tested with (oldest, newest); others are refused when a ropekit checkpoint
#: loads (vLLM's model runner is read, not wrapped: see docs/serving.md, "How it works")
TESTED_VLLM = ("0.32.0", "0.32.0")

#: 1-D architectures served with their patch -> the transformers model type; inside vLLM they are carried as M-RoPE
#: models (:mod:`.one_d`)
ONE_D = {
    "LlavaForConditionalGeneration": "llava",
    "LlavaNextForConditionalGeneration": "llava_next",
    "Mistral3ForConditionalGeneration": "mistral3",
    "InternVLForConditionalGeneration": "internvl",
    "Idefics3ForConditionalGeneration": "idefics3",
    "SmolVLMForConditionalGeneration": "smolvlm",
    "Gemma3ForConditionalGeneration": "gemma3",
    "LlavaOnevisionForConditionalGeneration": "llava_onevision",
    "LlavaNextVideoForConditionalGeneration": "llava_next_video",
    "Llama4ForConditionalGeneration": "llama4",
    "Cohere2VisionForConditionalGeneration": "cohere2_vision",
    "Gemma4ForConditionalGeneration": "gemma4",
    "Exaone4_5_ForConditionalGeneration": "exaone4_5",
    "Lfm2VlForConditionalGeneration": "lfm2_vl",
    "QianfanOCRForConditionalGeneration": "qianfan_ocr",
    "MiniCPMV4_6ForConditionalGeneration": "minicpmv4_6",
    "MiniCPMV4_7ForConditionalGeneration": "minicpmv4_7",
    "PaliGemmaForConditionalGeneration": "paligemma",
    "Step3p7ForConditionalGeneration": "step3p7",
}
#: of :data:`ONE_D`, the architectures whose vLLM model carries M-RoPE positions already (their language model is
#: Qwen3.5's): placed by :mod:`.one_d`, given no config hook. (MiniCPM-V 4.7's transformers model places canvas
#: M-RoPE, ropekit's ``canvas-mrope``; it is placed from the same crop sizes as 4.6.)
MROPE_IN_VLLM = ("MiniCPMV4_6ForConditionalGeneration", "MiniCPMV4_7ForConditionalGeneration")

#: architectures served with their patch -> the transformers model type
SERVED = {
    "Qwen2VLForConditionalGeneration": "qwen2_vl",
    "Qwen2_5_VLForConditionalGeneration": "qwen2_5_vl",
    "Qwen3VLForConditionalGeneration": "qwen3_vl",
    "Glm4vForConditionalGeneration": "glm4v",
    "Qwen3VLMoeForConditionalGeneration": "qwen3_vl_moe",
    "Glm4vMoeForConditionalGeneration": "glm4v_moe",
    "GlmOcrForConditionalGeneration": "glm_ocr",
    "PaddleOCRVLForConditionalGeneration": "paddleocr_vl",
    "Qwen3_5ForConditionalGeneration": "qwen3_5",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe",
    "Cosmos3EdgeForConditionalGeneration": "cosmos3_edge",
    "Ernie4_5_VLMoeForConditionalGeneration": "ernie4_5_vl_moe",
    "CohereCompassForConditionalGeneration": "cohere_compass",
    **ONE_D,
}

__all__ = ["register", "TESTED_VLLM", "SERVED", "ONE_D", "MROPE_IN_VLLM", "guarded_architectures"]


def guarded_architectures() -> list[str]:
    """vLLM architectures of the families ropekit patches that this plugin does not serve: a ropekit checkpoint
    of one of them is refused at load instead of running vLLM's stock positions."""
    from transformers.models.auto import modeling_auto as ma
    from vllm import ModelRegistry

    from ...hf.adapters import ADAPTERS

    names: set[str] = set()
    for table in ("MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", "MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES",
                  "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_VISION_2_SEQ_MAPPING_NAMES", "MODEL_MAPPING_NAMES"):
        mapping = getattr(ma, table, {})
        for model_type in ADAPTERS:
            arch = mapping.get(model_type)
            for a in (arch if isinstance(arch, (list, tuple)) else [arch]):
                if isinstance(a, str):
                    names.add(a)
    # the whole Omni models, which vLLM implements and transformers' tables list under no family ropekit patches (the
    # thinkers, which they list, are served: registered by register(), under both names)
    names |= {"Qwen2_5OmniForConditionalGeneration", "Qwen2_5OmniModel", "Qwen3OmniMoeForConditionalGeneration"}
    from .models import OMNI_SERVED

    supported = set(ModelRegistry.get_supported_archs())
    return sorted((names & supported) - set(SERVED) - set(OMNI_SERVED))


def register() -> None:
    """The entry point vLLM calls: ropekit's config form for transformers, ropekit's classes for vLLM."""
    from vllm import ModelRegistry

    from ... import hf  # noqa: F401  (AutoConfig reads model_type "ropekit": the family's config with the record)

    from ...hf.auto import ARCH_PREFIX

    for arch in list(SERVED) + guarded_architectures():
        # a checkpoint saved by ropekit names its class with the prefix (which vLLM alone does not know: without this
        # plugin it refuses the checkpoint); a stock checkpoint of the family keeps vLLM's own model (models.py)
        for name in (arch, ARCH_PREFIX + arch):
            ModelRegistry.register_model(name, f"ropekit.serve.vllm.models:{name}")
    from .one_d import register_config_hooks

    register_config_hooks([name for arch in ONE_D if arch not in MROPE_IN_VLLM for name in (arch, ARCH_PREFIX + arch)])
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    from .models import _CONFIGS, OMNI_THINKERS, TranslateConfig, TranslateOmniConfig
    from .one_d import untested_hook

    for arch in _CONFIGS:  # served families whose vLLM model reads another config than transformers' (ropekit's)
        own = MODELS_CONFIG_MAP.get(arch)  # vLLM's hook of the architecture, run first (ropekit's name too)
        if isinstance(own, type) and (issubclass(own, TranslateConfig) or own.__name__.startswith("Untested_")):
            own = getattr(own, "wraps", None)  # registered before (vLLM loads plugins in every process)
        for name in (arch, ARCH_PREFIX + arch):
            if own is not None and own.__name__ not in TranslateConfig.CHAINED:
                MODELS_CONFIG_MAP[name] = untested_hook(own, name)  # another release: stock keeps vLLM's hook
            else:
                MODELS_CONFIG_MAP[name] = TranslateConfig.after(own)

    # the Omni thinkers, which ropekit saves under their own (prefixed) names and vLLM does not implement alone: when
    # vLLM reads the checkpoint's config, a thinker's becomes the whole Omni model's config vLLM's thinker class and
    # processor read, and one without a ropekit record is refused, before vLLM builds the processor
    # (under both names: the stock-equivalent patch, tmrope, is saved under the family's own name, which vLLM 0.32
    # has no model of either)
    for arch in OMNI_THINKERS:
        for name in (ARCH_PREFIX + arch, arch):
            ModelRegistry.register_model(name, f"ropekit.serve.vllm.models:{name}")
            MODELS_CONFIG_MAP[name] = TranslateOmniConfig
