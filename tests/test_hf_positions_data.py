"""Positions as data: the position tensor of a batch, interleaved requests, packed rows, compiled forwards.

References: transformers' own ``get_rope_index`` and text positions (the stock-equivalent design), per-sample runs
(packed rows), teacher forcing over the whole sequence (each request decoding from its own cache), the eager
forward (compiled ones), and the stock model's per-sample runs.
"""
import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import torch
import torch.nn.functional as F
from transformers import Qwen2VLForConditionalGeneration

from ropekit.hf import (PackingCollator, is_patched, last_positions, pack, patch_model, position_ids,
                        position_rows, unpatch_model)

from test_hf import CACHE, SAMPLES, STOCK_SAMPLES, _qwen2_cfg, _seed_build, make_batch

PATCHES = [dict(design="mrope"), dict(design="circle", age="alternate"), dict(design="vrope"),
           dict(design=("compact", "vrope"), age="alternate")]
IDS = ["mrope", "circle-age", "vrope", "compact-vrope-age"]

# three samples of different lengths and layouts (images and videos), one text-only
PACKED = [
    [("T", 3), ("I", 4, 4), ("T", 2), ("V", 2, 4, 4), ("T", 2)],
    [("T", 5)],
    [("T", 2), ("I", 4, 8), ("T", 1), ("I", 8, 4), ("T", 3)],
]


@pytest.fixture(scope="module")
def qwen2():
    return _seed_build(Qwen2VLForConditionalGeneration, _qwen2_cfg(3))


@pytest.fixture(autouse=True)
def _unpatched_after(qwen2):
    yield
    if is_patched(qwen2):
        unpatch_model(qwen2)


def _extend(inputs, new):
    """The batch followed by text tokens ``new (B, n)``: what a teacher-forced pass over prompt and step sees."""
    full = dict(inputs, input_ids=torch.cat([inputs["input_ids"], new], 1))
    full["mm_token_type_ids"] = torch.cat([inputs["mm_token_type_ids"], torch.zeros_like(new)], 1)
    full["attention_mask"] = torch.cat([inputs["attention_mask"], torch.ones_like(new)], 1)
    return full


# --------------------------------------------------------------------------------------------------
# the position tensor


def test_stock_equivalent_tensor_is_transformers_own(qwen2):
    """With M-RoPE the tensor is transformers' [text; t; h; w]: its rows 1-3 are the stock get_rope_index, row 0 the
    text positions generate builds from the mask."""
    inputs, _ = make_batch(STOCK_SAMPLES, pad="left")
    with torch.no_grad():
        stock, _ = qwen2.model.get_rope_index(inputs["input_ids"], image_grid_thw=inputs["image_grid_thw"],
                                              video_grid_thw=inputs["video_grid_thw"],
                                              attention_mask=inputs["attention_mask"],
                                              mm_token_type_ids=inputs["mm_token_type_ids"])
        text = qwen2._prepare_position_ids_for_generation(inputs["input_ids"], dict(inputs))[0]
        patch_model(qwen2, "mrope")
        pos = position_ids(qwen2, **inputs)
    assert position_rows(qwen2) == [("mrope", 3)]
    keep = inputs["attention_mask"].bool()
    assert torch.equal(pos[1:][:, keep], stock[:, keep].float())
    assert torch.equal(pos[0], text.float())


@pytest.mark.parametrize("patch", PATCHES, ids=IDS)
def test_the_forward_applies_the_given_tensor_unchanged(qwen2, patch):
    """A forward given no positions equals one given position_ids(model, ...); one given other positions differs
    (the comparison sees the positions)."""
    inputs, _ = make_batch(pad="right")
    patch_model(qwen2, **patch)
    pos = position_ids(qwen2, **inputs)
    assert pos.shape == (1 + sum(a for _, a in position_rows(qwen2)), *inputs["input_ids"].shape)
    with torch.no_grad():
        placed = qwen2(**inputs).logits
        given = qwen2(**inputs, position_ids=pos).logits
        moved = pos.clone()
        moved[1:] += torch.arange(moved.shape[-1]) % 3  # every geometry row off by 0-2
        other = qwen2(**inputs, position_ids=moved).logits
    keep = inputs["attention_mask"].bool()
    assert torch.equal(given[keep], placed[keep])
    assert (other[keep] - placed[keep]).abs().max() > 1e-4


def test_a_forward_keeps_nothing_between_calls(qwen2):
    """Two identical forwards around an unrelated one give identical outputs (no state carried over)."""
    a, _ = make_batch(pad="left", seed=0)
    b, _ = make_batch([SAMPLES[1]], pad="left", seed=3)
    patch_model(qwen2, "circle", age="alternate")
    with torch.no_grad():
        first = qwen2(**a).logits
        qwen2(**b, use_cache=True)
        again = qwen2(**a).logits
    assert torch.equal(first, again)


# --------------------------------------------------------------------------------------------------
# requests interleaved on one model, each with its own cache


@pytest.mark.parametrize("patch", PATCHES, ids=IDS)
def test_interleaved_requests_decode_from_their_own_cache(qwen2, patch):
    """Prefill A, prefill B (same batch size, another layout), a cached step of A, then of B: each equals teacher
    forcing of its own sequence."""
    a, _ = make_batch(SAMPLES, pad="left", seed=0)
    b, _ = make_batch([SAMPLES[1], [("T", 4), ("I", 8, 8), ("T", 2)]], pad="left", seed=1)
    patch_model(qwen2, **patch)
    new = torch.tensor([[5], [6]])
    with torch.no_grad():
        cache_a = getattr(qwen2(**a, use_cache=True), CACHE)
        cache_b = getattr(qwen2(**b, use_cache=True), CACHE)
        steps = {}
        for name, req, cache in (("a", a, cache_a), ("b", b, cache_b)):
            mask = torch.cat([req["attention_mask"], torch.ones_like(new)], 1)
            steps[name] = qwen2(input_ids=new, attention_mask=mask, use_cache=True, **{CACHE: cache}).logits[:, -1]
        for name, req in (("a", a), ("b", b)):
            forced = qwen2(**_extend(req, new)).logits[:, -1]
            torch.testing.assert_close(steps[name], forced, rtol=1e-5, atol=1e-5)


def test_cached_steps_without_a_mask_continue_the_prompt(qwen2):
    """Steps given no attention mask (a hand-written loop over an unpadded prompt) take, on both geometries of an AGE
    patch, the positions teacher forcing gives the whole sequence, and its logits; a cache cut below the prompt is
    refused, never continued from a guess."""
    inputs, _ = make_batch([SAMPLES[0]], pad="left")  # one sample: no padding
    patch_model(qwen2, ("compact", "vrope"), age="alternate")  # compact's text leaves the diagonal
    new = torch.tensor([[5, 6, 7]])
    length = inputs["input_ids"].shape[1]
    with torch.no_grad():
        cache = getattr(qwen2(**inputs, use_cache=True), CACHE)
        steps = [qwen2(input_ids=new[:, i:i + 1], use_cache=True, **{CACHE: cache}).logits[:, -1] for i in range(3)]
        last = last_positions(qwen2)
        forced = qwen2(**_extend(inputs, new)).logits
        whole = last_positions(qwen2)
        for layer, pos in last.items():
            assert torch.equal(pos, whole[layer][..., -1:]), layer
        for i, step in enumerate(steps):
            torch.testing.assert_close(step, forced[:, length + i], rtol=1e-5, atol=1e-5)
        cache.crop(length - 1 - cache.get_seq_length())  # one token short of the prompt
        with pytest.raises(ValueError, match="fewer cached tokens than the prompt"):
            qwen2(input_ids=new[:, :1], use_cache=True, **{CACHE: cache})


def test_a_cache_the_patch_did_not_fill_is_refused(qwen2):
    """Where a cache's text continues is not known when it was filled with explicit positions: refused, naming the
    fix, never guessed."""
    a, _ = make_batch(pad="left")
    patch_model(qwen2, "circle")
    pos = position_ids(qwen2, **a)
    with torch.no_grad():
        cache = getattr(qwen2(**a, position_ids=pos, use_cache=True), CACHE)
        mask = torch.cat([a["attention_mask"], torch.ones(2, 1, dtype=torch.long)], 1)
        with pytest.raises(ValueError, match="pass position_ids for the new tokens"):
            qwen2(input_ids=torch.tensor([[5], [6]]), attention_mask=mask, use_cache=True, **{CACHE: cache})


def test_generate_refuses_a_prompt_ending_in_an_image(qwen2):
    """generate extends the positions by one on every row; after an image block the design puts text elsewhere."""
    inputs, _ = make_batch([[("T", 2), ("I", 4, 4)]], pad="left")
    patch_model(qwen2, "mrope")
    with pytest.raises(ValueError, match="ends with an image or video block"):
        qwen2.generate(**inputs, max_new_tokens=2, do_sample=False)


# --------------------------------------------------------------------------------------------------
# packed rows


def _samples(seed=0):
    return [make_batch([segs], seed=seed + i)[0] for i, segs in enumerate(PACKED)]


def _per_sample(model, samples):
    """Each sample's logits alone and its summed next-token loss."""
    logits, losses = [], []
    with torch.no_grad():
        for s in samples:
            out = model(**s).logits[0]
            logits.append(out)
            ids = s["input_ids"][0]
            losses.append(F.cross_entropy(out[:-1], ids[1:], reduction="sum"))
    return logits, torch.stack(losses)


@pytest.mark.parametrize("patch", PATCHES, ids=IDS)
def test_packed_row_equals_per_sample_runs(qwen2, patch):
    samples = _samples()
    patch_model(qwen2, **patch)
    ref, ref_loss = _per_sample(qwen2, samples)
    batch = pack(qwen2, samples)
    assert "attention_mask" not in batch
    with torch.no_grad():
        out = qwen2(**batch)
    at = 0
    for r in ref:
        torch.testing.assert_close(out.logits[0, at:at + r.shape[0]], r, rtol=1e-5, atol=1e-5)
        at += r.shape[0]
    assert at == out.logits.shape[1]
    tokens = sum(s["input_ids"].shape[1] - 1 for s in samples)  # every sample's first token predicts nothing
    torch.testing.assert_close(out.loss, ref_loss.sum() / tokens, rtol=1e-5, atol=1e-6)


def test_packed_stock_equivalent_equals_the_stock_models_per_sample_runs(qwen2):
    samples = _samples(seed=7)
    stock, _ = _per_sample(qwen2, samples)
    patch_model(qwen2, "mrope")
    batch = PackingCollator(qwen2)(samples)
    with torch.no_grad():
        out = qwen2(**batch).logits[0]
    torch.testing.assert_close(out, torch.cat(stock), rtol=1e-5, atol=1e-5)


def test_text_positions_with_images_are_refused(qwen2):
    """DataCollatorWithFlattening's restarting 1-D position_ids with images, and transformers' 4-row form for an AGE
    patch (which needs a block per geometry), would place the images wrongly: refused, naming what to use."""
    samples = _samples()
    patch_model(qwen2, "circle", age="alternate")
    batch = pack(qwen2, samples)
    text = batch["position_ids"][0].long()
    with pytest.raises(ValueError, match="1-D position_ids.*ropekit.hf.PackingCollator"):
        qwen2(**dict(batch, position_ids=text))
    with pytest.raises(ValueError, match="4 rows, but this patch takes 7.*PackingCollator"):
        qwen2(**dict(batch, position_ids=batch["position_ids"][:4]))


def test_pack_refuses_what_it_cannot_lay_out(qwen2):
    samples = _samples()
    patch_model(qwen2, "mrope")
    padded = dict(samples[0], attention_mask=samples[0]["attention_mask"].clone())
    padded["attention_mask"][0, 0] = 0
    with pytest.raises(ValueError, match="padding"):
        pack(qwen2, [padded])
    with pytest.raises(ValueError, match="does not know how to lay out"):
        pack(qwen2, [dict(samples[0], token_type_ids=samples[0]["input_ids"])])
    unpatch_model(qwen2)
    with pytest.raises(ValueError, match="not patched"):
        pack(qwen2, samples)


def test_flash_attention_kwargs_mark_the_sample_boundaries(qwen2):
    samples = _samples()
    patch_model(qwen2, "mrope")
    batch = pack(qwen2, samples, return_flash_attn_kwargs=True)
    lengths = [s["input_ids"].shape[1] for s in samples]
    assert batch["cu_seq_lens_q"].tolist() == [0, *torch.tensor(lengths).cumsum(0).tolist()]
    assert batch["max_length_k"] == max(lengths)


# --------------------------------------------------------------------------------------------------
# compiled


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_whole_forward_equals_eager(qwen2, backend):
    """torch.compile of the whole patched model (images, AGE), forward and a training step's gradients."""
    inputs, _ = make_batch(pad="right")
    patch_model(qwen2, "circle", age="alternate")
    labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)

    def step(model):
        qwen2.zero_grad()
        out = model(**inputs, labels=labels)
        out.loss.backward()
        grads = {n: p.grad.clone() for n, p in qwen2.model.language_model.named_parameters() if p.grad is not None}
        qwen2.zero_grad()
        return out.logits.detach(), grads

    eager, eager_grads = step(qwen2)
    torch._dynamo.reset()
    compiled, compiled_grads = step(torch.compile(qwen2, backend=backend))
    torch._dynamo.reset()
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-5)
    assert eager_grads.keys() == compiled_grads.keys()
    for n in eager_grads:
        torch.testing.assert_close(compiled_grads[n], eager_grads[n], rtol=1e-3, atol=1e-5)


def test_decoder_layers_compile_with_fullgraph(qwen2):
    inputs, _ = make_batch(pad="right")
    patch_model(qwen2, "circle", age="alternate")
    layers = qwen2.model.language_model.layers
    with torch.no_grad():
        eager = qwen2(**inputs).logits
        originals = list(layers)
        torch._dynamo.reset()
        try:
            for i, layer in enumerate(originals):
                layers[i] = torch.compile(layer, fullgraph=True, backend="aot_eager")
            compiled = qwen2(**inputs).logits
        finally:
            for i, layer in enumerate(originals):
                layers[i] = layer
            torch._dynamo.reset()
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpointed_training_keeps_every_layers_gradient(qwen2, use_reentrant):
    """Activation checkpointing (both of torch's kinds) gives the same loss and every decoder layer the same
    gradients as a plain step, with AGE: the layers get their input positionally, as checkpointing needs."""
    from hf_compat import assert_checkpointing_keeps_gradients

    inputs, _ = make_batch(pad="right")
    labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
    patch_model(qwen2, "circle", age="alternate")
    assert_checkpointing_keeps_gradients(qwen2, inputs, labels, qwen2.model.language_model, use_reentrant)
