# Two entry points: `make demo` and `make test`. Both create .venv on first use (idempotent).
PYTHON ?= python3
TORCH_VERSION ?= 2.13.0
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ropekit-installed

.PHONY: demo test bench bench-quick setup clean experiments

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned (override with TORCH_VERSION=...), so the package install finds it satisfied
	$(PY) -m pip install -q "torch==$(TORCH_VERSION)"
	$(PY) -m pip install -q -e ".[test,bench]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/ropekit report --out report/

test: $(STAMP)
	$(PY) -m pytest tests

# quick preset of every experiment (3 seeds each; sized for <= 7 min per experiment on 2 CPU cores), then the report
experiments: $(STAMP)
	$(VENV)/bin/ropekit experiment crossmodal --preset quick --out experiments/
	$(VENV)/bin/ropekit experiment video --preset quick --out experiments/
	$(VENV)/bin/ropekit report --out report/ --experiments experiments/

bench: $(STAMP)
	$(PY) -m benchmarks.run

bench-quick: $(STAMP)
	$(PY) -m benchmarks.run --quick

clean:
	rm -rf $(VENV) report
