"""ropekit designs inside the 3-axis families added in coverage round 3 (tiny random models built from configs),
with the matrix of tests/test_hf_families_3axis.py run on each: the stock-equivalent patch gives the stock
positions, logits and ``generate`` output bit for bit on padded image and video batches and on text; every design
runs and every layer rotates with ``ropekit.positions`` of the layout; cached generation (plain and AGE) equals a
teacher-forced forward; checkpointed training keeps the gradients; packed rows equal per-sample runs (or are
refused where linear-attention layers carry state across a row); save and reload restore the patch. Family
specifics follow the matrix.
"""
import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import torch
import transformers as T

from hf_compat import ready_to_generate, restore, runs_alone
from test_hf_families_3axis import DESIGNS, IMG, PAD, QWEN_VISION, TEXT, VID, Family, _seeded
from test_hf_families_3axis import (  # noqa: F401  (the shared matrix, run here on this file's `fam`)
    test_cached_generation_equals_a_teacher_forced_forward, test_checkpointed_training_step,
    test_packed_rows_equal_per_sample_runs, test_save_pretrained_and_reload_restore_the_patch,
    test_stock_equivalent_forward_matches_stock, test_stock_equivalent_generate_matches_stock)
from test_hf_families_3axis import _batches, _encoded, assert_every_design_places_its_positions
import ropekit
from ropekit.hf import boundary, is_patched, last_positions, patch_model, supported_models, unpatch_model
from ropekit.hf.adapters import ADAPTERS, cohere_compass


def _qwen4_exp():
    # Qwen3.5-MoE's text rotary and position code; sparse (QSA-indexed) attention over blocks of 2 cached tokens
    # with a budget of 4, so the indexer's block choice (keys rotated at their block's first position) matters
    rope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 1, 1], "partial_rotary_factor": 0.5,
            "mrope_interleaved": True}
    return T.Qwen4ExpForConditionalGeneration(T.Qwen4ExpConfig(
        text_config=dict(TEXT, head_dim=16, rope_parameters=rope, layer_types=["linear_attention", "indexed_attention"],
                         linear_num_value_heads=2, linear_num_key_heads=1, linear_key_head_dim=8,
                         linear_value_head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                         shared_expert_intermediate_size=16, hc_count=2, hc_lowrank=8, indexer_n_heads=2,
                         indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=4, indexer_compress_ratio=2),
        vision_config=QWEN_VISION, image_token_id=IMG, video_token_id=VID))


# Qwen3-VL's interleaved rotary over the whole 16-channel head (8 pairs: time 2, height 3, width 3)
QWEN3_ROPE = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3], "mrope_interleaved": True}


def _cosmos3_edge():
    # a SigLIP2 tower on 2 x 2-pixel patches (12 values each) with a 4 x 4 learned reference grid
    return T.Cosmos3EdgeForConditionalGeneration(T.Cosmos3EdgeConfig(
        text_config=dict(TEXT, head_dim=16, rope_parameters=QWEN3_ROPE),
        vision_config=dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                           patch_size=2, num_patches=16, spatial_merge_size=2),
        projector_hidden_size=32, image_token_id=IMG, video_token_id=VID))


def _cosmos3_omni():
    return T.Cosmos3OmniForConditionalGeneration(T.Cosmos3OmniConfig(
        text_config=dict(TEXT, head_dim=16, rope_parameters=QWEN3_ROPE),
        vision_config=dict(QWEN_VISION, deepstack_visual_indexes=[0]), image_token_id=IMG, video_token_id=VID))


def _compass_rope(rope):
    """Before transformers 5.21 Compass pre-permutes its frequencies whatever ``mrope_interleaved`` says (and ropekit
    refuses a flag contradicting the model): the flag is left out there. Its ``[2, 3, 3]`` then reads (h, w, t)."""
    if rope is None or not cohere_compass.prerotated():
        return rope
    return {k: v for k, v in rope.items() if k != "mrope_interleaved"}


def _cohere_compass(rope_full=dict(QWEN3_ROPE, rope_theta=1e4)):
    # a Cohere 2 decoder with a table per layer type: sliding-window layers (window 6) at base 1e6, full-attention
    # layers at base 1e4 (None: no positions on them)
    return T.CohereCompassForConditionalGeneration(T.CohereCompassConfig(
        text_config=dict(TEXT, head_dim=16, layer_types=["sliding_attention", "full_attention"], sliding_window=6,
                         rope_parameters={"sliding_attention": _compass_rope(QWEN3_ROPE),
                                          "full_attention": _compass_rope(rope_full)}),
        vision_config=dict(QWEN_VISION, deepstack_visual_indexes=[0]), image_token_id=IMG, video_token_id=VID))


def _hy_v4_vl(topk=64):
    # latent attention (rope on 8 of each head's channels: 4 pairs, time 2, height 1, width 1), a sparse indexer
    # keeping the top ``topk`` keys per query, hyper-connections and a MoE layer; a HunYuan-VL tower on 2 x 2-pixel
    # patches with a newline token closing every merged row
    rope = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 1, 1]}
    return T.HYV4VLForConditionalGeneration(T.HYV4VLConfig(
        text_config=dict(TEXT, num_key_value_heads=2, rope_parameters=rope, q_lora_rank=16, kv_lora_rank=16,
                         qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=16, index_topk=topk, index_head_dim=16,
                         index_n_heads=2, hc_mult=2, n_routed_experts=4, num_experts_per_tok=2,
                         moe_intermediate_size=16, mlp_layer_types=["dense", "sparse"],
                         indexer_types=["full", "shared"], pad_token_id=PAD, bos_token_id=1, eos_token_id=2),
        vision_config=dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                           patch_size=2, spatial_merge_size=2, out_hidden_size=32, max_image_size=16),
        image_token_id=IMG, video_token_id=VID))


#: (builder, the transformers class it needs)
FAMILIES = {
    "qwen4_exp": (Family(_qwen4_exp, (24,), "frames"), "Qwen4ExpForConditionalGeneration"),
    "cosmos3_edge": (Family(_cosmos3_edge, (12,), "frames"), "Cosmos3EdgeForConditionalGeneration"),
    "cosmos3_omni": (Family(_cosmos3_omni, (24,), "frames"), "Cosmos3OmniForConditionalGeneration"),
    # transformers 5.18's Compass lists no video modality, so its (stock) generate refuses videos: none there
    "cohere_compass": (Family(_cohere_compass, (24,), "frames" if "video" in getattr(
        getattr(T, "CohereCompassForConditionalGeneration", None), "input_modalities", ("video",)) else None),
        "CohereCompassForConditionalGeneration"),
    "hy_v4_vl": (Family(_hy_v4_vl, (12,), "frames", newline=1), "HYV4VLForConditionalGeneration"),
}


def _needs(cls):
    if not hasattr(T, cls):
        pytest.skip(f"transformers {T.__version__} has no {cls}")


def _missing(name):
    """Why this transformers cannot run family ``name``'s matrix (None when it can): it has no such class."""
    cls = FAMILIES[name][1]
    return None if hasattr(T, cls) else f"transformers {T.__version__} has no {cls}"


#: for tests/test_hf_boundary.py: the families this transformers runs
BUILDERS = {name: f.build for name, (f, _) in FAMILIES.items() if _missing(name) is None}
if hasattr(T, "MiniCPMV4_7ForConditionalGeneration"):
    BUILDERS["minicpmv4_7"] = lambda: _minicpm()


@pytest.fixture(scope="module", params=list(FAMILIES))
def fam(request):
    """(family name, its spec, a stock model); the model is unpatched after every test."""
    family, _ = FAMILIES[request.param]
    if _missing(request.param):
        pytest.skip(_missing(request.param))
    model = _seeded(family.build)
    yield request.param, family, model
    restore(model)


@pytest.fixture(autouse=True)
def _unpatched_after(request):
    yield
    if "fam" in request.fixturenames:
        restore(request.getfixturevalue("fam")[2])


def test_every_design_places_its_positions(fam):
    """Every design runs and every layer rotates with ``ropekit.positions`` of the layout: on the image batch, or on
    the video batch where the family places videos its own way (HY-V4-VL's frames back to back, each row closed by
    its newline column, as its images' rows are); the others split videos into one-frame blocks as Qwen3-VL does,
    which the stock-equivalent tests check on videos."""
    _, family, model = fam
    batches = [(_encoded(model, inputs), layouts) for inputs, layouts in _batches(family)]
    assert_every_design_places_its_positions(model, batches[-1:] if family.newline else batches[:1], DESIGNS)


def test_supported_models_lists_the_families():
    assert set(FAMILIES) <= set(supported_models())


# ---------------------------------------------------------------------------------------------------------------
# family specifics


def test_cosmos3_omni_reads_its_text_models_class():
    """Cosmos3-Omni builds its language model from the text config: one of another family (whose rotary layout
    the adapter does not know) is refused, and the model is left unpatched."""
    _needs("Cosmos3OmniForConditionalGeneration")
    other = T.Cosmos3OmniForConditionalGeneration(T.Cosmos3OmniConfig(
        text_config=dict(TEXT, model_type="qwen2"), vision_config=QWEN_VISION, image_token_id=IMG,
        video_token_id=VID))
    assert type(other.model.language_model).__name__ == "Qwen2Model"
    with pytest.raises(ValueError, match="cosmos3_omni with a Qwen2Model language model is not supported"):
        patch_model(other, "circle")
    assert not is_patched(other)


def test_cohere_compass_layers_without_positions_stay_without():
    """Cohere Compass layer types whose rope_parameters are None take no positions (NoPE): patched, they still get
    none, and the stock-equivalent patch gives the stock logits and greedy tokens bit for bit."""
    from test_hf_families_3axis import IMAGES, make_batch
    model = _seeded(lambda: _cohere_compass(rope_full=None))
    family = FAMILIES["cohere_compass"][0]
    inputs, _ = make_batch(family, IMAGES)
    keep = inputs["attention_mask"].bool()
    kw = dict(max_new_tokens=2, do_sample=False, return_dict_in_generate=True, output_logits=True)
    with torch.no_grad():
        ref, ref_gen = model(**inputs).logits, model.generate(**inputs, **kw)
        patch_model(model, "mrope", continuation="spatial")
        assert torch.equal(model(**inputs).logits[keep], ref[keep])
        gen = model.generate(**inputs, **kw)
    assert torch.equal(gen.sequences, ref_gen.sequences)
    assert all(torch.equal(a, b) for a, b in zip(gen.logits, ref_gen.logits))
    other = _cohere_compass(rope_full=dict(QWEN3_ROPE, mrope_section=[2, 2, 4]))
    with pytest.raises(ValueError, match="different mrope_section"):  # one position tensor serves every layer
        patch_model(other, "circle")
    assert not is_patched(other)


def test_hy_v4_vl_sparse_indexer_is_stock_with_the_stock_positions():
    """HY-V4-VL's indexer rotates its own queries and keys with the layer's cos/sin and keeps the top 4 keys per
    query: with the stock-equivalent patch its choice and the logits are the stock model's, bit for bit, on images
    and videos (each merged row closed by its newline token). (The matrix keeps every key: a top-k choice between
    near-equal scores flips on float noise, so cached steps and a teacher-forced forward of the same weights may
    pick differently, the stock model's too.)"""
    if _missing("hy_v4_vl"):
        pytest.skip(_missing("hy_v4_vl"))
    from test_hf_families_3axis import IMAGES, VIDEOS, make_batch
    family = FAMILIES["hy_v4_vl"][0]
    model = _seeded(lambda: _hy_v4_vl(topk=4))
    batches = [make_batch(family, IMAGES)[0], make_batch(family, VIDEOS, seed=1)[0]]
    with torch.no_grad():
        want = [model(**b).logits for b in batches]
        patch_model(model, "mrope", continuation="spatial")
        for b, logits in zip(batches, want):
            keep = b["attention_mask"].bool()
            assert torch.equal(model(**b).logits[keep], logits[keep])


def test_hunyuan_vl_output_of_a_sample_depends_on_the_samples_before_it():
    """Why HunYuan-VL stays refused after re-examination: its stock get_rope_index numbers images across the whole
    batch (the fourth axis), so the stock logits of a sample change with the samples batched before it. A ropekit
    design places each sample from its own layout (positions are data, per sample), so no design, whatever table
    rule turned the channels, could equal the stock model on padded batches; the first sample, with no image
    before it, is unaffected."""
    from test_hf_families_3axis import _hunyuan_vl
    torch.manual_seed(0)
    model = _hunyuan_vl().eval()
    # as the processor writes an image: <start>, the tower's extra token, 4 x 4 patches merged to 2 x 2 tokens with
    # a newline token closing each row, the closing extra token, <end>
    ids = torch.tensor([[1, 72] + [IMG] * 8 + [73, 2]] * 2)
    pixels = torch.randn(32, 12, generator=torch.Generator().manual_seed(0))

    def run(rows, pix):
        sub = ids[rows]
        with torch.no_grad():
            return model(input_ids=sub, pixel_values=pix, mm_token_type_ids=(sub == IMG).long(),
                         image_grid_thw=torch.tensor([[1, 4, 4]] * len(sub)), attention_mask=torch.ones_like(sub)).logits

    both = run(slice(0, 2), pixels)
    assert torch.equal(both[0], run(slice(0, 1), pixels[:16])[0])
    assert (both[1] - run(slice(1, 2), pixels[16:])[0]).abs().max() > 1e-5  # its image is image 1 in the batch


# ---------------------------------------------------------------------------------------------------------------
# MiniCPM-V 4.7: canvas M-RoPE. The batches are tests/test_canvas_mrope.py's (the processor's token sequences:
# markers, thumbnails, slice rows, video frames, on padded batches), each sample with its layout and canvas options
# written by hand there and checked against transformers' get_rope_index.


def _minicpm(mode="16x", layers=None):
    """``layers``: the text model's layer types (test_canvas_mrope's config: a linear-attention layer, then full
    attention), and the tower's window merger after its first layer so that pixels run in ``"16x"`` mode."""
    import test_canvas_mrope as C
    cfg = C._config(T.MiniCPMV4_7Config, image_start_id=C.IS, image_end_id=C.IE, slice_start_id=C.SS,
                    slice_end_id=C.SE, newline_id=C.NL, downsample_mode=mode,
                    **({} if layers is None else dict(insert_layer_id=0)))
    if layers is not None:
        cfg.text_config.layer_types = list(layers)
    torch.manual_seed(0)
    return ready_to_generate(T.MiniCPMV4_7ForConditionalGeneration(cfg), C.PAD, [C.IMG, C.VID, *C.MARKERS])


def _minicpm_case(case):
    """(inputs with encoded crops, hand-written (layout, canvas options) per sample, kept tokens, downsample mode)."""
    import test_canvas_mrope as C
    from transformers.modeling_outputs import BaseModelOutputWithPooling
    samples, pad, mode, layouts = C.CASES[case]
    inputs = C.batch(samples, pad=pad or "left", mask=pad is not None)
    g = torch.Generator().manual_seed(0)
    encoded = {kind: BaseModelOutputWithPooling(pooler_output=[torch.randn(int((inputs["input_ids"] == tok).sum()),
                                                                           32, generator=g)])
               for kind, tok in (("image", C.IMG), ("video", C.VID)) if (inputs["input_ids"] == tok).any()}
    inputs = {k: v for k, v in inputs.items() if v is not None}
    keep = inputs["attention_mask"].bool() if "attention_mask" in inputs else torch.ones_like(inputs["input_ids"]).bool()
    return (dict(inputs, mm_encoder_outputs=encoded), [(ropekit.Layout.parse(l), o) for l, o in layouts], keep, mode,
            pad)


MINICPM_CASES = ["images", "videos", "4x, unequal slices, pictures side by side", "no attention mask"]


@pytest.mark.parametrize("case", MINICPM_CASES)
def test_minicpmv4_7_canvas_mrope_is_the_stock_model(case):
    """``canvas-mrope`` patched into MiniCPM-V 4.7 gives transformers' positions, rope_deltas, logits and greedy
    generate output bit for bit on padded batches of pictures with slices, video frames and trailing markers, and
    text alone; the positions are ``ropekit.positions`` of each sample's hand-written layout and canvas options.
    (Right-padded prompts: generate is compared where transformers' own rule is right, see docs/hf.md.)"""
    _needs("MiniCPMV4_7ForConditionalGeneration")
    inputs, layouts, keep, mode, pad = _minicpm_case(case)
    model = _minicpm(mode)
    kw = dict(max_new_tokens=2, do_sample=False, output_logits=True, return_dict_in_generate=True)
    text = dict(input_ids=torch.randint(1, 60, (2, 7), generator=torch.Generator().manual_seed(3)))
    with torch.no_grad():
        pos, deltas = model.model.get_rope_index(**{k: v for k, v in inputs.items() if k != "mm_encoder_outputs"})
        ref, ref_text, ref_gen = model(**inputs).logits, model(**text).logits, model.generate(**inputs, **kw)
        model.model.rope_deltas = None
        patch_model(model, "canvas-mrope")
        got, got_deltas = model.model.get_rope_index(**{k: v for k, v in inputs.items() if k != "mm_encoder_outputs"})
        assert torch.equal(got[:, keep], pos[:, keep]) and torch.equal(got_deltas, deltas)
        assert torch.equal(model(**inputs).logits[keep], ref[keep])
        for b, (layout, options) in enumerate(layouts):
            want = ropekit.positions(layout, "canvas-mrope", **options).T
            assert all(torch.equal(p[:, b, keep[b]], want) for p in last_positions(model).values())
        assert torch.equal(model(**text).logits, ref_text)
        gen = model.generate(**inputs, **kw)
    if pad != "right":
        assert torch.equal(gen.sequences, ref_gen.sequences)
        assert all(torch.equal(a, b) for a, b in zip(gen.logits, ref_gen.logits))


def test_minicpmv4_7_every_design_places_its_layout():
    """Every design runs on MiniCPM-V 4.7 and every layer rotates with ``ropekit.positions`` of each sample's layout
    (its crops, the markers as text; canvas-mrope with the canvas options)."""
    _needs("MiniCPMV4_7ForConditionalGeneration")
    model = _minicpm()
    # two samples, no padding: a picture with 2 x 2 one-token slices and a newline trailing it, a small picture
    for case in ("no attention mask",):
        inputs, layouts, keep, _, _ = _minicpm_case(case)
        for design in DESIGNS:
            patch_model(model, design)
            with torch.no_grad():
                assert torch.isfinite(model(**inputs).logits[keep]).all(), design
            for b, (layout, options) in enumerate(layouts):
                want = ropekit.positions(layout, design, **(options if design == "canvas-mrope" else {})).T
                for p in last_positions(model).values():
                    assert torch.equal(p[:, b, keep[b]], want), (case, design, b)


@pytest.mark.parametrize("age", [None, "alternate"])
def test_minicpmv4_7_cached_generation_equals_a_teacher_forced_forward(age):
    """Left-padded pictures with slices and trailing markers: greedy cached decoding gives the logits of one forward
    over the finished sequence, whose positions are each layout followed by the generated text."""
    _needs("MiniCPMV4_7ForConditionalGeneration")
    model = _minicpm()
    inputs, layouts, _, _, _ = _minicpm_case("images")
    patch_model(model, "canvas-mrope" if age is None else "circle", age=age)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=3, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
        n = out.sequences.shape[1] - inputs["input_ids"].shape[1]
        more = lambda t, v: torch.cat([t, torch.full((t.shape[0], n), v)], 1)  # noqa: E731
        full = dict(inputs, input_ids=out.sequences, mm_token_type_ids=more(inputs["mm_token_type_ids"], 0),
                    attention_mask=more(inputs["attention_mask"], 1))
        logits = model(**full).logits
    keep = full["attention_mask"].bool()
    for layer, p in last_positions(model).items():
        design = ropekit.hf.layer_designs(model)[layer]
        for b, (layout, options) in enumerate(layouts):
            want = ropekit.positions(ropekit.Layout([*layout, ropekit.Text(n)]), design,
                                     **(options if design == "canvas-mrope" else {}))
            assert torch.equal(p[:, b, keep[b]], want.T)
    start = inputs["input_ids"].shape[1] - 1
    for k, step in enumerate(out.logits):
        torch.testing.assert_close(step, logits[:, start + k], rtol=1e-5, atol=1e-5)


def test_minicpmv4_7_save_reload_and_refusals(tmp_path):
    """The patch (AGE) saves and reloads; a per-call downsample_mode is refused by name (the patch places the crops
    with the config's)."""
    _needs("MiniCPMV4_7ForConditionalGeneration")
    model = patch_model(_minicpm(), "canvas-mrope", age="alternate")
    inputs, _, keep, _, _ = _minicpm_case("images")
    with torch.no_grad():
        ref = model(**inputs).logits
    model.save_pretrained(tmp_path)
    loaded = ropekit.hf.from_pretrained(tmp_path, T.MiniCPMV4_7ForConditionalGeneration).eval()
    with torch.no_grad():
        assert torch.equal(loaded(**inputs).logits[keep], ref[keep])
        with pytest.raises(ValueError, match="downsample_mode='4x'"):
            model(**inputs, downsample_mode="4x")


def _minicpm_sample(parts, g, merge):
    """One sample as the processor gives it alone (``parts`` as test_canvas_mrope's ``batch`` takes them, crops
    ``merge`` patches a token side): its crops' pixels one NaViT-packed row (4 x 4-pixel patches), a size row each."""
    import test_canvas_mrope as C
    b = C.batch([parts])
    out = {k: b[k] for k in ("input_ids", "attention_mask", "mm_token_type_ids")}
    for sizes, pixels in (("target_sizes", "pixel_values"), ("target_sizes_videos", "pixel_values_videos")):
        if b[sizes] is not None:
            out[sizes], out[pixels] = b[sizes], torch.rand(1, 3, 4, 4 * int(b[sizes].prod(1).sum()), generator=g)
    return out


def _minicpm_pack_samples(merge=2):
    """A picture with 1 x 2 slices and a trailing newline (after an ``<image_id>``), two small pictures of one size
    (other pixels, other text), a two-frame video."""
    import test_canvas_mrope as C
    g = torch.Generator().manual_seed(0)
    image = lambda *a: C.frame("image", *a, merge=merge)  # noqa: E731
    video = C.frame("video", (2, 3), merge=merge)
    return [_minicpm_sample(parts, g, merge) for parts in (
        [[1, 2, C.IDS, 3, C.IDE], image((2, 3), (1, 2), [(1, 2)]), [C.NL, 6, 7]],
        [[9, 10], image((2, 2)), [11, 12]], [[13], image((2, 2)), [14, 15, 16]], [[5], video, video, [8]])]


@pytest.mark.parametrize("patch", [dict(design="canvas-mrope"), dict(design=("circle", "canvas-mrope"),
                                                                      age="alternate")],
                         ids=["stock-equivalent", "circle-canvas-age"])
def test_minicpmv4_7_packed_rows_equal_per_sample_runs(patch):
    """Samples packed into one padding-free row (``PackingCollator``), on a text model of full-attention layers: each
    as the processor gives it alone (its crops one NaViT-packed pixel row). The row joins the pixel rows along the
    patches and the size rows in sample order; each sample keeps its own canvas (the row's positions are
    transformers' ``get_rope_index`` of each sample alone, the text row restarting at 0), and its logits and the loss
    equal its own run: the stock model's for ``canvas-mrope``, the patched model's for an AGE patch. Exchanging the
    pixels of the two same-sized pictures in the row changes their tokens' logits (the row reads each sample's own)."""
    _needs("MiniCPMV4_7ForConditionalGeneration")
    model = _minicpm("4x", layers=["full_attention"] * 2)
    samples = _minicpm_pack_samples()
    stock = patch["design"] == "canvas-mrope"
    if stock:
        want, want_loss = runs_alone(model, samples)
        with torch.no_grad():
            canvases = [model.model.get_rope_index(**{k: v for k, v in s.items() if "pixel" not in k})[0][:, 0]
                        for s in samples]  # (3, L) each: the stock canvas positions of each sample alone
    patch_model(model, **patch)
    if not stock:
        want, want_loss = runs_alone(model, samples)
    row = ropekit.hf.PackingCollator(model)(samples)
    assert row["pixel_values"].shape[:3] == (1, 3, 4) and row["target_sizes"].shape == (5, 2)
    if stock:
        assert torch.equal(row["position_ids"][0, 0], torch.cat([torch.arange(c.shape[1]) for c in canvases]).float())
        assert torch.equal(row["position_ids"][1:, 0], torch.cat(canvases, 1).float())
    with torch.no_grad():
        out = model(**row)
    torch.testing.assert_close(out.logits[0], want, rtol=1e-5, atol=1e-5)
    tokens = sum(s["input_ids"].shape[1] - 1 for s in samples)  # every sample's first token predicts nothing
    torch.testing.assert_close(out.loss, want_loss / tokens, rtol=1e-5, atol=1e-6)
    parts = list(row["pixel_values"].split([s["pixel_values"].shape[-1] for s in samples if "pixel_values" in s], -1))
    parts[1], parts[2] = parts[2], parts[1]
    with torch.no_grad():
        other = model(**dict(row, pixel_values=torch.cat(parts, -1))).logits[0]
    pictures = slice(samples[0]["input_ids"].shape[1], sum(samples[i]["input_ids"].shape[1] for i in range(3)))
    assert (other[pictures] - want[pictures]).abs().max() > 1e-2
    restore(model)


def test_minicpmv4_7_packs_16x_crops_of_several_sizes():
    """``"16x"`` (the tower's window merger on): two samples, each one crop, 4 x 8 and 8 x 4 patches, packed into one
    row equal their own runs, on transformers 5.18 as on 5.24: MiniCPM-V 4.7's window merger takes each crop's own
    size (4.6's reads every crop of a call as the first one's on 5.18, where such a row is refused)."""
    _needs("MiniCPMV4_7ForConditionalGeneration")
    import test_canvas_mrope as C
    model = _minicpm("16x", layers=["full_attention"] * 2)
    g = torch.Generator().manual_seed(6)
    samples = [_minicpm_sample([[5], C.frame("image", grid), [7]], g, 4) for grid in ((1, 2), (2, 1))]
    merger = model.model.vision_tower.vit_merger
    x, sizes = torch.randn(1, 64, merger.embed_dim, generator=g), torch.tensor([[4, 8], [8, 4]])
    patch_model(model, "circle")
    with torch.no_grad():
        apart = torch.cat([merger(x[:, :32], sizes[:1]), merger(x[:, 32:], sizes[1:])], 1)
        torch.testing.assert_close(merger(x, sizes), apart, rtol=1e-5, atol=1e-5)  # the stock merger, both crops
        alone = torch.cat([model(**s).logits[0] for s in samples])
        packed = model(**ropekit.hf.pack(model, samples)).logits[0]
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)
    restore(model)


def test_minicpmv4_7_pack_refusals():
    """As on MiniCPM-V 4.6 and Qwen3.5: a text model with linear-attention layers (as the checkpoints are built)
    refuses a packed row by the layer type, under flash attention too (tests/test_hf_families_round3_minicpm46.py
    shows the stock layer reading across the boundary). ``pack`` refuses a per-call ``downsample_mode`` (the patch
    places the crops with the config's) and pixels that are not one NaViT-packed row per sample."""
    _needs("MiniCPMV4_7ForConditionalGeneration")
    model = _minicpm("4x", layers=["linear_attention", "full_attention"])
    samples = _minicpm_pack_samples()[1:3]
    patch_model(model, "canvas-mrope")
    with torch.no_grad(), pytest.raises(ValueError, match=r"packed rows are not supported with attention layer "
                                                        r"types \['linear_attention'\]"):
        model(**ropekit.hf.pack(model, samples))
    text = model.model.language_model
    text.config._attn_implementation = "flash_attention_2"  # refused before any attention runs
    try:
        with torch.no_grad(), pytest.raises(ValueError, match=r"types \['linear_attention'\]"):
            model(**ropekit.hf.pack(model, samples, return_flash_attn_kwargs=True))
    finally:
        text.config._attn_implementation = "sdpa"
    with pytest.raises(ValueError, match="got downsample_mode='16x' for this call"):
        ropekit.hf.pack(model, [dict(s, downsample_mode="16x") for s in samples])
    two_rows = dict(samples[0], pixel_values=samples[0]["pixel_values"].expand(2, -1, -1, -1))
    with pytest.raises(ValueError, match="`pixel_values` have shapes"):
        ropekit.hf.pack(model, [two_rows, samples[1]])
    restore(model)


def _prerotated_reference(sections_hwt, positions, base, half):
    """Angles ``(N, half)`` of transformers' Command A Compass rotary before 5.21, recomputed in float64 from its
    steps: the ``h + w`` highest frequencies reordered even-indexed first, then odd-indexed, the lowest ``t`` kept;
    the angles of all three axes for every frequency; chunk ``i`` of ``[h, w, t]`` then read from axis ``(i + 1) % 3``
    (positions are ``(t, h, w)``)."""
    h, w, t = sections_hwt
    freqs = base ** (-torch.arange(0, 2 * half, 2, dtype=torch.float64) / (2 * half))
    spatial = freqs[:h + w]
    reordered = torch.cat([spatial[0::2], spatial[1::2], freqs[h + w:]])
    angles = positions.double().t()[:, :, None] * reordered  # (3, N, half)
    chunks = angles.split([h, w, t], dim=-1)
    return torch.cat([chunks[i][(i + 1) % 3] for i in range(3)], dim=-1)


@pytest.mark.parametrize("sections", [[22, 22, 20], [2, 3, 3], [3, 2, 3], [0, 5, 3]])
def test_compass_prerotated_allocation_is_the_old_compass_rotary(sections):
    """The ``compass-prerotated`` allocation (sections ``[t, h, w]``) turns pair j at transformers' pre-5.21
    Compass frequency and axis for the checkpoint's ``mrope_section`` ``[h, w, t]``, odd splits included."""
    h, w, t = sections
    half = h + w + t
    W = ropekit.frequency_matrix("compass-prerotated", 2 * half, 3, base=1e4, sections=[t, h, w])
    positions = torch.randint(0, 50, (7, 3)).double()
    want = _prerotated_reference(sections, positions, 1e4, half)
    torch.testing.assert_close(positions @ W.double(), want, rtol=1e-6, atol=1e-5)
    # longrope's factors belong to the spectrum's frequencies, wherever the allocation puts them
    longrope = dict(rope_type="longrope", long_factor=[1.0 + j for j in range(half)], short_factor=[1.0] * half,
                    original_max_position_embeddings=16, factor=4.0)
    scaled, _ = ropekit.scale_frequencies(W, longrope, base=1e4, seq_len=40, max_position_embeddings=64)
    spectrum, _ = ropekit.scaled_inv_freq(2 * half, longrope, base=1e4, seq_len=40, max_position_embeddings=64)
    spatial = torch.arange(h + w)
    order = torch.cat([spatial[0::2], spatial[1::2], torch.arange(h + w, half)])
    torch.testing.assert_close(scaled.sum(0), spectrum[order], rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match="no default split"):
        ropekit.frequency_matrix("compass-prerotated", 2 * half, 3)
    with pytest.raises(ValueError, match="summing to rotary_dim/2"):
        ropekit.frequency_matrix("compass-prerotated", 2 * half, 3, sections=[t, h, w + 1])


def _other_side_of_5_21(monkeypatch):
    """Make ropekit read the installed transformers as a release on the other side of Compass's 5.21 change."""
    old = cohere_compass.prerotated()
    monkeypatch.setattr(boundary, "transformers_version", lambda: "5.24.0" if old else "5.19.0")
    assert cohere_compass.prerotated() is not old


#: (design, its arguments) restored across 5.21: a design taking the family's layout (AGE), the stock-equivalent
#: design, one taking no M-RoPE layout (its checkpoint must still restore under the flag its config carries), and an
#: explicit allocation
ACROSS = [("circle", dict(age="alternate", alpha=0.5)), ("mrope", dict(continuation="spatial")), ("vanilla", {}),
          ("circle", dict(allocation="mrope"))]


@pytest.mark.parametrize("design, kwargs", ACROSS, ids=["circle-age", "stock-equivalent", "vanilla", "explicit"])
def test_compass_checkpoint_restores_the_layout_it_was_patched_with(design, kwargs, tmp_path, monkeypatch):
    """Compass's rotary changed layout at transformers 5.21 (pre-permuted before, interleaved after). A checkpoint
    records the layout it was patched (and trained) with and restores it on a release with the other layout, its
    config's ``mrope_interleaved`` saying that layout: the reloaded model's logits are the saved model's, its tables
    not the installed release's native ones. Even the stock-equivalent patch is then no stock model of the installed
    release, so the reloaded model saves in ropekit's form: loaded again through transformers' Auto class, it is
    the saved model still."""
    from test_hf_families_3axis import IMAGES, make_batch
    family = FAMILIES["cohere_compass"][0]
    model = _seeded(_cohere_compass)
    inputs, _ = make_batch(family, IMAGES)
    here = ADAPTERS["cohere_compass"].native_allocation
    with monkeypatch.context() as m:
        _other_side_of_5_21(m)
        there = ADAPTERS["cohere_compass"].native_allocation
        for rope in model.config.text_config.rope_parameters.values():  # the flag as that release's config says
            rope["mrope_interleaved"] = there == "interleaved"
        patch_model(model, design, **kwargs)
        assert model.config.ropekit["native"] == there
    ref = _logits_of(model, inputs)
    model.save_pretrained(tmp_path / "there")
    loaded = ropekit.hf.from_pretrained(tmp_path / "there", type(model)).eval()
    assert here != there and loaded.config.ropekit == model.config.ropekit
    assert torch.equal(_logits_of(loaded, inputs), ref)
    loaded.save_pretrained(tmp_path / "again")
    again = T.AutoModelForImageTextToText.from_pretrained(tmp_path / "again").eval()
    assert is_patched(again) and torch.equal(_logits_of(again, inputs), ref)
    if design == "circle" and "allocation" not in kwargs:  # the layout matters: patched anew, the logits differ
        for rope in loaded.config.text_config.rope_parameters.values():
            rope["mrope_interleaved"] = here == "interleaved"
        patch_model(loaded, design, **kwargs)
        assert set(loaded.config.ropekit["allocations"].values()) == {here}
        assert not torch.allclose(_logits_of(loaded, inputs), ref, atol=1e-4)


def _logits_of(model, inputs):
    with torch.no_grad():
        return model(**inputs).logits[inputs["attention_mask"].bool()]


def test_compass_before_5_21_refuses_what_its_rotary_does_not_pre_permute(monkeypatch):
    """Before 5.21 Compass pre-permutes 'default' rope tables only, whatever ``mrope_interleaved`` says: another
    rope type, or the flag set (on a fresh patch), is refused by name, the model left stock."""
    if not cohere_compass.prerotated():
        _other_side_of_5_21(monkeypatch)
    linear = dict(_compass_rope(QWEN3_ROPE), rope_type="linear", factor=2.0)
    scaled = _cohere_compass(rope_full=linear)
    flagged = _cohere_compass()
    flagged.config.text_config.rope_parameters["sliding_attention"]["mrope_interleaved"] = True
    with pytest.raises(ValueError, match="pre-permutes the frequencies of 'default' rope tables only"):
        patch_model(scaled, "circle")
    patch_model(scaled, "vanilla")  # a design that does not take the family's layout: any rope type
    assert is_patched(scaled)
    unpatch_model(scaled)
    with pytest.raises(ValueError, match=r"\['mrope_interleaved'\] is True.*does not interleave"):
        patch_model(flagged, "circle")
    assert not is_patched(scaled) and not is_patched(flagged)
