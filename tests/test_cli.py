"""The command line as a user runs it: report, positions, ptd, designs."""
import json
import re

import pytest
import torch

import ropekit
from ropekit.cli import main


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
