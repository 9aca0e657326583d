"""Circle-RoPE (CIP): a per-token re-computation of paper §4.1 (docs/conventions.md, "Circle-RoPE"), and its invariants."""
import math
import random

import pytest
import torch

import ropekit
from ropekit.analysis.metrics import layout_ptd, ptd
from ropekit.designs.circle import circle_blocks, ring_offsets
from ropekit.designs.registry import get_design


def reference_ring(h, w, alpha=0.5, radius=10.0, k=1.0, measure="l2", n=(1.0, 1.0, 1.0), dff_rate=0.0):
    """Straight from the rules of docs/conventions.md ("Circle-RoPE") with Python floats, one token at a time; returns [(t, h, w)]."""
    xs = [j for i in range(h) for j in range(w)]
    ys = [i for i in range(h) for j in range(w)]
    cx, cy = (max(xs) + min(xs)) / 2, (max(ys) + min(ys)) / 2
    xc = [x - cx for x in xs]
    yc = [0.0 if y == cy else y - cy for y in ys]
    ang = [math.atan2(y, x) for x, y in zip(xc, yc)]
    lo, hi = min(ang), max(ang)
    N = h * w
    if radius == "auto":
        if measure == "l2":
            R = k * max(math.hypot(x, y) for x, y in zip(xc, yc))
        else:
            R = k * max(max(abs(x), abs(y)) for x, y in zip(xc, yc))
    else:
        R = radius
    norm = math.sqrt(sum(c * c for c in n))
    nx, ny, nz = (c / norm for c in n)
    ul = math.hypot(nx, ny)
    u = (-ny / ul, nx / ul, 0.0) if ul > 0 else (1.0, 0.0, 0.0)
    v = (ny * u[2] - nz * u[1], nz * u[0] - nx * u[2], nx * u[1] - ny * u[0])
    out = []
    for idx in range(N):
        sa = (ang[idx] - lo) / (hi - lo) * 2 * math.pi if hi - lo > 0 else 0.0
        th = alpha * sa + (1 - alpha) * 2 * math.pi * idx / N
        a, b = R * math.cos(th), R * math.sin(th)
        # the released code's dff_rate: the ring blended with the centred grid laid in the same plane
        a, b = (1 - dff_rate) * a + dff_rate * xc[idx], (1 - dff_rate) * b + dff_rate * yc[idx]
        c = [a * u[m] + b * v[m] for m in range(3)]
        out.append((c[2], c[1], c[0]))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_ring_matches_per_token_reference(seed):
    rnd = random.Random(seed)
    h, w = rnd.randint(1, 7), rnd.randint(1, 7)
    opts = dict(alpha=rnd.choice([0.0, 0.3, 0.5, 1.0]), radius=rnd.choice([10.0, 3.5, "auto"]),
                k=rnd.choice([1.0, 2.0]), measure=rnd.choice(["l2", "max_abs"]))
    n = rnd.choice([(1.0, 1.0, 1.0), (0.2, -1.0, 0.7), (0.0, 0.0, 2.0)])
    got = ring_offsets(h, w, text_vector=n, **opts)
    ref = torch.tensor(reference_ring(h, w, n=n, **opts), dtype=torch.float64)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("rate", [0.25, 0.5, 1.0, True])
def test_dff_rate_blends_the_ring_with_the_centred_grid_in_its_plane(rate):
    """Circle-RoPE's released ``dff_rate``: ``(1 − r)·ring + r·grid`` in the plane orthogonal to the text
    vector (True is 1). The points stay in that plane; off the ring, PTD is no longer 0."""
    for h, w, n in [(3, 4, (1.0, 1.0, 1.0)), (2, 5, (0.2, -1.0, 0.7)), (4, 4, (0.0, 0.0, 2.0))]:
        got = ring_offsets(h, w, text_vector=n, dff_rate=rate)
        ref = torch.tensor(reference_ring(h, w, n=n, dff_rate=float(rate)), dtype=torch.float64)
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)
        normal = torch.tensor(n[::-1], dtype=torch.float64)  # offsets are (t, h, w); the vector is (w, h, t)
        assert float((got @ normal).abs().max()) < 1e-12
    lay = ropekit.Layout.parse("T2 I3x3 T3 V2x2x3@1.5 T1")
    pos = ropekit.positions(lay, "circle", dff_rate=rate)
    assert torch.equal(pos, ropekit.positions(lay, "circle", dff_rate=float(rate)))
    one = ropekit.Layout.parse("I3x3 T5")  # one image: PTD 0 on the ring, not off it
    text = one.token_types() == 0
    blended = ropekit.positions(one, "circle", dff_rate=rate)
    assert ptd(blended[text], blended[~text]) > 0.01
    plain = ropekit.positions(one, "circle", dff_rate=False)
    assert torch.equal(plain, ropekit.positions(one, "circle")) and ptd(plain[text], plain[~text]) < 1e-5


def test_spec_closed_form_axis_order():
    ring = ring_offsets(3, 3, alpha=0.0)  # pure grid-index angle: θ_k = 2πk/9
    for kk, (t, h, w) in enumerate(ring.tolist()):
        a, b = 10 * math.cos(2 * math.pi * kk / 9), 10 * math.sin(2 * math.pi * kk / 9)
        assert (t, h, w) == pytest.approx((2 * b / math.sqrt(6), a / math.sqrt(2) - b / math.sqrt(6),
                                           -a / math.sqrt(2) - b / math.sqrt(6)), abs=1e-12)


def test_negative_x_axis_gets_plus_pi_and_sa_spans_full_turn():
    # 3×3, pure SA: the left-middle token (x' = -1, y' = +0) has atan2 = +π = θmax, so SA = 2π; the
    # top-left token has θmin = atan2(-1, -1), so SA = 0 — the two land on the same ring point. With a
    # -0.0 row offset the left-middle token would be θmin instead and the top-left would sit at π/4.
    ring = ring_offsets(3, 3, alpha=1.0)
    torch.testing.assert_close(ring[3], ring[0], rtol=0, atol=1e-12)
    assert (ring[3] - ring[1]).norm() > 1.0


@pytest.mark.parametrize("layout", ["T3 I4x4 T2", "I3x3 T5", "T2 I2x5 T3 I3x3 T1", "T4 V3x2x2 T4"])
@pytest.mark.parametrize("opts", [{}, {"radius": "auto", "k": 2.0}, {"alpha": 0.0, "delta": 3.0},
                                  {"radius": "auto", "measure": "max_abs"}])
def test_ptd_is_zero_for_every_ring(layout, opts):
    lay = ropekit.Layout.parse(layout)
    c = ropekit.positions(lay, "circle", **opts).double()
    kinds = lay.token_types()
    text = c[kinds == 0]
    start = 0
    for seg in lay:  # each ring (each image, each video frame) separately
        if not isinstance(seg, ropekit.Text):
            frames = getattr(seg, "t", 1)
            per = seg.num_tokens // frames
            for f in range(frames):
                ring = c[start + f * per: start + (f + 1) * per]
                assert ptd(text, ring) < 1e-5
        start += seg.num_tokens
    if sum(not isinstance(s, ropekit.Text) for s in lay) == 1 and not layout.count("V"):
        assert layout_ptd(lay, "circle", **opts) < 1e-5  # one ring: the whole-layout PTD is 0 too


def test_ring_plane_centre_and_radius():
    lay = ropekit.Layout.parse("T5 I4x6 T2")
    c = ropekit.positions(lay, "circle", radius=7.0).double()
    ring = c[5:29]
    centre = torch.full((3,), 5.0, dtype=torch.float64)
    d = ring - centre
    torch.testing.assert_close(d.norm(dim=1), torch.full((24,), 7.0, dtype=torch.float64), rtol=0, atol=1e-5)
    torch.testing.assert_close(d @ torch.ones(3, dtype=torch.float64), torch.zeros(24, dtype=torch.float64),
                               rtol=0, atol=1e-5)
    # text after the block resumes at the block's largest coordinate + 1, on the diagonal
    assert c[29, 0].item() == pytest.approx(ring.max().item() + 1, abs=1e-5)
    assert torch.equal(c[29], c[29, :1].expand(3))
    # auto-k: R = k · max ‖(x', y')‖ = 2 · hypot(2.5, 1.5)
    r = ring_offsets(4, 6, radius="auto", k=2.0).norm(dim=1)
    torch.testing.assert_close(r, torch.full((24,), 2 * math.hypot(2.5, 1.5), dtype=torch.float64))
    r = ring_offsets(4, 6, radius="auto", measure="max_abs").norm(dim=1)
    torch.testing.assert_close(r, torch.full((24,), 2.5, dtype=torch.float64))


def test_custom_text_vector_sets_the_plane():
    n = torch.tensor([0.3, -1.0, 2.0], dtype=torch.float64)
    ring = ring_offsets(3, 4, text_vector=n.tolist())
    # components were reversed onto (t, h, w): undo before the dot product
    torch.testing.assert_close(ring.flip(-1) @ n, torch.zeros(12, dtype=torch.float64), rtol=0, atol=1e-12)


def test_multi_image_offset_and_video_frames():
    c0 = ropekit.positions("T2 I2x2 T1 I2x2", "circle").double()
    c1 = ropekit.positions("T2 I2x2 T1 I2x2", "circle", delta=4.0).double()
    torch.testing.assert_close(c0[:7], c1[:7])  # first image: no offset
    # the second ring moves by Δ along g, and its start moves with the first block's max
    assert (c1[7:] - c0[7:]).mean().item() == pytest.approx(4.0, abs=1e-4)
    v = ropekit.positions("T3 V3x2x2@2.5", "circle").double()
    frames = v[3:].reshape(3, 4, 3)
    torch.testing.assert_close(frames[1] - frames[0], torch.full((4, 3), 2.5, dtype=torch.float64), atol=1e-5, rtol=0)


def test_degenerate_cases_and_text_only():
    one = ring_offsets(1, 1, radius="auto")
    assert torch.equal(one, torch.zeros(1, 3, dtype=torch.float64))
    assert torch.isfinite(ring_offsets(1, 1)).all()
    assert torch.equal(ropekit.positions("T6", "circle"), ropekit.positions("T6", "mrope"))


@pytest.mark.parametrize("opts,match", [
    ({"alpha": 1.5}, "alpha"), ({"radius": -1.0}, "radius"), ({"radius": "big"}, "radius"),
    ({"k": 0}, "k"), ({"measure": "l1"}, "measure"), ({"text_vector": (0, 0, 0)}, "text_vector"),
    ({"text_vector": (1, 2)}, "text_vector"), ({"delta": -1}, "delta"), ({"dff_rate": 1.5}, "dff_rate"),
    ({"dff_rate": -0.1}, "dff_rate"), ({"dff_rate": "half"}, "dff_rate"),
])
def test_bad_options(opts, match):
    with pytest.raises(ValueError, match=match):
        ropekit.positions("T2 I2x2", "circle", **opts)
    with pytest.raises(TypeError, match="unknown option"):
        ropekit.positions("T2 I2x2", "circle", radiu=3)


def test_strips_by_hand():
    # 1×5: y' = +0 everywhere, so atan2 is 0 (x' >= 0) or +π (x' < 0) → SA ∈ {0, 2π}: pure SA puts every
    # token on one ring point. 5×1: atan2 ∈ {−π/2, 0, π/2} → SA ∈ {0, π, 2π}: both ends coincide, the
    # middle is diametrically opposite.
    row = ring_offsets(1, 5, alpha=1.0)
    torch.testing.assert_close(row, row[:1].expand(5, 3), rtol=0, atol=1e-12)
    col = ring_offsets(5, 1, alpha=1.0)
    torch.testing.assert_close(col[0], col[4], rtol=0, atol=1e-12)
    torch.testing.assert_close(col[2], -col[0], rtol=0, atol=1e-12)
    for h, w in [(1, 4), (6, 1), (1, 1)]:
        ref = torch.tensor(reference_ring(h, w, alpha=0.3, radius="auto", k=1.5), dtype=torch.float64)
        torch.testing.assert_close(ring_offsets(h, w, alpha=0.3, radius="auto", k=1.5), ref, rtol=0, atol=1e-12)


def test_alpha_extremes():
    # α = 1: the angle is the spatial angle alone, so tokens on one ray from the grid centre coincide
    ring = ring_offsets(5, 5, alpha=1.0).reshape(5, 5, 3)
    torch.testing.assert_close(ring[0, 0], ring[1, 1], rtol=0, atol=1e-12)
    torch.testing.assert_close(ring[2, 4], ring[2, 3], rtol=0, atol=1e-12)
    # α = 0: the angle is the scan index alone, so the grid's shape does not matter
    torch.testing.assert_close(ring_offsets(3, 4, alpha=0.0), ring_offsets(1, 12, alpha=0.0), rtol=0, atol=1e-12)
    torch.testing.assert_close(ring_offsets(3, 4, alpha=0.0), ring_offsets(6, 2, alpha=0.0), rtol=0, atol=1e-12)


def test_text_only_is_the_diagonal():
    c = ropekit.positions("T7", "circle")
    assert c.dtype == torch.float32
    assert torch.equal(c, torch.arange(7, dtype=torch.float32)[:, None].expand(7, 3))


@pytest.mark.parametrize("layout", ["T3 I3x5 T4", "T2 V2x3x3@1.5 T2 I2x2 T3"])
def test_every_text_token_equidistant_from_each_ring(layout):
    # direct check without the PTD metric: per text token, the spread of its distances to one ring is 0
    lay = ropekit.Layout.parse(layout)
    c = ropekit.positions(lay, "circle", alpha=0.7, radius="auto", k=1.3, delta=2.0).double()
    text = c[lay.token_types() == 0]
    start = 0
    for seg in lay:
        if not isinstance(seg, ropekit.Text):
            frames = getattr(seg, "t", 1)
            per = seg.num_tokens // frames
            for f in range(frames):
                d = torch.cdist(text, c[start + f * per: start + (f + 1) * per])
                assert (d.max(dim=1).values - d.min(dim=1).values).max() < 1e-4
        start += seg.num_tokens


def test_paper_multi_image_example_shifts_0_1_2():
    """Paper §4.3: three images; with Δ = 1 their centres move by 0, 1, 2 along g = (1, 1, 1)."""
    lay = ropekit.Layout.parse("I3x3 I3x3 I3x3")
    c0 = ropekit.positions(lay, "circle").double().reshape(3, 9, 3)
    c1 = ropekit.positions(lay, "circle", delta=1.0).double().reshape(3, 9, 3)
    for i in range(3):  # the i-th image (0-based): every token moved by exactly i·Δ on every axis
        torch.testing.assert_close(c1[i] - c0[i], torch.full((9, 3), float(i), dtype=torch.float64),
                                   rtol=0, atol=1e-5)


@pytest.mark.parametrize("layout", ["T2 I2x2 T1 I3x2 T3 V2x2x2 T1 I1x3 T2", "I2x2 I2x2 T1 V3x1x2@0.5 I2x3"])
@pytest.mark.parametrize("delta", [0.5, 1.0, 7.0])
def test_block_shifts_do_not_compound(layout, delta):
    """Block i (1-based, images and videos alike) moves by exactly (i−1)·Δ·(1,1,1) against Δ = 0; text after
    a block moves with it and still starts past that block's largest coordinate."""
    lay = ropekit.Layout.parse(layout)
    c0 = ropekit.positions(lay, "circle").double()
    c1 = ropekit.positions(lay, "circle", delta=delta).double()
    start, block, shift, prev_top = 0, 0, 0.0, None
    for seg in lay:
        n = seg.num_tokens
        if not isinstance(seg, ropekit.Text):
            shift = block * delta
            block += 1
        moved = c1[start:start + n] - c0[start:start + n]
        torch.testing.assert_close(moved, torch.full_like(moved, shift), rtol=0, atol=1e-4)
        if isinstance(seg, ropekit.Text) and prev_top is not None:
            assert c1[start, 0].item() >= prev_top + 1 - 1e-4  # text never precedes the block before it
        prev_top = c1[start:start + n].max().item() if not isinstance(seg, ropekit.Text) else None
        start += n


@pytest.mark.parametrize("opts,match", [
    ({"radius": 1e39}, "`radius` = 1e\\+39 .* not be finite float32"),
    ({"radius": "auto", "k": 1e308}, "`k` = 1e\\+308 .* not be finite float32"),
    ({"delta": 1e39}, "design 'circle' with delta=1e\\+39 .* not finite float32"),
    ({"delta": 3e38}, "not finite float32"),
])
def test_options_whose_positions_overflow_float32_are_refused(opts, match):
    with pytest.raises(ValueError, match=match):
        ropekit.positions("T1 I2x2 T1 I2x2 T1 I2x2", "circle", **opts)


def test_huge_text_vector_still_gives_a_ring():
    big = ropekit.positions("T2 I3x3 T1", "circle", text_vector=(1e308, 1e308, 1e308))
    torch.testing.assert_close(big, ropekit.positions("T2 I3x3 T1", "circle"), rtol=0, atol=1e-5)


def test_block_rule_places_each_frame_on_its_grids_reference_ring():
    """The batched rule: frame f of every block is the per-token reference ring of its grid moved by f·Δt on
    every axis (each distinct grid's ring is computed once and shared), the start advances by the block's
    largest coordinate + 1, and the gap is Δ on every axis."""
    assert get_design("circle").block_rule is circle_blocks
    segs = [ropekit.Image(3, 4), ropekit.Video(3, 2, 2, 0.5), ropekit.Image(3, 4), ropekit.Image(1, 1),
            ropekit.Video(2, 3, 4, 1.5), ropekit.Image(2, 2)]
    opts = dict(alpha=0.3, radius="auto", k=1.7, measure="max_abs", delta=2.5)
    offsets, advance, absolute, gap = circle_blocks(segs, **opts)
    assert absolute is None and gap.tolist() == [2.5, 2.5, 2.5]
    row = 0
    for k, seg in enumerate(segs):
        t, dt = (seg.t, seg.interval) if isinstance(seg, ropekit.Video) else (1, 0.0)
        ring = torch.tensor(reference_ring(seg.h, seg.w, alpha=0.3, radius="auto", k=1.7, measure="max_abs"),
                            dtype=torch.float64)
        want = torch.cat([ring + f * dt for f in range(t)])
        got = offsets[row: row + len(want)]
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
        assert torch.equal(advance[k], torch.full((3,), float(got.max()) + 1.0, dtype=torch.float64))
        row += len(want)
    assert row == offsets.shape[0]
    empty = circle_blocks([], **opts)
    assert empty[0].shape == (0, 3) and empty[1].shape == (0, 3)


def test_positions_follow_a_token_by_token_walk_with_the_gap():
    """positions(layout, "circle") against a Python walk: text on the diagonal from the running index p, block
    i (1-based) centred at p + (i>1)·Δ, frame f at + f·Δt, and p after a block at its largest coordinate + 1."""
    lay = ropekit.Layout.parse("T2 I2x3 T1 V3x2x2@0.7 I2x3 T4 I1x1 T1")
    delta = 1.25
    out, p, first = [], 0.0, True
    for seg in lay:
        if isinstance(seg, ropekit.Text):
            out += [(p + i,) * 3 for i in range(seg.n)]
            p += seg.n
            continue
        t, dt = (seg.t, seg.interval) if isinstance(seg, ropekit.Video) else (1, 0.0)
        centre = p if first else p + delta
        block = [tuple(centre + f * dt + c for c in tok) for f in range(t) for tok in reference_ring(seg.h, seg.w)]
        out += block
        p, first = max(max(tok) for tok in block) + 1.0, False
    got = ropekit.positions(lay, "circle", delta=delta)
    torch.testing.assert_close(got.double(), torch.tensor(out, dtype=torch.float64), rtol=1e-7, atol=1e-5)
