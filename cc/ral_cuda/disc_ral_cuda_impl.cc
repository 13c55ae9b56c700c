// disc_ral_cuda_impl.cc -- see disc_ral_cuda_impl.h.
//
// Only CUDA *types* come from cuda.h; every driver and cuBLAS entry point is
// resolved with dlsym from libcuda.so.1 and libcublas.so.{13,12}.
#include "disc_ral_cuda_impl.h"

#include "cublas_gemm.h"

#include <cuda.h>
#include <dlfcn.h>
#include <library_types.h>

#include <climits>
#include <string>

namespace disc_cuda {
namespace {

// ---- the CUDA driver, loaded on first use --------------------------------

struct Driver {
  CUresult (*ctx_get_current)(CUcontext*) = nullptr;
  CUresult (*module_load_data)(CUmodule*, const void*) = nullptr;
  CUresult (*module_get_function)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*module_get_global)(CUdeviceptr*, size_t*, CUmodule, const char*) = nullptr;
  CUresult (*launch_kernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                            unsigned, unsigned, CUstream, void**, void**) = nullptr;
  CUresult (*memset_d8_async)(CUdeviceptr, unsigned char, size_t, CUstream) = nullptr;
  CUresult (*get_error_string)(CUresult, const char**) = nullptr;
  CUresult (*stream_get_ctx)(CUstream, CUcontext*) = nullptr;
  CUresult (*memcpy_dtod_async)(CUdeviceptr, CUdeviceptr, size_t, CUstream) = nullptr;
  CUresult (*memcpy_htod_async)(CUdeviceptr, const void*, size_t, CUstream) = nullptr;
  CUresult (*memcpy_dtoh_async)(void*, CUdeviceptr, size_t, CUstream) = nullptr;
  CUresult (*stream_synchronize)(CUstream) = nullptr;
  CUresult (*ctx_push)(CUcontext) = nullptr;
  CUresult (*ctx_pop)(CUcontext*) = nullptr;
  std::string error;  // why loading failed; empty when usable
};

template <typename F>
bool Resolve(void* lib, const char* name, F* fn, std::string* missing) {
  *fn = reinterpret_cast<F>(::dlsym(lib, name));
  if (*fn == nullptr) *missing += std::string(" ") + name;
  return *fn != nullptr;
}

const Driver& GetDriver() {
  static const Driver* driver = [] {
    auto* d = new Driver;
    void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      d->error = "cannot load libcuda.so.1 (no NVIDIA driver)";
      return d;
    }
    std::string missing;
    Resolve(lib, "cuCtxGetCurrent", &d->ctx_get_current, &missing);
    Resolve(lib, "cuModuleLoadData", &d->module_load_data, &missing);
    Resolve(lib, "cuModuleGetFunction", &d->module_get_function, &missing);
    Resolve(lib, "cuModuleGetGlobal_v2", &d->module_get_global, &missing);
    Resolve(lib, "cuLaunchKernel", &d->launch_kernel, &missing);
    Resolve(lib, "cuMemsetD8Async", &d->memset_d8_async, &missing);
    Resolve(lib, "cuGetErrorString", &d->get_error_string, &missing);
    Resolve(lib, "cuStreamGetCtx", &d->stream_get_ctx, &missing);
    Resolve(lib, "cuMemcpyDtoDAsync_v2", &d->memcpy_dtod_async, &missing);
    Resolve(lib, "cuMemcpyHtoDAsync_v2", &d->memcpy_htod_async, &missing);
    Resolve(lib, "cuMemcpyDtoHAsync_v2", &d->memcpy_dtoh_async, &missing);
    Resolve(lib, "cuStreamSynchronize", &d->stream_synchronize, &missing);
    Resolve(lib, "cuCtxPushCurrent_v2", &d->ctx_push, &missing);
    Resolve(lib, "cuCtxPopCurrent_v2", &d->ctx_pop, &missing);
    if (!missing.empty()) d->error = "libcuda.so.1 lacks:" + missing;
    return d;
  }();
  return *driver;
}

std::string DriverError(CUresult r) {
  const char* text = nullptr;
  if (GetDriver().get_error_string) GetDriver().get_error_string(r, &text);
  return std::string(text ? text : "unknown CUDA error") + " (" + std::to_string(r) + ")";
}

// ---- cuBLAS, loaded on first use ------------------------------------------

using cublasHandle_t = void*;
static_assert(kCudaR32F == CUDA_R_32F && kCudaR16F == CUDA_R_16F && kCudaR16BF == CUDA_R_16BF,
              "cudaDataType_t values of cublas_gemm.h");

struct Blas {
  int (*create)(cublasHandle_t*) = nullptr;
  int (*set_stream)(cublasHandle_t, CUstream) = nullptr;
  GemmStridedBatchedEx gemm_strided_batched_ex = nullptr;
  std::string error;
  std::mutex mu;  // guards `handles` and each handle's stream binding
  std::map<CUcontext, cublasHandle_t> handles;
};

Blas& GetBlas() {
  static Blas* blas = [] {
    auto* b = new Blas;
    void* lib = nullptr;
    for (const char* name : {"libcublas.so.13", "libcublas.so.12", "libcublas.so"}) {
      if ((lib = ::dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    }
    if (lib == nullptr) {
      b->error = "cannot load libcublas (libcublas.so.13 or .12)";
      return b;
    }
    std::string missing;
    Resolve(lib, "cublasCreate_v2", &b->create, &missing);
    Resolve(lib, "cublasSetStream_v2", &b->set_stream, &missing);
    Resolve(lib, "cublasGemmStridedBatchedEx", &b->gemm_strided_batched_ex, &missing);
    if (!missing.empty()) b->error = "libcublas lacks:" + missing;
    return b;
  }();
  return *blas;
}

// ---- the disc_ral_cuda table ------------------------------------------------

struct CallState {
  CudaArtifact* artifact;
  CudaArtifact::Module* module;
  bool allow_tf32;
};

CallState* State(disc_ral_cuda* ral) { return static_cast<CallState*>(ral->impl); }

int32_t Fail(disc_ral_cuda* ral, int32_t code, const std::string& message) {
  ral->base.set_error(&ral->base, code, message.c_str());
  return 1;
}

int32_t Launch(disc_ral_cuda* ral, int32_t function, uint32_t grid, uint32_t block,
               uint32_t shared_bytes, void** params) {
  CudaArtifact::Module* m = State(ral)->module;
  if (function < 0 || function >= static_cast<int32_t>(m->functions.size())) {
    return Fail(ral, DISC_INTERNAL, "launch of unknown device function " + std::to_string(function));
  }
  CUresult r = GetDriver().launch_kernel(static_cast<CUfunction>(m->functions[function]), grid, 1,
                                         1, block, 1, 1, shared_bytes,
                                         static_cast<CUstream>(ral->stream), params, nullptr);
  if (r != CUDA_SUCCESS) return Fail(ral, DISC_INTERNAL, "cuLaunchKernel: " + DriverError(r));
  return 0;
}

void* DeviceGlobal(disc_ral_cuda* ral, const char* name) {
  std::string error;
  void* p = State(ral)->artifact->Global(State(ral)->module, name, &error);
  if (p == nullptr) Fail(ral, DISC_INTERNAL, error);
  return p;
}

int32_t GemmBatched(disc_ral_cuda* ral, int32_t dtype, int64_t batch, int64_t m, int64_t n,
                    int64_t k, const void* a, int64_t lda, int64_t stride_a, int32_t transpose_a,
                    const void* b, int64_t ldb, int64_t stride_b, int32_t transpose_b, void* c,
                    int64_t ldc, int64_t stride_c) {
  CublasGemm call{};
  if (const char* why = MapRowMajorGemm(dtype, batch, m, n, k, a, lda, stride_a, transpose_a, b,
                                        ldb, stride_b, transpose_b, c, ldc, stride_c, &call)) {
    return Fail(ral, DISC_INVALID_ARGUMENT, why);
  }
  if (k == 0) {  // C = 0, explicitly rather than through cuBLAS
    return ZeroGemmOutput(dtype, batch, m, n, c, ldc, stride_c, [ral](void* p, int64_t bytes) {
      return ral->memset_zero(ral, p, bytes);
    });
  }
  Blas& blas = GetBlas();
  if (!blas.error.empty()) return Fail(ral, DISC_INTERNAL, blas.error);
  CUcontext ctx = nullptr;
  GetDriver().ctx_get_current(&ctx);
  std::lock_guard<std::mutex> lock(blas.mu);
  cublasHandle_t& handle = blas.handles[ctx];
  if (handle == nullptr && blas.create(&handle) != 0) {
    handle = nullptr;
    return Fail(ral, DISC_INTERNAL, "cublasCreate failed");
  }
  if (blas.set_stream(handle, static_cast<CUstream>(ral->stream)) != 0) {
    return Fail(ral, DISC_INTERNAL, "cublasSetStream failed");
  }
  const int status =
      CallCublas(blas.gemm_strided_batched_ex, handle, call, State(ral)->allow_tf32);
  if (status != 0) {
    return Fail(ral, DISC_INTERNAL, "cublasGemmStridedBatchedEx failed: status " +
                                        std::to_string(status));
  }
  return 0;
}

int32_t MemsetZero(disc_ral_cuda* ral, void* ptr, int64_t bytes) {
  if (bytes <= 0) return 0;
  CUresult r = GetDriver().memset_d8_async(static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(ptr)),
                                           0, static_cast<size_t>(bytes),
                                           static_cast<CUstream>(ral->stream));
  if (r != CUDA_SUCCESS) return Fail(ral, DISC_INTERNAL, "cuMemsetD8Async: " + DriverError(r));
  return 0;
}

CUdeviceptr Dev(const void* p) { return static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p)); }

int32_t Copy(disc_ral_cuda* ral, void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return 0;
  CUresult r = GetDriver().memcpy_dtod_async(Dev(dst), Dev(src), static_cast<size_t>(bytes),
                                             static_cast<CUstream>(ral->stream));
  return r == CUDA_SUCCESS ? 0 : Fail(ral, DISC_INTERNAL, "cuMemcpyDtoDAsync: " + DriverError(r));
}

int32_t Upload(disc_ral_cuda* ral, void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return 0;
  CUresult r = GetDriver().memcpy_htod_async(Dev(dst), src, static_cast<size_t>(bytes),
                                             static_cast<CUstream>(ral->stream));
  return r == CUDA_SUCCESS ? 0 : Fail(ral, DISC_INTERNAL, "cuMemcpyHtoDAsync: " + DriverError(r));
}

int32_t Download(disc_ral_cuda* ral, void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return 0;
  CUstream stream = static_cast<CUstream>(ral->stream);
  CUresult r = GetDriver().memcpy_dtoh_async(dst, Dev(src), static_cast<size_t>(bytes), stream);
  if (r == CUDA_SUCCESS) r = GetDriver().stream_synchronize(stream);
  return r == CUDA_SUCCESS ? 0 : Fail(ral, DISC_INTERNAL, "reading device memory: " + DriverError(r));
}

}  // namespace

bool CudaArtifact::Init(void* dl_handle, std::string* error) {
  entry_ = reinterpret_cast<int32_t (*)(disc_ral_cuda*)>(::dlsym(dl_handle, "disc_cuda_entry"));
  auto abi = reinterpret_cast<int32_t (*)(void)>(::dlsym(dl_handle, "disc_cuda_abi_version"));
  fatbin_ = static_cast<const unsigned char*>(::dlsym(dl_handle, "disc_cuda_fatbin"));
  auto count = reinterpret_cast<int32_t (*)(void)>(::dlsym(dl_handle, "disc_cuda_num_functions"));
  auto name = reinterpret_cast<const char* (*)(int32_t)>(
      ::dlsym(dl_handle, "disc_cuda_function_name"));
  if (entry_ == nullptr || abi == nullptr || fatbin_ == nullptr || count == nullptr ||
      name == nullptr) {
    *error = "not a CUDA artifact (disc_cuda_entry, disc_cuda_fatbin, ... missing)";
    return false;
  }
  if (abi() != DISC_RAL_CUDA_ABI_VERSION) {
    *error = "CUDA artifact ABI " + std::to_string(abi()) + " != runtime's " +
             std::to_string(DISC_RAL_CUDA_ABI_VERSION);
    return false;
  }
  for (int32_t i = 0; i < count(); ++i) function_names_.emplace_back(name(i));
  return true;
}

CudaArtifact::Module* CudaArtifact::ModuleForCurrentContext(disc_ral* base) {
  const Driver& d = GetDriver();
  if (!d.error.empty()) {
    base->set_error(base, DISC_INTERNAL, d.error.c_str());
    return nullptr;
  }
  CUcontext ctx = nullptr;
  CUresult r = d.ctx_get_current(&ctx);
  if (r != CUDA_SUCCESS || ctx == nullptr) {
    base->set_error(base, DISC_INTERNAL, "no current CUDA context");
    return nullptr;
  }
  auto it = modules_.find(ctx);
  if (it != modules_.end()) return &it->second;
  Module m;
  CUmodule module = nullptr;
  r = d.module_load_data(&module, fatbin_);
  if (r != CUDA_SUCCESS) {
    base->set_error(base, DISC_INTERNAL,
                    ("loading the artifact's device code: " + DriverError(r)).c_str());
    return nullptr;
  }
  m.module = module;
  for (const std::string& fn : function_names_) {
    CUfunction f = nullptr;
    r = d.module_get_function(&f, module, fn.c_str());
    if (r != CUDA_SUCCESS) {
      base->set_error(base, DISC_INTERNAL, ("device function " + fn + ": " + DriverError(r)).c_str());
      return nullptr;
    }
    m.functions.push_back(f);
  }
  return &modules_.emplace(ctx, std::move(m)).first->second;
}

void* CudaArtifact::Global(Module* module, const char* name, std::string* error) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = module->globals.find(name);
  if (it != module->globals.end()) return it->second;
  CUdeviceptr ptr = 0;
  size_t bytes = 0;
  CUresult r = GetDriver().module_get_global(&ptr, &bytes, static_cast<CUmodule>(module->module),
                                             name);
  if (r != CUDA_SUCCESS) {
    *error = std::string("device global ") + name + ": " + DriverError(r);
    return nullptr;
  }
  void* p = reinterpret_cast<void*>(static_cast<uintptr_t>(ptr));
  module->globals[name] = p;
  return p;
}

int32_t CudaArtifact::Run(disc_ral_cuda* ral, void* stream, bool allow_tf32) {
  CallState state{this, nullptr, allow_tf32};
  ral->cuda_abi_version = DISC_RAL_CUDA_ABI_VERSION;
  ral->stream = stream;
  ral->impl = &state;
  ral->launch = Launch;
  ral->device_global = DeviceGlobal;
  ral->gemm_batched = GemmBatched;
  ral->memset_zero = MemsetZero;
  ral->copy = Copy;
  ral->upload = Upload;
  ral->download = Download;
  // The stream's context is made current for the call (the embedder's thread
  // need not have it current), and the caller's is restored after.
  const Driver& d = GetDriver();
  if (!d.error.empty()) {
    ral->base.set_error(&ral->base, DISC_INTERNAL, d.error.c_str());
    return 1;
  }
  CUcontext ctx = nullptr;
  CUresult r = d.stream_get_ctx(static_cast<CUstream>(stream), &ctx);
  if (r != CUDA_SUCCESS || ctx == nullptr || d.ctx_push(ctx) != CUDA_SUCCESS) {
    ral->base.set_error(&ral->base, DISC_INTERNAL,
                        ("cannot make the stream's CUDA context current: " + DriverError(r)).c_str());
    return 1;
  }
  {
    // Modules are loaded under the lock; launches only read a loaded
    // module's function handles, which never change afterwards.
    std::lock_guard<std::mutex> lock(mu_);
    state.module = ModuleForCurrentContext(&ral->base);
  }
  const int32_t rc = state.module == nullptr ? 1 : entry_(ral);
  CUcontext popped = nullptr;
  d.ctx_pop(&popped);
  ral->impl = nullptr;
  return rc;
}

}  // namespace disc_cuda
