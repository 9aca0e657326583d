"""A user sees their own layout: ``positions --plot``, ``report --layout --designs``, ``viz --save-path``."""
import json
import re

import pytest

import ropekit
from ropekit.analysis.metrics import block_ptd, layout_ptd
from ropekit.cli import main

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("design", ["circle", "rope2d", "vanilla", "vrope"])
def test_positions_plot_writes_the_figure_and_still_prints_positions(tmp_path, capsys, design):
    out = tmp_path / "sub" / "pos.png"
    assert main(["positions", "T2 I2x3 T1", "--design", design, "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG
    io = capsys.readouterr()
    assert f"positions plot written to {out}" in io.err
    assert len([line for line in io.out.splitlines() if not line.startswith("#")]) == 9  # one row per token


def test_positions_plot_takes_design_options_and_keeps_json_clean(tmp_path, capsys):
    out = tmp_path / "c.png"
    assert main(["positions", "T2 I2x2 T1", "--design", "circle", "-o", "alpha=0.5", "--json", "--plot", str(out)]) == 0
    got = json.loads(capsys.readouterr().out)  # the plot message goes to stderr, stdout stays JSON
    assert got["positions"] == ropekit.positions("T2 I2x2 T1", "circle", alpha=0.5).tolist()
    assert out.read_bytes()[:8] == PNG


def test_report_on_the_users_layout_and_designs(tmp_path, capsys):
    lay = "T2 I2x2 T2 V2x2x2 T3"
    assert main(["report", "--out", str(tmp_path), "--quiet", "--layout", lay, "--designs", "circle,vanilla"]) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    ptd = metrics["multimodal.ptd_section"]
    assert list(ptd["whole"]) == [lay] and list(ptd["whole"][lay]) == ["circle", "vanilla"]
    for d in ("circle", "vanilla"):
        assert ptd["whole"][lay][d] == pytest.approx(layout_ptd(lay, d))
        assert ptd["per_block"][lay][d] == pytest.approx(block_ptd(lay, d))
    assert list(ptd["per_block"][lay]["circle"]) == ["image 1 (I2x2)", "video 1 frame 0 (V2x2x2)",
                                                     "video 1 frame 1 (V2x2x2)"]
    assert set(metrics["multimodal.bias_section"]) == {"circle", "vanilla"}
    page = (tmp_path / "index.html").read_text()
    for img in re.findall(r"src='([^']+)'", page):
        assert (tmp_path / img).read_bytes()[:8] == PNG
    assert "designs_layout.png" in page and "<td><code>mrope</code></td>" not in page
    assert "<td><code>circle</code></td>" in page
    out = capsys.readouterr().out
    assert lay in out and "circle" in out and "mrope" not in out


@pytest.mark.parametrize("argv, message", [
    (["--designs", "circle,nope"], "unknown design 'nope'"),
    (["--designs", ","], "`--designs` is empty"),
    (["--layout", "T5"], "needs both text and image/video tokens"),
    (["--layout", "I2x2"], "needs both text and image/video tokens"),
    (["--layout", "T2 Q3"], "cannot read segment 'Q3'"),
])
def test_report_refuses_bad_choices_before_writing(tmp_path, capsys, argv, message):
    out = tmp_path / "rep"
    assert main(["report", "--out", str(out), "--quiet"] + argv) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_viz_save_path_folder_and_missing_suffix(tmp_path, capsys, monkeypatch):
    base = ["viz", "proj", "--num-vectors", "8", "--sampling-method", "golden"]
    folder = tmp_path / "figs"
    folder.mkdir()
    for given in (str(folder) + "/", str(folder)):  # an existing folder, with or without the slash
        assert main(base + ["--save-path", given]) == 0
        written = folder / "rope_proj_2d_golden.png"
        assert capsys.readouterr().out.strip() == f"projection figure written to {written}"
        assert written.read_bytes()[:8] == PNG
        written.unlink()
    new = tmp_path / "new" / "deeper"  # a folder that does not exist yet, named by its trailing slash
    assert main(base + ["--save-path", str(new) + "/"]) == 0
    assert capsys.readouterr().out.strip().endswith(str(new / "rope_proj_2d_golden.png"))
    assert (new / "rope_proj_2d_golden.png").exists()
    assert main(base + ["--save-path", str(tmp_path / "plain")]) == 0  # no suffix: .png is added, and said
    assert capsys.readouterr().out.strip() == f"projection figure written to {tmp_path / 'plain.png'}"
    assert (tmp_path / "plain.png").read_bytes()[:8] == PNG
    monkeypatch.chdir(tmp_path)
    assert main(base) == 0
    assert capsys.readouterr().out.strip() == "projection figure written to rope_proj_2d_golden.png"
    assert (tmp_path / "rope_proj_2d_golden.png").exists()


def test_positions_plot_draws_audio_segments(tmp_path, capsys, monkeypatch):
    """Audio tokens get their own colour and legend entry in ``positions --plot``, and their own letter in the
    printed table; they sit where the design places them (a text run under M-RoPE)."""
    import matplotlib.colors as mcolors

    from ropekit.analysis import figures

    figs = []
    real_save = figures._save
    monkeypatch.setattr(figures, "_save", lambda fig, path: (figs.append(fig), real_save(fig, path))[1])
    out = tmp_path / "audio.png"
    lay = "T2 A3 V2x1x2 A2@0.02 T1"
    assert main(["positions", lay, "--design", "mrope", "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    assert [r[1] for r in rows] == list("ttaaavvvvaat")
    fig = figs[0]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[:3] == ["text", "video", "audio"]
    audio_rgba = mcolors.to_rgba(figures._KIND_COLOURS[4])
    coords = ropekit.positions(lay, "mrope")
    drawn = set()  # (token index, coordinate) of every point drawn in the audio colour on the first panel
    for coll in fig.axes[0].collections:
        if tuple(coll.get_facecolor()[0][:3]) == audio_rgba[:3]:
            drawn |= {(float(x), float(y)) for x, y in coll.get_offsets()}
    want = {(float(i), float(coords[i, a])) for i in (2, 3, 4, 9, 10) for a in range(3)}
    assert drawn == want


def test_report_takes_a_layout_with_audio(tmp_path):
    lay = "T2 A4 I2x2 T2"
    assert main(["report", "--out", str(tmp_path), "--quiet", "--layout", lay, "--designs", "mrope"]) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    ptd = metrics["multimodal.ptd_section"]
    assert list(ptd["per_block"][lay]["mrope"]) == ["image 1 (I2x2)"]  # audio is no vision block
    assert ptd["whole"][lay]["mrope"] == pytest.approx(layout_ptd(lay, "mrope"))
    page = (tmp_path / "index.html").read_text()
    for img in re.findall(r"src='([^']+)'", page):
        assert (tmp_path / img).read_bytes()[:8] == PNG


def test_the_default_report_draws_an_audio_layout(tmp_path, monkeypatch):
    """The designs section shows a layout with audio next to the image and video ones, audio in its own colour."""
    from ropekit.analysis import figures
    from ropekit.report import multimodal

    drawn = []
    real = multimodal.plot_coordinates

    def plot(lay, names, path):
        drawn.append(lay)
        return real(lay, names, path)

    monkeypatch.setattr(multimodal, "plot_coordinates", plot)
    section = multimodal.designs_section(tmp_path, designs=["mrope", "tmrope"])
    assert multimodal.AUDIO_LAYOUT in drawn and "A4" in multimodal.AUDIO_LAYOUT
    assert "designs_audio.png" in section["html"] and (tmp_path / "designs_audio.png").read_bytes()[:8] == PNG
    assert figures._KIND_NAMES[4] == "audio"
