#!/usr/bin/env bash
# GPU run: TF with CUDA in its own venv, the op library with its GPU kernel, the
# e2e suite compiled for the GPU (DISC_TF_TARGET=cuda) and the CUDA codegen tests,
# then the BERT workloads against TF and XLA, the GPU named in the report. Sized
# for 10 minutes (each step has its own limit; the whole script stops at 590 s).
#
#   bench/gpu.sh             # results: bench/out-gpu/, bench/RESULTS-gpu.md
#   bench/gpu.sh --dry-run   # prints the steps and checks, with the project's venv,
#                            # that every module, flag and test path they use exists
#                            # (CI runs this, so the script cannot rot)
#
# For a GPU machine with network access (it pip-installs TF with CUDA). A machine
# without one gets no TF build for its GPU: run bench/gpu_replay/device.sh there
# instead (the compiled clusters, exported with TF's outputs where TF is; see
# bench/README.md, "GPU replay").
#
# Needs: an NVIDIA driver, python3, g++, and nvcc (CUDA codegen, and the headers
# the GPU kernel is built against). The project pins tensorflow-cpu; this venv
# installs tensorflow[and-cuda] of the same version instead and the project without
# deps. ONNX Runtime's CUDA provider is not installed here (bench/requirements-ort.txt
# pins the CPU build).
set -euo pipefail
cd "$(dirname "$0")/.."

DRY=0
[[ "${1:-}" == "--dry-run" ]] && DRY=1
TF_VERSION=2.21.0
VENV=bench/.venv-gpu
PY="$VENV/bin/python"
((DRY)) && PY=".venv/bin/python"
deadline=$((SECONDS + 590))
WORKLOADS=bert_base,bert_small
BENCH_FLAGS=(--workloads "$WORKLOADS" --peers tf,xla,disc --quick --skip-compile-time
             --timeout 90 --out-dir bench/out-gpu --report bench/RESULTS-gpu.md)
TESTS=(tests/e2e tests/codegen/test_cuda_codegen.py)

step() {  # step LIMIT_SECONDS DESCRIPTION COMMAND...
  local limit=$1 what=$2
  shift 2
  if ((DRY)); then
    echo "[dry-run] $what (limit ${limit}s): $*"
    return 0
  fi
  local left=$((deadline - SECONDS))
  ((left > 0)) || { echo "gpu.sh: out of time before: $what" >&2; exit 124; }
  ((limit < left)) || limit=$left
  echo "== $what (limit ${limit}s)"
  timeout --kill-after=10 "$limit" "$@"
}

if ((!DRY)) && [[ ! -x "$PY" ]]; then
  python3 -m venv "$VENV"
fi
PINS=(iree-base-compiler==3.13.0 pybind11==3.1.0 numpy==2.4.6 pytest==9.2.0 hypothesis==6.170.17)
step 240 "install TF $TF_VERSION with CUDA" "$PY" -m pip install --quiet --upgrade pip \
  "tensorflow[and-cuda]==$TF_VERSION" "${PINS[@]}"
step 60 "install disc_tf (no deps)" "$PY" -m pip install --quiet --no-deps -e .
step 30 "TF sees a GPU" "$PY" -c \
  "import tensorflow as tf; g = tf.config.list_physical_devices('GPU'); print(g); assert g, 'no GPU'"
step 120 "native build (with the GPU DiscCluster kernel)" "$PY" -c \
  "from disc_tf.runtime import native_build as b; assert b.cuda_include_dir(), 'no cuda.h'; b.main()"
GPU_NAME=$( ((DRY)) && echo "dry run" || nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
step 150 "e2e suite compiled for the GPU + CUDA codegen tests" env DISC_TF_TARGET=cuda \
  "$PY" -m pytest -q -x "${TESTS[@]}"
step 200 "BERT workloads: TF, XLA, disc_tf" "$PY" -m bench.run "${BENCH_FLAGS[@]}" \
  --note "GPU: $GPU_NAME (bench/gpu.sh)"

if ((DRY)); then  # what the steps use must exist in this checkout
  help=$("$PY" -m bench.run --help)
  for flag in "${BENCH_FLAGS[@]}" --note; do
    [[ "$flag" != --* ]] || grep -q -- "$flag" <<<"$help" || { echo "bench.run lacks $flag" >&2; exit 1; }
  done
  "$PY" -c "
from bench.workloads import WORKLOADS  # one process for the three checks: each imports TF
from disc_tf.runtime import native_build as b
from disc_tf.runtime.target import TARGETS
missing = set('$WORKLOADS'.split(',')) - set(WORKLOADS)
assert not missing, missing
assert callable(b.main) and callable(b.cuda_include_dir)
assert 'cuda' in TARGETS"
  for pin in "${PINS[@]}" "tensorflow-cpu==$TF_VERSION"; do  # the project's own pins
    grep -q "\"$pin\"" pyproject.toml || { echo "pyproject.toml does not pin $pin" >&2; exit 1; }
  done
  for t in "${TESTS[@]}"; do [[ -e "$t" ]] || { echo "missing test path $t" >&2; exit 1; }; done
  echo "gpu.sh --dry-run: ok"
  exit 0
fi
echo "gpu.sh: done in ${SECONDS}s; report: bench/RESULTS-gpu.md"
