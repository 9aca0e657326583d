"""PTD (Circle-RoPE Table 1) and the expected kernel (exact vs Monte-Carlo)."""
import math

import pytest
import torch

from ropekit import frequency_matrix
from ropekit.analysis.kernel import expected_kernel, monte_carlo_kernel
from ropekit.analysis.metrics import attention_bias_map, layout_ptd, ptd


def test_ptd_reproduces_paper_table_1():
    # 9 image tokens (3×3) and 5 text tokens, as in the paper's Table 1
    assert layout_ptd("I3x3 T5", "vanilla") == pytest.approx(2.22, abs=0.005)
    assert layout_ptd("T2 I3x3 T3", "vanilla") == pytest.approx(2.22, abs=0.005)
    assert layout_ptd("I3x3 T5", "shared") == 0.0
    # "spatial" in the paper's 2-D illustration (Fig. 1c): image on its 2-D grid, text continuing the
    # flattened count as in Fig. 1a, on the diagonal
    img = torch.tensor([[r, c] for r in range(3) for c in range(3)], dtype=torch.float64)
    txt = torch.tensor([[9 + i, 9 + i] for i in range(5)], dtype=torch.float64)
    assert ptd(txt, img) == pytest.approx(0.64, abs=0.005)


def test_ptd_matches_formula_brute_force():
    g = torch.Generator().manual_seed(0)
    t, i = torch.randn(4, 3, generator=g), torch.randn(6, 3, generator=g)
    tot = 0.0
    for a in t.tolist():
        d = [math.dist(a, b) for b in i.tolist()]
        m = sum(d) / len(d)
        tot += sum(abs(x - m) for x in d)
    assert ptd(t, i) == pytest.approx(tot / 24, rel=1e-12)


def test_ptd_errors():
    with pytest.raises(ValueError, match="axes"):
        ptd(torch.zeros(2, 1), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="NaN"):
        ptd(torch.tensor([[math.nan]]), torch.zeros(2, 1))
    with pytest.raises(ValueError, match="text and vision"):
        layout_ptd("T5", "vanilla")


def test_exact_kernel_agrees_with_monte_carlo():
    W = frequency_matrix("mrope", 32, 3, sections=[4, 6, 6])
    delta = torch.tensor([[0.0, 0, 0], [1, 2, 3], [5, -1, 0.5], [40, 40, 40]])
    exact = expected_kernel(delta, W)
    assert exact[0].item() == pytest.approx(1.0)
    mc = monte_carlo_kernel(delta, W, num_samples=40000, seed=1)
    torch.testing.assert_close(mc, exact.to(mc.dtype), atol=0.03, rtol=0)


def test_attention_bias_map_shape_and_vanilla_row_decay():
    m = attention_bias_map("T4 V2x3x4 T4", "vanilla", head_dim=64)
    assert m.shape == (2, 3, 4)
    # 1-D RoPE on a short range: the kernel from text after the video grows toward the last tokens
    flat = m.flatten()
    assert flat[-1] > flat[0]
    with pytest.raises(ValueError, match="no text tokens"):
        attention_bias_map("T4 V2x3x4", "vanilla")


# ------------------------------------------------------------------ per-block PTD, frame bias, boundary


def _brute_ptd(coords, text_idx, vis_idx):
    """The PTD definition in Python floats: mean over (t, i) of |d(t, i) − mean_i d(t, i)|, Euclidean."""
    tot = 0.0
    for t in text_idx:
        d = [math.dist(coords[t], coords[i]) for i in vis_idx]
        m = sum(d) / len(d)
        tot += sum(abs(x - m) for x in d)
    return tot / (len(text_idx) * len(vis_idx))


@pytest.mark.parametrize("design", ["circle", "vanilla", "mrope", "vrope"])
def test_block_ptd_matches_the_definition_per_image_and_per_frame(design):
    from ropekit import positions
    from ropekit.analysis.metrics import block_ptd

    c = positions("T2 I3x3 T2 I2x4 T2", design).double().tolist()
    text = [0, 1, 11, 12, 21, 22]
    got = block_ptd("T2 I3x3 T2 I2x4 T2", design)
    assert list(got) == ["image 1 (I3x3)", "image 2 (I2x4)"]
    assert got["image 1 (I3x3)"] == pytest.approx(_brute_ptd(c, text, range(2, 11)), abs=1e-5)
    assert got["image 2 (I2x4)"] == pytest.approx(_brute_ptd(c, text, range(13, 21)), abs=1e-5)
    c = positions("T4 V3x3x3 T4", design).double().tolist()
    text = [0, 1, 2, 3, 31, 32, 33, 34]
    got = block_ptd("T4 V3x3x3 T4", design)
    for f in range(3):
        want = _brute_ptd(c, text, range(4 + 9 * f, 13 + 9 * f))
        assert got[f"video 1 frame {f} (V3x3x3)"] == pytest.approx(want, abs=1e-5)


def test_circle_ptd_is_zero_per_ring_but_not_over_the_sequence():
    from ropekit.analysis.metrics import block_ptd

    # per ring (each image, each frame) Circle-RoPE is equidistant; over several rings it is not
    for lay in ("T4 V3x3x3 T4", "T2 I3x3 T2 I2x4 T2"):
        assert all(v < 1e-5 for v in block_ptd(lay, "circle").values())
    assert layout_ptd("T4 V3x3x3 T4", "circle") == pytest.approx(0.82, abs=0.01)  # outside testers' numbers
    assert layout_ptd("T2 I3x3 T2 I2x4 T2", "circle") == pytest.approx(6.76, abs=0.01)
    assert layout_ptd("T2 I3x3 T2 I2x4 T2", "vanilla") == pytest.approx(4.21, abs=0.01)
    with pytest.raises(ValueError, match="text and vision"):
        block_ptd("T5", "circle")


def _brute_kernel(a, b, W):
    """Mean over frequency pairs of cos(Σ_axis (b − a)_axis W[axis, j]) in Python floats."""
    Wl = W.double().tolist()
    half = len(Wl[0])
    return sum(math.cos(sum((b[x] - a[x]) * Wl[x][j] for x in range(len(a)))) for j in range(half)) / half


def test_frame_bias_separates_within_frame_spread_from_decay_across_frames():
    from ropekit import positions
    from ropekit.analysis.metrics import frame_bias
    from ropekit.rope import design_frequencies

    lay, design = "T2 V3x2x2 T3", "vrope"
    c = positions(lay, design).double().tolist()
    W = design_frequencies(design, 16, 4)
    text_after = [14, 15, 16]
    frames = []
    for f in range(3):
        frames.append([sum(_brute_kernel(c[t], c[2 + 4 * f + i], W) for t in text_after) / 3 for i in range(4)])
    within = sum(max(k) - min(k) for k in frames) / 3
    means = [sum(k) / 4 for k in frames]
    got = frame_bias(lay, design, head_dim=16)
    assert got["within_frame"] == pytest.approx(within, abs=1e-9)
    assert got["across_frames"] == pytest.approx(max(means) - min(means), abs=1e-9)
    # a 2×2 frame rotated by 180° lists its tokens in reverse order
    flip = max(abs(k[i] - k[3 - i]) for k in frames for i in range(4))
    assert got["flip_asymmetry"] == pytest.approx(flip, abs=1e-9)
    # shared gives every token of a frame one position: no bias within a frame, decay across frames
    shared = frame_bias("T2 V3x2x2 T3", "shared", head_dim=16)
    assert shared["within_frame"] == pytest.approx(0.0, abs=1e-12) and shared["across_frames"] > 0


def test_boundary_continuity_follows_the_vrope_paper():
    from ropekit.analysis.metrics import boundary_continuity

    # VRoPE paper §3: M-RoPE text after a video is offset by max(T, H, W), so on the time axis of a
    # 4×6×6 video it jumps by 6 − (4 − 1) = 3 past the video's last frame; VRoPE continues every axis by 1
    assert boundary_continuity("T4 V4x6x6 T4", "mrope")["index_jump"] == pytest.approx(3.0)
    assert boundary_continuity("T4 V16x6x6 T4", "mrope")["index_jump"] == pytest.approx(1.0 + 15 - 5)
    assert boundary_continuity("T4 V4x6x6 T4", "vrope")["index_jump"] == pytest.approx(1.0)
    van = boundary_continuity("T4 V4x6x6 T4", "vanilla")
    assert van["index_jump"] == van["jump"] == van["gap"] == van["text_step"] == pytest.approx(1.0)
    assert van["kernel_gap"] == pytest.approx(van["kernel_step"])
    m = boundary_continuity("T1 I2x2 T2", "mrope", head_dim=16)
    # brute force: tokens 1..4 image (1,1,1),(1,1,2),(1,2,1),(1,2,2); text (3,3,3),(4,4,4)
    assert m["gap"] == pytest.approx(math.dist((3, 3, 3), (1, 2, 2)))
    assert m["text_step"] == pytest.approx(math.sqrt(3))
    from ropekit.rope import design_frequencies

    W = design_frequencies("mrope", 16, 3)
    assert m["kernel_gap"] == pytest.approx(_brute_kernel((3, 3, 3), (1, 2, 2), W), abs=1e-12)
    with pytest.raises(ValueError, match="two text tokens right after"):
        boundary_continuity("T4 V2x2x2 T1", "vrope")
