"""The report does not mislead: its sentences agree with the numbers, its figures share one axis
convention, colour scale and legends. Figures are checked through their data and labels, not pixels."""
import math
import re
from pathlib import Path

import pytest
import torch

import ropekit
from ropekit.analysis import figures as design_figures
from ropekit.analysis import nd_figures
from ropekit.analysis.metrics import block_ptd, boundary_continuity, frame_bias, layout_ptd
from ropekit.analysis.nd import LINES, kernel_along_lines
from ropekit.analysis.relative import kernel_maps
from ropekit.apply.geope import apply_geope
from ropekit.report.multimodal import bias_sentences, ptd_sentences
from ropekit.report.relative import kernel_sentences
from ropekit.rotations.directional import directional_matrix
from ropekit.rotations.geope import geope_rotation


def _geope_kernel_brute(m, n, head_dim):
    """tr(R_mᵀ R_n) / D from GeoPE's own rotation of the D basis vectors: the isotropic-q expectation."""
    eye = torch.eye(head_dim, dtype=torch.float64)[None, None]  # (1, 1, D, D): D "tokens", one per basis vector
    pos = lambda p: torch.tensor([p] * head_dim, dtype=torch.float64)  # noqa: E731
    with torch.no_grad():
        rm = apply_geope(eye, geope_rotation(pos(m), head_dim))
        rn = apply_geope(eye, geope_rotation(pos(n), head_dim))
    return float((rm * rn).sum() / head_dim)


def test_geope_caption_says_what_the_kernel_shows():
    maps = kernel_maps(head_dim=96, radius=15)
    off = torch.arange(-15, 16, dtype=torch.float64)
    lines = {n: kernel_along_lines(a, off, 5) for n, (a, _) in maps.items()}
    moved = {n: float((a - b).abs().max()) for n, (a, b) in maps.items()}
    text = " ".join(kernel_sentences(lines, moved, 5))
    # query (15, 15): keys (20, 20), (10, 10) lie on the line through the origin and the query, keys
    # (20, 10), (10, 20) across it. Outside testers measured 0.71 and 0.94.
    along = (_geope_kernel_brute((15, 15), (20, 20), 96) + _geope_kernel_brute((15, 15), (10, 10), 96)) / 2
    across = (_geope_kernel_brute((15, 15), (20, 10), 96) + _geope_kernel_brute((15, 15), (10, 20), 96)) / 2
    assert along == pytest.approx(0.71, abs=0.005) and across == pytest.approx(0.94, abs=0.005)
    assert f"(diagonal Δh = Δw) the kernel is {along:.2f}, on the line across it (anti-diagonal Δh = −Δw) " \
           f"{across:.2f}, so GeoPE keeps keys across that line more similar" in text
    assert "Linear GeoPE: 7.1 tokens from the query the kernel is about the same on every line" in text
    assert "axial RoPE (base 100): 7.1 tokens from the query the kernel is highest along the Δh axis and " \
           "Δw axis" in text and "a cross" in text.split("GeoPE")[0]
    assert "changes the map of GeoPE (up to" in text and "Linear GeoPE do not change" in text


def _synthetic(fn, r=8):
    off = torch.arange(-r, r + 1, dtype=torch.float64)
    h, w = torch.meshgrid(off, off, indexing="ij")
    return fn(h, w), off


def test_kernel_sentences_follow_the_map_not_a_template():
    cross, off = _synthetic(lambda h, w: torch.where((h == 0) | (w == 0), 1.0, 0.5))
    round_, _ = _synthetic(lambda h, w: torch.exp(-0.05 * (h * h + w * w)))
    band, _ = _synthetic(lambda h, w: torch.exp(-0.5 * (h - w) ** 2))  # high where Δh = Δw
    lines = {n: kernel_along_lines(m, off, 3) for n, m in (("C", cross), ("R", round_), ("B", band))}
    assert lines["B"]["diagonal Δh = Δw"] == 1.0 and lines["C"][LINES[0]] == 1.0
    text = kernel_sentences(lines, {"C": 0.0, "R": 0.0, "B": 0.5}, 3)
    assert "a cross" in text[0] and "C:" in text[0]
    assert "a round map" in text[1]
    assert "highest along the diagonal Δh = Δw (1.00)" in text[2]
    assert "keeps keys along that line more similar" in text[3]  # the query line is the diagonal here


def test_kernel_along_lines_compares_equal_distances():
    m, off = _synthetic(lambda h, w: -(h * h + w * w).sqrt())  # minus the distance from the query
    v = kernel_along_lines(m, off, 5)
    # interpolated between the cells at 7 and 8 on the axes: exactly −5√2 for a map linear along them
    assert all(v[line] == pytest.approx(-5 * math.sqrt(2), abs=1e-12) for line in LINES)
    with pytest.raises(ValueError, match="must be on the grid"):
        kernel_along_lines(m, off, 6)


def _capture(monkeypatch, module):
    figs = []

    def keep(fig, path):
        figs.append(fig)
        return Path(path)

    monkeypatch.setattr(module, "_save", keep)
    return figs


def _value_at(im, dh, dw):
    """The value an image axes shows at data coordinates (Δw = x, Δh = y), from its extent and origin."""
    a = im.get_array()
    left, right, bottom, top = im.get_extent()
    rows, cols = a.shape
    j = int((dw - left) / (right - left) * cols)
    i_from_bottom = int((dh - bottom) / (top - bottom) * rows)
    i = rows - 1 - i_from_bottom if im.origin == "upper" else i_from_bottom
    return float(a[i, j])


def _brute_planar(W, d0, d1):
    cols = W.double().tolist()
    return sum(math.cos(d0 * cols[0][j] + d1 * cols[1][j]) for j in range(len(cols[0]))) / len(cols[0])


def test_every_kernel_figure_uses_one_axis_convention(monkeypatch, tmp_path):
    figs = _capture(monkeypatch, nd_figures)
    nd_figures.plot_sim2d(16, 7, "sobol", tmp_path / "a.png")
    W = directional_matrix(16, 2, "sobol", seed=0, dtype=torch.float64)
    nd_figures.plot_kernel_maps({"w": W}, 7, tmp_path / "b.png")
    maps = kernel_maps(head_dim=12, radius=3)
    nd_figures.plot_relative_kernels({"GeoPE": maps["GeoPE"][0]}, torch.arange(-3, 4.0), tmp_path / "c.png")
    nd_figures.plot_sim3d(16, 7, [0.0], "sobol", tmp_path / "d.png")
    W3 = directional_matrix(16, 3, "sobol", seed=0, dtype=torch.float64)
    references = [
        lambda dh, dw: _brute_planar(W, dh, dw),
        lambda dh, dw: _brute_planar(W, dh, dw),
        lambda dh, dw: _geope_kernel_brute((3, 3), (3 + dh, 3 + dw), 12),
        lambda dh, dw: _brute_planar(W3[:2], dh, dw),  # slice Δ(axis 2) = 0
    ]
    assert len(figs) == 4
    for fig, ref in zip(figs, references):
        panels = [ax for ax in fig.axes if ax.images]
        assert panels and panels[0].get_ylabel() == nd_figures.ROW_LABEL
        for ax in panels:
            assert ax.get_xlabel() == nd_figures.COL_LABEL
            assert ax.yaxis_inverted() and not ax.xaxis_inverted()  # Δh grows downward, Δw to the right
        im = panels[0].images[0]
        for dh, dw in ((2, -1), (-1, 2), (2, 1)):
            assert _value_at(im, dh, dw) == pytest.approx(ref(dh, dw), abs=1e-9), (dh, dw)


def test_bias_maps_share_one_labelled_colour_scale_and_draw_frames_h_down(monkeypatch, tmp_path):
    figs = _capture(monkeypatch, design_figures)
    _, maps = design_figures.plot_bias_maps("T2 V2x3x3 T3", ["vanilla", "mrope"], tmp_path / "x.png", head_dim=16)
    fig = figs[0]
    images = [ax.images[0] for ax in fig.axes if ax.images]
    assert len(images) == 4
    lo = min(float(m.min()) for m in maps.values())
    hi = max(float(m.max()) for m in maps.values())
    assert all(im.get_clim() == pytest.approx((lo, hi)) for im in images)
    assert all(ax.yaxis_inverted() for ax in fig.axes if ax.images)  # each frame as a picture, h down
    bars = [ax for ax in fig.axes if not ax.images and ax.get_ylabel()]
    assert any("expected positional kernel" in ax.get_ylabel() for ax in bars)


def test_design_figures_have_a_legend_for_marker_shapes(monkeypatch, tmp_path):
    figs = _capture(monkeypatch, design_figures)
    design_figures.plot_coordinates("T2 I2x2 T1", ["vanilla", "circle", "vrope"], tmp_path / "x.png")
    labels = [t.get_text() for leg in figs[0].legends for t in leg.get_texts()]
    assert {"text", "image"} <= set(labels)
    assert [lab for lab in labels if lab.startswith("axis")] == ["axis 0", "axis 1", "axis 2", "axis 3"]


def test_diagonal_view_turns_the_circle_ring_into_a_circle():
    lay = "T4 I4x4 T4"
    c = ropekit.positions(lay, "circle").double()
    kinds = ropekit.Layout.parse(lay).token_types()
    p = design_figures.diagonal_view(c)
    assert p[kinds == 0].abs().max() < 1e-4  # text on the diagonal projects to the centre
    ring = c[kinds != 0]
    u = torch.ones(3, dtype=torch.float64) / math.sqrt(3)
    to_diagonal = (ring - (ring @ u)[:, None] * u).norm(dim=-1)  # 3-D distance of each token to the diagonal
    torch.testing.assert_close(p[kinds != 0].norm(dim=-1), to_diagonal, atol=1e-4, rtol=0)
    assert to_diagonal.std() < 1e-4 and to_diagonal.mean() > 1  # a circle around the diagonal
    with pytest.raises(ValueError, match=r"\(L, 3\)"):
        design_figures.diagonal_view(torch.zeros(3, 4))


def test_ptd_sentences_explain_per_block_versus_whole():
    lays = ("T4 V3x3x3 T4", "T2 I3x3 T2 I2x4 T2")
    names = ("circle", "vanilla", "mrope")
    whole = {lay: {n: layout_ptd(lay, n) for n in names} for lay in lays}
    blocks = {lay: {n: block_ptd(lay, n) for n in names} for lay in lays}
    text = " ".join(ptd_sentences(whole, blocks))
    assert "circle 0.000 → 0.816" in text and "circle 0.000 → 6.762" in text
    assert "whole-sequence PTD of circle (6.762) is larger than vanilla's (4.209)" in text
    one = {"I3x3 T5": {n: layout_ptd("I3x3 T5", n) for n in names}}
    assert ptd_sentences(one, {"I3x3 T5": {n: block_ptd("I3x3 T5", n) for n in names}}) == []


def test_bias_sentences_rank_within_frame_bias_not_the_mixed_spread():
    lay = "T4 V4x6x6 T16"
    stats = {d: {**frame_bias(lay, d, head_dim=128), **boundary_continuity(lay, d, head_dim=128)}
             for d in ("vanilla", "mrope", "vrope", "circle")}
    text = bias_sentences(stats)
    least = min(stats, key=lambda d: stats[d]["within_frame"])
    assert text[0].startswith("Bias within a frame") and f"least for {least} " in text[0]
    # within a frame VRoPE and M-RoPE are close (outside testers: VRoPE 0.014–0.05, M-RoPE 0.029) ...
    assert stats["mrope"]["within_frame"] == pytest.approx(0.029, abs=0.002)
    assert 0.014 <= stats["vrope"]["within_frame"] <= 0.05
    # ... while the mixed spread ranked M-RoPE (0.041) far above VRoPE (0.183): that is decay across frames
    assert stats["vrope"]["across_frames"] > 5 * stats["mrope"]["across_frames"]
    assert "mrope jumps by 3.00" in text[2] and "vanilla, vrope continue every axis" in text[2]


def test_report_and_its_sources_cite_no_private_spec():
    root = Path(ropekit.__file__).parent
    files = list(root.rglob("*.py"))  # every module: docstrings are what users read (help(), IDEs)
    assert len(files) > 20 and [f.name for f in files if re.search(r"\bSPEC\b", f.read_text(encoding="utf-8"))] == []
