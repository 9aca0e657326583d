"""Inputs and configurations from transformers' own model suites (dev/hf_suites) that the stock-equivalent patch
must run as the stock model does: tiny random models built from configs, the stock model's logits as the reference.

- Gemma 3 with ``mm_tokens_per_image`` no square (the projector pools to ``int(√n)`` tokens per side);
- GLM-4.5V with a two-chunk ``mrope_section`` (chunk i turns with axis i mod 3: no width frequencies);
- Qwen3-Omni's ``rope_parameters`` with ``interleaved: True``, a key transformers' rotary never reads;
- rope scaling on a rotary dim of 2 (Qwen3.5's partial rotary on an 8-channel head);
- LLaVA-NeXT image tokens under ``attention_mask`` 0 (the model fills them whatever the mask);
- Mistral 3 image tokens without their row ends (what the stock model counts, it fills);
- an image or video token id in the Omni thinker's text outside any vision block (text to the stock model);
- a grid/token count mismatch refused with transformers' own words.
"""
import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import torch
import transformers as T

from ropekit.hf import patch_model, unpatch_model

from test_hf_families_1d import FAMILIES as FAMILIES_1D, TEXT as TEXT_1D, VISION as VISION_1D, _mistral3
from test_hf_families_1d import _seeded as _seeded_1d, make_batch as batch_1d
from test_hf_families_3axis import GLM_VISION, QWEN_VISION, TEXT, make_batch, FAMILIES as FAMILIES_3AXIS
from test_hf_families_3axis import _seeded as _seeded_3axis
from test_hf_llava_anyres import _build as _llava_next, make_batch as llava_next_batch
from test_hf_omni import FAMILIES as OMNI, IMG as OMNI_IMG, VID as OMNI_VID, V_START
from test_hf_omni import make_batch as omni_batch


def _logits(model, inputs):
    with torch.no_grad():
        return model(**inputs).logits


def _stock_then_patched(model, inputs, design, **options):
    """(stock logits, logits patched with ``design``) of one forward."""
    ref = _logits(model, inputs)
    patch_model(model, design, **options)
    try:
        return ref, _logits(model, inputs)
    finally:
        unpatch_model(model)


def test_gemma3_pools_a_non_square_token_count_as_its_projector_does():
    """mm_tokens_per_image=2 on 4 patches per side: the projector pools with a kernel of 4 // int(√2) = 4 to one
    token per image, which is what the processor's prompt then holds (transformers' Gemma 3 suite)."""
    torch.manual_seed(0)
    rope = {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    model = T.Gemma3ForConditionalGeneration(T.Gemma3Config(
        vision_config=VISION_1D, text_config=dict(TEXT_1D, head_dim=16, sliding_window=4, rope_parameters=rope),
        mm_tokens_per_image=2, image_token_index=70, boi_token_index=71, eoi_token_index=72)).eval()
    ids = torch.tensor([[5, 6, 71, 70, 72, 7, 71, 70, 72, 8], [0, 0, 9, 10, 71, 70, 72, 11, 12, 13]])
    inputs = dict(input_ids=ids, attention_mask=(ids != 0).long(), token_type_ids=(ids == 70).long(),
                  pixel_values=torch.randn(3, 3, 8, 8))
    inputs["position_ids"] = (inputs["attention_mask"].cumsum(-1) - 1).clamp(min=0)  # stock: left padding counted
    ref = _logits(model, inputs)
    patch_model(model, "vanilla")
    got = _logits(model, {k: v for k, v in inputs.items() if k != "position_ids"})
    keep = inputs["attention_mask"].bool()
    assert torch.equal(got[keep], ref[keep])
    unpatch_model(model)


def test_gemma3_refuses_only_a_pooling_the_model_cannot_build():
    torch.manual_seed(0)
    model = T.Gemma3ForConditionalGeneration(T.Gemma3Config(
        vision_config=VISION_1D, text_config=dict(TEXT_1D, head_dim=16), mm_tokens_per_image=25,
        image_token_index=70, boi_token_index=71, eoi_token_index=72))  # int(√25) = 5 tokens per side of 4 patches
    with pytest.raises(ValueError, match=r"kernel.*4 // 5.*below 1"):
        patch_model(model, "vanilla")


def test_glm4v_moe_two_chunk_mrope_section_is_the_stock_model():
    """mrope_section [2, 2] over 4 rotated pairs: time takes pairs 0-1, height 2-3, width none (stock's
    chunk i -> axis i mod 3); the stock-equivalent patch gives the stock logits on images."""
    torch.manual_seed(0)
    rope = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 2], "partial_rotary_factor": 0.5}
    model = T.Glm4vMoeForConditionalGeneration(T.Glm4vMoeConfig(
        text_config=dict(TEXT, head_dim=16, rope_parameters=rope, n_routed_experts=4, num_experts_per_tok=2,
                         moe_intermediate_size=16, n_shared_experts=1, first_k_dense_replace=1),
        vision_config=GLM_VISION, image_token_id=70, video_token_id=71)).eval()
    inputs, _ = make_batch(FAMILIES_3AXIS["glm4v_moe"], [[("T", 3), ("I", 4, 8), ("T", 2)],
                                                         [("T", 2), ("I", 8, 4), ("T", 1)]])
    ref, got = _stock_then_patched(model, inputs, "mrope", continuation="spatial")
    keep = inputs["attention_mask"].bool()
    assert torch.equal(got[keep], ref[keep])


def test_chunked_mrope_section_of_more_than_three_chunks_is_refused_by_its_reason():
    torch.manual_seed(0)
    rope = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [1, 1, 1, 1], "partial_rotary_factor": 0.5}
    model = T.Glm4vForConditionalGeneration(T.Glm4vConfig(
        text_config=dict(TEXT, rope_parameters=rope), vision_config=GLM_VISION, image_token_id=70, video_token_id=71))
    with pytest.raises(ValueError, match=r"\[1, 1, 1, 1\] has 4 chunks.*axis i mod 3"):
        patch_model(model, "mrope")


def _qwen3_omni(interleaved):
    torch.manual_seed(0)
    model = OMNI["qwen3_omni_moe_thinker"].build()
    rope = model.config.text_config.rope_parameters
    rope.pop("mrope_interleaved", None)
    rope["interleaved"] = interleaved
    return model.eval()


def test_qwen3_omni_interleaved_key_is_accepted_and_is_the_stock_model():
    model = _qwen3_omni(True)
    inputs, _ = omni_batch(OMNI["qwen3_omni_moe_thinker"], [[("T", 3), ("I", 4, 4), ("T", 2)],
                                                             [("T", 2), ("I", 4, 8), ("T", 1)]])
    ref, got = _stock_then_patched(model, inputs, "tmrope", temporal_rounding="exact")
    keep = inputs["attention_mask"].bool()
    assert torch.equal(got[keep], ref[keep])


def test_qwen3_omni_interleaved_false_is_refused_the_model_interleaves_anyway():
    with pytest.raises(ValueError, match=r"\['interleaved'\] is False.*interleaves its mrope_section"):
        patch_model(_qwen3_omni(False), "tmrope", temporal_rounding="exact")


@pytest.mark.parametrize("scaling", [{"rope_type": "linear", "factor": 10.0},
                                     {"rope_type": "yarn", "factor": 10.0, "original_max_position_embeddings": 16}])
def test_scaling_on_a_rotary_dim_of_two_is_the_stock_model(scaling):
    """Qwen3.5's partial rotary factor 0.25 of an 8-channel head rotates one pair, scaled as transformers scales it."""
    torch.manual_seed(0)
    rope = {"rope_theta": 1e4, "mrope_section": [1, 0, 0], "partial_rotary_factor": 0.25, **scaling}
    model = T.Qwen3_5ForConditionalGeneration(T.Qwen3_5Config(
        text_config=dict(TEXT, head_dim=8, rope_parameters=rope, layer_types=["full_attention"],
                         num_hidden_layers=1, linear_num_value_heads=2, linear_num_key_heads=1,
                         linear_key_head_dim=8, linear_value_head_dim=8, max_position_embeddings=64),
        vision_config=QWEN_VISION, image_token_id=70, video_token_id=71)).eval()
    inputs, _ = make_batch(FAMILIES_3AXIS["qwen3_5_moe"], [[("T", 3), ("I", 4, 4), ("T", 2)]])
    ref, got = _stock_then_patched(model, inputs, "mrope", continuation="spatial")
    assert torch.equal(got, ref)


def test_ntk_scaling_on_a_rotary_dim_of_two_is_refused_by_its_reason():
    from ropekit.rotations.scaling import parse_scaling, scale_frequencies

    with pytest.raises(ValueError, match="no value for a rotary dim of 2"):
        scale_frequencies(torch.ones(1, 1), parse_scaling({"rope_type": "ntk", "factor": 2.0}), base=1e4, dim=2)


def test_llava_next_image_tokens_under_mask_zero_are_the_stock_model():
    """transformers' VLM tester's inputs: image tokens first and row b attending to tokens 0..b only, so the images
    are partly under attention_mask 0 (the model fills their tokens all the same). vanilla places an image as text,
    so the unmasked tokens get the stock logits; a whole image under mask 0 is padding. A design that places an
    image as a grid refuses the partly hidden one by its reason."""
    model = _llava_next("next")
    model.family = "next"
    inputs, _ = llava_next_batch(model, [[("I", (8, 8)), ("T", 4)], [("I", (5, 16)), ("T", 3)]], pad="right")
    ids = inputs["input_ids"]
    first = int((ids[1] == 70).sum())
    hidden = torch.ones_like(ids)
    hidden[1, :first] = 0  # the second sample's image wholly under mask 0
    for mask in (torch.tril(torch.ones_like(ids)), hidden):
        case = dict(inputs, attention_mask=mask)
        ref = _logits(model, dict(case, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)))  # as generate counts
        patch_model(model, "vanilla")
        got = _logits(model, case)
        unpatch_model(model)
        keep = mask.bool()
        assert torch.equal(got[keep], ref[keep])
    patch_model(model, "circle")
    with pytest.raises(ValueError, match=r"image 0 \(row 0, from token 0\) is partly under attention_mask 0"):
        _logits(model, dict(inputs, attention_mask=torch.tril(torch.ones_like(ids))))
    unpatch_model(model)


def test_mistral3_image_tokens_without_row_ends_under_vanilla_are_the_stock_model():
    """transformers' Mistral 3 tester writes an image's tokens in one run, without the [IMG_BREAK]/[IMG_END] its
    processor puts after every row: vanilla places a grid's tokens as text, so it runs them as stock does; a
    design that places the image as a grid refuses them by the missing row ends."""
    torch.manual_seed(0)
    model = _mistral3().eval()
    ids = torch.tensor([[5, 6] + [70] * 4 + [7, 8], [9] + [70] * 4 + [10, 11, 12]])  # 8x8 pixels: 2x2 tokens each
    inputs = dict(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=torch.randn(2, 3, 16, 16),
                  image_sizes=torch.tensor([[8, 8], [8, 8]]))
    ref, got = _stock_then_patched(model, inputs, "vanilla")
    assert torch.equal(got, ref)
    patch_model(model, "circle")
    with pytest.raises(ValueError, match=r"not laid out as the processor writes it.*not each followed by one other"):
        _logits(model, inputs)
    unpatch_model(model)


def test_generate_continuing_generates_cache_with_the_whole_sequence_on_a_1d_family():
    """transformers' generation tests continue a generate's cache given the whole sequence and no pixels. On a
    1-D family under vanilla the text positions need no images, so the continuation is the stock one; a design
    whose positions depend on the images refuses it (the images are gone)."""
    model = _seeded_1d(FAMILIES_1D["internvl"].build)
    inputs, _ = batch_1d("internvl")
    kw = dict(do_sample=False, return_dict_in_generate=True, output_scores=True)
    with torch.no_grad():
        ref = model.generate(**inputs, max_new_tokens=4, **kw)
        for design in ("vanilla", "circle"):
            patch_model(model, design)
            first = model.generate(**inputs, max_new_tokens=3, **kw)
            mask = torch.nn.functional.pad(inputs["attention_mask"], (0, 3), value=1)
            cont = dict(input_ids=first.sequences, attention_mask=mask, past_key_values=first.past_key_values)
            if design == "circle":
                with pytest.raises(ValueError, match="did not fill itself"):
                    model.generate(**cont, max_new_tokens=1, **kw)
                continue
            got = model.generate(**cont, max_new_tokens=1, **kw)
            assert torch.equal(got.sequences, ref.sequences)
            assert torch.allclose(got.scores[0], ref.scores[3], atol=1e-5)
    unpatch_model(model)


def test_generate_continuing_generates_cache_with_the_prompts_token_types_on_a_3axis_family():
    """The same continuation on GLM-4V with the grids and the prompt's mm_token_type_ids, shorter than the sequence
    by what generate made (text, as generate extends the types itself): the stock-equivalent patch's tokens and
    scores are those of one longer stock generate."""
    model = _seeded_3axis(FAMILIES_3AXIS["glm4v"].build)
    samples = [[("T", 3), ("I", 4, 4), ("T", 2)], [("T", 2), ("I", 4, 8), ("T", 1)]]
    inputs, _ = make_batch(FAMILIES_3AXIS["glm4v"], samples)
    kw = dict(do_sample=False, return_dict_in_generate=True, output_scores=True)
    with torch.no_grad():
        ref = model.generate(**inputs, max_new_tokens=4, **kw)
        patch_model(model, "mrope", continuation="spatial")
        first = model.generate(**inputs, max_new_tokens=3, **kw)
        mask = torch.nn.functional.pad(inputs["attention_mask"], (0, 3), value=1)
        cont = dict(inputs, input_ids=first.sequences, attention_mask=mask, past_key_values=first.past_key_values)
        cont.pop("pixel_values")
        got = model.generate(**cont, max_new_tokens=1, **kw)
    assert torch.equal(got.sequences, ref.sequences)
    assert torch.allclose(got.scores[0], ref.scores[3], atol=1e-5)
    unpatch_model(model)


@pytest.mark.parametrize("stray", [OMNI_VID, OMNI_IMG])
def test_omni_vision_token_outside_a_vision_block_is_text_as_in_stock(stray):
    """transformers' Omni tester draws text ids that include the video token; with no video grids the stock
    position code reads it as text (it types a modality only right after a vision-start token)."""
    family = OMNI["qwen2_5_omni_thinker"]
    torch.manual_seed(0)
    model = family.build().eval()
    samples = [[("T", 3), ("I", 4, 4), ("T", 2)], [("T", 2), ("I", 4, 8), ("T", 1)]]
    if stray == OMNI_IMG:
        samples = [[("T", 6)], [("T", 4)]]
    inputs, _ = omni_batch(family, samples)
    inputs["input_ids"][:, -2] = stray  # in the text, after any vision block
    ref, got = _stock_then_patched(model, inputs, "tmrope")
    keep = inputs["attention_mask"].bool()
    assert torch.equal(got[keep], ref[keep])
    if stray == OMNI_VID:  # with image grids given: after a vision-start token it is a video without grids
        inputs["input_ids"][0, -3] = V_START
        with pytest.raises((TypeError, RuntimeError, IndexError)):
            _logits(model, inputs)  # the stock model fails on its own
        patch_model(model, "tmrope")
        with pytest.raises(ValueError, match="`video_grid_thw` is missing; pass the grids"):
            _logits(model, inputs)
        unpatch_model(model)


def test_grid_token_mismatch_speaks_transformers_words():
    """The refusal of more image tokens than the grids describe begins as the stock model's feature check."""
    torch.manual_seed(0)
    model = FAMILIES_3AXIS["glm4v"].build().eval()
    inputs, _ = make_batch(FAMILIES_3AXIS["glm4v"], [[("T", 3), ("I", 4, 4), ("T", 2)], [("T", 2), ("I", 4, 4)]])
    inputs["image_grid_thw"] = inputs["image_grid_thw"][:1]
    inputs["pixel_values"] = inputs["pixel_values"][:16]
    with pytest.raises(ValueError, match="Image features and image tokens do not match, tokens: 8, features: 4"):
        _logits(model, inputs)
    patch_model(model, "mrope")
    with pytest.raises(ValueError, match="Image features and image tokens do not match, tokens: 8, features: 4: "
                                         "rope_index"):
        _logits(model, inputs)
    unpatch_model(model)


def test_the_stock_equivalent_patch_saves_the_stock_models_checkpoint(tmp_path):
    """transformers' suites save a model and reload it with its own class, and build other classes from its
    config: the stock-equivalent patch is the stock model, so its checkpoint loads as one (the record kept, which
    ``patch_model(model)`` restores); any other patch keeps ropekit's saved form."""
    import json

    from ropekit.hf import is_patched, layer_designs

    torch.manual_seed(0)
    model = FAMILIES_3AXIS["glm4v"].build().eval()
    inputs, _ = make_batch(FAMILIES_3AXIS["glm4v"], [[("T", 3), ("I", 4, 4), ("T", 2)]])
    ref = _logits(model, inputs)
    patch_model(model, "mrope", continuation="spatial")
    T.AutoModel.from_config(model.config)  # the config still names its family's classes
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "glm4v" and saved["ropekit"]["design"] == "mrope"
    loaded = type(model).from_pretrained(tmp_path).eval()
    assert not is_patched(loaded) and torch.equal(_logits(loaded, inputs), ref)
    patch_model(loaded)
    assert layer_designs(loaded) == ["mrope", "mrope"] and torch.equal(_logits(loaded, inputs), ref)
    patch_model(model, "circle")
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "ropekit"
    patch_model(model, "mrope", continuation="spatial")  # back to the stock-equivalent patch: the stock form again
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "glm4v"
    unpatch_model(model)
