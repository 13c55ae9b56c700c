// emu_ral.h -- the host side of a `cuda-emu` artifact: a CPU artifact (it
// exports disc_entry, so the CPU DiscCluster kernel runs it) whose entry runs
// the CUDA host runner (disc_cuda_entry) unchanged, with a disc_ral_cuda table
// whose "device" is the CUDA emulator:
// * device memory is the CPU host's memory (inputs, outputs, temps);
// * launches run the emulated device code (its dispatch, disc_emu_launch, is
//   generated into the device translation unit) to completion: the stream is
//   in order, so a temp freed after its last reader's launch is safe;
// * GEMMs go through the same row-major -> cuBLAS mapping as on a GPU
//   (cublas_gemm.h), into the cuBLAS stand-in (cublas_emu.h).
// Included once: at the end of the host translation unit, or (prebuilt) alone
// in emu_host_runtime.cc.
#ifndef DISC_CUDA_EMU_RAL_H_
#define DISC_CUDA_EMU_RAL_H_

#include <stdint.h>
#include <stdio.h>

#include <cstddef>
#include <cstring>
#include <string>

#include "cublas_emu.h"
#include "cublas_gemm.h"
#include "disc_ral_cuda.h"
#include "ral_forward.h"

// From the device translation unit: runs function `function` of the artifact
// (kFunctions order); 0, or non-zero with the reason in error[0..error_size).
extern "C" int32_t disc_emu_launch(int32_t function, uint32_t grid, uint32_t block,
                                   uint32_t shared_bytes, void** params, char* error,
                                   uint64_t error_size);
// The address of the device global `name` (a constant tensor), or NULL.
extern "C" void* disc_emu_global(const char* name);
// From the host runner: runs the cluster once over `ral`.
extern "C" int32_t disc_cuda_entry(disc_ral_cuda* ral);

namespace disc_emu_host {

using disc_cuda::ForwardingRal;

inline disc_ral* Host(disc_ral_cuda* r) { return reinterpret_cast<ForwardingRal*>(r)->host; }

inline int32_t Fail(disc_ral_cuda* r, int32_t code, const std::string& message) {
  disc_ral* h = Host(r);
  h->set_error(h, code, message.c_str());
  return 1;
}

inline int32_t Launch(disc_ral_cuda* r, int32_t function, uint32_t grid, uint32_t block,
                      uint32_t shared_bytes, void** params) {
  char error[1024] = {0};
  if (disc_emu_launch(function, grid, block, shared_bytes, params, error, sizeof(error)) != 0) {
    return Fail(r, DISC_INTERNAL, std::string("emulated launch: ") + error);
  }
  return 0;
}

inline void* DeviceGlobal(disc_ral_cuda* r, const char* name) {
  void* p = disc_emu_global(name);
  if (p == nullptr) Fail(r, DISC_INTERNAL, std::string("device global ") + name + " not found");
  return p;
}

inline int32_t GemmBatched(disc_ral_cuda* r, int32_t dtype, int64_t batch, int64_t m, int64_t n,
                           int64_t k, const void* a, int64_t lda, int64_t stride_a,
                           int32_t transpose_a, const void* b, int64_t ldb, int64_t stride_b,
                           int32_t transpose_b, void* c, int64_t ldc, int64_t stride_c) {
  disc_cuda::CublasGemm call{};
  if (const char* why = disc_cuda::MapRowMajorGemm(dtype, batch, m, n, k, a, lda, stride_a,
                                                   transpose_a, b, ldb, stride_b, transpose_b,
                                                   c, ldc, stride_c, &call)) {
    return Fail(r, DISC_INVALID_ARGUMENT, why);
  }
  if (k == 0) {
    auto zero = [r](void* p, int64_t bytes) { return r->memset_zero(r, p, bytes); };
    return disc_cuda::ZeroGemmOutput(dtype, batch, m, n, c, ldc, stride_c, zero);
  }
  static int handle_storage;  // the stand-in only checks that a handle is given
  const int status = disc_cuda::CallCublas(&disc_emu::GemmStridedBatchedEx, &handle_storage, call);
  if (status != disc_cuda::kCublasStatusSuccess) {
    return Fail(r, DISC_INTERNAL,
                "cublasGemmStridedBatchedEx failed: status " + std::to_string(status));
  }
  return 0;
}

inline int32_t MemsetZero(disc_ral_cuda*, void* ptr, int64_t bytes) {
  if (bytes > 0) std::memset(ptr, 0, static_cast<size_t>(bytes));
  return 0;
}

// Device memory is host memory and the stream runs in order: copies are memcpy.
inline int32_t Copy(disc_ral_cuda*, void* dst, const void* src, int64_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
  return 0;
}

}  // namespace disc_emu_host

extern "C" int32_t disc_entry(disc_ral* host) {
  using namespace disc_emu_host;
  ForwardingRal call;
  disc_cuda::InitForwarding(&call, host);
  call.cu.launch = Launch;
  call.cu.device_global = DeviceGlobal;
  call.cu.gemm_batched = GemmBatched;
  call.cu.memset_zero = MemsetZero;
  call.cu.copy = Copy;
  call.cu.upload = Copy;
  call.cu.download = Copy;
  return disc_cuda_entry(&call.cu);
}

#endif  // DISC_CUDA_EMU_RAL_H_
