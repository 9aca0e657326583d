"""ropekit designs inside a tiny random Qwen3.5 (hybrid linear/full attention, partial rotary, interleaved
M-RoPE sections read over the rotated pairs only).

References: the stock transformers model (M-RoPE with transformers' continuation and text-only must equal
it), each design's ``ropekit.positions`` on the layout, one teacher-forced forward (cached generation).
"""
import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import torch
from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

import ropekit
from ropekit import Image, Layout, Text
from ropekit.hf import is_patched, last_positions, layer_designs, patch_model, unpatch_model

from hf_compat import checkpointing_off, checkpointing_on

IMG, VID, PAD = 70, 71, 0
ROPE = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 1, 1], "partial_rotary_factor": 0.5,
        "mrope_interleaved": True}


@pytest.fixture(scope="module")
def qwen35():
    cfg = Qwen3_5Config(
        text_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16, vocab_size=80, rope_parameters=ROPE,
                         layer_types=["linear_attention", "full_attention"] * 2, linear_num_value_heads=2,
                         linear_num_key_heads=1, linear_key_head_dim=8, linear_value_head_dim=8),
        vision_config=dict(depth=1, hidden_size=16, out_hidden_size=32, intermediate_size=16, num_heads=2,
                           spatial_merge_size=2, patch_size=2, temporal_patch_size=2, num_position_embeddings=16),
        image_token_id=IMG, video_token_id=VID,
    )
    torch.manual_seed(0)
    m = Qwen3_5ForConditionalGeneration(cfg).eval()
    m.generation_config.pad_token_id = PAD
    m.generation_config.eos_token_id = None
    m.generation_config.suppress_tokens = [IMG, VID]
    yield m
    if is_patched(m):
        unpatch_model(m)


@pytest.fixture(autouse=True)
def _unpatched_after(qwen35):
    yield
    if is_patched(qwen35):
        unpatch_model(qwen35)


def _inputs():
    ids = torch.tensor([[5, 6, 7] + [IMG] * 4 + [8, 9] + [IMG] * 8 + [10, 11],
                        [PAD] * 8 + [12, 13] + [IMG] * 4 + [14, 15, 16, 17, 18]])
    mask = (torch.arange(ids.shape[1]) >= torch.tensor([[0], [8]])).long()
    grids = torch.tensor([[1, 4, 4], [1, 4, 8], [1, 4, 4]])
    # each sample's segments before its last text run, and that run's length
    layouts = [([Text(3), Image(2, 2), Text(2), Image(2, 4)], 2), ([Text(2), Image(2, 2)], 5)]
    inputs = dict(input_ids=ids, mm_token_type_ids=(ids == IMG).long(), attention_mask=mask, image_grid_thw=grids,
                  pixel_values=torch.randn(int(grids.prod(1).sum()), 24, generator=torch.Generator().manual_seed(0)))
    return inputs, layouts


def test_rotates_only_the_partial_dims(qwen35):
    patch_model(qwen35, "mrope")
    W = qwen35.model.__dict__["_ropekit_patch"].geometries["mrope"].W
    assert W.shape == (3, 4)  # head_dim 16 · partial_rotary_factor 0.5 = 8 rotated channels = 4 pairs


def test_mrope_and_text_only_match_stock(qwen35):
    inputs, _ = _inputs()
    keep = inputs["attention_mask"].bool()
    text = torch.randint(1, 60, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = qwen35(**inputs).logits
        tref = qwen35(input_ids=text).logits
        patch_model(qwen35, "mrope", continuation="spatial")  # transformers 5.x M-RoPE
        out = qwen35(**inputs).logits
        patch_model(qwen35, "circle")
        tout = qwen35(input_ids=text).logits
    assert torch.equal(out[keep], ref[keep])
    assert torch.equal(tout, tref)


@pytest.mark.parametrize("design", ["circle", "vrope", "mrope", "compact", "vanilla"])
def test_positions_and_cached_generation(qwen35, design):
    inputs, layouts = _inputs()
    patch_model(qwen35, design)
    with torch.no_grad():
        out = qwen35.generate(**inputs, max_new_tokens=3, do_sample=False, output_logits=True,
                              return_dict_in_generate=True)
        seq = out.sequences
        n = seq.shape[1] - inputs["input_ids"].shape[1]
        full = dict(inputs, input_ids=seq,
                    mm_token_type_ids=torch.cat([inputs["mm_token_type_ids"], torch.zeros(2, n, dtype=torch.long)], 1),
                    attention_mask=torch.cat([inputs["attention_mask"], torch.ones(2, n, dtype=torch.long)], 1))
        logits = qwen35(**full).logits
    keep = full["attention_mask"].bool()
    for b, (segs, tail) in enumerate(layouts):
        expected = ropekit.positions(Layout(segs + [Text(tail + n)]), design).T
        for p in last_positions(qwen35).values():
            assert torch.equal(p[:, b, keep[b]], expected)
    Lp = inputs["input_ids"].shape[1]
    for k, step in enumerate(out.logits):
        torch.testing.assert_close(step, logits[:, Lp - 1 + k], rtol=1e-5, atol=1e-5)


def test_uncached_generate_matches_cached(qwen35):
    """generate(use_cache=False) passes the grids at the first step only; the later steps keep the images."""
    inputs, _ = _inputs()
    kw = dict(max_new_tokens=3, do_sample=False, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        ref = qwen35.generate(**inputs, use_cache=False, **kw).logits
        patch_model(qwen35, "mrope", continuation="spatial")  # transformers 5.x M-RoPE
        out = qwen35.generate(**inputs, use_cache=False, **kw).logits
        patch_model(qwen35, "circle")
        cached = qwen35.generate(**inputs, **kw).logits
        uncached = qwen35.generate(**inputs, use_cache=False, **kw).logits
    for w, g in zip(ref, out):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    for w, g in zip(cached, uncached):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_age_training_and_checkpointing(qwen35):
    inputs, _ = _inputs()
    labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
    patch_model(qwen35, "circle", age="alternate")
    assert layer_designs(qwen35) == ["circle", "mrope", "circle", "mrope"]

    def grads():
        qwen35.zero_grad()
        loss = qwen35(**inputs, labels=labels).loss
        loss.backward()
        g = [qwen35.model.language_model.layers[i].self_attn.k_proj.weight.grad.clone() for i in (1, 3)]
        qwen35.zero_grad()
        return loss, g

    qwen35.train()
    try:
        loss, plain = grads()
        checkpointing_on(qwen35, use_reentrant=False)
        _, ckpt = grads()
    finally:
        checkpointing_off(qwen35)
        qwen35.eval()
    assert torch.isfinite(loss)
    for a, b in zip(plain, ckpt):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
