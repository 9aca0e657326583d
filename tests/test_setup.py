"""The set-up a new user runs: which torch build `make` installs, and what each target installs."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# what a calling make hands its recipes: its flags and command-line variables (MAKEFLAGS, MAKEOVERRIDES), its depth
_MAKE_ENV = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "GNUMAKEFLAGS", "MAKE_TERMOUT", "MAKE_TERMERR")


def _makefile_variables() -> set[str]:
    """The variables the Makefile assigns (``NAME ?= ...``, ``NAME := ...``, ...)."""
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^(?:override\s+|export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*(?:\?|::?|\+|!)?=", text, re.M))


def _clean_env() -> dict[str, str]:
    """This process's environment without what would reach the Makefile from outside: under `make test
    TORCH_VERSION=2.15.0` (the Makefile's documented override) make passes TORCH_VERSION=2.15.0 to this suite
    both in MAKEFLAGS (which a nested make reads as its own command line) and as an environment variable (which
    beats the Makefile's ``?=`` default), so the dry run would show the caller's choice, not the Makefile's."""
    drop = set(_MAKE_ENV) | _makefile_variables()
    return {k: v for k, v in os.environ.items() if k not in drop}


def _recipe(target: str, *variables: str) -> str:
    """The commands `make TARGET` would run from scratch (dry run: nothing is installed), with only
    ``variables`` set from outside (whatever make or shell this suite runs under)."""
    done = subprocess.run(["make", "-n", "-B", "-C", str(ROOT), target, *variables],
                          capture_output=True, text=True, check=True, env=_clean_env())
    return re.sub(r" +", " ", done.stdout)  # an empty variable leaves two spaces: count them as one


def test_demo_installs_the_package_and_its_report_extra_only():
    recipe = _recipe("demo")
    assert "pip install -q -e ." in recipe and "ropekit report" in recipe
    # the report draws with matplotlib (the report extra); no other extra: the test extra's triton alone is ~1 GB
    assert re.findall(r"\.\[[^]]*\]", recipe) == [".[report]"]
    for target in ("experiments", "experiments-standard"):  # they end in `ropekit report`
        assert 'pip install -q -e ".[report]"' in _recipe(target)


def test_matplotlib_is_an_extra_not_a_core_dependency():
    """The core needs torch and numpy only (tests/test_architecture.py); the report extra brings matplotlib, and
    the test and bench extras include it so the suite and the benchmarks' figures run."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert sorted(req.split(">")[0] for req in project["dependencies"]) == ["numpy", "torch"]
    extras = project["optional-dependencies"]
    for extra in ("report", "test", "bench"):
        assert any(req.startswith("matplotlib>=") for req in extras[extra]), extra


def test_test_and_bench_add_their_extras():
    assert 'pip install -q -e ".[test]"' in _recipe("test")
    assert 'pip install -q -e ".[bench]"' in _recipe("bench")


def test_torch_build_is_an_explicit_overridable_choice():
    default = _recipe("setup")
    assert 'pip install -q "torch==2.13.0"' in default and "--index-url" not in default
    cpu = _recipe("setup", "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu")
    assert 'pip install -q --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0"' in cpu
    assert '"torch==2.12.0"' in _recipe("setup", "TORCH_VERSION=2.12.0")
    assert '"torch>=2.5"' in _recipe("setup", "TORCH_SPEC=torch>=2.5")


def test_recipes_are_read_the_same_under_a_make_with_its_own_overrides(tmp_path):
    """`make test TORCH_VERSION=2.15.0` runs this suite with TORCH_VERSION=2.15.0 in MAKEFLAGS and in the
    environment; the dry runs above still see the Makefile's own defaults. Checked under a real make that
    overrides every torch variable, with its jobserver flags too."""
    outer = tmp_path / "outer.mk"
    call = ("import sys; sys.path.insert(0, sys.argv[1]); import test_setup as t; "
            "t.test_torch_build_is_an_explicit_overridable_choice(); print('same recipes')")
    outer.write_text(f"check:\n\t{sys.executable} -c \"{call}\" {ROOT / 'tests'}\n")
    done = subprocess.run(["make", "-j2", "-f", str(outer), "check", "TORCH_VERSION=2.15.0",
                           "TORCH_SPEC=torch==2.15.0", "TORCH_INDEX_URL=https://example.invalid/whl", "PYTHON=nope"],
                          capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "TORCH_VERSION": "2.0.0"})
    assert done.returncode == 0 and "same recipes" in done.stdout, done.stdout + done.stderr
    assert {"TORCH_VERSION", "TORCH_SPEC", "TORCH_INDEX_URL", "PYTHON"} <= _makefile_variables()


def test_hypothesis_is_a_test_dependency():
    # the test extra is one line of pyproject.toml (read as text: tomllib exists only from Python 3.11)
    line = next(ln for ln in (ROOT / "pyproject.toml").read_text().splitlines() if ln.startswith("test = ["))
    assert re.search(r'"hypothesis(>=[\d.]+)?"', line)


def test_property_tests_draw_the_same_examples_on_every_run_by_default():
    """The suite's default hypothesis profile is derandomized (no flaky CI); HYPOTHESIS_PROFILE=dev explores."""
    import os

    from hypothesis import given, settings
    from hypothesis import strategies as st

    def draws(profile):
        seen = []

        @settings(settings.get_profile(profile), max_examples=30)
        @given(st.integers(-10**9, 10**9))
        def record(x):
            seen.append(x)

        record()
        return seen

    assert draws("ci") == draws("ci")
    assert draws("dev") != draws("dev")  # 30 draws from 2·10^9 values: equal only by a bug
    if "HYPOTHESIS_PROFILE" not in os.environ:
        assert settings.default.derandomize and settings.default.deadline is None and settings.default.print_blob


# ---- the lock: what the suite runs with, and the transformers range it was tested over ----

LOCK = ROOT / "requirements" / "lock.txt"
LOCK_FLOOR = ROOT / "requirements" / "lock-floor.txt"


def _pins(lock: Path) -> dict[str, str]:
    """{canonical name: version} of a lock file; every line that is not a comment pins one release."""
    pins = {}
    for line in lock.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and re.fullmatch(r"[\w.!+]+", version), f"{lock.name}: not an exact pin: {line!r}"
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def _pip_lines(recipe: str) -> list[str]:
    return [ln for ln in recipe.splitlines() if "pip install" in ln]


def test_transformers_floor_is_the_oldest_release_the_hooks_were_tested_with():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later

    from ropekit.hf.boundary import TESTED_TRANSFORMERS

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in ("hf", "test", "bench"):
        floors = [re.fullmatch(r"transformers>=([\d.]+)", req) for req in extras[extra] if req.startswith("transformers")]
        assert len(floors) == 1 and floors[0], f"the {extra} extra names transformers once, as transformers>=FLOOR"
        assert floors[0][1] == TESTED_TRANSFORMERS[0], f"the {extra} extra's transformers floor is not the tested one"
    assert any(req.startswith("accelerate>=") for req in extras["hf"])  # examples/finetune_vlm.py --trainer hf


def test_locked_transformers_lie_in_the_tested_range():
    from packaging.version import Version

    from ropekit.hf.boundary import TESTED_TRANSFORMERS

    low, high = map(Version, TESTED_TRANSFORMERS)
    locked = Version(_pins(LOCK)["transformers"])
    assert low <= locked <= high, (f"requirements/lock.txt has transformers {locked}, outside the range the hooks "
                                   f"were tested over {TESTED_TRANSFORMERS}: test it, then update the range")
    assert Version(_pins(LOCK_FLOOR)["transformers"]) == low  # make test-compat's floor environment


def test_the_docs_state_the_tested_transformers_range():
    from ropekit.hf.boundary import TESTED_TRANSFORMERS

    low, high = TESTED_TRANSFORMERS
    assert f"Supported transformers: {low} to {high}" in (ROOT / "README.md").read_text()
    assert f"Tested releases: transformers {low} (the oldest" in (ROOT / "docs" / "hf.md").read_text()
    assert f"to {high}." in (ROOT / "docs" / "hf.md").read_text()


def test_locks_leave_torch_and_ropekit_to_the_makefile():
    for lock in (LOCK, LOCK_FLOOR):
        pins = _pins(lock)
        assert "torch" not in pins and "ropekit" not in pins and "pip" not in pins, lock.name
        assert not [name for name in pins if name.startswith("nvidia-")], lock.name  # a CUDA torch's own pins
    for package in ("accelerate", "hypothesis", "numpy", "matplotlib", "pytest", "rotary-embedding-torch",
                    "huggingface-hub", "tokenizers", "safetensors"):
        assert package in _pins(LOCK), f"requirements/lock.txt does not pin {package}"


def test_every_target_installs_through_the_lock_except_torch():
    for target in ("demo", "test", "bench", "bench-quick", "experiments", "setup"):
        recipe = _recipe(target, "TORCH_VERSION=2.12.0")
        assert "requirements/lockfile.py constraints requirements/lock.txt > .venv/constraints.txt" in recipe
        for line in _pip_lines(recipe):
            if "--upgrade pip" in line or '"torch==2.12.0"' in line:
                assert " -c " not in line, line  # the torch build named by TORCH_* is never fought by the lock
            else:
                assert line.endswith(" -c .venv/constraints.txt"), line


def test_compat_environments_and_lock_recipes():
    floor = _recipe(".venv-compat/floor/.ropekit-compat")
    assert "constraints requirements/lock-floor.txt > .venv-compat/floor/constraints.txt" in floor
    assert _pip_lines(floor)[-1].endswith("-c .venv-compat/floor/constraints.txt")
    newest = _recipe("compat-newest", "NEWEST=99.1.0")
    assert '--relax "transformers==99.1.0"' in newest and '"transformers==99.1.0"' in _pip_lines(newest)[-1]
    assert "pytest -x tests/test_hf.py " in newest
    lock = _recipe("lock")
    assert "> requirements/lock.txt.new" in lock and "> requirements/lock-floor.txt.new" in lock
    assert ' -c ' not in lock  # the lock is written from the newest releases, not from itself
    assert ".venv-compat" in _recipe("clean") and ".venv-lock" in _recipe("clean")


def test_the_stated_torch_range_starts_at_the_torch_the_suite_is_locked_with():
    """docs/development.md states the supported torch range; its floor is pyproject's, the Makefile's default and
    the one the lock was written with (the oldest torch the suite runs with is the oldest it claims)."""
    from packaging.version import Version

    stated = re.search(r"\*\*Supported torch: ([\d.]+) and newer\*\*", (ROOT / "docs" / "development.md").read_text())
    assert stated, "docs/development.md states the supported torch range"
    low = Version(stated.group(1))
    floor = re.search(r'"torch>=([\d.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    default = re.search(r"^TORCH_VERSION \?= ([\d.]+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    locked_with = re.search(r"torch ([\d.]+)(?:\+\w+)?, ", LOCK.read_text()).group(1)
    assert low == Version(floor) and Version(default).release[:2] == low.release[:2] == Version(locked_with).release[:2]
