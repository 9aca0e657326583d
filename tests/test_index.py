"""rope_index / decode_positions against tiny random Qwen2-VL and Qwen2.5-VL models, a float64 walk of
the transformers 4.x rule, and every registered design's own positions."""
import math
import random

import pytest
import torch
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLModel, Qwen2VLConfig, Qwen2VLModel

import ropekit
from ropekit import Image, Layout, Text, Video, positions
from ropekit.hf.boundary import cache_keyword
from ropekit.index import decode_positions, rope_index

MERGE = 2
TEXT_CFG = dict(
    hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
    vocab_size=64, rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [1, 1, 2]},
)


@pytest.fixture(scope="module")
def qwen2():
    cfg = Qwen2VLConfig(
        text_config=TEXT_CFG,
        vision_config=dict(depth=1, embed_dim=16, hidden_size=16, num_heads=2, mlp_ratio=1,
                           spatial_merge_size=MERGE, patch_size=2, temporal_patch_size=2),
    )
    return Qwen2VLModel(cfg).eval()


@pytest.fixture(scope="module")
def qwen25():
    cfg = Qwen2_5_VLConfig(
        text_config=TEXT_CFG,
        vision_config=dict(depth=1, hidden_size=16, out_hidden_size=16, intermediate_size=16, num_heads=2,
                           spatial_merge_size=MERGE, tokens_per_second=2, fullatt_block_indexes=[0],
                           patch_size=2, temporal_patch_size=2),
    )
    return Qwen2_5_VLModel(cfg).eval()


def random_batch(seed, batch=3, pad="right", adjacent=False, seconds=(1.0,)):
    """A padded batch of random text/image/video samples; vision items are separated by text unless
    ``adjacent`` (transformers needs the separation). Returns the model inputs and, per sample, the
    segments in patch units."""
    rng = random.Random(seed)
    samples = []
    for _ in range(batch):
        segs = [("T", rng.randint(1, 4))]
        for _ in range(rng.randint(0, 3)):
            if rng.random() < 0.5:
                segs.append(("I", 1, 2 * rng.randint(1, 3), 2 * rng.randint(1, 3), None))
            else:
                segs.append(("V", rng.randint(1, 3), 2 * rng.randint(1, 2), 2 * rng.randint(1, 2), rng.choice(seconds)))
            if not adjacent or rng.random() < 0.3:
                segs.append(("T", rng.randint(1, 3)))
        samples.append(segs)
    rows, images, videos, spg = [], [], [], []
    for segs in samples:
        row = []
        for s in segs:
            if s[0] == "T":
                row += [0] * s[1]
                continue
            row += [1 if s[0] == "I" else 2] * (s[1] * s[2] * s[3] // MERGE**2)
            (images if s[0] == "I" else videos).append(list(s[1:4]))
            if s[0] == "V":
                spg.append(s[4])
        rows.append(row)
    return padded(rows, images, videos, pad, rng.randint(0, 2)), samples, torch.tensor(spg, dtype=torch.float32)


def padded(rows, images, videos, pad, extra):
    """Model inputs for token-type rows padded on side ``pad`` to the longest row + ``extra``."""
    length = max(map(len, rows)) + extra
    types = torch.zeros(len(rows), length, dtype=torch.long)
    mask = torch.zeros(len(rows), length, dtype=torch.long)
    for b, row in enumerate(rows):
        sl = slice(0, len(row)) if pad == "right" else slice(length - len(row), length)
        types[b, sl] = torch.tensor(row)
        mask[b, sl] = 1
    return dict(input_ids=torch.randint(0, 50, (len(rows), length)), mm_token_type_ids=types, attention_mask=mask,
                image_grid_thw=torch.tensor(images) if images else None,
                video_grid_thw=torch.tensor(videos) if videos else None)


def layouts_of(samples, intervals=None):
    """The ropekit layout of each sample (token units), built straight from the segment list."""
    it = iter(intervals or [])
    out = []
    for segs in samples:
        parts = []
        for s in segs:
            if s[0] == "T":
                parts.append(Text(s[1]))
            elif s[0] == "I":
                parts.append(Image(s[2] // MERGE, s[3] // MERGE))
            else:
                parts.append(Video(s[1], s[2] // MERGE, s[3] // MERGE, next(it) if intervals else 1.0))
        out.append(Layout(parts))
    return out


CASES = [(seed, pad) for seed in range(8) for pad in ("left", "right")]


@pytest.mark.parametrize("seed,pad", CASES)
def test_spatial_equals_qwen2vl_get_rope_index(qwen2, seed, pad):
    inputs, _, _ = random_batch(seed, pad=pad)
    want_pos, want_delta = qwen2.get_rope_index(**inputs)
    pos, delta = rope_index(**inputs, design="mrope", continuation="spatial", spatial_merge_size=MERGE)
    assert pos.dtype == torch.float32 and pos.shape == want_pos.shape
    assert torch.equal(pos, want_pos.float())
    assert torch.equal(delta, want_delta.float())


@pytest.mark.parametrize("seed,pad", CASES[:8])
def test_qwen25_temporal_intervals_equal_its_get_rope_index(qwen25, seed, pad):
    inputs, _, spg = random_batch(100 + seed, pad=pad, seconds=(0.35, 0.7, 1.0, 2.0, 0.1, 1.3))
    tps = qwen25.config.vision_config.tokens_per_second
    kw = dict(second_per_grid_ts=spg) if spg.numel() else {}
    want_pos, want_delta = qwen25.get_rope_index(**inputs, **kw)
    pos, delta = rope_index(**inputs, **kw, tokens_per_second=tps, continuation="spatial")
    assert torch.equal(pos, want_pos.float())
    assert torch.equal(delta, want_delta.float())
    # without second_per_grid_ts Qwen2.5-VL spaces frames by tokens_per_second
    want_pos, _ = qwen25.get_rope_index(**inputs)
    assert torch.equal(rope_index(**inputs, tokens_per_second=tps, continuation="spatial")[0], want_pos.float())


def test_qwen25_frame_times_round_in_float32_like_transformers(qwen25):
    # frame 10 of a 0.35 s/grid video at 2 tokens/s: 10 * float32(0.7) rounds to 7 in float32 (6 in float64)
    tps = qwen25.config.vision_config.tokens_per_second
    types = torch.tensor([[0] + [2] * 11 + [0]])
    kw = dict(video_grid_thw=torch.tensor([[11, 2, 2]]), second_per_grid_ts=torch.tensor([0.35]))
    want_pos, _ = qwen25.get_rope_index(types, types, **kw)
    assert want_pos[0, 0, 11] == 1 + 7
    got = rope_index(None, types, **kw, tokens_per_second=tps, continuation="spatial")[0]
    assert torch.equal(got, want_pos.float())


def walk_transformers4(types, mask, image_grids, video_grids, intervals, merge):
    """float64 walk of the transformers 4.x rule, token by token: a block starts at the running index,
    text after a block resumes at the block's max + 1; padding 0; delta = max + 1 - valid tokens."""
    batch, length = len(types), len(types[0])
    pos = [[[0.0] * length for _ in range(batch)] for _ in range(3)]
    deltas = []
    grids = {1: iter(image_grids), 2: iter(zip(video_grids, intervals))}
    for b in range(batch):
        p, block, top, seen, n_valid = 0, None, -math.inf, 0, 0
        for k in range(length):
            if not mask[b][k]:
                continue
            n_valid += 1
            kind = types[b][k]
            if kind == 0:
                if block is not None:
                    p, block = top + 1, None
                c = (p, p, p)
                p += 1
            else:
                if block is None or seen == block[0] * block[1] * block[2]:
                    if block is not None:
                        p = top + 1
                    g = next(grids[kind])
                    (t, h, w), dt = (g, 1.0) if kind == 1 else g
                    block, seen, start, top, step = (t, h // merge, w // merge), 0, p, -math.inf, dt
                f, rest = divmod(seen, block[1] * block[2])
                i, j = divmod(rest, block[2])
                c = (start + math.floor(f * step), start + i, start + j)
                top = max(top, *c)
                seen += 1
            for a in range(3):
                pos[a][b][k] = float(c[a])
        biggest = max(pos[a][b][k] for a in range(3) for k in range(length) if mask[b][k])
        deltas.append([biggest + 1 - n_valid])
    return torch.tensor(pos, dtype=torch.float64), torch.tensor(deltas, dtype=torch.float64)


@pytest.mark.parametrize("seed,pad", CASES[:8])
def test_max_continuation_equals_transformers4_walk(seed, pad):
    inputs, _, spg = random_batch(200 + seed, pad=pad, adjacent=True, seconds=(0.25, 0.5, 0.75, 1.0))
    tps = 2
    ig = inputs["image_grid_thw"].tolist() if inputs["image_grid_thw"] is not None else []
    vg = inputs["video_grid_thw"].tolist() if inputs["video_grid_thw"] is not None else []
    want_pos, want_delta = walk_transformers4(
        inputs["mm_token_type_ids"].tolist(), inputs["attention_mask"].tolist(), ig, vg,
        [tps * s for s in spg.tolist()], MERGE,
    )
    kw = dict(second_per_grid_ts=spg) if spg.numel() else {}
    pos, delta = rope_index(**inputs, **kw, tokens_per_second=tps)  # default: mrope, continuation="max"
    assert torch.equal(pos.double(), want_pos)
    assert torch.equal(delta.double(), want_delta)


@pytest.mark.parametrize("pad", ["left", "right"])
def test_text_only_batch_is_arange(pad):
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    if pad == "left":
        mask = mask.flip(-1)
    types = torch.zeros(2, 5, dtype=torch.long)
    for design in ropekit.designs():
        pos, delta = rope_index(None, types, attention_mask=mask, design=design)
        want = (mask.cumsum(-1) - 1).clamp(min=0) * mask
        assert torch.equal(pos, want.float()[None].expand_as(pos)), design
        assert torch.equal(delta, torch.zeros(2, 1))


@pytest.mark.parametrize("design", ropekit.designs())
def test_every_design_equals_its_own_positions_scattered(design):
    for seed, pad in [(300, "left"), (301, "right"), (302, "left")]:
        inputs, samples, _ = random_batch(seed, batch=4, pad=pad, adjacent=True)
        pos, delta = rope_index(**inputs, design=design)
        mask = inputs["attention_mask"].bool()
        for b, lay in enumerate(layouts_of(samples)):
            own = positions(lay, design)
            assert pos.shape[0] == own.shape[1]
            assert torch.equal(pos[:, b, mask[b]], own.T)
            assert torch.equal(pos[:, b, ~mask[b]], torch.zeros(own.shape[1], int((~mask[b]).sum())))
            axes = list(ropekit.get_design(design).delta_axes or range(own.shape[1]))  # where text continues
            assert delta[b, 0].item() == pytest.approx(own[:, axes].double().max().item() + 1 - lay.num_tokens)


def test_adjacent_images_are_split_by_their_grids():
    types = torch.tensor([[0] + [1] * 13 + [0]])
    grids = torch.tensor([[1, 4, 4], [1, 4, 8], [1, 2, 2]])  # 4 + 8 + 1 tokens, no text between
    pos, _ = rope_index(None, types, grids)
    want = positions([Text(1), Image(2, 2), Image(2, 4), Image(1, 1), Text(1)], "mrope")
    assert torch.equal(pos[:, 0], want.T)


def test_image_grid_with_frames_is_a_unit_interval_video(qwen25):
    types = torch.tensor([[0, 0] + [1] * 12 + [0]])
    grids = torch.tensor([[3, 4, 4]])
    want, _ = qwen25.get_rope_index(types, types, image_grid_thw=grids)
    pos, _ = rope_index(None, types, grids, tokens_per_second=2, continuation="spatial")
    assert torch.equal(pos, want.float())


class _Cache:
    def __init__(self, n):
        self.n = n

    def get_seq_length(self):
        return self.n


@pytest.mark.parametrize("pad", ["left", "right"])
def test_decode_positions_equal_transformers_incremental_rule(qwen2, pad):
    inputs, _, _ = random_batch(400, batch=4, pad=pad)
    _, delta = rope_index(**inputs, continuation="spatial")
    batch, past = inputs["mm_token_type_ids"].shape
    new = 3
    mask = torch.cat([inputs["attention_mask"], torch.ones(batch, new, dtype=torch.long)], dim=1)
    qwen2.rope_deltas = delta.long()
    embeds = torch.zeros(batch, new, 16)
    for m in (mask, None):
        want = qwen2.compute_3d_position_ids(
            torch.zeros(batch, new, dtype=torch.long), embeds, attention_mask=m,
            **{cache_keyword(type(qwen2).compute_3d_position_ids): _Cache(past)},
            mm_token_type_ids=torch.zeros(batch, new, dtype=torch.long),
        )
        got = decode_positions(delta, past, new, 3, attention_mask=m)
        assert torch.equal(got, want[..., -new:].float())  # with a mask it returns the whole mask width
    qwen2.rope_deltas = None


@pytest.mark.parametrize("design,per_axis", [("mrope", False), ("compact", True), ("vanilla", False)])
def test_cached_decoding_continues_like_a_full_pass(design, per_axis):
    """Prompt ending in text or in a vision block: decoding k tokens gives what positions(prompt + Tk) gives."""
    for prompt in ("T2 I2x3 T3", "T1 V3x2x2", "T2 I4x2", "T3 V2x2x2 T1 I2x2 T2"):
        lay = Layout.parse(prompt)
        types = lay.token_types()[None]
        imgs = [[1, 2 * s.h, 2 * s.w] for s in lay if isinstance(s, Image)] or None
        vids = [[s.t, 2 * s.h, 2 * s.w] for s in lay if isinstance(s, Video)] or None
        pos, delta = rope_index(None, types, imgs, vids, design=design, per_axis_deltas=per_axis)
        full = positions(Layout(list(lay.segments) + [Text(4)]), design)
        got = decode_positions(delta, lay.num_tokens, 4, pos.shape[0])
        assert torch.equal(got[:, 0].T, full[-4:]), (design, prompt)


def test_compact_needs_per_axis_deltas():
    lay = Layout.parse("T2 V3x2x2 T1")
    types = lay.token_types()[None]
    _, delta = rope_index(None, types, video_grid_thw=[[3, 4, 4]], design="compact", per_axis_deltas=True)
    assert delta.shape == (1, 3)
    assert delta.tolist() == [[2 + 3 + 1 - 15, 2 + 2 + 1 - 15, 2 + 2 + 1 - 15]]
    _, scalar = rope_index(None, types, video_grid_thw=[[3, 4, 4]], design="compact")
    assert scalar.shape == (1, 1)


def _one():
    types = torch.tensor([[0, 1, 1, 1, 1, 0, 2, 2, 2, 2, 0]])
    return types, torch.tensor([[1, 4, 4]]), torch.tensor([[1, 4, 4]])


@pytest.mark.parametrize("change,exc,match", [
    (dict(image_grid_thw=torch.tensor([[1, 4, 6]])), ValueError, "image_grid_thw.*6 image tokens.*holds 4"),
    (dict(image_grid_thw=torch.tensor([[1, 4, 4], [1, 4, 4]])), ValueError, "image_grid_thw.*8 image tokens"),
    (dict(image_grid_thw=torch.tensor([[1, 4, 5]])), ValueError, "not divisible by spatial_merge_size=2"),
    (dict(image_grid_thw=None), ValueError, "image tokens but `image_grid_thw` is missing"),
    (dict(video_grid_thw=torch.tensor([[1.0, float("nan"), 4.0]])), ValueError, "video_grid_thw.*NaN"),
    (dict(video_grid_thw=torch.tensor([[0, 4, 4]])), ValueError, "video_grid_thw.*>= 1"),
    (dict(video_grid_thw=torch.tensor([4, 4])), ValueError, "video_grid_thw.*shape"),
    (dict(second_per_grid_ts=torch.tensor([1.0])), ValueError, "needs `tokens_per_second`"),
    (dict(second_per_grid_ts=torch.tensor([1.0, 2.0]), tokens_per_second=2), ValueError, "2 entries.*1 videos"),
    (dict(second_per_grid_ts=torch.tensor([float("nan")]), tokens_per_second=2), ValueError, "finite"),
    (dict(tokens_per_second=-1), ValueError, "tokens_per_second"),
    (dict(spatial_merge_size=0), ValueError, "spatial_merge_size"),
    (dict(design="nope"), ValueError, "unknown design 'nope'"),
    (dict(continuation="up"), ValueError, "continuation"),
    (dict(wrong=1), TypeError, "unknown option"),
    (dict(attention_mask=torch.ones(1, 5)), ValueError, "attention_mask.*shape"),
    (dict(attention_mask=torch.full((1, 11), 2)), ValueError, "only 0"),
    (dict(attention_mask=torch.full((1, 11), float("nan"))), ValueError, "attention_mask.*NaN"),
])
def test_bad_inputs_fail_clearly(change, exc, match):
    types, ig, vg = _one()
    kw = dict(image_grid_thw=ig, video_grid_thw=vg)
    kw.update(change)
    with pytest.raises(exc, match=match):
        rope_index(None, types, **kw)


def test_bad_token_types_fail_clearly():
    types, ig, vg = _one()
    with pytest.raises(ValueError, match="values must be 0 \\(text\\), 1 \\(image\\) or 2"):
        rope_index(None, types * 2, ig, vg)
    with pytest.raises(TypeError, match="integer tensor"):
        rope_index(None, types.float(), ig, vg)
    with pytest.raises(ValueError, match="input_ids.*shape"):
        rope_index(torch.zeros(1, 3), types, ig, vg)
    # two images where the grids describe one bigger image: the runs do not split into whole images
    t = torch.tensor([[0, 1, 1, 0, 1, 1, 0]])
    with pytest.raises(ValueError, match="do not split into whole images"):
        rope_index(None, t, torch.tensor([[1, 2, 2], [1, 2, 6]]))


def test_decode_positions_bad_inputs():
    d = torch.zeros(2, 1)
    with pytest.raises(ValueError, match="deltas"):
        decode_positions(torch.zeros(2), 3, 1, 3)
    with pytest.raises(ValueError, match="num_new"):
        decode_positions(d, 3, 0, 3)
    with pytest.raises(ValueError, match="num_axes=3"):
        decode_positions(torch.zeros(2, 2), 3, 1, 3)
    with pytest.raises(ValueError, match="attention_mask.*\\(2, 4\\)"):
        decode_positions(d, 3, 1, 3, attention_mask=torch.ones(2, 3))


def test_fully_padded_sample_gets_zeros_and_zero_delta():
    types = torch.tensor([[0, 1, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0]])
    pos, delta = rope_index(None, types, [[1, 4, 4]], attention_mask=mask)
    assert torch.equal(pos[:, 1], torch.zeros(3, 6))
    assert delta[1].tolist() == [0.0]
    assert torch.equal(pos[:, 0], positions("T1 I2x2 T1", "mrope").T)


# ---------------------------------------------------------------------------------------------------
# Block rules: the translation-structured designs and the batch-wide index built on them

from ropekit import Grid  # noqa: E402
from ropekit.designs import registry  # noqa: E402
from ropekit.designs.registry import ragged_arange, walk  # noqa: E402

RULE_DESIGNS = ["vanilla", "shared", "mrope", "compact", "vrope", "rope2d"]
EXACT = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0)  # intervals whose products with frame numbers are exact in float32


def brute_force(layout, design, continuation="max", order="reference"):
    """float64 token-by-token placement written from docs/conventions.md ("Position designs"), one design at a time."""
    axes = {"vanilla": 1, "shared": 1, "mrope": 3, "compact": 3, "vrope": 4, "rope2d": 2}[design]
    out, p = [], [0.0] * axes  # running start, per axis
    for seg in layout:
        if isinstance(seg, Text):
            for _ in range(seg.n):
                out.append(list(p))
                p = [x + 1 for x in p]
            continue
        t, h, w, dt = (1, seg.h, seg.w, 0.0) if isinstance(seg, Image) else (seg.t, seg.h, seg.w, seg.interval)
        s, block = p[0], []
        for f in range(t):
            for i in range(h):
                for j in range(w):
                    if design == "vanilla":
                        block.append([s + len(block)])
                    elif design == "shared":
                        block.append([s + f])
                    elif design in ("mrope", "compact"):
                        block.append([q + d for q, d in zip(p, (math.floor(f * dt), i, j))])
                    elif design == "rope2d":
                        P = s + f * max(h, w)
                        block.append([P + i, P + j])
                    else:  # vrope, the released code's (default) order u+, v-, v+, u-; the paper's eq. 8 order is u+, u-, v+, v-
                        P = s + f * (h + w - 1)
                        up, vm, vp, um = P + i + j, P + i + (w - 1 - j), P + (h - 1 - i) + j, P + (h + w - 2) - i - j
                        block.append([up, vm, vp, um] if order == "reference" else [up, um, vp, vm])
        out += block
        if design == "vanilla":
            p = [s + len(block)]
        elif design == "shared":
            p = [s + t]
        elif design == "mrope":
            top = max(max(c) for c in block) + 1 if continuation == "max" else s + max(h, w)
            p = [top] * 3
        elif design == "compact":
            p = [max(c[a] for c in block) + 1 for a in range(3)]
        elif design == "rope2d":
            p = [s + t * max(h, w)] * 2
        else:
            p = [s + t * (h + w - 1)] * 4
    return torch.tensor(out, dtype=torch.float64)


def random_layout(rng, max_segments=5):
    segs = []
    for _ in range(rng.randint(1, max_segments)):
        r = rng.random()
        if r < 0.4:
            segs.append(Text(rng.randint(1, 5)))
        elif r < 0.7:
            segs.append(Image(rng.randint(1, 4), rng.randint(1, 4)))
        else:
            segs.append(Video(rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 4), rng.choice(EXACT)))
    return Layout(segs)


RULE_CASES = [("vanilla", {}), ("shared", {}), ("mrope", {}), ("mrope", {"continuation": "spatial"}),
              ("compact", {}), ("vrope", {}), ("vrope", {"order": "paper"}), ("rope2d", {})]


@pytest.mark.parametrize("design,opts", RULE_CASES)
def test_block_rule_walk_equals_brute_force_placement(design, opts):
    assert registry.get_design(design).block_rule is not None
    rng = random.Random(hash(design + str(opts)) % 1000)
    for _ in range(25):
        lay = random_layout(rng)
        want = brute_force(lay, design, **opts)
        got = positions(lay, design, **opts)
        assert got.dtype == torch.float32 and torch.equal(got.double(), want), (design, opts, str(lay))
        assert torch.equal(walk(lay, registry.get_design(design).block_rule, **opts), got)


def test_block_rules_place_many_blocks_like_one_at_a_time():
    """A rule called on several segments returns each segment's own offsets, concatenated in order."""
    segs = [Image(2, 3), Video(3, 2, 2, 0.5), Grid(2, 2), Image(1, 1), Video(2, 3, 1, 1.5)]
    for design in RULE_DESIGNS:
        rule = registry.get_design(design).block_rule
        segs_d = segs if design != "vrope" else [s for s in segs if not isinstance(s, Grid) or len(s.sizes) == 2]
        offsets, advance = rule(segs_d)
        assert offsets.dtype == advance.dtype == torch.float64 and advance.shape[0] == len(segs_d)
        one = [rule([s]) for s in segs_d]
        assert torch.equal(offsets, torch.cat([o for o, _ in one]))
        assert torch.equal(advance, torch.cat([a for _, a in one]))
        empty_off, empty_adv = rule([])
        assert empty_off.shape == (0, advance.shape[1]) and empty_adv.shape == (0, advance.shape[1])


def test_ragged_arange_matches_a_python_loop():
    counts = torch.tensor([3, 0, 1, 4, 0, 0, 2])
    owner, local = ragged_arange(counts)
    want = [(k, i) for k, n in enumerate(counts.tolist()) for i in range(n)]
    assert list(zip(owner.tolist(), local.tolist())) == want
    assert ragged_arange(torch.tensor([0, 0]))[0].numel() == 0


def test_register_rejects_a_block_rule_that_is_not_a_function():
    with pytest.raises(TypeError, match="block_rule.*must be a function"):
        registry.register("never-registered", summary="x", allocation="1d", block_rule=3)
    assert "never-registered" not in ropekit.designs()


def with_holes(inputs, seed, rate=0.15):
    """Insert masked tokens (of random type: what padding holds must not matter) anywhere in each sample,
    inside images too; the tokens that remain, and so the grids, are unchanged."""
    rng = random.Random(seed)
    types, mask = inputs["mm_token_type_ids"].tolist(), inputs["attention_mask"].tolist()
    rows = []
    for trow, mrow in zip(types, mask):
        row = []
        for t, m in zip(trow, mrow):
            while rng.random() < rate:
                row.append((rng.choice([0, 1, 2]), 0))
            row.append((t, m))
        rows.append(row)
    length = max(map(len, rows))
    out = dict(inputs)
    out["mm_token_type_ids"] = torch.tensor([[t for t, _ in r] + [0] * (length - len(r)) for r in rows])
    out["attention_mask"] = torch.tensor([[m for _, m in r] + [0] * (length - len(r)) for r in rows])
    out["input_ids"] = torch.randint(0, 50, (len(rows), length), generator=torch.Generator().manual_seed(seed))
    return out


def big_random_batch(seed, batch=6, pad="right", seconds=(1.0,)):
    """Longer samples with several images (some with frames, some adjacent) and videos."""
    rng = random.Random(seed)
    rows, images, videos, spg = [], [], [], []
    for _ in range(batch):
        row = [0] * rng.randint(0, 3)
        for _ in range(rng.randint(0, 6)):
            r = rng.random()
            if r < 0.45:
                grid = [rng.choice([1, 1, 2]), 2 * rng.randint(1, 3), 2 * rng.randint(1, 3)]
                images.append(grid)
                row += [1] * (grid[0] * grid[1] * grid[2] // MERGE**2)
            elif r < 0.8:
                grid = [rng.randint(1, 3), 2 * rng.randint(1, 2), 2 * rng.randint(1, 3)]
                videos.append(grid)
                spg.append(rng.choice(seconds))
                row += [2] * (grid[0] * grid[1] * grid[2] // MERGE**2)
            row += [0] * rng.randint(0 if r < 0.45 else 1, 3)  # at times no text between two images
        rows.append(row)
    length = max(1, max(map(len, rows))) + rng.randint(0, 3)
    types = torch.zeros(batch, length, dtype=torch.long)
    mask = torch.zeros(batch, length, dtype=torch.long)
    for b, row in enumerate(rows):
        sl = slice(0, len(row)) if pad == "right" else slice(length - len(row), length)
        types[b, sl] = torch.tensor(row, dtype=torch.long)
        mask[b, sl] = 1
    return dict(
        input_ids=None, mm_token_type_ids=types, attention_mask=mask,
        image_grid_thw=torch.tensor(images) if images else None,
        video_grid_thw=torch.tensor(videos) if videos else None,
    ), torch.tensor(spg, dtype=torch.float32)


# circle: the rule's gap (every block after the first of its sample one more Δ further), auto radius, a tilted text vector
CIRCLE_CASES = [("circle", {"delta": 1.5, "radius": "auto", "k": 1.2}),
                ("circle", {"alpha": 0.3, "measure": "max_abs", "text_vector": (1.0, 2.0, 0.5), "delta": 0.75})]
INDEX_CASES = [(d, o, pad, holes) for d, o in RULE_CASES + CIRCLE_CASES
               for pad, holes in (("right", False), ("left", True))]


@pytest.mark.parametrize("design,opts,pad,holes", INDEX_CASES)
def test_batched_index_equals_the_per_layout_path(monkeypatch, design, opts, pad, holes):
    """Vectorised rope_index == the same design without its block rule (one positions() per sample)."""
    no_rule = registry.Design(**{**registry.get_design(design).__dict__, "block_rule": None})
    for seed in range(3):
        inputs, spg = big_random_batch(500 + seed, pad=pad, seconds=(0.35, 0.7, 1.0, 2.0))
        if holes:
            inputs = with_holes(inputs, seed)
        kw = dict(inputs, design=design, tokens_per_second=2, per_axis_deltas=design == "compact", **opts)
        if spg.numel():
            kw["second_per_grid_ts"] = spg
        fast = rope_index(**kw)
        with monkeypatch.context() as m:
            m.setitem(registry._REGISTRY, design, no_rule)
            slow = rope_index(**kw)
        assert torch.equal(fast[0], slow[0]), (design, opts, seed)
        assert torch.equal(fast[1], slow[1]), (design, opts, seed)


@pytest.mark.parametrize("seed", range(4))
def test_mask_holes_equal_transformers(qwen2, seed):
    """transformers drops masked tokens before indexing, even inside an image; so does rope_index."""
    inputs, _, _ = random_batch(600 + seed, batch=4, pad=("left", "right")[seed % 2])
    inputs = with_holes(inputs, seed, rate=0.3)
    assert ((inputs["attention_mask"][:, 1:] - inputs["attention_mask"][:, :-1]) == 1).sum() > 4  # holes exist
    want_pos, want_delta = qwen2.get_rope_index(**inputs)
    pos, delta = rope_index(**inputs, continuation="spatial")
    assert torch.equal(pos, want_pos.float()) and torch.equal(delta, want_delta.float())


def test_rule_option_errors_reach_the_caller():
    types, ig, vg = _one()
    with pytest.raises(ValueError, match="spatial_dims=3"):
        rope_index(None, types, ig, vg, design="vrope", spatial_dims=3)
    with pytest.raises(ValueError, match="order"):
        rope_index(None, types, ig, vg, design="vrope", order="sideways")
    with pytest.raises(ValueError, match="continuation"):
        rope_index(None, torch.zeros(1, 3, dtype=torch.long), design="mrope", continuation="up")


# ---------------------------------------------------------------------------------------------------
# Inputs a user can get wrong or unusual: any strides, empty batches, overflowing numbers

@pytest.mark.parametrize("design", ["mrope", "circle", "vrope"])
def test_any_strides_give_the_contiguous_result(design):
    inputs, _, _ = random_batch(700, batch=4, pad="left")
    want = rope_index(**inputs, design=design)
    odd = dict(inputs)
    for name in ("mm_token_type_ids", "attention_mask", "input_ids"):
        odd[name] = inputs[name].T.contiguous().T  # same values, column-major strides
        assert not odd[name].is_contiguous()
    got = rope_index(**odd, design=design)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # a broadcast (stride 0) batch: every row is the same sample
    types = torch.tensor([[0, 1, 1, 1, 1, 0]]).expand(3, -1)
    pos, _ = rope_index(None, types, [[1, 4, 4]] * 3, attention_mask=torch.ones(1, 6).expand(3, -1), design=design)
    assert torch.equal(pos, positions("T1 I2x2 T1", design).T[:, None].expand(-1, 3, -1))


@pytest.mark.parametrize("design", ["mrope", "circle", "vrope", "vanilla"])
def test_an_empty_batch_gives_empty_positions(design):
    axes = positions("T1", design).shape[1]
    for shape in ((0, 5), (0, 0), (2, 0)):
        pos, delta = rope_index(None, torch.zeros(shape, dtype=torch.long), design=design)
        assert pos.shape == (axes, *shape) and pos.dtype == torch.float32
        assert delta.shape == (shape[0], 1)
    with pytest.raises(ValueError, match="image_grid_thw.*1 tokens.*0 tokens of the whole batch"):
        rope_index(None, torch.zeros(0, 5, dtype=torch.long), [[1, 2, 2]], design=design)


def test_a_grid_product_that_wraps_int64_is_refused():
    # 4 · (2**62 + 1) = 2**64 + 4 wraps to 4 in int64, which matched the four image tokens before
    types = torch.tensor([[0, 1, 1, 1, 1, 0]])
    with pytest.raises(ValueError, match="image_grid_thw.*18446744073709551620 tokens"):
        rope_index(None, types, [[1, 4, 2**62 + 1]], spatial_merge_size=1)
    with pytest.raises(ValueError, match="video_grid_thw.*tokens"):
        rope_index(None, types * 2, video_grid_thw=torch.tensor([[2**31, 2**31, 2**31 + 4]]), spatial_merge_size=1)


@pytest.mark.parametrize("change,exc,match", [
    (dict(second_per_grid_ts=[1e300], tokens_per_second=2), ValueError,
     "video 0: `tokens_per_second` = 2 × `second_per_grid_ts\\[0\\]` = 1e\\+300 .* not be finite float32"),
    (dict(second_per_grid_ts=[3e38], tokens_per_second=2), ValueError, "second_per_grid_ts\\[0\\].*float32"),
    (dict(tokens_per_second=1e39), ValueError, "`tokens_per_second` = 1e\\+39 .*float32"),
    (dict(tokens_per_second="2"), TypeError, "`tokens_per_second` must be a number"),
    (dict(tokens_per_second=[2]), TypeError, "`tokens_per_second` must be a number"),
    (dict(second_per_grid_ts=["a"], tokens_per_second=2), TypeError, "`second_per_grid_ts` must be numbers"),
    (dict(second_per_grid_ts=[[1.0, 2.0], [3.0]], tokens_per_second=2), TypeError, "`second_per_grid_ts`"),
    (dict(spatial_merge_size=10**20), ValueError, "not divisible by spatial_merge_size=100000000000000000000"),
    (dict(image_grid_thw=[["a", 1, 1]]), TypeError, "`image_grid_thw` must be"),
    (dict(image_grid_thw=torch.ones(1, 3, dtype=torch.bool)), TypeError, "`image_grid_thw`.*dtype"),
    (dict(image_grid_thw=[[1, 4, 4]], video_grid_thw=[[1.0, 4.0, 1e30]]), ValueError, "video_grid_thw.*tokens"),
    (dict(per_axis_deltas="yes"), TypeError, "per_axis_deltas"),
])
def test_bad_numbers_fail_with_the_argument_named(change, exc, match):
    types, ig, vg = _one()
    kw = dict(image_grid_thw=ig, video_grid_thw=vg)
    kw.update(change)
    with pytest.raises(exc, match=match):
        rope_index(None, types, **kw)


def test_huge_frame_times_are_refused_not_returned_as_inf():
    # a finite float32 interval whose frame 2 lands beyond float32: every design path says so
    types = torch.tensor([[0] + [2] * 3 + [0]])
    for design in ("mrope", "compact", "circle"):
        with pytest.raises(ValueError, match="not finite float32"):
            rope_index(None, types, video_grid_thw=[[3, 2, 2]], tokens_per_second=3e38, design=design)


def test_too_many_coordinates_are_refused_before_allocating(monkeypatch):
    import ropekit.index as index
    monkeypatch.setattr(index, "MAX_BATCH_COORDINATES", 3 * 2 * 5 - 1)
    with pytest.raises(ValueError, match="3 axes × 2 × 5 = 30 coordinates, more than the limit of 29"):
        rope_index(None, torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="decode_positions would return 3 axes × 2 × 5 = 30"):
        decode_positions(torch.zeros(2, 1), 0, 5, 3)
    assert rope_index(None, torch.zeros(2, 5, dtype=torch.long), design="vanilla")[0].shape == (1, 2, 5)


def test_decode_positions_argument_types():
    d = torch.zeros(1, 1)
    with pytest.raises(TypeError, match="`attention_mask` must be a torch.Tensor"):
        decode_positions(d, 2, 1, 3, attention_mask=[[1, 1, 1]])
    with pytest.raises(TypeError, match="`deltas` must be"):
        decode_positions([[0.0]], 2, 1, 3)
    with pytest.raises(ValueError, match="`deltas` must hold finite"):
        decode_positions(torch.tensor([[float("nan")]]), 2, 1, 3)
    with pytest.raises(ValueError, match="`past_length` \\+ `num_new`.*exceed the limit"):
        decode_positions(d, 10**30, 1, 3)


# ---------------------------------------------------------------------------------------------------
# Qwen3-VL input: one video grid [t, h, w], t frame blocks in the text (each after timestamp tokens)


def qwen3_batch(seed, batch=3, pad="left"):
    """A padded Qwen3-VL-style batch: images [1, h, w] and videos [t, h, w] whose frames each follow 1-3
    timestamp text tokens, as Qwen3-VL's processor writes them."""
    rng = random.Random(seed)
    rows, images, videos = [], [], []
    for _ in range(batch):
        row = [0] * rng.randint(1, 4)
        for _ in range(rng.randint(0, 3)):
            h, w = 2 * rng.randint(1, 3), 2 * rng.randint(1, 3)
            if rng.random() < 0.4:
                images.append([1, h, w])
                row += [1] * (h * w // MERGE**2)
            else:
                t = rng.randint(1, 4)
                videos.append([t, h, w])
                for _ in range(t):
                    row += [0] * rng.randint(1, 3) + [2] * (h * w // MERGE**2)
            row += [0] * rng.randint(1, 2)  # transformers needs text between vision items
        rows.append(row)
    return padded(rows, images, videos, pad, rng.randint(0, 2))


def qwen3_get_rope_index(inputs):
    """transformers' Qwen3-VL get_rope_index (it only reads the merge size from the model)."""
    from types import SimpleNamespace

    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

    model = SimpleNamespace(config=SimpleNamespace(vision_config=SimpleNamespace(spatial_merge_size=MERGE)))
    model.get_vision_position_ids = lambda *a, **k: Qwen3VLModel.get_vision_position_ids(model, *a, **k)
    grids = inputs["video_grid_thw"]
    return Qwen3VLModel.get_rope_index(model, **{**inputs, "video_grid_thw": None if grids is None else grids.clone()})


@pytest.mark.parametrize("seed,pad", [(seed, pad) for seed in range(6) for pad in ("left", "right")])
@pytest.mark.parametrize("design", ["mrope-i", "mrope"])
def test_qwen3_video_grids_with_many_frames_equal_its_get_rope_index(seed, pad, design):
    inputs = qwen3_batch(seed, pad=pad)
    want_pos, want_delta = qwen3_get_rope_index(inputs)
    for split in (None, True):  # auto-detected from the timestamp-separated runs, or forced
        pos, delta = rope_index(**inputs, design=design, split_video_frames=split, dtype=torch.int64)
        assert pos.dtype == want_pos.dtype == torch.int64 and delta.dtype == want_delta.dtype
        assert torch.equal(pos, want_pos) and torch.equal(delta, want_delta)
        fpos, fdelta = rope_index(**inputs, design=design, split_video_frames=split)  # default float32
        assert fpos.dtype == torch.float32 and torch.equal(fpos, want_pos.float())
        assert torch.equal(fdelta, want_delta.float())


def test_qwen3_video_grids_are_not_split_when_told_not_to_or_when_frames_are_contiguous():
    inputs = qwen3_batch(0)
    assert (inputs["video_grid_thw"][:, 0] > 1).any()
    with pytest.raises(ValueError, match="do not split into whole videos"):
        rope_index(**inputs, design="mrope-i", split_video_frames=False)
    # Qwen2-VL input (frames of a video back to back): auto keeps the video whole, as Qwen2-VL does
    types = torch.tensor([[0, 0] + [2] * 8 + [0]])
    whole = rope_index(None, types, video_grid_thw=[[2, 4, 4]], design="mrope")[0]
    assert torch.equal(whole[:, 0, 2:10], positions("V2x2x2", "mrope").T + 2)
    split = rope_index(None, types, video_grid_thw=[[2, 4, 4]], design="mrope", split_video_frames=True)[0]
    assert torch.equal(split[:, 0, 2:10], positions("V1x2x2 V1x2x2", "mrope").T + 2)
    with pytest.raises(TypeError, match="`split_video_frames`"):
        rope_index(None, types, video_grid_thw=[[2, 4, 4]], split_video_frames="yes")


def test_int64_positions_equal_qwen25_and_are_refused_where_positions_are_fractional(qwen25):
    inputs, _, _ = random_batch(3, pad="left")
    want_pos, want_delta = qwen25.get_rope_index(**inputs)
    pos, delta = rope_index(**inputs, design="mrope", dtype=torch.int64)
    assert pos.dtype == want_pos.dtype and torch.equal(pos, want_pos) and torch.equal(delta.reshape(-1),
                                                                                       want_delta.reshape(-1))
    for design in ("circle", "v2pe"):  # fractional by construction, whatever the batch
        with pytest.raises(ValueError, match=f"`dtype`=torch.int64 .* design '{design}' places tokens at fractional"):
            rope_index(None, torch.tensor([[0, 0, 0]]), design=design, dtype=torch.int64)
    types = torch.tensor([[0] + [2] * 8 + [0]])
    with pytest.raises(ValueError, match="design 'videorope' with temporal_stride=0.5 places tokens at fractional"):
        rope_index(None, types, video_grid_thw=[[2, 4, 4]], design="videorope", temporal_stride=0.5, dtype=torch.int64)
    whole = rope_index(None, types, video_grid_thw=[[2, 4, 4]], design="videorope", dtype=torch.int64)[0]
    assert torch.equal(whole[:, 0, 1:9], positions("V2x2x2", "videorope").T.long() + 1)
    with pytest.raises(TypeError, match="`dtype`"):
        rope_index(None, types, video_grid_thw=[[2, 4, 4]], dtype=torch.float16)


TABLE_CASES = [(name, {}) for name in ropekit.designs()] + CIRCLE_CASES + [
    ("mrope", {"continuation": "spatial"}), ("vrope", {"order": "paper"}), ("videorope", {"temporal_stride": 0.7}),
    ("v2pe", {"visual_stride": 2.5}), ("mmrope", {"position_scale": (1.0, 0.5, 1.5)}), ("mhrope", {"spatial_reset": False})]


@pytest.mark.parametrize("design,opts", TABLE_CASES)
def test_block_rules_read_a_block_table_like_the_segments_it_holds(design, opts):
    """rope_index hands rules its distinct blocks as a column table; every rule must place them exactly as
    it places the same Image/Video segments (the path positions() and the walk use)."""
    rng = random.Random(len(design) * 31 + len(opts))
    segs = []
    for _ in range(40):
        if rng.random() < 0.5:
            segs.append(Image(rng.randint(1, 9), rng.randint(1, 9)))
        else:
            segs.append(Video(rng.randint(1, 4), rng.randint(1, 6), rng.randint(1, 6), rng.choice(EXACT + (0.7, 2.5))))
    table = registry.BlockTable(
        torch.tensor([getattr(s, "t", 1) for s in segs]), torch.tensor([s.h for s in segs]),
        torch.tensor([s.w for s in segs]), torch.tensor([getattr(s, "interval", 0.0) for s in segs], dtype=torch.float64),
        torch.tensor([isinstance(s, Image) for s in segs]))
    assert list(table) == segs and table[3] == segs[3] and table[-1] == segs[-1] and len(table) == len(segs)
    rule = registry.get_design(design).block_rule
    want, got = registry.unpack_placed(rule(segs, **opts)), registry.unpack_placed(rule(table, **opts))
    for w, g in zip(want, got):
        assert (w is None) == (g is None) and (w is None or torch.equal(w, g)), design


def test_a_mask_hole_inside_a_multi_frame_video_does_not_split_it(qwen2):
    """Auto frame splitting looks at the runs of *valid* video tokens: a masked token inside a Qwen2-VL video
    (frames back to back) breaks the raw run but must not make the video's frames separate blocks."""
    types = torch.tensor([[0, 0] + [2] * 4 + [0] + [2] * 4 + [0, 0]])  # one 2-frame video, a masked token inside
    mask = torch.ones_like(types)
    mask[0, 6] = 0
    inputs = dict(input_ids=torch.zeros_like(types), mm_token_type_ids=types, attention_mask=mask,
                  video_grid_thw=torch.tensor([[2, 4, 4]]))
    want_pos, want_delta = qwen2.get_rope_index(**inputs)
    pos, delta = rope_index(**inputs, continuation="spatial")
    assert torch.equal(pos, want_pos.float()) and torch.equal(delta, want_delta.float())
    assert torch.equal(pos[:, 0, mask[0].bool()][:, 2:10], positions("V2x2x2", "mrope").T + 2)


def test_masks_and_grids_of_any_real_dtype_give_the_int64_result():
    """The vectorised checks read masks and grids of every dtype the per-row checks accepted (bfloat16 has
    no numpy form, so it must not go through one)."""
    inputs, _, _ = random_batch(11, batch=3, pad="left")
    want = rope_index(**inputs)
    for dt in (torch.bfloat16, torch.float16, torch.float32, torch.bool, torch.uint8, torch.int32):
        got = rope_index(**{**inputs, "attention_mask": inputs["attention_mask"].to(dt)})
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), dt
    for dt in (torch.bfloat16, torch.float32, torch.int32, torch.uint8):
        got = rope_index(**{**inputs, "image_grid_thw": inputs["image_grid_thw"].to(dt),
                            "video_grid_thw": inputs["video_grid_thw"].to(dt)})
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), dt


# ---------------------------------------------------------------------------------------------------
# Blocks kept across calls (ropekit.block_cache): a kept block is only ever handed to the same rule and options

from ropekit import block_cache  # noqa: E402


def _per_layout(monkeypatch, design, kw):
    """rope_index of the same inputs through the per-layout path (no rule, so nothing kept)."""
    no_rule = registry.Design(**{**registry.get_design(design).__dict__, "block_rule": None})
    with monkeypatch.context() as m:
        m.setitem(registry._REGISTRY, registry.get_design(design).name, no_rule)
        return rope_index(**kw)


# options that change the placement of the same blocks, interleaved so that every call finds blocks kept by another
OPTION_SEQUENCES = [
    ("mrope", [{}, {"continuation": "spatial"}, {"continuation": "max"}, {}]),
    ("circle", [{}, {"alpha": 0.3}, {"radius": 10}, {"radius": 10.0}, {"radius": "auto", "k": 1.2}, {"delta": 0.5},
                {"text_vector": [1.0, 2.0, 0.5]}, {"text_vector": (1.0, 2.0, 0.5)}, {"dff_rate": True}, {"dff_rate": 1},
                {"dff_rate": 0.5}, {"measure": "max_abs"}, {}]),
    ("hope", [{"temporal_scale": 1}, {"temporal_scale": 1.5}, {"temporal_scale": 1.0}, {"temporal_scale": 0.5}]),
    ("videorope", [{}, {"temporal_stride": 0.7}, {"temporal_stride": 2}, {}]),
    ("vrope", [{}, {"order": "paper"}, {"spatial_dims": 2}, {}]),
    ("mmrope", [{}, {"position_scale": (1.0, 0.5, 1.5)}, {"position_scale": [1.0, 0.5, 2.0]},
                {"position_scale": torch.tensor([1.0, 2.0, 1.0])}, {}]),
    ("v2pe", [{}, {"increment": 0.5}, {"visual_stride": 2.5}, {"visual_stride": 3}, {}]),
    ("mhrope", [{}, {"spatial_reset": False}, {}]),
]


@pytest.mark.parametrize("design,sequence", OPTION_SEQUENCES)
def test_kept_blocks_never_reach_a_call_with_other_options(monkeypatch, design, sequence):
    """The same batches under options that differ (in value, or only in type: 10 and 10.0, True and 1, a list
    and a tuple), one call after another: every result equals the per-layout path, which keeps nothing."""
    block_cache.clear()
    batches = [big_random_batch(900 + seed, pad=("right", "left")[seed % 2], seconds=(0.35, 1.0, 2.0)) for seed in range(2)]
    for _ in range(2):  # the second round finds every block kept
        for opts in sequence:
            for inputs, spg in batches:
                kw = dict(inputs, design=design, tokens_per_second=2, **opts)
                if spg.numel():
                    kw["second_per_grid_ts"] = spg
                got, want = rope_index(**kw), _per_layout(monkeypatch, design, kw)
                assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (design, opts)


def test_kept_blocks_grow_with_longer_text_and_padding_and_stay_within_their_budget(monkeypatch):
    """Batches of growing length and new block shapes, a small budget that forces evictions and rebuilds,
    and no cache at all: results equal the per-layout path throughout, and the kept bytes stay in budget."""
    block_cache.clear()
    for budget in (block_cache.MAX_BYTES, 40_000, 0):
        monkeypatch.setattr(block_cache, "MAX_BYTES", budget)
        for seed in range(6):
            inputs, _ = big_random_batch(950 + seed, batch=3 + seed)
            types, mask = inputs["mm_token_type_ids"], inputs["attention_mask"]
            extra = 300 * seed  # long text and long padding: the zero and diagonal rows grow
            inputs["mm_token_type_ids"] = torch.cat([types, torch.zeros(types.shape[0], extra, dtype=torch.long)], 1)
            inputs["attention_mask"] = torch.cat([mask, torch.zeros_like(inputs["mm_token_type_ids"][:, :extra])], 1)
            inputs["attention_mask"][0, -extra:] = 1  # sample 0: the text runs on
            for design in ("mrope", "circle", "vrope", "vanilla"):
                kw = dict(inputs, design=design)
                got, want = rope_index(**kw), _per_layout(monkeypatch, design, kw)
                assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (budget, seed, design)
                kept = sum(a.nbytes for a in block_cache._ARENAS.values())
                assert kept <= budget and (budget or not block_cache._ARENAS)


def test_kept_blocks_belong_to_one_rule(monkeypatch):
    """Two designs of different rules never share blocks, even under one name: a design registered anew with
    another rule (as a test or a user may) gets its own placement."""
    types, ig = torch.tensor([[0, 1, 1, 1, 1, 0]]), [[1, 4, 4]]
    want_mrope = rope_index(None, types, ig, design="mrope")[0]
    rule = registry.get_design("mrope").block_rule
    shifted = lambda segments: tuple(x + 1.0 for x in rule(segments))  # noqa: E731
    other = registry.Design(**{**registry.get_design("mrope").__dict__, "block_rule": shifted})
    with monkeypatch.context() as m:
        m.setitem(registry._REGISTRY, "mrope", other)
        got = rope_index(None, types, ig, design="mrope")[0]
    assert torch.equal(got[:, 0, 1:5], want_mrope[:, 0, 1:5] + 1) and torch.equal(got[:, 0, 5], want_mrope[:, 0, 5] + 1)
    assert torch.equal(rope_index(None, types, ig, design="mrope")[0], want_mrope)


def test_kept_blocks_are_safe_to_share_between_threads(monkeypatch):
    import concurrent.futures

    block_cache.clear()
    jobs = [(design, opts, 970 + seed) for design, opts in [("mrope", {}), ("circle", {"alpha": 0.3}), ("circle", {}),
                                                            ("hope", {"temporal_scale": 1.5})] for seed in range(3)]
    want = [_per_layout(monkeypatch, d, dict(big_random_batch(s)[0], design=d, **o)) for d, o, s in jobs]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda j: rope_index(**big_random_batch(j[2])[0], design=j[0], **j[1]), jobs * 3))
    for g, w in zip(got, want * 3):
        assert torch.equal(g[0], w[0]) and torch.equal(g[1], w[1])


def test_what_padding_holds_does_not_matter():
    """Token types under the padding (any valid type) give the positions of zeros there, left or right."""
    for pad in ("left", "right"):
        inputs, _ = big_random_batch(990, pad=pad)
        noisy = dict(inputs)
        types, mask = inputs["mm_token_type_ids"].clone(), inputs["attention_mask"].bool()
        types[~mask] = torch.randint(0, 3, (int((~mask).sum()),), generator=torch.Generator().manual_seed(0))
        noisy["mm_token_type_ids"] = types
        for design in ("mrope", "circle"):
            got, want = rope_index(**noisy, design=design), rope_index(**inputs, design=design)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_kept_blocks_grow_past_their_first_rows(monkeypatch):
    """Batch after batch of new image shapes (more blocks and rows than an arena starts with), then a block too
    tall to be keyed: every result equals the per-layout path."""
    block_cache.clear()
    shapes = [(a, b) for a in range(1, 13) for b in range(1, 13)]
    for first in range(0, len(shapes), 36):
        rows, grids = [], []
        for a, b in shapes[first: first + 36]:
            rows.append([0] * (a % 3 + 1) + [1] * (a * b) + [0] * (b % 2 + 1))
            grids.append([1, 2 * a, 2 * b])
        inputs = padded(rows, grids, [], "right", 1)
        for design in ("mrope", "circle"):
            kw = dict(inputs, design=design)
            got, want = rope_index(**kw), _per_layout(monkeypatch, design, kw)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (first, design)
    assert block_cache._ARENAS and max(a.count for a in block_cache._ARENAS.values()) == len(shapes)
    types = torch.tensor([[0] + [1] * 2**20 + [0]])
    kw = dict(input_ids=None, mm_token_type_ids=types, image_grid_thw=[[1, 2**20, 1]], spatial_merge_size=1)
    got, want = rope_index(**kw), _per_layout(monkeypatch, "mrope", dict(kw, design="mrope"))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
