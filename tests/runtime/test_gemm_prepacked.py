"""The prepacked GEMM block (cc/ral/gemm_kernel_impl.h) on its own, without TensorFlow:
B packed once, then C = op(A) * B over a grid of rows (full 6-row tiles and the
remainders), columns (partial panels, several strip blocks), depths (one and several
1024-deep stretches), a transposed A and accumulation, against a double-precision
product, through both entries (with the prefetches of B, and `_resident` without).
Both loop orders run on each ISA (strips and panels, each compiled as its own variant
of the block), so the software prefetches of the next stretch of B, which follow each
order's own walk over B, are exercised with every layout they plan for. C starts as
NaN (or a known value when accumulating), so a tile no loop wrote fails."""

from __future__ import annotations

import itertools
import pathlib
import random
import subprocess

import pytest

from disc_tf.runtime import compiler, isa

REPO = pathlib.Path(__file__).resolve().parents[2]

# One variant of the block per (ISA, loop order), each under its own exported names.
_VARIANT = """#define DISC_GEMM_STRIPS {strips}
#define DISC_GEMM_ISA(name) name##_{tag}
#include "cc/ral/gemm_kernel_impl.h"
"""

_AVX2 = ["-mavx2", "-mfma"]
_AVX512 = [*_AVX2, "-mavx512f", "-mavx512cd", "-mavx512bw", "-mavx512dq", "-mavx512vl"]
_VARIANTS = {  # tag: (ISA flags, strips)
    "avx2_strips": (_AVX2, 1), "avx2_panels": (_AVX2, 0),
    "avx512_strips": (_AVX512, 1), "avx512_panels": (_AVX512, 0),
}

_PROGRAM = r"""
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#define DECLARE(tag)                                                                   \
  extern "C" int64_t disc_gemm_packed_size_##tag(int64_t k, int64_t n);               \
  extern "C" void disc_gemm_pack_b_##tag(int64_t k, int64_t n, const float* b,        \
                                         int64_t ldb, int tb, float* out);            \
  extern "C" void disc_gemm_prepacked_block_##tag(int64_t m, int64_t n, int64_t k,    \
                                                  const float* a, int64_t lda, int ta, \
                                                  const float* packed_b, float* c,    \
                                                  int64_t ldc, int accumulate);    \
  extern "C" void disc_gemm_prepacked_block_resident_##tag(                           \
      int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, int ta,           \
      const float* packed_b, float* c, int64_t ldc, int accumulate);
VARIANT_DECLARATIONS

struct Block {
  const char* tag;
  int64_t (*size)(int64_t, int64_t);
  void (*pack)(int64_t, int64_t, const float*, int64_t, int, float*);
  using Gemm = void (*)(int64_t, int64_t, int64_t, const float*, int64_t, int, const float*,
                        float*, int64_t, int);
  Gemm gemm, gemm_resident;  // with and without prefetching B
};
#define ENTRY(tag) {#tag, &disc_gemm_packed_size_##tag, &disc_gemm_pack_b_##tag, \
                    &disc_gemm_prepacked_block_##tag, &disc_gemm_prepacked_block_resident_##tag},
const Block kBlocks[] = {VARIANT_ENTRIES};

int main(int argc, char** argv) {
  const Block* block = nullptr;
  for (const Block& b : kBlocks)
    if (std::strcmp(b.tag, argv[1]) == 0) block = &b;
  if (block == nullptr) return 2;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  int64_t m, n, k, ta, accumulate, tb, resident;
  while (std::scanf("%ld %ld %ld %ld %ld %ld %ld", &m, &n, &k, &ta, &tb, &accumulate,
                    &resident) == 7) {
    // A has a row stride wider than its rows (a view of a wider tensor).
    const int64_t lda = (ta ? m : k) + 5;
    std::vector<float> a((ta ? k : m) * lda), b(k * n);
    for (float& v : a) v = normal(rng);
    for (float& v : b) v = normal(rng);
    // C has a row stride wider than n (a view of a wider result), its padding untouched.
    const int64_t ldc = n + 3;
    std::vector<float> c(m * ldc, accumulate ? 0.5f : NAN);
    std::vector<float> packed(block->size(k, n));
    block->pack(k, n, b.data(), tb ? k : n, int(tb), packed.data());
    (resident ? block->gemm_resident : block->gemm)(m, n, k, a.data(), lda, int(ta),
                                                    packed.data(), c.data(), ldc,
                                                    int(accumulate));
    double worst = 0;
    bool padding_kept = true;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double sum = accumulate ? 0.5 : 0.0, size = 1.0;
        for (int64_t p = 0; p < k; ++p) {
          const double term = double(ta ? a[p * lda + i] : a[i * lda + p]) *
                              (tb ? b[j * k + p] : b[p * n + j]);
          sum += term;
          size += std::fabs(term);
        }
        const double got = c[i * ldc + j];
        worst = std::max(worst, std::isnan(got) ? 1e9 : std::fabs(got - sum) / size);
      }
      for (int64_t j = n; j < ldc; ++j) {
        const float v = c[i * ldc + j];
        padding_kept &= accumulate ? v == 0.5f : std::isnan(v);
      }
    }
    std::printf("%g %d\n", worst, padding_kept ? 1 : 0);
  }
}
"""


@pytest.fixture(scope="module")
def prepacked(tmp_path_factory):
    """Runs the program on (m, n, k, ta, tb, accumulate, resident) rows with one variant of the
    block; returns (worst relative error, C's padding kept) per row."""
    d = tmp_path_factory.mktemp("prepacked")
    tags = [t for t in _VARIANTS if t.startswith("avx2") or isa.host_level() == "x86-64-v4"]
    cxx = compiler.resolve(compiler.cxx())
    base = [cxx, "-O2", "-std=c++17", "-fno-math-errno", f"-I{REPO}"]
    objects = []
    for tag in tags:
        flags, strips = _VARIANTS[tag]
        source = d / f"{tag}.cc"
        source.write_text(_VARIANT.format(strips=strips, tag=tag))
        subprocess.run([*base, *flags, "-c", str(source), "-o", str(d / f"{tag}.o")],
                       check=True)
        objects.append(str(d / f"{tag}.o"))
    program = (_PROGRAM.replace("VARIANT_DECLARATIONS", "\n".join(f"DECLARE({t})" for t in tags))
               .replace("VARIANT_ENTRIES", " ".join(f"ENTRY({t})" for t in tags)))
    (d / "main.cc").write_text(program)
    subprocess.run([*base, str(d / "main.cc"), *objects, "-o", str(d / "prepacked")],
                   check=True)

    def run(cases, tag):
        text = "".join(" ".join(str(v) for v in case) + "\n" for case in cases)
        out = subprocess.run([str(d / "prepacked"), tag], input=text, capture_output=True,
                             text=True, check=True).stdout.split("\n")
        return [(float(w), int(p)) for w, p in (line.split() for line in out if line)]
    return run


def _cases():
    """Rows: below one tile, one tile, tiles plus each remainder, many tiles. Columns:
    one vector, partial and whole panels of both ISAs, several 128-column strip blocks
    with a partial last one. Depths: short, one stretch, and several 1024-deep ones."""
    rows = [1, 5, 6, 7, 12, 17, 40, 131]
    cols = [1, 9, 16, 33, 64, 130, 300]
    depths = [1, 3, 256, 1024, 1100, 2100]
    rng = random.Random(3)  # the flags drawn independently of the sizes
    for m, n, k in itertools.product(rows, cols, depths):
        if m * n * k > 40_000_000:
            continue
        yield m, n, k, *(rng.randrange(2) for _ in range(4))


@pytest.mark.skipif(isa.host_level() == "x86-64", reason="the GEMM blocks need AVX2+FMA")
@pytest.mark.parametrize("tag", list(_VARIANTS))
def test_prepacked_block_matches_a_double_product(prepacked, tag):
    if tag.startswith("avx512") and isa.host_level() != "x86-64-v4":
        pytest.skip("the AVX-512 block needs AVX-512")
    cases = list(_cases())
    assert len(cases) > 300
    for case, (worst, padding_kept) in zip(cases, prepacked(cases, tag), strict=True):
        assert worst < 1e-5, (case, worst)
        assert padding_kept, case
