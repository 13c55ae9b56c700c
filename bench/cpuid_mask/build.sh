#!/usr/bin/env bash
# Builds build/hide_avx512.so (see hide_avx512.c) and checks that it hides AVX-512 here.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$here/build"
"${CC:-gcc}" -O2 -shared -fPIC -Wall -o "$here/build/hide_avx512.so" "$here/hide_avx512.c" -ldl
