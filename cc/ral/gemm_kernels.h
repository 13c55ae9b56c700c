// gemm_kernels.h -- single-threaded float GEMM blocks built for one ISA each.
//
// Each function computes, row-major with beta = 0,
//   C[m x n] = op(A) * op(B)
// where op(A) is A ([m x k], row stride lda) or, if ta, the transpose of A
// ([k x m], row stride lda); likewise op(B) from B ([k x n] or, if tb,
// [n x k], row stride ldb); C has row stride ldc. k == 0 writes zeros. With
// accumulate, C += op(A) * op(B) instead (k == 0 leaves C as it is).
//
// The implementations live in gemm_kernel_<isa>.cc, each compiled only with
// its ISA's flags, with Eigen in a private namespace so no template
// instantiation is shared with code built for the baseline ISA. Callers must
// check the CPU before calling one (see disc_ral_tf.cc).
#ifndef DISC_TF_CC_RAL_GEMM_KERNELS_H_
#define DISC_TF_CC_RAL_GEMM_KERNELS_H_

#include <stdint.h>

extern "C" {

typedef void (*disc_gemm_block_fn)(int64_t m, int64_t n, int64_t k,
                                   const float* a, int64_t lda, int ta,
                                   const float* b, int64_t ldb, int tb,
                                   float* c, int64_t ldc, int accumulate);

// x86-64 with AVX2 and FMA.
void disc_gemm_block_avx2(int64_t m, int64_t n, int64_t k, const float* a,
                          int64_t lda, int ta, const float* b, int64_t ldb,
                          int tb, float* c, int64_t ldc, int accumulate);

// x86-64 with AVX-512 F/CD/BW/DQ/VL (and AVX2, FMA).
void disc_gemm_block_avx512(int64_t m, int64_t n, int64_t k, const float* a,
                            int64_t lda, int ta, const float* b, int64_t ldb,
                            int tb, float* c, int64_t ldc, int accumulate);

}  // extern "C"

#endif  // DISC_TF_CC_RAL_GEMM_KERNELS_H_
