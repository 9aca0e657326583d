"""ropekit designs inside the 1-D families placed like LLaVA: InternVL, Gemma 3, Idefics3, SmolVLM, Mistral 3,
PaliGemma and Aya Vision (tiny random models built from configs).

References: the stock transformers model with the same weights (``vanilla`` must give its logits and ``generate``
output bit for bit, and the attention masks its layers receive must stay the stock ones), each design's
``ropekit.positions`` on the layout the model sees (every tile, crop or image one grid), the V2PE paper's position
rule on InternVL, transformers' own feature reshaping (which patches each image token holds), one teacher-forced
forward over the whole sequence (cached generation), gradient checkpointing, and a save/reload round trip.
"""
import os

os.environ["HF_HUB_OFFLINE"] = "1"

from dataclasses import dataclass
from typing import Callable

import pytest
import torch
import transformers as T

import ropekit
from ropekit import Image, Layout, Text
from ropekit.hf import is_patched, last_positions, layer_designs, patch_model, supported_models

from hf_compat import assert_checkpointing_keeps_gradients, ready_to_generate, restore
from test_hf_llava import pad_rows, reference_positions

IMG, PAD, BRK, END = 70, 0, 73, 74  # image token; pad; Mistral 3's [IMG_BREAK] and [IMG_END]
DESIGNS = [d for d in ropekit.designs() if ropekit.get_design(d).allocation != "mhrope"]
TEXT = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
            vocab_size=80)
VISION = dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2, image_size=8,
              patch_size=2)  # 4 x 4 patches per tile or image
S = 2  # tokens per side of a tile / image grid (4 patches pixel-shuffled or pooled by 2)


def _internvl(**kw):
    return T.InternVLForConditionalGeneration(T.InternVLConfig(
        vision_config=VISION, text_config=dict(TEXT, model_type="qwen2"), image_token_id=IMG, image_seq_length=S * S,
        **kw))


def _gemma3():
    # three layers: sliding, global, sliding; the global table scaled linearly, as on the larger checkpoints
    rope = {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    return T.Gemma3ForConditionalGeneration(T.Gemma3Config(
        vision_config=VISION, text_config=dict(TEXT, head_dim=16, num_hidden_layers=3, sliding_window=4,
                                               sliding_window_pattern=2, rope_parameters=rope),
        mm_tokens_per_image=S * S, image_token_index=IMG, boi_token_index=71, eoi_token_index=72))


def _idefics3():
    return T.Idefics3ForConditionalGeneration(T.Idefics3Config(
        vision_config=VISION, text_config=dict(TEXT, model_type="llama"), image_token_id=IMG, scale_factor=2))


def _smolvlm():
    return T.SmolVLMForConditionalGeneration(T.SmolVLMConfig(
        vision_config=VISION, text_config=dict(TEXT, model_type="llama"), image_token_id=IMG, scale_factor=2))


def _mistral3():
    return T.Mistral3ForConditionalGeneration(T.Mistral3Config(
        vision_config=dict(VISION, model_type="pixtral", image_size=16, head_dim=8),
        text_config=dict(TEXT, model_type="mistral", head_dim=16), image_token_id=IMG, spatial_merge_size=2,
        vision_feature_layer=-1))


def _paligemma():
    return T.PaliGemmaForConditionalGeneration(T.PaliGemmaConfig(
        vision_config=dict(VISION, patch_size=4, projection_dim=32),
        text_config=dict(TEXT, model_type="gemma", head_dim=16),
        image_token_id=IMG, projection_dim=32))


def _aya_vision():
    return T.AyaVisionForConditionalGeneration(T.AyaVisionConfig(
        vision_config=dict(VISION, model_type="siglip_vision_model"),
        text_config=dict(TEXT, model_type="cohere2", head_dim=16, sliding_window=4,
                         layer_types=["sliding_attention", "full_attention"], eos_token_id=1),
        image_token_id=IMG, downsample_factor=2))


# ---------------------------------------------------------------------------------------------------------------
# inputs: samples as segments ("T", n) text and ("I", spec) an image; each family writes an image as its processor
# does (the begin/end and tile markers as text tokens) and gives the ropekit layout of what it wrote


def _text(g, n):
    return torch.randint(1, 60, (n,), generator=g).tolist()


def _grid_tokens(n=1):
    return [IMG] * (S * S * n), [Image(S, S)] * n


def _internvl_image(tiles):  # <img>, the tiles' tokens (tiles, then the thumbnail), </img>
    ids, lay = _grid_tokens(tiles)
    return [61] + ids + [62], [Text(1)] + lay + [Text(1)], tiles


def _gemma3_image(_):  # <start_of_image>, the pooled grid, <end_of_image>
    ids, lay = _grid_tokens()
    return [71] + ids + [72], [Text(1)] + lay + [Text(1)], 1


def _idefics3_image(rows_cols):  # per tile <fake><row_r_col_c> + tokens, "\n" per row; "\n<fake><global-img>" + ...
    rows, cols = rows_cols
    ids, lay = [], []
    for _ in range(rows):
        for _ in range(cols):
            ids += [63, 64] + [IMG] * S * S
            lay += [Text(2), Image(S, S)]
        ids, lay = ids + [65], lay + [Text(1)]
    if rows:
        ids, lay = ids + [65], lay + [Text(1)]
    return ids + [63, 66] + [IMG] * S * S + [63], lay + [Text(2), Image(S, S), Text(1)], rows * cols + 1


def _mistral3_image(rows_cols):  # each row: cols tokens then [IMG_BREAK]; the last row ends in [IMG_END]
    rows, cols = rows_cols
    ids = sum(([IMG] * cols + [BRK] for _ in range(rows)), [])
    ids[-1] = END
    return ids, [Image(rows, cols + 1)], (rows, cols)


def _aya_image(tiles):  # <|START_OF_IMG|>, TILE_i + tokens per tile (when several), TILE_GLOBAL + tokens, <|END|>
    ids, lay = [61], [Text(1)]
    for _ in range(tiles - 1 if tiles > 1 else 0):
        ids, lay = ids + [64] + [IMG] * S * S, lay + [Text(1), Image(S, S)]
    ids, lay = ids + [65] + [IMG] * S * S + [62], lay + [Text(1), Image(S, S), Text(1)]
    return ids, lay, tiles


@dataclass(frozen=True)
class Family:
    build: Callable
    image: Callable  # spec -> (ids, layout, what the pixels need)
    samples: list
    origin: float = 0.0  # the family's first position (PaliGemma counts from 1)
    #: the image inputs of a batch: (what each image needs, per sample its images' needs summed, generator) ->
    #: dict; None: the families below, built by name in make_batch
    pixels: Callable = None
    counts_padding: bool = False  # the stock model counts a row's leading padding (EXAONE 4.5): token i at i
    #: the forward's token-type argument, filled as the processor fills it (1 on image tokens), or None
    token_types: str = None


FAMILIES = {
    "internvl": Family(_internvl, _internvl_image, [[("T", 3), ("I", 3), ("T", 2)], [("T", 2), ("I", 1), ("T", 1),
                                                                                      ("I", 1), ("T", 2)]]),
    "gemma3": Family(_gemma3, _gemma3_image, [[("T", 3), ("I", 0), ("T", 2), ("I", 0), ("T", 1)],
                                              [("T", 2), ("I", 0), ("T", 3)]]),
    "idefics3": Family(_idefics3, _idefics3_image, [[("T", 2), ("I", (1, 2)), ("T", 2)], [("T", 3), ("I", (0, 0)),
                                                                                         ("T", 1)]]),
    "smolvlm": Family(_smolvlm, _idefics3_image, [[("T", 2), ("I", (2, 1)), ("T", 2)], [("T", 1), ("I", (0, 0)),
                                                                                       ("T", 2)]]),
    "mistral3": Family(_mistral3, _mistral3_image, [[("T", 2), ("I", (4, 2)), ("T", 2), ("I", (1, 1)), ("T", 1)],
                                                    [("T", 1), ("I", (2, 3)), ("T", 3)]]),
    "paligemma": Family(_paligemma, None, [[("I", 1), ("T", 5)], [("I", 2), ("T", 3)]], origin=1.0),
    "aya_vision": Family(_aya_vision, _aya_image, [[("T", 2), ("I", 3), ("T", 2)], [("T", 3), ("I", 1),
                                                                                                   ("T", 1)]]),
}
BUILDERS = {name: f.build for name, f in FAMILIES.items()}  # for tests/test_hf_boundary.py


def make_batch(name, pad="left", seed=0, suffix=0):
    """Model inputs for the family's padded samples and, per sample, the layout the model sees.

    ``suffix``: PaliGemma samples end in that many suffix tokens (``token_type_ids`` 1, attended causally)."""
    family = FAMILIES[name]
    g = torch.Generator().manual_seed(seed)
    rows, layouts, images, per_sample = [], [], [], []
    for segs in family.samples:
        ids, lay, count = [], [], 0
        for seg in segs:
            if seg[0] == "T":
                ids, lay = ids + _text(g, seg[1]), lay + [Text(seg[1])]
            elif name == "paligemma":  # the image prefix (seg[1] images), then the prompt
                ids, lay = ids + [IMG] * S * S * seg[1], lay + [Image(S, S)] * seg[1]
                images.append(seg[1])
            else:
                i_ids, i_lay, need = family.image(seg[1])
                ids, lay = ids + i_ids, lay + i_lay
                images.append(need)
                count += need if isinstance(need, int) else 1
        if name == "paligemma" and suffix:
            ids, lay = ids + _text(g, suffix), lay + [Text(suffix)]
        rows.append(ids)
        layouts.append(Layout(lay))
        per_sample.append(count)
    input_ids, mask = pad_rows(rows, pad)
    inputs = dict(input_ids=input_ids, attention_mask=mask)
    if family.pixels is not None:
        inputs.update(family.pixels(images, per_sample, g))
    elif name in ("internvl", "aya_vision", "paligemma"):  # one pixel row per tile / image
        inputs["pixel_values"] = torch.randn(sum(images), 3, 8, 8, generator=g)
    elif name == "gemma3":
        inputs["pixel_values"] = torch.randn(len(images), 3, 8, 8, generator=g)
        inputs["token_type_ids"] = (input_ids == IMG).long()
    elif name in ("idefics3", "smolvlm"):  # samples x tiles, all-zero tiles pad
        pixels = torch.zeros(len(rows), max(per_sample), 3, 8, 8)
        for b, n in enumerate(per_sample):
            pixels[b, :n] = torch.randn(n, 3, 8, 8, generator=g)
        inputs["pixel_values"] = pixels
    elif name == "mistral3":  # 4 pixels per token side (patch 2, merge 2)
        inputs["image_sizes"] = torch.tensor([[4 * r, 4 * c] for r, c in images])
        inputs["pixel_values"] = torch.randn(len(images), 3, 16, 16, generator=g)
    if family.token_types:
        inputs[family.token_types] = (input_ids == IMG).long()
    if name == "paligemma":  # 0 on the prefix (images and prompt), 1 on the suffix
        types, _ = pad_rows([[0] * (len(r) - suffix) + [1] * suffix for r in rows], pad)
        inputs["token_type_ids"] = types
    return inputs, layouts


def expected(name, inputs, layouts, design, extra=0, **options):
    """Each sample's ``ropekit.positions`` (its layout, then ``extra`` text tokens) on its tokens, from the family's
    first position."""
    if extra:
        layouts = [Layout(list(lay.segments) + [Text(extra)]) for lay in layouts]
    out = reference_positions(inputs, layouts, design, **options) + FAMILIES[name].origin
    if FAMILIES[name].counts_padding:  # each row shifted by its leading padding, as the stock model counts it
        mask = inputs["attention_mask"]
        leading = (mask.cumsum(-1) == 0).sum(-1)
        out = torch.where(mask.bool()[None], out + leading[None, :, None], out)
    return out


def _seeded(build):
    torch.manual_seed(0)
    return ready_to_generate(build(), PAD, [IMG])


def family_fixture(table: dict, prepare: Callable = lambda family: _seeded(family.build)):
    """The ``fam`` fixture over the families of ``table``: (family name, a stock model from ``prepare(family)``,
    which may skip), unpatched after every test. Modules running the shared matrix on families of their own set
    ``fam = family_fixture(THEIRS)`` and import :func:`_unpatched_after`."""

    @pytest.fixture(scope="module", params=list(table))
    def fam(request):
        model = prepare(table[request.param])
        yield request.param, model
        restore(model)

    return fam


fam = family_fixture(FAMILIES)


@pytest.fixture(autouse=True)
def _unpatched_after(request):
    yield
    if "fam" in request.fixturenames:
        restore(request.getfixturevalue("fam")[1])


def _text_model(model):
    inner = getattr(model, "model", model)  # Llama 4's generation model is its multimodal model
    text = getattr(inner, "language_model", None) or inner.text_model
    return text if hasattr(text, "layers") else text.model  # Llama 4: a causal LM around the text model


def _logits(model, inputs):
    with torch.no_grad():
        return model(**inputs).logits


def _encoded(model, inputs):
    """``inputs`` with the images encoded once (``mm_encoder_outputs``, as ``generate`` passes them)."""
    out = dict(inputs)
    encoder_args = {k: out.pop(k) for k in ("pixel_values", "image_sizes", "pixel_attention_mask",
                                                          "image_token_pooling") if k in out}
    # kept for the forward too: Gemma 4's image_position_ids, EXAONE 4.5's image_grid_thw, LFM2-VL's spatial_shapes,
    # VideoLLaMA3's image_grid_thw and image_merge_sizes, Molmo2's image_grids, MiniCPM-V 4.6's target_sizes
    keep = ("image_position_ids", "image_grid_thw", "spatial_shapes", "image_merge_sizes", "image_grids",
            "target_sizes")
    encoder_args.update({k: out[k] for k in keep if k in out})
    with torch.no_grad():
        bare = getattr(model, "model", model)
        encoded = {"image": bare.get_image_features(**encoder_args, return_dict=True)}
        if "pixel_values_videos" in out:  # videos too (EXAONE 4.5), as generate encodes them
            encoded["video"] = bare.get_video_features(out.pop("pixel_values_videos"), out["video_grid_thw"],
                                                       return_dict=True)
    return dict(out, mm_encoder_outputs=encoded)


# ---------------------------------------------------------------------------------------------------------------
# the stock-equivalent design is the stock model


def test_supported_models_lists_the_families():
    assert set(FAMILIES) <= set(supported_models())


def test_vanilla_is_the_stock_model(fam):
    """Left-padded images: the stock logits and generate output bit for bit (stock positions as generate counts
    them); text only: the stock model under vanilla and under a multimodal design (text is the diagonal)."""
    name, model = fam
    inputs, _ = make_batch(name)
    keep = inputs["attention_mask"].bool()
    text = torch.randint(1, 60, (2, 7), generator=torch.Generator().manual_seed(1))
    stock_pos = (inputs["attention_mask"].cumsum(-1) - 1).clamp(min=0) + int(FAMILIES[name].origin)
    if FAMILIES[name].counts_padding:  # its own rule, in its forward and its generate: token i at i
        stock_pos = torch.arange(stock_pos.shape[1]).expand_as(stock_pos)
    kw = dict(max_new_tokens=3, do_sample=False, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        ref = model(**inputs, position_ids=stock_pos).logits
        gref = model.generate(**inputs, **kw)
        tref = _logits(model, dict(input_ids=text))
        tgref = model.generate(input_ids=text, max_new_tokens=3, do_sample=False)
        patch_model(model, "vanilla")
        assert torch.equal(_logits(model, inputs)[keep], ref[keep])
        got = model.generate(**inputs, **kw)
        assert torch.equal(got.sequences, gref.sequences)
        assert all(torch.equal(a, b) for a, b in zip(got.logits, gref.logits))
        for design in ("vanilla", "circle"):
            patch_model(model, design)
            assert torch.equal(_logits(model, dict(input_ids=text)), tref)
            assert torch.equal(model.generate(input_ids=text, max_new_tokens=3, do_sample=False), tgref)


def test_every_design_places_its_positions(fam):
    """Every design runs, and every layer rotates with ``ropekit.positions`` of the layout: from the pixels (and the
    sizes) once, then from the encoded images ``generate`` hands the first forward."""
    name, model = fam
    inputs, layouts = make_batch(name)
    keep = inputs["attention_mask"].bool()
    encoded = _encoded(model, inputs)
    layers = len(_text_model(model).layers)
    for i, design in enumerate(DESIGNS):
        patch_model(model, design)
        out = _logits(model, inputs if i == 0 else encoded)
        assert torch.isfinite(out[keep]).all(), design
        want = expected(name, inputs, layouts, design)
        got = last_positions(model)
        assert sorted(got) == list(range(layers))
        for p in got.values():
            assert torch.equal(p[:, keep], want[:, keep]), design


# ---------------------------------------------------------------------------------------------------------------
# cached generation, training, saving


def _full(name, inputs, sequences):
    """The prompt with the generated tokens, as one teacher-forced input (generated tokens are text; on PaliGemma
    they are suffix tokens, as its generate marks them)."""
    n = sequences.shape[1] - inputs["input_ids"].shape[1]
    ones = torch.ones(sequences.shape[0], n, dtype=torch.long)
    full = dict(inputs, input_ids=sequences, attention_mask=torch.cat([inputs["attention_mask"], ones], 1))
    if "token_type_ids" in inputs:
        full["token_type_ids"] = torch.cat([inputs["token_type_ids"], ones * int(name == "paligemma")], 1)
    if "mm_token_type_ids" in inputs:
        full["mm_token_type_ids"] = torch.cat([inputs["mm_token_type_ids"], ones * 0], 1)
    return full, n


@pytest.mark.parametrize("age", [None, "alternate"])
def test_cached_generation_equals_a_teacher_forced_forward(fam, age):
    name, model = fam
    inputs, layouts = make_batch(name)
    patch_model(model, ("v2pe" if name == "internvl" else "circle", "mrope"), age=age or "all")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=3, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
        full, n = _full(name, inputs, out.sequences)
        logits = model(**full).logits
    keep = full["attention_mask"].bool()
    for layer, p in last_positions(model).items():
        want = expected(name, full, layouts, layer_designs(model)[layer], extra=n)
        assert torch.equal(p[:, keep], want[:, keep])
    start = inputs["input_ids"].shape[1] - 1
    for k, step in enumerate(out.logits):
        torch.testing.assert_close(step, logits[:, start + k], rtol=1e-5, atol=1e-5)


def test_checkpointed_training_step(fam):
    """AGE training: the loss backpropagates, and gradient checkpointing gives the same gradients."""
    name, model = fam
    inputs, _ = make_batch(name, pad="right", suffix=2)
    ids = inputs["input_ids"]
    labels = ids.masked_fill((inputs["attention_mask"] == 0) | (ids == IMG), -100)
    patch_model(model, ("circle", "mrope"), age="alternate")

    assert_checkpointing_keeps_gradients(model, inputs, labels, _text_model(model))


def test_save_pretrained_and_reload_restore_the_patch(fam, tmp_path):
    name, model = fam
    inputs, _ = make_batch(name)
    keep = inputs["attention_mask"].bool()
    stock = _logits(model, inputs)
    patch_model(model, "circle", age="alternate", alpha=0.5)
    ref = _logits(model, inputs)
    assert not torch.allclose(ref[keep], stock[keep])
    model.save_pretrained(tmp_path)
    plain = ropekit.hf.load_stock(str(tmp_path), type(model)).eval()  # the stock model only on purpose
    assert not is_patched(plain)
    assert torch.equal(_logits(plain, inputs), stock)
    loaded = ropekit.hf.from_pretrained(tmp_path, type(model)).eval()  # the family's class, patched from the record
    assert layer_designs(loaded) == layer_designs(model)
    assert torch.equal(_logits(loaded, inputs), ref)


# ---------------------------------------------------------------------------------------------------------------
# the token grids are the models' own: which patches each image token holds


def _patch_ids(side):
    return torch.arange(side * side, dtype=torch.float32)  # patch (r, c) carries r * side + c


def _windows(tokens, side):
    """Per token of a grid (row-major), the (rows, cols) of the patches it holds."""
    return [(sorted({int(v) // side for v in t}), sorted({int(v) % side for v in t})) for t in tokens]


def _row_major(grid, window):
    return [([r * window + i for i in range(window)], [c * window + i for i in range(window)])
            for r in range(grid) for c in range(grid)]


@pytest.mark.parametrize("name", ["internvl", "idefics3", "smolvlm", "aya_vision", "gemma3", "mistral3"])
def test_each_image_token_holds_the_patches_of_its_grid_cell(name):
    """Marker features through the family's own merging (pixel shuffle, pooling, patch merger): token k of a tile
    holds the 2 x 2 patch window at row k // S, column k % S, the grid ropekit places."""
    model = _seeded(FAMILIES[name].build)
    side = 4
    f = _patch_ids(side)
    if name == "internvl":
        out = model.model.pixel_shuffle(f.view(1, side, side, 1), 0.5).reshape(-1, 4)
    elif name in ("idefics3", "smolvlm"):
        out = model.model.connector.pixel_shuffle(f.view(1, side * side, 1), 2).reshape(-1, 4)
    elif name == "aya_vision":
        out = model.model.multi_modal_projector.pixel_shuffle(f.view(1, side * side, 1)).reshape(-1, 4)
    elif name == "gemma3":  # average pooling: a token's mean is its window's mean; check the window by its corners
        pooled = model.model.multi_modal_projector.avg_pool(f.view(1, 1, side, side)).flatten()
        want = torch.tensor([sum(r * side + c for r in rs for c in cs) / 4 for rs, cs in _row_major(S, 2)])
        assert torch.equal(pooled, want)
        return
    else:  # Mistral 3: the patch merger's unfold of a 4 x 6 patch image gives a 2 x 3 token grid
        h, w = 4, 6
        merged = torch.nn.functional.unfold(torch.arange(h * w, dtype=torch.float32).view(1, 1, h, w), 2, stride=2)
        tokens = merged.view(4, -1).t()
        assert [(sorted({int(v) // w for v in t}), sorted({int(v) % w for v in t})) for t in tokens] == [
            ([2 * r, 2 * r + 1], [2 * c, 2 * c + 1]) for r in range(2) for c in range(3)]
        return
    assert _windows(out, side) == _row_major(S, 2)


# ---------------------------------------------------------------------------------------------------------------
# family specifics


@pytest.mark.parametrize("increment", [1 / 16, 1 / 4])
def test_internvl_v2pe_is_the_papers_rule(increment):
    """V2PE (Ge et al. 2024), the rule InternVL was fine-tuned with: each token one past the previous one, each
    visual token (InternVL's image-context token, tiles and thumbnail alike) only ``increment`` past it; the first
    token at 0. Computed here token by token from the input ids, independent of ropekit's layouts."""
    model = _seeded(_internvl)
    inputs, _ = make_batch("internvl")
    patch_model(model, "v2pe", increment=increment)
    _logits(model, inputs)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    want = torch.zeros(ids.shape, dtype=torch.float64)
    for b in range(ids.shape[0]):
        p = -1.0
        for i in range(ids.shape[1]):
            if mask[b, i]:
                p += increment if ids[b, i] == IMG else 1.0
                want[b, i] = p
    keep = mask.bool()
    for pos in last_positions(model).values():
        assert torch.equal(pos[0][keep].double(), want[keep])


def _layer_masks(model, inputs):
    """The attention mask each decoder layer receives in one forward."""
    seen = {}
    hooks = [layer.register_forward_pre_hook(lambda m, a, kw, i=i: seen.__setitem__(i, kw.get("attention_mask")),
                                             with_kwargs=True)
             for i, layer in enumerate(_text_model(model).layers)]
    try:
        _logits(model, inputs)
    finally:
        for h in hooks:
            h.remove()
    return seen


@pytest.mark.parametrize("name", ["gemma3", "paligemma"])
def test_bidirectional_masks_stay_the_stock_ones(name):
    """Gemma 3's bidirectional attention within each image and PaliGemma's bidirectional prefix: under a
    multimodal design every layer gets exactly the stock mask (the patch changes positions only)."""
    model = _seeded(FAMILIES[name].build)
    inputs, _ = make_batch(name, suffix=2)
    stock = _layer_masks(model, inputs)
    patch_model(model, "circle", age="alternate")
    got = _layer_masks(model, inputs)
    assert stock.keys() == got.keys()
    for i in stock:
        assert torch.equal(got[i], stock[i]), i
    # the bidirectional part is there: the first image token of sample 0 sees a later token of its block
    images = (inputs["input_ids"][0] == IMG).nonzero()[:, 0]
    first = int(images[0])
    later = int(images[S * S - 1]) if name == "gemma3" else int((inputs["token_type_ids"][0] == 0).nonzero()[-1])
    for mask in got.values():
        assert mask.dtype == torch.bool and bool(mask[0, 0, first, later]) and not bool(mask[0, 0, first, -1])


def test_internvl_refuses_a_cls_keeping_strategy():
    """A tile's features keep the tower's CLS feature under strategy 'full': no square grid (the model cannot
    reshape them either), so the patch is refused before anything changes."""
    model = _seeded(lambda: _internvl(vision_feature_select_strategy="full"))
    with pytest.raises(ValueError, match="'full' keeps the tower's CLS feature.*use 'default'"):
        patch_model(model, "v2pe")
    assert not is_patched(model)


def test_mistral3_row_ends_are_the_grids_last_column():
    """Each row's [IMG_BREAK] (and the last row's [IMG_END]) is the image block's last column; an image whose rows
    are not so closed is refused, as are pixels without their sizes."""
    model = _seeded(_mistral3)
    inputs, _ = make_batch("mistral3")
    patch_model(model, "mrope")
    _logits(model, inputs)
    ids = inputs["input_ids"][1]
    pos = last_positions(model)[0][:, 1]
    ends = (ids == BRK) | (ids == END)
    first = int((ids == IMG).nonzero()[0])
    cells = pos[1:, first:first + 2 * 4].view(2, 2, 4)  # (h, w) of 2 rows x (3 + 1) columns
    assert torch.equal(cells[0] - cells[0, 0, 0], torch.tensor([[0.0] * 4, [1.0] * 4]))
    assert torch.equal(cells[1] - cells[1, 0, 0], torch.tensor([[0.0, 1, 2, 3]] * 2))
    assert bool(ends[first + 3]) and bool(ends[first + 7])
    broken = inputs["input_ids"].clone()
    broken[broken == BRK] = IMG  # rows run on into each other: no row ends
    broken[1, first + 7] = 5
    with pytest.raises(ValueError, match="not laid out as the processor writes it"):
        model(**dict(inputs, input_ids=broken))
    with pytest.raises(ValueError, match="without `image_sizes`"):
        model(**{k: v for k, v in inputs.items() if k != "image_sizes"})


def test_idefics3_tiles_must_be_the_configs_size():
    model = _seeded(_idefics3)
    inputs, _ = make_batch("idefics3")
    patch_model(model, "circle")
    big = torch.nn.functional.pad(inputs["pixel_values"], (0, 4, 0, 4))
    with pytest.raises(ValueError, match=r"tiles of \(12, 12\) pixels.*image_size \(8 x 8\)"):
        model(**dict(inputs, pixel_values=big))


def test_paligemma_generate_through_an_unpatched_wrapper_is_refused():
    """Patching only the bare model leaves ``generate`` stock: it hands over PaliGemma's stock positions (counted
    from 1), which would silently give the stock placement; they are refused with images."""
    model = _seeded(_paligemma)
    inputs, _ = make_batch("paligemma")
    patch_model(model.model, "circle")
    with pytest.raises(ValueError, match=r"patch_model\(model\), not patch_model\(model.model\)"):
        model.generate(**inputs, max_new_tokens=1, do_sample=False)


def test_llava_with_a_cohere_language_model_gets_cohere_tables():
    """The pair layout is read off the language model (Cohere pairs channels 2j, 2j + 1), on every 1-D family:
    LLaVA with a Cohere 2 language model is the stock model under vanilla."""
    from test_hf_llava import IMG as LLAVA_IMG, _config, make_batch as llava_batch

    cfg = _config(text="cohere2", layers=2, head_dim=16, sliding_window=4,
                  layer_types=["sliding_attention", "full_attention"])
    model = _seeded(lambda: T.LlavaForConditionalGeneration(cfg))
    inputs, _ = llava_batch(model)
    keep = inputs["attention_mask"].bool()
    stock = _logits(model, dict(inputs, position_ids=(inputs["attention_mask"].cumsum(-1) - 1).clamp(min=0)))
    patch_model(model, "vanilla")
    assert model.model.__dict__["_ropekit_patch"].layout == "pairs" and LLAVA_IMG == IMG
    assert torch.equal(_logits(model, inputs)[keep], stock[keep])


def _one_sample_batches(name):
    """Each of the family's samples as a batch of its own (no padding), as a packing collator receives them."""
    import dataclasses

    family, out = FAMILIES[name], []
    for i, segs in enumerate(family.samples):
        FAMILIES[name] = dataclasses.replace(family, samples=[segs])
        try:
            out.append(make_batch(name, seed=i)[0])
        finally:
            FAMILIES[name] = family
    return out


UNPACKED = {"gemma3", "paligemma"}  # families whose forward builds two-way image masks: packing is refused


@pytest.mark.parametrize("design", ["vanilla", "circle"])
def test_packed_rows_equal_per_sample_runs(fam, design):
    """Samples packed into one padding-free row (ropekit.hf.pack): each sample's logits equal its own run. Gemma 3 and
    PaliGemma build their two-way image masks in their own forward, so packing is refused there."""
    name, model = fam
    samples = _one_sample_batches(name)
    patch_model(model, design)
    if name in UNPACKED:
        with pytest.raises(ValueError, match="token_type_ids|packed rows are not supported"):
            _logits(model, ropekit.hf.pack(model, samples))
        return
    row = ropekit.hf.pack(model, samples)
    alone = torch.cat([_logits(model, s)[0] for s in samples])
    torch.testing.assert_close(_logits(model, row)[0], alone, rtol=1e-5, atol=1e-5)
