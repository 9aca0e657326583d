"""ropekit designs inside tiny random LLaVA models (CLIP/SigLIP tower + Llama/Qwen2 text), and the model
config's rope scaling honoured by the patch.

References: the stock transformers model (vanilla and text-only must equal it; each scaling type must give
stock logits for the stock-equivalent design), each design's own ``ropekit.positions`` on a hand-built
layout whose image grids are the vision config's (image_size / patch_size per side), one teacher-forced
forward over the whole sequence (cached generation must reproduce its positions and logits), and AGE.
"""
import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import torch
from transformers import LlavaConfig, LlavaForConditionalGeneration, Qwen2VLConfig, Qwen2VLForConditionalGeneration

import ropekit
from ropekit import Image, Layout, Text
from ropekit.hf import last_positions, layer_designs, patch_model, unpatch_model
from ropekit.hf.adapters.llava import scaled_sections

from hf_compat import checkpointed_gradients, ready_to_generate, restore

IMG, PAD = 70, 0
SIDE = 2  # image_size 4 / patch_size 2: 2x2 image tokens
DESIGNS = [d for d in ropekit.designs() if ropekit.get_design(d).allocation != "mhrope"]
TEXT_1D_DESIGNS = [d for d in DESIGNS if ropekit.get_design(d).allocation != "hope"]


def _config(tower="clip_vision_model", strategy="default", text="llama", layers=3, rope=None, **text_kw):
    vision = dict(model_type=tower, hidden_size=16, intermediate_size=16, num_hidden_layers=2,
                  num_attention_heads=2, image_size=2 * SIDE, patch_size=2)
    txt = dict(model_type=text, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
               num_attention_heads=2, num_key_value_heads=1, vocab_size=80, **text_kw)
    if rope is not None:
        txt["rope_parameters"] = rope
    return LlavaConfig(vision_config=vision, text_config=txt, image_token_id=IMG, vision_feature_layer=-1,
                       vision_feature_select_strategy=strategy)


def _build(cfg):
    torch.manual_seed(0)
    return ready_to_generate(LlavaForConditionalGeneration(cfg), PAD, [IMG])


MODELS = {
    "clip": dict(),  # CLS dropped: an image is a 2x2 grid of tokens
    "clip_full_qwen2": dict(strategy="full", text="qwen2"),  # CLS kept: a text token before the grid
    "siglip": dict(tower="siglip_vision_model", strategy="full"),  # no CLS at all
}


@pytest.fixture(scope="module", params=list(MODELS))
def llava(request):
    m = _build(_config(**MODELS[request.param]))
    yield m
    restore(m)


@pytest.fixture(scope="module")
def clip():
    return _build(_config())


@pytest.fixture(autouse=True)
def _unpatched_after(request):
    yield
    for name in ("llava", "clip"):
        if name in request.fixturenames:
            restore(request.getfixturevalue(name))


SAMPLES = [[("T", 3), ("I",), ("T", 2), ("I",), ("T", 1)], [("T", 2), ("I",), ("T", 4)]]


def make_batch(model, samples=SAMPLES, pad="left", seed=0):
    """Inputs for a padded batch and, per sample, its ropekit Layout (a CLS feature is one text token)."""
    cls = int(model.config.vision_feature_select_strategy == "full"
              and model.config.vision_config.model_type.startswith("clip"))
    g = torch.Generator().manual_seed(seed)
    rows, layouts, images = [], [], 0
    for segs in samples:
        ids, lay = [], []
        for s in segs:
            if s[0] == "T":
                ids += torch.randint(1, 60, (s[1],), generator=g).tolist()
                lay.append(Text(s[1]))
            else:
                ids += [IMG] * (SIDE * SIDE + cls)
                lay += [Text(1)] * cls + [Image(SIDE, SIDE)]
                images += 1
        rows.append(ids)
        layouts.append(Layout(lay))
    input_ids, mask = pad_rows(rows, pad)
    pixels = torch.randn(images, 3, 2 * SIDE, 2 * SIDE, generator=g)
    return dict(input_ids=input_ids, attention_mask=mask, pixel_values=pixels), layouts


def pad_rows(rows, pad="left"):
    """(input_ids, attention_mask) of token id lists padded with PAD on the ``pad`` side."""
    L = max(map(len, rows))
    input_ids = torch.full((len(rows), L), PAD)
    mask = torch.zeros(len(rows), L, dtype=torch.long)
    for b, ids in enumerate(rows):
        sl = slice(L - len(ids), L) if pad == "left" else slice(0, len(ids))
        input_ids[b, sl] = torch.tensor(ids)
        mask[b, sl] = 1
    return input_ids, mask


def reference_positions(inputs, layouts, design, **options):
    mask = inputs["attention_mask"].bool()
    per = [ropekit.positions(lay, design, **options) for lay in layouts]
    out = torch.zeros(per[0].shape[1], *mask.shape)
    for b, p in enumerate(per):
        out[:, b, mask[b]] = p.T
    return out


def _stock_positions(mask):
    return (mask.cumsum(-1) - 1).clamp(min=0)  # what stock generate gives a padded batch


# --------------------------------------------------------------------------------------------------
# positions and stock equality


def assert_design_positions(model, inputs, layouts, design):
    """Every decoder layer of ``model`` patched with ``design`` gets the design's positions of ``layouts``."""
    patch_model(model, design)
    with torch.no_grad():
        model(**inputs)
    expected = reference_positions(inputs, layouts, design)
    valid = inputs["attention_mask"].bool()
    got = last_positions(model)
    assert sorted(got) == list(range(len(model.model.language_model.layers)))
    for p in got.values():
        assert torch.equal(p[:, valid], expected[:, valid])


def assert_vanilla_is_stock(model, inputs):
    """The `vanilla` patch gives the stock logits and `generate` output (stock positions as generate counts)."""
    keep = inputs["attention_mask"].bool()
    with torch.no_grad():
        ref = model(**inputs, position_ids=_stock_positions(inputs["attention_mask"])).logits
        gref = model.generate(**inputs, max_new_tokens=3, do_sample=False)
        patch_model(model, "vanilla")
        out = model(**inputs).logits
        gout = model.generate(**inputs, max_new_tokens=3, do_sample=False)
    assert torch.equal(out[keep], ref[keep])
    assert torch.equal(gout, gref)


def assert_text_only_is_stock(model, design):
    ids = torch.randint(1, 60, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        gref = model.generate(input_ids=ids, max_new_tokens=3, do_sample=False)
        patch_model(model, design)
        out = model(input_ids=ids).logits
        gout = model.generate(input_ids=ids, max_new_tokens=3, do_sample=False)
    assert torch.equal(out, ref) and torch.equal(gout, gref)


@pytest.mark.parametrize("design", DESIGNS)
def test_every_layer_gets_the_design_positions(llava, design):
    inputs, layouts = make_batch(llava)
    assert_design_positions(llava, inputs, layouts, design)


def test_vanilla_with_images_is_the_stock_model(llava):
    assert_vanilla_is_stock(llava, make_batch(llava)[0])


@pytest.mark.parametrize("design", TEXT_1D_DESIGNS)
def test_text_only_is_the_stock_model(clip, design):
    assert_text_only_is_stock(clip, design)


def test_image_tokens_without_pixels_are_text_as_in_the_stock_model(clip):
    ids = torch.tensor([[5, 6] + [IMG] * 4 + [7]])
    with torch.no_grad():
        ref = clip(input_ids=ids).logits
        patch_model(clip, "circle")
        out = clip(input_ids=ids).logits
    assert torch.equal(out, ref)


# --------------------------------------------------------------------------------------------------
# cached generation = one teacher-forced pass


def _generate_and_replay(model, inputs, new=3):
    steps = []
    hook = model.register_forward_hook(lambda *_: steps.append(last_positions(model)))
    try:
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=new, do_sample=False, output_logits=True,
                                 return_dict_in_generate=True)
    finally:
        hook.remove()
    assert len(steps) == new
    cached = {i: torch.cat([s[i] for s in steps], dim=-1) for i in steps[0]}
    seq = out.sequences
    n = seq.shape[1] - inputs["input_ids"].shape[1]
    mask = torch.cat([inputs["attention_mask"], torch.ones(seq.shape[0], n, dtype=torch.long)], 1)
    with torch.no_grad():
        logits = model(**dict(inputs, input_ids=seq, attention_mask=mask)).logits
    forced = last_positions(model)
    Lp = inputs["input_ids"].shape[1]
    for i in forced:
        assert torch.equal(cached[i], forced[i][..., :-1]), f"layer {i}: cached positions differ from a full pass"
    for k, step_logits in enumerate(out.logits):
        torch.testing.assert_close(step_logits, logits[:, Lp - 1 + k], rtol=1e-5, atol=1e-5)
    return cached


@pytest.mark.parametrize("design", DESIGNS)
def test_cached_generation_matches_teacher_forcing(clip, design):
    inputs, _ = make_batch(clip)
    patch_model(clip, design)
    _generate_and_replay(clip, inputs)


def test_cached_generation_other_towers(llava):
    inputs, _ = make_batch(llava)
    patch_model(llava, "circle")
    _generate_and_replay(llava, inputs)


@pytest.mark.parametrize("pair", [("vrope", "mrope"), ("circle", "mrope"), ("compact", "vanilla")])
def test_age_generation_keeps_one_offset_per_geometry(clip, pair):
    inputs, _ = make_batch(clip)
    patch_model(clip, pair, age="alternate")
    assert layer_designs(clip) == [pair[0], pair[1], pair[0]]
    cached = _generate_and_replay(clip, inputs)
    assert not torch.equal(cached[0][0, :, -1], cached[1][0, :, -1])


# --------------------------------------------------------------------------------------------------
# training


@pytest.mark.parametrize("design", ["circle", "rope2d"])
def test_training_step(llava, design):
    inputs, _ = make_batch(llava, pad="right")
    labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100).masked_fill(
        inputs["input_ids"] == IMG, -100)
    patch_model(llava, design)
    llava.zero_grad()
    out = llava(**inputs, labels=labels)
    out.loss.backward()
    grads = [p.grad for p in llava.model.language_model.layers[0].self_attn.parameters()]
    grads.append(llava.model.multi_modal_projector.linear_1.weight.grad)
    assert torch.isfinite(out.loss) and all(g is not None and torch.isfinite(g).all() for g in grads)
    llava.zero_grad()


def test_gradient_checkpointing_gives_the_same_gradients(clip):
    inputs, _ = make_batch(clip)
    labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
    patch_model(clip, ("vrope", "mrope"), age="alternate")
    params = [l.self_attn.k_proj.weight for l in clip.model.language_model.layers]
    _, _, plain, ckpt = checkpointed_gradients(clip, inputs, labels, lambda: enumerate(params))
    assert len(plain) == len(params)
    for i in plain:
        torch.testing.assert_close(ckpt[i], plain[i], rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------------------------------
# allocation of the 1-D model's head


def _pairs_per_axis(model, design):
    W = model.model.__dict__["_ropekit_patch"].geometries[design].W
    return (W != 0).sum(dim=1).tolist()


def test_default_and_given_sections(clip):
    half = clip.model.language_model.layers[0].self_attn.head_dim // 2
    assert scaled_sections(64) == [16, 24, 24]  # Qwen2-VL's own split at its head size
    assert sum(scaled_sections(half)) == half
    patch_model(clip, "mrope")
    assert _pairs_per_axis(clip, "mrope") == scaled_sections(half)
    patch_model(clip, "mrope", sections=[4, 2, 2])
    assert _pairs_per_axis(clip, "mrope") == [4, 2, 2]


# --------------------------------------------------------------------------------------------------
# clear errors


def test_errors(clip):
    with pytest.raises(ValueError, match="SigLIP.*'default'.*use strategy 'full'"):
        patch_model(_build(_config(tower="siglip_vision_model", strategy="default", layers=1)), "mrope")
    with pytest.raises(ValueError, match="`sections`.*sum to 7.*make them sum to 8"):
        patch_model(clip, "mrope", sections=[3, 2, 2])
    with pytest.raises(TypeError, match="`sections` must be a list"):
        patch_model(clip, "mrope", sections="2,3,3")
    patch_model(clip, "circle")
    inputs, _ = make_batch(clip, [[("T", 2), ("I",), ("T", 1)]])
    inputs["input_ids"] = torch.cat([inputs["input_ids"][:, :3], inputs["input_ids"][:, 4:]], 1)  # 3 image tokens
    inputs["attention_mask"] = inputs["attention_mask"][:, 1:]
    with pytest.raises(ValueError, match="3 image tokens are not a whole number of images of 4 tokens"):
        clip(**inputs)


def test_generate_through_an_unpatched_wrapper_of_a_patched_bare_model_is_refused(clip):
    """Patching only ``model.model`` left ``model.generate`` stock: it passed plain text position ids, which
    the patched bare model honoured, so the design was silently not applied (the stock logits came back)."""
    inputs, layouts = make_batch(clip)
    kw = dict(max_new_tokens=2, do_sample=False)
    with torch.no_grad():
        stock = clip.generate(**inputs, **kw)
        patch_model(clip.model, "circle")
        try:
            with pytest.raises(ValueError, match=r"patch_model\(model\), not patch_model\(model.model\)"):
                clip.generate(**inputs, **kw)
            text = _stock_positions(inputs["attention_mask"])
            with pytest.raises(ValueError, match="1-D position_ids .* together with images"):
                clip.model(**inputs, position_ids=text)
            clip.model(**inputs)  # no position ids: the design places the tokens
            expected = reference_positions(inputs, layouts, "circle")
            keep = inputs["attention_mask"].bool()
            for p in last_positions(clip).values():
                assert torch.equal(p[:, keep], expected[:, keep])
            given = ropekit.hf.position_ids(clip.model, **inputs) + 5
            clip.model(**inputs, position_ids=given)  # a position tensor is honoured as given
            for p in last_positions(clip).values():
                assert torch.equal(p[:, keep], given[1:][:, keep])
            patch_model(clip.model, "vanilla")  # the stock positions are the design's: nothing to refuse
            assert torch.equal(clip.generate(**inputs, **kw), stock)
        finally:
            unpatch_model(clip.model)


# --------------------------------------------------------------------------------------------------
# the model config's rope scaling


HALF = 8  # frequency pairs per head (head_dim 16)
SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
    "longrope": {"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": 8,
                 "short_factor": [1.0 + 0.1 * i for i in range(HALF)],
                 "long_factor": [1.5 + 0.3 * i for i in range(HALF)]},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0},
}


@pytest.mark.parametrize("kind", list(SCALINGS))
def test_llava_rope_scaling_gives_the_stock_logits(kind):
    rope = dict(SCALINGS[kind], rope_theta=10000.0)
    # a short max_position_embeddings, so the prompt and its continuation pass it (dynamic NTK, LongRoPE)
    model = _build(_config(layers=2, rope=rope, max_position_embeddings=12))
    inputs, _ = make_batch(model, [[("T", 3), ("I",), ("T", 6), ("I",), ("T", 2)]])
    with torch.no_grad():
        ref = model(**inputs).logits
        gref = model.generate(**inputs, max_new_tokens=4, do_sample=False, output_logits=True,
                              return_dict_in_generate=True)
        short = model(input_ids=inputs["input_ids"][:, :5]).logits  # dynamic NTK goes back below the original
        patch_model(model, "vanilla")
        out = model(**inputs).logits
        gout = model.generate(**inputs, max_new_tokens=4, do_sample=False, output_logits=True,
                              return_dict_in_generate=True)
        short_out = model(input_ids=inputs["input_ids"][:, :5]).logits
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(short_out, short, rtol=1e-6, atol=1e-6)
    assert torch.equal(gout.sequences, gref.sequences)
    for a, b in zip(gout.logits, gref.logits):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", ["linear", "yarn", "dynamic"])
def test_qwen2_vl_rope_scaling_gives_the_stock_logits(kind):
    rope = dict(SCALINGS[kind], rope_theta=1e6, mrope_section=[2, 3, 3])
    cfg = Qwen2VLConfig(
        text_config=dict(hidden_size=32, intermediate_size=48, num_attention_heads=2, num_key_value_heads=1,
                         vocab_size=80, num_hidden_layers=2, rope_parameters=rope, max_position_embeddings=12),
        vision_config=dict(depth=1, embed_dim=16, hidden_size=32, num_heads=2, mlp_ratio=1, spatial_merge_size=2,
                           patch_size=2, temporal_patch_size=2),
        image_token_id=IMG, video_token_id=71,
    )
    torch.manual_seed(0)
    model = Qwen2VLForConditionalGeneration(cfg).eval()
    ids = torch.tensor([[5, 6, 7] + [IMG] * 4 + list(range(10, 22))])
    inputs = dict(input_ids=ids, mm_token_type_ids=(ids == IMG).long(), attention_mask=torch.ones_like(ids),
                  image_grid_thw=torch.tensor([[1, 4, 4]]), pixel_values=torch.randn(16, 24))
    with torch.no_grad():
        ref = model(**inputs).logits
        patch_model(model, "mrope", continuation="spatial")  # transformers 5.x M-RoPE
        out = model(**inputs).logits
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------------------------------
# LLaVA-OneVision: base-grid images (several per sample), each followed by a newline token
# (tiled images and videos: tests/test_hf_llava_anyres.py)


@pytest.fixture(scope="module")
def onevision():
    from transformers import LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration

    cfg = LlavaOnevisionConfig(
        vision_config=dict(model_type="siglip_vision_model", hidden_size=16, intermediate_size=16,
                           num_hidden_layers=2, num_attention_heads=2, image_size=2 * SIDE, patch_size=2),
        text_config=dict(model_type="qwen2", hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, vocab_size=80),
        image_token_id=IMG, video_token_id=71, vision_feature_layer=-1,
        image_grid_pinpoints=[[2 * SIDE, 2 * SIDE], [2 * SIDE, 4 * SIDE]],
    )
    torch.manual_seed(0)
    m = ready_to_generate(LlavaOnevisionForConditionalGeneration(cfg), PAD, [IMG, 71])
    yield m
    restore(m)


def _onevision_batch():
    per = SIDE * SIDE + 1  # the grid, then a newline token
    ids = torch.tensor([[5, 6] + [IMG] * per + [7] + [IMG] * per + [8, 9]])
    layout = Layout([Text(2), Image(SIDE, SIDE), Text(2), Image(SIDE, SIDE), Text(3)])
    g = torch.Generator().manual_seed(0)
    inputs = dict(input_ids=ids, attention_mask=torch.ones_like(ids),
                  pixel_values=torch.randn(2, 1, 3, 2 * SIDE, 2 * SIDE, generator=g),
                  image_sizes=torch.tensor([[2 * SIDE, 2 * SIDE]] * 2), batch_num_images=torch.tensor([2]))
    return inputs, layout


def test_onevision_base_grids(onevision):
    inputs, layout = _onevision_batch()
    try:
        with torch.no_grad():
            ref = onevision(**inputs).logits
            gref = onevision.generate(**inputs, max_new_tokens=3, do_sample=False)
            patch_model(onevision, "vanilla")
            assert torch.equal(onevision(**inputs).logits, ref)
            assert torch.equal(onevision.generate(**inputs, max_new_tokens=3, do_sample=False), gref)
            patch_model(onevision, "circle", age="alternate")
            onevision(**inputs)
        got = last_positions(onevision)
        assert torch.equal(got[0][:, 0], ropekit.positions(layout, "circle").T)
        assert torch.equal(got[1][:, 0], ropekit.positions(layout, "mrope").T)
        _generate_and_replay(onevision, inputs)
    finally:
        unpatch_model(onevision)
