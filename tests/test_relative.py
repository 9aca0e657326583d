"""Relative-position error of every family, and GeoPE's exact expected kernel."""
import pytest
import torch

from ropekit import frequency_matrix
from ropekit.analysis.relative import (
    geope_expected_kernel,
    geope_score,
    linear_geope_score,
    planar_score,
    relative_error,
    relative_table,
)
from ropekit.apply.geope import apply_geope
from ropekit.rotations.geope import geope_rotation


def test_table_classifies_every_family():
    rows = relative_table(head_dim=48, num_trials=48)
    names = {r["name"] for r in rows}
    assert {"axial 2-D (base 100)", "M-RoPE sections (t, h, w)", "VRoPE groups (4 coordinates)",
            "GeoPE 2-D", "GeoPE 3-D", "Linear GeoPE 2-D", "Linear GeoPE 3-D"} <= names
    for r in rows:
        assert r["exact"] == r["expected_exact"], r
        if r["expected_exact"]:
            # float32 rounding only: angles up to ~64 rad carry ~4e-6 rad of error, scores are ~√D
            assert r["ratio"] < 1e-4 and r["max_error"] < 1e-3, r
        else:
            assert r["ratio"] > 0.1, r  # GeoPE: the error is of the order of the score itself


def test_measure_detects_absolute_terms_and_passes_relative_ones():
    def absolute(q, k, pq, pk):  # a score with an absolute-position term
        return (q * k).sum(-1) + 0.01 * pq.sum(-1)

    def relative(q, k, pq, pk):  # depends on n − m only
        return (q * k).sum(-1) * torch.cos((pk - pq).sum(-1))

    assert relative_error(absolute, num_axes=2, head_dim=6, num_trials=32) > 0.01
    assert relative_error(relative, num_axes=2, head_dim=6, num_trials=32) == 0.0


def test_geope_is_relative_on_a_line_and_not_across_axes():
    """Rotations about one fixed axis commute: GeoPE on (p, p) — one direction — is relative; in the plane it is not."""
    geo = geope_score(12)

    def diagonal(q, k, pq, pk):
        return geo(q, k, pq.expand(-1, 2), pk.expand(-1, 2))

    assert relative_error(diagonal, num_axes=1, head_dim=12, num_trials=64) < 1e-4
    assert relative_error(geo, num_axes=2, head_dim=12, num_trials=64) > 0.5


def test_planar_score_matches_float64_rotation_matrices():
    """The score helper itself: compare with explicit 2×2 rotations of interleaved-free 'half' pairs in float64."""
    W = frequency_matrix("axial", 8, 2, base=100.0)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(5, 8, generator=g), torch.randn(5, 8, generator=g)
    pq, pk = torch.randint(0, 9, (5, 2), generator=g).float(), torch.randint(0, 9, (5, 2), generator=g).float()
    got = planar_score(W)(q, k, pq, pk)[0, 0]
    ang = ((pk - pq).double() @ W.double())  # relative angle per pair
    q1, q2, k1, k2 = q[:, :4].double(), q[:, 4:].double(), k[:, :4].double(), k[:, 4:].double()
    # ⟨R(a) x, R(b) y⟩ = ⟨x, R(b − a) y⟩ per plane
    want = (q1 * (torch.cos(ang) * k1 - torch.sin(ang) * k2) + q2 * (torch.sin(ang) * k1 + torch.cos(ang) * k2)).sum(-1)
    torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-5)


def test_linear_geope_score_is_relative_for_continuous_positions():
    lin = linear_geope_score(12)
    err = relative_error(lin, num_axes=2, head_dim=12, num_trials=64, integer_positions=False)
    assert err < 1e-3


def test_geope_kernel_equals_trace_of_relative_rotation():
    """tr(R_mᵀ R_n) = Σ_j ⟨R_m e_j, R_n e_j⟩ with the basis vectors rotated by the library (deterministic)."""
    D = 11  # 3 triples + 2 pass-through channels
    pos = torch.tensor([[0.0, 0.0], [3.0, -2.0], [5.0, 7.0], [-1.0, 4.0]], dtype=torch.float64)
    eye = torch.eye(D, dtype=torch.float64)[None, :, None, :].expand(1, D, pos.shape[0], D)
    rotated = apply_geope(eye, geope_rotation(pos, D))[0]  # (D basis, L, D)
    trace = torch.einsum("jmc,jnc->mn", rotated, rotated)
    kernel = geope_expected_kernel(pos[:, None, :], pos[None, :, :], D)
    torch.testing.assert_close(kernel, trace / D)
    assert torch.allclose(kernel.diagonal(), torch.ones(4, dtype=torch.float64))


@pytest.mark.parametrize("linear", [False, True])
def test_geope_kernel_matches_monte_carlo(linear):
    D, N = 12, 4000
    centre = torch.tensor([4.0, 4.0], dtype=torch.float64)
    others = torch.tensor([[4.0, 5.0], [6.0, 1.0], [0.0, 0.0], [9.0, 4.0]], dtype=torch.float64)
    exact = geope_expected_kernel(centre, others, D, linear=linear)
    q = torch.randn(N, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    score = linear_geope_score(D) if linear else geope_score(D)
    mc = torch.stack([score(q, q, centre.expand(N, 2), o.expand(N, 2)).mean() / D for o in others])
    # standard error of a mean of N scores of q·Rq / D: about √(2/D)/√N ≈ 0.007
    torch.testing.assert_close(mc, exact, atol=0.03, rtol=0)
    assert exact.std() > 0.1  # the four offsets give clearly different kernels, so the check has teeth


def test_bad_input():
    with pytest.raises(ValueError, match="num_trials"):
        relative_error(geope_score(6), num_axes=2, head_dim=6, num_trials=0)
    with pytest.raises(ValueError, match="divisible by 16"):
        relative_table(head_dim=50)
    with pytest.raises(ValueError, match="W"):
        planar_score(torch.zeros(4))


def test_report_section(tmp_path):
    import json

    from ropekit.report.relative import kernel_maps, section

    sec = section(tmp_path)
    assert set(sec) == {"title", "html", "metrics"}
    assert "relative_kernels.png" in sec["html"] and (tmp_path / "relative_kernels.png").stat().st_size > 1000
    json.dumps(sec["metrics"])
    k = sec["metrics"]["kernel"]
    assert k["axial RoPE (base 100)"]["change_when_moved"] == 0.0
    assert k["Linear GeoPE"]["change_when_moved"] < 1e-12
    assert k["GeoPE"]["change_when_moved"] > 0.1
    maps = kernel_maps(head_dim=12, radius=3)
    for name, (a, _) in maps.items():
        assert a[3, 3].item() == pytest.approx(1.0)  # zero offset: R = I
    lin = maps["Linear GeoPE"][0]
    torch.testing.assert_close(lin, lin.T)  # depends on |Δ| only
    torch.testing.assert_close(lin, lin.flip(0))
