// Hand-written kernels that exercise the CUDA emulator's semantics (warp
// collectives, barriers, launch checks, shared memory) and the row-major ->
// cuBLAS mapping with the cuBLAS stand-in; driven by test_cuda_emulator.py
// through ctypes. Compiled with -include cuda_emulator.h and linked with the launch
// loop (emu_runtime.o), as artifacts are.
#include <cstring>

#include "cublas_emu.h"
#include "cublas_gemm.h"

namespace {

struct Out {
  int* data;
  int arg;
};

__global__ void Shuffles(const Out o) {
  const int t = threadIdx.x, width = o.arg;
  int* d = o.data + 4 * t;
  d[0] = __shfl_xor_sync(0xffffffffu, t, 3, width);
  d[1] = __shfl_down_sync(0xffffffffu, t, 3, width);
  d[2] = __shfl_up_sync(0xffffffffu, t, 3, width);
  d[3] = __shfl_sync(0xffffffffu, t, 5, width);
}

__global__ void Votes(const Out o) {
  const int t = threadIdx.x;
  const unsigned ballot = __ballot_sync(0xffffffffu, t % 3 == 0);
  const int any = __any_sync(0xffffffffu, t == 40);
  const int all = __all_sync(0xffffffffu, t < 48);
  // Half-warp masks: two independent collectives in one warp.
  const unsigned half = (t % 32) < 16 ? 0x0000ffffu : 0xffff0000u;
  const int sum = __shfl_xor_sync(half, t, 8);
  if (t % 32 == 0) {
    o.data[(t / 32) * 3] = static_cast<int>(ballot);
    o.data[(t / 32) * 3 + 1] = any;
    o.data[(t / 32) * 3 + 2] = all;
  }
  o.data[64 + t] = sum;
}

__global__ void DivergentSync(const Out o) {
  if (threadIdx.x % 2 == 0) __syncthreads();
  o.data[threadIdx.x] = 1;
}

__global__ void ExitedLane(const Out o) {
  if (threadIdx.x == 7) return;
  o.data[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);
}

__global__ void MismatchedCollectives(const Out o) {
  if (threadIdx.x == 3) {
    o.data[0] = __ballot_sync(0xffffffffu, 1);
  } else {
    o.data[1] = __shfl_xor_sync(0xffffffffu, 1, 1);
  }
}

__global__ void DynamicShared(const Out o) {
  DISC_DYNAMIC_SMEM(smem);
  float* f = reinterpret_cast<float*>(smem);
  const float before = f[threadIdx.x];
  __syncthreads();
  f[threadIdx.x] = static_cast<float>(threadIdx.x);
  __syncthreads();
  o.data[blockIdx.x * blockDim.x + threadIdx.x] =
      (before != before ? 1000 : 0) + static_cast<int>(f[blockDim.x - 1 - threadIdx.x]);
}

// Sum of each block's elements: shared memory tree, then a warp's shuffles.
__global__ void BlockSums(const Out o) {
  __shared__ int partial[256];
  const int t = threadIdx.x;
  partial[t] = o.data[blockIdx.x * blockDim.x + t];
  __syncthreads();
  for (int s = blockDim.x / 2; s >= 32; s /= 2) {
    if (t < s) partial[t] += partial[t + s];
    __syncthreads();
  }
  if (t < 32) {
    int v = partial[t];
    for (int m = 16; m; m /= 2) v += __shfl_xor_sync(0xffffffffu, v, m);
    if (t == 0) o.data[o.arg + blockIdx.x] = v;
  }
}

__global__ void DividesByZero(const Out o) {
  o.data[threadIdx.x] = 100 / (o.arg - static_cast<int>(threadIdx.x));  // thread `arg`: 100 / 0
}

__global__ void DivisionOverflows(const Out o) {
  o.data[threadIdx.x] = o.arg / (threadIdx.x == 3 ? -1 : 1);  // arg = INT_MIN: thread 3 overflows
}

template <typename Args>
int Report(void (*kernel)(Args), unsigned grid, unsigned block, unsigned shared, Args args,
           char* error, int error_size) {
  void* params[] = {&args};
  return disc_emu::Launch(kernel, grid, block, shared, params, error, error_size) ? 0 : 1;
}

}  // namespace

extern "C" {

int emu_shuffles(int* out, int width, char* e, int n) {
  return Report(&Shuffles, 1, 64, 0, Out{out, width}, e, n);
}
int emu_votes(int* out, char* e, int n) { return Report(&Votes, 1, 64, 0, Out{out, 0}, e, n); }
int emu_divergent_sync(int* out, char* e, int n) {
  return Report(&DivergentSync, 1, 64, 0, Out{out, 0}, e, n);
}
int emu_exited_lane(int* out, char* e, int n) {
  return Report(&ExitedLane, 1, 32, 0, Out{out, 0}, e, n);
}
int emu_mismatched(int* out, char* e, int n) {
  return Report(&MismatchedCollectives, 1, 32, 0, Out{out, 0}, e, n);
}
int emu_dynamic_shared(int* out, unsigned grid, unsigned block, unsigned shared, char* e, int n) {
  return Report(&DynamicShared, grid, block, shared, Out{out, 0}, e, n);
}
int emu_divide_by_zero(int* out, int zero_at, char* e, int n) {
  return Report(&DividesByZero, 1, 32, 0, Out{out, zero_at}, e, n);
}
int emu_division_overflow(int* out, int numerator, char* e, int n) {
  return Report(&DivisionOverflows, 1, 32, 0, Out{out, numerator}, e, n);
}
int emu_block_sums(int* data, int blocks, char* e, int n) {
  return Report(&BlockSums, static_cast<unsigned>(blocks), 256, 0, Out{data, blocks * 256}, e, n);
}

// Row-major C[batch][m x n] = op(A) op(B), through the mapping the CUDA RAL uses
// (float operands rounded to TF32 with allow_tf32, as the RAL asks when TF allows it).
int emu_row_major_gemm_tf32(int dtype, long batch, long m, long n, long k, const void* a,
                            long lda, long sa, int ta, const void* b, long ldb, long sb, int tb,
                            void* c, long ldc, long sc, int allow_tf32) {
  disc_cuda::CublasGemm call{};
  if (disc_cuda::MapRowMajorGemm(dtype, batch, m, n, k, a, lda, sa, ta, b, ldb, sb, tb, c, ldc,
                                 sc, &call) != nullptr) {
    return -1;
  }
  static int handle;
  return disc_cuda::CallCublas(&disc_emu::GemmStridedBatchedEx, &handle, call, allow_tf32 != 0);
}
// Zeroes C of a k == 0 product as both CUDA RALs do (disc_cuda::ZeroGemmOutput);
// returns how many contiguous runs it cleared, or -1 on a failure.
int emu_zero_gemm_output(int dtype, long batch, long m, long n, void* c, long ldc, long sc) {
  int runs = 0;
  auto zero = [&runs](void* p, int64_t bytes) {
    std::memset(p, 0, static_cast<size_t>(bytes));
    ++runs;
    return 0;
  };
  return disc_cuda::ZeroGemmOutput(dtype, batch, m, n, c, ldc, sc, zero) == 0 ? runs : -1;
}
int emu_row_major_gemm(int dtype, long batch, long m, long n, long k, const void* a, long lda,
                       long sa, int ta, const void* b, long ldb, long sb, int tb, void* c,
                       long ldc, long sc) {
  return emu_row_major_gemm_tf32(dtype, batch, m, n, k, a, lda, sa, ta, b, ldb, sb, tb, c, ldc,
                                 sc, 0);
}

}  // extern "C"
