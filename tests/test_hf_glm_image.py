"""ropekit designs inside GLM-Image (``glm_image``, a tiny random model built from its config), whose prompt plans the
positions of the image the model generates after it.

References: the stock transformers model with the same weights (the stock-equivalent patch, M-RoPE with
``continuation="spatial"``, must give its logits and positions on text-to-image, image-to-image and text prompts,
and its ``generate`` tokens, per-step logits and per-step positions bit for bit, the generated image's tokens taking
the raster the stock model plans at prefill), each design's ``ropekit.positions`` of the layout (the prompt, each
target grid as an image block in the order the model generates them, then text), and one teacher-forced forward over
the generated sequence (cached generation must reproduce its logits, with and without AGE).
"""
import inspect
import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import torch
import transformers as T

import ropekit
from ropekit import Image, Layout, Text
from ropekit.hf.boundary import CACHE_NAMES
from ropekit.hf import is_patched, last_positions, layer_designs, patch_model, position_ids, supported_models

from hf_compat import assert_checkpointing_keeps_gradients, left_padded, ready_to_generate, restore
from test_hf_families_3axis import DESIGNS, IMG, PAD, TEXT

HAS_GLM_IMAGE = hasattr(T, "GlmImageForConditionalGeneration")
pytestmark = pytest.mark.skipif(not HAS_GLM_IMAGE,
                                reason=f"transformers {T.__version__} has no GlmImageForConditionalGeneration")

START, END = 72, 73  # <image_start>, <image_end>
VISION_VOCAB = 40  # the ids the model generates (its VQ codebook): never a marker or a placeholder
# half of the 16-channel head rotates (4 pairs), chunked t 1 : h 2 : w 1
ROPE = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [1, 2, 1], "partial_rotary_factor": 0.5}


def _glm_image(vision_vocab=VISION_VOCAB):
    return T.GlmImageForConditionalGeneration(T.GlmImageConfig(
        text_config=dict(TEXT, vision_vocab_size=vision_vocab, pad_token_id=PAD, eos_token_id=END,
                         rope_parameters=ROPE),
        vision_config=dict(depth=1, hidden_size=16, num_heads=2, intermediate_size=16, patch_size=2, image_size=8),
        vq_config=dict(embed_dim=8, num_embeddings=VISION_VOCAB, latent_channels=16),
        image_token_id=IMG, image_start_token_id=START, image_end_token_id=END))


BUILDERS = {"glm_image": _glm_image} if HAS_GLM_IMAGE else {}  # for tests/test_hf_boundary.py


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = ready_to_generate(_glm_image(), PAD, [])
    yield m
    restore(m)


@pytest.fixture(autouse=True)
def _unpatched_after(request):
    yield
    if "model" in request.fixturenames:
        m = request.getfixturevalue("model")
        restore(m)
        m.model._cached_decode_position_ids = None


# ---------------------------------------------------------------------------------------------------------------
# prompts as the processor writes them: ("T", n) text, ("S", h, w) a source image between <image_start> and
# <image_end>, ("G",) the closing <image_start> after which the model generates the target grids


def make_batch(samples, seed=0, generated=0):
    """Left-padded inputs for ``samples`` (each ``(segments, target grids)``), ``generated`` random image tokens
    appended to every sample, and per sample its layout (segments, then the image blocks the model generates, in
    the order it generates them: the last target first)."""
    g = torch.Generator().manual_seed(seed)
    rows, grids, per_sample, layouts, patches = [], [], [], [], 0
    for segs, targets in samples:
        ids, lay, sources = [], [], []
        for s in segs:
            if s[0] == "T":
                ids += torch.randint(1, 60, (s[1],), generator=g).tolist()
                lay.append(Text(s[1]))
            elif s[0] == "S":
                ids += [START] + [IMG] * (s[1] * s[2]) + [END]
                lay += [Text(1), Image(s[1], s[2]), Text(1)]
                sources.append([1, s[1], s[2]])
                patches += s[1] * s[2]
            else:
                ids.append(START)
                lay.append(Text(1))
        ids += torch.randint(0, VISION_VOCAB, (generated,), generator=g).tolist()
        rows.append(ids)
        grids += sources + [[1, h, w] for h, w in targets]
        per_sample.append(len(sources) + len(targets))
        layouts.append(lay + [Image(h, w) for h, w in reversed(targets)])
    input_ids, mask = left_padded(rows, PAD)
    inputs = dict(input_ids=input_ids, attention_mask=mask)
    if grids:
        inputs.update(image_grid_thw=torch.tensor(grids), images_per_sample=torch.tensor(per_sample))
    if patches:
        inputs["pixel_values"] = torch.randn(patches, 12, generator=g)
    return inputs, layouts


# text-to-image: a large grid and a preview (generated first); the samples' grids differ in shape, not in tokens
T2I = [([("T", 3), ("G",)], [(2, 3), (2, 2)]), ([("T", 5), ("G",)], [(3, 2), (1, 4)])]
# image-to-image: source images, then one target grid
I2I = [([("T", 2), ("S", 2, 2), ("T", 3), ("G",)], [(2, 3)]), ([("T", 1), ("S", 2, 4), ("T", 1), ("G",)], [(3, 2)])]
PLANNED = 10, 6  # tokens of the image generated after a T2I, an I2I prompt


def reference_positions(inputs, layouts, design, **options):
    """Expected (A, B, L): each sample's ``ropekit.positions`` of its layout on its tokens (text after the layout)."""
    mask = inputs["attention_mask"].bool()
    out = None
    for b, lay in enumerate(layouts):
        n = int(mask[b].sum())
        more = n - sum(s.num_tokens for s in lay)
        p = ropekit.positions(Layout(lay + ([Text(more)] if more > 0 else [])), design, **options)[:n]
        out = torch.zeros(p.shape[1], *mask.shape) if out is None else out
        out[:, b, mask[b]] = p.T
    return out


def _logits(model, inputs):
    with torch.no_grad():
        return model(**inputs).logits


def _cache_keyword():
    """The generation model's KV cache parameter (``cache`` since transformers 5.24, ``past_key_values`` before)."""
    names = inspect.signature(T.GlmImageForConditionalGeneration.forward).parameters
    return next(n for n in CACHE_NAMES if n in names)


def _cache(out):
    """The KV cache a forward returns (``cache`` since transformers 5.24, ``past_key_values`` before)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _rotary_positions(model):
    """A list that collects the position ids every call of the text model's rotary gets (stock or patched)."""
    seen = []
    model.model.language_model.rotary_emb.register_forward_pre_hook(
        lambda mod, args, kwargs: seen.append(kwargs.get("position_ids", args[1] if len(args) > 1 else None)),
        with_kwargs=True)
    return seen


# ---------------------------------------------------------------------------------------------------------------
# the stock-equivalent patch is the stock model


def test_glm_image_is_supported():
    assert "glm_image" in supported_models()


def test_stock_equivalent_forward_matches_stock(model):
    """Text-to-image and image-to-image prompts (left-padded, the source images' pixels through the VQ tokenizer) and
    left-padded text: the same logits and get_rope_index positions as the stock model, bit for bit, and the positions
    are ``ropekit.positions`` of the layout; nothing is kept on the model."""
    batches = [make_batch(T2I), make_batch(I2I, seed=1)]
    text = make_batch([([("T", 4)], []), ([("T", 7)], [])], seed=2)[0]
    want = [(_logits(model, inputs), model.model.get_rope_index(
        inputs["input_ids"], image_grid_thw=inputs["image_grid_thw"], images_per_sample=inputs["images_per_sample"],
        attention_mask=inputs["attention_mask"])) for inputs, _ in batches]
    want_text = _logits(model, text)
    model.model._cached_decode_position_ids = None
    patch_model(model, "mrope", continuation="spatial")
    for (inputs, layouts), (ref, (pos, deltas)) in zip(batches, want):
        keep = inputs["attention_mask"].bool()
        assert torch.equal(_logits(model, inputs)[keep], ref[keep])
        spatial = reference_positions(inputs, layouts, "mrope", continuation="spatial")
        assert torch.equal(pos[:, keep].float(), spatial[:, keep])
        for p in last_positions(model).values():
            assert torch.equal(p[:, keep], spatial[:, keep])
        got, got_deltas = model.model.get_rope_index(
            inputs["input_ids"], image_grid_thw=inputs["image_grid_thw"],
            images_per_sample=inputs["images_per_sample"], attention_mask=inputs["attention_mask"])
        assert torch.equal(got[:, keep], pos[:, keep]) and torch.equal(got_deltas, deltas)
    keep = text["attention_mask"].bool()  # no grid: the stock model counts the left padding, and so does the patch
    assert torch.equal(_logits(model, text)[keep], want_text[keep])
    assert model.model.rope_deltas is None and model.model._cached_decode_position_ids is None


def test_stock_equivalent_generate_matches_stock(model):
    """Greedy generate of the planned image and its end marker (max_new_tokens = its tokens + 1, as GLM-Image's
    pipeline asks): the same tokens, per-step logits and per-step positions as the stock model, bit for bit; the
    positions of the generated tokens are the raster the stock model planned at prefill."""
    kw = dict(do_sample=False, output_logits=True, return_dict_in_generate=True)
    batches = [(make_batch(T2I)[0], PLANNED[0]), (make_batch(I2I, seed=1)[0], PLANNED[1])]
    seen = _rotary_positions(model)
    want = []
    with torch.no_grad():
        for inputs, planned in batches:
            seen.clear()
            out = model.generate(**inputs, max_new_tokens=planned + 1, **kw)
            want.append((out, list(seen), model.model._cached_decode_position_ids.clone()))
        model.model._cached_decode_position_ids = None
        patch_model(model, "mrope", continuation="spatial")
        for (inputs, planned), (ref, steps, plan) in zip(batches, want):
            seen.clear()
            got = model.generate(**inputs, max_new_tokens=planned + 1, **kw)
            assert torch.equal(got.sequences, ref.sequences)
            for w, g in zip(ref.logits, got.logits):
                assert torch.equal(g, w)
            keep = inputs["attention_mask"].bool()  # the prompt (stock puts padding at 1, the patch at 0)
            assert torch.equal(seen[0][:, keep], steps[0][:, keep].float())
            assert len(seen) == len(steps) == planned + 1
            for k, (w, g) in enumerate(zip(steps[1:], seen[1:])):  # decoding step k feeds generated token k
                assert torch.equal(g, w.float()) and torch.equal(g[:, :, 0], plan[:, :, k].T.float())
            assert model.model._cached_decode_position_ids is None


def test_the_generated_image_takes_the_stock_plan(model):
    """The positions of a generated sequence (a forward over the prompt and the tokens generated after it) are the
    stock model's planned raster for those tokens: the preview grid, then the large one, then the end marker. The
    stock forward of the same sequence puts them on the text diagonal instead (unlike its own decoding)."""
    inputs, _ = make_batch(T2I)
    stock_pos, _ = model.model.get_rope_index(
        inputs["input_ids"], image_grid_thw=inputs["image_grid_thw"], images_per_sample=inputs["images_per_sample"],
        attention_mask=inputs["attention_mask"])
    plan = model.model._cached_decode_position_ids  # (B, 3, tokens + end marker)
    assert plan.shape[2] == PLANNED[0] + 1
    full, _ = make_batch(T2I, generated=PLANNED[0] + 1)
    stock_full, _ = model.model.get_rope_index(
        full["input_ids"], image_grid_thw=full["image_grid_thw"], images_per_sample=full["images_per_sample"],
        attention_mask=full["attention_mask"])
    tail = slice(-(PLANNED[0] + 1), None)
    assert not torch.equal(stock_full[:, :, tail], plan.permute(1, 0, 2))  # the stock forward: the diagonal
    patch_model(model, "mrope", continuation="spatial")
    pos = position_ids(model, **full)
    assert torch.equal(pos[1:, :, tail], plan.permute(1, 0, 2).float())
    keep = inputs["attention_mask"].bool()
    assert torch.equal(pos[1:, :, :keep.shape[1]][:, keep], stock_pos[:, keep].float())
    # the text row counts tokens, as transformers' masks read it
    assert torch.equal(pos[0, :, tail], (keep.sum(1)[:, None] + torch.arange(PLANNED[0] + 1)).float())


# ---------------------------------------------------------------------------------------------------------------
# every design places the prompt and the image it generates; cached generation equals teacher forcing


def test_every_design_places_its_positions(model):
    """Every design runs over generated sequences (the prompt, the planned image's tokens, its end marker and more
    text) and every layer rotates with ``ropekit.positions`` of the layout: the generated grids placed as the design
    places an image of that size."""
    # a text-to-image and an image-to-image sample side by side (plans of 10 and 6 tokens, then text); the source
    # image as its VQ ids, without pixels (the stock vision path takes every sample's last row alone as its target)
    inputs, layouts = make_batch([T2I[0], I2I[1]], generated=PLANNED[0] + 2)
    inputs.pop("pixel_values")
    keep = inputs["attention_mask"].bool()
    for design in DESIGNS:
        patch_model(model, design)
        out = _logits(model, inputs)
        assert torch.isfinite(out[keep]).all(), design
        want = reference_positions(inputs, layouts, design)
        for p in last_positions(model).values():
            assert torch.equal(p[:, keep], want[:, keep]), design


@pytest.mark.parametrize("age", [None, "alternate"])
def test_cached_generation_equals_a_teacher_forced_forward(model, age):
    """Circle-RoPE (with and without AGE): generating the planned image, its end marker and two tokens of text after
    it from a cache gives the logits of one forward over the whole sequence, which places the layout."""
    patch_model(model, "circle", age=age)
    for samples, planned, seed in ((T2I, PLANNED[0], 0), (I2I, PLANNED[1], 1)):
        inputs, layouts = make_batch(samples, seed=seed)
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=planned + 3, do_sample=False, output_logits=True,
                                 return_dict_in_generate=True)
            n = out.sequences.shape[1] - inputs["input_ids"].shape[1]
            full = dict(inputs, input_ids=out.sequences,
                        attention_mask=torch.cat([inputs["attention_mask"], torch.ones(2, n, dtype=torch.long)], 1))
            logits = model(**full).logits
        keep = full["attention_mask"].bool()
        for layer, p in last_positions(model).items():
            assert torch.equal(p[:, keep], reference_positions(full, layouts, layer_designs(model)[layer])[:, keep])
        start = inputs["input_ids"].shape[1] - 1
        for k, step in enumerate(out.logits):
            torch.testing.assert_close(step, logits[:, start + k], rtol=1e-5, atol=1e-5)


def test_two_caches_continue_their_own_plans(model):
    """Positions are data: two prompts with different target grids prefilled into two caches, then decoded step by
    step in alternation, each step taking its own cache's plan (the stock model keeps one plan on the model)."""
    patch_model(model, "mrope", continuation="spatial")
    a, _ = make_batch(T2I[:1])
    b, _ = make_batch(I2I[1:], seed=1)
    runs = []
    with torch.no_grad():
        for inputs in (a, b):
            out = model(**inputs, use_cache=True)
            runs.append([inputs, _cache(out), out.logits[:, -1:].argmax(-1), []])
        for _ in range(3):
            for run in runs:
                inputs, cache, token, steps = run
                mask = torch.ones(1, cache.get_seq_length() + 1, dtype=torch.long)
                out = model(input_ids=token, attention_mask=mask, use_cache=True, **{_cache_keyword(): cache})
                steps.append(list(last_positions(model).values())[0][:, 0, 0])
                run[2] = out.logits[:, -1:].argmax(-1)
    for (inputs, _, _, steps), planned in zip(runs, (PLANNED[0] + 1, PLANNED[1] + 1)):
        full, _ = make_batch(T2I[:1] if inputs is a else I2I[1:], seed=0 if inputs is a else 1, generated=planned)
        tail = position_ids(model, **full)[1:, 0, -planned:]
        assert torch.equal(torch.stack(steps, dim=1), tail[:, :3])


@pytest.mark.parametrize("patch", [dict(design="mrope", continuation="spatial"), dict(design="circle", age="alternate")],
                         ids=["stock-equivalent", "circle-age"])
def test_packed_rows_equal_per_sample_runs(model, patch):
    """Generated sequences (text-to-image, and image-to-image with the source images' pixels) packed into one
    padding-free row (ropekit.hf.pack, ``images_per_sample`` stacked): each sample's logits equal its own run."""
    patch_model(model, **patch)
    for samples, planned, seed in ((T2I, PLANNED[0], 0), (I2I, PLANNED[1], 1)):
        alone = [make_batch([s], seed=seed + i, generated=planned + 2)[0] for i, s in enumerate(samples)]
        row = ropekit.hf.pack(model, alone)
        row.pop("labels")  # the stock loss reads the text vocabulary's size, not the image vocabulary's
        want = torch.cat([_logits(model, s)[0] for s in alone])
        torch.testing.assert_close(_logits(model, row)[0], want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# training, saving, refusals


def test_checkpointed_training_step():
    """AGE training on a generated sequence (loss on the image tokens): gradient checkpointing gives the same
    gradients. (The stock loss reads the text vocabulary's size, so the model's image vocabulary is made as large.)"""
    torch.manual_seed(0)
    model = _glm_image(vision_vocab=TEXT["vocab_size"]).eval()
    inputs, _ = make_batch(T2I, generated=PLANNED[0])
    labels = torch.full_like(inputs["input_ids"], -100)
    labels[:, -PLANNED[0]:] = inputs["input_ids"][:, -PLANNED[0]:]
    patch_model(model, "circle", age="alternate")
    assert_checkpointing_keeps_gradients(model, inputs, labels, model.model.language_model)


def test_save_pretrained_and_reload_restore_the_patch(model, tmp_path):
    inputs, _ = make_batch(I2I, seed=1, generated=3)
    patch_model(model, "circle", age="alternate", alpha=0.5)
    ref = _logits(model, inputs)
    model.save_pretrained(tmp_path)
    loaded = ropekit.hf.from_pretrained(tmp_path, T.GlmImageForConditionalGeneration).eval()
    assert layer_designs(loaded) == layer_designs(model)
    assert torch.equal(_logits(loaded, inputs), ref)


def test_what_cannot_be_placed_is_refused(model):
    """Target grids without the closing <image_start> (where the generated image begins is then unknown), markers out
    of the processor's order, a source image of another size than its grid, a last image that could be a source or
    the generated one, and multi-frame grids are refused by name; without grids the markers are text, as in the stock
    model."""
    patch_model(model, "circle")
    inputs, _ = make_batch(T2I[:1])
    no_start = dict(inputs, input_ids=inputs["input_ids"].masked_fill(inputs["input_ids"] == START, 5))
    with pytest.raises(ValueError, match=r"no <image_start> token .*generates its image after"):
        _logits(model, no_start)
    with pytest.raises(ValueError, match=r"no <image_start> token"):
        model.generate(**no_start, max_new_tokens=1)
    swapped = dict(inputs, input_ids=torch.cat([torch.tensor([[END]]), inputs["input_ids"][:, 1:]], 1))
    with pytest.raises(ValueError, match=r"do not alternate"):
        _logits(model, swapped)
    source, _ = make_batch(I2I[:1], seed=1)
    source.pop("pixel_values")
    wrong = dict(source, image_grid_thw=torch.tensor([[1, 1, 3], [1, 2, 3]]))  # its source image holds 2 x 2 tokens
    with pytest.raises(ValueError, match=r"source image 0 has 4 tokens but its image_grid_thw row \[1, 1, 3\]"):
        _logits(model, wrong)
    closed = dict(inputs, input_ids=torch.cat([inputs["input_ids"], torch.tensor([[1] * 6 + [END]])], 1),
                  attention_mask=torch.ones(1, inputs["input_ids"].shape[1] + 7, dtype=torch.long))
    with pytest.raises(ValueError, match=r"closed after the tokens of image_grid_thw row \[1, 2, 3\], with more"):
        _logits(model, closed)  # a 2 x 3 source image, or the generated image cut short?
    frames = dict(inputs, image_grid_thw=torch.tensor([[2, 2, 3], [1, 2, 2]]))
    with pytest.raises(ValueError, match=r"more than one temporal patch"):
        _logits(model, frames)
    pos = position_ids(model, **{k: inputs[k] for k in ("input_ids", "attention_mask")})  # no grids: text
    assert torch.equal(pos[1:], pos[:1].expand(3, -1, -1))
    assert is_patched(model)
