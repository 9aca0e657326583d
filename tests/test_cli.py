"""The command line as a user runs it: report, positions, ptd, designs, relative, viz."""
import argparse
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

import ropekit
from ropekit.cli import build_parser, main


def test_report_writes_a_self_contained_page(tmp_path, capsys):
    assert main(["report", "--out", str(tmp_path), "--quiet"]) == 0
    page = (tmp_path / "index.html").read_text()
    images = re.findall(r"src='([^']+)'", page)
    assert images, "the report shows figures"
    for img in images:  # every figure is a PNG beside the page
        assert (tmp_path / img).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    ptd = metrics["multimodal.ptd_section"]["whole"]["I3x3 T5"]
    for name in ropekit.designs():
        assert ptd[name] == pytest.approx(ropekit.layout_ptd("I3x3 T5", name))
    out = capsys.readouterr().out
    assert "index.html" in out and "vanilla" in out


def test_positions_json_matches_the_library(capsys):
    assert main(["positions", "T2 I2x3 T1", "--design", "vanilla", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert torch.tensor(got["positions"]).equal(ropekit.positions("T2 I2x3 T1", "vanilla"))
    assert got["token_types"] == [0, 0, 1, 1, 1, 1, 1, 1, 0]


def test_ptd_and_designs_commands(capsys):
    assert main(["ptd", "I3x3 T5", "--design", "vanilla", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ptd"]["vanilla"] == pytest.approx(20 / 9)
    assert main(["designs"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in ropekit.designs())


def test_bad_input_is_reported_not_a_traceback(capsys):
    assert main(["positions", "T2 I0x2"]) == 2
    assert "must be >= 1" in capsys.readouterr().err
    assert main(["positions", "T2", "--design", "nope"]) == 2
    assert "unknown design" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["positions", "T2", "-o", "alpha"])


def test_relative_command_classifies_families(capsys):
    assert main(["relative", "--head-dim", "48", "--trials", "16", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and all(r["exact"] == r["expected_exact"] for r in rows)
    assert not next(r for r in rows if r["name"] == "GeoPE 2-D")["exact"]


# ------------------------------------------------------------------ failures a user sees: one line, never a traceback

_SRC = str(Path(ropekit.__file__).resolve().parents[1])
_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_SRC, os.environ.get("PYTHONPATH")]))}
_ENV.pop("ROPEKIT_DEBUG", None)
_FILE = "{file}"  # replaced by an existing plain file

# Bad arguments for every command: usage errors (argparse) and bad input found while the command runs.
# Each fails before any real work. "experiment" is the training command of another branch; until it
# exists the case is an unknown command, which must also be one line.
BAD = {
    "none": [],
    "unknown command": ["nope"],
    "report --bogus": ["report", "--bogus"],
    "report --out FILE": ["report", "--out", _FILE],
    "report --out impossible": ["report", "--out", "/dev/null/sub"],
    "positions no layout": ["positions"],
    "positions overflow": ["positions", "T99999999999999999999"],
    "positions huge": ["positions", "I100000000x100000000"],
    "positions NaN json": ["positions", "V2x2x2@1e39", "--json"],
    "positions bad layout": ["positions", "T2 I0x2"],
    "positions bad design": ["positions", "T2", "--design", "nope"],
    "positions bad -o": ["positions", "T2", "-o", "alpha"],
    "positions bad option value": ["positions", "T2", "--design", "circle", "-o", "alpha=abc"],
    "ptd bad layout": ["ptd", "X3"],
    "ptd bad design": ["ptd", "T2", "--design", "nope"],
    "designs extra": ["designs", "extra"],
    "relative huge head-dim": ["relative", "--head-dim", "100000000"],
    "relative zero trials": ["relative", "--trials", "0"],
    "relative head-dim 40": ["relative", "--head-dim", "40"],
    "relative trials x": ["relative", "--trials", "x"],
    "viz none": ["viz"],
    "viz proj n-dims": ["viz", "proj", "--n-dims", "4"],
    "viz proj zero vectors": ["viz", "proj", "--num-vectors", "0"],
    "viz proj impossible path": ["viz", "proj", "--num-vectors", "4", "--save-path", "/dev/null/x.png"],
    "viz sim2d odd d-head": ["viz", "sim2d", "--d-head", "7"],
    "viz sim2d zero grid": ["viz", "sim2d", "--grid-size", "0"],
    "viz sim3d no slices": ["viz", "sim3d", "--slice-coords"],
    "viz sim3d d-head x": ["viz", "sim3d", "--d-head", "x"],
    # absurd sizes are refused before any allocation (each would need tens of GiB or hours)
    "viz sim2d huge grid": ["viz", "sim2d", "--grid-size", "100000"],
    "viz sim2d huge d-head": ["viz", "sim2d", "--d-head", "1000000000"],
    "viz sim2d huge num-samples": ["viz", "sim2d", "--num-samples", "10000000"],
    "viz sim3d huge grid": ["viz", "sim3d", "--grid-size", "100000"],
    "viz sim3d many slices": ["viz", "sim3d", "--slice-coords", *map(str, range(100))],
    "viz sim3d slice outside the grid": ["viz", "sim3d", "--slice-coords", "100"],
    "viz sim3d full-width digit": ["viz", "sim3d", "--slice-coords", "１０"],
    "positions full-width digit": ["positions", "T３"],
    "viz proj huge num-vectors": ["viz", "proj", "--num-vectors", "1000000000"],
    "experiment bad preset": ["experiment", "--preset", "huge"],
}
# the same failures through the installed entry point (python -m ropekit), one per command plus the
# issue's reproducers; the rest run in-process, which is the same main() without a new interpreter
THROUGH_ENTRY_POINT = ["none", "report --out FILE", "report --out impossible", "positions overflow",
                       "positions huge", "positions NaN json", "ptd bad layout", "designs extra",
                       "relative huge head-dim", "viz proj impossible path", "viz sim2d odd d-head",
                       "viz sim3d no slices", "experiment bad preset"]


def _leaf_commands(parser: argparse.ArgumentParser, prefix: tuple = ()) -> list[tuple]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [prefix]
    return [leaf for name, p in subs[0].choices.items() for leaf in _leaf_commands(p, prefix + (name,))]


def _args(case: str, tmp_path: Path) -> list[str]:
    file = tmp_path / "a-file"
    file.write_text("")
    return [str(file) if a == _FILE else a for a in BAD[case]]


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ropekit: error: "), err
    assert "Traceback" not in err
    return lines[0]


def test_every_command_has_bad_argument_cases():
    covered = {tuple(args[: len(leaf)]) for args in BAD.values() for leaf in _leaf_commands(build_parser())}
    assert set(_leaf_commands(build_parser())) <= covered


@pytest.mark.parametrize("case", list(BAD))
def test_bad_arguments_give_one_line_and_a_failing_status(case, tmp_path, capsys):
    try:
        status = main(_args(case, tmp_path))
    except SystemExit as stop:  # usage errors exit as argparse does
        status = stop.code
    out, err = capsys.readouterr()
    _one_error_line(err)
    assert status not in (0, None)
    if "--json" in BAD[case]:
        assert out == ""


@pytest.fixture(scope="module")
def entry_point_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")

    def run(case):
        cmd = [sys.executable, "-m", "ropekit", *_args(case, tmp)]
        return case, subprocess.run(cmd, capture_output=True, text=True, env=_ENV, timeout=300)

    with ThreadPoolExecutor(max_workers=3) as pool:  # each run is mostly interpreter start-up
        return dict(pool.map(run, THROUGH_ENTRY_POINT))


@pytest.mark.parametrize("case", THROUGH_ENTRY_POINT)
def test_bad_arguments_through_python_m_ropekit(case, entry_point_runs):
    done = entry_point_runs[case]
    _one_error_line(done.stderr)
    assert done.returncode != 0
    if "--json" in BAD[case]:
        assert done.stdout == ""


def test_bad_input_messages_say_what_is_wrong(tmp_path, capsys):
    for case, expected in [("report --out FILE", "exists and is not a folder"),
                           ("positions overflow", "too large"),
                           ("relative huge head-dim", "--head-dim: must be between 16 and 8192"),
                           ("positions bad -o", "see 'ropekit positions --help'"),
                           ("viz sim2d huge grid", "`grid_size`² (100000²) × (`d_head`/2 + 3 = 515) = 5150000000000"),
                           ("viz sim2d huge num-samples", "× `num_samples` (10000000) ="),
                           ("viz sim3d many slices", "100 slices"),
                           ("viz sim3d slice outside the grid", "--slice-coords: 100 is outside the grid"),
                           ("viz sim3d full-width digit", "argument --slice-coords: '１０' holds the non-ASCII digit"),
                           ("positions full-width digit", "argument layout: 'T３' holds the non-ASCII digit '３' "
                                                          "(FULLWIDTH DIGIT THREE); write numbers with the ASCII "
                                                          "digits 0-9, e.g. 'T3'"),
                           ("viz proj huge num-vectors", "`num_vectors` = 1000000000")]:
        try:
            main(_args(case, tmp_path))
        except SystemExit:
            pass
        assert expected in _one_error_line(capsys.readouterr().err), case


def test_closed_stdout_ends_quietly():
    """``ropekit positions … | head -1``: no BrokenPipeError traceback, the status a shell gives SIGPIPE."""
    proc = subprocess.Popen([sys.executable, "-m", "ropekit", "positions", "T20000"], env=_ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("# layout T20000")
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 141
    assert err == ""


def test_unexpected_failures_are_one_line_too(monkeypatch, capsys):
    def broken(args):
        raise KeyError("boom")

    monkeypatch.setattr("ropekit.cli._cmd_designs", broken)
    assert main(["designs"]) == 1
    assert "internal error (KeyError" in _one_error_line(capsys.readouterr().err)
    monkeypatch.setenv("ROPEKIT_DEBUG", "1")
    with pytest.raises(KeyError):
        main(["designs"])


# ---------------------------------------------------------------------------------------- help and listings


def _parsers(parser: argparse.ArgumentParser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_every_option_has_help_and_shows_its_default():
    for parser in _parsers(build_parser()):
        text = parser.format_help()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help, f"{parser.prog}: {action.dest} has no help"
            if action.default not in (None, False, [], argparse.SUPPRESS):
                assert "default" in action.help or f"(default: {action.default}" in " ".join(text.split()), \
                    f"{parser.prog}: {action.dest} does not show its default {action.default!r}"


def test_python_m_ropekit_help():
    done = subprocess.run([sys.executable, "-m", "ropekit", "positions", "--help"], capture_output=True,
                          text=True, env=_ENV, timeout=300)
    assert done.returncode == 0 and done.stderr == ""
    assert "usage: ropekit positions" in done.stdout and "(default: mrope)" in " ".join(done.stdout.split())


def test_designs_columns_align(capsys):
    assert main(["designs"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    assert len(starts) == 4 and len(rows) == len(ropekit.designs())
    for row in rows:
        for s in starts[1:]:  # every column starts where its heading does, after a space
            assert row[s - 1] == " " and row[s] != " ", (row, s)
        assert row.split()[0] in ropekit.designs()


# ------------------------------------------------------------------------- digits, and where outputs are written


def _non_ascii_digits() -> list[str]:
    """Every character Python's str.isdigit() accepts besides 0-9 (full-width, Arabic-Indic, superscripts, ...)."""
    return [chr(i) for i in range(0x80, 0x110000) if chr(i).isdigit()]


def test_layouts_with_non_ascii_digits_are_refused_everywhere(capsys):
    """int() and a Unicode regex read '３' as 3, so 'T３' was the layout T3. Every non-ASCII digit is refused by
    Layout.parse (in any segment kind), and by the commands' layout arguments, with the ASCII spelling."""
    from ropekit.layout import Layout

    digits = _non_ascii_digits()
    assert len(digits) > 300 and "３" in digits and "٣" in digits and "²" in digits
    for d in digits:
        for text in (f"T{d}", f"T2 I{d}x2", f"V2x2x{d}+A4:time", f"A{d}", f"G2x{d}"):
            with pytest.raises(ValueError, match="holds the non-ASCII digit"):
                Layout.parse(text)
    with pytest.raises(ValueError, match=r"segment 'I４x٤' holds the non-ASCII digit '４' \(FULLWIDTH DIGIT FOUR\); "
                                         r"write sizes with the ASCII digits 0-9, e.g. 'I4x4'"):
        Layout.parse("T3 I４x٤")
    assert str(Layout.parse("T3 I4x4 V2x2x2+A4:time G2x3 A5")) == "T3 I4x4 V2x2x2+A4:time G2x3 A5"
    for argv, option in ((["positions", "T３"], "layout"), (["ptd", "I２x2 T1"], "layout"),
                         (["report", "--layout", "T3 I４x4"], "--layout")):
        try:
            main(argv)
        except SystemExit as stop:
            assert stop.code == 2
        else:
            raise AssertionError(f"{argv} was accepted")
        err = _one_error_line(capsys.readouterr().err)
        assert f"argument {option}: " in err and "write numbers with the ASCII digits 0-9" in err


@pytest.mark.parametrize("argv,option", [(["relative", "--trials", "８"], "--trials"),
                                         (["viz", "proj", "--num-vectors", "１６"], "--num-vectors"),
                                         (["viz", "proj", "--n-dims", "２"], "--n-dims"),
                                         (["experiment", "--list", "--seeds", "３"], "--seeds"),
                                         (["experiment", "--list", "--jobs", "２"], "--jobs")])
def test_numbers_with_non_ascii_digits_are_refused_naming_the_option(argv, option, capsys):
    assert int(argv[-1]) > 0, "int() alone would take it"
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = _one_error_line(capsys.readouterr().err)
    assert err.startswith(f"ropekit: error: argument {option}: {argv[-1]!r} holds the non-ASCII digit ")
    assert f"e.g. '{int(argv[-1])}'" in err


def test_every_output_option_creates_missing_folders_and_says_so(tmp_path, capsys):
    """`positions --plot` and `viz --save-path` write into folders that do not exist yet, as `report --out` and
    `experiment --out` do; each option's help says so."""
    plot = tmp_path / "new" / "deeper" / "pos.png"
    assert main(["positions", "T2 I2x2", "--plot", str(plot)]) == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig = tmp_path / "other" / "folder" / "proj.png"
    assert main(["viz", "proj", "--num-vectors", "8", "--save-path", str(fig)]) == 0
    assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    helps = {}
    for parser in _parsers(build_parser()):
        for action in parser._actions:
            if set(action.option_strings) & {"--out", "--plot", "--save-path"}:
                helps[(parser.prog, action.option_strings[-1])] = action.help
    assert {prog.split()[1] for prog, _ in helps} == {"report", "positions", "experiment", "viz"}
    for key, text in helps.items():
        assert "missing folders are created" in text, key
