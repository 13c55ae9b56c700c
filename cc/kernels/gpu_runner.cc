// gpu_runner.cc -- see gpu_runner.h.
#include "cc/kernels/gpu_runner.h"

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cc/ral_cuda/disc_ral_cuda_impl.h"
#include "cc/ral_cuda/ral_forward.h"
#include "tensorflow/core/framework/device_base.h"
#include "xla/stream_executor/stream.h"

namespace disc_tf {
namespace {

// TF keeps a GPU kernel's int32 tensors in host memory; the artifact's kernels
// read and write device memory. int32 inputs are uploaded into device temporaries
// before the entry runs; int32 outputs are written into device temporaries and
// downloaded into TF's host-memory outputs after it (the one wait of such a call).
struct GpuCall {
  disc_cuda::ForwardingRal forward;  // first: the runner's table
  tensorflow::OpKernelContext* ctx;
  std::vector<const void*> device_inputs;  // int32 inputs' device copies, else null
  struct Staged {
    int32_t index;
    void* device;
    std::vector<int64_t> dims;
  };
  std::vector<Staged> staged_outputs;
};

GpuCall* CallOf(disc_ral* r) { return reinterpret_cast<GpuCall*>(r); }

int64_t Elements(int32_t rank, const int64_t* dims) {
  int64_t n = 1;
  for (int32_t d = 0; d < rank; ++d) n *= dims[d];
  return n;
}

const void* GpuInputData(disc_ral* r, int32_t i) {
  GpuCall* call = CallOf(r);
  if (call->device_inputs[i] != nullptr) return call->device_inputs[i];
  disc_ral* host = call->forward.host;
  return host->input_data(host, i);
}

void* GpuAllocOutput(disc_ral* r, int32_t i, int32_t rank, const int64_t* dims) {
  GpuCall* call = CallOf(r);
  disc_ral* host = call->forward.host;
  if (call->ctx->expected_output_dtype(i) != tensorflow::DT_INT32) {
    return host->alloc_output(host, i, rank, dims);
  }
  void* device = host->alloc_temp(host, Elements(rank, dims) * 4);
  if (device != nullptr) call->staged_outputs.push_back({i, device, {dims, dims + rank}});
  return device;
}

int32_t UploadInt32Inputs(disc_ral_cuda* cu, void* state) {
  GpuCall* call = static_cast<GpuCall*>(state);
  disc_ral* host = call->forward.host;
  for (int32_t i = 0; i < host->num_inputs; ++i) {
    if (host->input_dtype(host, i) != DISC_I32) continue;
    const int64_t bytes = Elements(host->input_rank(host, i), host->input_dims(host, i)) * 4;
    void* device = host->alloc_temp(host, bytes > 0 ? bytes : 4);
    if (device == nullptr) return 1;
    if (cu->upload(cu, device, host->input_data(host, i), bytes) != 0) return 1;
    call->device_inputs[i] = device;
  }
  return 0;
}

int32_t DownloadInt32Outputs(disc_ral_cuda* cu, void* state) {
  GpuCall* call = static_cast<GpuCall*>(state);
  disc_ral* host = call->forward.host;
  for (const GpuCall::Staged& out : call->staged_outputs) {
    const int32_t rank = static_cast<int32_t>(out.dims.size());
    void* dst = host->alloc_output(host, out.index, rank, out.dims.data());
    const int64_t bytes = Elements(rank, out.dims.data()) * 4;
    if (dst == nullptr && bytes > 0) return 1;
    if (cu->download(cu, dst, out.device, bytes) != 0) return 1;
  }
  return 0;
}

// The CudaArtifact of each loaded artifact (its module per CUDA context),
// made once per process.
disc_cuda::CudaArtifact* CudaArtifactOf(const LoadedArtifact& artifact, std::string* error) {
  static std::mutex* mu = new std::mutex;
  static auto* made = new std::map<const LoadedArtifact*, std::unique_ptr<disc_cuda::CudaArtifact>>;
  std::lock_guard<std::mutex> lock(*mu);
  auto it = made->find(&artifact);
  if (it != made->end()) return it->second.get();
  auto cuda = std::make_unique<disc_cuda::CudaArtifact>();
  if (!cuda->Init(artifact.handle, error)) return nullptr;
  return made->emplace(&artifact, std::move(cuda)).first->second.get();
}

}  // namespace

int32_t RunCudaArtifact(tensorflow::OpKernelContext* ctx, const LoadedArtifact& artifact,
                        TfRal* ral) {
  std::string error;
  disc_cuda::CudaArtifact* cuda = CudaArtifactOf(artifact, &error);
  if (cuda == nullptr) {
    ral->SetError(DISC_INTERNAL, "not a runnable CUDA artifact: " + error);
    return 1;
  }
  tensorflow::DeviceContext* device_context = ctx->op_device_context();
  if (device_context == nullptr || device_context->stream() == nullptr) {
    ral->SetError(DISC_INTERNAL, "the GPU kernel has no compute stream");
    return 1;
  }
  void* stream = device_context->stream()->platform_specific_handle().stream;
  GpuCall call;
  disc_cuda::InitForwarding(&call.forward, ral->ral());
  call.ctx = ctx;
  call.device_inputs.assign(ral->num_inputs, nullptr);
  call.forward.cu.base.input_data = GpuInputData;
  call.forward.cu.base.alloc_output = GpuAllocOutput;
  return cuda->Run(&call.forward.cu, stream, UploadInt32Inputs, DownloadInt32Outputs, &call);
}

}  // namespace disc_tf
