// Runs a CUDA artifact's host runner with its device code executed by the CPU
// emulator (cuda_emulator.h), for tests without a GPU. "Device" memory is host
// memory; GEMMs are a naive fp32 loop.
// Usage: cuda_emu_host ARTIFACT.so EMU.so OUTDIR ITEMSIZES DTYPE:D0xD1x...:FILE ...
//   EMU.so exports emu_launch(function, grid, block, shared bytes, params) and
//   emu_global(name);
//   ITEMSIZES: bytes per element of each output, comma-separated. Writes
//   OUTDIR/out<i>.bin (raw elements) and OUTDIR/out<i>.shape; prints "rc N"
//   and any error.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "disc_ral_cuda.h"

namespace {

struct Input {
  int32_t dtype;
  std::vector<int64_t> dims;
  std::vector<char> data;
};
struct Output {
  std::vector<int64_t> dims;
  void* data = nullptr;
};

std::vector<Input> inputs;
std::vector<Output> outputs;
int32_t (*emu_launch)(int32_t, uint32_t, uint32_t, uint32_t, void**) = nullptr;
void* (*emu_global)(const char*) = nullptr;

int32_t InputRank(disc_ral*, int32_t i) { return static_cast<int32_t>(inputs[i].dims.size()); }
const int64_t* InputDims(disc_ral*, int32_t i) { return inputs[i].dims.data(); }
int32_t InputDtype(disc_ral*, int32_t i) { return inputs[i].dtype; }
const void* InputData(disc_ral*, int32_t i) { return inputs[i].data.data(); }

void* AllocOutput(disc_ral*, int32_t i, int32_t rank, const int64_t* dims) {
  int64_t n = 1;
  outputs[i].dims.assign(dims, dims + rank);
  for (int d = 0; d < rank; ++d) n *= dims[d];
  outputs[i].data = std::calloc(static_cast<size_t>(n > 0 ? n : 1), 8);
  return outputs[i].data;
}
void* AllocTemp(disc_ral*, int64_t bytes) {
  return std::calloc(static_cast<size_t>(bytes > 0 ? bytes : 1), 1);
}
void FreeTemp(disc_ral*, void* p) { std::free(p); }
void SetError(disc_ral*, int32_t code, const char* message) {
  std::printf("error %d %s\n", code, message);
}
int32_t Launch(disc_ral_cuda*, int32_t f, uint32_t grid, uint32_t block, uint32_t shared,
               void** params) {
  return emu_launch(f, grid, block, shared, params);
}
void* Global(disc_ral_cuda*, const char* name) { return emu_global(name); }

int32_t Gemm(disc_ral_cuda*, int32_t dtype, int64_t batch, int64_t m, int64_t n, int64_t k,
             const void* a, int64_t lda, int64_t sa, int32_t ta, const void* b, int64_t ldb,
             int64_t sb, int32_t tb, void* c, int64_t ldc, int64_t sc) {
  if (dtype != DISC_F32) return 1;
  const float* A = static_cast<const float*>(a);
  const float* B = static_cast<const float*>(b);
  float* C = static_cast<float*>(c);
  for (int64_t q = 0; q < batch; ++q)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < k; ++p) {
          const float x = ta ? A[q * sa + p * lda + i] : A[q * sa + i * lda + p];
          const float y = tb ? B[q * sb + j * ldb + p] : B[q * sb + p * ldb + j];
          acc += static_cast<double>(x) * y;
        }
        C[q * sc + i * ldc + j] = static_cast<float>(acc);
      }
  return 0;
}
int32_t MemsetZero(disc_ral_cuda*, void* p, int64_t bytes) {
  std::memset(p, 0, static_cast<size_t>(bytes));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) return 2;
  void* art = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  void* emu = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
  if (!art || !emu) {
    std::printf("dlopen failed: %s\n", dlerror());
    return 2;
  }
  auto entry = reinterpret_cast<int32_t (*)(disc_ral_cuda*)>(dlsym(art, "disc_cuda_entry"));
  emu_launch = reinterpret_cast<int32_t (*)(int32_t, uint32_t, uint32_t, uint32_t, void**)>(
      dlsym(emu, "emu_launch"));
  emu_global = reinterpret_cast<void* (*)(const char*)>(dlsym(emu, "emu_global"));
  if (!entry || !emu_launch || !emu_global) return 3;
  const std::string out_dir = argv[3];
  std::vector<int> itemsizes;
  for (char* p = argv[4]; *p;) {
    itemsizes.push_back(static_cast<int>(std::strtol(p, &p, 10)));
    if (*p == ',') ++p;
  }
  outputs.resize(itemsizes.size());
  for (int a = 5; a < argc; ++a) {
    Input in;
    char* p = argv[a];
    in.dtype = static_cast<int32_t>(std::strtol(p, &p, 10));
    while (*p == ':' || *p == 'x') {
      if (*p == ':' && (p[1] < '0' || p[1] > '9')) break;
      in.dims.push_back(std::strtoll(p + 1, &p, 10));
    }
    std::ifstream f(p + 1, std::ios::binary);
    in.data.assign(std::istreambuf_iterator<char>(f), {});
    in.data.resize(in.data.size() + 8);
    inputs.push_back(std::move(in));
  }
  disc_ral_cuda ral{};
  ral.base.abi_version = DISC_RAL_ABI_VERSION;
  ral.base.num_inputs = static_cast<int32_t>(inputs.size());
  ral.base.num_outputs = static_cast<int32_t>(outputs.size());
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
  const int32_t rc = entry(&ral);
  for (size_t i = 0; i < outputs.size() && rc == 0; ++i) {
    int64_t n = 1;
    std::ofstream shape(out_dir + "/out" + std::to_string(i) + ".shape");
    for (int64_t d : outputs[i].dims) {
      n *= d;
      shape << d << " ";
    }
    std::ofstream data(out_dir + "/out" + std::to_string(i) + ".bin", std::ios::binary);
    if (outputs[i].data) data.write(static_cast<const char*>(outputs[i].data), n * itemsizes[i]);
  }
  std::printf("rc %d\n", rc);
  return 0;
}
