#!/usr/bin/env bash
# Builds build/gemm_libs (and build/split_race): the harness, the RAL's two GEMM microkernel objects
# (cc/ral/gemm_kernel_{avx2,avx512}.cc with native_build.py's ISA flags), and
# every library that setup.sh installed (each one absent is left out).
#   bench/gemm_libs/build.sh     # then run.py (or build/gemm_libs, flags in its header)
#   DISC_VARIANT_FLAGS=-DDISC_GEMM_K_UNROLL=1 bench/gemm_libs/build.sh   # + disc_variant
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${GEMM_LIBS_OUT:-$here/build}"  # GEMM_LIBS_OUT: another build folder
mkdir -p "$out"
CXX="${CXX:-g++}"
base=(-O3 -std=c++17 -fno-math-errno -I"$repo")
"$CXX" "${base[@]}" -mavx2 -mfma -c "$repo/cc/ral/gemm_kernel_avx2.cc" -o "$out/gemm_kernel_avx2.o"
"$CXX" "${base[@]}" -mavx2 -mfma -mavx512f -mavx512cd -mavx512bw -mavx512dq -mavx512vl \
  -c "$repo/cc/ral/gemm_kernel_avx512.cc" -o "$out/gemm_kernel_avx512.o"

defs=() inc=() libs=()
# DISC_VARIANT_FLAGS (e.g. -DDISC_GEMM_K_UNROLL=1): the same block built again with them,
# raced against the RAL's build as the candidate disc_variant (kernel_variant.cc).
if [[ -n "${DISC_VARIANT_FLAGS:-}" ]]; then
  read -r -a variant <<< "$DISC_VARIANT_FLAGS"
  "$CXX" "${base[@]}" -mavx2 -mfma "${variant[@]}" -c "$here/kernel_variant.cc" \
    -o "$out/kernel_variant_avx2.o"
  "$CXX" "${base[@]}" -mavx2 -mfma -mavx512f -mavx512cd -mavx512bw -mavx512dq -mavx512vl \
    "${variant[@]}" -c "$here/kernel_variant.cc" -o "$out/kernel_variant_avx512.o"
  defs+=(-DHAVE_DISC_VARIANT)
  libs+=("$out/kernel_variant_avx2.o" "$out/kernel_variant_avx512.o")
fi
mkl="$here/.venv"
if [[ -f "$mkl/include/mkl.h" ]]; then  # MKL first: cblas_* and sgemm_ resolve to it
  defs+=(-DHAVE_MKL) inc+=(-I"$mkl/include")
  libs+=(-L"$mkl/lib" -Wl,-rpath,"$mkl/lib" -l:libmkl_intel_lp64.so.2
         -l:libmkl_gnu_thread.so.2 -l:libmkl_core.so.2)
fi
if [[ -f /usr/include/libxsmm.h ]]; then
  defs+=(-DHAVE_XSMM) libs+=(/usr/lib/libxsmm.a)
fi
blis=/usr/lib/x86_64-linux-gnu/blis-openmp
if [[ -f "$blis/libblis.so" ]]; then
  defs+=(-DHAVE_BLIS)
  "$CXX" "${base[@]}" -I/usr/include/x86_64-linux-gnu/blis-openmp -c "$here/blis_glue.cc" \
    -o "$out/blis_glue.o"
  libs+=("$out/blis_glue.o" -L"$blis" -Wl,-rpath,"$blis" -lblis)
fi
if [[ -f /usr/include/oneapi/dnnl/dnnl.hpp ]]; then
  defs+=(-DHAVE_DNNL) libs+=(-ldnnl)
fi
"$CXX" "${base[@]}" -fopenmp "${defs[@]}" "${inc[@]}" "$here/gemm_libs.cc" \
  "$out/gemm_kernel_avx2.o" "$out/gemm_kernel_avx512.o" -o "$out/gemm_libs" \
  -Wl,--no-as-needed "${libs[@]}" -lgomp -lpthread -ldl -lrt -lm
# split_race: ways of cutting one prepacked product for two threads (split_race.cc)
"$CXX" "${base[@]}" -mavx2 -mfma "$here/split_race.cc" "$out/gemm_kernel_avx2.o" \
  "$out/gemm_kernel_avx512.o" \
  -o "$out/split_race" -lpthread
echo "built $out/gemm_libs with: ${defs[*]}"
