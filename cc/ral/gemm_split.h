// gemm_split.h -- how the RAL cuts one GEMM product into blocks of C for its
// thread pool. Header-only and free of TensorFlow, so that a benchmark harness
// (bench/gemm_libs) splits a product exactly as the RAL does.
#ifndef DISC_TF_CC_RAL_GEMM_SPLIT_H_
#define DISC_TF_CC_RAL_GEMM_SPLIT_H_

#include <stdint.h>

#include <algorithm>

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
};

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

// Row blocks of a prepacked product (AVX2, see ChoosePrepackedSplit): about this
// many rows each, when packed B holds at most kRowBlockMaxPackedFloats.
constexpr int64_t kRowBlockRows = 48;
constexpr double kRowBlockMaxPackedFloats = 640.0 * 1024;

// The split of a product whose B is packed already: no block packs
// anything, so rows cost nothing to cut. Up to two blocks per thread (of at
// least kMinBlockWork multiply-adds each) let the threads that start first
// take the blocks of one that starts late (1, 2, 4 or 8 per thread measured
// the same within noise on the keras_encoder shapes).
//
// With row_block > 0 (the RAL passes kRowBlockRows on AVX2), a product of at
// least threads * row_block rows whose packed B is at most
// kRowBlockMaxPackedFloats is instead cut by rows only, into blocks of about
// row_block rows (threads * ceil(m / (threads * row_block)) asked for; rows
// rounded up to whole 6-row tiles, which may leave a block or two fewer): each block's C (48 x 512 floats:
// 96 KiB) is still in L2 when its epilogue runs, and a thread slowed by other
// work leaves many small blocks to the others. Measured on Zen 3 (AVX2, 2
// threads, bias + ReLU per block, interleaved rounds; bench/GEMM.md): 1.23x
// at 2048 x 64 x 512, 1.12-1.22x at k x n = 256 x 1024 and 256 x 256, 1.04x
// at 768 x 768; with a larger B (3072 x 768: 9 MiB re-read from L3 by every
// block) it lost 9%, hence the bound.
constexpr double kMinBlockWork = 1 << 20;
inline GemmSplit ChoosePrepackedSplit(int64_t m, int64_t n, int64_t k, int64_t threads,
                                      bool full_rows, int64_t row_block = 0) {
  GemmSplit split;
  split.row_align = 6;  // whole register tiles of every ISA's GEMM block
  if (row_block > 0 && threads > 1 && m >= threads * row_block &&
      static_cast<double>(k) * n <= kRowBlockMaxPackedFloats) {
    split.row_blocks = threads * ((m + threads * row_block - 1) / (threads * row_block));
    return split;
  }
  const double work = static_cast<double>(m) * n * k;
  const int64_t want = std::max<int64_t>(
      threads, std::min<int64_t>(2 * threads, static_cast<int64_t>(work / kMinBlockWork)));
  split.col_blocks = full_rows ? 1 : std::max<int64_t>(1, std::min(want, n / 64));
  const int64_t rows_wanted = (want + split.col_blocks - 1) / split.col_blocks;
  split.row_blocks = std::max<int64_t>(1, std::min(rows_wanted, m / 6));
  return split;
}

}  // namespace disc_tf

#endif  // DISC_TF_CC_RAL_GEMM_SPLIT_H_
