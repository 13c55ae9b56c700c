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

#include <stdint.h>

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

}  // namespace

extern "C" void DISC_GEMM_FN(int64_t m, int64_t n, int64_t k, const float* a,
                             int64_t lda, int ta, const float* b, int64_t ldb,
                             int tb, float* c, int64_t ldc, int accumulate) {
  if (m <= 0 || n <= 0) return;
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
