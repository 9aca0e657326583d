"""The README: its first screen shows a researcher's own model, its examples run and show what they print, and
its command lines parse.

Every Python block of the README and of docs/*.md runs alone in a fresh interpreter (tests/test_docs.py, through
tests/doc_blocks.py); here, what the README's blocks show: a line ending in ``# → VALUE`` must evaluate to
exactly that repr (checked on every page), and the Hugging Face block, built from a tiny config, ran offline.
"""
import ast
import re
import shlex
from pathlib import Path

import pytest

import doc_blocks
from ropekit.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FIRST_SCREEN = 40  # lines


def _blocks(path: Path, language: str) -> list[str]:
    return [b.source for b in doc_blocks.blocks(path) if b.language == language]


def _shown(path: Path) -> dict:
    """``{first source line: value}`` of every top-level expression of the page's blocks, as they ran."""
    results = doc_blocks.run_all()
    shown = {}
    for chain in doc_blocks.chains(path):
        result = results[chain[0].where]
        assert result["ok"], f"{chain[0].where} failed:\n{result['error']}"
        shown.update({line: value for line, (value, _) in result["shown"].items()})
    return shown


def test_first_screen_loads_patches_trains_saves_and_restores_a_pretrained_model():
    top = "\n".join(README.read_text().splitlines()[:FIRST_SCREEN])
    first = doc_blocks.blocks(README)[0]
    assert first.language == "python" and first.line < FIRST_SCREEN, "the README opens with a Python block"
    assert first.source in top + "\n", f"the first block ends within the first {FIRST_SCREEN} lines"
    code = [ln for ln in first.source.splitlines() if ln.strip() and not ln.startswith(("import ", "from "))]
    assert len(code) <= 10, "about ten lines"
    assert first.no_run and first.word("twin"), "it loads from the hub: marked no-run, with a runnable twin"
    steps = [c for c in doc_blocks.calls(first.source)]
    names = [doc_blocks.callee(c) for c in steps]
    assert names.count("from_pretrained") == 2 and "save_pretrained" in names
    assert "backward" in names or "Trainer" in names, "it trains"
    patches = [c for c in steps if doc_blocks.callee(c) == "patch_model"]
    assert [ast.unparse(p) for p in patches] == ["ropekit.patch_model(model, 'circle', age='alternate')"]
    loads = [c for c in steps if doc_blocks.callee(c) == "from_pretrained"]
    assert all(ast.unparse(c.func).startswith("AutoModelForImageTextToText") for c in loads), \
        "the reload goes through an Auto class, which patches it from its record"
    assert names.index("save_pretrained") < len(names) - names[::-1].index("from_pretrained") - 1
    assert re.search(r"Qwen2\.5-VL", first.source)
    prose = top.split(first.source, 1)[1]
    for said in ("AGE", "Alternating Geometry Encoding", "load it patched", "config.json", "load_stock"):
        assert said in prose, f"the first screen explains {said!r}"


def test_readme_examples_run_and_show_their_values():
    shown = _shown(README)
    claims = [line for line in shown if "# →" in line]
    assert len(claims) >= 3, "the README shows values"
    assert any("layer_designs(model)" in line for line in claims), "the Hugging Face block ran"
    # the values themselves: tests/test_docs.py checks every `# →` of every page


def test_readme_command_lines_parse():
    parser = build_parser()
    lines = [ln.split("#")[0].strip() for block in _blocks(README, "bash") for ln in block.splitlines()]
    commands = [ln for ln in lines if ln.startswith(("ropekit ", "python -m ropekit "))]
    assert len(commands) >= 8
    for command in commands:
        words = shlex.split(command.replace("[", "").replace("]", ""))  # [--json]: optional
        args = words[3:] if words[0] == "python" else words[1:]
        assert parser.parse_args(args).func, command


def test_relative_doc_example_runs_and_matches_its_comments():
    shown = _shown(ROOT / "docs" / "relative.md")
    by_comment = {line.split("#")[1].strip(): value for line, value in shown.items() if "#" in line}
    assert by_comment["≈ 18: not relative"] == pytest.approx(18, rel=0.25)
    assert by_comment["≈ 1e-5: float32 rounding"] < 1e-4
    rows = next(v for c, v in by_comment.items() if c.startswith("one row per family"))
    assert rows and all(r["exact"] == r["expected_exact"] for r in rows)


def test_the_family_table_lists_every_family_patch_model_knows():
    """The README's table of model families has one row per supported model type and per refused one, each under
    its transformers ``model_type``; supported rows name a stock-equivalent design, refused ones "none"."""
    pytest.importorskip("transformers")
    from ropekit.hf import supported_models
    from ropekit.hf.adapters import REFUSED

    text = (ROOT / "README.md").read_text()
    start = text.index("| family (`model_type`) |")
    rows = [line for line in text[start:].splitlines()[2:] if line.startswith("|")]
    rows = rows[:next((i for i, r in enumerate(rows) if not r.strip()), len(rows))]
    listed: dict[str, str] = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        for mtype in re.findall(r"\(`([a-z0-9_]+)`\)", cells[0]):
            assert mtype not in listed, f"README lists {mtype} twice"
            listed[mtype] = cells[3]
    known = set(supported_models()) | set(REFUSED)
    assert set(listed) == known, f"missing: {sorted(known - set(listed))}; not a family: {sorted(set(listed) - known)}"
    for mtype, stock in listed.items():
        assert (stock == "none") == (mtype in REFUSED), (mtype, stock)
