"""ropekit designs inside tiny random Qwen2-VL / Qwen2.5-VL / Qwen3-VL models.

References: the stock transformers models (M-RoPE and text-only must match them), each design's own
``positions`` on a hand-built layout (routed to every layer), one teacher-forced forward over the whole
sequence (cached generation must reproduce its positions and logits), and AGE invariants.
"""
import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import torch
from torch import nn
from transformers import (
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLModel,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
)

import ropekit
from ropekit import Image, Layout, Text, Video
from ropekit.hf.boundary import cache_keyword
from ropekit.hf import is_patched, last_positions, layer_designs, patch_model, unpatch_model
import ropekit.hf.hooks as hfhooks
import ropekit.hf.state as hfstate

from hf_compat import checkpointing_off, checkpointing_on

IMG, VID, PAD = 70, 71, 0
CACHE = cache_keyword(Qwen2VLForConditionalGeneration.forward)  # "cache" since transformers 5.24
SECTIONS = [2, 3, 3]  # head_dim 16
PATCH_DIM = 3 * 2 * 2 * 2  # channels · temporal patch · patch²
# designs whose own allocation is per head (MHRoPE) cannot drive the models' shared rotary tables
DESIGNS = [d for d in ropekit.designs() if ropekit.get_design(d).allocation != "mhrope"]
# HoPE gives time zero frequency for every token, text included (as its paper does), so its text-only
# model is not the stock one; every other design keeps text plain 1-D RoPE
TEXT_1D_DESIGNS = [d for d in DESIGNS if ropekit.get_design(d).allocation != "hope"]
TEXT = dict(
    hidden_size=32, intermediate_size=48, num_attention_heads=2, num_key_value_heads=1, vocab_size=80,
    rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": SECTIONS},
)


def _qwen2_cfg(layers):
    return Qwen2VLConfig(
        text_config=dict(TEXT, num_hidden_layers=layers),
        vision_config=dict(depth=1, embed_dim=16, hidden_size=32, num_heads=2, mlp_ratio=1, spatial_merge_size=2,
                           patch_size=2, temporal_patch_size=2),
        image_token_id=IMG, video_token_id=VID,
    )


def _seed_build(cls, cfg):
    torch.manual_seed(0)
    m = cls(cfg).eval()
    m.generation_config.pad_token_id = PAD
    m.generation_config.eos_token_id = None
    return m


@pytest.fixture(scope="module")
def qwen2():
    return _seed_build(Qwen2VLForConditionalGeneration, _qwen2_cfg(3))


@pytest.fixture(scope="module")
def qwen25():
    cfg = Qwen2_5_VLConfig(
        text_config=dict(TEXT, num_hidden_layers=4),
        vision_config=dict(depth=1, hidden_size=16, out_hidden_size=32, intermediate_size=16, num_heads=2,
                           spatial_merge_size=2, tokens_per_second=2, fullatt_block_indexes=[0], patch_size=2,
                           temporal_patch_size=2, window_size=8),
        image_token_id=IMG, video_token_id=VID,
    )
    return _seed_build(Qwen2_5_VLForConditionalGeneration, cfg)


@pytest.fixture(scope="module")
def qwen3():
    rope = dict(TEXT["rope_parameters"], mrope_interleaved=True)
    cfg = Qwen3VLConfig(
        text_config=dict(TEXT, num_hidden_layers=2, head_dim=16, rope_parameters=rope),
        vision_config=dict(depth=1, hidden_size=16, out_hidden_size=32, intermediate_size=16, num_heads=2,
                           spatial_merge_size=2, patch_size=2, temporal_patch_size=2, deepstack_visual_indexes=[0],
                           num_position_embeddings=16),
        image_token_id=IMG, video_token_id=VID,
    )
    return _seed_build(Qwen3VLForConditionalGeneration, cfg)


@pytest.fixture(autouse=True)
def _unpatched_after(request):
    """Every test starts and ends with stock models."""
    yield
    for name in ("qwen2", "qwen25", "qwen3"):
        if name in request.fixturenames:
            m = request.getfixturevalue(name)
            if is_patched(m):
                unpatch_model(m)


# samples as segments: ("T", n) text, ("I", h, w) image patch grid, ("V", t, h, w) video patch grid
SAMPLES = [
    [("T", 3), ("I", 4, 4), ("T", 2), ("V", 2, 4, 4), ("T", 1), ("I", 4, 8), ("T", 2)],
    [("T", 2), ("V", 2, 4, 4), ("T", 2), ("I", 4, 4), ("I", 8, 4), ("T", 3)],
]
# transformers needs text between vision blocks (ropekit splits adjacent ones by their grids)
STOCK_SAMPLES = [SAMPLES[0], [("T", 2), ("V", 2, 4, 4), ("T", 2), ("I", 4, 4), ("T", 1), ("I", 8, 4), ("T", 3)]]


def make_batch(samples=SAMPLES, pad="left", frames_apart=False, seconds=None, seed=0):
    """Model inputs for a padded batch and, per sample, its ropekit Layout (merge 2 → token grids).

    ``frames_apart`` puts one text token between video frames (Qwen3-VL's timestamps), each frame its
    own layout block. ``seconds``: Qwen2.5-VL second_per_grid_ts per video (interval = 2 · seconds).
    """
    g = torch.Generator().manual_seed(seed)
    rows, types, layouts, img, vid = [], [], [], [], []
    v = 0
    for segs in samples:
        ids, tt, lay = [], [], []
        for s in segs:
            if s[0] == "T":
                ids += torch.randint(1, 60, (s[1],), generator=g).tolist()
                tt += [0] * s[1]
                lay.append(Text(s[1]))
            elif s[0] == "I":
                n = s[1] * s[2] // 4
                ids += [IMG] * n
                tt += [1] * n
                img.append([1, s[1], s[2]])
                lay.append(Image(s[1] // 2, s[2] // 2))
            else:
                t, h, w = s[1:]
                vid.append([t, h, w])
                if frames_apart:
                    for f in range(t):
                        if f:
                            ids.append(int(torch.randint(1, 60, (1,), generator=g)))
                            tt.append(0)
                            lay.append(Text(1))
                        ids += [VID] * (h * w // 4)
                        tt += [2] * (h * w // 4)
                        lay.append(Video(1, h // 2, w // 2, 1.0))
                else:
                    ids += [VID] * (t * h * w // 4)
                    tt += [2] * (t * h * w // 4)
                    interval = 1.0 if seconds is None else 2 * seconds[v]
                    lay.append(Video(t, h // 2, w // 2, interval))
                v += 1
        rows.append(ids)
        types.append(tt)
        layouts.append(Layout(lay))
    L = max(map(len, rows))
    input_ids = torch.full((len(rows), L), PAD)
    mm = torch.zeros(len(rows), L, dtype=torch.long)
    mask = torch.zeros(len(rows), L, dtype=torch.long)
    for b, (ids, tt) in enumerate(zip(rows, types)):
        sl = slice(L - len(ids), L) if pad == "left" else slice(0, len(ids))
        input_ids[b, sl] = torch.tensor(ids)
        mm[b, sl] = torch.tensor(tt)
        mask[b, sl] = 1
    img_t = torch.tensor(img) if img else None
    vid_t = torch.tensor(vid) if vid else None
    inputs = dict(input_ids=input_ids, mm_token_type_ids=mm, attention_mask=mask)
    if img_t is not None:
        inputs.update(image_grid_thw=img_t, pixel_values=torch.randn(int(img_t.prod(1).sum()), PATCH_DIM, generator=g))
    if vid_t is not None:
        inputs.update(video_grid_thw=vid_t,
                      pixel_values_videos=torch.randn(int(vid_t.prod(1).sum()), PATCH_DIM, generator=g))
    if seconds is not None:
        inputs["second_per_grid_ts"] = torch.tensor(seconds)
    return inputs, layouts


def reference_positions(inputs, layouts, design, **options):
    """Expected (A, B, L): each sample's ``ropekit.positions`` placed on its valid tokens."""
    mask = inputs["attention_mask"].bool()
    per = [ropekit.positions(lay, design, **options) for lay in layouts]
    out = torch.zeros(per[0].shape[1], *mask.shape)
    for b, p in enumerate(per):
        out[:, b, mask[b]] = p.T
    return out


def text_batch(pad=None, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 60, (2, 7), generator=g)
    mask = torch.ones_like(ids)
    if pad == "left":
        mask[0, :3] = 0
        ids[0, :3] = PAD
    return ids, mask


# --------------------------------------------------------------------------------------------------
# positions reach every layer


@pytest.mark.parametrize("pad", ["left", "right"])
@pytest.mark.parametrize("design", DESIGNS)
def test_every_layer_gets_the_design_positions(qwen2, design, pad):
    inputs, layouts = make_batch(pad=pad)
    patch_model(qwen2, design)
    with torch.no_grad():
        qwen2(**inputs)
    used = last_positions(qwen2)
    want = reference_positions(inputs, layouts, design)
    assert sorted(used) == [0, 1, 2]
    valid = inputs["attention_mask"].bool()
    for pos in used.values():
        assert pos.dtype == torch.float32
        torch.testing.assert_close(pos[:, valid], want[:, valid], rtol=0, atol=0)


# --------------------------------------------------------------------------------------------------
# M-RoPE reproduces the stock models; text-only input is the stock model for every design


def _stock_mrope(model, inputs, **kw):
    with torch.no_grad():
        ref = model(**inputs).logits
        pos, _ = model.model.get_rope_index(
            inputs["input_ids"], mm_token_type_ids=inputs["mm_token_type_ids"],
            image_grid_thw=inputs.get("image_grid_thw"), video_grid_thw=inputs.get("video_grid_thw"),
            attention_mask=inputs["attention_mask"], **kw,
        )
    return ref, pos


@pytest.mark.parametrize("which", ["qwen2", "qwen25", "qwen3"])
def test_mrope_matches_stock_transformers(request, which):
    model = request.getfixturevalue(which)
    kw = {}
    if which == "qwen3":
        inputs, _ = make_batch(STOCK_SAMPLES, frames_apart=True)
    elif which == "qwen25":
        inputs, _ = make_batch(STOCK_SAMPLES, seconds=[0.5, 1.5])
        kw["second_per_grid_ts"] = inputs["second_per_grid_ts"]
    else:
        inputs, _ = make_batch(STOCK_SAMPLES, pad="right")
    ref, pos = _stock_mrope(model, inputs, **kw)
    patch_model(model, "mrope", continuation="spatial")  # transformers 5.x continues text at s + max(h, w)
    with torch.no_grad():
        out = model(**inputs).logits
    valid = inputs["attention_mask"].bool()
    for p in last_positions(model).values():
        assert torch.equal(p[:, valid], pos[:, valid].float())
    assert torch.equal(out, ref)


@pytest.mark.parametrize("design", TEXT_1D_DESIGNS)
def test_text_only_is_the_stock_model(qwen2, design):
    ids, _ = text_batch()
    lids, lmask = text_batch(pad="left")
    with torch.no_grad():
        ref = qwen2(input_ids=ids).logits
        # stock model with the positions generate would give a left-padded batch
        lpos = (lmask.cumsum(-1) - 1).clamp(min=0)
        lref = qwen2(input_ids=lids, attention_mask=lmask, position_ids=lpos).logits
        gref = qwen2.generate(input_ids=lids, attention_mask=lmask, max_new_tokens=3, do_sample=False)
        patch_model(qwen2, design)
        out = qwen2(input_ids=ids).logits
        lout = qwen2(input_ids=lids, attention_mask=lmask).logits
        gout = qwen2.generate(input_ids=lids, attention_mask=lmask, max_new_tokens=3, do_sample=False)
    assert torch.equal(out, ref)
    keep = lmask.bool()
    assert torch.equal(lout[keep], lref[keep])
    assert torch.equal(gout, gref)


# --------------------------------------------------------------------------------------------------
# cached generation = one teacher-forced pass, per layer, per geometry


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
    full = dict(inputs, input_ids=seq)
    B, n = seq.shape[0], seq.shape[1] - inputs["input_ids"].shape[1]
    full["mm_token_type_ids"] = torch.cat([inputs["mm_token_type_ids"], torch.zeros(B, n, dtype=torch.long)], 1)
    full["attention_mask"] = torch.cat([inputs["attention_mask"], torch.ones(B, n, dtype=torch.long)], 1)
    with torch.no_grad():
        logits = model(**full).logits
    forced = last_positions(model)
    Lp = inputs["input_ids"].shape[1]
    for i in forced:
        # the last generated token is never fed back, so the cached run covers all but it
        assert torch.equal(cached[i], forced[i][..., :-1]), f"layer {i}: cached positions differ from a full pass"
    for k, step_logits in enumerate(out.logits):
        torch.testing.assert_close(step_logits, logits[:, Lp - 1 + k], rtol=1e-5, atol=1e-5)
    return cached


@pytest.mark.parametrize("design", DESIGNS)
def test_cached_generation_matches_teacher_forcing(qwen2, design):
    inputs, _ = make_batch(pad="left")
    patch_model(qwen2, design)
    _generate_and_replay(qwen2, inputs)


def test_longer_generation_with_age_matches_teacher_forcing(qwen2):
    """Several steps past the prompt under two geometries, each continuing its own text run."""
    inputs, _ = make_batch(pad="left")
    patch_model(qwen2, ("vrope", "compact"), age="alternate")
    _generate_and_replay(qwen2, inputs, new=5)


def _age_pairs():
    # tmrope is M-RoPE ("max" continuation) with time in float32 seconds: on Qwen2-VL's batches (no seconds, Δt = 1)
    # it places every token where mrope does, so the pair would have no second offset to keep apart
    others = [d for d in DESIGNS if d not in ("mrope", "tmrope")]
    return [(d, "mrope") for d in others]


@pytest.mark.parametrize("pair", _age_pairs())
def test_age_generation_keeps_one_offset_per_geometry(qwen2, pair):
    inputs, _ = make_batch(pad="left")
    patch_model(qwen2, pair, age="alternate")
    assert layer_designs(qwen2) == [pair[0], pair[1], pair[0]]
    cached = _generate_and_replay(qwen2, inputs)
    # the geometries continue from different offsets on this batch, so one shared offset would be caught
    assert not torch.equal(cached[0][0, :, -1], cached[1][0, :, -1])


@pytest.mark.parametrize("which", ["qwen25", "qwen3"])
def test_age_generation_other_models(request, which):
    model = request.getfixturevalue(which)
    if which == "qwen3":
        inputs, _ = make_batch(frames_apart=True)
    else:
        inputs, _ = make_batch(seconds=[0.5, 1.5])
    patch_model(model, ("vrope", "mrope"), age="lower")
    _generate_and_replay(model, inputs, new=2)


def test_generation_with_several_sequences_per_prompt(qwen2):
    inputs, _ = make_batch(pad="left")
    patch_model(qwen2, "vrope")
    with torch.no_grad():
        one = qwen2.generate(**inputs, max_new_tokens=3, do_sample=False)
        two = qwen2.generate(**inputs, max_new_tokens=3, do_sample=False, num_beams=2, num_return_sequences=2)
    assert two.shape[0] == 2 * one.shape[0]


# --------------------------------------------------------------------------------------------------
# AGE


def test_age_layer_maps_on_3_4_and_7_layers(qwen2, qwen25):
    seven = Qwen2VLModel(_qwen2_cfg(7))
    A, M = "vrope", "mrope"
    patch_model(qwen2, A, age="alternate")
    assert layer_designs(qwen2) == [A, M, A]
    patch_model(qwen2, A, age="lower")  # odd count: the lower half takes the middle layer
    assert layer_designs(qwen2) == [A, A, M]
    patch_model(qwen25, A, age="upper")
    assert layer_designs(qwen25) == [M, M, A, A]
    patch_model(qwen25, A, age="strategy_2")  # the released code's numbering: 2 = lower
    assert layer_designs(qwen25) == [A, A, M, M]
    patch_model(seven, A, age="alternate")
    assert layer_designs(seven) == [A, M, A, M, A, M, A]
    patch_model(seven, A, age=[True, False, False, True, True, False, True])
    assert layer_designs(seven) == [A, M, M, A, A, M, A]
    patch_model(seven, (A, "vanilla"), age="upper")
    assert layer_designs(seven) == ["vanilla"] * 4 + [A] * 3
    patch_model(seven, "mrope", age=["vanilla", "shared", "rope2d", "compact", "vrope", "mrope", "vanilla"])
    inputs, layouts = make_batch(pad="right")
    with torch.no_grad():
        seven(**{k: v for k, v in inputs.items()})
    valid = inputs["attention_mask"].bool()
    for i, name in enumerate(layer_designs(seven)):
        want = reference_positions(inputs, layouts, name)
        assert torch.equal(last_positions(seven)[i][:, valid], want[:, valid]), (i, name)


def test_age_all_and_none_reduce_to_single_designs(qwen2, monkeypatch):
    inputs, _ = make_batch(pad="left")
    with torch.no_grad():
        patch_model(qwen2, "vrope")
        single = qwen2(**inputs).logits
        patch_model(qwen2, "mrope")
        plain = qwen2(**inputs).logits
        patch_model(qwen2, "vrope", age="all")
        assert torch.equal(qwen2(**inputs).logits, single)
        patch_model(qwen2, "vrope", age="none")
        assert torch.equal(qwen2(**inputs).logits, plain)
        calls = []
        real = hfhooks.product  # the rotary's angles
        monkeypatch.setattr(hfhooks, "product", lambda *a: calls.append(1) or real(*a))
        patch_model(qwen2, "vrope", age="alternate")
        mixed = qwen2(**inputs).logits
    assert len(calls) == 2  # cos/sin once per geometry per forward, not per layer
    assert not torch.allclose(mixed, single) and not torch.allclose(mixed, plain)


# --------------------------------------------------------------------------------------------------
# instance-level patching


def test_two_models_one_patched_and_unpatch_restores(qwen2):
    other = _seed_build(Qwen2VLForConditionalGeneration, _qwen2_cfg(3))
    inputs, _ = make_batch(STOCK_SAMPLES, pad="left")
    with torch.no_grad():
        ref = other(**inputs).logits
        ref_gen = other.generate(**inputs, max_new_tokens=3, do_sample=False)
        assert torch.equal(qwen2(**inputs).logits, ref)  # same seed, same weights
        patch_model(qwen2, "vrope")
        patched = qwen2(**inputs).logits
        assert torch.equal(other(**inputs).logits, ref)
        assert torch.equal(other.generate(**inputs, max_new_tokens=3, do_sample=False), ref_gen)
        assert not torch.allclose(patched, ref)
        unpatch_model(qwen2)
        hooks = [qwen2, qwen2.model, qwen2.model.language_model.rotary_emb, *qwen2.model.language_model.layers]
        assert not any(k in m.__dict__ for m in hooks for k in ("forward", "compute_3d_position_ids",
                                                                 "_prepare_position_ids_for_generation"))
        assert torch.equal(qwen2(**inputs).logits, ref)
        assert torch.equal(qwen2.generate(**inputs, max_new_tokens=3, do_sample=False), ref_gen)


def test_bare_model_can_be_patched():
    torch.manual_seed(0)
    bare = Qwen2VLModel(_qwen2_cfg(2)).eval()
    inputs, layouts = make_batch(pad="right")
    patch_model(bare, "rope2d")
    with torch.no_grad():
        bare(**inputs)
    valid = inputs["attention_mask"].bool()
    assert torch.equal(last_positions(bare)[1][:, valid], reference_positions(inputs, layouts, "rope2d")[:, valid])
    unpatch_model(bare)
    assert not is_patched(bare)


# --------------------------------------------------------------------------------------------------
# training


@pytest.mark.parametrize("design", DESIGNS)
def test_training_step(qwen2, design):
    inputs, _ = make_batch(pad="right")
    labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
    patch_model(qwen2, design)
    qwen2.zero_grad()
    out = qwen2(**inputs, labels=labels)
    out.loss.backward()
    grads = [p.grad for p in qwen2.model.language_model.layers[0].self_attn.parameters()]
    assert torch.isfinite(out.loss) and all(g is not None and torch.isfinite(g).all() for g in grads)
    qwen2.zero_grad()


def test_float_positions_train_like_the_stock_model(qwen2):
    """Explicit float coordinates go through unchanged: the stock rotary takes float ids too."""
    ids, _ = text_batch()
    pos = (torch.arange(ids.shape[1]) * 0.75 + 0.25).expand(3, ids.shape[0], -1).clone()
    pos[1] += 0.5
    labels = ids.clone()

    def step():
        qwen2.zero_grad()
        out = qwen2(input_ids=ids, position_ids=pos, labels=labels)
        out.loss.backward()
        g = qwen2.model.language_model.layers[1].self_attn.q_proj.weight.grad.clone()
        qwen2.zero_grad()
        return out.loss.detach(), g

    ref_loss, ref_grad = step()
    patch_model(qwen2, "mrope")
    loss, grad = step()
    assert torch.equal(loss, ref_loss) and torch.equal(grad, ref_grad)
    assert torch.equal(last_positions(qwen2)[0], pos)


def test_gradient_checkpointing_gives_the_same_gradients(qwen2):
    inputs, _ = make_batch(pad="left")
    labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
    patch_model(qwen2, ("vrope", "mrope"), age="alternate")

    def grads():
        qwen2.zero_grad()
        qwen2(**inputs, labels=labels).loss.backward()
        g = [l.self_attn.k_proj.weight.grad.clone() for l in qwen2.model.language_model.layers]
        qwen2.zero_grad()
        return g

    qwen2.train()
    try:
        plain = grads()
        checkpointing_on(qwen2, use_reentrant=False)
        ckpt = grads()
    finally:
        checkpointing_off(qwen2)
        qwen2.eval()
    for a, b in zip(plain, ckpt):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------------------------------
# clear errors


def test_errors(qwen2):
    with pytest.raises(ValueError, match="unsupported model type.*qwen2_vl"):
        patch_model(nn.Linear(2, 2), "mrope")
    with pytest.raises(TypeError, match="`design` must be a design name.*NoneType"):
        patch_model(qwen2, None)
    with pytest.raises(TypeError, match="`age` must be an AGE schedule"):
        patch_model(qwen2, "vrope", age=3)
    with pytest.raises(TypeError, match="`options` maps a design name"):
        patch_model(qwen2, "vrope", options=3)
    with pytest.raises(ValueError, match="unknown design 'spiral'"):
        patch_model(qwen2, "spiral")
    with pytest.raises(TypeError, match="unknown option.*'radius'"):
        patch_model(qwen2, "mrope", radius=3)
    with pytest.raises(ValueError, match="2 entries but the model has 3 decoder layers"):
        patch_model(qwen2, "vrope", age=[True, False])
    with pytest.raises(ValueError, match="4 entries but the model has 3 decoder layers"):
        patch_model(qwen2, "vrope", age=[True, False, True, True])
    with pytest.raises(ValueError, match="unknown AGE schedule"):
        patch_model(qwen2, "vrope", age="sometimes")
    with pytest.raises(ValueError, match="does not fit.*allocation '1d'"):
        patch_model(qwen2, "mrope", allocation="1d")
    with pytest.raises(ValueError, match="rope_parameters cannot be applied.*factor"):  # scaling types are honoured,
        cfg = _qwen2_cfg(1)                                                          # malformed ones refused
        cfg.text_config.rope_parameters = {"rope_type": "linear", "factor": -2.0, "rope_theta": 1e6,
                                           "mrope_section": SECTIONS}
        patch_model(Qwen2VLModel(cfg), "mrope")
    with pytest.raises(ValueError, match="not patched"):
        unpatch_model(qwen2)
    inputs, _ = make_batch(pad="right")
    patch_model(qwen2, "vrope")
    missing = {k: v for k, v in inputs.items() if k not in ("video_grid_thw", "pixel_values_videos")}
    with pytest.raises(ValueError, match="design 'vrope'.*video tokens but `video_grid_thw` is missing"):
        qwen2(**missing)
    ids, _ = text_batch()
    uneven = torch.stack([torch.arange(7.0), torch.arange(7.0) + 0.5, torch.arange(7.0)])[:, None].expand(3, 2, 7)
    with pytest.raises(ValueError, match="position_ids with 3 rows, but this patch takes 5"):
        qwen2(input_ids=ids, position_ids=uneven)
    emb = qwen2.get_input_embeddings()(inputs["input_ids"])
    no_types = {k: v for k, v in inputs.items() if k not in ("input_ids", "mm_token_type_ids")}
    no_types = {k: v for k, v in no_types.items() if not k.startswith("pixel")}
    with pytest.raises(ValueError, match="mm_token_type_ids"):
        qwen2(inputs_embeds=emb, **no_types)


@pytest.mark.parametrize("design", ["circle", "vrope", "compact", "mrope"])
def test_vision_tokens_after_a_cache_are_refused_not_placed_as_text(qwen2, design):
    """Item: image tokens arriving after a KV cache were placed as text when mm_token_type_ids was omitted."""
    inputs, _ = make_batch(pad="left")
    patch_model(qwen2, design)
    with torch.no_grad():
        out = qwen2(**inputs, use_cache=True)
        B = inputs["input_ids"].shape[0]
        mask = torch.cat([inputs["attention_mask"], torch.ones(B, 2, dtype=torch.long)], dim=1)
        step = {CACHE: out.past_key_values, "attention_mask": mask, "use_cache": True}
        new = torch.tensor([[5, IMG], [6, 7]])
        with pytest.raises(ValueError, match="image/video tokens after a KV cache are not supported"):
            qwen2(input_ids=new, **step)
        with pytest.raises(ValueError, match="image/video tokens after a KV cache are not supported"):
            qwen2(input_ids=torch.tensor([[5, 8], [6, VID]]), **step)
        embeds = qwen2.get_input_embeddings()(new)  # no ids: the image token's embedding gives it away
        with pytest.raises(ValueError, match="image/video tokens after a KV cache are not supported"):
            qwen2(inputs_embeds=embeds, **step)
        # declared text by mm_token_type_ids: the same ids are text, as the caller says
        qwen2(input_ids=new, mm_token_type_ids=torch.zeros_like(new), **step)


def test_compiled_cached_decoding_equals_eager(qwen2):
    """Compiled cached decoding (fullgraph) reads the continuation the cache keeps with plain tensor
    arithmetic. Reference: eager decoding."""
    inputs, _ = make_batch(pad="left")
    patch_model(qwen2, ("compact", "vrope"), age="alternate")  # compact's text leaves the diagonal

    def run(forward):
        with torch.no_grad():
            out = qwen2(**inputs, use_cache=True)
            cache, mask, seen = out.past_key_values, inputs["attention_mask"], []
            for _ in range(4):
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
                mask = torch.cat([mask, torch.ones_like(nxt)], dim=1)
                out = forward(input_ids=nxt, mm_token_type_ids=torch.zeros_like(nxt), attention_mask=mask,
                              use_cache=True, **{CACHE: cache})
                cache = out.past_key_values
                seen.append(out.logits[:, -1])
        return seen

    eager = run(qwen2.forward)
    torch._dynamo.reset()
    compiled = run(torch.compile(qwen2.forward, fullgraph=True, backend="eager"))
    torch._dynamo.reset()
    for le, lc in zip(eager, compiled):
        torch.testing.assert_close(lc, le, rtol=1e-5, atol=1e-5)


def test_generate_declares_its_tokens_text(qwen2):
    """A text prompt without mm_token_type_ids: generated tokens that carry the image token id are text
    (as in stock generate), not refused as images after the cache."""
    ids, _ = text_batch()

    def gen():
        with torch.no_grad():
            # sequence_bias makes the model emit the image token id
            return qwen2.generate(input_ids=ids, max_new_tokens=3, do_sample=False, sequence_bias={(IMG,): 1e4})
    ref = gen()
    assert (ref[:, ids.shape[1]:] == IMG).all()
    patch_model(qwen2, "vrope")
    assert torch.equal(gen(), ref)


def test_a_left_over_generate_placement_is_not_reused_for_another_mask(qwen2):
    """Positions generate placed for a padded prompt (say, generate failed right after) must not drive
    a later forward of the same ids without a mask: that one counts every token."""
    ids, _ = text_batch()
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with torch.no_grad():
        ref = qwen2(input_ids=ids).logits
        patch_model(qwen2, "vrope")
        qwen2._prepare_position_ids_for_generation(ids, {"input_ids": ids, "attention_mask": mask})
        out = qwen2(input_ids=ids).logits
    assert torch.equal(out, ref)


# --------------------------------------------------------------------------------------------------
# unpadded batches: every row continues at once

# two unpadded samples of 28 tokens each, placed differently
DENSE = [SAMPLES[0], [("T", 3), ("V", 2, 4, 4), ("T", 2), ("I", 4, 4), ("I", 8, 4), ("T", 3)]]
FAST_STATES = [dict(design="mrope"), dict(design="circle", age="alternate"), dict(design="vrope")]


@pytest.mark.parametrize("state", FAST_STATES, ids=lambda s: "+".join(map(str, s.values())))
def test_dense_generation_matches_teacher_forcing(qwen2, state):
    """generate on an unpadded batch."""
    inputs, _ = make_batch(DENSE)
    patch_model(qwen2, **state)
    _generate_and_replay(qwen2, inputs, new=4)
