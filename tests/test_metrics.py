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
