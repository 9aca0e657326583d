"""ropekit designs inside the 3-axis families whose position code has the Qwen-VL shape: Qwen3-VL-MoE, Qwen3.5-MoE,
GLM-4.1V / 4.5V / 4.6V, GLM-OCR, ERNIE-4.5-VL-MoE and PaddleOCR-VL (tiny random models built from configs); and the
refusal of HunYuan-VL, whose position code has another shape.

References: the stock transformers model with the same weights (the stock-equivalent patch, M-RoPE with
``continuation="spatial"`` in the family's native allocation, must give its logits, positions, ``rope_deltas`` and
``generate`` output bit for bit), each design's ``ropekit.positions`` on the layout the model sees, and one
teacher-forced forward over the whole sequence (cached generation must reproduce its logits).
"""
import os

os.environ["HF_HUB_OFFLINE"] = "1"

from dataclasses import dataclass
from typing import Callable, Optional

import pytest
import torch
import transformers as T

import ropekit
from ropekit import Image, Layout, Text, Video
from ropekit.hf import is_patched, last_positions, layer_designs, patch_model, supported_models

from hf_compat import (assert_refused_by_name, assert_checkpointing_keeps_gradients, left_padded, ready_to_generate,
                       restore)

IMG, VID, PAD = 70, 71, 0
DESIGNS = [d for d in ropekit.designs() if ropekit.get_design(d).allocation != "mhrope"]
TEXT = dict(hidden_size=32, intermediate_size=48, num_attention_heads=2, num_key_value_heads=1, vocab_size=80,
            num_hidden_layers=2)
QWEN_VISION = dict(depth=1, hidden_size=16, out_hidden_size=32, intermediate_size=16, num_heads=2, spatial_merge_size=2,
                   patch_size=2, temporal_patch_size=2, num_position_embeddings=16)
GLM_VISION = dict(depth=1, hidden_size=16, out_hidden_size=32, intermediate_size=16, num_heads=2, spatial_merge_size=2,
                  patch_size=2, temporal_patch_size=2, image_size=8)
# GLM: half of the 16-channel head rotates (4 pairs), chunked t 1 : h 2 : w 1
GLM_ROPE = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [1, 2, 1], "partial_rotary_factor": 0.5}


def _qwen3_vl_moe():
    rope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3], "mrope_interleaved": True}
    return T.Qwen3VLMoeForConditionalGeneration(T.Qwen3VLMoeConfig(
        text_config=dict(TEXT, head_dim=16, rope_parameters=rope, num_experts=4, num_experts_per_tok=2,
                         moe_intermediate_size=16),
        vision_config=dict(QWEN_VISION, deepstack_visual_indexes=[0]), image_token_id=IMG, video_token_id=VID))


def _qwen3_5_moe(layers=("linear_attention", "full_attention")):
    rope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 1, 1], "partial_rotary_factor": 0.5,
            "mrope_interleaved": True}
    return T.Qwen3_5MoeForConditionalGeneration(T.Qwen3_5MoeConfig(
        text_config=dict(TEXT, num_hidden_layers=len(layers), head_dim=16, rope_parameters=rope,
                         layer_types=list(layers), linear_num_value_heads=2, linear_num_key_heads=1,
                         linear_key_head_dim=8, linear_value_head_dim=8, num_experts=4, num_experts_per_tok=2,
                         moe_intermediate_size=16, shared_expert_intermediate_size=16),
        vision_config=QWEN_VISION, image_token_id=IMG, video_token_id=VID))


def _glm4v():
    return T.Glm4vForConditionalGeneration(T.Glm4vConfig(
        text_config=dict(TEXT, rope_parameters=GLM_ROPE), vision_config=GLM_VISION, image_token_id=IMG,
        video_token_id=VID))


def _glm4v_moe():
    return T.Glm4vMoeForConditionalGeneration(T.Glm4vMoeConfig(
        text_config=dict(TEXT, head_dim=16, rope_parameters=GLM_ROPE, n_routed_experts=4, num_experts_per_tok=2,
                         moe_intermediate_size=16, n_shared_experts=1, first_k_dense_replace=1),
        vision_config=GLM_VISION, image_token_id=IMG, video_token_id=VID))


def _glm46v(text="glm4v_text"):
    extra = dict(head_dim=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                 n_shared_experts=1, first_k_dense_replace=1) if text == "glm4v_moe_text" else {}
    return T.Glm46VForConditionalGeneration(T.Glm46VConfig(
        text_config=dict(TEXT, model_type=text, rope_parameters=GLM_ROPE, **extra),
        vision_config=dict(GLM_VISION, model_type="glm4v_vision"), image_token_id=IMG, video_token_id=VID))


def _glm_ocr():
    return T.GlmOcrForConditionalGeneration(T.GlmOcrConfig(
        text_config=dict(TEXT, head_dim=16, rope_parameters=GLM_ROPE), vision_config=GLM_VISION, image_token_id=IMG,
        video_token_id=VID))


def _ernie():
    # mrope_section [h, w, t]: h and w alternate over the 6 highest-frequency pairs, t takes the 2 lowest
    rope = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [3, 3, 2]}
    return T.Ernie4_5_VLMoeForConditionalGeneration(T.Ernie4_5_VLMoeConfig(
        text_config=dict(TEXT, head_dim=16, rope_parameters=rope, moe_num_experts=4, moe_k=2,
                         moe_intermediate_size=[16, 16], moe_num_shared_experts=1, mlp_layer_types=["dense", "sparse"]),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, patch_size=2,
                           spatial_merge_size=2, temporal_merge_size=2),
        image_token_id=IMG, video_token_id=VID))


def _paddleocr_vl():
    rope = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]}
    return T.PaddleOCRVLForConditionalGeneration(T.PaddleOCRVLConfig(
        text_config=dict(TEXT, head_dim=16, rope_parameters=rope),
        vision_config=dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                           patch_size=2, image_size=8, spatial_merge_size=2),
        image_token_id=IMG, video_token_id=VID))


@dataclass(frozen=True)
class Family:
    build: Callable
    pixel: tuple  # one patch's pixel_values shape
    videos: Optional[str]  # "frames": one block per frame, a timestamp between; "block": one block; None: no videos
    video_id: int = VID  # the id video tokens carry in input_ids (GLM: the image token's)
    temporal_merge: int = 1  # grid t per token step (ERNIE's resampler merges 2)
    newline: int = 0  # tokens closing every merged row, placed as the grid's last columns (HY-V4-VL: 1)


FAMILIES = {
    "qwen3_vl_moe": Family(_qwen3_vl_moe, (24,), "frames"),
    "qwen3_5_moe": Family(_qwen3_5_moe, (24,), "frames"),
    "glm4v": Family(_glm4v, (24,), "frames", video_id=IMG),
    "glm4v_moe": Family(_glm4v_moe, (24,), "frames", video_id=IMG),
    "glm46v": Family(_glm46v, (24,), "frames", video_id=IMG),
    "glm_ocr": Family(_glm_ocr, (24,), "frames", video_id=IMG),
    "ernie4_5_vl_moe": Family(_ernie, (12,), "block", temporal_merge=2),
    "paddleocr_vl": Family(_paddleocr_vl, (3, 2, 2), None),
}
BUILDERS = {name: f.build for name, f in FAMILIES.items()}  # for tests/test_hf_boundary.py


def _seeded(build):
    torch.manual_seed(0)
    return ready_to_generate(build(), PAD, [IMG, VID])


@pytest.fixture(scope="module", params=list(FAMILIES))
def fam(request):
    """(family name, its spec, a stock model); the model is unpatched after every test."""
    model = _seeded(FAMILIES[request.param].build)
    yield request.param, FAMILIES[request.param], model
    restore(model)


@pytest.fixture(autouse=True)
def _unpatched_after(request):
    yield
    if "fam" in request.fixturenames:
        restore(request.getfixturevalue("fam")[2])


# ---------------------------------------------------------------------------------------------------------------
# inputs: samples as segments ("T", n) text, ("I", h, w) image patch grid, ("V", t, h, w) video patch grid


IMAGES = [[("T", 3), ("I", 4, 4), ("T", 2), ("I", 4, 8), ("T", 2)], [("T", 2), ("I", 8, 4), ("T", 3)]]
VIDEOS = [[("T", 2), ("V", 4, 4, 4), ("T", 3)], [("T", 3), ("V", 2, 4, 8), ("T", 2)]]


def make_batch(family: Family, samples, seed=0):
    """Left-padded model inputs and, per sample, its layout (a list of ropekit segments, spatial merge 2)."""
    g = torch.Generator().manual_seed(seed)
    rows, types, layouts, img, vid = [], [], [], [], []
    for segs in samples:
        ids, tt, lay = [], [], []

        def add(token, kind, n):
            ids.extend([token] * n if kind else torch.randint(1, 60, (n,), generator=g).tolist())
            tt.extend([kind] * n)

        for s in segs:
            if s[0] == "T":
                add(None, 0, s[1])
                lay.append(Text(s[1]))
            elif s[0] == "I":
                img.append(s[1:])
                gh, gw = s[1] // 2, s[2] // 2 + family.newline
                add(IMG, 1, gh * gw)
                lay.append(Image(gh, gw))
            else:
                t, h, w = s[1:]
                vid.append(s[1:])
                gh, gw = h // 2, w // 2 + family.newline
                if family.videos == "frames":  # each frame a block of its own, its timestamp (text) between
                    for f in range(t):
                        if f and not family.newline:  # HY-V4-VL writes the frames back to back
                            add(None, 0, 1)
                            lay.append(Text(1))
                        add(family.video_id, 2, gh * gw)
                        lay.append(Video(1, gh, gw, 1.0))
                else:
                    steps = t // family.temporal_merge
                    add(family.video_id, 2, steps * gh * gw)
                    lay.append(Video(steps, gh, gw, 1.0))
        rows.append(ids)
        types.append(tt)
        layouts.append(lay)
    input_ids, mask, mm = left_padded(rows, PAD, types)
    inputs = dict(input_ids=input_ids, mm_token_type_ids=mm, attention_mask=mask)
    if img:
        grids = torch.tensor([[1, h, w] for h, w in img])
        inputs.update(image_grid_thw=grids,
                      pixel_values=torch.randn(int(grids.prod(1).sum()), *family.pixel, generator=g))
    if vid:
        grids = torch.tensor(vid)
        inputs.update(video_grid_thw=grids,
                      pixel_values_videos=torch.randn(int(grids.prod(1).sum()), *family.pixel, generator=g))
    return inputs, layouts


def reference_positions(inputs, layouts, design, extra=0, **options):
    """Expected (A, B, L): each sample's ``ropekit.positions`` (its layout, then ``extra`` text) on its tokens."""
    mask = inputs["attention_mask"].bool()
    per = [ropekit.positions(Layout(lay + ([Text(extra)] if extra else [])), design, **options) for lay in layouts]
    out = torch.zeros(per[0].shape[1], *mask.shape)
    for b, p in enumerate(per):
        out[:, b, mask[b]] = p.T
    return out


def _batches(family):
    return [make_batch(family, IMAGES)] + ([make_batch(family, VIDEOS, seed=1)] if family.videos else [])


def _logits(model, inputs):
    with torch.no_grad():
        return model(**inputs).logits


def _stock_positions(model, inputs):
    return model.model.get_rope_index(
        inputs["input_ids"], mm_token_type_ids=inputs["mm_token_type_ids"],
        image_grid_thw=inputs.get("image_grid_thw"), video_grid_thw=inputs.get("video_grid_thw"),
        attention_mask=inputs["attention_mask"])


# ---------------------------------------------------------------------------------------------------------------
# the stock-equivalent patch is the stock model


def test_supported_models_lists_the_families():
    assert set(FAMILIES) <= set(supported_models())
    assert supported_models() == sorted(supported_models())


def test_stock_equivalent_forward_matches_stock(fam):
    """Images and (where the family has them) videos with left padding, and text only: the same positions,
    rope_deltas and logits as the stock model, bit for bit; the positions are ``ropekit.positions`` of the layout."""
    _, family, model = fam
    text = torch.randint(1, 60, (2, 7), generator=torch.Generator().manual_seed(3))
    want = []
    for inputs, _ in _batches(family):
        ref = _logits(model, inputs)
        want.append((ref, *_stock_positions(model, inputs)))
    want_text = _logits(model, dict(input_ids=text))
    patch_model(model, "mrope", continuation="spatial")
    for (inputs, layouts), (ref, pos, deltas) in zip(_batches(family), want):
        keep = inputs["attention_mask"].bool()
        out = _logits(model, inputs)
        assert torch.equal(out[keep], ref[keep])
        assert model.model.rope_deltas is None  # the patched model keeps nothing between calls
        # transformers 5.x continues text after a block at its start + its larger side: ropekit's spatial continuation
        spatial = reference_positions(inputs, layouts, "mrope", continuation="spatial")
        assert torch.equal(pos[:, keep].float(), spatial[:, keep])
        for p in last_positions(model).values():
            assert torch.equal(p[:, keep], spatial[:, keep])
        got, got_deltas = _stock_positions(model, inputs)  # the patched get_rope_index: the stock one here
        assert torch.equal(got[:, keep], pos[:, keep]) and torch.equal(got_deltas, deltas)
    assert torch.equal(_logits(model, dict(input_ids=text)), want_text)
    patch_model(model, "circle")  # text is the diagonal in every design
    assert torch.equal(_logits(model, dict(input_ids=text)), want_text)


def test_stock_equivalent_generate_matches_stock(fam):
    """Greedy generate over left-padded images (and videos): the same tokens, per-step logits and rope_deltas."""
    _, family, model = fam
    kw = dict(max_new_tokens=3, do_sample=False, output_logits=True, return_dict_in_generate=True)
    batches = [inputs for inputs, _ in _batches(family)]
    with torch.no_grad():
        want = [model.generate(**inputs, **kw) for inputs in batches]
        patch_model(model, "mrope", continuation="spatial")
        for inputs, ref in zip(batches, want):
            got = model.generate(**inputs, **kw)
            assert torch.equal(got.sequences, ref.sequences)
            for w, g in zip(ref.logits, got.logits):
                assert torch.equal(g, w)
            assert model.model.rope_deltas is None


def _encoded(model, inputs):
    """``inputs`` with the images and videos encoded once (``mm_encoder_outputs``, as ``generate`` passes them)."""
    out, encoded = dict(inputs), {}
    with torch.no_grad():
        if "pixel_values" in out:
            encoded["image"] = model.model.get_image_features(out.pop("pixel_values"), out["image_grid_thw"],
                                                              return_dict=True)
        if "pixel_values_videos" in out:
            encoded["video"] = model.model.get_video_features(out.pop("pixel_values_videos"), out["video_grid_thw"],
                                                              return_dict=True)
    return dict(out, mm_encoder_outputs=encoded)


def assert_every_design_places_its_positions(model, batches, designs) -> None:
    """Patched with each of ``designs``, ``model`` gives finite logits on every ``(inputs, layouts)`` batch and
    every layer rotates with each sample's ``ropekit.positions`` of its layout."""
    for design in designs:
        patch_model(model, design)
        for inputs, layouts in batches:
            keep = inputs["attention_mask"].bool()
            out = _logits(model, inputs)
            assert torch.isfinite(out[keep]).all(), design
            want = reference_positions(inputs, layouts, design)
            for p in last_positions(model).values():
                assert torch.equal(p[:, keep], want[:, keep]), design


def test_every_design_places_its_positions(fam):
    """Every design runs (images and videos) and every layer rotates with ``ropekit.positions`` of the layout."""
    _, family, model = fam
    batches = [(_encoded(model, inputs), layouts) for inputs, layouts in _batches(family)]
    assert_every_design_places_its_positions(model, batches, DESIGNS)


@pytest.mark.parametrize("age", [None, "alternate"])
def test_cached_generation_equals_a_teacher_forced_forward(fam, age):
    _, family, model = fam
    inputs, layouts = make_batch(family, IMAGES)
    patch_model(model, "circle", age=age)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=3, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
        n = out.sequences.shape[1] - inputs["input_ids"].shape[1]
        full = dict(inputs, input_ids=out.sequences,
                    mm_token_type_ids=torch.cat([inputs["mm_token_type_ids"], torch.zeros(2, n, dtype=torch.long)], 1),
                    attention_mask=torch.cat([inputs["attention_mask"], torch.ones(2, n, dtype=torch.long)], 1))
        logits = model(**full).logits
    keep = full["attention_mask"].bool()
    for layer, p in last_positions(model).items():
        want = reference_positions(full, layouts, layer_designs(model)[layer], extra=n)
        assert torch.equal(p[:, keep], want[:, keep])
    start = inputs["input_ids"].shape[1] - 1
    for k, step in enumerate(out.logits):
        torch.testing.assert_close(step, logits[:, start + k], rtol=1e-5, atol=1e-5)


def test_checkpointed_training_step(fam):
    """AGE training: the loss backpropagates, and gradient checkpointing gives the same gradients."""
    _, family, model = fam
    inputs, _ = make_batch(family, IMAGES)
    labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
    patch_model(model, "circle", age="alternate")

    assert_checkpointing_keeps_gradients(model, inputs, labels, model.model.language_model)


def test_save_pretrained_and_reload_restore_the_patch(fam, tmp_path):
    _, family, model = fam
    inputs, _ = make_batch(family, IMAGES)
    patch_model(model, "circle", age="alternate", alpha=0.5)
    ref = _logits(model, inputs)
    model.save_pretrained(tmp_path)
    loaded = ropekit.hf.from_pretrained(tmp_path, type(model)).eval()  # the family's class, patched from the record
    assert layer_designs(loaded) == layer_designs(model)
    assert torch.equal(_logits(loaded, inputs), ref)


# ---------------------------------------------------------------------------------------------------------------
# family specifics


@pytest.mark.parametrize("name", ["glm4v", "glm_ocr"])
def test_glm_video_grids_need_token_types(name):
    """GLM-4V and GLM-OCR write video frames with the image token id: without mm_token_type_ids a video cannot be
    placed."""
    model = patch_model(_seeded(FAMILIES[name].build), "circle")
    inputs, _ = make_batch(FAMILIES[name], VIDEOS)
    inputs.pop("mm_token_type_ids")
    with pytest.raises(ValueError, match="image token id.*mm_token_type_ids"):
        _logits(model, inputs)
    with pytest.raises(ValueError, match="image token id.*mm_token_type_ids"):
        model.generate(**inputs, max_new_tokens=1)


def test_glm46v_reads_its_text_models_layout():
    """GLM-4.6V builds its language model from the text config: the GLM-4.5V (MoE) text model rotates with
    rotate-half tables and is stock-equivalent too; a language model of another family is refused."""
    model = _seeded(lambda: _glm46v("glm4v_moe_text"))
    assert type(model.model.language_model).__name__ == "Glm4vMoeTextModel"
    inputs, _ = make_batch(FAMILIES["glm46v"], IMAGES)
    keep = inputs["attention_mask"].bool()
    ref = _logits(model, inputs)
    patch_model(model, "mrope", continuation="spatial")
    assert torch.equal(_logits(model, inputs)[keep], ref[keep])
    other = T.Glm46VForConditionalGeneration(T.Glm46VConfig(
        text_config=dict(TEXT, model_type="qwen2"), vision_config=dict(GLM_VISION, model_type="glm4v_vision"),
        image_token_id=IMG, video_token_id=VID))
    with pytest.raises(ValueError, match="glm46v with a Qwen2Model language model is not supported"):
        patch_model(other, "circle")
    assert not is_patched(other)


def test_ernie_rotates_in_float32_as_stock():
    """ERNIE-4.5-VL rotates q and k in float32 with float32 cos/sin: in bfloat16 the patch gives the stock logits.

    ``Module.to(bfloat16)`` also rounds the stock rotary's inverse frequencies (a buffer; ``from_pretrained`` with a
    dtype keeps them float32); they are kept in float32 here, as loading does, so only the tables' dtype differs."""
    model = _seeded(_ernie)
    rotary = model.model.language_model.rotary_emb
    inv_freq = rotary.inv_freq.clone()
    model.to(torch.bfloat16)
    rotary.inv_freq = inv_freq
    inputs, _ = make_batch(FAMILIES["ernie4_5_vl_moe"], IMAGES)
    inputs["pixel_values"] = inputs["pixel_values"].bfloat16()
    keep = inputs["attention_mask"].bool()
    ref = _logits(model, inputs)
    patch_model(model, "mrope", continuation="spatial")
    assert torch.equal(_logits(model, inputs)[keep], ref[keep])


def test_ernie_sections_must_interleave_height_and_width():
    model = _seeded(_ernie)
    model.model.language_model.config.rope_parameters["mrope_section"] = [4, 2, 2]
    with pytest.raises(ValueError, match=r"\[h, w, t\] with h == w"):
        patch_model(model, "circle")
    assert not is_patched(model)


# ---------------------------------------------------------------------------------------------------------------
# families refused: their position code does not have the Qwen-VL shape (docs/hf.md, "Families ropekit refuses").
# The reference for each reason is the stock transformers model itself.


def _hunyuan_vl():
    rope = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 2, 2, 2]}  # sequence, width, height, image
    return T.HunYuanVLForConditionalGeneration(T.HunYuanVLConfig(
        text_config=dict(TEXT, head_dim=16, rope_parameters=rope),
        vision_config=dict(hidden_size=16, intermediate_size=16, num_attention_heads=2, num_hidden_layers=1, patch_size=2,
                           spatial_merge_size=2, out_hidden_size=32),
        image_token_id=IMG, im_start_id=72, im_end_id=73, im_newline_id=74))


REFUSED = {"hunyuan_vl": _hunyuan_vl}


@pytest.mark.parametrize("name", list(REFUSED))
def test_refused_families_say_why_and_list_the_supported_ones(name):
    assert_refused_by_name(REFUSED[name]().eval(), name, "mrope", continuation="spatial")


def test_hunyuan_vl_rotary_turns_the_two_channels_of_a_pair_by_different_axes():
    """Why HunYuan-VL is refused (1): its stock cos/sin are no rotation once the axes differ. Channel j and j + D/2
    are the pair transformers' rotate_half turns together; on a token whose axes agree (text) both carry the same
    angle, on a token whose axes differ (an image token) they do not, which no one-angle-per-pair table reproduces."""
    rotary = _hunyuan_vl().model.language_model.rotary_emb
    x = torch.zeros(1, 2, 16)
    pos = torch.tensor([[5, 5], [5, 0], [5, 1], [5, 0]])[:, None, :]  # (axes, batch, tokens): text at 5, image token
    cos, sin = rotary(x, pos)
    half = cos.shape[-1] // 2
    assert torch.equal(cos[0, 0, :half], cos[0, 0, half:]) and torch.equal(sin[0, 0, :half], sin[0, 0, half:])
    assert not torch.allclose(cos[0, 1, :half], cos[0, 1, half:])


def test_hunyuan_vl_places_image_axes_from_zero_and_counts_images_across_the_batch():
    """Why HunYuan-VL is refused (2): stock get_rope_index keeps every token's sequence index on the first axis,
    puts an image's tokens at (width, height) from 0 with a newline column, and numbers images over the whole batch,
    so a sample's positions depend on the samples before it (no per-sample layout gives them)."""
    model = _hunyuan_vl()
    # as the processor writes an image: start marker, the vision tower's extra token, a 4 x 4 patch grid merged to
    # 2 x 2 tokens plus one newline token per row, its closing extra token, end marker
    ids = torch.tensor([[1, 72] + [IMG] * 8 + [73, 2]] * 2)
    pos, deltas = model.model.get_rope_index(ids, mm_token_type_ids=(ids == IMG).long(),
                                             image_grid_thw=torch.tensor([[1, 4, 4]] * 2))
    assert pos.shape[0] == 4 and torch.equal(pos[0], torch.arange(12).expand(2, -1))
    grid = slice(3, 9)
    for axis in (1, 2, 3):  # the extra tokens and the markers keep their sequence index
        assert torch.equal(pos[axis, :, [0, 1, 2, 9, 10, 11]], pos[0, :, [0, 1, 2, 9, 10, 11]])
    assert torch.equal(pos[1, 0, grid], torch.tensor([0, 1, 2, 0, 1, 2]))  # width, the newline column last
    assert torch.equal(pos[2, 0, grid], torch.tensor([0, 0, 0, 1, 1, 1]))  # height
    assert torch.equal(pos[3, :, grid], torch.tensor([[0] * 6, [1] * 6]))  # the second sample's image is image 1
    assert torch.equal(deltas, torch.zeros(2, 1, dtype=deltas.dtype))


@pytest.mark.parametrize("patch", [dict(design="mrope", continuation="spatial"), dict(design="circle", age="alternate")],
                         ids=["stock-equivalent", "circle-age"])
def test_packed_rows_equal_per_sample_runs(fam, patch):
    """Samples packed into one padding-free row (ropekit.hf.pack): each sample's logits equal its own run. Families
    with linear-attention layers (Qwen3.5) carry a recurrent state across a row, so packing is refused there."""
    name, family, model = fam
    patch_model(model, **patch)
    # images and videos in rows of their own: GLM writes video frames with the image token id, and its stock forward
    # takes a batch of one kind
    for kind in [IMAGES] + ([VIDEOS] if family.videos else []):
        samples = [make_batch(family, [segs], seed=i)[0] for i, segs in enumerate(kind)]
        row = ropekit.hf.pack(model, samples)
        if "linear_attention" in (getattr(model.config.get_text_config(), "layer_types", None) or []):
            with pytest.raises(ValueError, match="linear_attention"):
                _logits(model, row)
            return
        alone = torch.cat([_logits(model, s)[0] for s in samples])
        torch.testing.assert_close(_logits(model, row)[0], alone, rtol=1e-5, atol=1e-5)
