# Two entry points: `make demo` and `make test`. Both create .venv on first use and are idempotent.
#
# Which PyTorch build gets installed is explicit: pip installs TORCH_SPEC from TORCH_INDEX_URL
# (empty: pip's configured index; on Linux, PyPI's torch is the CUDA build, several GB).
#   CPU wheels (laptop, CI):   make test TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
#   CUDA 12.4 wheels (GPU):    make test TORCH_INDEX_URL=https://download.pytorch.org/whl/cu124
#   another release:           make test TORCH_VERSION=2.12.0   (or TORCH_SPEC='torch>=2.5')
# torch goes in first, so installing ropekit finds it satisfied and never swaps it for another build.
# To switch builds in an existing .venv, `make clean` first.
PYTHON ?= python3
TORCH_VERSION ?= 2.13.0
TORCH_SPEC ?= torch==$(TORCH_VERSION)
TORCH_INDEX_URL ?=
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q
# one stamp per install step: demo needs only the package; test and bench add their extras
BASE_STAMP := $(VENV)/.ropekit-base
TEST_STAMP := $(VENV)/.ropekit-test
BENCH_STAMP := $(VENV)/.ropekit-bench

.PHONY: demo test bench bench-quick setup clean experiments experiments-standard

$(BASE_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) $(if $(strip $(TORCH_INDEX_URL)),--index-url $(strip $(TORCH_INDEX_URL)) )"$(TORCH_SPEC)"
	$(PIP) -e .
	touch $@

$(TEST_STAMP): $(BASE_STAMP) pyproject.toml
	$(PIP) -e ".[test]"
	touch $@

$(BENCH_STAMP): $(BASE_STAMP) pyproject.toml
	$(PIP) -e ".[bench]"
	touch $@

setup: $(BASE_STAMP)

demo: $(BASE_STAMP)
	$(VENV)/bin/ropekit report --out report/

test: $(TEST_STAMP)
	$(PY) -m pytest tests

# quick preset of every experiment (3 seeds each; a few-minute look per experiment on 2 CPU cores, not sized to
# decide the claims), then the report
experiments: $(BASE_STAMP)
	$(VENV)/bin/ropekit experiment crossmodal --preset quick --out experiments/
	$(VENV)/bin/ropekit experiment video --preset quick --out experiments/
	$(VENV)/bin/ropekit experiment resolution --preset quick --threads 1 --out experiments/
	$(VENV)/bin/ropekit experiment isotropy --preset quick --threads 1 --out experiments/
	$(VENV)/bin/ropekit experiment shape-bias --preset quick --threads 1 --out experiments/
	$(VENV)/bin/ropekit report --out report/ --experiments experiments/

# standard preset of every experiment with its replication (seeds and evaluation sizes from the measured variance
# budget in docs/experiments.md; about an hour per experiment and as much again for the replication, on 2 CPU
# cores; resumable: rerun to continue), then the report
experiments-standard: $(BASE_STAMP)
	for name in crossmodal video resolution isotropy shape-bias pointcloud; do \
	  $(VENV)/bin/ropekit experiment $$name --preset standard --threads 1 --replicate --out experiments-standard/ || exit 1; \
	done
	$(VENV)/bin/ropekit report --out report/ --experiments experiments-standard/

bench: $(BENCH_STAMP)
	$(PY) -m benchmarks.run

bench-quick: $(BENCH_STAMP)
	$(PY) -m benchmarks.run --quick

clean:
	rm -rf $(VENV) report
