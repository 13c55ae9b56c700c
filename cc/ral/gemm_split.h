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

// The split of a product whose B is packed already: no block packs
// anything, so rows cost nothing to cut. Up to two blocks per thread (of at
// least kMinBlockWork multiply-adds each) let the threads that start first
// take the blocks of one that starts late (1, 2, 4 or 8 per thread measured
// the same within noise on the keras_encoder shapes).
constexpr double kMinBlockWork = 1 << 20;
inline GemmSplit ChoosePrepackedSplit(int64_t m, int64_t n, int64_t k, int64_t threads,
                               bool full_rows) {
  const double work = static_cast<double>(m) * n * k;
  const int64_t want = std::max<int64_t>(
      threads, std::min<int64_t>(2 * threads, static_cast<int64_t>(work / kMinBlockWork)));
  GemmSplit split;
  split.col_blocks = full_rows ? 1 : std::max<int64_t>(1, std::min(want, n / 64));
  const int64_t rows_wanted = (want + split.col_blocks - 1) / split.col_blocks;
  split.row_blocks = std::max<int64_t>(1, std::min(rows_wanted, m / 6));
  split.row_align = 6;  // whole register tiles of every ISA's GEMM block
  return split;
}

}  // namespace disc_tf

#endif  // DISC_TF_CC_RAL_GEMM_SPLIT_H_
