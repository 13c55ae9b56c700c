"""How the RAL cuts a prepacked GEMM for its threads (cc/ral/gemm_split.h), over a grid
of shapes and thread counts: every block is non-empty, the blocks tile C, each thread
gets as many blocks as the others wherever rounding allows, each ISA's rule cuts
the shapes it was measured on as measured (bench/GEMM.md), and row blocks share the
rows' register tiles evenly."""

from __future__ import annotations

import itertools
import pathlib
import subprocess

import pytest

from disc_tf.runtime import compiler

REPO = pathlib.Path(__file__).resolve().parents[2]

_PROGRAM = r"""
#include <algorithm>
#include <cstdio>
#include "cc/ral/gemm_split.h"
int main() {
  long long m, n, k, threads, full_rows, l2;
  char isa[16];
  while (std::scanf("%lld %lld %lld %lld %lld %15s %lld", &m, &n, &k, &threads, &full_rows, isa,
                    &l2) == 7) {
    const disc_tf::GemmSplit s = disc_tf::ChoosePrepackedSplit(
        m, n, k, threads, full_rows != 0, disc_tf::PrepackedRowsFor(isa, l2));
    const disc_tf::RowBlocks blocks = disc_tf::RowBlocks::Of(s, m);
    long long longest = 0;
    for (long long i = 0; i < blocks.count; ++i)
      longest = std::max<long long>(longest, blocks.end(i) - blocks.begin(i));
    std::printf("%lld %lld %lld %lld %lld\n", (long long)s.rows(m), (long long)s.cols(n),
                (long long)s.launches(m, n), (long long)blocks.count, longest);
  }
}
"""

#: Prints the row blocks RowBlocks(m, rows, align) cuts, for each "m rows align" line.
_ROW_BLOCKS = r"""
#include <cstdio>
#include "cc/ral/gemm_split.h"
int main() {
  long long m, rows, align;
  while (std::scanf("%lld %lld %lld", &m, &rows, &align) == 3) {
    const disc_tf::RowBlocks blocks(m, rows, align);
    for (long long i = 0; i < blocks.count; ++i)
      std::printf("%lld:%lld ", (long long)blocks.begin(i), (long long)blocks.end(i));
    std::printf("\n");
  }
}
"""

#: Prints the blocks LayerRowBlocks cuts, for each "m threads row_floats l2_bytes" line.
_LAYER_BLOCKS = r"""
#include <cstdio>
#include "cc/ral/gemm_split.h"
int main() {
  long long m, threads, row_floats, l2;
  while (std::scanf("%lld %lld %lld %lld", &m, &threads, &row_floats, &l2) == 4) {
    const disc_tf::RowBlocks blocks = disc_tf::LayerRowBlocks(m, threads, row_floats, l2);
    for (long long i = 0; i < blocks.count; ++i)
      std::printf("%lld:%lld ", (long long)blocks.begin(i), (long long)blocks.end(i));
    std::printf("\n");
  }
}
"""


def _build(d: pathlib.Path, name: str, source: str) -> pathlib.Path:
    (d / f"{name}.cc").write_text(source)
    subprocess.run([compiler.resolve(compiler.cxx()), "-O1", "-std=c++17", f"-I{REPO}",
                    str(d / f"{name}.cc"), "-o", str(d / name)], check=True)
    return d / name


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """Runs ChoosePrepackedSplit on (m, n, k, threads, full_rows, isa[, L2 bytes]) rows
    (the L2 of a Zen 3 core, 512 KiB, unless given)."""
    program = _build(tmp_path_factory.mktemp("split"), "split", _PROGRAM)

    def run(cases):
        text = "".join(f"{m} {n} {k} {t} {int(f)} {isa} {(rest or [512 << 10])[0]}\n"
                       for m, n, k, t, f, isa, *rest in cases)
        out = subprocess.run([str(program)], input=text, capture_output=True, text=True,
                             check=True).stdout.split("\n")
        return [tuple(int(v) for v in line.split()) for line in out if line]
    return run


def test_blocks_tile_c_and_threads_share_them_evenly(split):
    cases = [(m, n, k, t, f, isa, l2)
             for m, n, k, t, f, isa, l2 in itertools.product(
                 [1, 6, 13, 48, 49, 54, 96, 100, 383, 1000, 2048], [1, 64, 96, 264, 320, 512, 768],
                 [16, 256, 1024], [2, 3, 4, 8, 16], [False, True], ["avx2", "avx512", "none"],
                 [512 << 10, 2 << 20])]
    for (m, n, k, t, f, isa, _), (rows, cols, launches, row_blocks, longest) in zip(
            cases, split(cases)):
        assert 1 <= rows <= m and 1 <= cols <= n, (m, n, k, t, f, isa)
        # the RAL's row blocks: the split's count, none longer than rows(m)
        assert launches == row_blocks * -(-n // cols) and longest <= rows, (m, n, k, t, f, isa)
        if f:
            assert cols == n  # a row-wise epilogue sees whole rows
        # On two threads the blocks split evenly, AVX2's many 48-row blocks too. (With
        # more threads the rounding to panels can leave 3 column blocks for 4 threads
        # even at one each.)
        if launches > 1 and m * n * k >= 64 ** 3 and t == 2:
            assert launches % 2 == 0, (m, n, k, t, f, isa, rows, cols, launches)


@pytest.mark.parametrize("m,n,k,threads,isa,launches", [
    (49, 512, 64, 2, "avx512", 2),     # 4 blocks of 49 rows would round to 18 + 18 + 13
    (54, 512, 64, 2, "avx512", 2),
    (100, 264, 256, 2, "none", 2),     # 4 column blocks would round to 3 panels of 128
    (48, 512, 64, 16, "avx512", 16),   # too few 6-row tiles for 16 threads: columns
    (2048, 512, 64, 2, "avx512", 4),   # tall, small B: whole rows, 2 per thread
    (128, 768, 768, 2, "avx512", 4),   # larger B, few rows: columns
    (1000, 512, 64, 2, "avx2", 22),    # AVX2: 2 * ceil(1000 / 96) blocks of 42-48 rows
    (289, 512, 64, 2, "avx2", 8),      # 8 of 36-42 rows, not 7 of 42 (one thread 4)
])
def test_measured_cuts(split, m, n, k, threads, isa, launches):
    (_, _, got, _, _), = split([(m, n, k, threads, False, isa)])
    assert got == launches


@pytest.mark.parametrize("m,n,k,full_rows,isa,l2,launches", [
    (1000, 512, 64, False, "avx2", 2 << 20, 2),  # 2 MiB of L2, B in L2: one block per thread
    (1000, 512, 64, False, "avx2", 512 << 10, 22),  # Zen 3: blocks of about 48 rows
    (96, 1024, 256, False, "avx2", 2 << 20, 2),  # 2 x 48 rows: one block of rows per thread
    (90, 1024, 256, False, "avx2", 2 << 20, 4),  # fewer rows: columns first, 2 per thread
    (300, 256, 256, True, "avx2", 2 << 20, 2),  # whole rows of a small B: one per thread
    (600, 768, 768, False, "avx2", 512 << 10, 14),  # Zen 3: 48-row blocks of this B
    (600, 768, 768, False, "avx2", 2 << 20, 4),  # 2 MiB: a B past L2's share: columns
    (600, 768, 768, True, "avx2", 2 << 20, 2),  # its whole rows: one block per thread
    (300, 768, 768, True, "avx512", 2 << 20, 2),  # whole rows of a B past L2: one per thread
    (1000, 2304, 768, True, "avx512", 2 << 20, 2),
    (600, 768, 768, False, "avx512", 2 << 20, 2),  # tall (2m >= n), B past L2: one per thread
    (2048, 512, 64, True, "avx512", 2 << 20, 4),  # a small B keeps two per thread
])
def test_cuts_by_cache(split, m, n, k, full_rows, isa, l2, launches):
    """The rules that depend on the core's caches: the AVX2 block's 48-row blocks of a
    512 KiB L2 and its one block of rows per thread of a small B on a 2 MiB one, and
    whole rows of a B that leaves L2 cut once per thread (bench/GEMM.md)."""
    (_, _, got, _, _), = split([(m, n, k, 2, full_rows, isa, l2)])
    assert got == launches


def test_row_blocks_share_the_tiles_evenly(tmp_path):
    """RowBlocks keeps the count of blocks of ``rows`` rows, tiles [0, m) in order with
    non-empty blocks of at most ``rows`` rows that start on whole tiles, and gives every
    block as many tiles as the others, or one more, the larger first: 150 rows in blocks
    of 42 are 42, 36, 36 and 36 rows, not 42, 42, 42 and 24."""
    program = _build(tmp_path, "row_blocks", _ROW_BLOCKS)
    cases = [(m, rows, align) for m in [1, 5, 6, 7, 48, 100, 149, 150, 383, 1000, 2048]
             for rows in [1, 4, 6, 12, 42, 48, 96, 175, 180, 2048] for align in [1, 6]]
    text = "".join(f"{m} {rows} {align}\n" for m, rows, align in cases)
    out = subprocess.run([str(program)], input=text, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    got = {case: [tuple(int(v) for v in b.split(":")) for b in line.split()]
           for case, line in zip(cases, out)}
    for (m, rows, align), blocks in got.items():
        unit = align if rows % align == 0 else 1
        assert len(blocks) == -(-m // rows), (m, rows, align, blocks)
        assert blocks[0][0] == 0 and blocks[-1][1] == m, (m, rows, align, blocks)
        assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:])), blocks
        assert all(0 < e - b <= rows and b % unit == 0 for b, e in blocks), (m, rows, blocks)
        tiles = [-(-(e - b) // unit) for b, e in blocks]
        assert max(tiles) - min(tiles) <= 1, (m, rows, align, blocks)
        assert tiles == sorted(tiles, reverse=True), (m, rows, align, blocks)
    assert got[(150, 42, 6)] == [(0, 42), (42, 78), (78, 114), (114, 150)]
    # 167 tiles (the last of 4 rows) in 21 blocks: 20 of 8 tiles, then 7
    assert [e - b for b, e in got[(1000, 48, 6)]] == [48] * 20 + [40]


def _greedy_loads(sizes: list[int], threads: int) -> list[int]:
    """Each thread's rows when the threads take the blocks in order from a shared counter
    as they finish (RunTasks), every row costing the same."""
    loads = [0] * threads
    for size in sizes:
        loads[loads.index(min(loads))] += size
    return loads


def test_layer_blocks_give_every_thread_as_many_rows(tmp_path):
    """LayerRowBlocks (sgemm_layers' blocks) tiles [0, m) in order with non-empty blocks
    whose rows of C fit in half of L2 and, under 1 MiB of L2, have at most 48 rows; there
    their count is a multiple of the threads, so that no thread waits on another's extra
    block: 112 rows on two threads in four blocks of 22-30, where three of 36-40 had one
    thread run 76 rows against the other's 36; and 595 rows on four threads in 16 blocks
    of 6 or 7 tiles, one of 7 for each thread."""
    program = _build(tmp_path, "layer_blocks", _LAYER_BLOCKS)
    cases = [(m, t, floats, l2) for m in [96, 100, 112, 150, 212, 383, 595, 672, 708, 1000, 2048]
             for t in [2, 3, 4, 8] for floats in [16, 1536, 4096, 40000] for l2 in [512 << 10, 2 << 20]]
    text = "".join(f"{m} {t} {floats} {l2}\n" for m, t, floats, l2 in cases)
    out = subprocess.run([str(program)], input=text, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    got = {case: [tuple(int(v) for v in b.split(":")) for b in line.split()]
           for case, line in zip(cases, out)}
    for (m, t, floats, l2), blocks in got.items():
        fit = max(1, l2 // 8 // floats)
        sizes = [e - b for b, e in blocks]
        assert blocks[0][0] == 0 and blocks[-1][1] == m, (m, t, floats, l2, blocks)
        assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:])), blocks
        assert all(0 < size <= fit for size in sizes), (m, t, floats, l2, blocks)
        if l2 < 1 << 20:
            assert max(sizes) <= 48, (m, t, floats, blocks)
            if len(blocks) < m:  # not one row a block
                assert len(blocks) % t == 0, (m, t, floats, blocks)
            if fit >= 48:  # whole 6-row tiles: the busiest thread has at most one more
                assert max(_greedy_loads(sizes, t)) <= -(-m // (6 * t)) * 6 + 6, (m, t, blocks)
    assert got[(112, 2, 1536, 512 << 10)] == [(0, 30), (30, 60), (60, 90), (90, 112)]
    # 100 tiles: 13 blocks of at most 8 -> 14; at 1536 floats a row, 42 rows: 15 -> 16
    assert len(got[(595, 2, 16, 512 << 10)]) == 14 and len(got[(595, 2, 1536, 512 << 10)]) == 16
    assert sorted(_greedy_loads([e - b for b, e in got[(595, 4, 1536, 512 << 10)]], 4)) == [
        145, 150, 150, 150]
