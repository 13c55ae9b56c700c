# Two commands on a fresh machine: `make demo` and `make test`.
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed

.PHONY: install native demo test test-cuda-emu test-all test-models bench bench-deps lint clean bazel-build

# matplotlib (the bench plot's test) goes outside site-packages: tests/requirements-plot.txt.
PLOT_LIB := $(VENV)/plot-lib

$(STAMP): pyproject.toml setup.py tests/requirements-plot.txt
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install --quiet --upgrade pip
	$(VPY) -m pip install --quiet -e '.[test]'
	$(VPY) -m pip uninstall --quiet --yes matplotlib  # a venv from before plot-lib
	$(VPY) -m pip install --quiet --no-deps --upgrade --target $(PLOT_LIB) -r tests/requirements-plot.txt
	touch $(STAMP)

# Bytecode of the repo's modules, written once: every test subprocess imports disc_tf,
# and where $$PYTHONDONTWRITEBYTECODE is set no import writes it (each would compile
# the sources again, about 0.3 s of CPU).
install: $(STAMP) native
	$(VPY) -m compileall -q -x '/\.venv' disc_tf bench tests disc_tf_autoload.py > /dev/null

native: $(STAMP)
	$(VPY) -m disc_tf.runtime.native_build

demo: install
	$(VPY) -m disc_tf.demo

# One pytest worker per core (at most 4); a test file stays on one worker, so its
# module fixtures are built once. Workers share the artifact cache and its key.
# A worker that crashes ends the run (its test is named): pytest-xdist's loadfile
# scheduling can hang for good once it replaces a crashed worker.
PYTEST_PARALLEL := -n auto --maxprocesses 4 --dist loadfile --max-worker-restart 0
# pytest caches its assertion-rewritten test modules as bytecode, unless
# $$PYTHONDONTWRITEBYTECODE is set: then every worker of both runs rewrote them
# all again (collection 12 s against 8 s of CPU per worker).
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(VPY) -m pytest

test: install
	$(VPY) -m ruff check .
	$(PYTEST) -q $(PYTEST_PARALLEL)
	$(CUDA_EMU_PYTEST)

# The GPU code path without a GPU: the end-to-end suite and the 50-program
# differential fuzz again, every cluster compiled by the CUDA backend for the
# emulated GPU (strict: no fallback, no refusal). tests/cuda_emu_gaps.txt lists
# what it cannot run yet, as strict xfails.
CUDA_EMU_PYTEST := DISC_TF_TARGET=cuda-emu $(PYTEST) -q $(PYTEST_PARALLEL) tests/e2e \
	  tests/fuzz/test_differential.py
test-cuda-emu: install
	$(CUDA_EMU_PYTEST)

test-all: install
	$(PYTEST) -q $(PYTEST_PARALLEL) -m ''

# Real models (Keras applications, a GRU, Hugging Face BERT and GPT-2): slow.
test-models: install
	$(VPY) -m pip install --quiet -r tests/models/requirements.txt
	$(PYTEST) -q $(PYTEST_PARALLEL) -m slow tests/models

# Bench peers: ONNX Runtime + tf2onnx in their own venv (the plot's matplotlib: plot-lib).
ORT_VENV  := bench/.venv-ort
ORT_STAMP := $(ORT_VENV)/.installed

$(ORT_STAMP): bench/requirements-ort.txt
	$(PY) -m venv $(ORT_VENV)
	$(ORT_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(ORT_VENV)/bin/python -m pip install --quiet -r bench/requirements-ort.txt
	touch $(ORT_STAMP)

bench-deps: $(STAMP) $(ORT_STAMP)
	$(VPY) -m pip install --quiet -r bench/requirements.txt

bench: install bench-deps
	$(VPY) -m bench.run

# The serving library with Bazel, offline, against the venv's TensorFlow
# (docs/serving.md). Outputs: `bazel info -c opt bazel-bin`/cc/.
bazel-build: $(STAMP)
	DISC_TF_PYTHON_BIN=$(abspath $(VPY)) bazel build //cc:disc_tf_ops //cc:libdisc_tf_ops_bazel.so

# The C++ serving host without Python (serving/host, docs/serving.md), built against
# the venv's TensorFlow wheel; prints the binary's path.
.PHONY: serving-host
serving-host: $(STAMP)
	$(VPY) -m serving.build_host

lint: $(STAMP)
	$(VPY) -m ruff check .

clean:
	rm -rf $(VENV) disc_tf/_native build *.egg-info
