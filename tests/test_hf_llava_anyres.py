"""ropekit designs in tiny random LLaVA-NeXT, LLaVA-NeXT-Video and LLaVA-OneVision models: tiled ("anyres")
images and pooled videos.

References: transformers' own packing of an image's features (``pack_image_features`` run on marker
features: the high-resolution view's rows end where the model puts its newline feature), its processors'
token counts (a second implementation of the same arithmetic), its video pooling layers, each design's own
``ropekit.positions`` on the layout those grids give, the stock model (vanilla and text-only logits), one
teacher-forced forward over the whole sequence (cached generation), and a save/reload round trip.
"""
import json
import os
import types

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import torch
from transformers import (
    LlavaNextConfig,
    LlavaNextForConditionalGeneration,
    LlavaNextVideoConfig,
    LlavaNextVideoForConditionalGeneration,
    LlavaOnevisionConfig,
    LlavaOnevisionForConditionalGeneration,
)
from transformers.image_processing_utils import select_best_resolution
from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches
from transformers.models.llava_next.processing_llava_next import LlavaNextProcessor
from transformers.models.llava_onevision.processing_llava_onevision import LlavaOnevisionProcessor

import ropekit
from ropekit import Image, Layout, Text, Video
from ropekit.hf import is_patched, last_positions, layer_designs, patch_model, unpatch_model
from ropekit.hf.persist import CONFIG_KEY
from hf_compat import checkpointed_gradients
from test_hf_llava import (  # the LLaVA tests' helpers and token ids
    DESIGNS,
    IMG,
    PAD,
    _generate_and_replay,
    assert_design_positions,
    assert_text_only_is_stock,
    assert_vanilla_is_stock,
    pad_rows,
    reference_positions,
)

VID = 71
S = 4  # image_size 8 / patch_size 2: a 4x4 patch grid per view, tile and frame
FRAMES = 2
PINPOINTS = [[8, 8], [8, 16], [16, 8], [16, 16], [8, 24], [16, 24]]
VISION = dict(hidden_size=16, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2, image_size=2 * S,
              patch_size=2)
TEXT = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1,
            vocab_size=80)
# image sizes (height, width): square, unpadded rows, unpadded columns, tall, wide; on OneVision (anyres_max_4)
# the larger views are also shrunk
SIZES = [(8, 8), (5, 16), (16, 5), (20, 9), (7, 24), (30, 31)]


def _config(family, **kw):
    common = dict(image_token_id=IMG, vision_feature_layer=-1, image_grid_pinpoints=PINPOINTS)
    if family == "next":
        return LlavaNextConfig(vision_config=dict(VISION, model_type="clip_vision_model"),
                               text_config=dict(TEXT, model_type="llama"), **common, **kw)
    if family == "next_video":
        return LlavaNextVideoConfig(vision_config=dict(VISION, model_type="clip_vision_model"),
                                    text_config=dict(TEXT, model_type="llama"), video_token_id=VID, **common, **kw)
    return LlavaOnevisionConfig(vision_config=dict(VISION, model_type="siglip_vision_model"),
                                text_config=dict(TEXT, model_type="qwen2"), video_token_id=VID,
                                vision_aspect_ratio="anyres_max_4", **common, **kw)


CLASSES = {"next": LlavaNextForConditionalGeneration, "next_video": LlavaNextVideoForConditionalGeneration,
           "onevision": LlavaOnevisionForConditionalGeneration}


def _build(family, **kw):
    torch.manual_seed(0)
    m = CLASSES[family](_config(family, **kw)).eval()
    m.generation_config.pad_token_id = PAD
    m.generation_config.eos_token_id = None
    m.generation_config.suppress_tokens = [IMG, VID]  # a generated image/video token would need pixels of its own
    return m


@pytest.fixture(scope="module", params=list(CLASSES))
def model(request):
    m = _build(request.param)
    m.family = request.param
    yield m


@pytest.fixture(autouse=True)
def _unpatched_after(request):
    yield
    if "model" in request.fixturenames:
        m = request.getfixturevalue("model")
        if is_patched(m):
            unpatch_model(m)


# --------------------------------------------------------------------------------------------------
# the token grids, from transformers' own code


def packed_views(model, size):
    """(tiles incl. the base view, rows, tokens per row) of an image of ``size`` as transformers packs it:
    features numbered 1, 2, … and a newline feature of -1 go through the model's ``pack_image_features``."""
    cfg = model.config
    tiles = image_size_to_num_patches(size, cfg.image_grid_pinpoints, cfg.vision_config.image_size)
    features = (torch.arange(tiles * S * S, dtype=torch.float32) + 1).view(tiles, S * S, 1)
    extra = (dict(vision_aspect_ratio=cfg.vision_aspect_ratio) if model.family == "onevision"
             else dict(vision_feature_select_strategy="default"))
    packed, lengths = model.model.pack_image_features([features], torch.tensor([size]),
                                                      image_newline=torch.tensor([-1.0]), **extra)
    high = packed[0][S * S:, 0]
    newline = high == -1
    rows = int(newline.sum())
    width = high.numel() // rows
    assert torch.equal(packed[0][: S * S, 0], features[0, :, 0])  # the base view comes first, whole
    assert torch.equal(newline.view(rows, width)[:, -1], torch.ones(rows, dtype=torch.bool))  # one per row, last
    return tiles, rows, width


def processor_counts(model, size):
    """(unpadded patches, newline tokens) of the same image by the model's processor."""
    cfg = model.config
    best = select_best_resolution(list(size), cfg.image_grid_pinpoints)
    scale = (best[0] // cfg.vision_config.image_size, best[1] // cfg.vision_config.image_size)
    if model.family == "onevision":
        proc = types.SimpleNamespace(vision_aspect_ratio=cfg.vision_aspect_ratio)
        return LlavaOnevisionProcessor._get_unpadded_features(proc, *size, S, S, *scale)
    return LlavaNextProcessor._get_unpadded_features(None, *size, S, S, *scale)


def pooled_side(model):
    """A video frame's grid side after the model's own pooling of an S x S frame."""
    frame = torch.zeros(1, S * S, TEXT["hidden_size"] if model.family == "onevision" else VISION["hidden_size"])
    pooled = model.model.apply_pooling(frame) if model.family == "onevision" else model.model.vision_resampler(frame)
    side = round(pooled.shape[1] ** 0.5)
    assert side * side == pooled.shape[1]
    return side


# samples: ("T", n) text, ("I", (h, w)) an image of that size, ("V",) a video of FRAMES frames
SAMPLES = [[("T", 3), ("I", (5, 16)), ("T", 2)], [("T", 2), ("I", (20, 9)), ("T", 4)]]
VIDEO_SAMPLES = [[("T", 2), ("I", (7, 24)), ("T", 2), ("V",), ("T", 3)], [("T", 3), ("V",), ("T", 1)]]
# OneVision: a sample of two images (base views, given with `several`), one whose view is shrunk
SEVERAL = [[("T", 2), ("I", (16, 24)), ("T", 1), ("I", (8, 8)), ("T", 2)], [("T", 1), ("I", (30, 31)), ("T", 2)]]


def _samples(model):
    return SAMPLES + (VIDEO_SAMPLES if model.family != "next" else [])


def make_batch(model, samples, pad="left", seed=0, several=()):
    """Inputs for a padded batch and, per sample, its ropekit Layout from transformers' grids.

    ``several``: OneVision samples given two base-view images each (``batch_num_images`` 2, not tiled)."""
    g = torch.Generator().manual_seed(seed)
    rows, layouts, sizes, tiles, counts, videos = [], [], [], [], [], 0
    for b, segs in enumerate(samples):
        ids, lay, n_img = [], [], 0
        for s in segs:
            if s[0] == "T":
                ids += torch.randint(1, 60, (s[1],), generator=g).tolist()
                lay.append(Text(s[1]))
            elif s[0] == "I" and b in several:  # a base view, then its newline as text
                ids += [IMG] * (S * S + 1)
                lay += [Image(S, S), Text(1)]
                sizes.append(list(s[1]))
                tiles.append(1)
                n_img += 1
            elif s[0] == "I":
                n, r, w = packed_views(model, list(s[1]))
                unpadded, newlines = processor_counts(model, s[1])
                assert (newlines, unpadded) == (r, r * (w - 1))  # the processor counts the same grid
                ids += [IMG] * (S * S + r * w)
                lay += [Image(S, S), Image(r, w)]
                sizes.append(list(s[1]))
                tiles.append(n)
                n_img += 1
            else:
                p = pooled_side(model)
                newline = int(model.family == "onevision")
                ids += [VID] * (FRAMES * p * p + newline)
                lay += [Video(FRAMES, p, p)] + [Text(1)] * newline
                videos += 1
        rows.append(ids)
        layouts.append(Layout(lay))
        counts.append(n_img)
    input_ids, mask = pad_rows(rows, pad)
    inputs = dict(input_ids=input_ids, attention_mask=mask, image_sizes=torch.tensor(sizes),
                  pixel_values=torch.randn(len(sizes), max(tiles), 3, 2 * S, 2 * S, generator=g))
    if model.family == "onevision":
        inputs["batch_num_images"] = torch.tensor(counts)
    if videos:
        inputs["pixel_values_videos"] = torch.randn(videos, FRAMES, 3, 2 * S, 2 * S, generator=g)
    return inputs, layouts


# --------------------------------------------------------------------------------------------------
# positions and stock equality


@pytest.mark.parametrize("size", SIZES)
def test_tiled_image_grids_are_transformers_packing(model, size):
    inputs, layouts = make_batch(model, [[("T", 2), ("I", size), ("T", 3)]])
    patch_model(model, "mrope")
    with torch.no_grad():
        model(**inputs)  # the stock model also checks the token count against its features
    assert torch.equal(last_positions(model)[0][:, 0], ropekit.positions(layouts[0], "mrope").T)


@pytest.mark.parametrize("model", ["onevision"], indirect=True)
def test_onevision_shrinks_large_views_and_keeps_several_images_untiled(model):
    _, rows, width = packed_views(model, [16, 24])  # 8 x 12 patches, more than anyres_max_4 allows
    assert (rows, width) == (6, 10)  # shrunk to 6 x 9, plus the newline column
    inputs, layouts = make_batch(model, SEVERAL, several=(0,))
    patch_model(model, "circle")
    with torch.no_grad():
        model(**inputs)
    expected = reference_positions(inputs, layouts, "circle")
    valid = inputs["attention_mask"].bool()
    assert torch.equal(last_positions(model)[2][:, valid], expected[:, valid])


@pytest.mark.parametrize("design", DESIGNS)
def test_every_layer_gets_the_design_positions(model, design):
    inputs, layouts = make_batch(model, _samples(model))
    assert_design_positions(model, inputs, layouts, design)


def test_vanilla_with_images_and_videos_is_the_stock_model(model):
    assert_vanilla_is_stock(model, make_batch(model, _samples(model))[0])


@pytest.mark.parametrize("design", ["circle", "videorope"])  # every design: tests/test_hf_llava.py
def test_text_only_is_the_stock_model(model, design):
    assert_text_only_is_stock(model, design)


def test_vision_token_ids_without_pixels_are_text_as_in_the_stock_model(model):
    ids = torch.tensor([[5, 6] + [IMG] * 5 + [7] + [VID] * 3 + [8]])
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        patch_model(model, "circle")
        out = model(input_ids=ids).logits
    assert torch.equal(out, ref)


# --------------------------------------------------------------------------------------------------
# cached generation (generate encodes the images first and drops their sizes) = one teacher-forced pass


@pytest.mark.parametrize("design", ["circle", "videorope", "mrope"])
def test_cached_generation_matches_teacher_forcing(model, design):
    inputs, _ = make_batch(model, _samples(model))
    patch_model(model, design)
    _generate_and_replay(model, inputs)


def test_age_generation(model):
    samples, several = _samples(model), ()
    if model.family == "onevision":  # with a sample of two base-view images
        samples, several = samples + SEVERAL[:1], (len(samples),)
    inputs, _ = make_batch(model, samples, several=several)
    patch_model(model, ("vrope", "mrope"), age="alternate")
    assert layer_designs(model) == ["vrope", "mrope", "vrope"]
    _generate_and_replay(model, inputs)


# --------------------------------------------------------------------------------------------------
# training and saving


def _labels(inputs):
    ids = inputs["input_ids"]
    return ids.masked_fill(inputs["attention_mask"] == 0, -100).masked_fill((ids == IMG) | (ids == VID), -100)


def test_training_step_and_gradient_checkpointing(model):
    inputs, _ = make_batch(model, _samples(model), pad="right")
    patch_model(model, ("circle", "mrope"), age="alternate")
    params = [l.self_attn.k_proj.weight for l in model.model.language_model.layers]
    params.append(model.model.multi_modal_projector.linear_1.weight)
    loss, _, plain, ckpt = checkpointed_gradients(model, inputs, _labels(inputs), lambda: enumerate(params))
    assert len(plain) == len(params)
    assert torch.isfinite(loss) and all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in plain.values())
    for i in plain:
        torch.testing.assert_close(ckpt[i], plain[i], rtol=1e-6, atol=1e-7)


def test_save_reload_restores_the_patch(model, tmp_path):
    inputs, _ = make_batch(model, _samples(model))
    with torch.no_grad():
        stock = model(**inputs).logits
        patch_model(model, "circle", age="alternate", alpha=0.5)
        patched = model(**inputs).logits
    assert not torch.allclose(patched, stock)
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())[CONFIG_KEY]["options"] == {"circle": {"alpha": 0.5}}
    plain = ropekit.hf.load_stock(str(tmp_path), CLASSES[model.family]).eval()  # the stock model only on purpose
    loaded = ropekit.hf.from_pretrained(tmp_path, CLASSES[model.family]).eval()  # patched from the record
    with torch.no_grad():
        assert torch.equal(plain(**inputs).logits, stock)
        assert layer_designs(loaded) == ["circle", "mrope", "circle"]
        assert torch.equal(loaded(**inputs).logits, patched)


# --------------------------------------------------------------------------------------------------
# clear errors


def test_errors(model):
    inputs, _ = make_batch(model, SAMPLES)
    patch_model(model, "circle")
    with pytest.raises(ValueError, match="`pixel_values` without `image_sizes`.*pass the image sizes"):
        model(**{k: v for k, v in inputs.items() if k != "image_sizes"})
    ids = inputs["input_ids"].clone()
    ids.view(-1)[int((ids.view(-1) == IMG).nonzero()[0])] = 5  # one image token fewer
    with pytest.raises(ValueError, match="holds .* image tokens but its 2 image\\(s\\) fill"):
        model(**dict(inputs, input_ids=ids))
    encoded = model.model.get_image_features(inputs["pixel_values"], inputs["image_sizes"], return_dict=True)
    encoded.pooler_output = [f[:-1] for f in encoded.pooler_output]  # the last row lost its newline feature
    with pytest.raises(ValueError, match="not laid out as the model packs them.*pass pixel_values and image_sizes"):
        model(input_ids=inputs["input_ids"], mm_encoder_outputs={"image": encoded})
    if model.family == "onevision":
        with pytest.raises(ValueError, match="`batch_num_images` \\[3\\] counts 3 images.*holds 2"):
            model(**dict(inputs, batch_num_images=torch.tensor([3])))
    else:
        with pytest.raises(ValueError, match="'full' keeps the CLIP CLS feature.*use 'default'"):
            patch_model(_build(model.family, vision_feature_select_strategy="full"), "mrope")
