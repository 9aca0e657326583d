"""Canvas M-RoPE (`canvas-mrope`, MiniCPM-V 4.7) against transformers' own position code.

Reference: ``MiniCPMV4_7Model.get_rope_index`` of the installed transformers, on padded batches of the token
sequences MiniCPM-V's processor writes (``<image>`` thumbnail ``</image>``, rows of ``<slice>`` slice ``</slice>``
joined by newlines, video frames one after another, ``<image_id>N</image_id>`` before pictures), built here from
a tiny config (no hub download). Every sample's layout is written by hand; its token types must be the batch's
``mm_token_type_ids`` and its positions must equal transformers' on every kept token. The positions the model's
forward hands its language model are checked once too, and MiniCPM-V 4.6 (no canvas: 1-D positions) once.
"""
import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import torch

import ropekit
from ropekit import Layout, positions
from ropekit.designs import get_design
from ropekit.designs.canvas import canvas_blocks, thumbnail_spread
from ropekit.designs.registry import walk
from ropekit.index import rope_index

IMG, VID, IS, IE, SS, SE, NL, IDS, IDE, PAD = 70, 71, 72, 73, 74, 75, 76, 77, 78, 0
MARKERS = (IS, IE, SS, SE, NL)
ROPE = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 1, 1], "partial_rotary_factor": 0.5,
        "mrope_interleaved": True}


def _config(cls, **extra):
    return cls(
        text_config=dict(model_type="qwen3_5_text", hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, vocab_size=80, rope_parameters=ROPE,
                         layer_types=["linear_attention", "full_attention"], linear_num_value_heads=2,
                         linear_num_key_heads=1, linear_key_head_dim=8, linear_value_head_dim=8),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=32, patch_size=4),
        image_token_id=IMG, video_token_id=VID, **extra)


@pytest.fixture(scope="module")
def minicpmv47():
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "MiniCPMV4_7Model"):
        pytest.skip("this transformers has no MiniCPM-V 4.7")
    cfg = _config(transformers.MiniCPMV4_7Config, image_start_id=IS, image_end_id=IE, slice_start_id=SS,
                  slice_end_id=SE, newline_id=NL)
    torch.manual_seed(0)
    return transformers.MiniCPMV4_7Model(cfg).eval()


# ------------------------------------------------------------------------------------------- the batches

def frame(kind, thumb, grid=None, slices=(), merge=4):
    """Token ids of one frame as the processor writes it, and the patch grids (target sizes) of its crops.

    ``thumb`` and ``slices`` are token grids (h, w); ``grid`` is (rows, cols); ``slices`` holds one grid for all
    slices or one per slice (per-slice upsampling makes them differ)."""
    tok = IMG if kind == "image" else VID
    ids, sizes = [IS] + [tok] * (thumb[0] * thumb[1]) + [IE], [thumb]
    if grid:
        rows, cols = grid
        for r in range(rows):
            if r:
                ids.append(NL)
            for c in range(cols):
                h, w = slices[r * cols + c] if len(slices) > 1 else slices[0]
                ids += [SS] + [tok] * (h * w) + [SE]
                sizes.append((h, w))
    return kind, ids, [(merge * h, merge * w) for h, w in sizes]


def batch(samples, pad="left", mask=True):
    """Padded input_ids, mm_token_type_ids, attention mask and target sizes of ``samples`` (lists whose items are
    token-id lists or ``frame(...)``), crops numbered in batch order, per modality, as the processor does."""
    rows, image_sizes, video_sizes = [], [], []
    for parts in samples:
        row = []
        for part in parts:
            if isinstance(part, tuple):
                kind, ids, sizes = part
                row += ids
                (image_sizes if kind == "image" else video_sizes).extend(sizes)
            else:
                row += part
        rows.append(row)
    length = max(map(len, rows))
    assert mask or all(len(r) == length for r in rows)
    ids = torch.full((len(rows), length), PAD)
    keep = torch.zeros(len(rows), length, dtype=torch.long)
    for b, row in enumerate(rows):
        where = slice(length - len(row), length) if pad == "left" else slice(0, len(row))
        ids[b, where] = torch.tensor(row)
        keep[b, where] = 1
    types = (ids == IMG).long() + 2 * (ids == VID).long()
    as_sizes = lambda s: torch.tensor(s, dtype=torch.long).reshape(-1, 2) if s else None  # noqa: E731
    return dict(input_ids=ids, mm_token_type_ids=types, attention_mask=keep if mask else None,
                target_sizes=as_sizes(image_sizes), target_sizes_videos=as_sizes(video_sizes))


# each case: (samples, padding, downsample mode, [(hand-written layout, design options) per sample])
CASES = {
    "images": (
        [
            # system text, <image_id>0</image_id>, a picture with 2x3 slices (thumbnail 3x4 on a 4x6 canvas),
            # a newline right after it, the question
            [[1, 2, 3, IDS, 5, IDE], frame("image", (3, 4), (2, 3), [(2, 2)]), [NL, 6, 7, 8]],
            # a small picture: no slices
            [[9, 10], frame("image", (2, 2)), [11, 12]],
            # two pictures with their ids, slice grids 1x2 and 2x1 (thumbnail 4x4 on a 4x3 canvas)
            [[IDS, 5, IDE], frame("image", (2, 3), (1, 2), [(2, 2)]), [13, IDS, 6, IDE],
             frame("image", (4, 4), (2, 1), [(2, 3)]), [14, 15]],
        ],
        "left", "16x",
        [
            ("T7 I3x4 T2 I2x2 T2 I2x2 T2 I2x2 T3 I2x2 T2 I2x2 T2 I2x2 T5",
             dict(markers=True, slices=["2x3"], trailing=1)),
            ("T3 I2x2 T3", dict(markers=True)),
            ("T4 I2x3 T2 I2x2 T2 I2x2 T6 I4x4 T2 I2x3 T3 I2x3 T3", dict(markers=True, slices=[(1, 2), (2, 1)])),
        ],
    ),
    "videos": (
        [
            # three frames back to back (</image><image> between them), a newline, the question
            [[1, 2], frame("video", (2, 2)), frame("video", (2, 2)), frame("video", (2, 2)), [NL, 3, 4]],
            # two video frames with 1x2 slices each, then a picture
            [[7], frame("video", (2, 2), (1, 2), [(2, 2)]), frame("video", (2, 2), (1, 2), [(2, 2)]), [5],
             frame("image", (3, 3)), [6]],
            # a picture as the very first token (its <image> halo clamps at 0)
            [frame("image", (2, 2)), [8]],
        ],
        "left", "16x",
        [
            ("T3 V1x2x2 T2 V1x2x2 T2 V1x2x2 T4", dict(markers=True, trailing=1)),
            ("T2 V1x2x2 T2 V1x2x2 T2 V1x2x2 T2 V1x2x2 T2 V1x2x2 T2 V1x2x2 T3 I3x3 T2",
             dict(markers=True, slices="1x2 1x2 0")),
            ("T1 I2x2 T2", dict(markers=True)),
        ],
    ),
    "4x, unequal slices, pictures side by side": (
        [
            # thumbnail 5x5 on a 2x4 canvas (several rows share one position), slices of 2x2 and 3x2 tokens,
            # then a newline and a second picture with no id between them (transformers groups the two)
            [[1, 2], frame("image", (5, 5), (1, 2), [(2, 2), (3, 2)], merge=2), [NL],
             frame("image", (2, 3), merge=2), [3]],
            [[4, 5, 6, 7]],  # text only
            [[9], frame("video", (3, 2), merge=2), frame("video", (3, 2), merge=2), [10, 11]],
        ],
        "right", "4x",
        [
            ("T3 I5x5 T2 I2x2 T2 I3x2 T3 I2x3 T2", dict(markers=True, slices=["1x2", 0], trailing=[1, 0])),
            ("T4", dict(markers=True)),
            ("T2 V1x3x2 T2 V1x3x2 T3", dict(markers=True)),
        ],
    ),
    "no attention mask": (
        [
            [[1, 2], frame("image", (2, 2)), list(range(3, 16))],
            [frame("image", (2, 2), (2, 2), [(1, 1)]), [NL, 6]],
        ],
        None, "16x",
        [
            ("T3 I2x2 T14", dict(markers=True)),
            ("T1 I2x2 T2 I1x1 T2 I1x1 T3 I1x1 T2 I1x1 T3", dict(markers=True, slices=[(2, 2)], trailing=[1])),
        ],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_positions_equal_transformers_get_rope_index(minicpmv47, case):
    samples, pad, mode, layouts = CASES[case]
    inputs = batch(samples, pad=pad or "left", mask=pad is not None)
    want, deltas = minicpmv47.get_rope_index(**inputs, downsample_mode=mode)
    keep = torch.ones_like(inputs["input_ids"], dtype=torch.bool) if pad is None else inputs["attention_mask"].bool()
    for b, (layout, options) in enumerate(layouts):
        lay = Layout.parse(layout)
        # the hand-written layout is this sample's token sequence: its token types are the batch's
        assert torch.equal(lay.token_types(), inputs["mm_token_type_ids"][b, keep[b]]), (case, b)
        got = positions(lay, "canvas-mrope", **options)
        assert torch.equal(got.T, want[:, b, keep[b]].float()), (case, b, layout)
        assert not want[:, b, ~keep[b]].any()
        # transformers' decoding offset: the largest coordinate + 1 - the number of tokens
        assert deltas[b, 0].item() == got.max().item() + 1 - lay.num_tokens


def test_forward_hands_the_language_model_these_positions(minicpmv47):
    """Not only get_rope_index: the positions the 4.7 forward rotates with (captured at the text model's rotary
    embedding, pictures given as encoded features) are the design's."""
    samples, pad, mode, layouts = CASES["images"]
    inputs = batch(samples, pad=pad)
    n_image = int((inputs["input_ids"] == IMG).sum())
    features = torch.randn(n_image, 32, generator=torch.Generator().manual_seed(0))
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    seen = []
    hook = minicpmv47.language_model.rotary_emb.register_forward_hook(lambda _, args, out: seen.append((args[1], out)))
    try:
        with torch.no_grad():
            minicpmv47(**inputs, downsample_mode=mode,
                       mm_encoder_outputs={"image": BaseModelOutputWithPooling(pooler_output=[features])})
    finally:
        hook.remove()
        minicpmv47.rope_deltas = None
    ((used, (cos, sin)),) = seen
    keep = inputs["attention_mask"].bool()
    # the design's allocation with the config's sections, over the partial rotary dims (16 · 0.5), is the
    # text model's interleaved M-RoPE: the same cos/sin on every kept token
    rope = ropekit.RoPE("canvas-mrope", head_dim=16, rotary_dim=8, base=ROPE["rope_theta"],
                        sections=ROPE["mrope_section"])
    for b, (layout, options) in enumerate(layouts):
        coords = positions(layout, "canvas-mrope", **options)
        assert torch.equal(used[:, b, keep[b]].float(), coords.T)
        want_cos, want_sin = rope.cos_sin(coords)
        torch.testing.assert_close(cos[b, keep[b], :4], want_cos, rtol=0, atol=1e-6)
        torch.testing.assert_close(sin[b, keep[b], :4], want_sin, rtol=0, atol=1e-6)
        assert torch.equal(cos[b, :, :4], cos[b, :, 4:])  # rotate-half pairs: channel j with j + 4


def test_allocation_with_qwen35_sections_is_the_text_models_rotary():
    """At a real checkpoint's shape (head_dim 256, a quarter rotated, mrope_section [11, 11, 10], whose h section
    reaches past the last pair), the design's allocation gives the cos/sin of Qwen3.5's text rotary embedding."""
    qwen35 = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    from transformers import Qwen3_5TextConfig

    rope_parameters = {"rope_type": "default", "rope_theta": 1e7, "mrope_section": [11, 11, 10],
                       "partial_rotary_factor": 0.25, "mrope_interleaved": True}
    cfg = Qwen3_5TextConfig(head_dim=256, hidden_size=64, num_attention_heads=2, rope_parameters=rope_parameters)
    stock = qwen35.Qwen3_5TextRotaryEmbedding(cfg)
    layout, options = CASES["images"][3][0]
    coords = positions(layout, "canvas-mrope", **options)
    with torch.no_grad():
        cos, sin = stock(torch.zeros(1, coords.shape[0], 8), coords.T[:, None].long())
    rope = ropekit.RoPE("canvas-mrope", head_dim=256, rotary_dim=64, base=1e7, sections=[11, 11, 10])
    want_cos, want_sin = rope.cos_sin(coords)
    torch.testing.assert_close(cos[0, :, :32], want_cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(sin[0, :, :32], want_sin, rtol=0, atol=1e-6)


def test_minicpmv46_has_no_canvas_its_positions_are_1d():
    """MiniCPM-V 4.6 has no position code of its own: its language model numbers every token 1-D (every axis the
    same index, images included), which is `vanilla` — canvas M-RoPE is 4.7's only."""
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "MiniCPMV4_6Model"):
        pytest.skip("this transformers has no MiniCPM-V 4.6")
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    assert not hasattr(transformers.MiniCPMV4_6Model, "get_rope_index")
    torch.manual_seed(0)
    model = transformers.MiniCPMV4_6Model(_config(transformers.MiniCPMV4_6Config)).eval()
    inputs = batch([[[1, 2], frame("image", (2, 2), (1, 2), [(2, 2)]), [NL, 3]]])
    features = torch.randn(12, 32, generator=torch.Generator().manual_seed(0))
    seen = []
    hook = model.language_model.rotary_emb.register_forward_pre_hook(lambda _, args: seen.append(args[1]))
    with torch.no_grad():
        model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
              mm_encoder_outputs={"image": BaseModelOutputWithPooling(pooler_output=[features])})
    hook.remove()
    (used,) = seen
    one_d = positions("T3 I2x2 T2 I2x2 T2 I2x2 T3", "vanilla")[:, 0]
    for axis in range(3):
        assert torch.equal(used[axis, 0].float(), one_d)


# --------------------------------------------------------------------------------------------- the design

def test_registered_with_its_allocation_and_rule():
    d = get_design("canvas-mrope")
    assert d.allocation == "interleaved" and d.axes == 3 and d.block_rule is canvas_blocks
    assert d.options == ("markers", "slices", "trailing")
    assert get_design("canvas") is d


def test_crops_only_each_crop_and_each_video_frame_its_own_canvas():
    got = positions("T1 I2x3 T1 V3x2x2 T1", "canvas-mrope")
    rows = [[0, 0, 0]]
    rows += [[1, 1 + r, 1 + q] for r in range(2) for q in range(3)]  # advance max(2, 3) + 1 = 4
    rows += [[5, 5, 5]]
    for f in range(3):  # frames at 6, 9, 12 (advance max(2, 2) + 1 = 3 each)
        s = 6 + 3 * f
        rows += [[s, s + r, s + q] for r in range(2) for q in range(2)]
    rows += [[15, 15, 15]]
    assert got.tolist() == rows
    assert torch.equal(got, walk(Layout.parse("T1 I2x3 T1 V3x2x2 T1"), canvas_blocks))


@pytest.mark.parametrize("case", list(CASES))
def test_without_markers_tokens_keep_their_places_markers_taken_out(case):
    """markers=False reads the crops alone: every token gets the position it has with the markers around each crop,
    the marker tokens (the processor's, and a newline a frame absorbs) taken out of the layout."""
    samples, pad, _, layouts = CASES[case]
    inputs = batch(samples, pad=pad or "left")
    keep = inputs["attention_mask"].bool()
    for b, (layout, options) in enumerate(layouts):
        is_marker = torch.isin(inputs["input_ids"][b, keep[b]], torch.tensor(MARKERS))
        bare, at = [], 0
        for seg in Layout.parse(layout):
            n = seg.num_tokens
            kept = n - int(is_marker[at:at + n].sum())
            if not isinstance(seg, ropekit.Text):
                assert kept == n
                bare.append(str(seg))
            elif kept:
                bare.append(f"T{kept}")
            at += n
        marked = positions(layout, "canvas-mrope", **options)
        crops_only = positions(" ".join(bare), "canvas-mrope", slices=options.get("slices"))
        assert torch.equal(crops_only, marked[~is_marker]), (case, b)


def test_thumbnail_spread_rounds_float32_linspace_half_to_even():
    assert thumbnail_spread(4, 3).tolist() == [0.0, 2.0, 3.0]  # 0, 1.5, 3: 1.5 rounds to 2
    assert thumbnail_spread(2, 5).tolist() == [0.0, 0.0, 0.0, 1.0, 1.0]  # 0, .25, .5, .75, 1: .5 rounds to 0
    assert thumbnail_spread(7, 7).tolist() == list(map(float, range(7)))  # no slices: the plain grid


def test_rope_index_places_the_crops_only_reading_and_refuses_markers():
    types = torch.tensor([[0, 0] + [1] * 4 + [0] + [2] * 8 + [0]])
    pos, _ = rope_index(None, types, [[1, 4, 4]], [[2, 4, 4]], design="canvas-mrope")
    assert torch.equal(pos[:, 0].T, positions("T2 I2x2 T1 V2x2x2 T1", "canvas-mrope"))
    for options in (dict(markers=True), dict(slices=[0, 0, 0])):
        with pytest.raises(ValueError, match="cannot see; place each sample's layout with ropekit.positions"):
            rope_index(None, types, [[1, 4, 4]], [[2, 4, 4]], design="canvas-mrope", **options)
    text_only, _ = rope_index(None, torch.zeros(1, 4, dtype=torch.long), design="canvas-mrope", markers=True)
    assert text_only[:, 0].tolist() == [[0.0, 1.0, 2.0, 3.0]] * 3


@pytest.mark.parametrize("layout,options,error,match", [
    ("T2 I2x2 T1", dict(markers=1), TypeError, "`markers` must be True"),
    ("T2 I2x2 T1", dict(slices=[3]), ValueError, r"`slices` entry 0 must be .* written \[\(2, 3\)\]"),
    ("T2 I2x2 T1", dict(slices=[(2, 0)]), ValueError, "`slices` entry 0"),
    ("T2 I2x2 T1", dict(slices=3), TypeError, "`slices` must be a sequence"),
    ("T2 I2x2 T1", dict(slices=["1x2"]), ValueError, "frame 0 as a thumbnail with 1x2 slices"),
    ("T2 I2x2 T1 I2x2 T1", dict(slices=[0]), ValueError, "covering 1 crops, but the layout holds 2"),
    ("T2 I2x2 T1", dict(trailing=1), ValueError, "`trailing` .* needs markers=True"),
    ("T2 I2x2 T1", dict(markers=True, trailing=-1), ValueError, "`trailing` must be an int >= 0"),
    ("T2 I2x2 T2 I2x2 T1", dict(markers=True, trailing=[0, 1, 0]), ValueError, "3 entries for 2 frames"),
    ("T2 V2x2x2 T1", dict(markers=True), ValueError, "V2x2x2 holds 2 frames .*'V1x2x2 T2 V1x2x2'"),
    ("I2x2 T1", dict(markers=True), ValueError, "before crop 0 must be at least this thumbnail's <image>"),
    ("T1 I2x2", dict(markers=True), ValueError, "after crop 0 must be at least its frame's closing marker"),
    ("T2 I2x2 T1 I2x2 T1", dict(markers=True), ValueError, "before crop 1 must be the previous frame's closing"),
    ("T2 I2x2 T3 I1x1 T2", dict(markers=True, slices=["1x1"]), ValueError, r"'</image><slice>' \(2 tokens\)"),
    ("T2 I2x2 T2 I1x1 T2 I1x1 T2", dict(markers=True, slices=["2x1"]), ValueError, r"'</slice>\\n<slice>'"),
    ("T2 I2x2 T1 I1x1 T2", dict(slices=["1x1"]), ValueError, "without markers the crops of one frame follow"),
])
def test_layouts_that_do_not_fit_are_refused_by_name(layout, options, error, match):
    with pytest.raises(error, match=match):
        positions(layout, "canvas-mrope", **options)


def test_slices_and_trailing_forms():
    lay = "T2 I3x3 T2 I2x2 T2 I2x2 T3 I2x2 T2 I2x2 T2"
    want = positions(lay, "canvas-mrope", markers=True, slices=[(2, 2)], trailing=[1])
    for slices in ("2x2", ["2x2"], [[2, 2]], torch.tensor([[2, 2]])):
        assert torch.equal(positions(lay, "canvas-mrope", markers=True, slices=slices, trailing=1), want)
    assert want[-1].tolist() == [1.0, 1.0, 1.0]  # the trailing marker sits at the canvas origin, c = 1
    # a frame without slices: None, 0, (0, 0) and "0" / "-" read alike
    two = "T2 I2x2 T2 I2x2 T1"
    for none in ([None, None], [0, (0, 0)], "0 -"):
        assert torch.equal(positions(two, "canvas-mrope", markers=True, slices=none),
                           positions(two, "canvas-mrope", markers=True))
