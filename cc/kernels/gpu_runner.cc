// gpu_runner.cc -- see gpu_runner.h.
#include "cc/kernels/gpu_runner.h"

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "cc/ral_cuda/disc_ral_cuda_impl.h"
#include "cc/ral_cuda/ral_forward.h"
#include "tensorflow/core/framework/device_base.h"
#include "tensorflow/core/platform/tensor_float_32_utils.h"
#include "xla/stream_executor/stream.h"

namespace disc_tf {
namespace {

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
  disc_cuda::ForwardingRal call;
  disc_cuda::InitForwarding(&call, ral->ral());
  // Run makes the stream's CUDA context current for the call. Float GEMMs use TF32
  // exactly when TF's own GPU MatMul would (tf.config.experimental.
  // enable_tensor_float_32_execution; on by default).
  return cuda->Run(&call.cu, stream, tensorflow::tensor_float_32_execution_enabled());
}

}  // namespace disc_tf
