"""How the RAL cuts a prepacked GEMM for its threads (cc/ral/gemm_split.h), over a grid
of shapes and thread counts: every block is non-empty, the blocks tile C, each thread
gets as many blocks as the others wherever rounding allows, and each ISA's rule cuts
the shapes it was measured on as measured (bench/GEMM.md)."""

from __future__ import annotations

import itertools
import pathlib
import subprocess

import pytest

from disc_tf.runtime import compiler

REPO = pathlib.Path(__file__).resolve().parents[2]

_PROGRAM = r"""
#include <cstdio>
#include "cc/ral/gemm_split.h"
int main() {
  long long m, n, k, threads, full_rows;
  char isa[16];
  while (std::scanf("%lld %lld %lld %lld %lld %15s", &m, &n, &k, &threads, &full_rows, isa) == 6) {
    const disc_tf::GemmSplit s = disc_tf::ChoosePrepackedSplit(
        m, n, k, threads, full_rows != 0, disc_tf::PrepackedRowsFor(isa));
    std::printf("%lld %lld %lld\n", (long long)s.rows(m), (long long)s.cols(n),
                (long long)s.launches(m, n));
  }
}
"""


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """Runs ChoosePrepackedSplit on (m, n, k, threads, full_rows, isa) rows."""
    d = tmp_path_factory.mktemp("split")
    (d / "split.cc").write_text(_PROGRAM)
    subprocess.run([compiler.resolve(compiler.cxx()), "-O1", "-std=c++17", f"-I{REPO}",
                    str(d / "split.cc"), "-o", str(d / "split")], check=True)

    def run(cases):
        text = "".join(f"{m} {n} {k} {t} {int(f)} {isa}\n" for m, n, k, t, f, isa in cases)
        out = subprocess.run([str(d / "split")], input=text, capture_output=True, text=True,
                             check=True).stdout.split("\n")
        return [tuple(int(v) for v in line.split()) for line in out if line]
    return run


def test_blocks_tile_c_and_threads_share_them_evenly(split):
    cases = [(m, n, k, t, f, isa)
             for m, n, k, t, f, isa in itertools.product(
                 [1, 6, 13, 48, 49, 54, 96, 100, 383, 1000, 2048], [1, 64, 96, 264, 320, 512, 768],
                 [16, 256, 1024], [2, 3, 4, 8, 16], [False, True], ["avx2", "avx512", "none"])]
    for (m, n, k, t, f, isa), (rows, cols, launches) in zip(cases, split(cases)):
        assert 1 <= rows <= m and 1 <= cols <= n, (m, n, k, t, f, isa)
        assert launches == -(-m // rows) * -(-n // cols)
        if f:
            assert cols == n  # a row-wise epilogue sees whole rows
        # On two threads a few blocks (up to 2 per thread) split evenly; AVX2's many
        # 48-row blocks may leave one thread one block more. (With more threads the
        # rounding to panels can leave 3 column blocks for 4 threads even at one each.)
        few = 1 < launches <= 4 and m * n * k >= 64 ** 3
        if few and t == 2:
            assert launches % 2 == 0, (m, n, k, t, f, isa, rows, cols, launches)


@pytest.mark.parametrize("m,n,k,threads,isa,launches", [
    (49, 512, 64, 2, "avx512", 2),     # 4 blocks of 49 rows would round to 18 + 18 + 13
    (54, 512, 64, 2, "avx512", 2),
    (100, 264, 256, 2, "none", 2),     # 4 column blocks would round to 3 panels of 128
    (48, 512, 64, 16, "avx512", 16),   # too few 6-row tiles for 16 threads: columns
    (2048, 512, 64, 2, "avx512", 4),   # tall, small B: whole rows, 2 per thread
    (128, 768, 768, 2, "avx512", 4),   # larger B, few rows: columns
    (1000, 512, 64, 2, "avx2", 21),    # AVX2: blocks of about 48 rows
])
def test_measured_cuts(split, m, n, k, threads, isa, launches):
    (_, _, got), = split([(m, n, k, threads, False, isa)])
    assert got == launches
