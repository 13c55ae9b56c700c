// A GPU-less host for CUDA artifacts, for tests: runs an artifact's host
// runner (disc_cuda_entry) with host memory standing in for device memory and
// prints every service call instead of doing it, one per line:
//   alloc_output <i> [d0,d1,...]    launch <function name> grid=<g> block=<b>
//   alloc_temp <bytes>              gemm dtype=<t> batch m n k lda sa ta ldb sb tb ldc sc
//   free_temp                       global <name>
//   error <code> <message>          rc <return code>
// Usage: cuda_mock_host ARTIFACT.so DTYPE:D0xD1x... [...]   (DTYPE: TF enum)
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "disc_ral_cuda.h"

namespace {

struct Input {
  int32_t dtype;
  std::vector<int64_t> dims;
  std::vector<char> data;
};

std::vector<Input> inputs;
const char* (*function_name)(int32_t) = nullptr;

int32_t InputRank(disc_ral*, int32_t i) { return static_cast<int32_t>(inputs[i].dims.size()); }
const int64_t* InputDims(disc_ral*, int32_t i) { return inputs[i].dims.data(); }
int32_t InputDtype(disc_ral*, int32_t i) { return inputs[i].dtype; }
const void* InputData(disc_ral*, int32_t i) { return inputs[i].data.data(); }

void* AllocOutput(disc_ral*, int32_t i, int32_t rank, const int64_t* dims) {
  std::string shape;
  int64_t n = 1;
  for (int d = 0; d < rank; ++d) {
    shape += (d ? "," : "") + std::to_string(dims[d]);
    n *= dims[d];
  }
  std::printf("alloc_output %d [%s]\n", i, shape.c_str());
  return std::calloc(static_cast<size_t>(n > 0 ? n : 1), 8);
}

void* AllocTemp(disc_ral*, int64_t bytes) {
  std::printf("alloc_temp %lld\n", static_cast<long long>(bytes));
  return std::calloc(static_cast<size_t>(bytes > 0 ? bytes : 1), 1);
}

void FreeTemp(disc_ral*, void* p) {
  std::printf("free_temp\n");
  std::free(p);
}

void SetError(disc_ral*, int32_t code, const char* message) {
  std::printf("error %d %s\n", code, message);
}

int32_t Launch(disc_ral_cuda*, int32_t f, uint32_t grid, uint32_t block, uint32_t, void**) {
  std::printf("launch %s grid=%u block=%u\n", function_name(f), grid, block);
  return 0;
}

void* Global(disc_ral_cuda*, const char* name) {
  std::printf("global %s\n", name);
  static char storage[1 << 16];
  return storage;
}

int32_t Gemm(disc_ral_cuda*, int32_t dtype, int64_t batch, int64_t m, int64_t n, int64_t k,
             const void*, int64_t lda, int64_t sa, int32_t ta, const void*, int64_t ldb,
             int64_t sb, int32_t tb, void*, int64_t ldc, int64_t sc) {
  std::printf("gemm dtype=%d %lld %lld %lld %lld %lld %lld %d %lld %lld %d %lld %lld\n", dtype,
              (long long)batch, (long long)m, (long long)n, (long long)k, (long long)lda,
              (long long)sa, ta, (long long)ldb, (long long)sb, tb, (long long)ldc,
              (long long)sc);
  return 0;
}

int32_t MemsetZero(disc_ral_cuda*, void*, int64_t bytes) {
  std::printf("memset_zero %lld\n", static_cast<long long>(bytes));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    std::printf("dlopen failed: %s\n", dlerror());
    return 2;
  }
  auto entry = reinterpret_cast<int32_t (*)(disc_ral_cuda*)>(dlsym(lib, "disc_cuda_entry"));
  function_name = reinterpret_cast<const char* (*)(int32_t)>(dlsym(lib, "disc_cuda_function_name"));
  if (!entry || !function_name) return 3;
  for (int a = 2; a < argc; ++a) {
    Input in;
    char* p = argv[a];
    in.dtype = static_cast<int32_t>(std::strtol(p, &p, 10));
    int64_t n = 1;
    while (*p == ':' || *p == 'x') {
      const int64_t d = std::strtoll(p + 1, &p, 10);
      in.dims.push_back(d);
      n *= d;
    }
    in.data.resize(static_cast<size_t>(n > 0 ? n * 8 : 8));
    inputs.push_back(std::move(in));
  }
  disc_ral_cuda ral{};
  ral.base.abi_version = DISC_RAL_ABI_VERSION;
  ral.base.num_inputs = static_cast<int32_t>(inputs.size());
  ral.base.num_outputs = 1;
  ral.base.input_rank = InputRank;
  ral.base.input_dims = InputDims;
  ral.base.input_dtype = InputDtype;
  ral.base.input_data = InputData;
  ral.base.alloc_output = AllocOutput;
  ral.base.alloc_temp = AllocTemp;
  ral.base.free_temp = FreeTemp;
  ral.base.set_error = SetError;
  ral.cuda_abi_version = DISC_RAL_CUDA_ABI_VERSION;
  ral.launch = Launch;
  ral.device_global = Global;
  ral.gemm_batched = Gemm;
  ral.memset_zero = MemsetZero;
  std::printf("rc %d\n", entry(&ral));
  return 0;
}
