#!/usr/bin/env bash
# GPU run: TF with CUDA in its own venv, the e2e and CUDA codegen tests on the GPU
# machine, then the BERT workloads against TF and XLA. Sized for 10 minutes
# (each step has its own time limit; the whole script stops at 590 s).
#
#   bench/gpu.sh            # results: bench/out-gpu/, bench/RESULTS-gpu.md
#
# Needs: an NVIDIA driver, python3, g++, and nvcc for the CUDA codegen tests
# (they skip without it). The project pins tensorflow-cpu; this venv installs
# tensorflow[and-cuda] of the same version instead and the project without deps.
set -euo pipefail
cd "$(dirname "$0")/.."

TF_VERSION=2.21.0
VENV=bench/.venv-gpu
PY="$VENV/bin/python"
deadline=$((SECONDS + 590))

step() {  # step LIMIT_SECONDS DESCRIPTION COMMAND...
  local limit=$1 what=$2
  shift 2
  local left=$((deadline - SECONDS))
  ((left > 0)) || { echo "gpu.sh: out of time before: $what" >&2; exit 124; }
  ((limit < left)) || limit=$left
  echo "== $what (limit ${limit}s)"
  timeout --kill-after=10 "$limit" "$@"
}

if [[ ! -x "$PY" ]]; then
  python3 -m venv "$VENV"
fi
step 240 "install TF $TF_VERSION with CUDA" "$PY" -m pip install --quiet --upgrade pip \
  "tensorflow[and-cuda]==$TF_VERSION" iree-base-compiler==3.13.0 pybind11==3.1.0 numpy==2.4.6 \
  pytest==9.2.0 hypothesis==6.170.17
step 60 "install disc_tf (no deps)" "$PY" -m pip install --quiet --no-deps -e .
step 30 "TF sees a GPU" "$PY" -c \
  "import tensorflow as tf; g = tf.config.list_physical_devices('GPU'); print(g); assert g, 'no GPU'"
step 120 "native build" "$PY" -c "from disc_tf.runtime import native_build; native_build.main()"
step 150 "e2e + CUDA codegen tests" "$PY" -m pytest -q -x tests/e2e tests/codegen/test_cuda_codegen.py
step 200 "BERT workloads: TF, XLA, disc_tf" "$PY" -m bench.run --workloads bert_base,bert_small \
  --peers tf,xla,disc --quick --skip-compile-time --timeout 90 \
  --out-dir bench/out-gpu --report bench/RESULTS-gpu.md
echo "gpu.sh: done in ${SECONDS}s; report: bench/RESULTS-gpu.md"
