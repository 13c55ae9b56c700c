/* disc_ral_cuda.h -- the CUDA side of the runtime abstraction layer.
 *
 * A CUDA artifact is a host shared object (built by the C++ compiler, no CUDA
 * headers, no CUDA libraries) that carries its device code as a fatbin (sm_80
 * and sm_90 SASS plus compute_90 PTX). Its host runner computes shapes and
 * launches kernels; every GPU service is a function pointer of the table
 * below, which the embedder fills (TF: its GPU stream, allocator and a cuBLAS
 * handle bound to that stream; see disc_ral_cuda_impl.h).
 *
 * The `base` table keeps its meaning with one difference: input data,
 * alloc_output and alloc_temp are *device* memory. Temps are released
 * stream-ordered (free_temp may be called while a kernel that reads the temp
 * is still queued: the allocator must only reuse it for work on the same
 * stream, as TF's GPU allocator does). parallel_for and sgemm_batched are not
 * used and may be NULL.
 *
 * An artifact exports, with C linkage (and deliberately no `disc_entry`, so a
 * CPU-only host refuses it when resolving symbols instead of running it):
 *   int32_t disc_abi_version(void);            DISC_RAL_ABI_VERSION
 *   int32_t disc_cuda_abi_version(void);       DISC_RAL_CUDA_ABI_VERSION
 *   int32_t disc_num_kernels(void);            planned kernels
 *   const char* disc_target(void);             "cuda"
 *   const unsigned char disc_cuda_fatbin[];    device code (cuModuleLoadData)
 *   uint64_t disc_cuda_fatbin_size(void);
 *   int32_t disc_cuda_num_functions(void);     __global__ functions, in the
 *   const char* disc_cuda_function_name(int32_t i);  order `launch` indexes
 *   int32_t disc_cuda_entry(disc_ral_cuda* ral);     runs the cluster once:
 *       queues its work on ral->stream and returns without waiting for it; 0
 *       on success, otherwise an error was set with base.set_error.
 */
#ifndef DISC_RAL_CUDA_H_
#define DISC_RAL_CUDA_H_

#include <stdint.h>

#include "disc_ral.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DISC_RAL_CUDA_ABI_VERSION 2

typedef struct disc_ral_cuda disc_ral_cuda;

struct disc_ral_cuda {
  disc_ral base; /* first member: a disc_ral_cuda* is a valid disc_ral* */
  int32_t cuda_abi_version; /* DISC_RAL_CUDA_ABI_VERSION of the host */

  /* The host's stream (a CUstream); every launch and GEMM is queued on it. */
  void* stream;
  /* Owned by the RAL implementation (e.g. the artifact's loaded module);
   * generated code never reads it. */
  void* impl;

  /* Launches device function `function` (an index into the artifact's
   * disc_cuda_function_name list) with a 1-D grid on the stream; `params` as
   * cuLaunchKernel's kernelParams. Returns 0, or non-zero with an error set. */
  int32_t (*launch)(disc_ral_cuda* ral, int32_t function, uint32_t grid,
                    uint32_t block, uint32_t shared_bytes, void** params);

  /* Device address of the `__device__` global `name` of the artifact's device
   * code (constant tensors). NULL with an error set if absent. */
  void* (*device_global)(disc_ral_cuda* ral, const char* name);

  /* Batched GEMM on the stream, row-major, beta = 0, the same contract as
   * disc_ral.sgemm_batched (strides and leading dims in elements) for a, b and
   * c of element type `dtype` (DISC_F32, DISC_F16 or DISC_BF16; accumulation
   * in fp32). Returns 0, or non-zero with an error set. */
  int32_t (*gemm_batched)(disc_ral_cuda* ral, int32_t dtype, int64_t batch,
                          int64_t m, int64_t n, int64_t k, const void* a,
                          int64_t lda, int64_t stride_a, int32_t transpose_a,
                          const void* b, int64_t ldb, int64_t stride_b,
                          int32_t transpose_b, void* c, int64_t ldc,
                          int64_t stride_c);

  /* Sets `bytes` bytes at device address `ptr` to zero on the stream. */
  int32_t (*memset_zero)(disc_ral_cuda* ral, void* ptr, int64_t bytes);

  /* ---- ABI 2: what a loop cluster's runner needs (lists, constants, its condition). */
  /* Copies `bytes` from device `src` to device `dst` on the stream. */
  int32_t (*copy)(disc_ral_cuda* ral, void* dst, const void* src, int64_t bytes);
  /* Copies `bytes` from host `src` to device `dst` on the stream; `src` stays valid
   * (static data of the artifact). */
  int32_t (*upload)(disc_ral_cuda* ral, void* dst, const void* src, int64_t bytes);
  /* Copies `bytes` from device `src` to host `dst` once the stream's work so far is
   * done, and waits for it: the one service that synchronises (a loop's condition,
   * a list index computed on the device). */
  int32_t (*download)(disc_ral_cuda* ral, void* dst, const void* src, int64_t bytes);
};

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DISC_RAL_CUDA_H_ */
