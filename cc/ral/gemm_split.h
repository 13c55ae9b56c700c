// gemm_split.h -- how the RAL cuts one GEMM product into blocks of C for its
// thread pool. Header-only and free of TensorFlow, so that a benchmark harness
// (bench/gemm_libs) splits a product exactly as the RAL does.
#ifndef DISC_TF_CC_RAL_GEMM_SPLIT_H_
#define DISC_TF_CC_RAL_GEMM_SPLIT_H_

#include <stdint.h>
#include <string.h>

#include <algorithm>

#include "cc/ral/cache_size.h"

namespace disc_tf {

// Products smaller than this (m * n * k) are not split across threads; a
// batch of them is spread over the pool one product per task.
constexpr double kSmallGemm = 64.0 * 64.0 * 64.0;

// How one product is cut into blocks of C for the pool. A block reads its
// rows of op(A) in place and packs (or, with few rows, streams) its columns
// of op(B), so cutting rows packs B once more per row block while cutting
// columns costs nothing extra.
struct GemmSplit {
  int64_t row_blocks = 1, col_blocks = 1;
  int64_t row_align = 1;  // rows per block are a multiple of this
  int64_t rows(int64_t m) const {
    const int64_t r = (m + row_blocks - 1) / row_blocks;
    return std::min(m, (r + row_align - 1) / row_align * row_align);
  }
  // Columns per block: whole 64-column panels of the GEMM block's tiles.
  int64_t cols(int64_t n) const {
    const int64_t c = (n + col_blocks - 1) / col_blocks;
    return col_blocks == 1 ? n : std::min(n, (c + 63) / 64 * 64);
  }
  // Blocks of C after the rounding of columns (at least one): RowBlocks::Of's blocks
  // of rows (row_blocks, fewer only where m has fewer tiles of row_align rows) times
  // the blocks of columns. Defined after RowBlocks.
  int64_t launches(int64_t m, int64_t n) const;
};

// The row blocks of m rows cut into blocks of at most `rows` rows: as many blocks as
// blocks of `rows` rows take, sharing m's tiles of `align` rows (the GEMM block's
// register tiles) as evenly as they can. 150 rows in blocks of 42: 42, 36, 36 and 36
// rows, where blocks of 42 from the top leave 42, 42, 42 and 24 (two threads then wait
// on 84 rows against 66: 12% of the product; bench/GEMM.md, "Balanced row blocks").
// The blocks with a tile more come first: threads that take blocks in turn from a
// counter (RunTasks) then get one each before any gets a second (595 rows, 16 blocks
// of 6 or 7 tiles, four threads: 25 tiles each, where one block of 7 every fourth gave
// one thread all four: 28).
struct RowBlocks {
  int64_t m, count, unit, tiles;
  RowBlocks(int64_t m_rows, int64_t rows, int64_t align = 6)
      : m(m_rows),
        count(m_rows > 0 && rows > 0 ? (m_rows + rows - 1) / rows : 1),
        unit(align > 0 && rows % align == 0 ? align : 1),
        tiles((m_rows + unit - 1) / unit) {}
  // First row of block i (i in [0, count]; begin(count) == m). No block has more
  // than `rows` rows, as each has at most ceil(tiles / count) tiles.
  int64_t begin(int64_t i) const {
    return std::min(m, (i * (tiles / count) + std::min(i, tiles % count)) * unit);
  }
  int64_t end(int64_t i) const { return begin(i + 1); }
  // m_rows cut into `blocks` blocks (at least one, at most one a tile) sharing its
  // tiles of `align` rows as evenly as they can.
  static RowBlocks OfCount(int64_t m_rows, int64_t blocks, int64_t align) {
    RowBlocks cut(m_rows, std::max<int64_t>(align, 1), align);
    cut.count = std::max<int64_t>(1, std::min(blocks, cut.tiles));
    return cut;
  }
  // The row blocks of `split`: its row_blocks blocks, none longer than split.rows(m)
  // (blocks of split.rows(m) from the count of rows could be fewer: 289 rows wanted in
  // 8 blocks are 37 rows, 42 in whole tiles, and 7 blocks of 42 leave one of two
  // threads four of them; bench/GEMM.md, "Layer blocks by the threads").
  static RowBlocks Of(const GemmSplit& split, int64_t m_rows) {
    return OfCount(m_rows, split.row_blocks, std::max<int64_t>(split.row_align, 1));
  }
};

inline int64_t GemmSplit::launches(int64_t m, int64_t n) const {
  const int64_t c = std::max<int64_t>(1, cols(n));
  return RowBlocks::Of(*this, m).count * std::max<int64_t>(1, (n + c - 1) / c);
}

// Rows per task at most `most`, whole 6-row register tiles where that allows.
inline int64_t CapRows(int64_t rows, int64_t most) {
  return rows <= most ? rows : most >= 6 ? most / 6 * 6 : most;
}

// The split into at least `want` blocks (rows of 8 or more, columns of 64 or
// more, where the product allows) that packs the fewest elements of B; with
// full_rows, rows only.
inline GemmSplit ChooseGemmSplit(int64_t m, int64_t n, int64_t k, int64_t want, bool full_rows) {
  GemmSplit best;
  if (full_rows) {
    best.row_blocks = std::max<int64_t>(1, std::min(want, m / 8));
    return best;
  }
  double best_packed = -1;
  for (int64_t rb = 1; rb <= want; ++rb) {
    const int64_t cb = (want + rb - 1) / rb;
    if ((rb > 1 && m < 8 * rb) || (cb > 1 && n < 64 * cb)) continue;
    const double packed = static_cast<double>(rb) * k * n;
    if (best_packed < 0 || packed < best_packed) {
      best_packed = packed;
      best.row_blocks = rb;
      best.col_blocks = cb;
    }
  }
  return best;
}

// How the threads share a prepacked product, per ISA (its GEMM block and the
// caches of the machines it was measured on; bench/GEMM.md).
enum class PrepackedRows {
  // Up to two blocks per thread, columns first (an ISA not measured).
  kColumnsFirst,
  // AVX2 (Zen 3): blocks of about kRowBlockRows whole rows, for a product of at
  // least threads * kRowBlockRows rows whose packed B fits kRowBlockMaxPackedFloats.
  kBlocksOf48,
  // AVX2 on a core with 1 MiB of L2 or more (Sapphire Rapids): one block of whole
  // rows per thread for a product of at least threads * kRowBlockRows rows whose
  // packed B is at most kSmallPackedFloats (in L2 for the whole block); columns
  // first otherwise.
  kThreadRowsSmallB,
  // AVX-512 (Sapphire Rapids): up to two blocks of whole rows per thread, for a
  // product of at least kRowBlockRows rows whose packed B fits
  // kRowBlockMaxPackedFloats, and either is small (kSmallPackedFloats) or has
  // at least n / 2 rows.
  kTallProducts,
};

// The rule measured for the GEMM block of ISA `isa` ("avx2", "avx512") on a core with
// `l2_bytes` of L2 (L2CacheBytes, cache_size.h). The AVX2 block's 48-row blocks were
// measured on Zen 3 (512 KiB of L2, a fast L3). On Sapphire Rapids (2 MiB of L2, a
// slower L3) they lost 8-9% at 300-600 x 768 x 768 against columns, where B (590 K
// floats) comes from L3 for every block, and still won where B is in L2 (1.06x at
// 200 x 256 x 1024); the AVX-512 rule lost 2-6% there at 64 rows (bench/GEMM.md,
// "AVX2 block on Sapphire Rapids"). There 48-row blocks of a small B also lost to one
// block per thread inside a model (4 x 2 dense layers of 256 x 1024 and 1024 x 256,
// 300 rows: 6.6-6.7 -> 6.2 ms a call; BERT-small's stream 1.5-3%), where each
// layer's B comes from L3 and its A from the last layer's epilogue: with one block
// per thread, the caller's rows are its own in every layer, and no thread waits on
// another's last block (the split_race harness, with A and B hot, ties them within
// 3%; bench/GEMM.md, "One block per thread in a model").
inline PrepackedRows PrepackedRowsFor(const char* isa, int64_t l2_bytes) {
  if (strcmp(isa, "avx2") == 0)
    return l2_bytes < (1 << 20) ? PrepackedRows::kBlocksOf48 : PrepackedRows::kThreadRowsSmallB;
  if (strcmp(isa, "avx512") == 0) return PrepackedRows::kTallProducts;
  return PrepackedRows::kColumnsFirst;
}

constexpr int64_t kRowBlockRows = 48;

// The row blocks of an sgemm_layers launch (RAL ABI 12: every layer of a run of GEMMs
// on one block of rows) of m rows whose rows of C take `row_floats` floats (every C in
// scratch, or the widest), on `threads` threads with `l2_bytes` of L2 a core. Each
// block's rows of C stay within half of L2; the rest holds the panels of B it streams.
// With less than 1 MiB of L2 (Zen 3: each block streams every layer's B from L3, as a
// layer's own 48-row blocks did) blocks of at most kRowBlockRows rows, fewer where
// those would pass half of L2, their count a multiple of the threads: 112 rows (one
// BERT-small sequence, 42-row blocks) in four blocks of 22-30 rows, not three of 36-40
// that leave one thread two of them (the run of layers: 1.10 -> 0.92 ms on Zen 3;
// bench/GEMM.md, "Layer blocks by the threads"). With more L2 (Sapphire Rapids, where a layer's
// product took one block of rows per thread: B in L2 for the whole block,
// PrepackedRows::kThreadRowsSmallB) one block per thread, or as few blocks as keep
// each within half of L2, their count a multiple of the threads (2000 rows of the
// recommender in blocks of at most 315: 8 of 250, not 7 that leave one thread four).
inline RowBlocks LayerRowBlocks(int64_t m, int64_t threads, int64_t row_floats,
                                int64_t l2_bytes) {
  const int64_t half_l2 = l2_bytes / 2 / static_cast<int64_t>(sizeof(float));
  const int64_t fit = std::max<int64_t>(1, half_l2 / std::max<int64_t>(row_floats, 1));
  const int64_t t = std::max<int64_t>(threads, 1);
  if (l2_bytes < (1 << 20)) {
    const int64_t cap = CapRows(kRowBlockRows, fit);
    const int64_t align = cap % 6 == 0 ? 6 : 1;
    const int64_t tiles = (m + align - 1) / align, per_block = cap / align;
    const int64_t blocks = ((tiles + per_block - 1) / per_block + t - 1) / t * t;
    return RowBlocks::OfCount(m, blocks, align);
  }
  const int64_t rounds = std::max<int64_t>(1, (m + t * fit - 1) / (t * fit));  // blocks a thread
  const int64_t rows = (m + t * rounds - 1) / (t * rounds);
  return RowBlocks(m, CapRows(std::max<int64_t>(6, (rows + 5) / 6 * 6), fit));
}

constexpr double kRowBlockMaxPackedFloats = 640.0 * 1024;
constexpr double kSmallPackedFloats = 256.0 * 1024;

// Whether a prepacked product with a row-wise epilogue (LayerNorm, softmax over C's
// rows) of m rows whose packed B holds packed_floats floats shares its columns among
// the threads and runs the epilogue on whole rows after them, instead of cutting rows.
// A row cut has every thread read all of B. With fewer than kRowBlockRows rows per
// thread that dominates, and the 6-row tiles fall unequally (8 rows: one thread does it
// all); the epilogue then reads a C of a few KiB to a hundred KiB. Past
// kRowBlockMaxPackedFloats B comes from the L3, or from memory where a model's weights
// pass the L3, and a column cut reads it once for all the threads. BERT-base (56 MB of
// weights; Zen 3, best of 6 calls, old and new library in turn) at 1 x 142 tokens took
// 0.66-0.99x the time with its FFN's LayerNorm and GELU launches so cut (6 rounds),
// 0.88-1.11x with Q/K/V (2304 columns) too (5 rounds), 2 x 113 0.81-1.03x; 720-756 rows
// tie (0.8-1.3x, the host's spread). Its C, 300 K floats and more, is in memory either
// way.
inline bool ColumnsThenRows(int64_t m, int64_t threads, double packed_floats = 0) {
  return threads > 1 && (m < threads * kRowBlockRows || packed_floats > kRowBlockMaxPackedFloats);
}

// The split of a product whose B is packed already: no block packs
// anything, so rows cost nothing to cut. Up to two blocks per thread (of at
// least kMinBlockWork multiply-adds each, as many for every thread after the
// rounding of rows and columns where it allows) let the
// threads that start first take the blocks of one that starts late (1, 2, 4
// or 8 per thread measured the same within noise on the keras_encoder shapes).
// Columns are cut first (each block then reads all of A and its part of B),
// unless `rows` says otherwise or full_rows asks for whole rows.
//
// Cutting columns leaves each block an m x n / blocks window of C: at 2048 rows
// a block's C (1 MiB and more) has left L2 when its epilogue reads it back, and
// every block reads all of A. Whole rows keep a block's C in L2 but make every
// thread read all of B, so they pay while B is small (kRowBlockMaxPackedFloats)
// and A is not much smaller than B. Measured with bench/gemm_libs/split_race (2
// threads, bias + ReLU per block, interleaved rounds; bench/GEMM.md):
// * kBlocksOf48 on Zen 3 (AVX2): 1.23x at 2048 x 64 x 512, 1.12-1.22x at k x n =
//   256 x 1024 and 256 x 256, 1.04x at 768 x 768; with a larger B (3072 x 768:
//   9 MiB re-read from L3 by every block) it lost 9%, hence the bound.
// * kTallProducts on Sapphire Rapids (AVX-512, 2 MiB L2): 1.58x at
//   2048 x 64 x 512, 1.38x at 800 x 256 x 256, 1.13-1.15x at 2048 x 512 x 256,
//   1024 x 256 x 1024 and 512 x 256 x 1024, 1.06x at 1024 x 768 x 768; 48-row
//   blocks there gained less (0.97x at 1024 x 768 x 768). With B in L2 (at most
//   kSmallPackedFloats: 1 MiB) whole rows win at fewer rows too: 1.62x at
//   96 x 64 x 512, 1.20x at 48 x 128 x 512, 1.09x at 96 x 256 x 768; with a
//   larger B and few rows they lost 12% (128 x 768 x 768: each thread reads all
//   of B for little A), and below 48 rows the 6-row tiles leave the threads
//   unequal shares (16 rows: 12 and 4; 0.80x at 16 x 256 x 768).
constexpr double kMinBlockWork = 1 << 20;
inline GemmSplit ChoosePrepackedSplit(int64_t m, int64_t n, int64_t k, int64_t threads,
                                      bool full_rows,
                                      PrepackedRows rows = PrepackedRows::kColumnsFirst) {
  GemmSplit split;
  split.row_align = 6;  // whole register tiles of every ISA's GEMM block
  const double packed_floats = static_cast<double>(k) * n;
  const bool b_fits = packed_floats <= kRowBlockMaxPackedFloats;
  if (threads > 1 && m >= threads * kRowBlockRows) {
    if (rows == PrepackedRows::kBlocksOf48 && b_fits) {
      split.row_blocks =
          threads * ((m + threads * kRowBlockRows - 1) / (threads * kRowBlockRows));
      return split;
    }
    if (rows == PrepackedRows::kThreadRowsSmallB && packed_floats <= kSmallPackedFloats) {
      split.row_blocks = threads;
      return split;
    }
  }
  const double work = static_cast<double>(m) * n * k;
  int64_t most = (std::max<int64_t>(threads, std::min<int64_t>(
                            2 * threads, static_cast<int64_t>(work / kMinBlockWork))) +
                        threads - 1) / threads * threads;
  // kTallProducts only where every wanted block gets a 6-row tile or more.
  if (rows == PrepackedRows::kTallProducts && b_fits && m >= kRowBlockRows && m / 6 >= most &&
      (2 * m >= n || packed_floats <= kSmallPackedFloats)) {
    full_rows = true;
  }
  // Whole rows of a B that leaves L2: each block streams all of B again from L3, so one
  // block per thread (split_race, Sapphire Rapids: 1.02-1.25x against two per thread at
  // 130-1000 x 768 x 768, 1000 x 768 x 2304 and 600 x 3072 x 768 on the AVX-512 block,
  // 1.04-1.08x on the AVX2 block; bench/GEMM.md).
  if (full_rows && packed_floats > kSmallPackedFloats) most = threads;
  // As many blocks for every thread: rows rounded up to 6-row tiles and columns to
  // 64-column panels can make fewer launches than blocks wanted (4 wanted of 49
  // rows: 18 + 18 + 13), so an uneven count falls back to one block wanted per
  // thread (on two threads always even; with more, the rounding may still leave
  // fewer blocks than threads).
  for (const int64_t want : {most, threads}) {
    split.col_blocks = full_rows ? 1 : std::max<int64_t>(1, std::min(want, n / 64));
    const int64_t rows_wanted = (want + split.col_blocks - 1) / split.col_blocks;
    split.row_blocks = std::max<int64_t>(1, std::min(rows_wanted, m / 6));
    if (split.launches(m, n) % threads == 0) break;
  }
  return split;
}

}  // namespace disc_tf

#endif  // DISC_TF_CC_RAL_GEMM_SPLIT_H_
