"""The report as a reader sees it ("Trust, round 3", item 12): captions name panels where the figure puts them,
text and tables show the same numbers, labels are whole and readable, every plotted axis is labelled.

Figures are checked on the matplotlib objects the report draws (captured before they are saved); a caption is
checked against the figure's own geometry or the numbers of the table beside it, never against a copy of its text.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from ropekit.analysis import figures, nd_figures  # noqa: E402
from ropekit.analysis.nd import max_angular_gap  # noqa: E402
from ropekit.experiments import runner  # noqa: E402
from ropekit.experiments.base import Claim  # noqa: E402
from ropekit.report import build, experiments as rexp, multimodal  # noqa: E402
from ropekit.report import nd as rnd  # noqa: E402
from ropekit.rotations.directional import nd_directions  # noqa: E402

STORED = Path(__file__).resolve().parents[1] / "docs" / "results"
PAGE_PX = 1068  # what a 1400 px window shows of a figure: the page's 1100 px column less its padding
SAVE_DPI = 110  # figures.py's _save


def _capture(monkeypatch, module):
    figs = []

    def keep(fig, path):
        figs.append(fig)
        return Path(path)

    monkeypatch.setattr(module, "_save", keep)
    return figs


def _capture_closed(monkeypatch):
    """Figures the experiment plots close after saving (they call plt.close(fig) themselves)."""
    figs = []
    close = rexp.plt.close
    monkeypatch.setattr(rexp.plt, "close", lambda fig=None: (figs.append(fig), close(fig)))
    return figs


# --- the 3-axis figure's caption follows its layout --------------------------------------------------------

def _geometry(fig) -> set[str]:
    """Where each design's diagonal view lies relative to its 3-D panel, from the panels' drawn boxes."""
    boxes = {}
    for ax in fig.axes:
        if ax.get_gid():
            boxes.setdefault(ax.get_gid(), {})["3d" if ax.name == "3d" else "2d"] = ax.get_position()
    out = set()
    for b in boxes.values():
        top, view = b["3d"], b["2d"]
        same_column = min(top.x1, view.x1) > max(top.x0, view.x0)
        same_row = min(top.y1, view.y1) > max(top.y0, view.y0)
        if same_column and view.y1 <= top.y0 + 1e-9:
            out.add("below")
        elif same_row and view.x0 >= top.x1 - 1e-9:
            out.add("right")
        else:
            out.add("other")
    return out


def test_the_3_axis_caption_names_the_panels_where_the_figure_draws_them(tmp_path, monkeypatch):
    fig = figures.rings_figure("T2 I2x2 T1", ["mrope", "circle", "vanilla"])
    assert _geometry(fig) == {"below"} and figures.pair_arrangement(fig) == "below"
    plt.close(fig)
    # a figure with its pairs side by side is read as such, and its caption then says left and right
    side = plt.figure()
    a = side.add_subplot(1, 2, 1, projection="3d")
    b = side.add_subplot(1, 2, 2)
    a.set_gid("x")
    b.set_gid("x")
    side.canvas.draw()
    assert _geometry(side) == {"right"} and figures.pair_arrangement(side) == "right"
    plt.close(side)
    assert "Left of each pair" in multimodal.rings_caption("right")
    below = multimodal.rings_caption("below")
    assert "below" in below and "Left" not in below and "Right" not in below
    # the report's caption is the one for the figure it saved
    saved = []
    real = multimodal.save_figure
    monkeypatch.setattr(multimodal, "save_figure", lambda f, p: (saved.append(_geometry(f)), real(f, p))[1])
    sec = multimodal.designs_section(tmp_path, designs=["mrope", "circle"])
    assert saved == [{"below"}]
    assert multimodal.rings_caption("below") in sec["html"].replace("&#x27;", "'")
    assert "Left of each pair" not in sec["html"]


# --- the per-token coordinate grids are readable at the page's width --------------------------------------

def test_coordinate_grids_are_readable_at_page_width_and_tell_axes_apart(monkeypatch, tmp_path):
    figs = _capture(monkeypatch, figures)
    names = ["vanilla", "mrope", "vrope", "circle", "rope2d"]
    figures.plot_coordinates("T4 I4x4 T4", names, tmp_path / "x.png")
    fig = figs[0]
    scale = PAGE_PX / (fig.get_figwidth() * SAVE_DPI)  # the page shrinks a wider figure to its column
    fig.canvas.draw()
    panels = [ax for ax in fig.axes if ax.axison]
    assert len(panels) == len(names)
    for ax in panels:
        ticks = ax.get_xticklabels() + ax.get_yticklabels()
        shown = [t for t in ticks if t.get_text()]
        assert min(t.get_fontsize() for t in shown) * SAVE_DPI / 72 * scale >= 9  # px on the page
        assert len([t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]) <= 8
        assert ax.get_xlabel() and ax.get_ylabel()
        # each axis has its own marker shape, edge colour and size, the larger drawn first (equal values nest)
        by_axis = {}
        for c in ax.collections:
            if len(c.get_offsets()):
                key = c.get_paths()[0].vertices.tobytes()
                by_axis.setdefault(key, set()).add((tuple(c.get_edgecolor()[0]), float(c.get_sizes()[0]), c.zorder))
        styles = [next(iter(v)) for v in by_axis.values()]
        assert all(len(v) == 1 for v in by_axis.values())  # one style per shape, whatever the modality
        assert len({e for e, _, _ in styles}) == len(styles)
        by_z = sorted(styles, key=lambda st: st[2])
        assert all(a[1] > b[1] for a, b in zip(by_z, by_z[1:]))
    vrope = next(ax for ax in panels if ax.get_title().startswith("vrope"))
    assert len({c.get_paths()[0].vertices.tobytes() for c in vrope.collections if len(c.get_offsets())}) == 4
    labels = {t.get_text() for leg in fig.legends for t in leg.get_texts()}
    assert {"text", "image", "axis 0", "axis 3"} <= labels
    handles = [h for leg in fig.legends for h in leg.legend_handles if h.get_label().startswith("axis")]
    edges, shapes = {h.get_markeredgecolor() for h in handles}, {h.get_marker() for h in handles}
    assert len(edges) == len(shapes) == len(handles) == 4
    assert 9 <= min(t.get_fontsize() for leg in fig.legends for t in leg.get_texts()) * SAVE_DPI / 72 * scale


# --- a 1-axis design draws each image grid's positions -------------------------------------------------------

def _pype_ring_position(start: int, r: int, c: int, h: int, w: int, layer: int) -> int:
    """PyPE's rule written out: ring ``min(r, c, h-1-r, w-1-c)`` capped at ``P - 1``, P = max(min(h, w)//2 - layer, 1)."""
    levels = max(min(h, w) // 2 - layer, 1)
    return start + min(r, c, h - 1 - r, w - 1 - c, levels - 1)


@pytest.mark.parametrize("layer", [0, 1])
def test_one_axis_plot_draws_each_grid_as_the_design_places_it(monkeypatch, tmp_path, layer):
    figs = _capture(monkeypatch, figures)
    figures.plot_layout("T1 I6x6 T2 I4x5 T1", "pype", tmp_path / "x.png", layer=layer)
    fig = figs[0]
    fig.canvas.draw()
    grids = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title() for ax in grids] == ["image 1: position", "image 2: position"]
    starts = (1, 1 + max(3 - layer, 1) + 2)  # the text after an image continues at s + P
    for ax, (h, w), s in zip(grids, [(6, 6), (4, 5)], starts):
        want = torch.tensor([[_pype_ring_position(s, r, c, h, w, layer) for c in range(w)] for r in range(h)])
        assert torch.equal(torch.as_tensor(ax.images[0].get_array()).to(want.dtype), want)
        assert ax.get_xlabel() == "column"
        # every cell carries its value as text
        assert sorted(float(t.get_text()) for t in ax.texts) == sorted(want.flatten().tolist())
    assert any(ax.get_ylabel() == "position" for ax in fig.axes)  # the shared colour bar is labelled


def test_video_frames_are_drawn_as_grids_of_their_own(monkeypatch, tmp_path):
    figs = _capture(monkeypatch, figures)
    figures.plot_layout("T1 V6x2x2 T1", "v2pe", tmp_path / "x.png")
    grids = [ax for ax in figs[0].axes if ax.images]
    assert [ax.get_title() for ax in grids] == [f"frame {f}: position" for f in (1, 2, 3, 4)]  # at most four
    # V2PE: each visual token one increment (1/16) after the one before, the first after the text token at 0
    for f, ax in enumerate(grids):
        want = (1 + f * 4 + torch.arange(4, dtype=torch.float64)).reshape(2, 2) / 16
        assert torch.allclose(torch.as_tensor(ax.images[0].get_array()).double(), want, atol=1e-6)


def test_own_layout_captions_count_what_the_figures_show():
    # ID-Align: the 4x4 high-resolution view shares the 2x2 thumbnail's four positions
    text = multimodal.own_layout_caption("T2 I2x2 I4x4 T2", "id-align", thumbnail=(2, 2))
    assert "image 2 (4×4, 16 tokens) takes 4 distinct positions (2–5)" in text
    assert text.endswith("the last text token is at (7).")
    # PyPE on a 6x6 image: 3 rings at layer 0, then one fewer per layer
    for layer, levels in ((0, 3), (1, 2), (2, 1)):
        text = multimodal.own_layout_caption("T1 I6x6 T1", "pype", layer=layer)
        plural = "s" if levels != 1 else ""
        assert f"takes {levels} distinct position{plural} (1–{levels})" in text
        assert text.endswith(f"the last text token is at ({1 + levels}).")


# --- PTD table ----------------------------------------------------------------------------------------------

def test_ptd_cells_of_one_block_stay_on_one_line(tmp_path):
    sec = multimodal.ptd_section(tmp_path, designs=["vanilla", "mrope"])
    cells = re.findall(r"<td[^>]*>(.*?)</td>", sec["html"])
    one = [c for c in cells if "one block" in c]
    assert one and all("class='nowrap'" in c for c in one)
    assert re.search(r"\.nowrap\{[^}]*white-space:\s*nowrap", build._CSS)


# --- N-D section: the figures, the text and the table show the same numbers ---------------------------------

def _table_rows(html_text: str) -> dict[str, list[str]]:
    rows = {}
    for tr in re.findall(r"<tr>(.*?)</tr>", html_text):
        cells = [re.sub("<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", tr)]
        if cells:
            rows[cells[0]] = cells[1:]
    return rows


def test_nd_direction_figures_and_text_show_rows_of_the_table(tmp_path, monkeypatch):
    figs = _capture(monkeypatch, nd_figures)
    sec = rnd.section(tmp_path)
    rows = _table_rows(sec["html"])
    titles = [" ".join(ax.get_title() for ax in f.axes) for f in figs[:2]]
    panels = [[ax.get_title() for ax in f.axes] for f in figs[:2]]
    # 2-D figure: both panels' largest gaps are table rows, 3-D figure: both |mean| values are
    shown = rnd.SHOWN
    for (left, right), column in zip(panels, (0, 1)):
        assert left.splitlines()[0] == shown and "random" in right
        nums = [re.search(r"= ([0-9.]+)", t).group(1) for t in (left, right)]
        assert nums == [rows[shown][column], rows["random"][column]], titles
    # the sentence under the figures quotes the same two rows and the table's best values
    note = sec["html"][: sec["html"].index("<img")]
    for column in (0, 1):
        assert rows[shown][column] in note and rows["random"][column] in note
    gaps = {m: float(v[0]) for m, v in rows.items() if m in sec["metrics"]["largest_gap_2d"]}
    best = min(gaps, key=gaps.get)
    assert f"{best} ({rows[best][0]})" in note


def test_projection_reference_is_the_random_method_at_the_same_seed(monkeypatch, tmp_path):
    figs = _capture(monkeypatch, nd_figures)
    nd_figures.plot_projections(2, 40, "weyl", tmp_path / "a.png", seed=3)
    nd_figures.plot_projections(2, 40, "random", tmp_path / "b.png", seed=3)
    for fig, seed in zip(figs, (3, 4)):
        title = fig.axes[1].get_title()
        gap = max_angular_gap(nd_directions(40, 2, "random", seed=seed))
        assert f"seed {seed}" in title and f"{gap:.2f}" in title


# --- experiments ----------------------------------------------------------------------------------------

def test_the_claims_summary_says_each_scope_once(tmp_path):
    entries = []
    for f in sorted(STORED.glob("experiments-*.json")):
        agg = json.loads(f.read_text())
        entries.append((f.stem.removeprefix("experiments-"), agg))
    # an adjusted quick aggregate next to the stored ones, as a fresh quick run writes it
    claim = Claim("A", "a beats base", "Paper §1", "acc", "a", "base", delta=0.02, delta_reason="accuracy")
    exp = SimpleNamespace(claims=(claim,))
    runs = [{"design": d, "seed": s, "metrics": {"acc": v + 0.01 * s}} for d, v in (("a", 0.6), ("base", 0.5))
            for s in range(3)]
    for name in ("fake-one", "fake-two"):
        entries.append((name, {"experiment": name, "preset": "quick", "seeds": 3, "seed_list": [0, 1, 2],
                               "claims": runner.verdicts(exp, runs)}))
    html_text = rexp.claims_table(entries)
    scopes = {rexp.scope(agg) for _, agg in entries if agg["claims"]}
    assert "quick: a look, not sized to decide" in scopes
    note, body = html_text.split("<table>", 1)
    for s in scopes:  # what each kind of run means is said once, in the note, whatever the number of its rows
        label = s.partition(": ")[0]
        assert note.count(f"<b>{label}</b>") == 1, s
    quick_kinds = [s for s in scopes if s.startswith("quick")]
    rows = body.count("<tr>") - 1
    quick_rows = sum(len(agg["claims"]) for _, agg in entries if agg["preset"] == "quick")
    assert rows == sum(len(agg["claims"]) for _, agg in entries) and quick_rows > len(quick_kinds)
    assert note.count("a look, not sized to decide") == len(quick_kinds) == 2
    assert "sized to decide" not in body and "adjustment existed" not in body


def test_cost_table_shows_ratios_only_against_a_reference(tmp_path):
    designs = {"a": {"step_s": 0.2, "step_cpu_s": 0.4, "cpu_ratio": None, "wall_ratio": None},
               "b": {"step_s": 0.3, "step_cpu_s": 0.5, "cpu_ratio": None, "wall_ratio": None}}
    without = rexp._costs({"cost": {"reference": None, "designs": designs}})
    assert "×" not in without and "–" not in re.sub("<p.*?</p>", "", without)
    assert "no reference design" in without
    header = re.findall(r"<th>(.*?)</th>", without)
    body_rows = re.findall(r"<tr>(.*?)</tr>", without)[1:]
    assert len(header) == 3 and all(len(re.findall(r"<td", tr)) == 3 for tr in body_rows)
    ref = {"axial": {"step_s": 0.2, "step_cpu_s": 0.4, "cpu_ratio": 1.0, "wall_ratio": 1.0},
           "b": {"step_s": 0.3, "step_cpu_s": 0.6, "cpu_ratio": 1.5, "wall_ratio": 1.5}}
    with_ref = rexp._costs({"cost": {"reference": "axial", "designs": ref}})
    assert "CPU × axial" in with_ref and "1.50×" in with_ref


def _long_claims():
    text = ("Circle-RoPE keeps spatial structure: better than M-RoPE on grids larger than trained, and on every "
            "aspect ratio the paper's appendix lists")
    claims = (Claim("C3", text, "Paper §1", "acc", "a", "base", delta=0.02, delta_reason="accuracy"),
              Claim("C4", "short", "Paper §2", "acc", "b", "base", delta=0.02, delta_reason="accuracy"))
    vals = {"base": 0.50, "a": 0.55, "b": 0.50}
    runs = [{"design": d, "seed": s, "metrics": {"acc": v + 0.01 * ((s * 7 + len(d)) % 3)}}
            for d, v in vals.items() for s in range(4)]
    return runner.verdicts(SimpleNamespace(claims=claims), runs)


def test_forest_labels_show_each_claim_whole_inside_the_figure(tmp_path, monkeypatch):
    figs = _capture_closed(monkeypatch)
    claims = _long_claims()
    agg = {"experiment": "fake", "preset": "standard", "seeds": 4, "seed_list": [0, 1, 2, 3], "claims": claims}
    rexp.plot_forest(agg, tmp_path / "forest.png", "fake")
    fig = figs[-1]
    ax = fig.axes[0]
    canvas = FigureCanvasAgg(fig)  # the figure was closed: draw it again as it was saved
    canvas.draw()
    labels = ax.get_yticklabels()
    texts = [" ".join(t.get_text().split()) for t in labels]
    for c in claims:
        assert f"{c['id']}: {c['claim']}" in texts
    assert not any("…" in t for t in texts)
    renderer = canvas.get_renderer()
    width = fig.bbox.width
    for t in labels + list(ax.texts):  # labels and verdicts lie inside the figure
        box = t.get_window_extent(renderer)
        assert box.x0 >= 0 and box.x1 <= width + 1, t.get_text()
    # rows do not overlap: each label's box ends before the next one starts
    boxes = sorted((t.get_window_extent(renderer) for t in labels), key=lambda b: b.y0)
    assert all(lo.y1 <= hi.y0 + 1 for lo, hi in zip(boxes, boxes[1:]))


def _curve_agg(n: int) -> dict:
    xs = ["0", "4", "8"]
    metrics = {f"d{i}": {"acc_vs_gap": {x: {"mean": 0.5, "lo": 0.4, "hi": 0.6} for x in xs},
                         "acc": {"mean": 0.5, "lo": 0.4, "hi": 0.6, "n": 2},
                         "cell_acc": {"mean": [[0.5, 0.4], [0.3, 0.2]]}, "cell_spread": {"mean": 0.1}}
               for i in range(n)}
    return {"metrics": metrics, "seeds": 2, "claims": [{"baseline": "d0"}]}


@pytest.mark.parametrize("n", [3, rexp.PANEL_ABOVE + 2])
def test_every_experiment_plot_labels_every_axis(tmp_path, monkeypatch, n):
    figs = _capture_closed(monkeypatch)
    agg = _curve_agg(n)
    rexp.plot_curve(agg, "acc_vs_gap", "text gap between image and question (tokens)", tmp_path / "c.png")
    rexp.plot_bars(agg, ["acc"], tmp_path / "b.png")
    rexp.plot_heatmaps(agg, "cell_acc", tmp_path / "h.png")
    for fig in figs:
        plotted = [ax for ax in fig.axes if ax.axison and (ax.lines or ax.images or ax.patches)]
        assert plotted
        for ax in plotted:
            assert ax.get_xlabel().strip() and ax.get_ylabel().strip(), (ax.get_title(), fig)
    curve = figs[0]
    assert all("gap" in ax.get_xlabel() for ax in curve.axes if ax.axison and ax.lines)
