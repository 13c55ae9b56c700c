// disc_ral_tf.h -- the DISC runtime abstraction layer implemented on top of a
// TensorFlow OpKernelContext (CPU device).
//
// One TfRal is built per DiscCluster execution; its `disc_ral` base is passed
// to the artifact's `disc_entry`. Everything the artifact allocates through it
// (outputs via allocate_output, scratch via allocate_temp) comes from TF's
// allocators; scratch tensors are kept alive until the TfRal is destroyed or
// free_temp is called, and then go to the kernel's TempCache (temp_cache.h)
// where it has one.
#ifndef DISC_TF_CC_RAL_DISC_RAL_TF_H_
#define DISC_TF_CC_RAL_DISC_RAL_TF_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "cc/ral/disc_ral.h"
#include "cc/ral/folded_values.h"
#include "cc/ral/packed_weights.h"
#include "cc/ral/temp_cache.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace disc_tf {

// Converts a DISC_* error code and message to an absl::Status:
// DISC_INVALID_ARGUMENT -> InvalidArgument, DISC_RESOURCE_EXHAUSTED ->
// ResourceExhausted, DISC_OK -> OK, anything else -> Internal.
absl::Status DiscErrorToStatus(int32_t code, const std::string& message);

// Wakes the RAL's sleeping worker threads for the CPU kernel `ctx` (none when its
// intra-op pool has one thread), so that they poll when its first launch comes.
// A DiscCluster call whose last call ran tasks on them calls this first.
void WakeTaskPool(tensorflow::OpKernelContext* ctx);

// A disc_ral bound to one OpKernelContext for the duration of one call.
// Not copyable; must outlive the disc_entry call it is passed to.
struct TfRal : public disc_ral {
  // `inputs` are the call's input values: ctx's inputs, except that a
  // resource input is replaced by the variable's value (see DiscClusterOp).
  // `cluster` names the cluster in the launch profile (DISC_TF_PROFILE).
  TfRal(tensorflow::OpKernelContext* ctx, std::vector<tensorflow::Tensor> inputs,
        std::string cluster = "");
  ~TfRal();

  TfRal(const TfRal&) = delete;
  TfRal& operator=(const TfRal&) = delete;

  // The disc_ral pointer to hand to disc_entry.
  disc_ral* ral() { return this; }

  // Recovers the TfRal from the pointer passed to a RAL callback.
  static TfRal* From(disc_ral* ral) { return static_cast<TfRal*>(ral); }

  // True once set_error has been called (or the host recorded an error).
  bool has_error() const;

  // The stored error as a Status (OK if none was recorded).
  absl::Status status() const;

  // Records an error; the first error wins. Thread-safe.
  void SetError(int32_t code, const std::string& message);

  // Releases all scratch tensors now (also done by the destructor): to
  // `temp_cache` where there is one.
  void ReleaseTemps();

  tensorflow::OpKernelContext* ctx;
  // The input values of this call (see the constructor).
  std::vector<tensorflow::Tensor> inputs;
  // Every input's dims, copied as int64 one input after another (input_dims returns
  // pointers into these): input i's are dims[dim_begin[i], dim_begin[i + 1]). Two
  // buffers a call, not one per input (MobileNetV2's call has 261 inputs).
  std::vector<int64_t> dims;
  std::vector<int32_t> dim_begin;
  // Scratch tensors alive until the end of the call or free_temp.
  std::vector<tensorflow::Tensor> temps;
  // The calling kernel's kept scratch (CPU kernels); null: every temp comes from
  // and goes back to TF's allocator. `temp_bytes` is what `temps` hold now,
  // `temp_peak` the most they held in this call (it bounds what the cache keeps).
  TempCache* temp_cache = nullptr;
  int64_t temp_bytes = 0;
  int64_t temp_peak = 0;
  // Which outputs were allocated through alloc_output.
  std::vector<bool> output_allocated;

  mutable std::mutex mu;  // guards temps, outputs and the error fields
  int32_t error_code = DISC_OK;
  std::string error_message;

  // The calling kernel's packed weights; null when B operands are packed per call.
  // Set by SetConstantInputs with the inputs they may come from (its constant_inputs
  // attr), whose buffers it indexes.
  PackedWeights* packed_weights = nullptr;
  void SetConstantInputs(PackedWeights* weights, const std::vector<int>& constants);
  // The constant inputs' float buffers [begin, end) by begin; `reach` is the largest
  // end up to and including this one, `rank` the input's place in constant_inputs.
  // ConstantInputHolding searches it per GEMM launch: scanning all 260 of
  // MobileNetV2's inputs for each of its 48 launches took about 85 us a call.
  struct ConstantSpan {
    const float* begin;
    const float* end;
    const float* reach;
    int input;
    int rank;
  };
  std::vector<ConstantSpan> constant_spans;
  // constant_input[i]: input i is one of SetConstantInputs' constants.
  std::vector<char> constant_input;
  // The calling kernel's kept results of weight-only kernels (folded_values.h); null:
  // every kernel runs on every call. `folds_held` keeps the entries this call reads
  // alive until it ends; `folds_pending` holds the entries it is computing (by site).
  FoldedValues* folded = nullptr;
  std::vector<std::shared_ptr<const FoldedEntry>> folds_held;
  std::vector<std::pair<int32_t, std::shared_ptr<FoldedEntry>>> folds_pending;
  // The kept results this call reads, as GEMM weights too (a weight norm's g * v / |v|):
  // ConstantInputHolding looks here after the constant inputs, and PackedWeights keys
  // them by `index`, past the inputs' (folded_values.h, FoldedIndex).
  struct FoldedSpan {
    const float* begin;
    const float* end;
    int index;
    const tensorflow::Tensor* tensor;  // in an entry of folds_held
  };
  std::vector<FoldedSpan> folded_spans;
  // Input i's tensor, or the kept result a FoldedSpan's index names.
  const tensorflow::Tensor& ConstantTensor(int i) const;
  // The kernel's packed weights fit in half of a core's L2, so they stay there
  // between calls: GEMMs then read B without prefetching it (gemm_kernels.h).
  bool weights_resident = false;

  // Launch profiling (DISC_TF_PROFILE): the cluster's name when it is on, and
  // the number of launches so far in this call.
  std::string profile_cluster;
  // Set once a launch of this call handed tasks to the RAL's worker threads.
  std::atomic<bool> scheduled_tasks{false};
  bool profiling = false;
  int32_t launches = 0;
  const std::string* profile_key() const { return profiling ? &profile_cluster : nullptr; }
};

}  // namespace disc_tf

#endif  // DISC_TF_CC_RAL_DISC_RAL_TF_H_
