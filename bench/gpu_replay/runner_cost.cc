// runner_cost.cc -- the host cost of a CUDA artifact's generated runner alone.
//
// Calls the artifact's disc_cuda_entry with a disc_ral_cuda whose GPU services do
// nothing but count (launches, GEMMs, allocations): no GPU is needed, and what is
// timed is the runner's own shape arithmetic and dispatch. Set against the host time
// of a call on a GPU (bench/gpu_replay/check.py), it splits that time between the
// runner and the driver, cuBLAS and the allocator.
//
//   runner_cost ARTIFACT CALLS NUM_OUTPUTS DTYPE:D0,D1,... (one per input)
// prints: us_per_call launches gemms allocations
#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "disc_ral_cuda.h"

namespace {

struct Input {
  int32_t dtype = 0;
  std::vector<int64_t> dims;
};
std::vector<Input> inputs;
int launches = 0, gemms = 0, allocations = 0;
alignas(64) char scratch[1 << 16];  // every "device" pointer: never read or written

int32_t Rank(disc_ral*, int32_t i) { return static_cast<int32_t>(inputs[i].dims.size()); }
const int64_t* Dims(disc_ral*, int32_t i) { return inputs[i].dims.data(); }
int32_t Dtype(disc_ral*, int32_t i) { return inputs[i].dtype; }
const void* Data(disc_ral*, int32_t) { return scratch; }
void* Output(disc_ral*, int32_t, int32_t, const int64_t*) { return ++allocations, scratch; }
void* Temp(disc_ral*, int64_t) { return ++allocations, scratch; }
void Free(disc_ral*, void*) {}
void Error(disc_ral*, int32_t code, const char* message) {
  std::fprintf(stderr, "error %d: %s\n", code, message);
}
int32_t Launch(disc_ral_cuda*, int32_t, uint32_t, uint32_t, uint32_t, void**) {
  return ++launches, 0;
}
void* Global(disc_ral_cuda*, const char*) { return scratch; }
int32_t Gemm(disc_ral_cuda*, int32_t, int64_t, int64_t, int64_t, int64_t, const void*, int64_t,
             int64_t, int32_t, const void*, int64_t, int64_t, int32_t, void*, int64_t, int64_t) {
  return ++gemms, 0;
}
int32_t Memset(disc_ral_cuda*, void*, int64_t) { return 0; }
int32_t Copy(disc_ral_cuda*, void*, const void*, int64_t) { return 0; }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) return std::fprintf(stderr, "usage: see runner_cost.cc\n"), 2;
  void* lib = ::dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  auto entry = lib ? reinterpret_cast<int32_t (*)(disc_ral_cuda*)>(::dlsym(lib, "disc_cuda_entry"))
                   : nullptr;
  if (entry == nullptr) return std::fprintf(stderr, "not a CUDA artifact: %s\n", argv[1]), 2;
  const int calls = std::atoi(argv[2]);
  for (int i = 4; i < argc; ++i) {
    Input in;
    char* s = argv[i];
    in.dtype = static_cast<int32_t>(std::strtol(s, &s, 10));
    while (*s == ':' || *s == ',') {
      ++s;
      if (*s) in.dims.push_back(std::strtoll(s, &s, 10));
    }
    inputs.push_back(in);
  }
  disc_ral_cuda cu{};
  disc_ral& base = cu.base;
  base.abi_version = DISC_RAL_ABI_VERSION;
  base.num_inputs = static_cast<int32_t>(inputs.size());
  base.num_outputs = std::atoi(argv[3]);
  base.input_rank = Rank;
  base.input_dims = Dims;
  base.input_dtype = Dtype;
  base.input_data = Data;
  base.alloc_output = Output;
  base.alloc_temp = Temp;
  base.free_temp = Free;
  base.set_error = Error;
  cu.cuda_abi_version = DISC_RAL_CUDA_ABI_VERSION;
  cu.launch = Launch;
  cu.device_global = Global;
  cu.gemm_batched = Gemm;
  cu.memset_zero = Memset;
  cu.copy = cu.upload = cu.download = Copy;
  if (entry(&cu) != 0) return 1;
  const int per_call[3] = {launches, gemms, allocations};
  const auto start = std::chrono::steady_clock::now();
  for (int c = 0; c < calls; ++c) entry(&cu);
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  std::printf("%.3f %d %d %d\n", us / (calls > 0 ? calls : 1), per_call[0], per_call[1],
              per_call[2]);
  return 0;
}
