"""The README's and the docs' examples run as written and show what they print.

Python blocks run in one namespace per file, as in a notebook (the README's Hugging Face block builds a
tiny random model from a config, so it runs offline too). A line ending in ``# → VALUE`` must evaluate to
exactly that repr. The command-line lines must parse with the real parser.
"""
import ast
import re
import shlex
from pathlib import Path

import pytest

from ropekit.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def _blocks(path: Path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", path.read_text(), flags=re.S)


def _run(path: Path) -> dict[str, object]:
    """Run the file's Python blocks statement by statement; the value of each expression line by its text."""
    namespace: dict = {}
    shown = {}
    for block in _blocks(path, "python"):
        lines = block.splitlines()
        for node in ast.parse(block).body:
            if isinstance(node, ast.Expr):
                shown[lines[node.lineno - 1]] = eval(compile(ast.Expression(node.value), str(path), "eval"), namespace)
            else:
                exec(compile(ast.Module([node], type_ignores=[]), str(path), "exec"), namespace)
    return shown


def test_readme_examples_run_and_show_their_values():
    shown = _run(README)
    claims = {line: line.split("# →")[1].split(":")[0].strip() for line in shown if "# →" in line}
    assert claims, "the README shows at least one value"
    assert any("layer_designs(model)" in line for line in claims), "the Hugging Face block ran"
    for line, value in claims.items():
        assert repr(shown[line]) == value, line


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
    shown = _run(ROOT / "docs" / "relative.md")
    by_comment = {line.split("#")[1].strip(): value for line, value in shown.items() if "#" in line}
    assert by_comment["≈ 18: not relative"] == pytest.approx(18, rel=0.25)
    assert by_comment["≈ 1e-5: float32 rounding"] < 1e-4
    rows = by_comment["one row per family"]
    assert all(r["exact"] == r["expected_exact"] for r in rows)
