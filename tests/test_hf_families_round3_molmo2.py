"""ropekit designs inside Molmo2 (a tiny random model built from its config): every image two views (low and high
resolution), each a grid whose rows end in a column token, in a language model whose layers split between a scaled
and an unscaled rotary.

The matrix is tests/test_hf_families_1d.py's, collected here on this module's ``fam`` fixture. References: the stock
transformers model with the same weights (``vanilla`` gives its logits and ``generate`` output bit for bit; the stock
model fed a 1-D design's positions gives that design's logits, through both rotaries), each design's
``ropekit.positions`` on the layout the model sees, one teacher-forced forward (cached generation), gradient
checkpointing, save and reload; packing is refused (the forward builds the two-way image masks).
"""
import pytest
import torch
import transformers as T

import test_hf_families_1d as base
from hf_compat import restore
from ropekit import Image, Layout, Text, Video
from ropekit.hf import last_positions, patch_model
from test_hf_llava import reference_positions
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
