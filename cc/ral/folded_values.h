// folded_values.h -- results of weight-only kernels kept across calls (RAL ABI 10).
//
// Some kernels read nothing but a cluster's weights: MobileNetV2's batch norms
// compute rsqrt(variance + eps) * gamma and beta - mean * scale from four
// variables, 13 launches on every call. The host runner asks the RAL first
// (fold_begin): when every input such a kernel reads is a constant input of the
// call (a Const's or a ReadVariableOp's value), the kernel's results computed by
// an earlier call from the same input buffers are used instead of launching it.
//
// Soundness is PackedWeights' (packed_weights.h): an entry holds references to
// the input tensors it was computed from, and TensorFlow never writes into a
// buffer someone else references (a variable assignment then allocates a new
// one), nor frees it for reuse while it is held. A new value thus arrives at a
// new address and misses. The key also holds what the host runner passes
// (the kernel's dims), so a kernel whose results depend on a call's shapes
// misses when they change.
//
// Bounds: one entry per kernel site (a new value replaces the old entry), and
// only kernels whose results are at most kMostFoldedBytes. A site that missed
// kMaxMoves times with an entry (inputs in new buffers: variables a training step
// updates; or dims that follow the call's shapes) is computed on every call from
// then on: held references would make TF copy each updated variable, and the
// results would be allocated anew on every call. DISC_TF_FOLD=0 turns folding
// off. The counter folded_reuses (stats.h) counts the launches skipped.
#ifndef DISC_TF_CC_RAL_FOLDED_VALUES_H_
#define DISC_TF_CC_RAL_FOLDED_VALUES_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cc/ral/disc_ral.h"
#include "tensorflow/core/framework/tensor.h"

namespace disc_tf {

// Results above this (all of one kernel's outputs) are computed on every call:
// a kept copy of a large derived weight would double its memory.
constexpr int64_t kMostFoldedBytes = int64_t{16} << 20;

// One kernel's results and what they were computed from.
struct FoldedEntry {
  std::vector<tensorflow::Tensor> inputs;  // held: their buffers identify the values
  std::vector<int64_t> key;
  std::vector<tensorflow::Tensor> outputs;  // int8 tensors of each output's bytes
};

// The kept results of one DiscCluster kernel, by site. Thread-safe: concurrent
// calls of one kernel share it; an entry is immutable once published.
class FoldedValues {
 public:
  FoldedValues() = default;
  FoldedValues(const FoldedValues&) = delete;
  FoldedValues& operator=(const FoldedValues&) = delete;

  // A site that missed this often with an entry is no longer folded.
  static constexpr int kMaxMoves = 8;

  // The entry of `site` computed from the buffers (same shapes) of the call's
  // inputs `inputs[0, n_inputs)` (indices into `values`) and from `key`, with
  // outputs of these byte sizes; null if there is none. Sets *off when the site is
  // no longer folded (kMaxMoves).
  std::shared_ptr<const FoldedEntry> Find(int32_t site,
                                          const std::vector<tensorflow::Tensor>& values,
                                          const int32_t* inputs, int32_t n_inputs,
                                          const int64_t* key, int32_t n_key,
                                          const int64_t* bytes, int32_t n_outputs, bool* off);

  // Makes `entry` the one of `site`, replacing any earlier one (a call still
  // reading the old one holds its own reference).
  void Publish(int32_t site, std::shared_ptr<const FoldedEntry> entry);

 private:
  struct Site {
    std::shared_ptr<const FoldedEntry> entry;
    int moves = 0;  // misses with an entry (other input buffers or key)
  };
  std::mutex mu_;
  std::unordered_map<int32_t, Site> sites_;
};

// The index PackedWeights keys output `output` of `site` by when a GEMM reads it as
// its weights: past the cluster's `num_inputs` inputs, distinct per site and output.
inline int FoldedIndex(int num_inputs, int32_t site, int output) {
  return num_inputs + 1 + site * 1024 + output;
}

// The RAL's fold_begin and fold_done for a TfRal (disc_ral.h, ABI 10).
int32_t RalFoldBegin(disc_ral* ral, int32_t site, const int32_t* inputs, int32_t n_inputs,
                     const int64_t* key, int32_t n_key, const int64_t* bytes,
                     int32_t n_outputs, void** outs);
void RalFoldDone(disc_ral* ral, int32_t site);

}  // namespace disc_tf

#endif  // DISC_TF_CC_RAL_FOLDED_VALUES_H_
