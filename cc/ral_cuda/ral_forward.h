// ral_forward.h -- a disc_ral_cuda table whose `base` services (inputs, outputs,
// temporaries, errors) are another disc_ral's: the embedder's. Used where one host
// RAL serves a CUDA artifact: TF's GPU kernel (gpu_runner.cc) and the CUDA
// emulator's CPU entry point (cc/cuda_emu/emu_ral.h). The CUDA services are the
// caller's to fill.
#ifndef DISC_RAL_FORWARD_H_
#define DISC_RAL_FORWARD_H_

#include <cstddef>
#include <cstring>

#include "disc_ral_cuda.h"

namespace disc_cuda {

struct ForwardingRal {
  disc_ral_cuda cu;  // first: the runner's disc_ral* / disc_ral_cuda* point here
  disc_ral* host;
};
static_assert(offsetof(ForwardingRal, cu) == 0 && offsetof(disc_ral_cuda, base) == 0,
              "a disc_ral* of the runner is the ForwardingRal");

namespace forward {
inline disc_ral* Host(disc_ral* r) { return reinterpret_cast<ForwardingRal*>(r)->host; }
inline int32_t InputRank(disc_ral* r, int32_t i) { return Host(r)->input_rank(Host(r), i); }
inline const int64_t* InputDims(disc_ral* r, int32_t i) { return Host(r)->input_dims(Host(r), i); }
inline int32_t InputDtype(disc_ral* r, int32_t i) { return Host(r)->input_dtype(Host(r), i); }
inline const void* InputData(disc_ral* r, int32_t i) { return Host(r)->input_data(Host(r), i); }
inline void* AllocOutput(disc_ral* r, int32_t i, int32_t rank, const int64_t* dims) {
  return Host(r)->alloc_output(Host(r), i, rank, dims);
}
inline void* AllocTemp(disc_ral* r, int64_t bytes) { return Host(r)->alloc_temp(Host(r), bytes); }
inline void FreeTemp(disc_ral* r, void* p) { Host(r)->free_temp(Host(r), p); }
inline void SetError(disc_ral* r, int32_t code, const char* message) {
  Host(r)->set_error(Host(r), code, message);
}
}  // namespace forward

// Zeroes `f` and fills its base table with services forwarding to `host`.
inline void InitForwarding(ForwardingRal* f, disc_ral* host) {
  std::memset(f, 0, sizeof(*f));
  f->host = host;
  disc_ral& base = f->cu.base;
  base.abi_version = DISC_RAL_ABI_VERSION;
  base.num_inputs = host->num_inputs;
  base.num_outputs = host->num_outputs;
  base.input_rank = forward::InputRank;
  base.input_dims = forward::InputDims;
  base.input_dtype = forward::InputDtype;
  base.input_data = forward::InputData;
  base.alloc_output = forward::AllocOutput;
  base.alloc_temp = forward::AllocTemp;
  base.free_temp = forward::FreeTemp;
  base.set_error = forward::SetError;
  f->cu.cuda_abi_version = DISC_RAL_CUDA_ABI_VERSION;
}

}  // namespace disc_cuda

#endif  // DISC_RAL_FORWARD_H_
