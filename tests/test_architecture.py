"""The four stages import downwards only: layout <- designs <- index / rotations / apply <- hf, experiments.

Read from the source (every ``import`` statement, including those inside functions): a design module never
imports the batched index or anything above the designs, and the designs' shared helpers (``_common``) never
import the registry that builds on them. A lazy import inside a function still ties the two modules in a
circle, so it counts.
"""
import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "ropekit"
ABOVE_DESIGNS = {"index", "block_cache", "rope", "hf", "experiments", "report", "cli", "nn", "analysis"}


def _imports(path: Path) -> set[str]:
    """Every ropekit module ``path`` imports, as a dotted name relative to the package (``designs.registry``)."""
    return _imports_of(path.read_text(), path.relative_to(SRC).with_suffix("").parts[:-1])


def _imports_of(source: str, package: tuple) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[:len(package) - node.level + 1])
                mod = base + (node.module.split(".") if node.module else [])
                names = [".".join(mod + [a.name]) for a in node.names] if not node.module else [".".join(mod)]
                out.update(names)
            elif node.module and node.module.startswith("ropekit."):
                out.add(node.module[len("ropekit."):])
        elif isinstance(node, ast.Import):
            out.update(a.name[len("ropekit."):] for a in node.names if a.name.startswith("ropekit."))
    return out


def test_designs_never_import_what_is_built_on_them():
    for path in sorted((SRC / "designs").glob("*.py")):
        above = {m for m in _imports(path) if m.split(".")[0] in ABOVE_DESIGNS}
        assert not above, f"designs/{path.name} imports {sorted(above)}, which import the designs"


def test_design_helpers_do_not_import_the_registry():
    assert not {m for m in _imports(SRC / "designs" / "_common.py") if m.startswith("designs.")}


def test_the_checker_sees_lazy_and_relative_imports():
    """The reader finds an import inside a function body (the form the old circles took) and resolves
    relative imports of either depth."""
    source = "import torch\nfrom . import registry\nfrom ._common import x\ndef f():\n    from ..index import rope_index\n"
    assert _imports_of(source, ("designs",)) == {"designs.registry", "designs._common", "index"}
