"""The four stages import downwards only: layout <- designs <- rotations <- apply <- rope, nn, analysis <- hf;
the lab (experiments, report, the figures) sits on top of the core and the core never imports it.

Read from the source (every ``import`` statement, including those inside functions): a design module never
imports the batched index or anything above the designs, and the designs' shared helpers (``_common``) never
import the registry that builds on them; every core module imports only its own layer or lower ones, and of
other packages only torch and numpy (transformers and triton inside the functions that need them, in hf, serve
and apply's Triton kernel; vllm in serve.vllm's). A lazy import inside a function still ties the two modules in a
circle, so it counts.
The last tests import the core in a fresh interpreter where matplotlib cannot be imported.
"""
import ast
import os
import subprocess
import sys
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


# The core, lowest layer first: a core module imports only modules of its own rank or below. ``_extras`` and
# ``_terminal`` are small helpers with no ropekit imports.
CORE_RANKS = {"_extras": 0, "_terminal": 0, "layout": 0, "designs": 1, "rotations": 2, "age": 2, "block_cache": 2,
              "apply": 3, "index": 3, "request_index": 3, "rope": 4, "nn": 5, "analysis": 6, "hf": 7, "serve": 8}
# The lab: training experiments, the report and everything that draws (matplotlib, the report extra).
LAB = {"experiments", "report", "viz", "analysis.figures", "analysis.nd_figures"}
# The front door: the package's own namespace and the command line, which reach both (the CLI lazily).
FRONT = {"__init__", "__main__", "cli"}
# Packages a core module may import besides the standard library, and where. Optional ones only inside a function
# (``_extras`` imports matplotlib to say which extra installs it when it is missing).
CORE_PACKAGES = {"torch", "numpy"}
OPTIONAL = {"transformers": ("hf", "serve"), "triton": ("apply.triton_rope",), "matplotlib": ("_extras",),
            "lmms_eval": ("hf.lmms_backend",), "accelerate": ("hf.lmms_backend",), "vllm": ("serve.vllm",)}


def _name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def _is_lab(module: str) -> bool:
    return module.split(".")[0] in LAB or any(module == m or module.startswith(m + ".") for m in LAB)


def _kind(module: str) -> str:
    if module in FRONT:
        return "front"
    return "lab" if _is_lab(module) else "core"


def _rank(module: str) -> int:
    return CORE_RANKS[module.split(".")[0]]


def _modules() -> dict[str, Path]:
    return {_name(path): path for path in sorted(SRC.rglob("*.py"))}


def _packages(source: str) -> dict[str, bool]:
    """Every other package (top-level name) the source imports: ``{name: imported when the module is}``."""
    found: dict[str, bool] = {}

    def visit(node, at_import: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, False)
                continue
            names = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom) and not child.level and child.module:
                names = [child.module]
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("ropekit", "__future__"):
                    found[top] = found.get(top, False) or at_import
            visit(child, at_import)

    visit(ast.parse(source), True)
    return found


def test_every_module_is_core_lab_or_front_and_every_core_layer_is_ranked():
    for module in _modules():
        kind = _kind(module)
        if kind == "core":
            assert module.split(".")[0] in CORE_RANKS, f"{module}: neither core (ranked), lab nor front"


def test_core_imports_only_its_own_layer_or_lower_and_never_the_lab():
    for module, path in _modules().items():
        if _kind(module) != "core":
            continue
        for imported in _imports(path):
            if imported == "__version__" or imported.startswith("__version__"):
                continue  # ``from .. import __version__``: the package's version string
            assert not _is_lab(imported), f"core module {module} imports the lab's {imported}"
            assert imported.split(".")[0] in CORE_RANKS, f"core module {module} imports {imported}"
            assert _rank(imported) <= _rank(module), (
                f"{module} (layer {_rank(module)}) imports {imported} (layer {_rank(imported)}), a layer above it")


def test_rotations_never_import_apply():
    """The rotations compute frequencies and rotations; applying them to q and k is the layer above
    (RoPE-Mixed's rotary object lives in apply/mixed.py, as GeoPE's does in apply/geope.py)."""
    for path in sorted((SRC / "rotations").glob("*.py")):
        above = {m for m in _imports(path) if m.split(".")[0] in {"apply", "index", "rope", "nn", "analysis", "hf"}}
        assert not above, f"rotations/{path.name} imports {sorted(above)}"


def test_core_imports_only_torch_and_numpy():
    for module, path in _modules().items():
        if _kind(module) != "core":
            continue
        for package, at_import in _packages(path.read_text()).items():
            if package in CORE_PACKAGES:
                continue
            where = OPTIONAL.get(package)
            assert where is not None, f"core module {module} imports {package}: only torch and numpy are core"
            assert any(module == w or module.startswith(w + ".") for w in where), f"{module} imports {package}"
            assert not at_import, f"{module} imports {package} when it is imported: move it into the function"


def test_matplotlib_is_imported_by_the_lab_only():
    for module, path in _modules().items():
        if "matplotlib" in _packages(path.read_text()):
            assert _kind(module) == "lab" or module in OPTIONAL["matplotlib"], f"{module} imports matplotlib"


def test_the_package_reader_tells_module_from_function_imports():
    source = "import torch\nimport numpy as np\nclass A:\n    import matplotlib\ndef f():\n    import transformers\n"
    assert _packages(source) == {"torch": True, "numpy": True, "matplotlib": True, "transformers": False}


# in a fresh interpreter: matplotlib (and the other optional packages) cannot be imported
_WITHOUT_EXTRAS = """
import sys
for name in ("matplotlib", "transformers", "triton", "vllm"):
    sys.modules[name] = None  # `import name` raises ImportError
"""


def _run(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC.parent), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", _WITHOUT_EXTRAS + code], capture_output=True, text=True, env=env,
                          timeout=300)


def test_the_core_imports_and_runs_with_torch_and_numpy_alone():
    core = sorted(m for m in _modules() if _kind(m) == "core") + ["cli"]
    done = _run(f"""
import importlib
import torch
import ropekit
for module in {core!r}:
    importlib.import_module("ropekit." + module)
q, k = ropekit.RoPE("circle", head_dim=16).rotate(torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, 16), "T1 I2x2")
assert ropekit.MixedFrequencies(16, num_heads=2, seed=0).rotate(q, k, "G1x5")[0].shape == q.shape
ropekit.layout_ptd("I3x3 T5", "circle")
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("matplotlib", "transformers", "triton", "vllm")
                and sys.modules[m] is not None)
print("loaded:", loaded)
""")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "loaded: []" in done.stdout


def test_plotting_without_matplotlib_names_the_report_extra():
    done = _run("""
import importlib
for module in ("ropekit.analysis.figures", "ropekit.analysis.nd_figures", "ropekit.viz", "ropekit.report",
               "ropekit.report.experiments"):
    try:
        importlib.import_module(module)
    except ImportError as error:
        assert type(error).__name__ == "MissingExtraError", (module, error)
        assert "pip install 'ropekit[report]'" in str(error), (module, error)
        print("refused:", module)
    else:
        raise AssertionError(module + " imported without matplotlib")
from ropekit.cli import main
status = main(["positions", "T1 I2x2", "--design", "circle", "--plot", "never.png"])
print("status:", status)
""")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("refused:") == 5
    assert "pip install 'ropekit[report]'" in done.stderr and "status: 0" not in done.stdout  # the CLI says so too
