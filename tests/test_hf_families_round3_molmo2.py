"""ropekit designs inside Molmo2 (a tiny random model built from its config): every image two views (low and high
resolution), each a grid whose rows end in a column token, in a language model whose layers split between a scaled
and an unscaled rotary.

The matrix is tests/test_hf_families_1d.py's, collected here on this module's ``fam`` fixture. References: the stock
transformers model with the same weights (``vanilla`` gives its logits and ``generate`` output bit for bit; the stock
model fed a 1-D design's positions gives that design's logits, through both rotaries), each design's
``ropekit.positions`` on the layout the model sees, one teacher-forced forward (cached generation, on image and on
video prompts), gradient checkpointing, save and reload; packing is refused (the forward builds the two-way image
masks).
"""
import pytest
import torch
import transformers as T

import test_hf_families_1d as base
from hf_compat import restore
from ropekit import Image, Layout, Text, Video
from ropekit.hf import last_positions, layer_designs, patch_model
from test_hf_llava import pad_rows, reference_positions
from test_hf_families_1d import _unpatched_after, family_fixture  # noqa: F401  (autouse: unpatch after each test)
from test_hf_families_1d import (  # noqa: F401  (the shared matrix, collected on this module's family)
    IMG, TEXT, Family, _logits, _seeded, expected, make_batch,
    test_cached_generation_equals_a_teacher_forced_forward, test_checkpointed_training_step,
    test_every_design_places_its_positions, test_packed_rows_equal_per_sample_runs,
    test_save_pretrained_and_reload_restore_the_patch, test_supported_models_lists_the_families,
    test_vanilla_is_the_stock_model)

IM_START, LOW_START, COL, IM_END = 71, 72, 73, 74  # <im_start>, <low_res_im_start>, <im_col>, <im_end>
FRAME_START, FRAME_END = 75, 76  # <frame_start>, <frame_end>


def _molmo2():
    cls = getattr(T, "Molmo2ForConditionalGeneration", None)
    if cls is None:
        pytest.skip(f"transformers {T.__version__} has no Molmo2ForConditionalGeneration")
    # layer 0 unscaled, layer 1 with linear scaling (factor 2): the two rotaries give different tables
    return cls(T.Molmo2Config(
        text_config=dict(TEXT, head_dim=16, additional_vocab_size=0, rope_scaling_layers=[1],
                         rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}),
        vision_config=dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                           num_key_value_heads=2, head_dim=8, image_size=[4, 4], patch_size=2),
        adapter_config=dict(vision_feature_layer=[-1], hidden_size=16, num_attention_heads=2, num_key_value_heads=2,
                            head_dim=8, intermediate_size=16, text_hidden_size=TEXT["hidden_size"]),
        image_start_token_id=IM_START, low_res_image_start_token_id=LOW_START, image_end_token_id=IM_END,
        image_patch_id=IMG, frame_start_token_id=FRAME_START, frame_end_token_id=FRAME_END))


def _view(start, rows, cols, columns):
    row = [IMG] * cols + [COL] * columns
    return [start] + row * rows + [IM_END], [Text(1), Image(rows, cols + columns), Text(1)]


def _molmo2_image(spec):  # low-res view, then high-res view; each row ends in <im_col> where `columns`
    (r1, c1), (r2, c2), columns = spec
    low_ids, low_lay = _view(LOW_START, r1, c1, columns)
    high_ids, high_lay = _view(IM_START, r2, c2, columns)
    return low_ids + high_ids, low_lay + high_lay, (r1, c1, r2, c2)


def _molmo2_pixels(images, per_sample, g):
    """One crop (2 x 2 patches of 12 values) per image; each image token pools one of its crop's patches."""
    tokens = [r1 * c1 + r2 * c2 for r1, c1, r2, c2 in images]
    pooling = torch.cat([4 * i + torch.arange(n) % 4 for i, n in enumerate(tokens)])[:, None]
    return {"pixel_values": torch.randn(len(images), 4, 12, generator=g), "image_token_pooling": pooling,
            "image_grids": torch.tensor(images)}


MOLMO2 = Family(_molmo2, _molmo2_image, [[("T", 3), ("I", ((2, 2), (2, 3), True)), ("T", 2)],
                                         [("T", 2), ("I", ((1, 2), (2, 2), True)), ("T", 1),
                                          ("I", ((1, 1), (2, 1), False)), ("T", 2)]],
                pixels=_molmo2_pixels, token_types="mm_token_type_ids")
base.FAMILIES["molmo2"] = MOLMO2  # the shared tests read the families from that table
base.UNPACKED.add("molmo2")  # its forward builds the two-way image masks


fam = family_fixture({"molmo2": MOLMO2})


def test_both_rotaries_turn_the_designs_positions(fam):
    """A 1-D design (V2PE: image tokens 1/4 apart) is the stock model fed that design's positions: its unscaled
    layer and its scaled layer both rotate with them (each with its own table)."""
    _, model = fam
    inputs, layouts = make_batch("molmo2")
    keep = inputs["attention_mask"].bool()
    pos = expected("molmo2", inputs, layouts, "v2pe", increment=0.25)[0]
    with torch.no_grad():
        stock = model(**inputs, position_ids=pos).logits
        unscaled = model.model.language_model.rotary_emb_unscaled(stock, position_ids=pos)[0]
        scaled = model.model.language_model.rotary_emb(stock, position_ids=pos)[0]
    assert not torch.allclose(unscaled, scaled)  # the two tables differ
    patch_model(model, "v2pe", increment=0.25)
    got = _logits(model, inputs)
    assert all(torch.equal(p[0][keep], pos[keep]) for p in last_positions(model).values())
    torch.testing.assert_close(got[keep], stock[keep], rtol=1e-5, atol=1e-5)


def test_column_tokens_are_each_views_last_column(fam):
    """<im_col> ends every row of both views and is the grid's last column; the view begin/end tokens are text. A
    view without column tokens is its bare grid; a broken layout and images without their grids are refused."""
    _, model = fam
    inputs, _ = make_batch("molmo2")
    patch_model(model, "mrope")
    _logits(model, inputs)
    ids, pos = inputs["input_ids"][1], last_positions(model)[0][:, 1]
    first = int((ids == LOW_START).nonzero()[0]) + 1  # the low view's one row: 2 tokens, <im_col>
    assert ids[first + 2] == COL and torch.equal(pos[2, first:first + 3] - pos[2, first], torch.tensor([0.0, 1, 2]))
    assert torch.equal(pos[1, first:first + 3], pos[1, first].expand(3))
    high = int((ids == IM_START).nonzero()[0]) + 1  # the high view: 2 rows of 2 tokens + <im_col>
    cells = pos[1:, high:high + 6].view(2, 2, 3)
    assert torch.equal(cells[0] - cells[0, 0, 0], torch.tensor([[0.0] * 3, [1.0] * 3]))
    assert torch.equal(cells[1] - cells[1, 0, 0], torch.tensor([[0.0, 1, 2]] * 2))
    bare = int((ids == IM_START).nonzero()[1]) + 1  # the last image's high view: 2 rows of 1 token, no <im_col>
    assert ids[bare + 2] == IM_END and torch.equal(pos[1, bare:bare + 2] - pos[1, bare], torch.tensor([0.0, 1]))
    broken = inputs["input_ids"].clone()
    broken[0, (broken[0] == COL).nonzero()[0]] = IMG  # the first view's first row runs on into its second
    with pytest.raises(ValueError, match="not laid out as the processor writes it"):
        model(**dict(inputs, input_ids=broken))
    with pytest.raises(ValueError, match="without `image_grids`"):
        model(**{k: v for k, v in inputs.items() if k != "image_grids"})


def test_video_frames_are_blocks_of_their_own(fam):
    """A video of two 2 x 2 frames, each written as timestamp, <frame_start>, its rows (no column tokens),
    <frame_end>: vanilla is the stock model, and under a design each frame is a one-frame block."""
    _, model = fam
    frame = [FRAME_START] + [IMG] * 4 + [FRAME_END]
    ids = torch.tensor([[5, 6, 30] + frame + [31] + frame + [7, 8]])
    inputs = dict(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=(ids == IMG).long(),
                  pixel_values_videos=torch.randn(2, 4, 12, generator=torch.Generator().manual_seed(0)),
                  video_token_pooling=torch.arange(8)[:, None], video_grids=torch.tensor([[2, 2, 2]]))
    stock = _logits(model, inputs)
    patch_model(model, "vanilla")
    assert torch.equal(_logits(model, inputs), stock)
    patch_model(model, "videorope")
    _logits(model, inputs)
    layout = Layout([Text(4), Video(1, 2, 2), Text(3), Video(1, 2, 2), Text(3)])
    want = reference_positions(inputs, [layout], "videorope")
    assert all(torch.equal(p, want) for p in last_positions(model).values())


def _video_prompts():
    """Two left-padded video prompts as the processor writes them (per frame a timestamp, <frame_start>, its rows,
    <frame_end>): two 2 x 2 frames, and three 1 x 2 frames; each prompt's layout."""
    g = torch.Generator().manual_seed(4)
    rows, layouts = [], []
    for frames, (h, w) in ((2, (2, 2)), (3, (1, 2))):
        ids, lay = [5, 6], [Text(2)]
        for f in range(frames):
            ids += [30 + f, FRAME_START] + [IMG] * h * w + [FRAME_END]
            lay += [Text(2), Video(1, h, w), Text(1)]
        rows.append(ids + [7, 8])
        layouts.append(Layout(lay + [Text(2)]))
    ids, mask = pad_rows(rows, "left")
    pooling = torch.arange(2 * 4 + 3 * 2)[:, None]  # each video token pools one patch of its own
    return dict(input_ids=ids, attention_mask=mask, mm_token_type_ids=(ids == IMG).long(),
                pixel_values_videos=torch.randn(5, 4, 12, generator=g), video_token_pooling=pooling,
                video_grids=torch.tensor([[2, 2, 2], [3, 1, 2]])), layouts


def test_video_generate_is_the_stock_models_and_teacher_forced():
    """Video prompts through ``generate``: under ``vanilla`` the stock model's tokens and logits bit for bit; under a
    design, with and without AGE, every cached step's logits equal one teacher-forced forward over the prompt and the
    generated tokens, whose positions are the design's on the prompt's layout followed by the generated text. (The
    vision weights are drawn large enough that the frames change the generated tokens.)"""
    model = _seeded(_molmo2)
    inputs, layouts = _video_prompts()
    kw = dict(max_new_tokens=3, do_sample=False, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        torch.manual_seed(1)
        for name, weight in model.model.named_parameters():
            if not name.startswith("language_model") and weight.ndim == 2:
                weight.normal_(0, 0.5)
        blind = model.generate(**dict(inputs, pixel_values_videos=torch.zeros_like(inputs["pixel_values_videos"])),
                               **kw)
        gref = model.generate(**inputs, **kw)
    assert not torch.equal(blind.sequences, gref.sequences)
    with torch.no_grad():
        patch_model(model, "vanilla")
        got = model.generate(**inputs, **kw)
    assert torch.equal(got.sequences, gref.sequences)
    assert all(torch.equal(a, b) for a, b in zip(got.logits, gref.logits))
    for age in ("all", "alternate"):
        patch_model(model, ("videorope", "vanilla"), age=age)
        with torch.no_grad():
            out = model.generate(**inputs, **kw)
            full, n = base._full("molmo2", inputs, out.sequences)
            logits = model(**full).logits
        keep = full["attention_mask"].bool()
        for layer, p in last_positions(model).items():
            want = expected("molmo2", full, layouts, layer_designs(model)[layer], extra=n)
            assert torch.equal(p[:, keep], want[:, keep])
        start = inputs["input_ids"].shape[1] - 1
        for k, step in enumerate(out.logits):
            torch.testing.assert_close(step, logits[:, start + k], rtol=1e-5, atol=1e-5)
    restore(model)
