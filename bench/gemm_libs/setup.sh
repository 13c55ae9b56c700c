#!/usr/bin/env bash
# Installs the pinned GEMM libraries of the study (idempotent; run as root).
#   Debian 12: libxsmm-dev 1.17-2, libblis-dev 0.9.0-1 (OpenMP build), libdnnl-dev 2.6.3-1
#   PyPI, into bench/gemm_libs/.venv: mkl-devel / mkl 2025.3.1 (headers, libs)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

debs=(libxsmm-dev=1.17-2 libblis-dev=0.9.0-1 libblis-openmp-dev=0.9.0-1
      libblis4-openmp=0.9.0-1 libdnnl-dev=2.6.3-1)
missing=()
for d in "${debs[@]}"; do
  name="${d%%=*}" want="${d#*=}"
  have="$(dpkg-query -W -f='${Version}' "$name" 2>/dev/null || true)"
  [[ "$have" == "$want" ]] || missing+=("$d")
done
if ((${#missing[@]})); then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi

MKL_VERSION=2025.3.1
venv="$here/.venv"
[[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
if ! "$venv/bin/python" -m pip show mkl-devel 2>/dev/null | grep -qx "Version: $MKL_VERSION"; then
  "$venv/bin/python" -m pip install --quiet "mkl-devel==$MKL_VERSION" "mkl==$MKL_VERSION"
fi
echo "setup: debs ${debs[*]}; mkl $MKL_VERSION in $venv"
