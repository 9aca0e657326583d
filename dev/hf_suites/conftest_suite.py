"""conftest.py for transformers' own model suites, installed by dev/hf_suites/run.py at the root of its scratch
folder (next to the extracted ``tests/``). Not part of ropekit's test suite.

It stands in for transformers' repository conftest (markers, offline hub, no safetensors conversion) and does
two things of its own:

- with ``ROPEKIT_HF_SUITES_PATCH=1``, every model a test constructs is patched stock-equivalently right after its
  ``post_init``: the outermost model under construction (models built inside another model's ``__init__`` are
  left to it) when it is a ``...ForConditionalGeneration`` or a bare ``...Model`` of a model type in
  ``ropekit.hf.supported_models()``; otherwise the outermost such models inside it (the thinker of a full
  Qwen-Omni model, the bare model inside Gemma 3's sequence classifier). Everything else is left stock. An error
  raised by ``patch_model`` itself is not caught: the test fails with it, as a user's patch would.
- with ``ROPEKIT_HF_SUITES_RESULTS=<file>``, one JSON line per test: node id, outcome, the first line of the
  error, the exception type, and the classes the patch was applied to (and skipped) while the test ran.
"""
from __future__ import annotations

import json
import os
import sys
import warnings

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("DISABLE_SAFETENSORS_CONVERSION", "true")
warnings.simplefilter(action="ignore", category=FutureWarning)

# transformers' test_pipeline_mixin imports the library from <repo>/src/transformers (run.py links it there)
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), "src"))

PATCH = os.environ.get("ROPEKIT_HF_SUITES_PATCH") == "1"
RESULTS = os.environ.get("ROPEKIT_HF_SUITES_RESULTS")
DESIGN = os.environ.get("ROPEKIT_HF_SUITES_DESIGN")  # patch with this design instead of the stock-equivalent one

# what the current test's models got: class names patched / skipped (with why)
_seen: dict[str, set] = {"patched": set(), "skipped": set()}


def stock_equivalent(model_type: str) -> tuple[str, dict]:
    """(design, design options) of the patch that reproduces the stock model of ``model_type`` (docs/hf.md,
    "stock-equivalent"), as the family's adapter states it: ``vanilla`` on the 1-D families, ``tmrope`` on the Omni
    thinkers (``exact`` temporal rounding on Qwen3-Omni), ``mrope`` with the spatial continuation on every other
    3-axis family."""
    from ropekit.hf.adapters import ADAPTERS

    return ADAPTERS[model_type].stock_design()


def _eligible(module) -> bool:
    import ropekit

    name = type(module).__name__
    mtype = getattr(getattr(module, "config", None), "model_type", None)
    shape_ok = name.endswith("ForConditionalGeneration") or (name.endswith("Model") and not name.endswith("PreTrainedModel"))
    return shape_ok and mtype in ropekit.hf.supported_models()


def _patch_tree(model) -> None:
    """Patch ``model`` if eligible, else the outermost eligible models inside it."""
    import ropekit

    if _eligible(model):
        design, opts = stock_equivalent(model.config.model_type)
        if DESIGN:  # another design on purpose (run.py --design): what the suites make of it, not a comparison
            design, opts = DESIGN, {}
        ropekit.patch_model(model, design, **opts)  # errors propagate: the test fails with the patch's refusal
        _seen["patched"].add(type(model).__name__)
        return
    _seen["skipped"].add(type(model).__name__)
    for child in model.children():
        _patch_children(child)


def _patch_children(module) -> None:
    from transformers import PreTrainedModel

    if isinstance(module, PreTrainedModel):
        if _eligible(module):
            _patch_tree(module)
            return
    for child in module.children():
        _patch_children(child)


def _under_construction_elsewhere(model) -> bool:
    """Whether ``model`` is being built inside another PreTrainedModel's ``__init__`` (a submodule)."""
    from transformers import PreTrainedModel

    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "__init__":
            owner = frame.f_locals.get("self")
            if owner is not model and isinstance(owner, PreTrainedModel):
                return True
        frame = frame.f_back
    return False


def _install_patch_hook() -> None:
    from transformers import PreTrainedModel

    stock_post_init = PreTrainedModel.post_init

    def post_init(self, *args, **kwargs):
        out = stock_post_init(self, *args, **kwargs)
        if not _under_construction_elsewhere(self):
            _patch_tree(self)
        return out

    PreTrainedModel.post_init = post_init


def _testing_utils_constants() -> None:
    """Give transformers.testing_utils the plain constants (literals) of the mirror's testing_utils.py that the
    installed release lacks: the mirror's test helpers (vlm_tester.py, causal_lm_tester.py) can be newer than
    the library and import them (``_TEXT_MODEL_TESTER_DEFAULTS``)."""
    import ast

    import transformers.testing_utils as tu

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mirror_testing_utils.py")
    if not os.path.exists(path):
        return
    added = []
    for node in ast.parse(open(path, encoding="utf-8").read()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if hasattr(tu, name):
                continue
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                continue
            setattr(tu, name, value)
            added.append(name)
    if added and RESULTS:  # pytest captures stdout from here on: run.py reads the names from this file
        with open(RESULTS + ".shims", "w", encoding="utf-8") as f:
            f.write(" ".join(added) + "\n")


_testing_utils_constants()


def _stub_missing_modules() -> None:
    """An empty module for what a suite imports at its top only for its slow integration tests (librosa, in the
    Omni suites; run.py names them in ROPEKIT_HF_SUITES_STUBS for those suites alone), where the .venv lacks it:
    those tests are skipped here, and the name, used, fails them."""
    import importlib.util
    import types

    wanted = [n for n in os.environ.get("ROPEKIT_HF_SUITES_STUBS", "").split(",") if n]
    stubbed = [name for name in wanted if importlib.util.find_spec(name) is None]
    for name in stubbed:
        module = types.ModuleType(name)

        def missing(attr, _name=name):  # AttributeError, as for any module: tools that scan sys.modules expect it
            raise AttributeError(f"{_name} is a stub in transformers' suites under ropekit's dev/hf_suites ({attr})")

        module.__getattr__ = missing
        sys.modules[name] = module
    if stubbed and RESULTS:
        with open(RESULTS + ".shims", "a", encoding="utf-8") as f:
            f.write(" ".join(f"{n}(stub)" for n in stubbed) + "\n")


_stub_missing_modules()


def pytest_configure(config):
    for marker in ("slow", "is_pipeline_test", "is_staging_test", "accelerate_tests", "not_device_test",
                   "torch_compile_test", "torch_export_test", "onnx_export_test", "flash_attn_test",
                   "flash_attn_3_test", "flash_attn_4_test", "all_flash_attn_test", "training_ci",
                   "tensor_parallel_ci", "fsdp_ci", "generate", "timeout", "expert_parallel_ci"):
        config.addinivalue_line("markers", f"{marker}: transformers' marker")
    if PATCH:
        _install_patch_hook()


def pytest_addoption(parser):
    from transformers.testing_utils import pytest_addoption_shared

    pytest_addoption_shared(parser)


def pytest_runtest_setup(item):
    _seen["patched"].clear()
    _seen["skipped"].clear()


_outcomes: dict[str, dict] = {}


def _first_line(report) -> tuple[str, str]:
    if isinstance(report.longrepr, tuple):  # a skip: (file, line, reason)
        return str(report.longrepr[-1])[:400], ""
    crash = getattr(report.longrepr, "reprcrash", None)
    message = crash.message if crash is not None else str(report.longrepr)
    line = next((ln for ln in message.splitlines() if ln.strip()), "")
    kind = line.split(":", 1)[0] if ":" in line else ""
    return line[:400], kind


def pytest_runtest_logreport(report):
    if not RESULTS:
        return
    rec = _outcomes.setdefault(report.nodeid, {"id": report.nodeid, "outcome": "passed", "error": "", "kind": ""})
    if report.failed:
        if rec["outcome"] != "failed":  # the first failing phase (setup, call, teardown) names the cause
            rec["outcome"] = "failed"
            rec["error"], rec["kind"] = _first_line(report)
            rec["phase"] = report.when
            context = getattr(report, "context", None)  # a failing subtest: which one
            if context is not None:
                rec["subtest"] = " ".join([context.msg or ""] + [f"{k}={v}" for k, v in context.kwargs.items()]).strip()
    elif report.skipped and rec["outcome"] == "passed":
        rec["outcome"] = "skipped"
        rec["error"] = _first_line(report)[0]
    if report.when == "teardown":
        rec["patched"] = sorted(_seen["patched"])
        rec["unpatched"] = sorted(_seen["skipped"])
        with open(RESULTS, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
        _outcomes.pop(report.nodeid, None)
