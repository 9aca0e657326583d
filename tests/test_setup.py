"""The set-up a new user runs: which torch build `make` installs, and what each target installs."""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _recipe(target: str, *variables: str) -> str:
    """The commands `make TARGET` would run from scratch (dry run: nothing is installed)."""
    done = subprocess.run(["make", "-n", "-B", "-C", str(ROOT), target, *variables],
                          capture_output=True, text=True, check=True)
    return re.sub(r" +", " ", done.stdout)  # an empty variable leaves two spaces: count them as one


def test_demo_installs_only_the_package():
    recipe = _recipe("demo")
    assert "pip install -q -e ." in recipe and "ropekit report" in recipe
    assert ".[" not in recipe  # no extras: the test extra's triton alone is about 1 GB


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
