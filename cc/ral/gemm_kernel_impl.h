// gemm_kernel_impl.h -- the body of one ISA variant of the GEMM block.
//
// Included by exactly one translation unit per ISA, which defines
// DISC_GEMM_FN (the exported name) and DISC_GEMM_EIGEN (a namespace name
// for this TU's private copy of Eigen) first, and includes nothing else.
// Renaming Eigen's namespace keeps this TU's inline functions and template
// instantiations (compiled for the TU's ISA) from being merged with the
// baseline build's by the linker.
#ifndef DISC_TF_CC_RAL_GEMM_KERNEL_IMPL_H_
#define DISC_TF_CC_RAL_GEMM_KERNEL_IMPL_H_

#if !defined(DISC_GEMM_FN) || !defined(DISC_GEMM_EIGEN)
#error "define DISC_GEMM_FN and DISC_GEMM_EIGEN before including this file"
#endif

#include <immintrin.h>
#include <stdint.h>

#include <algorithm>

#include "cc/ral/gemm_kernels.h"

#define Eigen DISC_GEMM_EIGEN
#include "Eigen/Core"
#undef Eigen

namespace {

namespace E = DISC_GEMM_EIGEN;
using RowMajorMatrix = E::Matrix<float, E::Dynamic, E::Dynamic, E::RowMajor>;
using ConstMap = E::Map<const RowMajorMatrix, 0, E::OuterStride<>>;
using MutableMap = E::Map<RowMajorMatrix, 0, E::OuterStride<>>;

// C = lhs * rhs, or C += lhs * rhs.
template <typename Lhs, typename Rhs>
void Product(MutableMap& C, const Lhs& lhs, const Rhs& rhs, int accumulate) {
  if (accumulate) {
    C.noalias() += lhs * rhs;
  } else {
    C.noalias() = lhs * rhs;
  }
}

// ---- Few rows: B streamed as stored, no packing.
//
// Eigen packs a panel of B for every call; when the block has few rows that
// copy costs about as much as the product (m = 16, k = n = 768: the packing
// reads and writes 2.3 MB for 19 MFLOP). With few rows, each tile of C
// (kRows x kVecs vectors) is kept in registers while k rows of B stream
// through: B is read once from memory per column panel and from cache for
// each further tile of rows.
#if defined(__AVX512F__)
using Vec = __m512;
constexpr int kLanes = 16, kRows = 6, kVecs = 4;  // 24 accumulators of 32 registers
inline Vec Load(const float* p) { return _mm512_loadu_ps(p); }
inline void Store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec Splat(float x) { return _mm512_set1_ps(x); }
inline Vec Zero() { return _mm512_setzero_ps(); }
inline Vec MulAdd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
#else
using Vec = __m256;
constexpr int kLanes = 8, kRows = 6, kVecs = 2;  // 12 accumulators of 16 registers
inline Vec Load(const float* p) { return _mm256_loadu_ps(p); }
inline void Store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec Splat(float x) { return _mm256_set1_ps(x); }
inline Vec Zero() { return _mm256_setzero_ps(); }
inline Vec MulAdd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
#endif
constexpr int64_t kPanel = kLanes * kVecs;  // columns of one tile

// Blocks with at most this many rows take the streamed path (measured: see
// docs/architecture.md, "GEMM").
constexpr int64_t kStreamedMaxRows = 96;

// C[0:R, 0:kPanel] (+)= A[0:R, 0:k] * B[0:k, 0:kPanel], all row-major.
template <int R>
inline void StreamedTile(int64_t k, const float* a, int64_t lda, const float* b,
                         int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  Vec acc[R][kVecs];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < kVecs; ++v)
      acc[r][v] = accumulate ? Load(c + r * ldc + v * kLanes) : Zero();
  for (int64_t p = 0; p < k; ++p) {
    const float* row = b + p * ldb;
    Vec bv[kVecs];
    for (int v = 0; v < kVecs; ++v) bv[v] = Load(row + v * kLanes);
    for (int r = 0; r < R; ++r) {
      const Vec av = Splat(a[r * lda + p]);
      for (int v = 0; v < kVecs; ++v) acc[r][v] = MulAdd(av, bv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < kVecs; ++v) Store(c + r * ldc + v * kLanes, acc[r][v]);
}

// Rows [i, m) of one column panel, kRows at a time, then the remainder.
inline void StreamedPanel(int64_t m, int64_t k, const float* a, int64_t lda,
                          const float* b, int64_t ldb, float* c, int64_t ldc,
                          bool accumulate) {
  int64_t i = 0;
  for (; i + kRows <= m; i += kRows)
    StreamedTile<kRows>(k, a + i * lda, lda, b, ldb, c + i * ldc, ldc, accumulate);
  const float* ai = a + i * lda;
  float* ci = c + i * ldc;
  switch (m - i) {
    case 1: StreamedTile<1>(k, ai, lda, b, ldb, ci, ldc, accumulate); break;
    case 2: StreamedTile<2>(k, ai, lda, b, ldb, ci, ldc, accumulate); break;
    case 3: StreamedTile<3>(k, ai, lda, b, ldb, ci, ldc, accumulate); break;
    case 4: StreamedTile<4>(k, ai, lda, b, ldb, ci, ldc, accumulate); break;
    case 5: StreamedTile<5>(k, ai, lda, b, ldb, ci, ldc, accumulate); break;
    default: break;
  }
  static_assert(kRows == 6, "the remainder cases above cover 1 .. kRows - 1 rows");
}

// Rows of B per pass over a panel: kDepth x kPanel floats (64 KiB with AVX-512)
// stay in L2 while every tile of rows reads them.
constexpr int64_t kDepth = 256;

// The whole panels of C = A * B (no transposes); returns the columns done.
inline int64_t StreamedGemm(int64_t m, int64_t n, int64_t k, const float* a,
                            int64_t lda, const float* b, int64_t ldb, float* c,
                            int64_t ldc, bool accumulate) {
  const int64_t done = n / kPanel * kPanel;
  for (int64_t j = 0; j < done; j += kPanel) {
    for (int64_t p = 0; p < k; p += kDepth) {
      StreamedPanel(m, std::min(kDepth, k - p), a + p, lda, b + p * ldb + j, ldb, c + j,
                    ldc, accumulate || p > 0);
    }
  }
  return done;
}

}  // namespace

extern "C" void DISC_GEMM_FN(int64_t m, int64_t n, int64_t k, const float* a,
                             int64_t lda, int ta, const float* b, int64_t ldb,
                             int tb, float* c, int64_t ldc, int accumulate) {
  if (m <= 0 || n <= 0) return;
  if (!ta && !tb && k > 0 && m <= kStreamedMaxRows && n >= kPanel) {
    const int64_t done = StreamedGemm(m, n, k, a, lda, b, ldb, c, ldc, accumulate != 0);
    if (done == n) return;
    b += done;  // the last, partial panel through Eigen
    c += done;
    n -= done;
  }
  MutableMap C(c, m, n, E::OuterStride<>(ldc));
  if (k <= 0) {
    if (!accumulate) C.setZero();
    return;
  }
  // op(A) and op(B) as (possibly transposed) views: Eigen's GEMM reads a
  // transposed operand in place, no copy is made.
  if (!ta) {
    ConstMap A(a, m, k, E::OuterStride<>(lda));
    if (!tb) {
      Product(C, A, ConstMap(b, k, n, E::OuterStride<>(ldb)), accumulate);
    } else {
      Product(C, A, ConstMap(b, n, k, E::OuterStride<>(ldb)).transpose(), accumulate);
    }
  } else {
    ConstMap At(a, k, m, E::OuterStride<>(lda));
    if (!tb) {
      Product(C, At.transpose(), ConstMap(b, k, n, E::OuterStride<>(ldb)), accumulate);
    } else {
      Product(C, At.transpose(), ConstMap(b, n, k, E::OuterStride<>(ldb)).transpose(),
              accumulate);
    }
  }
}

#endif  // DISC_TF_CC_RAL_GEMM_KERNEL_IMPL_H_
