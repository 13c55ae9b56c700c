"""Winograd F(2, 3), F(4, 3) and F(6, 3) Conv1D tiles (cc/ral/conv_winograd.cc) exactly as the RAL runs them,
without TensorFlow: filters transformed and packed for each ISA's GEMM block (whose
ISA the transforms then run in too: the AVX2 ones on an AVX-512 host as well), the
threads' split into tiles (ChooseWinogradSplit), each tile run on its own, against a
direct convolution in double precision over a grid of widths, paddings (SAME, VALID,
wider than the input, one-sided), kernel widths 3-12, channel counts off the panels,
batches and thread counts. C starts as NaN, so an output no tile wrote fails."""

from __future__ import annotations

import itertools
import pathlib
import subprocess

import pytest

from disc_tf.runtime import compiler, isa
from disc_tf.runtime.native_build import SOURCE_FLAGS

REPO = pathlib.Path(__file__).resolve().parents[2]

_PROGRAM = r"""
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "cc/ral/conv_winograd.h"
using namespace disc_tf;

struct Isa {
  disc_gemm_packed_size_fn size;
  disc_gemm_pack_b_fn pack;
  disc_gemm_prepacked_block_fn gemm;
  WinogradIsa transforms;
};

int main(int argc, char** argv) {
  Isa isa{&disc_gemm_packed_size_avx2, &disc_gemm_pack_b_avx2, &disc_gemm_prepacked_block_avx2,
          WinogradIsa::kAvx2};
#ifdef WITH_AVX512
  if (argc > 1 && std::strcmp(argv[1], "avx512") == 0)
    isa = {&disc_gemm_packed_size_avx512, &disc_gemm_pack_b_avx512,
           &disc_gemm_prepacked_block_avx512, WinogradIsa::kAvx512};
#endif
  int64_t batch, width, ci, co, kw, pad, pad_right, threads, full_rows, m;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  while (std::scanf("%ld %ld %ld %ld %ld %ld %ld %ld %ld %ld", &batch, &width, &ci, &co,
                    &kw, &pad, &pad_right, &threads, &full_rows, &m) == 10) {
    const int64_t ow = width + pad + pad_right - kw + 1;
    std::vector<float> x(batch * width * ci), w(kw * ci * co), c(batch * ow * co, NAN);
    for (float& v : x) v = normal(rng);
    for (float& v : w) v = normal(rng);
    WinogradConv1D conv{width, ci, co, kw, pad, ow, x.data(), c.data(), int(m)};
    std::vector<std::vector<float>> packed(conv.parts());
    const float* parts[kWinogradMaxParts];
    std::vector<float> g(conv.depth() * co);
    for (int u = 0; u < conv.parts(); ++u) {
      for (int64_t e0 = 0; e0 < ci * co; e0 += 100)  // in ranges, as the RAL's pool runs it
        WinogradFilter(w.data(), kw, ci, co, int(m), u, e0, std::min(ci * co, e0 + 100),
                       g.data());
      packed[u].resize(isa.size(conv.depth(), co));
      isa.pack(conv.depth(), co, g.data(), co, 0, packed[u].data());
      parts[u] = packed[u].data();
    }
    const WinogradSplit s = ChooseWinogradSplit(batch, conv.units(), conv.parts(), conv.depth(),
                                                co, threads, full_rows != 0);
    bool split_ok = s.units >= 1 && s.cols >= 1 && s.row_tiles * s.units >= conv.units() &&
                    (s.row_tiles - 1) * s.units < conv.units() && s.col_blocks * s.cols >= co &&
                    (s.col_blocks - 1) * s.cols < co && (s.cols == co || s.cols % 64 == 0) &&
                    (!full_rows || s.cols == co);
    for (int64_t n = 0; n < batch; ++n)
      for (int64_t t = 0; t < s.row_tiles; ++t)
        for (int64_t b = 0; b < s.col_blocks; ++b) {
          const int64_t p0 = t * s.units, c0 = b * s.cols;
          const int64_t p1 = std::min(conv.units(), p0 + s.units), c1 = std::min(co, c0 + s.cols);
          float* scratch = WinogradScratch(WinogradScratchFloats(conv, p1 - p0, c1 - c0));
          WinogradTile(conv, isa.transforms, parts, isa.gemm, n, p0, p1, c0, c1, scratch);
        }
    // |error| / (sum of |terms| + 1), x and w being N(0, 1); the sum of |terms| is the
    // largest over the outputs of the unit: each output is a combination of the unit's
    // M_u, so its rounding is that of its unit (an output of the padding alone, whose
    // terms are all zero, is a cancellation of the others' values).
    double worst = 0;
    std::vector<double> sums(ow), sizes(ow);
    for (int64_t n = 0; n < batch; ++n)
      for (int64_t j = 0; j < co; ++j) {
        for (int64_t o = 0; o < ow; ++o) {
          double sum = 0, size = 0;
          for (int64_t tap = 0; tap < kw; ++tap) {
            const int64_t col = o - pad + tap;
            if (col < 0 || col >= width) continue;
            for (int64_t e = 0; e < ci; ++e) {
              const double term = double(x[(n * width + col) * ci + e]) * w[(tap * ci + e) * co + j];
              sum += term;
              size += std::fabs(term);
            }
          }
          sums[o] = sum;
          sizes[o] = size;
        }
        for (int64_t o = 0; o < ow; ++o) {
          double size = 0;
          for (int64_t u = o / m * m; u < std::min(ow, o / m * m + m); ++u)
            size = std::max(size, sizes[u]);
          const double got = c[(n * ow + o) * co + j];
          const double err = std::isnan(got) ? 1e9 : std::fabs(got - sums[o]) / (size + 1);
          worst = std::max(worst, err);
        }
      }
    std::printf("%d %g %ld %ld\n", split_ok ? 1 : 0, worst, s.row_tiles, s.col_blocks);
  }
}
"""


@pytest.fixture(scope="module")
def tiles(tmp_path_factory):
    """Runs the program on (batch, width, ci, co, kw, pad, pad_right, threads, full_rows, m)
    rows with the block of one ISA; returns (split ok, worst error, row tiles, column
    blocks) per row."""
    d = tmp_path_factory.mktemp("winograd")
    (d / "main.cc").write_text(_PROGRAM)
    cxx = compiler.resolve(compiler.cxx())
    base = [cxx, "-O2", "-std=c++17", f"-I{REPO}"]
    objects = []
    # conv_winograd.cc as the native build compiles it: its transforms vectorised
    sources = [("conv_winograd.cc", list(SOURCE_FLAGS["conv_winograd.cc"])),
               ("gemm_kernel_avx2.cc", ["-mavx2", "-mfma"])]
    with_avx512 = isa.host_level() == "x86-64-v4"
    if with_avx512:
        sources.append(("gemm_kernel_avx512.cc", ["-mavx2", "-mfma", "-mavx512f", "-mavx512cd",
                                                  "-mavx512bw", "-mavx512dq", "-mavx512vl"]))
    for name, flags in sources:
        obj = d / (name + ".o")
        subprocess.run([*base, *flags, "-c", str(REPO / "cc" / "ral" / name), "-o", str(obj)],
                       check=True)
        objects.append(str(obj))
    subprocess.run([*base, *(["-DWITH_AVX512"] if with_avx512 else []), str(d / "main.cc"),
                    *objects, "-o", str(d / "tiles")], check=True)

    def run(cases, gemm_isa):
        text = "".join(" ".join(str(v) for v in case) + "\n" for case in cases)
        out = subprocess.run([str(d / "tiles"), gemm_isa], input=text, capture_output=True,
                             text=True, check=True).stdout.split("\n")
        return [(int(a), float(b), int(c), int(e)) for a, b, c, e in
                (line.split() for line in out if line)]
    return run


def _cases():
    for kw, width, (left, right), ci, co in itertools.product(
            [3, 6, 9, 12], [1, 2, 15, 16, 31, 130], [(None, None), (0, 0), (7, 1), (0, 3)],
            [1, 5, 64], [1, 13, 64, 130]):
        if left is None:  # SAME
            left, right = (kw - 1) // 2, kw - 1 - (kw - 1) // 2
        if width + left + right - kw + 1 < 1:
            continue
        for m in (2, 4, 6):
            yield (1 + (width + ci) % 3, width, ci, co, kw, left, right, 1 + co % 4, co % 2, m)


@pytest.mark.skipif(isa.host_level() == "x86-64", reason="the GEMM blocks need AVX2+FMA")
@pytest.mark.parametrize("gemm_isa", ["avx2", "avx512"])
def test_tiles_match_a_direct_conv(tiles, gemm_isa):
    if gemm_isa == "avx512" and isa.host_level() != "x86-64-v4":
        pytest.skip("the AVX-512 block needs AVX-512")
    cases = list(_cases())
    assert len(cases) > 1000
    for case, (split_ok, worst, _, _) in zip(cases, tiles(cases, gemm_isa), strict=True):
        assert split_ok, case
        assert worst < 1e-5, (case, worst)


@pytest.mark.skipif(isa.host_level() == "x86-64", reason="the GEMM blocks need AVX2+FMA")
def test_threads_split_rows_then_channels(tiles):
    """As few row tiles as the scratch bound allows (102 pairs of F(2, 3), 60 units of
    F(4, 3), 42 of F(6, 3) for a kernel-9 256 -> 1024 conv): each streams every G_u.
    Row tiles that do not share out evenly over the threads cut the channels in
    64-column blocks too, unless the epilogue wants whole rows: then one image takes a
    multiple of the threads in row tiles."""
    cases = [  # batch, width, ci, co, kw, pad, pad_right, threads, full_rows, m
        (1, 800, 256, 1024, 9, 4, 4, 2, 0, 2),  # 400 pairs: 4 tiles of 102 (the last 94)
        (1, 400, 256, 1024, 9, 4, 4, 2, 0, 2),  # 200 pairs: 2 tiles of 102 (the last 98)
        (1, 20, 256, 1024, 9, 4, 4, 2, 0, 2),  # 10 pairs: one tile, channels in 2 blocks
        (1, 20, 256, 1024, 9, 4, 4, 2, 1, 2),  # ... not with a row-wise epilogue
        (3, 20, 16, 100, 3, 1, 1, 2, 0, 2),  # 3 images: a tile each is enough
        (1, 800, 256, 1024, 9, 4, 4, 2, 0, 4),  # 200 units of 4: 4 tiles of 54 (the last 38)
        (1, 400, 256, 1024, 9, 4, 4, 2, 0, 4),  # 100 units: 2 tiles of 54
        (1, 20, 256, 1024, 9, 4, 4, 2, 0, 4),  # 5 units: one tile, channels in 2 blocks
        (1, 64, 256, 1024, 9, 4, 4, 2, 0, 4),  # 16 units: one tile, not two of 12 and 4
        (1, 600, 256, 1024, 9, 4, 4, 2, 0, 2),  # 300 pairs: 3 tiles, channels in 2 blocks
        (1, 600, 256, 1024, 9, 4, 4, 2, 1, 2),  # ... rows cut into 4 tiles for the epilogue
        (1, 800, 256, 1024, 9, 4, 4, 2, 0, 6),  # 134 units of 6: 4 tiles of 36 (the last 26)
        (1, 400, 256, 1024, 9, 4, 4, 2, 0, 6),  # 67 units: 2 tiles of 36
        (1, 200, 256, 1024, 9, 4, 4, 2, 1, 6),  # 34 units: 2 tiles of 18 for the epilogue
    ]
    got = [(tiles_, blocks) for _, _, tiles_, blocks in tiles(cases, "avx2")]
    assert got == [(4, 1), (2, 1), (1, 2), (1, 1), (1, 1), (4, 1), (2, 1), (1, 2), (1, 2), (3, 2),
                   (4, 1), (4, 1), (2, 1), (2, 1)]
