// disc_ral_cuda_impl.h -- runs CUDA artifacts (see disc_ral_cuda.h) on a
// CUDA stream, independent of TensorFlow.
//
// The embedder (TF's GPU DiscCluster kernel) dlopen()s an artifact, wraps it
// in a CudaArtifact, fills the `base` services of a disc_ral (inputs, outputs
// and temps in device memory, errors) and calls Run with its compute stream.
// The CUDA driver and cuBLAS are loaded with dlopen on first use, so this
// code (and the op library that contains it) links without CUDA libraries.
#ifndef DISC_RAL_CUDA_IMPL_H_
#define DISC_RAL_CUDA_IMPL_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "disc_ral_cuda.h"

namespace disc_cuda {

// A loaded CUDA artifact: its exported symbols, and its device code loaded
// into each CUDA context it runs in (once per context).
class CudaArtifact {
 public:
  // Per-context module and function handles (public for the RAL callbacks).
  struct Module {
    void* module = nullptr;           // CUmodule
    std::vector<void*> functions;     // CUfunction, by function index
    std::map<std::string, void*> globals;  // name -> CUdeviceptr
  };

  // Resolves the artifact's exports from a dlopen() handle. On failure
  // returns false and sets *error (e.g. a CPU artifact: no disc_cuda_entry).
  bool Init(void* dl_handle, std::string* error);

  // Runs the cluster once on `stream` (a CUstream of the current context):
  // queues its kernels and GEMMs and returns without waiting for them.
  // The embedder owns `ral` and has filled `ral->base` (its callbacks may
  // find the embedder's state from the disc_ral* they receive); Run fills the
  // CUDA members. Errors are reported through base.set_error and a non-zero
  // return. With allow_tf32, float GEMMs may round their operands to TF32 (what
  // TF's GPU MatMul does while tensor_float_32_execution is enabled).
  int32_t Run(disc_ral_cuda* ral, void* stream, bool allow_tf32 = false);

  // The address of device global `name` in `module` (looked up once).
  void* Global(Module* module, const char* name, std::string* error);

  Module* ModuleForCurrentContext(disc_ral* base);

 private:
  int32_t (*entry_)(disc_ral_cuda*) = nullptr;
  const unsigned char* fatbin_ = nullptr;
  std::vector<std::string> function_names_;
  std::mutex mu_;
  std::map<void*, Module> modules_;  // CUcontext -> module
};

}  // namespace disc_cuda

#endif  // DISC_RAL_CUDA_IMPL_H_
