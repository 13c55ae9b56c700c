// cublas_emu.h -- a stand-in for cublasGemmStridedBatchedEx on the CPU, for
// the CUDA emulator. It takes the real function's arguments with their real
// meaning -- column-major operands, leading dimensions, transposes, strided
// batches, alpha/beta, data and compute types -- and rejects what cuBLAS
// rejects, so that a wrong mapping from the plan to the library call gives a
// wrong answer or an error here, as it would on a GPU.
#ifndef DISC_CUBLAS_EMU_H_
#define DISC_CUBLAS_EMU_H_

#include <cstdint>
#include <cstring>

#include "cublas_gemm.h"

namespace disc_emu {

inline float LoadElement(const void* base, int type, long long i) {
  if (type == disc_cuda::kCudaR32F) return static_cast<const float*>(base)[i];
  if (type == disc_cuda::kCudaR16F) {
    return static_cast<float>(static_cast<const _Float16*>(base)[i]);
  }
  const uint32_t u = static_cast<uint32_t>(static_cast<const uint16_t*>(base)[i]) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline void StoreElement(void* base, int type, long long i, float v) {
  if (type == disc_cuda::kCudaR32F) {
    static_cast<float*>(base)[i] = v;
  } else if (type == disc_cuda::kCudaR16F) {
    static_cast<_Float16*>(base)[i] = static_cast<_Float16>(v);
  } else {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    const uint16_t bits = v != v ? static_cast<uint16_t>((u >> 16) | 0x40)
                                 : static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
    static_cast<uint16_t*>(base)[i] = bits;
  }
}

// A float as the tensor cores take it under CUBLAS_COMPUTE_32F_FAST_TF32: its
// mantissa rounded to 10 bits, to nearest with ties away from zero (cvt.rna.tf32.f32).
inline float RoundToTF32(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  if ((u & 0x7F800000u) != 0x7F800000u) u = (u + 0x1000u) & ~0x1FFFu;  // not inf or NaN
  std::memcpy(&v, &u, 4);
  return v;
}

// C_q = alpha op(A_q) op(B_q) + beta C_q for q < batch, column-major:
// element (i, j) of an [rows x cols] matrix X is X[i + j * ldx]; op(A) is
// [m x k] (A stored [m x k], or [k x m] with transa = T); op(B) is [k x n].
// beta == 0 does not read C. With CUBLAS_COMPUTE_32F_FAST_TF32 (float operands only)
// A and B are rounded to TF32 first. Returns a cuBLAS status.
inline int GemmStridedBatchedEx(void* handle, int transa, int transb, int m, int n, int k,
                                const void* alpha, const void* a, int a_type, int lda,
                                long long stride_a, const void* b, int b_type, int ldb,
                                long long stride_b, const void* beta, void* c, int c_type,
                                int ldc, long long stride_c, int batch, int compute_type,
                                int algo) {
  using namespace disc_cuda;
  auto is_op = [](int op) { return op == kCublasOpN || op == kCublasOpT; };
  if (handle == nullptr || !is_op(transa) || !is_op(transb) || m < 0 || n < 0 || k < 0 ||
      batch < 0 || alpha == nullptr || beta == nullptr) {
    return kCublasStatusInvalidValue;
  }
  const int a_rows = transa == kCublasOpN ? m : k, b_rows = transb == kCublasOpN ? k : n;
  if (lda < (a_rows > 1 ? a_rows : 1) || ldb < (b_rows > 1 ? b_rows : 1) ||
      ldc < (m > 1 ? m : 1)) {
    return kCublasStatusInvalidValue;
  }
  const bool type_ok = a_type == b_type && b_type == c_type &&
                       (a_type == kCudaR32F || a_type == kCudaR16F || a_type == kCudaR16BF);
  const bool tf32 = compute_type == kCublasCompute32FFastTF32;
  if (!type_ok || (compute_type != kCublasCompute32F && !(tf32 && a_type == kCudaR32F)) ||
      algo != kCublasGemmDefault) {
    return kCublasStatusNotSupported;
  }
  auto operand = [tf32](const void* x, int type, long long i) {
    const float v = LoadElement(x, type, i);
    return tf32 ? RoundToTF32(v) : v;
  };
  if (m == 0 || n == 0 || batch == 0) return kCublasStatusSuccess;
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  for (int q = 0; q < batch; ++q) {
    for (int j = 0; j < n; ++j) {
      for (int i = 0; i < m; ++i) {
        float acc = 0.0f;
        for (int p = 0; p < k; ++p) {
          const long long ai = transa == kCublasOpN ? i + static_cast<long long>(p) * lda
                                                    : p + static_cast<long long>(i) * lda;
          const long long bi = transb == kCublasOpN ? p + static_cast<long long>(j) * ldb
                                                    : j + static_cast<long long>(p) * ldb;
          acc += operand(a, a_type, q * stride_a + ai) * operand(b, b_type, q * stride_b + bi);
        }
        const long long ci = q * stride_c + i + static_cast<long long>(j) * ldc;
        const float old = be == 0.0f ? 0.0f : be * LoadElement(c, c_type, ci);
        StoreElement(c, c_type, ci, al * acc + old);
      }
    }
  }
  return kCublasStatusSuccess;
}

}  // namespace disc_emu

#endif  // DISC_CUBLAS_EMU_H_
