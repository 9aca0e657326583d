"""Published multimodal RoPE variants (MRoPE-I, MHRoPE, IL-RoPE, Omni-RoPE, VideoRoPE, HoPE, V2PE, MMRoPE).

References, all independent of ropekit's code:
- per-token float64 walks of each paper's position formulas (plain Python loops);
- a plain-Python re-enactment of the public Multimodal-RoPEs index function as described in
  ``multimodal-ropes-behaviour.md`` (Qwen3-VL token sequences with vision start/end tokens and timestamp
  text, frame-split video grids, padded batches), compared through ``ropekit.rope_index``;
- the frequency allocations written out pair by pair from the same description, transformers'
  Qwen3-VL rotary embedding for MRoPE-I, and a float64 per-head rotation for MHRoPE.
"""
import math
import random

import pytest
import torch
from transformers import Qwen3VLTextConfig
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

import ropekit
from ropekit import Image, Layout, RoPE, Text, Video, positions, rope_index
from ropekit.designs import registry

NEW = ["mrope-i", "mhrope", "ilrope", "omnirope", "videorope", "hope", "v2pe", "mmrope", "grape"]


# --------------------------------------------------------------------------------------------------
# float64 per-token walks of the papers' formulas


def frames(seg):
    """(frames, h, w) of a vision segment."""
    return (seg.t, seg.h, seg.w) if isinstance(seg, Video) else (1, seg.h, seg.w)


def walk_3d(layout, place):
    """Text on the diagonal from the running start p; ``place(seg, p)`` gives a vision segment's coordinates
    (one tuple per token) and the next p."""
    out, p = [], 0
    for seg in layout:
        if isinstance(seg, Text):
            out += [(p + k,) * 3 for k in range(seg.n)]
            p += seg.n
        else:
            coords, p = place(seg, p)
            out += coords
    return out


def walk_mrope_i(layout, spatial_reset=False):
    """MRoPE-I: each frame a block at s: (s, s+r, s+c) or, reset, (s, r, c); text resumes at s + max(h, w)."""
    def place(seg, p):
        t, h, w = frames(seg)
        out = []
        for _ in range(t):
            out += [(p, r, c) if spatial_reset else (p, p + r, p + c) for r in range(h) for c in range(w)]
            p += max(h, w)
        return out, p
    return walk_3d(layout, place)


def walk_videorope(layout, stride):
    """VideoRoPE: frame f at t = s + f·δ, h = t + i − (H−1)//2, w = t + j − (W−1)//2; text at s + (T−1)δ + 1."""
    def place(seg, p):
        t, h, w = frames(seg)
        out = []
        for f in range(t):
            tt = p + f * stride
            out += [(tt, tt + i - (h - 1) // 2, tt + j - (w - 1) // 2) for i in range(h) for j in range(w)]
        return out, p + (t - 1) * stride + 1
    return walk_3d(layout, place)


def walk_v2pe(layout, delta):
    """V2PE recurrence: previous + 1 for text, previous + δ for a visual token; a virtual token at −1."""
    out, q = [], -1.0
    for seg in layout:
        step = 1.0 if isinstance(seg, Text) else delta
        for _ in range(seg.num_tokens):
            q += step
            out.append((q,))
    return out


def walk_v2pe_public(layout, stride):
    """Public code: each frame's n tokens at last + i·(S/n); then last = ceil(last visual); text last + 1 …"""
    out, last = [], -1.0
    for seg in layout:
        if isinstance(seg, Text):
            for _ in range(seg.n):
                last += 1
                out.append((last,))
            continue
        t, h, w = frames(seg)
        for _ in range(t):
            n = h * w
            out += [(last + i * (stride / n),) for i in range(1, n + 1)]
            last = math.ceil(out[-1][0])
    return out


def walk_mmrope(layout, sh, sw):
    """MMRoPE: each frame a block at s: (s, s + σh·r, s + σw·c); the next starts at the block max + 1."""
    def place(seg, p):
        t, h, w = frames(seg)
        out = []
        for _ in range(t):
            block = [(p, p + sh * r, p + sw * c) for r in range(h) for c in range(w)]
            out += block
            p = max(max(x) for x in block) + 1
        return out, p
    return walk_3d(layout, place)


def random_layout(rng):
    segs = [Text(rng.randint(1, 3))] if rng.random() < 0.8 else []
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.5:
            segs.append(Image(rng.randint(1, 5), rng.randint(1, 5)))
        else:
            segs.append(Video(rng.randint(1, 3), rng.randint(1, 4), rng.randint(1, 4)))
        if rng.random() < 0.7:
            segs.append(Text(rng.randint(1, 4)))
    return Layout(segs)


PAPER_CASES = [
    ("mrope-i", {}, lambda lay: walk_mrope_i(lay)),
    ("mrope-i", {"spatial_reset": True}, lambda lay: walk_mrope_i(lay, True)),
    ("mhrope", {}, lambda lay: walk_mrope_i(lay, True)),  # the paper's MHRoPE uses the reset
    ("mhrope", {"spatial_reset": False}, lambda lay: walk_mrope_i(lay)),
    ("ilrope", {}, lambda lay: walk_mrope_i(lay, True)),
    ("omnirope", {}, lambda lay: walk_mrope_i(lay, True)),
    ("videorope", {}, lambda lay: walk_videorope(lay, 2.0)),  # the paper's δ = 2
    ("videorope", {"temporal_stride": 0.5}, lambda lay: walk_videorope(lay, 0.5)),
    ("hope", {}, lambda lay: walk_videorope(lay, 1.0)),
    ("hope", {"temporal_scale": 1.25}, lambda lay: walk_videorope(lay, 1.25)),
    ("v2pe", {}, lambda lay: walk_v2pe(lay, 1 / 16)),
    ("v2pe", {"increment": 0.25}, lambda lay: walk_v2pe(lay, 0.25)),
    ("v2pe", {"visual_stride": 16.0}, lambda lay: walk_v2pe_public(lay, 16.0)),
    ("mmrope", {}, lambda lay: walk_mmrope(lay, 1.0, 1.0)),
    ("mmrope", {"position_scale": (1.0, 0.5, 2.0)}, lambda lay: walk_mmrope(lay, 0.5, 2.0)),
]


@pytest.mark.parametrize("design,opts,ref", PAPER_CASES)
def test_positions_equal_the_papers_formulas(design, opts, ref):
    rng = random.Random(design + str(opts))
    for _ in range(20):
        lay = random_layout(rng)
        want = torch.tensor(ref(lay), dtype=torch.float64).reshape(lay.num_tokens, -1)
        got = positions(lay, design, **opts)
        assert got.dtype == torch.float32
        assert torch.equal(got, want.to(torch.float32)), (design, opts, str(lay))


@pytest.mark.parametrize("design", NEW)
def test_text_only_is_the_1d_diagonal(design):
    got = positions("T7", design)
    assert torch.equal(got, torch.arange(7.0)[:, None].expand_as(got))


def test_block_rules_equal_brute_force_and_place_many_blocks_at_once():
    segs = [Image(2, 3), Video(3, 2, 2), Image(1, 1), Video(2, 3, 1), Image(4, 1)]
    for design in NEW:
        rule = registry.get_design(design).block_rule
        assert rule is not None, design
        placed = rule(segs)
        one = [rule([s]) for s in segs]
        for i in range(len(placed)):
            if placed[i].ndim == 2:
                assert torch.equal(placed[i], torch.cat([o[i] for o in one])), design
        empty = rule([])
        assert empty[0].shape == (0, placed[1].shape[1]) and empty[1].shape == (0, placed[1].shape[1])


def test_peer_names_are_aliases():
    for alias, name in [("mrope-interleave", "mrope-i"), ("vanilla-rope", "vanilla"), ("videorope", "videorope"),
                        ("circlerope", "circle"), ("omni-rope", "omnirope"), ("il-rope", "ilrope")]:
        assert ropekit.get_design(alias).name == name
    assert torch.equal(positions("T2 I2x2 T1", "mrope-interleave"), positions("T2 I2x2 T1", "mrope-i"))
    with pytest.raises(ValueError, match="already names another design"):
        registry.alias("mrope", "vanilla-rope")


# --------------------------------------------------------------------------------------------------
# the public code's index function, re-enacted from its behaviour description (Qwen3-VL token format)

VS, VE, IMG, VID = 90, 91, 92, 93


def qwen3_sample(rng):
    """Token ids of one Qwen3-VL sample and its (patch) grids: text, images, videos with timestamp text."""
    ids, images, videos = [], [], []
    if rng.random() < 0.7:
        ids += [rng.randint(1, 80) for _ in range(rng.randint(1, 4))]
    for _ in range(rng.randint(1, 3)):
        h, w = 2 * rng.randint(1, 4), 2 * rng.randint(1, 4)
        if rng.random() < 0.5:
            images.append([1, h, w])
            ids += [VS] + [IMG] * (h * w // 4) + [VE]
        else:
            t = rng.randint(1, 3)
            videos.append([t, h, w])
            for _ in range(t):  # "<0.5 seconds>" then the frame
                ids += [rng.randint(1, 80) for _ in range(rng.randint(1, 3))] + [VS] + [VID] * (h * w // 4) + [VE]
        ids += [rng.randint(1, 80) for _ in range(rng.randint(0, 3))]
    return ids, images, videos


def peer_row(toks, images, videos, variant, opts):
    """Positions (3 rows) and the largest value M of one valid row, as the public code computes them.
    ``images``/``videos`` are iterators over token grids (h', w'), videos already split per frame."""
    pos, st = [], 0
    nblocks = sum(1 for i in range(len(toks) - 1) if toks[i] == VS and toks[i + 1] in (IMG, VID))
    shift = last = 0.0
    last = -1.0
    nxt = 0.0  # where the next text span starts

    def text(n):
        nonlocal nxt, shift, last
        for k in range(n):
            if variant == "v2pe":
                last += 1
                pos.append((last,) * 3)
            elif variant in ("ilrope", "omnirope"):
                pos.append((shift,) * 3)
                shift += 1
            else:
                pos.append((nxt + k,) * 3)
        if variant not in ("v2pe", "ilrope", "omnirope"):
            nxt += n

    for _ in range(nblocks):
        ed_i = toks.index(IMG, st) if IMG in toks[st:] else len(toks)
        ed_v = toks.index(VID, st) if VID in toks[st:] else len(toks)
        hh, ww = next(images) if ed_i < ed_v else next(videos)
        ed = min(ed_i, ed_v)
        text(ed - st)
        s0 = nxt
        cells = [(r, c) for r in range(hh) for c in range(ww)]
        if variant == "v2pe":
            n, stride = hh * ww, opts["visual_stride"]
            block = [(last + i * (stride / n),) * 3 for i in range(1, n + 1)]
            last = math.ceil(block[-1][0])
        elif variant in ("ilrope", "omnirope"):
            block = [(shift, r, c) for r, c in cells]
            shift += max(1, hh, ww)
        elif variant in ("videorope", "hope"):
            block = [(s0, s0 + r - (hh - 1) // 2, s0 + c - (ww - 1) // 2) for r, c in cells]
            nxt = s0 + 1
        elif variant == "mmrope":
            _, sh, sw = opts.get("position_scale", (1, 1, 1))
            block = [(s0, s0 + sh * r, s0 + sw * c) for r, c in cells]
            nxt = max(max(b) for b in block) + 1
        else:  # mrope-interleave / mhrope
            if opts.get("spatial_reset"):
                block = [(s0, r, c) for r, c in cells]
            else:
                block = [(s0, s0 + r, s0 + c) for r, c in cells]
            nxt = s0 + max(hh, ww)
        pos += block
        st = ed + hh * ww
        if variant in ("mrope-i", "mhrope") and opts.get("spatial_reset") and st < len(toks):
            pos.append((nxt,) * 3)  # the token after the block is taken as <vision_end>
            nxt, st = nxt + 1, st + 1
    text(len(toks) - st)
    if variant in ("videorope", "hope"):
        top = max(p[0] for p in pos)
    elif variant == "v2pe":
        top = math.ceil(max(p[0] for p in pos))
    else:
        top = max(max(p) for p in pos)
    return pos, top


PEER_CASES = [
    ("mrope-i", {}), ("mrope-i", {"spatial_reset": True}), ("mhrope", {"spatial_reset": False}),
    ("mhrope", {"spatial_reset": True}), ("ilrope", {}), ("omnirope", {}), ("videorope", {}), ("hope", {}),
    ("v2pe", {"visual_stride": 16.0}), ("mmrope", {}), ("mmrope", {"position_scale": (1.0, 1.5, 0.5)}),
]


@pytest.mark.parametrize("pad", ["left", "right"])
@pytest.mark.parametrize("design,opts", PEER_CASES)
def test_rope_index_equals_the_public_code_on_qwen3_batches(design, opts, pad):
    rng = random.Random(f"{design}{opts}{pad}")
    samples = [qwen3_sample(rng) for _ in range(4)]
    length = max(len(s[0]) for s in samples) + rng.randint(0, 3)
    ids = torch.zeros(len(samples), length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    images = [g for s in samples for g in s[1]]
    videos = [g for s in samples for g in s[2]]
    frames_split = [[1, h, w] for t, h, w in videos for _ in range(t)]  # the public code's per-frame split
    img_it = iter([(h // 2, w // 2) for _, h, w in images])
    vid_it = iter([(h // 2, w // 2) for _, h, w in frames_split])
    want, tops = [], []
    for b, (row, _, _) in enumerate(samples):
        sl = slice(0, len(row)) if pad == "right" else slice(length - len(row), length)
        ids[b, sl] = torch.tensor(row)
        mask[b, sl] = 1
        p, top = peer_row(row, img_it, vid_it, design, opts)
        want.append(torch.tensor(p, dtype=torch.float64).T)
        tops.append(top)
    types = (ids == IMG).long() + 2 * (ids == VID).long()
    pos, delta = rope_index(ids, types, torch.tensor(images) if images else None,
                            torch.tensor(frames_split) if frames_split else None, mask, design=design, **opts)
    for b in range(len(samples)):
        valid = mask[b].bool()
        got = pos[:, b, valid]
        assert torch.equal(got, want[b][: got.shape[0]].to(torch.float32)), (design, opts, b)
        # the public code subtracts the padded length; ropekit the number of valid tokens (HF's rule)
        assert delta[b, 0].item() == pytest.approx(tops[b] + 1 - int(valid.sum()), abs=1e-5)


# --------------------------------------------------------------------------------------------------
# frequency allocations, pair by pair


def axes_from_description(name, half=64):
    """Axis (0 t, 1 h, 2 w, None = not rotated) of each pair, written out from the behaviour description."""
    if name == "mrope-interleave":
        return [1 if j % 3 == 1 and j < 60 else 2 if j % 3 == 2 and j < 60 else 0 for j in range(half)]
    if name == "videorope-public":
        return [0 if j == 0 or j >= 48 else 1 if j % 2 else 2 for j in range(half)]
    if name == "videorope":  # the paper's figure: h, w, h, w, …, then t on the 16 lowest frequencies
        return [0 if j >= 48 else 2 if j % 2 else 1 for j in range(half)]
    if name in ("hope", "hope-public"):
        base = axes_from_description(name.replace("hope", "videorope"), half)
        return [None if a == 0 else a for a in base]
    if name == "mmrope":
        return [[0, 0, 1, 2, 1, 2, 1, 2][j % 8] for j in range(half)]
    if name == "mrope":
        return [0] * 16 + [1] * 24 + [2] * 24
    raise KeyError(name)


@pytest.mark.parametrize("alloc", ["mrope-interleave", "videorope", "videorope-public", "hope", "hope-public", "mmrope"])
def test_allocations_assign_pairs_as_described(alloc):
    W = ropekit.frequency_matrix(alloc, 128, 3, base=1e6)
    inv = ropekit.inv_freq(128, 1e6)
    for j, a in enumerate(axes_from_description(alloc)):
        col = torch.zeros(3)
        if a is not None:
            col[a] = inv[j]
        assert torch.equal(W[:, j], col), (alloc, j)


def test_videorope_counts_follow_the_paper_and_the_public_code():
    def counts(alloc):
        W = ropekit.frequency_matrix(alloc, 128, 3)
        return [int((W[a] != 0).sum()) for a in range(3)]
    assert counts("videorope") == [16, 24, 24]
    assert counts("videorope-public") == [17, 24, 23]
    assert counts("mmrope") == [16, 24, 24]


def test_mrope_interleave_cos_sin_equal_transformers_qwen3_vl():
    cfg = Qwen3VLTextConfig(hidden_size=256, num_attention_heads=2, head_dim=128, rope_parameters={
        "rope_type": "default", "rope_theta": 5e6, "mrope_section": [24, 20, 20], "mrope_interleaved": True})
    emb = Qwen3VLTextRotaryEmbedding(cfg)
    coords = positions("T3 I4x6 T2 V2x2x4 T3", "mrope-i", spatial_reset=True)
    cos_ref, sin_ref = emb(torch.zeros(1, coords.shape[0], 128), coords.T[:, None].long())
    cos, sin = RoPE("mrope-i", head_dim=128, base=5e6).cos_sin(coords)
    assert torch.equal(torch.cat([cos, cos], -1), cos_ref[0]) and torch.equal(torch.cat([sin, sin], -1), sin_ref[0])


@pytest.mark.parametrize("design,alloc", [("mrope-i", "mrope-interleave"), ("ilrope", "mrope-interleave"),
                                          ("omnirope", "mrope"), ("videorope", "videorope"), ("hope", "hope"),
                                          ("mmrope", "mmrope"), ("v2pe", None)])
def test_cos_sin_equal_float64_per_pair_rotation(design, alloc):
    coords = positions("T3 I3x5 T2 V2x2x3 T4", design)
    cos, sin = RoPE(design, head_dim=128, base=1e6).cos_sin(coords)
    inv = 1e6 ** (-torch.arange(0, 128, 2, dtype=torch.float64) / 128)
    axes = [0] * 64 if alloc is None else axes_from_description(alloc)
    c64 = coords.double()
    ang = torch.stack([c64[:, a] * inv[j] if a is not None else torch.zeros(len(c64), dtype=torch.float64)
                       for j, a in enumerate(axes)], 1)
    torch.testing.assert_close(cos.double(), ang.cos(), rtol=0, atol=2e-5)
    torch.testing.assert_close(sin.double(), ang.sin(), rtol=0, atol=2e-5)


def test_hope_text_keeps_spatial_pairs_and_zeroes_time():
    coords = positions("T9", "hope")
    cos, sin = RoPE("hope", head_dim=64).cos_sin(coords)
    W = ropekit.frequency_matrix("hope", 64, 3)
    temporal = W.abs().sum(0) == 0
    assert int(temporal.sum()) == 8  # the lowest quarter
    assert torch.equal(cos[:, temporal], torch.ones(9, 8)) and torch.equal(sin[:, temporal], torch.zeros(9, 8))
    plain_cos, _ = RoPE("vanilla", head_dim=64).cos_sin(positions("T9", "vanilla"))
    assert torch.equal(cos[:, ~temporal], plain_cos[:, ~temporal])


# --------------------------------------------------------------------------------------------------
# MHRoPE: whole heads per axis, a per-head W, no special case in apply


def brute_force_heads(x, coords, head_axis, base=1e4):
    """float64 rotate-half rotation of every head h by the coordinate on axis ``head_axis[h]`` (None: none)."""
    B, H, L, D = x.shape
    inv = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    out = x.double().clone()
    for h, a in enumerate(head_axis):
        if a is None:
            continue
        ang = coords[:, a].double()[:, None] * inv
        x1, x2 = out[:, h, :, : D // 2].clone(), out[:, h, :, D // 2:].clone()
        out[:, h, :, : D // 2] = x1 * ang.cos() - x2 * ang.sin()
        out[:, h, :, D // 2:] = x2 * ang.cos() + x1 * ang.sin()
    return out


@pytest.mark.parametrize("seq_dim", [-2, 1])
def test_mhrope_rotates_whole_heads_per_axis_like_a_float64_brute_force(seq_dim):
    rope = RoPE("mhrope", head_dim=32, sections=[2, 3, 3, 1])  # 9 KV heads, the last one not rotated
    coords = positions("T2 I3x4 T3 V2x2x2 T2", "mhrope")
    L = coords.shape[0]
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 18, L, 32, generator=g, dtype=torch.float64)  # 2 query heads per KV head
    k = torch.randn(2, 9, L, 32, generator=g, dtype=torch.float64)
    kv_axis = [0, 0, 1, 1, 1, 2, 2, 2, None]
    if seq_dim == 1:
        rq, rk = rope.rotate(q.transpose(1, 2), k.transpose(1, 2), coords, seq_dim=1)
        rq, rk = rq.transpose(1, 2), rk.transpose(1, 2)
    else:
        rq, rk = rope.rotate(q, k, coords)
    torch.testing.assert_close(rk, brute_force_heads(k, coords, kv_axis), rtol=0, atol=1e-5)
    torch.testing.assert_close(rq, brute_force_heads(q, coords, [kv_axis[i // 2] for i in range(18)]), rtol=0, atol=1e-5)
    assert torch.equal(rk[:, 8], k[:, 8])  # the leftover head: no rotation at all


def test_mhrope_per_head_tables_broadcast_over_batch_and_match_the_shared_apply():
    W = ropekit.frequency_matrix("mhrope", 16, 3, sections=[1, 1, 1])
    assert W.shape == (3, 3, 8)
    coords = positions("T2 I2x3 T1", "mhrope").expand(4, -1, -1)  # batched coords
    ang = ropekit.angles(coords, W)
    assert ang.shape == (4, 3, 9, 8)
    x = torch.randn(4, 3, 9, 16)
    cos, sin = ropekit.cos_sin(ang)
    shared = [ropekit.apply_rotary(x[:, h:h + 1], *ropekit.cos_sin(ropekit.angles(coords, W[h]))) for h in range(3)]
    assert torch.equal(ropekit.apply_rotary(x, cos, sin), torch.cat(shared, 1))
    assert torch.equal(ropekit.apply_rotary_fused(x, cos[:1], sin[:1]), ropekit.apply_rotary(x, cos[:1], sin[:1]))


def test_mhrope_head_count_mismatch_and_hf_patching_fail_clearly():
    rope = RoPE("mhrope", head_dim=16)  # default 2/3/3 of 8 KV heads
    q = torch.randn(1, 12, 5, 16)
    with pytest.raises(ValueError, match="multiple of 8"):
        rope.rotate(q, q, "T5")
    with pytest.raises(ValueError, match="sections"):
        ropekit.frequency_matrix("mhrope", 16, 3, sections=[2, 3])


# --------------------------------------------------------------------------------------------------
# HoPE randomness, options, errors


def test_hope_draws_per_sample_from_its_generator_only():
    lay = "T2 V3x2x2 T2"
    state, py_state = torch.random.get_rng_state(), random.getstate()
    a = [positions(lay, "hope", scales=(0.5, 1.5), generator=torch.Generator().manual_seed(s)) for s in range(6)]
    b = [positions(lay, "hope", scales=(0.5, 1.5), generator=s) for s in range(6)]
    assert torch.equal(torch.random.get_rng_state(), state) and random.getstate() == py_state
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    allowed = [positions(lay, "hope", temporal_scale=g) for g in (0.5, 1.5)]
    assert all(any(torch.equal(x, w) for w in allowed) for x in a)
    assert not all(torch.equal(a[0], x) for x in a)  # both scales get drawn over six samples
    g = torch.Generator().manual_seed(0)  # one generator, consecutive samples: independent draws
    draws = {positions(lay, "hope", scales=(0.5, 1.0, 1.5), generator=g)[-1, 0].item() for _ in range(12)}
    assert len(draws) > 1


@pytest.mark.parametrize("design,opts,match", [
    ("mrope-i", {"spatial_reset": 1}, "spatial_reset"),
    ("videorope", {"temporal_stride": 0}, "temporal_stride"),
    ("videorope", {"temporal_stride": float("nan")}, "temporal_stride"),
    ("hope", {"temporal_scale": -1.0}, "temporal_scale"),
    ("hope", {"scales": (0.5, 1.0)}, "generator"),
    ("hope", {"generator": 3}, "scales"),
    ("hope", {"scales": (), "generator": 1}, "at least one"),
    ("v2pe", {"increment": 0.0}, "increment"),
    ("v2pe", {"visual_stride": float("inf")}, "visual_stride"),
    ("mmrope", {"position_scale": (1.0, 2.0)}, "position_scale"),
    ("mmrope", {"position_scale": (1.0, 0.0, 1.0)}, "position_scale"),
    # strings and ints too large for a float: the option's name, never Python's bare conversion error
    ("mmrope", {"position_scale": "1:2"}, "`position_scale`"),
    ("mmrope", {"position_scale": ("1", 1.0, 1.0)}, "`position_scale`"),
    ("mmrope", {"position_scale": (1.0, 10**400, 1.0)}, "`position_scale`"),
    ("videorope", {"temporal_stride": 10**400}, "`temporal_stride`"),
    ("v2pe", {"increment": 10**400}, "`increment`"),
    ("v2pe", {"visual_stride": -(10**400)}, "`visual_stride`"),
    ("v2pe", {"visual_stride": 2**200}, "visual_stride=.* not finite float32"),  # its ceiling was an int overflow
    ("mmrope", {"position_scale": torch.tensor(2.0)}, "`position_scale`"),
    ("hope", {"temporal_scale": 10**400}, "`temporal_scale`"),
    ("hope", {"scales": (1.0, 10**400), "generator": 0}, "`scales`"),
    ("hope", {"scales": (1.0,), "generator": 2**70}, "`generator`"),
    ("hope", {"scales": (1.0,), "generator": -1}, "`generator`"),
    ("mmrope", {"position_scale": ":"}, "position_scale"),  # a string of non-numbers (found by hypothesis)
    ("v2pe", {"visual_stride": 1e39}, "visual_stride"),  # beyond float32 (found by hypothesis)
])
def test_bad_options_fail_clearly(design, opts, match):
    with pytest.raises((ValueError, TypeError), match=match):
        positions("T2 I2x2 T1", design, **opts)


@pytest.mark.parametrize("design", NEW)
def test_every_variant_declares_its_axis_count_before_placing(design, monkeypatch):
    """The axis count is known before placing (so oversized work is refused before allocating) and is the
    number of columns the design returns."""
    lay = Layout.parse("T2 I2x2 V2x2x2 T1")
    declared = registry.num_axes(registry.get_design(design), lay, {})
    assert declared == positions(lay, design).shape[1]
    monkeypatch.setattr(registry, "MAX_WORK", lay.num_tokens * declared - 1)
    with pytest.raises(ValueError, match="MAX_WORK"):
        positions(lay, design)


def test_hope_random_scales_are_refused_by_the_batched_index():
    types = torch.tensor([[0, 1, 1, 1, 1, 0]])
    with pytest.raises(ValueError, match="per sample"):
        rope_index(None, types, [[1, 4, 4]], design="hope", scales=(0.5, 1.0), generator=0)


@pytest.mark.parametrize("alloc,kw,match", [
    ("videorope", {"sections": [16, 20, 28]}, "h == w"),
    ("mmrope", {"sections": [16, 24, 24]}, "fixed pattern"),
    ("mrope-interleave", {"sections": [4, 30, 30]}, "interleave"),
    ("hope", {"num_axes": 2}, "num_axes=3"),
])
def test_bad_allocation_arguments_fail_clearly(alloc, kw, match):
    num_axes = kw.pop("num_axes", 3)
    with pytest.raises(ValueError, match=match):
        ropekit.frequency_matrix(alloc, 128, num_axes, **kw)


# --------------------------------------------------------------------------------------------------
# batched indexing and decoding


@pytest.mark.parametrize("design,opts", [(d, {}) for d in NEW] + [("mrope-i", {"spatial_reset": True}),
                                                                  ("v2pe", {"visual_stride": 16.0})])
def test_batched_index_equals_the_per_layout_path(monkeypatch, design, opts):
    from test_index import big_random_batch, with_holes

    no_rule = registry.Design(**{**registry.get_design(design).__dict__, "block_rule": None})
    for seed, pad in [(0, "right"), (1, "left")]:
        inputs, spg = big_random_batch(700 + seed, pad=pad)
        if seed:
            inputs = with_holes(inputs, seed)
        fast = rope_index(**inputs, design=design, **opts)
        with monkeypatch.context() as m:
            m.setitem(registry._REGISTRY, registry.get_design(design).name, no_rule)
            slow = rope_index(**inputs, design=design, **opts)
        assert torch.equal(fast[0], slow[0]) and torch.equal(fast[1], slow[1]), (design, opts, seed)


def test_videorope_decoding_continues_where_text_would():
    """The rows of an image reach past the text after it; the next token goes after the last text token."""
    types = torch.tensor([[0, 0] + [1] * 16 + [0]])
    pos, delta = rope_index(None, types, [[1, 8, 8]], design="videorope")
    full = positions("T2 I4x4 T2", "videorope")
    nxt = ropekit.decode_positions(delta, 19, 1, 3)
    assert torch.equal(nxt[:, 0, 0], full[-1])
    assert full[:-1].max() + 1 > full[-1, 0]  # the overall max of the prompt + 1 would skip a position


# --------------------------------------------------------------------------------------------------
# the variants table in docs/designs.md states facts: check them


def _doc_rows():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "designs.md").read_text()
    section = text.split("## Published multimodal variants", 1)[1]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| `")]
    return {r[0].strip().strip("`"): [c.strip() for c in r] for r in rows}


def _shift_invariant(design, **opts):
    lay = "T2 I3x4 T3 V2x2x2 T2 I2x5 T1"
    a, b = positions(lay, design, **opts).double(), positions("T3 " + lay, design, **opts)[3:].double()
    return bool(torch.allclose(b - a, torch.full_like(a, 3.0), rtol=0, atol=1e-5))


def test_docs_table_ptd_and_shift_invariance_are_true():
    rows = _doc_rows()
    assert sorted(rows) == sorted(NEW)
    for name, cells in rows.items():
        assert float(cells[5]) == pytest.approx(ropekit.layout_ptd("I3x3 T5", name), abs=5e-4), name
        claim = cells[4]
        assert _shift_invariant(name) == claim.startswith("yes"), name
    assert not _shift_invariant("mrope-i", spatial_reset=True)  # "no with spatial_reset=True"
    assert _shift_invariant("mhrope", spatial_reset=False)  # "yes without"


@pytest.mark.parametrize("mode", ["chunked", "interleaved"])
def test_grape_canonical_is_three_commuting_axis_rotations(mode):
    """GRAPE's canonical multimodal form: each frequency pair turns with one axis, the pair → axis map being
    M-RoPE's chunks (16/24/24 of 64, scaled) or ``j mod 3``; positions are M-RoPE's per video frame. Reference:
    float64 angles pair by pair from that description, and the ``mrope-i`` coordinates."""
    lay = "T2 I3x4 T3 V2x2x2 T2"
    opts = {} if mode == "chunked" else {"frequency_allocation": mode}
    assert torch.equal(positions(lay, "grape", **opts), positions(lay, "mrope-i"))
    rope = ropekit.RoPE("grape", head_dim=32, design_options=opts)
    cos, sin = rope.cos_sin(positions(lay, "grape", **opts))
    half = 16
    owner = [0] * 2 + [1] * 3 + [2] * 3 if mode == "chunked" else [j % 3 for j in range(8)]
    owner = [owner[j * 8 // half] if mode == "chunked" else j % 3 for j in range(half)]
    coords = positions(lay, "grape", **opts).double()
    inv = [10000.0 ** (-2 * j / 32) for j in range(half)]
    angle = torch.stack([coords[:, owner[j]] * inv[j] for j in range(half)], dim=1)
    torch.testing.assert_close(cos.double(), angle.cos(), rtol=0, atol=2e-6)
    torch.testing.assert_close(sin.double(), angle.sin(), rtol=0, atol=2e-6)
    with pytest.raises(ValueError, match="frequency_allocation"):
        positions(lay, "grape", frequency_allocation="axis")


def test_mhrope_kernel_is_the_mean_of_its_heads():
    """Isotropic q = k: a head rotating every pair by one axis has kernel mean_j cos(Δ_axis·ω_j); a head
    with no rotation has kernel 1; MHRoPE's kernel averages its heads."""
    bias = ropekit.attention_bias_map("T2 V2x2x3 T3", "mhrope", head_dim=16)
    coords = positions("T2 V2x2x3 T3", "mhrope").double()
    inv = 1e4 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    text, video = coords[-3:], coords[2:14]
    per_axis = [torch.cos((video[None, :, a] - text[:, None, a])[..., None] * inv).mean(-1).mean(0) for a in range(3)]
    want = (2 * per_axis[0] + 3 * per_axis[1] + 3 * per_axis[2]) / 8  # default heads 2/3/3
    torch.testing.assert_close(bias.reshape(-1).double(), want, rtol=0, atol=1e-6)


def test_apply_rejects_per_head_tables_that_do_not_match_the_heads():
    cos = torch.ones(1, 3, 5, 4)
    with pytest.raises(ValueError, match="3 per-head tables but `x` has 6 heads"):
        ropekit.apply_rotary(torch.randn(2, 6, 5, 8), cos, cos)
    with pytest.raises(ValueError, match="per-head tables"):
        ropekit.apply_rotary_qk_fused(torch.randn(2, 5, 6, 8), torch.randn(2, 5, 6, 8), cos, cos, seq_dim=1)


def test_hope_index_draws_one_scale_per_sample_like_positions_would():
    from ropekit import hope_index

    types = torch.tensor([[0, 0] + [2] * 12 + [0, 0]] * 6)  # one 3-frame 2x2 video per sample
    videos = [[3, 4, 4]] * 6
    pos, delta, drawn = hope_index(None, types, None, videos, scales=(0.5, 1.0, 1.5), generator=7)
    g = torch.Generator().manual_seed(7)
    for b in range(6):
        own = positions("T2 V3x2x2 T2", "hope", scales=(0.5, 1.0, 1.5), generator=g)
        assert torch.equal(pos[:, b], own.T)
        assert torch.equal(own, positions("T2 V3x2x2 T2", "hope", temporal_scale=float(drawn[b])))
        assert delta[b, 0].item() == pytest.approx(own[:, 0].max().item() + 1 - 16)
    assert len(set(drawn.tolist())) > 1


def test_patch_model_refuses_a_per_head_allocation_clearly():
    from test_hf import _qwen2_cfg
    from transformers import Qwen2VLForConditionalGeneration

    model = Qwen2VLForConditionalGeneration(_qwen2_cfg(1)).eval()
    with pytest.raises(ValueError, match="per-head allocation 'mhrope'"):
        ropekit.patch_model(model, "mhrope")
    ropekit.patch_model(model, "mhrope", allocation="mrope-interleave")  # its positions with a shared allocation
    ropekit.unpatch_model(model)


def test_v2pe_huge_visual_stride_within_float32_is_placed_or_refused_cleanly():
    """⌈S⌉ of a stride near the float32 maximum is a huge int: it must not overflow the tensor maths."""
    assert torch.equal(positions("T3", "v2pe", visual_stride=3.3e38), torch.arange(3.0)[:, None])
    with pytest.raises(ValueError, match="v2pe"):
        positions("T1 I2x2 T1 I2x2", "v2pe", visual_stride=3.3e38)
