// gemm_kernels.h -- single-threaded float GEMM blocks built for one ISA each.
//
// disc_gemm_block_<isa> computes, row-major,
//   C[m x n] = op(A) * op(B)
// where op(A) is A ([m x k], row stride lda) or, if ta, the transpose of A
// ([k x m], row stride lda); likewise op(B) from B ([k x n] or, if tb,
// [n x k], row stride ldb); C has row stride ldc. k == 0 writes zeros. With
// accumulate, C += op(A) * op(B) instead (k == 0 leaves C as it is).
//
// op(B) can also be packed once (disc_gemm_pack_b_<isa>, into
// disc_gemm_packed_size_<isa>(k, n) floats) and reused by any number of
// disc_gemm_prepacked_block_<isa> calls: one of those computes the columns
// [j0, j0 + n) of C from the packed panels starting at
// packed + j0 * k, where j0 must be a multiple of disc_gemm_panel_<isa>()
// (the packed block's n may be any count up to the end of op(B)).
// disc_gemm_prepacked_block_<isa> prefetches the packed B it reads next (a
// model's weights come from L3 or memory on every call);
// disc_gemm_prepacked_block_resident_<isa> computes the same without those
// prefetches, for a B that stays in L2 between calls.
//
// The implementations live in gemm_kernel_<isa>.cc, each compiled only with
// its ISA's flags. Callers must check the CPU before calling one (see
// disc_ral_tf.cc).
#ifndef DISC_TF_CC_RAL_GEMM_KERNELS_H_
#define DISC_TF_CC_RAL_GEMM_KERNELS_H_

#include <stdint.h>

#include "cc/ral/disc_ral.h"

extern "C" {

typedef void (*disc_gemm_block_fn)(int64_t m, int64_t n, int64_t k,
                                   const float* a, int64_t lda, int ta,
                                   const float* b, int64_t ldb, int tb,
                                   float* c, int64_t ldc, int accumulate);
typedef int64_t (*disc_gemm_panel_fn)(void);
// disc_gemm_prepacked_block_columns_<isa>: disc_gemm_prepacked_block (accumulate
// off, with prefetches where fetch) whose last pass over k runs the column epilogue
// `e` (disc_ral.h, ABI 11) on each tile as it is stored: the result of C's column j
// of the block, row i, goes to out[i * e->cols + j]; the block's columns are C's
// from j0 on. disc_gemm_column_pass_<isa> runs the same steps over an m x n block of
// C already computed (at c, row stride ldc).
typedef void (*disc_gemm_prepacked_columns_fn)(int64_t m, int64_t n, int64_t k,
                                               const float* a, int64_t lda, int ta,
                                               const float* packed_b, float* c, int64_t ldc,
                                               const disc_column_epilogue* e, float* out,
                                               int64_t j0, int fetch);
typedef void (*disc_gemm_column_pass_fn)(int64_t m, int64_t n, const float* c, int64_t ldc,
                                         const disc_column_epilogue* e, float* out,
                                         int64_t j0);
typedef int64_t (*disc_gemm_packed_size_fn)(int64_t k, int64_t n);
typedef void (*disc_gemm_pack_b_fn)(int64_t k, int64_t n, const float* b,
                                    int64_t ldb, int tb, float* out);
typedef void (*disc_gemm_prepacked_block_fn)(int64_t m, int64_t n, int64_t k,
                                             const float* a, int64_t lda, int ta,
                                             const float* packed_b, float* c,
                                             int64_t ldc, int accumulate);

// Declares the entry points of one ISA's GEMM (suffix: its name).
#define DISC_GEMM_DECLARE(isa)                                                  \
  void disc_gemm_block_##isa(int64_t m, int64_t n, int64_t k, const float* a,   \
                             int64_t lda, int ta, const float* b, int64_t ldb,  \
                             int tb, float* c, int64_t ldc, int accumulate);    \
  int64_t disc_gemm_panel_##isa(void);                                          \
  int64_t disc_gemm_packed_size_##isa(int64_t k, int64_t n);                    \
  void disc_gemm_pack_b_##isa(int64_t k, int64_t n, const float* b,             \
                              int64_t ldb, int tb, float* out);                 \
  void disc_gemm_prepacked_block_##isa(int64_t m, int64_t n, int64_t k,         \
                                       const float* a, int64_t lda, int ta,     \
                                       const float* packed_b, float* c,         \
                                       int64_t ldc, int accumulate);            \
  void disc_gemm_prepacked_block_resident_##isa(                                \
      int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, int ta,     \
      const float* packed_b, float* c, int64_t ldc, int accumulate);            \
  void disc_gemm_prepacked_block_columns_##isa(                                 \
      int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, int ta,     \
      const float* packed_b, float* c, int64_t ldc,                             \
      const disc_column_epilogue* e, float* out, int64_t j0, int fetch);        \
  void disc_gemm_column_pass_##isa(int64_t m, int64_t n, const float* c,        \
                                   int64_t ldc, const disc_column_epilogue* e,  \
                                   float* out, int64_t j0);

DISC_GEMM_DECLARE(avx2)    // x86-64 with AVX2 and FMA
DISC_GEMM_DECLARE(avx512)  // x86-64 with AVX-512 F/CD/BW/DQ/VL (and AVX2, FMA)

}  // extern "C"

#endif  // DISC_TF_CC_RAL_GEMM_KERNELS_H_
