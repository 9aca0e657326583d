"""What a user sees when an input is wrong or damaged, and the progress output in a log.

``report --experiments`` with a folder holding no results, empty names in ``--designs``, a ``runs.jsonl``
cut off by a killed run, and progress written to a CI log or a file (no ``\\r``).
"""
import io
import json
import shutil

import pytest

from ropekit.cli import main
from ropekit.experiments import get, runner
from ropekit.report import build

_VALID = "`ropekit experiment NAME --out DIR`"  # every --experiments error says what a valid folder is


def _error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ropekit: error: "), err
    return lines[0]


# ---------------------------------------------------------------------------------- report --experiments


@pytest.mark.parametrize("kind", ["missing", "file", "empty folder"])
def test_report_refuses_an_experiments_path_without_results(tmp_path, capsys, kind):
    given = tmp_path / "typo"
    if kind == "file":
        given.write_text("")
    elif kind == "empty folder":
        given.mkdir()
    out = tmp_path / "rep"
    assert main(["report", "--out", str(out), "--quiet", "--experiments", str(given)]) == 2
    line = _error(capsys.readouterr().err)
    assert "`--experiments`" in line and f"'{given}'" in line and _VALID in line
    assert {"missing": "does not exist", "file": "is not a folder",
            "empty folder": "holds no experiment results"}[kind] in line
    assert not out.exists(), "refused before any section ran"


def test_report_experiments_errors_say_what_to_give_instead(tmp_path, capsys):
    own = tmp_path / "exps" / "crossmodal"  # one experiment's folder instead of the folder above it
    own.mkdir(parents=True)
    (own / "aggregate.json").write_text("{}")
    assert main(["report", "--out", str(tmp_path / "rep"), "--quiet", "--experiments", str(own)]) == 2
    assert f"give its parent '{own.parent}'" in _error(capsys.readouterr().err)
    (own / "aggregate.json").rename(own / "runs.jsonl")  # a killed run: records, no aggregate yet
    assert main(["report", "--out", str(tmp_path / "rep"), "--quiet", "--experiments", str(own.parent)]) == 2
    line = _error(capsys.readouterr().err)
    assert "unfinished experiments (crossmodal)" in line and f"--out {own.parent}" in line
    assert main(["report", "--out", str(tmp_path / "rep"), "--quiet", "--experiments", ""]) == 2
    assert "`--experiments` is empty" in _error(capsys.readouterr().err)


def test_build_report_refuses_a_folder_without_results_before_writing(tmp_path):
    with pytest.raises(ValueError, match="experiments folder '.*nowhere' does not exist"):
        build.build_report(tmp_path / "rep", progress=False, experiments=tmp_path / "nowhere")
    assert not (tmp_path / "rep").exists()


# ---------------------------------------------------------------------------------- --designs


@pytest.mark.parametrize("command", ["report", "experiment"])
@pytest.mark.parametrize("given, message", [
    ("", "`--designs` is empty"),
    (" , ", "`--designs` is empty"),
    ("circle,,mrope", "`--designs` 'circle,,mrope' holds an empty name"),
    ("circle,", "`--designs` 'circle,' holds an empty name"),
    ("circle,nope", "unknown design 'nope'"),
])
def test_designs_with_empty_or_unknown_names_are_refused(tmp_path, capsys, command, given, message):
    out = tmp_path / "out"
    argv = ["report", "--quiet"] if command == "report" else ["experiment", "crossmodal", "--preset", "micro",
                                                               "--quiet"]
    assert main(argv + ["--out", str(out), "--designs", given]) == 2
    assert message in _error(capsys.readouterr().err)
    assert not out.exists(), "refused before any work"


# ---------------------------------------------------------------------------------- a damaged runs.jsonl

_RUN = ["experiment", "crossmodal", "--designs", "mrope", "--preset", "micro", "--quiet"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished micro run of 2 seeds: its folder (``DIR``) and its two records."""
    base = tmp_path_factory.mktemp("finished")
    assert main(_RUN + ["--seeds", "2", "--out", str(base)]) == 0
    lines = (base / "crossmodal" / "runs.jsonl").read_text().splitlines()
    return base, [json.loads(line) for line in lines]


def _copy(finished, tmp_path):
    out = tmp_path / "exps"
    shutil.copytree(finished[0], out)
    return out, out / "crossmodal" / "runs.jsonl"


def test_a_cut_off_last_line_is_skipped_and_its_run_trained_again(finished, tmp_path, capsys):
    out, path = _copy(finished, tmp_path)
    first, second = path.read_bytes().split(b"\n")[:2]
    path.write_bytes(first + b"\n" + second[: len(second) // 2])  # killed while writing the second record
    capsys.readouterr()
    assert main(_RUN + ["--seeds", "2", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    warning = next(line for line in err.splitlines() if line.startswith("ropekit: warning: "))
    assert f"'{path}' line 2 is cut off" in warning and "trained again" in warning
    records = [json.loads(line) for line in path.read_text().splitlines()]  # every line whole again
    assert [(r["design"], r["seed"]) for r in records] == [("mrope", 0), ("mrope", 1)]
    assert records[1]["losses"] == finished[1][1]["losses"]  # the same run, trained again
    assert records[1]["metrics"] == finished[1][1]["metrics"]
    assert json.loads((out / "crossmodal" / "aggregate.json").read_text())["metrics"]["mrope"]["acc"]["n"] == 2


def test_read_runs_warns_naming_the_file_and_how_to_recover(finished, tmp_path, capsys):
    out, path = _copy(finished, tmp_path)
    path.write_bytes(path.read_bytes() + b'{"experiment": "crossmodal", "des')
    records = runner.read_runs(path)
    assert [(r["design"], r["seed"]) for r in records] == [("mrope", 0), ("mrope", 1)]
    warning = capsys.readouterr().err.strip()
    assert warning.startswith("ropekit: warning: ") and f"'{path}' line 3 is cut off" in warning
    assert f"`ropekit experiment crossmodal --out {out}` with the same options trains it again" in warning
    assert path.read_bytes().endswith(b'"des'), "reading alone leaves the file as it is"


def test_a_damaged_line_before_the_last_is_an_error_naming_file_and_line(finished, tmp_path, capsys):
    out, path = _copy(finished, tmp_path)
    first, second = path.read_bytes().split(b"\n")[:2]
    damaged = first[:100] + b"\n" + second + b"\n"
    path.write_bytes(damaged)
    assert main(_RUN + ["--seeds", "2", "--out", str(out)]) == 2
    line = _error(capsys.readouterr().err)
    assert f"'{path}' line 1 is damaged" in line and "repair or delete line 1" in line
    assert "Traceback" not in line
    assert path.read_bytes() == damaged, "a damaged middle line is the user's to repair, not removed"
    with pytest.raises(ValueError, match="line 1 is damaged"):
        runner.read_runs(path)


def test_a_last_record_without_its_newline_gets_one_before_the_next(finished, tmp_path, capsys):
    out, path = _copy(finished, tmp_path)
    path.write_bytes(path.read_bytes().rstrip(b"\n"))  # killed right before the newline: the record is whole
    assert main(_RUN + ["--seeds", "3", "--out", str(out)]) == 0
    assert "warning" not in capsys.readouterr().err
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["seed"] for r in records] == [0, 1, 2]
    assert records[1]["losses"] == finished[1][1]["losses"], "the whole record was kept, not trained again"


# ---------------------------------------------------------------------------------- progress in a log


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _fake_section(out, layout=None, designs=None):
    return {"title": "fake", "html": "<p>fake</p>",
            "metrics": {"whole": {"T1 I1x1": {"circle": 0.0}}, "per_block": {"T1 I1x1": {"circle": {"image": 0.0}}}}}


def test_report_progress_is_plain_lines_when_stderr_is_not_a_terminal(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(build, "_load", lambda mod, fn: _fake_section)  # `make demo` without the real work
    assert main(["report", "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "\r" not in err and "\r" not in out
    steps = [line for line in err.splitlines() if line.startswith("[")]
    n = len(build.SECTIONS)
    assert [s.split()[0] for s in steps] == [f"[{i}/{n}]" for i in range(n + 1)]
    assert steps[-1].split()[1] == "done"
    monkeypatch.setattr("sys.stderr", _Terminal())  # on a terminal the bar is redrawn in place
    build.build_report(tmp_path)
    assert build.sys.stderr.getvalue().count("\r") == n + 1


def test_experiment_progress_is_plain_lines_when_stderr_is_not_a_terminal(tmp_path, capsys, monkeypatch):
    argv = ["experiment", "crossmodal", "--designs", "mrope", "--seeds", "1", "--preset", "micro"]
    assert main(argv + ["--out", str(tmp_path / "log")]) == 0
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = [line.strip() for line in err.splitlines() if "mrope seed 0" in line]
    steps = get("crossmodal").presets["micro"]["train"]["steps"]
    assert lines and lines[-1].startswith(f"mrope seed 0: step {steps}/{steps} loss ")
    monkeypatch.setattr("sys.stderr", _Terminal())
    assert main(argv + ["--out", str(tmp_path / "tty")]) == 0
    assert "\r  mrope seed 0" in runner.sys.stderr.getvalue()


# ---------------------------------------------------------------------------------- mistyped names


def _nearest(word, names):
    """The reference for a suggestion: the names difflib finds nearest, case ignored."""
    import difflib

    return difflib.get_close_matches(word.lower(), [n.lower() for n in names], n=1, cutoff=0.6)


@pytest.mark.parametrize("typo, meant", [("cirle", "circle"), ("Circle", "circle"), ("MRoPE", "mrope"),
                                         ("vidoerope", "videorope"), ("mrope_interleav", "mrope-i"),
                                         ("v2p", "v2pe"), ("rope2", "rope2d")])
def test_a_mistyped_design_name_gets_the_nearest_names(typo, meant, capsys):
    from ropekit.designs import designs, get_design
    from ropekit.designs.registry import _ALIASES

    with pytest.raises(ValueError, match=rf"unknown design '{typo}' \(did you mean '{meant}'[ ,?]") as err:
        get_design(typo)
    nearest = _nearest(typo, designs() + list(_ALIASES))[0]
    assert get_design(nearest).name == meant  # the first suggestion is difflib's nearest name (or its design)
    assert "choose one of: " + ", ".join(sorted(designs())[:2]) in str(err.value)  # the whole list follows
    assert main(["positions", "T2", "--design", typo]) == 2
    assert f"(did you mean '{meant}'" in _error(capsys.readouterr().err)


def test_a_name_near_nothing_gets_the_list_only():
    from ropekit.designs import designs, get_design

    with pytest.raises(ValueError) as err:
        get_design("xyzzy")
    assert "did you mean" not in str(err.value) and "choose one of: " + ", ".join(designs()) in str(err.value)


def test_a_mistyped_design_option_gets_the_nearest_option(capsys):
    from ropekit import RoPE, positions
    from ropekit.designs import get_design

    allowed = get_design("circle").options
    assert _nearest("alpah", allowed) == ["alpha"] and _nearest("radus", allowed) == ["radius"]
    with pytest.raises(TypeError, match=r"unknown option\(s\) 'alpah' \(did you mean 'alpha'\?\), 'radus' "
                                        r"\(did you mean 'radius'\?\), 'zzz'; it accepts: alpha, radius"):
        positions("T2 I2x2", "circle", alpah=0.3, radus=1.0, zzz=1)
    with pytest.raises(TypeError, match=r"'alpah' \(did you mean 'alpha'\?\)"):
        RoPE(design="circle", design_options={"alpah": 0.3})
    assert main(["positions", "T2 I2x2", "--design", "circle", "-o", "alpah=0.3"]) == 2
    assert "'alpah' (did you mean 'alpha'?)" in _error(capsys.readouterr().err)


def test_a_mistyped_allocation_gets_the_nearest_allocations():
    from ropekit import RoPE, frequency_matrix
    from ropekit.rotations.planar import ALLOCATIONS

    for typo, meant in (("1D", "1d"), ("axil", "axial"), ("interleave", "interleaved"), ("mropee", "mrope")):
        assert _nearest(typo, ALLOCATIONS) == [meant]
        with pytest.raises(ValueError, match=rf"unknown allocation '{typo}' \(did you mean '{meant}'"):
            frequency_matrix(typo, 16, 1)
        with pytest.raises(ValueError, match=rf"unknown allocation '{typo}' \(did you mean '{meant}'"):
            RoPE(design="circle", allocation=typo)


def test_a_design_name_as_allocation_names_the_designs_own_allocation():
    """frequency_matrix takes allocations, not designs (one design may pair with several: GRAPE's option picks
    one); a design's name is refused with the allocation to pass instead, which gives what design_frequencies,
    the design's own pairing, gives."""
    import torch

    from ropekit import design_frequencies, frequency_matrix
    from ropekit.designs import designs, get_design
    from ropekit.rotations.planar import ALLOCATIONS

    for name in designs():
        if name in ALLOCATIONS:  # the same word names both (mrope, vrope, hope, ...): an allocation here
            continue
        own = get_design(name).allocation
        with pytest.raises(ValueError, match=rf"'{name}' is a position design, not an allocation; its allocation "
                                             rf"is '{own}'.*frequency_matrix\('{own}', \.\.\.\)"):
            frequency_matrix(name, 16, 1)
    with pytest.raises(ValueError, match=r"its allocation is '1d': frequency_matrix\('1d', \.\.\.\), or "
                                         r"ropekit.design_frequencies\('vanilla', \.\.\.\)"):
        frequency_matrix("vanilla", 16, 1)
    assert torch.equal(frequency_matrix("1d", 16, 1), design_frequencies("vanilla", 16, 1))
    with pytest.raises(ValueError, match=r"its allocation is 'mrope' \('interleaved' with "
                                         r"frequency_allocation='interleaved'\)"):
        frequency_matrix("grape", 16, 3)


def test_ptd_help_lists_every_segment_kind_the_layout_parser_reads(capsys):
    """Each template in `ptd --help` (its optional parts left out, and filled in) parses, and together they give
    every segment class Layout.parse builds."""
    import re

    from ropekit import layout

    with pytest.raises(SystemExit):
        main(["ptd", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    templates = {t.rstrip(";,)") for t in re.findall(r"(?<![\w{])[TIVAG]\{\S+", text)}
    kinds = set()
    for t in templates:
        filled = (t.replace("[x...]", "x2").replace("[@interval]", "@2").replace("[@seconds]", "@0.02")
                  .replace("[{c}]", "{c}"))
        bare = re.sub(r"\[[^]]*\]", "", t)
        for example in (filled, bare):
            seg, = layout.Layout.parse(re.sub(r"\{\w+\}", "3", example)).segments
            kinds.add(type(seg))
    assert kinds == set(layout._SEGMENTS), templates
    assert {"V{t}x{h}x{w}[@interval]+A{n}:time", "V{t}x{h}x{w}[@interval]+A{n}:chunks[{c}]"} <= templates
    # the help says which design places a video with its audio interleaved
    from ropekit.designs.registry import _REGISTRY

    assert [n for n, d in _REGISTRY.items() if d.audio_in_video] == ["tmrope"] and "design tmrope only" in text


def test_the_finetune_example_help_shows_every_default(capsys, monkeypatch):
    """Every option of examples/finetune_vlm.py with a default (not a flag, not None) shows it in --help, read
    from the parser's own actions."""
    import argparse
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "finetune_vlm.py"
    spec = importlib.util.spec_from_file_location("finetune_vlm_help", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises(SystemExit):
        mod.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())

    class Built(Exception):
        pass

    def stop(parser, *args, **kwargs):
        raise Built(parser)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop)
    with pytest.raises(Built) as built:
        mod.parse_args([])
    actions = [a for a in built.value.args[0]._actions if a.dest != "help"]
    shown = 0
    for action in actions:
        assert action.help, f"--{action.dest} has no help"
        if any(action.default is d for d in (None, False, argparse.SUPPRESS)):
            continue
        help_text = " ".join(action.help.split())
        assert f"{help_text} (default: {action.default})" in text or "(default" in help_text, action.dest
        shown += 1
    assert shown == 11  # model, design, age, trainer, pairs, steps, batch-size, lr, seed, max-new-tokens, output-dir
