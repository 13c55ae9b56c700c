// gpu_runner.h -- runs a CUDA artifact (cc/ral/disc_ral_cuda.h) for the GPU
// DiscCluster kernel: TF's compute stream, TF's GPU allocator (through the
// call's TfRal: outputs and temps are device memory on a GPU device), the CUDA
// RAL of cc/ral_cuda. Built only where CUDA headers exist (DISC_TF_GPU).
#ifndef DISC_TF_CC_KERNELS_GPU_RUNNER_H_
#define DISC_TF_CC_KERNELS_GPU_RUNNER_H_

#include <cstdint>

#include "cc/kernels/artifact_loader.h"
#include "cc/ral/disc_ral_tf.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace disc_tf {

// Queues one call of `artifact` on ctx's stream through `ral`'s services and
// returns without waiting for the GPU: 0, or non-zero with an error set on `ral`.
int32_t RunCudaArtifact(tensorflow::OpKernelContext* ctx, const LoadedArtifact& artifact,
                        TfRal* ral);

}  // namespace disc_tf

#endif  // DISC_TF_CC_KERNELS_GPU_RUNNER_H_
