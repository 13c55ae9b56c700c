// cublas_gemm.h -- the RAL's row-major batched GEMM (disc_ral_cuda.gemm_batched)
// as one cublasGemmStridedBatchedEx call. Shared by the CUDA RAL (real cuBLAS,
// loaded with dlopen) and the CUDA emulator (its stand-in honours cuBLAS's
// argument conventions), so the mapping the emulator tests is the one a GPU runs.
//
// Needs no CUDA header: the enum values are cuBLAS's and CUDA's own
// (cublas_api.h, library_types.h); disc_ral_cuda_impl.cc checks them against
// the real headers.
#ifndef DISC_RAL_CUBLAS_GEMM_H_
#define DISC_RAL_CUBLAS_GEMM_H_

#include <climits>
#include <cstdint>
#include <initializer_list>

#include "disc_ral_cuda.h"

namespace disc_cuda {

constexpr int kCublasOpN = 0, kCublasOpT = 1;                   // cublasOperation_t
constexpr int kCudaR32F = 0, kCudaR16F = 2, kCudaR16BF = 14;  // cudaDataType_t
constexpr int kCublasCompute32F = 68;                           // cublasComputeType_t
constexpr int kCublasCompute32FFastTF32 = 77;                   // ... inputs rounded to TF32
constexpr int kCublasGemmDefault = -1;                          // cublasGemmAlgo_t
constexpr int kCublasStatusSuccess = 0, kCublasStatusInvalidValue = 7,
              kCublasStatusNotSupported = 15;

// cublasGemmStridedBatchedEx's signature (the handle as void*).
using GemmStridedBatchedEx = int (*)(void* handle, int transa, int transb, int m, int n, int k,
                                     const void* alpha, const void* a, int a_type, int lda,
                                     long long stride_a, const void* b, int b_type, int ldb,
                                     long long stride_b, const void* beta, void* c, int c_type,
                                     int ldc, long long stride_c, int batch_count,
                                     int compute_type, int algo);

// One column-major cuBLAS call, every argument but the handle.
struct CublasGemm {
  int transa, transb, m, n, k;
  const void* a;
  int lda;
  long long stride_a;
  const void* b;
  int ldb;
  long long stride_b;
  void* c;
  int ldc;
  long long stride_c;
  int batch, type;
};

// Maps the row-major contract of gemm_batched to a cuBLAS call: row-major
// C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, so cuBLAS's "A" is B,
// its "B" is A and m, n trade places. Returns nullptr and fills *out, or the
// reason the call cannot be made (a dtype cuBLAS is not given, a size over
// INT_MAX). k == 0 is the caller's (cuBLAS would leave C untouched):
// ZeroGemmOutput.
inline const char* MapRowMajorGemm(int32_t dtype, int64_t batch, int64_t m, int64_t n,
                                   int64_t k, const void* a, int64_t lda, int64_t stride_a,
                                   int32_t transpose_a, const void* b, int64_t ldb,
                                   int64_t stride_b, int32_t transpose_b, void* c, int64_t ldc,
                                   int64_t stride_c, CublasGemm* out) {
  const int type = dtype == DISC_F32    ? kCudaR32F
                   : dtype == DISC_F16  ? kCudaR16F
                   : dtype == DISC_BF16 ? kCudaR16BF
                                        : -1;
  if (type < 0) return "GEMM: unsupported element type";
  for (int64_t v : {batch, m, n, k, lda, ldb, ldc}) {
    if (v < 0 || v > INT_MAX) return "GEMM: a dimension is negative or exceeds INT_MAX";
  }
  *out = CublasGemm{transpose_b ? kCublasOpT : kCublasOpN,
                    transpose_a ? kCublasOpT : kCublasOpN,
                    static_cast<int>(n),
                    static_cast<int>(m),
                    static_cast<int>(k),
                    b,
                    static_cast<int>(ldb),
                    stride_b,
                    a,
                    static_cast<int>(lda),
                    stride_a,
                    c,
                    static_cast<int>(ldc),
                    stride_c,
                    static_cast<int>(batch),
                    type};
  return nullptr;
}

// The compute type of a call: fp32 accumulation; with allow_tf32, float operands
// may be rounded to TF32 (10-bit mantissa) for the tensor cores, as TF's own GPU
// MatMul does while tensor_float_32_execution is enabled (its default).
inline int CublasComputeType(const CublasGemm& g, bool allow_tf32) {
  return allow_tf32 && g.type == kCudaR32F ? kCublasCompute32FFastTF32 : kCublasCompute32F;
}

// Makes the call: alpha = 1, beta = 0, fp32 accumulation. Returns cuBLAS's status.
inline int CallCublas(GemmStridedBatchedEx gemm, void* handle, const CublasGemm& g,
                      bool allow_tf32 = false) {
  const float one = 1.0f, zero = 0.0f;
  return gemm(handle, g.transa, g.transb, g.m, g.n, g.k, &one, g.a, g.type, g.lda, g.stride_a,
              g.b, g.type, g.ldb, g.stride_b, &zero, g.c, g.type, g.ldc, g.stride_c, g.batch,
              CublasComputeType(g, allow_tf32), kCublasGemmDefault);
}

// Bytes of one element of a gemm_batched dtype.
inline int64_t GemmItemSize(int32_t dtype) { return dtype == DISC_F32 ? 4 : 2; }

// C = 0 for a k == 0 product: row i of matrix q is the n elements at
// q * stride_c + i * ldc. C may be a window of a larger tensor (a GEMM that writes
// its reader's layout: ldc > n, or matrices that interleave), so zeroing
// batch * stride_c elements from c would clear what is not C and run past the
// tensor's end. Calls zero(ptr, bytes) once per contiguous run of C (once when C
// is dense or its matrices' rows interleave without gaps, once per matrix when
// its rows are dense, else once per row) and returns the first non-zero status.
template <typename Zero>
int32_t ZeroGemmOutput(int32_t dtype, int64_t batch, int64_t m, int64_t n, void* c, int64_t ldc,
                       int64_t stride_c, Zero zero) {
  if (batch <= 0 || m <= 0 || n <= 0) return 0;
  const int64_t item = GemmItemSize(dtype);
  char* const base = static_cast<char*>(c);
  const bool rows_dense = m == 1 || ldc == n;  // each matrix one run of m * n
  if (rows_dense && (batch == 1 || stride_c == m * n)) return zero(base, batch * m * n * item);
  // Row i of every matrix side by side: [i][q][n] (a GEMM per head writing [seq, heads, dim]).
  if (stride_c == n && ldc == batch * n) return zero(base, m * batch * n * item);
  for (int64_t q = 0; q < batch; ++q) {
    char* const matrix = base + q * stride_c * item;
    if (rows_dense) {
      if (const int32_t s = zero(matrix, m * n * item)) return s;
      continue;
    }
    for (int64_t i = 0; i < m; ++i) {
      if (const int32_t s = zero(matrix + i * ldc * item, n * item)) return s;
    }
  }
  return 0;
}

}  // namespace disc_cuda

#endif  // DISC_RAL_CUBLAS_GEMM_H_
