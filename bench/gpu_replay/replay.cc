// replay.cc -- runs one CUDA artifact of disc_tf on a GPU without TensorFlow.
//
// A Python driver (bench/gpu_replay/check.py) loads this library with ctypes,
// hands it a cluster's artifact and the cluster's input tensors that TF computed
// on the CPU, runs the artifact through the project's CUDA RAL
// (cc/ral_cuda/disc_ral_cuda_impl.cc, the code TF's GPU DiscCluster kernel runs) and
// reads the outputs back to compare them with TF's. So a machine with a GPU but no
// TensorFlow build for it can still run every generated kernel, host runner and
// cuBLAS mapping the GPU kernel would.
//
// Device memory comes from the driver's stream-ordered pool (cuMemAllocAsync),
// kept cached between calls as TF's BFC allocator keeps its chunks, so timed calls
// measure the cluster rather than the allocator. Like the RAL, the driver is
// loaded with dlopen: the library builds wherever cuda.h is, with no CUDA library.
#include <cuda.h>
#include <dlfcn.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "disc_ral_cuda.h"
#include "disc_ral_cuda_impl.h"

namespace {

struct Api {
  CUresult (*init)(unsigned);
  CUresult (*device_get)(CUdevice*, int);
  CUresult (*device_get_name)(char*, int, CUdevice);
  CUresult (*primary_ctx_retain)(CUcontext*, CUdevice);
  CUresult (*ctx_set_current)(CUcontext);
  CUresult (*stream_create)(CUstream*, unsigned);
  CUresult (*stream_synchronize)(CUstream);
  CUresult (*mem_alloc_async)(CUdeviceptr*, size_t, CUstream);
  CUresult (*mem_free_async)(CUdeviceptr, CUstream);
  CUresult (*memcpy_htod)(CUdeviceptr, const void*, size_t);
  CUresult (*memcpy_dtoh)(void*, CUdeviceptr, size_t);
  CUresult (*default_mem_pool)(CUmemoryPool*, CUdevice);
  CUresult (*mem_pool_set_attribute)(CUmemoryPool, CUmemPool_attribute, void*);
  CUresult (*event_create)(CUevent*, unsigned);
  CUresult (*event_destroy)(CUevent);
  CUresult (*event_record)(CUevent, CUstream);
  CUresult (*event_synchronize)(CUevent);
  CUresult (*event_elapsed)(float*, CUevent, CUevent);
  CUresult (*get_error_string)(CUresult, const char**);
};

// The driver entry points, or an error naming what is missing.
const Api* LoadApi(std::string* error) {
  static Api api;
  static std::string load_error = [] {
    void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return std::string("cannot load libcuda.so.1 (no NVIDIA driver)");
    std::string missing;
    auto get = [&](const char* name, auto** fn) {
      *fn = reinterpret_cast<std::remove_reference_t<decltype(*fn)>>(::dlsym(lib, name));
      if (*fn == nullptr) missing += std::string(" ") + name;
    };
    get("cuInit", &api.init);
    get("cuDeviceGet", &api.device_get);
    get("cuDeviceGetName", &api.device_get_name);
    get("cuDevicePrimaryCtxRetain", &api.primary_ctx_retain);
    get("cuCtxSetCurrent", &api.ctx_set_current);
    get("cuStreamCreate", &api.stream_create);
    get("cuStreamSynchronize", &api.stream_synchronize);
    get("cuMemAllocAsync", &api.mem_alloc_async);
    get("cuMemFreeAsync", &api.mem_free_async);
    get("cuMemcpyHtoD_v2", &api.memcpy_htod);
    get("cuMemcpyDtoH_v2", &api.memcpy_dtoh);
    get("cuDeviceGetDefaultMemPool", &api.default_mem_pool);
    get("cuMemPoolSetAttribute", &api.mem_pool_set_attribute);
    get("cuEventCreate", &api.event_create);
    get("cuEventDestroy_v2", &api.event_destroy);
    get("cuEventRecord", &api.event_record);
    get("cuEventSynchronize", &api.event_synchronize);
    get("cuEventElapsedTime_v2", &api.event_elapsed);
    get("cuGetErrorString", &api.get_error_string);
    return missing.empty() ? std::string() : "libcuda.so.1 lacks:" + missing;
  }();
  if (!load_error.empty()) {
    *error = load_error;
    return nullptr;
  }
  return &api;
}

std::string Describe(const Api& api, CUresult r) {
  const char* text = nullptr;
  api.get_error_string(r, &text);
  return std::string(text ? text : "unknown CUDA error") + " (" + std::to_string(r) + ")";
}

struct Tensor {
  int32_t dtype = 0;
  std::vector<int64_t> dims;
  CUdeviceptr data = 0;
};

// One loaded artifact with its inputs in device memory and the outputs of its
// last run. `cu` is first, so the disc_ral* the runner passes back is a Replay*.
struct Replay {
  disc_ral_cuda cu;
  const Api* api = nullptr;
  CUstream stream = nullptr;
  void* handle = nullptr;
  disc_cuda::CudaArtifact artifact;
  std::vector<Tensor> inputs;
  std::vector<Tensor> outputs;
  std::string error;
  int64_t temp_bytes = 0;
  int64_t peak_temp_bytes = 0;
  std::vector<std::pair<CUdeviceptr, int64_t>> temps;
};

Replay* Of(disc_ral* r) { return reinterpret_cast<Replay*>(r); }

int32_t InputRank(disc_ral* r, int32_t i) { return static_cast<int32_t>(Of(r)->inputs[i].dims.size()); }
const int64_t* InputDims(disc_ral* r, int32_t i) { return Of(r)->inputs[i].dims.data(); }
int32_t InputDtype(disc_ral* r, int32_t i) { return Of(r)->inputs[i].dtype; }
const void* InputData(disc_ral* r, int32_t i) {
  return reinterpret_cast<const void*>(static_cast<uintptr_t>(Of(r)->inputs[i].data));
}

void SetError(disc_ral* r, int32_t code, const char* message) {
  Of(r)->error = "error " + std::to_string(code) + ": " + message;
}

CUdeviceptr Allocate(Replay* rp, int64_t bytes) {
  CUdeviceptr p = 0;
  if (bytes <= 0) return 0;
  CUresult rc = rp->api->mem_alloc_async(&p, static_cast<size_t>(bytes), rp->stream);
  if (rc != CUDA_SUCCESS) {
    rp->error = "cuMemAllocAsync(" + std::to_string(bytes) + "): " + Describe(*rp->api, rc);
    return 0;
  }
  return p;
}

int64_t ItemBytes(int32_t dtype) {
  switch (dtype) {
    case DISC_F32: case DISC_I32: return 4;
    case DISC_I64: return 8;
    case DISC_BOOL: return 1;
    case DISC_F16: case DISC_BF16: return 2;
    default: return 0;
  }
}

void* AllocOutput(disc_ral* r, int32_t i, int32_t rank, const int64_t* dims) {
  Replay* rp = Of(r);
  Tensor& out = rp->outputs[i];
  if (out.data) rp->api->mem_free_async(out.data, rp->stream);
  out.data = 0;
  out.dims.assign(dims, dims + rank);
  int64_t n = ItemBytes(out.dtype);
  for (int64_t d : out.dims) n *= d;
  out.data = Allocate(rp, n);
  return reinterpret_cast<void*>(static_cast<uintptr_t>(out.data));
}

void* AllocTemp(disc_ral* r, int64_t bytes) {
  Replay* rp = Of(r);
  CUdeviceptr p = Allocate(rp, bytes > 0 ? bytes : 1);
  if (p == 0) return nullptr;
  rp->temps.emplace_back(p, bytes);
  rp->temp_bytes += bytes;
  if (rp->temp_bytes > rp->peak_temp_bytes) rp->peak_temp_bytes = rp->temp_bytes;
  return reinterpret_cast<void*>(static_cast<uintptr_t>(p));
}

void FreeTemp(disc_ral* r, void* ptr) {
  Replay* rp = Of(r);
  CUdeviceptr p = static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(ptr));
  for (size_t t = 0; t < rp->temps.size(); ++t) {
    if (rp->temps[t].first != p) continue;
    rp->temp_bytes -= rp->temps[t].second;
    rp->temps.erase(rp->temps.begin() + static_cast<std::ptrdiff_t>(t));
    rp->api->mem_free_async(p, rp->stream);  // stream-ordered, as TF's allocator
    return;
  }
}

// Temps the runner did not free are released at the end of a call, as TF does.
void ReleaseTemps(Replay* rp) {
  for (auto& t : rp->temps) rp->api->mem_free_async(t.first, rp->stream);
  rp->temps.clear();
  rp->temp_bytes = 0;
}

int Fail(char* error, int size, const std::string& message) {
  std::snprintf(error, static_cast<size_t>(size), "%s", message.c_str());
  return 1;
}

}  // namespace

extern "C" {

// Opens `artifact_path` (a disc_tf CUDA artifact) for a cluster of the given
// input and output counts, on device 0's primary context and a new stream.
// Returns NULL with the reason in error[0..size).
void* replay_open(const char* artifact_path, int32_t num_inputs, int32_t num_outputs,
                  const int32_t* output_dtypes, char* error, int32_t size) {
  std::string why;
  const Api* api = LoadApi(&why);
  if (api == nullptr) return Fail(error, size, why), nullptr;
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CUresult rc = api->init(0);
  if (rc == CUDA_SUCCESS) rc = api->device_get(&dev, 0);
  if (rc == CUDA_SUCCESS) rc = api->primary_ctx_retain(&ctx, dev);
  if (rc == CUDA_SUCCESS) rc = api->ctx_set_current(ctx);
  if (rc != CUDA_SUCCESS) return Fail(error, size, "no CUDA device: " + Describe(*api, rc)), nullptr;
  CUmemoryPool pool = nullptr;  // keep freed blocks cached, as a framework allocator does
  if (api->default_mem_pool(&pool, dev) == CUDA_SUCCESS) {
    cuuint64_t keep = ~cuuint64_t{0};
    api->mem_pool_set_attribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
  }
  auto* rp = new Replay;
  std::memset(&rp->cu, 0, sizeof(rp->cu));
  rp->api = api;
  rp->handle = ::dlopen(artifact_path, RTLD_NOW | RTLD_LOCAL);
  if (rp->handle == nullptr) {
    Fail(error, size, std::string("dlopen: ") + ::dlerror());
    delete rp;
    return nullptr;
  }
  if (!rp->artifact.Init(rp->handle, &why) ||
      (rc = api->stream_create(&rp->stream, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS) {
    Fail(error, size, why.empty() ? "cuStreamCreate: " + Describe(*api, rc) : why);
    delete rp;
    return nullptr;
  }
  rp->inputs.resize(static_cast<size_t>(num_inputs));
  rp->outputs.resize(static_cast<size_t>(num_outputs));
  for (int32_t i = 0; i < num_outputs; ++i) rp->outputs[i].dtype = output_dtypes[i];
  disc_ral& base = rp->cu.base;
  base.abi_version = DISC_RAL_ABI_VERSION;
  base.num_inputs = num_inputs;
  base.num_outputs = num_outputs;
  base.input_rank = InputRank;
  base.input_dims = InputDims;
  base.input_dtype = InputDtype;
  base.input_data = InputData;
  base.alloc_output = AllocOutput;
  base.alloc_temp = AllocTemp;
  base.free_temp = FreeTemp;
  base.set_error = SetError;
  return rp;
}

// Copies input i (host data of `bytes` bytes) to device memory.
int32_t replay_set_input(void* handle, int32_t i, int32_t dtype, int32_t rank,
                         const int64_t* dims, const void* data, int64_t bytes, char* error,
                         int32_t size) {
  auto* rp = static_cast<Replay*>(handle);
  Tensor& t = rp->inputs[static_cast<size_t>(i)];
  t.dtype = dtype;
  t.dims.assign(dims, dims + rank);
  t.data = Allocate(rp, bytes > 0 ? bytes : 1);
  if (t.data == 0) return Fail(error, size, rp->error);
  CUresult rc = rp->api->stream_synchronize(rp->stream);
  if (rc == CUDA_SUCCESS && bytes > 0) rc = rp->api->memcpy_htod(t.data, data, static_cast<size_t>(bytes));
  return rc == CUDA_SUCCESS ? 0 : Fail(error, size, "copying input: " + Describe(*rp->api, rc));
}

// Runs the cluster `calls` times back to back on the stream and waits. Writes the
// GPU time of all calls (events around them) and the host time spent in the
// runner (its shape arithmetic and launches, without waiting) in milliseconds.
// allow_tf32: float GEMMs on TF32 tensor cores (TF's default on a GPU).
int32_t replay_run(void* handle, int32_t calls, int32_t allow_tf32, double* gpu_ms,
                   double* host_ms, char* error, int32_t size) {
  auto* rp = static_cast<Replay*>(handle);
  const Api& api = *rp->api;
  CUevent start = nullptr, stop = nullptr;
  if (api.event_create(&start, CU_EVENT_DEFAULT) != CUDA_SUCCESS ||
      api.event_create(&stop, CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
    if (start) api.event_destroy(start);
    return Fail(error, size, "cuEventCreate failed");
  }
  struct Events {  // destroyed on every return
    const Api& api;
    CUevent start, stop;
    ~Events() { api.event_destroy(start), api.event_destroy(stop); }
  } events{api, start, stop};
  api.event_record(start, rp->stream);
  double host = 0;
  for (int32_t c = 0; c < calls; ++c) {
    rp->error.clear();
    auto t0 = std::chrono::steady_clock::now();
    int32_t rc = rp->artifact.Run(&rp->cu, rp->stream, allow_tf32 != 0);
    host += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ReleaseTemps(rp);
    if (rc != 0) return Fail(error, size, rp->error.empty() ? "the runner failed" : rp->error);
  }
  api.event_record(stop, rp->stream);
  CUresult rc = api.event_synchronize(stop);
  if (rc != CUDA_SUCCESS) return Fail(error, size, "running the cluster: " + Describe(api, rc));
  float ms = 0;
  api.event_elapsed(&ms, start, stop);
  *gpu_ms = ms;
  *host_ms = host;
  return 0;
}

// Output i of the last run: its rank (dims written to `dims`, up to 8).
int32_t replay_output_dims(void* handle, int32_t i, int64_t* dims) {
  const Tensor& t = static_cast<Replay*>(handle)->outputs[static_cast<size_t>(i)];
  for (size_t d = 0; d < t.dims.size() && d < 8; ++d) dims[d] = t.dims[d];
  return static_cast<int32_t>(t.dims.size());
}

// Copies output i of the last run (`bytes` bytes) to host memory at `dst`.
int32_t replay_output_copy(void* handle, int32_t i, void* dst, int64_t bytes, char* error,
                           int32_t size) {
  auto* rp = static_cast<Replay*>(handle);
  const Tensor& t = rp->outputs[static_cast<size_t>(i)];
  if (bytes <= 0) return 0;
  if (t.data == 0) return Fail(error, size, "output " + std::to_string(i) + " was not allocated");
  CUresult rc = rp->api->stream_synchronize(rp->stream);
  if (rc == CUDA_SUCCESS) rc = rp->api->memcpy_dtoh(dst, t.data, static_cast<size_t>(bytes));
  return rc == CUDA_SUCCESS ? 0 : Fail(error, size, "reading output: " + Describe(*rp->api, rc));
}

// The most device temporary bytes live at once in any run so far.
int64_t replay_peak_temp_bytes(void* handle) { return static_cast<Replay*>(handle)->peak_temp_bytes; }

// The name of device 0 ("" if none).
void replay_device_name(char* name, int32_t size) {
  std::string why;
  const Api* api = LoadApi(&why);
  CUdevice dev = 0;
  name[0] = 0;
  if (api && api->init(0) == CUDA_SUCCESS && api->device_get(&dev, 0) == CUDA_SUCCESS) {
    api->device_get_name(name, size, dev);
  }
}

// Frees the device buffers (the library stays loaded: its module may be cached).
void replay_close(void* handle) {
  auto* rp = static_cast<Replay*>(handle);
  rp->api->stream_synchronize(rp->stream);
  for (Tensor& t : rp->inputs) if (t.data) rp->api->mem_free_async(t.data, rp->stream);
  for (Tensor& t : rp->outputs) if (t.data) rp->api->mem_free_async(t.data, rp->stream);
  rp->api->stream_synchronize(rp->stream);
  delete rp;
}

}  // extern "C"
