"""The project's docs stand alone: no citations of files users do not have, and every link resolves."""
import re
from pathlib import Path

import ropekit

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


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
