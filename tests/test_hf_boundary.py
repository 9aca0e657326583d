"""The transformers boundary fails closed: a hooked method whose installed signature changed is refused at
patch time, by name, and the model is left as it was.

Reference: transformers' own classes, widened here by one parameter the way a release adds or renames one
(transformers 5.24 renamed ``past_key_values`` to ``cache``; a hook that let unknown keywords through kept
reading the old name and placed every decoded token at position 0). Which methods are hooked is read off a
patched instance, so a hook added later is covered without editing this file.
"""
import inspect
import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import torch
import transformers

from ropekit.hf import is_patched, patch_model, patch_vision_model, unpatch_model
from ropekit.hf.vision import is_vision_patched
from ropekit.hf import boundary
from ropekit.hf.boundary import CACHE_NAMES, TESTED_TRANSFORMERS, UnsupportedTransformersError
from ropekit.hf.hooks import Hook

from test_hf_conformance import BUILDERS as QWEN_BUILDERS
from test_hf_families_1d import BUILDERS as FAMILY_1D_BUILDERS
from test_hf_families_3axis import BUILDERS as FAMILY_BUILDERS
from test_hf_families_round3_3axis import BUILDERS as ROUND3_BUILDERS
from test_hf_glm_image import BUILDERS as GLM_IMAGE_BUILDERS
from test_hf_llava import _build as _build_llava, _config as _llava_config
from test_hf_omni import BUILDERS as OMNI_BUILDERS
from test_hf_vision import ENCODERS

NEW = "ropekit_probe_arg"  # a parameter no transformers release has


def _qwen3_5():
    from test_hf_qwen3_5 import ROPE
    cfg = transformers.Qwen3_5Config(
        text_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16, vocab_size=80, rope_parameters=ROPE,
                         layer_types=["linear_attention", "full_attention"], linear_num_value_heads=2,
                         linear_num_key_heads=1, linear_key_head_dim=8, linear_value_head_dim=8),
        vision_config=dict(depth=1, hidden_size=16, out_hidden_size=32, intermediate_size=16, num_heads=2,
                           spatial_merge_size=2, patch_size=2, temporal_patch_size=2, num_position_embeddings=16),
        image_token_id=70, video_token_id=71,
    )
    return transformers.Qwen3_5ForConditionalGeneration(cfg)


BUILDERS = {
    "qwen2_vl": QWEN_BUILDERS["qwen2_vl"],
    "qwen2_5_vl": QWEN_BUILDERS["qwen2_5_vl"],
    "qwen3_vl": QWEN_BUILDERS["qwen3_vl"],
    "qwen3_5": _qwen3_5,
    "llava": lambda: _build_llava(_llava_config()),
    **FAMILY_BUILDERS,  # qwen3_vl_moe, qwen3_5_moe, glm4v, glm4v_moe, glm46v, glm_ocr, ernie4_5_vl_moe, paddleocr_vl
    **FAMILY_1D_BUILDERS,  # internvl, gemma3, idefics3, smolvlm, mistral3, paligemma, aya_vision
    **OMNI_BUILDERS,  # qwen2_5_omni_thinker, qwen3_omni_moe_thinker
    **ROUND3_BUILDERS,  # qwen4_exp, cosmos3_edge, cosmos3_omni, cohere_compass, hy_v4_vl, ...
    **GLM_IMAGE_BUILDERS,  # glm_image
}


def _hooked(model) -> list[tuple[type, str]]:
    """Every (class, method) a patch replaces on ``model``, plus the forwards whose arguments generate hands on."""
    found = {}
    for module in model.modules():
        for name, value in module.__dict__.items():
            if isinstance(value, Hook):
                found[(type(module), name)] = None
    found[(type(model), "forward")] = None
    found[(type(model.model), "forward")] = None
    return list(found)


def _hooked_by_family():
    cases = []
    for family, build in BUILDERS.items():
        torch.manual_seed(0)
        model = patch_model(build().eval(), "mrope" if family != "llava" else "circle")
        cases += [pytest.param(family, cls, name, id=f"{family}-{cls.__name__}.{name}") for cls, name in _hooked(model)]
    return cases


CASES = _hooked_by_family()


def _with_signature(monkeypatch, cls, name, edit):
    """Replace ``cls.<name>`` by a pass-through whose signature is ``edit(parameters)``."""
    original = getattr(cls, name)
    params = list(inspect.signature(original).parameters.values())

    def changed(self, *args, **kwargs):
        return original(self, *args, **kwargs)

    changed.__signature__ = inspect.Signature(edit(params))
    monkeypatch.setattr(cls, name, changed)


def _add(params, new):
    """``params`` with ``new`` where its kind may stand: a positional one before any keyword-only parameter
    or ``*args``/``**kwargs``, a keyword-only one before ``**kwargs``."""
    P = inspect.Parameter
    stop = (P.VAR_POSITIONAL, P.KEYWORD_ONLY, P.VAR_KEYWORD) if new.kind is P.POSITIONAL_OR_KEYWORD else (P.VAR_KEYWORD,)
    at = next((i for i, p in enumerate(params) if p.kind in stop), len(params))
    return params[:at] + [new] + params[at:]


def _probe(kind=inspect.Parameter.KEYWORD_ONLY):
    return inspect.Parameter(NEW, kind, default=None)


@pytest.fixture(scope="module")
def models():
    built = {}

    def get(family):
        if family not in built:
            torch.manual_seed(0)
            built[family] = BUILDERS[family]().eval()
        return built[family]
    return get


@pytest.mark.parametrize("kind", [inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD])
@pytest.mark.parametrize("family,cls,name", CASES)
def test_a_new_parameter_on_any_hooked_method_is_refused_by_name(models, monkeypatch, family, cls, name, kind):
    model = models(family)
    _with_signature(monkeypatch, cls, name, lambda ps: _add(ps, _probe(kind)))
    with pytest.raises(UnsupportedTransformersError) as err:
        patch_model(model, "circle")
    message = str(err.value)
    assert f"{cls.__name__}.{name}" in message and f"`{NEW}`" in message
    assert f"transformers {transformers.__version__}" in message and "upgrade ropekit" in message
    assert not is_patched(model), "a refused patch changes nothing"


def test_a_renamed_cache_parameter_is_refused(models, monkeypatch):
    """The 5.24 rename, replayed with a name no release used: the old name gone, a new one in its place."""
    model = models("qwen2_vl")
    cls = type(model.model)

    def rename(params):
        return [p.replace(name="kv_store") if p.name in CACHE_NAMES else p for p in params]
    _with_signature(monkeypatch, cls, "forward", rename)
    with pytest.raises(UnsupportedTransformersError, match=r"Qwen2VLModel\.forward.*`kv_store`"):
        patch_model(model, "mrope")
    assert not is_patched(model)


def test_a_dropped_parameter_the_hook_reads_is_refused(models, monkeypatch):
    model = models("qwen2_vl")
    cls = type(model.model)
    _with_signature(monkeypatch, cls, "forward", lambda ps: [p for p in ps if p.name not in CACHE_NAMES])
    with pytest.raises(UnsupportedTransformersError, match=r"Qwen2VLModel\.forward.*has no parameter.*`cache`"):
        patch_model(model, "mrope")
    assert not is_patched(model)


def test_a_refused_repatch_keeps_the_previous_patch(models, monkeypatch):
    model = models("qwen2_vl")
    patch_model(model, "vrope")
    try:
        _with_signature(monkeypatch, type(model), "forward", lambda ps: _add(ps, _probe()))
        with pytest.raises(UnsupportedTransformersError, match=NEW):
            patch_model(model, "circle")
        from ropekit.hf import layer_designs
        assert layer_designs(model) == ["vrope"] * len(model.model.language_model.layers)
    finally:
        unpatch_model(model)


def test_an_unknown_keyword_at_call_time_is_refused(models):
    """A keyword that reaches a hook but is no parameter it knows (and the method hands no **kwargs on)."""
    model = patch_model(models("qwen2_vl"), "mrope")
    try:
        ids = torch.tensor([[5, 6, 7]])
        rotary = model.model.language_model.rotary_emb
        with pytest.raises(UnsupportedTransformersError, match=r"RotaryEmbedding.forward was called with `bogus`"):
            rotary(torch.zeros(1, 3, 32), ids[None].expand(4, -1, -1), bogus=1)
    finally:
        unpatch_model(model)


def test_a_transformers_older_than_the_tested_floor_is_refused(models, monkeypatch):
    model = models("qwen2_vl")
    monkeypatch.setattr(boundary, "transformers_version", lambda: "5.0.0")  # transformers' own attribute is lazy
    with pytest.raises(UnsupportedTransformersError, match=rf"5\.0\.0 is older.*{TESTED_TRANSFORMERS[0]}"):
        patch_model(model, "mrope")
    assert not is_patched(model)


def _vision_hooked(model):
    found = {}
    for module in model.modules():
        for name, value in module.__dict__.items():
            if isinstance(value, Hook):
                found[(type(module), name)] = None
    return list(found)


def _vision_cases():
    cases = []
    for enc, (build, _, _) in sorted(ENCODERS.items()):
        torch.manual_seed(0)
        model = patch_vision_model(build(), "axial")
        cases += [pytest.param(enc, cls, name, id=f"{enc}-{cls.__name__}.{name}") for cls, name in _vision_hooked(model)]
    return cases


@pytest.mark.parametrize("encoder,cls,name", _vision_cases())
def test_vision_patch_refuses_a_new_parameter_on_any_hooked_method(monkeypatch, encoder, cls, name):
    torch.manual_seed(0)
    model = ENCODERS[encoder][0]()
    _with_signature(monkeypatch, cls, name, lambda ps: _add(ps, _probe()))
    with pytest.raises(UnsupportedTransformersError, match=rf"{cls.__name__}\.{name}.*`{NEW}`"):
        patch_vision_model(model, "geope")
    assert not is_vision_patched(model)


def test_a_parameter_one_family_adds_is_refused_on_the_others(models, monkeypatch):
    """The MoE families' forwards take ``output_router_logits`` and ERNIE-4.5-VL's decoder layers
    ``moe_mm_token_type_ids``; each family's contracts know only its own additions."""
    model = models("qwen3_vl")
    layer = type(model.model.language_model.layers[0])
    for cls, name, param in [(type(model), "forward", "output_router_logits"),
                             (layer, "forward", "moe_mm_token_type_ids")]:
        with monkeypatch.context() as mp:
            new = inspect.Parameter(param, inspect.Parameter.KEYWORD_ONLY, default=None)
            _with_signature(mp, cls, name, lambda ps: _add(ps, new))
            with pytest.raises(UnsupportedTransformersError, match=rf"{cls.__name__}\.{name}.*`{param}`"):
                patch_model(model, "circle")
        assert not is_patched(model)


def test_a_parameter_a_1d_family_adds_is_refused_on_the_others(models, monkeypatch):
    """Gemma 3's and PaliGemma's forwards take ``token_type_ids``, Idefics3's and SmolVLM's
    ``pixel_attention_mask``, and Gemma 3's rotary ``layer_type`` (it picks one of two tables); LLaVA's contracts
    know none of them."""
    model = models("llava")
    text = model.model.language_model
    for cls, name, param in [(type(model), "forward", "token_type_ids"),
                             (type(model.model), "forward", "pixel_attention_mask"),
                             (type(text.rotary_emb), "forward", "layer_type")]:
        with monkeypatch.context() as mp:
            new = inspect.Parameter(param, inspect.Parameter.KEYWORD_ONLY, default=None)
            _with_signature(mp, cls, name, lambda ps: _add(ps, new))
            with pytest.raises(UnsupportedTransformersError, match=rf"{cls.__name__}\.{name}.*`{param}`"):
                patch_model(model, "circle")
        assert not is_patched(model)


def test_gemma3s_rotary_without_its_layer_type_is_refused(models, monkeypatch):
    """The rotary hook reads ``layer_type`` to pick the table: a release that dropped it is refused by name."""
    model = models("gemma3")
    cls = type(model.model.language_model.rotary_emb)
    _with_signature(monkeypatch, cls, "forward", lambda ps: [p for p in ps if p.name != "layer_type"])
    with pytest.raises(UnsupportedTransformersError,
                       match=r"Gemma3RotaryEmbedding\.forward.*has no parameter `layer_type`"):
        patch_model(model, "circle")
    assert not is_patched(model)


def test_the_omni_position_parameters_are_refused_on_the_other_families(models, monkeypatch):
    """Qwen2.5-Omni's position code takes ``use_audio_in_video`` and ``video_second_per_grid``; only its adapter
    knows them (and refuses audio in video): on Qwen2.5-VL the same parameter is unknown and refused by name."""
    model = models("qwen2_5_vl")
    for param in ("use_audio_in_video", "video_second_per_grid", "audio_feature_lengths"):
        with monkeypatch.context() as mp:
            new = inspect.Parameter(param, inspect.Parameter.KEYWORD_ONLY, default=None)
            _with_signature(mp, type(model.model), "forward", lambda ps: _add(ps, new))
            with pytest.raises(UnsupportedTransformersError, match=rf"Qwen2_5_VLModel\.forward.*`{param}`"):
                patch_model(model, "circle")
        assert not is_patched(model)
