"""The project's docs stand alone: no citations of files users do not have, every link resolves, and every
Python block runs as written.

A Python block runs alone in a fresh interpreter, or says in its first line that it continues the previous
block and runs after it (tests/doc_blocks.py runs them: offline, each chain in its own process and folder).
A block that must load a pretrained checkpoint from the hub is fenced ```` ```python no-run twin=NAME ````:
such blocks are few, and each names a runnable block (``id=NAME``) that makes the same calls on a tiny model.
"""
import ast
import re
from pathlib import Path

import pytest

import doc_blocks
import ropekit

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MAX_NO_RUN = 3


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", page.read_text(), flags=re.M)}


def test_no_page_cites_the_internal_spec():
    for page in PAGES:
        cited = re.findall(r"\bSPEC\b[^\n]{0,20}", page.read_text())
        assert not cited, f"{page.name} cites {cited}: state the convention or link docs/conventions.md"


def test_every_markdown_link_resolves():
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            assert dest.exists(), f"{page.name}: link to missing {target}"
            if anchor:
                assert anchor in _anchors(dest), f"{page.name}: no heading for #{anchor} in {dest.name}"


def test_conventions_state_the_rule_of_every_design():
    text = (ROOT / "docs" / "conventions.md").read_text()
    table = text.split("## Position designs", 1)[1].split("\n## ", 1)[0]
    for name in ropekit.designs():
        assert f"| `{name}`" in table, f"docs/conventions.md has no row for design {name!r}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_python_block_runs_alone_or_after_the_block_it_continues(page):
    results = doc_blocks.run_all()
    for chain in doc_blocks.chains(page):
        result = results[chain[0].where]
        assert result["ok"], (f"{chain[0].where} (with the {len(chain) - 1} blocks continuing it) failed in a fresh "
                              f"interpreter:\n{result['error']}\n{result['output'][-3000:]}")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_shown_value_is_what_the_line_gives(page):
    """A line ending in ``# → VALUE`` (or ``# → VALUE: why``) evaluates to exactly that repr."""
    results = doc_blocks.run_all()
    for chain in doc_blocks.chains(page):
        result = results[chain[0].where]
        assert result["ok"], chain[0].where
        for line, (_, shown) in result["shown"].items():
            if "# →" in line:
                claim = line.split("# →", 1)[1].split(":")[0].strip()
                assert shown == claim, f"{chain[0].where}: {line.strip()} gives {shown}"
    written = sum("# →" in ln for b in doc_blocks.python_blocks(page) if not b.no_run for ln in b.source.splitlines())
    seen = sum("# →" in ln for chain in doc_blocks.chains(page) for ln in results[chain[0].where]["shown"])
    assert seen == written, f"{page.name}: a `# →` claim on a line that is not a top-level expression"


def test_python_fences_use_known_words_and_parse():
    ids = {}
    for page in PAGES:
        for block in doc_blocks.python_blocks(page):
            unknown = [w for w in block.words if not doc_blocks.WORDS.fullmatch(w)]
            assert not unknown, f"{block.where}: unknown fence words {unknown} (no-run, twin=NAME, id=NAME)"
            assert not block.no_run or block.word("twin"), f"{block.where}: a no-run block names its twin=NAME"
            assert block.no_run or not block.word("twin"), f"{block.where}: twin= belongs to no-run blocks"
            ast.parse(block.source, block.where)  # no-run blocks too
            if block.word("id"):
                assert block.word("id") not in ids, f"{block.where}: id={block.word('id')} is taken"
                ids[block.word("id")] = block
        doc_blocks.chains(page)  # a continuing block follows a runnable one


def _ropekit_calls(source: str) -> set:
    """ropekit's calls in ``source`` with their literal arguments (the model argument aside)."""
    out = set()
    for call in doc_blocks.calls(source):
        if doc_blocks.callee(call) in ropekit.__all__ or doc_blocks.callee(call) in ropekit.hf.__all__:
            args = tuple(ast.unparse(a) for a in call.args[1:] if isinstance(a, ast.Constant))
            kwargs = tuple(sorted((k.arg, ast.unparse(k.value)) for k in call.keywords if isinstance(k.value, ast.Constant)))
            out.add((doc_blocks.callee(call), args, kwargs))
    return out


def test_no_run_blocks_are_few_and_each_has_a_runnable_twin():
    blocks = [b for page in PAGES for b in doc_blocks.python_blocks(page)]
    no_run = [b for b in blocks if b.no_run]
    assert 1 <= len(no_run) <= MAX_NO_RUN, [b.where for b in no_run]
    named = {b.word("id"): b for b in blocks if b.word("id")}
    results = doc_blocks.run_all()
    for block in no_run:
        lines = (ROOT / block.page).read_text().splitlines()
        around = "\n".join(lines[max(0, block.line - 8):block.line + len(block.source.splitlines()) + 16])
        assert re.search(r"hub|download", around), f"{block.where}: the prose says why the block does not run here"
        twin = named.get(block.word("twin"))
        assert twin is not None and not twin.no_run, f"{block.where}: no runnable block id={block.word('twin')}"
        chain = next(c for p in PAGES for c in doc_blocks.chains(p) if twin in c)
        assert results[chain[0].where]["ok"], f"{twin.where}, the twin of {block.where}, failed"
        twin_source = "".join(b.source for b in chain[:chain.index(twin) + 1])
        missing = {doc_blocks.callee(c) for c in doc_blocks.calls(block.source)} - {
            doc_blocks.callee(c) for c in doc_blocks.calls(twin_source)}
        assert not missing, f"{twin.where} does not call {sorted(missing)}, which {block.where} calls"
        assert _ropekit_calls(block.source) <= _ropekit_calls(twin_source), (
            f"{twin.where} does not make {block.where}'s ropekit calls with the same arguments")


SAMPLE = """
```python
x = 1
```
```python no-run twin=t
y = load_from_hub()
```
```python id=t
# continues the previous block, which defines x
z = x + 1
```
```python
fresh = 2
```
"""


def test_blocks_group_into_chains_by_their_first_line():
    page = ROOT / "sample.md"
    assert [[b.source.split()[0] for b in chain] for chain in doc_blocks.chains(page, "")] == []
    with pytest.raises(ValueError, match="no-run"):
        doc_blocks.chains(page, SAMPLE)  # it continues the no-run block, not the one before it
    fixed = SAMPLE.replace("```python no-run twin=t\ny = load_from_hub()\n```\n", "")
    chains = doc_blocks.chains(page, fixed)
    assert [[b.line for b in chain] for chain in chains] == [[2, 5], [9]]
    assert chains[0][1].word("id") == "t" and chains[0][1].continues
    no_run = doc_blocks.python_blocks(page, SAMPLE)[1]
    assert no_run.no_run and no_run.word("twin") == "t" and not no_run.continues
