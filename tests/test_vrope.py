"""VRoPE design: the paper's equations (brute force), its continuity and symmetry properties, N-D grids, errors."""
import itertools
import random

import pytest
import torch

import ropekit
from ropekit import Grid, Image, Layout, RoPE, Text, Video, frequency_matrix, positions
from ropekit.analysis.kernel import kernel_between
from ropekit.designs.vrope import flip_patterns, frame_coordinates, frame_length
from ropekit.rotations.planar import angles

REFERENCE = ("u+", "v-", "v+", "u-")  # the released code's order, ropekit's default (docs/conventions.md)
PAPER = ("u+", "u-", "v+", "v-")  # eq. 8 order


def paper_walk(layout, order=REFERENCE):
    """Per-token float64 re-computation of paper eq. 6-7 (2-D frames, text on the diagonal)."""
    rows, p = [], 0.0
    for seg in layout:
        if isinstance(seg, Text):
            for _ in range(seg.n):
                rows.append([p] * 4)
                p += 1.0
            continue
        T, H, W = (seg.t, seg.h, seg.w) if isinstance(seg, Video) else (1, seg.h, seg.w)
        for _ in range(T):
            bias = H + W - 2
            for h in range(H):
                for w in range(W):
                    u, v = w + h, w - h + H - 1  # eq. 6
                    named = {"u+": u + p, "u-": -u + bias + p, "v+": v + p, "v-": -v + bias + p}  # eq. 7
                    rows.append([named[k] for k in order])
            p += H + W - 1
    return torch.tensor(rows, dtype=torch.float64)


def random_video_layout(rng):
    segs = []
    for _ in range(rng.randint(1, 4)):
        segs.append(Text(rng.randint(1, 4)))
        if rng.random() < 0.5:
            segs.append(Image(rng.randint(1, 5), rng.randint(1, 5)))
        else:
            segs.append(Video(rng.randint(1, 3), rng.randint(1, 4), rng.randint(1, 4)))
    segs.append(Text(rng.randint(1, 3)))
    return Layout(segs)


@pytest.mark.parametrize("seed", range(6))
def test_matches_paper_equations_per_token(seed):
    lay = random_video_layout(random.Random(seed))
    ours = positions(lay, "vrope")
    assert ours.dtype == torch.float32 and ours.shape == (lay.num_tokens, 4)
    assert torch.equal(ours.double(), paper_walk(lay, REFERENCE))
    assert torch.equal(positions(lay, "vrope", order="paper").double(), paper_walk(lay, PAPER))


def nd_walk(sizes, start=0.0):
    """Per-token float64 VRoPE for one N-D frame: for each ± pattern, add x_a or its reflection per axis."""
    out = []
    for x in itertools.product(*(range(s) for s in sizes)):
        coords = []
        for signs in itertools.product((+1, -1), repeat=len(sizes)):
            coords.append(start + sum(xa if sg > 0 else s - 1 - xa for xa, s, sg in zip(x, sizes, signs)))
        out.append(coords)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("sizes", [(5,), (1,), (3, 4), (2, 1), (2, 3, 4), (3, 1, 2), (2, 2, 3, 2)])
def test_nd_grid_matches_sign_pattern_walk(sizes):
    n = len(sizes)
    lay = Layout([Text(3), Grid(*sizes), Text(2)])
    pos = positions(lay, "vrope").double()
    assert pos.shape == (lay.num_tokens, 2**n)
    g = Grid(*sizes).num_tokens
    assert torch.equal(pos[3 : 3 + g], nd_walk(sizes, 3.0))
    after = 3 + sum(sizes) - n + 1
    assert torch.equal(pos[3 + g :], torch.tensor([[after], [after + 1.0]]).expand(2, 2**n))


def test_two_d_grid_equals_image_and_video_frames_follow_each_other():
    assert torch.equal(positions("T2 G3x4 T1", "vrope"), positions("T2 I3x4 T1", "vrope"))
    vid = positions("T1 V3x2x3", "vrope")
    one = frame_coordinates((2, 3), 1.0)
    for f in range(3):
        assert torch.equal(vid[1 + 6 * f : 7 + 6 * f].double(), one + f * frame_length((2, 3)))


def block_spans(layout, pos):
    """(first token, end token, index the block started at) of every vision segment."""
    spans, t = [], 0
    for seg in layout:
        if not isinstance(seg, Text):
            spans.append((t, t + seg.num_tokens, float(pos[t - 1, 0]) + 1.0 if t else 0.0))
        t += seg.num_tokens
    return spans


@pytest.mark.parametrize("seed", range(4))
def test_continuity_on_every_axis(seed):
    # paper §4.1: the block starts where the text left off and the next text is its max + 1, on every axis
    lay = random_video_layout(random.Random(100 + seed))
    pos = positions(lay, "vrope").double()
    for a, b, s in block_spans(lay, pos):
        block = pos[a:b]
        assert torch.equal(block.amin(0), torch.full((4,), s))
        if b < pos.shape[0]:
            assert torch.equal(block.amax(0) + 1.0, pos[b])
            assert torch.all(pos[b] == pos[b, 0])  # the text is back on the diagonal


def test_frames_are_contiguous_per_axis():
    H, W, T = 3, 5, 4
    pos = positions(Video(T, H, W), "vrope").double().reshape(T, H * W, 4)
    for f in range(1, T):
        assert torch.equal(pos[f].amin(0), pos[f - 1].amax(0) + 1.0)
        assert torch.equal(pos[f].amax(0) - pos[f].amin(0), torch.full((4,), H + W - 2.0))


def test_end_to_end_string_layout():
    pos = positions("T5 V8x3x3 T1", "vrope")
    assert pos.shape == (5 + 72 + 1, 4)
    assert torch.equal(pos[:5], torch.arange(5.0)[:, None].expand(5, 4))
    assert torch.equal(pos[-1], torch.full((4,), 5.0 + 8 * (3 + 3 - 1)))  # s + T·(H+W-1)
    assert ropekit.get_design("vrope").allocation == "vrope"
    rope = RoPE("vrope", head_dim=16)
    q = torch.randn(1, 2, pos.shape[0], 16, dtype=torch.float64)
    k = torch.randn(1, 2, pos.shape[0], 16, dtype=torch.float64)
    rq, rk = rope.rotate(q, k, pos.double())
    assert torch.allclose(rq.norm(dim=-1), q.norm(dim=-1))
    from_string = rope.rotate(q.float(), k.float(), "T5 V8x3x3 T1")[0]  # float32 path from the layout string
    assert torch.allclose(from_string.double(), rq, atol=1e-4)
    # relative: shifting the whole sequence (shorter text prefix) leaves the block's scores unchanged
    rq2, rk2 = rope.rotate(q[:, :, 3:], k[:, :, 3:], positions("T2 V8x3x3 T1", "vrope").double())
    assert torch.allclose(rq[:, :, 3:] @ rk[:, :, 3:].transpose(-1, -2), rq2 @ rk2.transpose(-1, -2), atol=1e-9)


def test_frequency_matrix_interleaves_as_eq_8():
    # eq. 8: frequency j = 4k + r rotates with the r-th coordinate (paper order u+, u-, v+, v-),
    # θ_j = base^(-2j/d) (eq. 2)
    D, base = 32, 10000.0
    Wm = frequency_matrix("vrope", D, 4).double()
    lay = Layout([Text(2), Video(2, 3, 4), Text(1)])
    named = paper_walk(lay, PAPER)
    ang = angles(positions(lay, "vrope", order="paper").double(), Wm)
    for j in range(D // 2):
        theta = base ** (-2.0 * j / D)
        assert torch.allclose(ang[:, j], named[:, j % 4] * theta, rtol=1e-6)


@pytest.mark.parametrize("sizes", [(6,), (3, 5), (4, 4), (2, 3, 4)])
def test_reflections_permute_coordinates(sizes):
    # reflecting the axes in `mask` maps coordinate c to c XOR mask (reference order)
    n = len(sizes)
    coords = frame_coordinates(sizes).reshape(*sizes, 2**n)
    for mask in range(2**n):
        axes = [a for a in range(n) if mask >> (n - 1 - a) & 1]
        flipped = coords.flip(axes) if axes else coords
        perm = torch.arange(2**n) ^ mask
        assert torch.equal(flipped, coords[..., perm])
    # hence every token of a frame has the same mean coordinate, the frame's centre
    centre = sum(s - 1 for s in sizes) / 2
    assert torch.allclose(coords.mean(-1), torch.full(sizes, centre, dtype=torch.float64))


@pytest.mark.parametrize("query", ["before", "after"])
def test_text_to_frame_kernel_symmetry(query):
    """What holds exactly: the text→frame expected kernel is invariant under flipping rows, columns or both
    whenever every coordinate gets the same spectrum (e.g. the axial allocation); with VRoPE's interleaved
    allocation the flip instead permutes which frequency group sees which coordinate (c ↦ c XOR mask)."""
    H, W, D = 4, 5, 48
    lay = Layout([Text(3), Video(2, H, W), Text(2)])
    pos = positions(lay, "vrope").double()
    q = pos[2:3] if query == "before" else pos[-1:]
    frames = [pos[3 + f * H * W : 3 + (f + 1) * H * W] for f in range(2)]
    same = frequency_matrix("axial", D, 4)
    inter = frequency_matrix("vrope", D, 4)
    for fr in frames:
        K = kernel_between(q, fr, same)[0].reshape(H, W)
        assert K.max() - K.min() > 1e-3  # the kernel does vary over the frame
        for axes in ([0], [1], [0, 1]):
            assert torch.allclose(K, K.flip(axes), atol=1e-12, rtol=0)
        Ki = kernel_between(q, fr, inter)[0].reshape(H, W)
        for axes, mask in (([0], 2), ([1], 1), ([0, 1], 3)):
            permuted = inter[torch.arange(4) ^ mask]
            Kp = kernel_between(q, fr, permuted)[0].reshape(H, W)
            assert torch.allclose(Ki.flip(axes), Kp, atol=1e-12, rtol=0)
    # M-RoPE, for contrast, is not flip-symmetric with its own same-spectrum axes
    mpos = positions(lay, "mrope").double()
    mq = mpos[2:3] if query == "before" else mpos[-1:]
    Km = kernel_between(mq, mpos[3 : 3 + H * W], frequency_matrix("axial", D, 3))[0].reshape(H, W)
    assert (Km - Km.flip([0, 1])).abs().max() > 1e-3


def test_one_row_degrades_to_the_paper_1d_form():
    # paper §4.3: with H = 1 the positions become (w, -w, w, -w) (+ offsets) in eq. 8's order
    Wd = 6
    s = 2.0
    pos = positions(Layout([Text(2), Image(1, Wd), Text(1)]), "vrope", order="paper").double()
    w = torch.arange(Wd, dtype=torch.float64)
    expect = torch.stack([s + w, s + Wd - 1 - w, s + w, s + Wd - 1 - w], dim=1)
    assert torch.equal(pos[2:-1], expect)
    assert pos[-1, 0] == s + Wd  # a 1-row image advances like Wd text tokens
    # and it is the 1-D grid form, tiled: same angles with the same interleaved frequencies
    ref2 = positions(Layout([Text(2), Image(1, Wd), Text(1)]), "vrope").double()
    one = positions(Layout([Text(2), Grid(Wd), Text(1)]), "vrope").double()
    assert one.shape[1] == 2
    assert torch.equal(ref2, one.repeat(1, 2))
    D = 32
    assert torch.allclose(
        angles(ref2, frequency_matrix("vrope", D, 4)), angles(one, frequency_matrix("vrope", D, 2)), atol=0, rtol=0
    )


def test_one_d_grid_is_forward_and_backward_text_order():
    pos = positions("T1 G5 T1", "vrope")
    assert pos[1:6, 0].tolist() == [1, 2, 3, 4, 5]
    assert pos[1:6, 1].tolist() == [5, 4, 3, 2, 1]


def test_size_one_axes_degrade_in_3d():
    # a 3-D grid with unit depth is the 2-D frame with its coordinates tiled (flipping a unit axis changes nothing)
    c3 = frame_coordinates((1, 3, 4))
    c2 = frame_coordinates((3, 4))
    assert torch.equal(c3, c2.repeat(1, 2))
    assert frame_length((1, 3, 4)) == frame_length((3, 4))
    assert torch.equal(frame_coordinates((1, 1, 5)), frame_coordinates((5,)).repeat(1, 4))


def test_3d_grid_invariants():
    sizes = (2, 3, 4)
    lay = Layout([Text(4), Grid(*sizes), Text(1)])
    pos = positions(lay, "vrope").double()
    block = pos[4:-1]
    P = 4.0
    assert block.shape == (24, 8)
    x = torch.tensor(list(itertools.product(*(range(s) for s in sizes))), dtype=torch.float64)
    offsets = torch.tensor(sizes, dtype=torch.float64) - 1.0
    for c in range(8):
        bits = flip_patterns(3)[c]
        # every coordinate is P + Σ (±x_a) + the reflections' constant
        expect = P + torch.where(bits.bool(), offsets - x, x).sum(1)
        assert torch.equal(block[:, c], expect)
        # complementary patterns sum to a constant: 2P + Σ(size - 1)
        assert torch.equal(block[:, c] + block[:, 7 - c], torch.full((24,), 2 * P + offsets.sum()))
    # the 8 patterns are all distinct sign patterns
    assert len({tuple(r.tolist()) for r in flip_patterns(3)}) == 8
    # neighbours along any axis differ by exactly 1 on every coordinate
    grid = block.reshape(*sizes, 8)
    for a in range(3):
        assert torch.all(torch.diff(grid, dim=a).abs() == 1)
    assert torch.equal(pos[-1], torch.full((8,), P + sum(sizes) - 3 + 1))


def test_paper_order_is_eq8_generalised():
    assert flip_patterns(2, "paper").tolist() == [[0, 0], [1, 1], [1, 0], [0, 1]]  # u+, u-, v+, v-
    assert flip_patterns(2).tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]  # u+, v-, v+, u-
    for n in (1, 2, 3):
        pats = flip_patterns(n, "paper")
        assert sorted(map(tuple, pats.tolist())) == sorted(map(tuple, flip_patterns(n).tolist()))
        assert torch.equal(pats[0::2] + pats[1::2], torch.ones(2 ** (n - 1), n, dtype=pats.dtype))


def test_text_only_and_spatial_dims():
    assert torch.equal(positions("T6", "vrope"), torch.arange(6.0)[:, None].expand(6, 4))
    assert positions("T3", "vrope", spatial_dims=3).shape == (3, 8)
    assert torch.equal(positions("T2 G2x2x2", "vrope", spatial_dims=3), positions("T2 G2x2x2", "vrope"))


def test_bad_inputs():
    with pytest.raises(ValueError, match="mixes spatial grids of different rank"):
        positions("T1 I2x2 T1 G2x2x2", "vrope")
    with pytest.raises(ValueError, match="mixes spatial grids"):
        positions("G4 V2x2x2", "vrope")
    with pytest.raises(ValueError, match="has 2 spatial axes but `spatial_dims=3`"):
        positions("T1 I2x2", "vrope", spatial_dims=3)
    with pytest.raises(ValueError, match="`spatial_dims` must be an int >= 1"):
        positions("T3", "vrope", spatial_dims=0)
    with pytest.raises(ValueError, match="`spatial_dims` must be an int >= 1"):
        positions("T3", "vrope", spatial_dims="2")
    with pytest.raises(ValueError, match="`order` must be 'reference'"):
        positions("T1 I2x2", "vrope", order="eq8")
    with pytest.raises(ValueError, match="frame `sizes`"):
        frame_coordinates(())
    with pytest.raises(ValueError, match="frame `sizes`"):
        frame_coordinates((2, 0))
    with pytest.raises(ValueError, match="frame `sizes`"):
        frame_coordinates((2.5, 3))
    with pytest.raises(TypeError, match="unknown option"):
        positions("T1 I2x2", "vrope", spatial_dim=2)
