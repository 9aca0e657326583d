"""request_positions (one request, items with offsets) against the batched rope_index on the same request,
transformers' Qwen2-VL / Qwen2.5-VL get_rope_index, a float64 walk of the per-request M-RoPE rule servers
use, and each design's own positions()."""
import random
import re

import numpy as np
import pytest
import torch
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLModel, Qwen2VLConfig, Qwen2VLModel

import ropekit
from ropekit import Image, Layout, Text, Video, block_cache, positions, request_positions, rope_index
from ropekit.designs import registry

MERGE = 2
TEXT_CFG = dict(
    hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
    vocab_size=64, rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [1, 1, 2]},
)
VISION = dict(spatial_merge_size=MERGE, patch_size=2, temporal_patch_size=2, num_heads=2)


def random_request(rng, adjacent=True, seconds=None, max_items=5):
    """(num_tokens, items): text runs and images (some with frames) and videos at random offsets; with
    ``adjacent`` some items follow one another with no text between."""
    items, at = [], rng.randint(0, 4)
    for _ in range(rng.randint(0, max_items)):
        if rng.random() < 0.5:
            grid = [rng.choice([1, 1, 1, 2]), 2 * rng.randint(1, 3), 2 * rng.randint(1, 3)]
            items.append((at, "image", grid))
        else:
            grid = [rng.randint(1, 3), 2 * rng.randint(1, 2), 2 * rng.randint(1, 3)]
            items.append((at, "video", grid) if seconds is None else (at, "video", grid, rng.choice(seconds)))
        at += grid[0] * grid[1] * grid[2] // MERGE**2
        at += rng.randint(0 if adjacent and rng.random() < 0.3 else 1, 4)
    return max(at, 1), items


def as_batch(num_tokens, items):
    """The same request as rope_index's batch of one: token types, grids in order, the videos' seconds."""
    types = torch.zeros(1, num_tokens, dtype=torch.long)
    images, videos, seconds = [], [], []
    for item in items:
        offset, kind, (t, h, w) = item[:3]
        types[0, offset: offset + t * h * w // MERGE**2] = 1 if kind == "image" else 2
        (images if kind == "image" else videos).append([t, h, w])
        if len(item) == 4:
            seconds.append(item[3])
    return dict(input_ids=torch.randint(3, 50, (1, num_tokens)), mm_token_type_ids=types,
                attention_mask=torch.ones(1, num_tokens, dtype=torch.long),
                image_grid_thw=torch.tensor(images) if images else None,
                video_grid_thw=torch.tensor(videos) if videos else None), seconds


OPTION_CASES = [("mrope", {"continuation": "spatial"}), ("vrope", {"order": "paper"}),
                ("circle", {"delta": 1.5, "radius": "auto", "k": 1.2}),
                ("circle", {"alpha": 0.3, "measure": "max_abs", "text_vector": (1.0, 2.0, 0.5), "delta": 0.75}),
                ("videorope", {"temporal_stride": 0.7}), ("v2pe", {"visual_stride": 2.5})]


@pytest.mark.parametrize("design,opts", [(name, {}) for name in ropekit.designs()] + OPTION_CASES)
def test_every_design_equals_the_batched_index_on_the_same_request(design, opts):
    rng = random.Random(design + str(opts))
    for k in range(4):
        num_tokens, items = random_request(rng, seconds=(0.35, 0.7, 2.0) if k % 2 else None)
        batch, seconds = as_batch(num_tokens, items)
        kw = dict(design=design, tokens_per_second=2 if k else None, per_axis_deltas=k == 3 or design == "compact",
                  split_video_frames=True if k == 2 else None, **opts)
        want_pos, want_delta = rope_index(**batch, second_per_grid_ts=seconds or None, **kw)
        pos, delta = request_positions(num_tokens, items, **kw)
        assert pos.dtype == torch.float32 and pos.shape == want_pos[:, 0].shape
        assert torch.equal(pos, want_pos[:, 0]), (design, k, items)
        assert torch.equal(delta, want_delta[0]), (design, k, items)
    # whole-number designs give int64 positions as rope_index does; the others are refused alike
    try:
        want_pos, want_delta = rope_index(**batch, second_per_grid_ts=seconds or None, **kw, dtype=torch.int64)
    except ValueError as e:
        with pytest.raises(ValueError, match=re.escape(str(e)[:60])):
            request_positions(num_tokens, items, **kw, dtype=torch.int64)
    else:
        pos, delta = request_positions(num_tokens, items, **kw, dtype=torch.int64)
        assert pos.dtype == delta.dtype == torch.int64
        assert torch.equal(pos, want_pos[:, 0]) and torch.equal(delta, want_delta[0]), design


def test_a_design_without_a_block_rule_goes_through_the_batched_index(monkeypatch):
    """A registered design with no block rule (placed per layout): the same result as with its rule."""
    rng = random.Random(7)
    requests = [random_request(rng, seconds=(0.5, 1.0)) for _ in range(3)]
    with_rule = [request_positions(n, items, design="vrope", tokens_per_second=2) for n, items in requests]
    no_rule = registry.Design(**{**registry.get_design("vrope").__dict__, "block_rule": None})
    monkeypatch.setitem(registry._REGISTRY, "vrope", no_rule)
    for (n, items), (pos, delta) in zip(requests, with_rule):
        got = request_positions(n, items, design="vrope", tokens_per_second=2)
        assert torch.equal(got[0], pos) and torch.equal(got[1], delta)


@pytest.fixture(scope="module")
def qwen2():
    cfg = Qwen2VLConfig(text_config=TEXT_CFG, vision_config=dict(depth=1, embed_dim=16, hidden_size=16, mlp_ratio=1,
                                                                 **VISION))
    return Qwen2VLModel(cfg).eval()


@pytest.fixture(scope="module")
def qwen25():
    cfg = Qwen2_5_VLConfig(text_config=TEXT_CFG, vision_config=dict(
        depth=1, hidden_size=16, out_hidden_size=16, intermediate_size=16, tokens_per_second=2,
        fullatt_block_indexes=[0], **VISION))
    return Qwen2_5_VLModel(cfg).eval()


def test_stock_equivalent_design_equals_qwen2vl_and_qwen25vl_get_rope_index(qwen2, qwen25):
    """mrope with continuation="spatial" is transformers' rule: per request, positions and delta equal the
    stock models' get_rope_index (vision items separated by text, as the stock code needs)."""
    rng = random.Random(11)
    for k in range(6):
        num_tokens, items = random_request(rng, adjacent=False)
        batch, _ = as_batch(num_tokens, items)
        want_pos, want_delta = qwen2.get_rope_index(**batch)
        pos, delta = request_positions(num_tokens, items, design="mrope", continuation="spatial")
        assert torch.equal(pos, want_pos[:, 0].float()) and torch.equal(delta, want_delta[0].float())
        num_tokens, items = random_request(rng, adjacent=False, seconds=(0.35, 0.7, 1.0, 2.0))
        batch, seconds = as_batch(num_tokens, items)
        spg = torch.tensor(seconds, dtype=torch.float32) if seconds else None
        want_pos, want_delta = qwen25.get_rope_index(**batch, second_per_grid_ts=spg)
        pos, delta = request_positions(num_tokens, items, design="mrope", continuation="spatial",
                                       tokens_per_second=qwen25.config.vision_config.tokens_per_second)
        assert torch.equal(pos, want_pos[:, 0].float()) and torch.equal(delta, want_delta[0].float())


def serving_rule(num_tokens, items):
    """float64 walk of the per-request M-RoPE rule of serving engines (Qwen2-VL, transformers 4.x): text
    continues at the previous segment's largest coordinate + 1; a block of (t, h, w) tokens sits at its start
    plus (frame, row, column); delta = largest coordinate + 1 - tokens."""
    pos, last_max, at = [], -1.0, 0
    for offset, _, (t, h, w) in items:
        for k in range(offset - at):
            pos.append([last_max + 1 + k] * 3)
        if offset > at:
            last_max = pos[-1][0]
        start = last_max + 1
        h, w = h // MERGE, w // MERGE
        block = [[start + f, start + i, start + j] for f in range(t) for i in range(h) for j in range(w)]
        pos += block
        last_max = max(max(c) for c in block)
        at = offset + t * h * w
    for k in range(num_tokens - at):
        pos.append([last_max + 1 + k] * 3)
    pos = torch.tensor(pos, dtype=torch.float64).reshape(-1, 3).T
    return pos, pos.max().item() + 1 - num_tokens


def test_mrope_equals_the_serving_rule_and_gives_its_int64_result():
    rng = random.Random(3)
    for _ in range(8):
        num_tokens, items = random_request(rng)
        want_pos, want_delta = serving_rule(num_tokens, items)
        pos, delta = request_positions(num_tokens, items, design="mrope", dtype=torch.int64)
        assert pos.dtype == torch.int64 and torch.equal(pos, want_pos.long())
        assert delta.tolist() == [want_delta]


def test_items_in_any_order_and_any_integer_form_give_one_result():
    rng = random.Random(5)
    num_tokens, items = random_request(rng, max_items=6)
    while len(items) < 3:
        num_tokens, items = random_request(rng, max_items=6)
    want = request_positions(num_tokens, items, design="vrope")
    shuffled = list(reversed(items))
    as_tensors = [(torch.tensor(o), k, torch.tensor(g)) for o, k, g in items]
    as_numpy = [(np.int64(o), 1 if k == "image" else 2, np.array(g)) for o, k, g in items]
    for other in (shuffled, as_tensors, as_numpy):
        got = request_positions(num_tokens, other, design="vrope")
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_kept_blocks_serve_later_requests_as_the_table_grows():
    """Requests with longer and longer text and new block shapes, from an empty cache: each equals the
    design's own positions() of its layout (which keeps nothing)."""
    block_cache.clear()
    rng = random.Random(9)
    for k in range(8):
        text = [rng.randint(1, 3) * 2 ** (k + 3) for _ in range(2)]
        grid = [1, 2 * rng.randint(1, 2 + k), 2 * rng.randint(1, 2 + k)]
        size = grid[1] * grid[2] // MERGE**2
        items = [(text[0], "image", grid), (text[0] + size, "video", [2, 2, 2])]
        num_tokens = text[0] + size + 2 + text[1]
        layout = Layout([Text(text[0]), Image(grid[1] // MERGE, grid[2] // MERGE), Video(2, 1, 1, 1.0), Text(text[1])])
        for design in ("mrope", "circle"):
            want = positions(layout, design).T
            pos, delta = request_positions(num_tokens, items, design=design)
            assert torch.equal(pos, want), (design, k)
            assert delta.item() == np.float32(want.double().max().item() + 1 - num_tokens), (design, k)


@pytest.mark.parametrize("num_tokens,items,kw,exc,match", [
    (10, [(4, "image", [1, 2, 2]), (4, "video", [1, 2, 2])], {}, ValueError, r"items\[1\]` starts at token 4.*overlaps"),
    (5, [(3, "image", [1, 4, 4])], {}, ValueError, r"4 tokens from token 3\) ends past the `num_tokens`=5"),
    (9, [(0, "audio", [1, 2, 2])], {}, ValueError, "modality must be 'image' or 'video'"),
    (9, [(0, True, [1, 2, 2])], {}, ValueError, "modality must be 'image' or 'video'"),
    (9, [(0, "image", [1, 3, 2])], {}, ValueError, "not divisible by spatial_merge_size=2"),
    (9, [(0, "image", [0, 2, 2])], {}, ValueError, "grid entries must be >= 1"),
    (9, [(0, "image", [1, 2])], {}, ValueError, "three whole numbers"),
    (9, [(0, "image", [1, 2.0, 2])], {}, TypeError, "grid entry must be a whole number"),
    (9, [(-1, "image", [1, 2, 2])], {}, ValueError, r"starts at token -1, which is negative"),
    (9, [(0, "image", [1, 2, 2], 0.5)], {}, ValueError, "is an image but gives second_per_grid_t"),
    (9, [(0, "video", [1, 2, 2], 0.5), (2, "video", [1, 2, 2])], {"tokens_per_second": 2}, ValueError,
     "second_per_grid_t for every video item or for none"),
    (9, [(0, "video", [1, 2, 2], 0.5)], {}, ValueError, "`second_per_grid_ts` needs `tokens_per_second`"),
    (9, [(0, "image")], {}, ValueError, r"items\[0\]` must be"),
    (9, "0 image", {}, TypeError, "`items` must be a list"),
    (-1, [], {}, ValueError, "`num_tokens` must be an int >= 0"),
    (9, [], {"design": "nope"}, ValueError, "unknown design 'nope'"),
    (9, [], {"design": "mrope", "contin": "max"}, TypeError, "unknown option"),
    (9, [], {"spatial_merge_size": 0}, ValueError, "`spatial_merge_size` must be an int >= 1"),
    (9, [], {"dtype": torch.float16}, TypeError, "`dtype`"),
    (9, [], {"design": "circle", "dtype": torch.int64}, ValueError, "places tokens at fractional positions"),
])
def test_bad_requests_fail_naming_the_argument(num_tokens, items, kw, exc, match):
    with pytest.raises(exc, match=match):
        request_positions(num_tokens, items, **kw)


def test_text_only_and_empty_requests():
    pos, delta = request_positions(5, [], design="vrope")
    assert torch.equal(pos, torch.arange(5.0).expand(4, 5)) and delta.tolist() == [0.0]
    pos, delta = request_positions(0, [])
    assert pos.shape == (3, 0) and delta.tolist() == [0.0]
    assert request_positions(4, [(0, "image", [1, 4, 4])])[1].tolist() == [1 + 1 - 4]  # largest 1, 4 tokens
