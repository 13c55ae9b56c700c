// packed_weights.h -- GEMM weight operands packed once and reused across calls.
//
// A GEMM block packs the panels of op(B) it reads on every call. When B lies
// in a DiscCluster input that cannot change between calls, the packing can be
// done once: the cluster's `constant_inputs` attr lists the inputs produced by
// a Const or a ReadVariableOp. The cache holds a reference to the input tensor
// next to its packed copy. That reference is what makes reuse sound:
// TensorFlow never writes into a buffer that someone else still references
// (resource variables copy on write: an assignment or optimizer update of a
// variable whose value is held elsewhere allocates a new buffer), and the
// buffer cannot be freed and reused for another tensor while it is held. A
// new value therefore always arrives at a new address, misses the cache and
// evicts the entries of the old one.
#ifndef DISC_TF_CC_RAL_PACKED_WEIGHTS_H_
#define DISC_TF_CC_RAL_PACKED_WEIGHTS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>
#include <vector>

#include "cc/ral/gemm_kernels.h"
#include "tensorflow/core/framework/tensor.h"

namespace disc_tf {

// op(B) packed for one ISA's prepacked GEMM blocks.
struct PackedOperand {
  std::unique_ptr<float, void (*)(void*)> data{nullptr, &free};
  int64_t floats = 0;
};

// The packing functions of the GEMM ISA in use.
struct GemmPacker {
  disc_gemm_panel_fn panel = nullptr;
  disc_gemm_packed_size_fn packed_size = nullptr;
  disc_gemm_pack_b_fn pack_b = nullptr;
};

// Runs fn(t) for t in [0, tasks), possibly in parallel (the RAL's RunTasks).
using TaskRunner =
    std::function<void(int64_t tasks, const std::function<void(int64_t)>& fn)>;

// Packed weights of one DiscCluster kernel. Thread-safe.
class PackedWeights {
 public:
  // The packed op(B) of a product whose B (k x n, or n x k with tb; row
  // stride ldb) lies inside `input`, the cluster's constant input number
  // `input_index`; packed now if it is not cached. Null when packing is off
  // (DISC_TF_PACK_WEIGHTS=0), memory is short, or the process-wide budget
  // (DISC_TF_PACKED_WEIGHTS_MB, default 4096) is spent, or the input moved to
  // a new buffer on kMaxMoves calls: the caller then packs per call as usual.
  // The packing itself runs in column ranges of whole panels through `run`.
  std::shared_ptr<const PackedOperand> Get(int input_index, const tensorflow::Tensor& input,
                                           const float* b, int64_t k, int64_t n, int64_t ldb,
                                           bool tb, const GemmPacker& packer,
                                           const TaskRunner& run);

  // A k x n matrix derived from a constant input (the Winograd transform of a
  // filter), row-major into `out`: `variant` (from 1) tells apart the matrices
  // derived from one B.
  using Derive = std::function<void(float* out)>;

  // The packed matrix `variant` that `derive` makes from B, which lies inside
  // `input` as for Get; packed now if it is not cached (through a k x n copy
  // held only while packing). Null as for Get.
  std::shared_ptr<const PackedOperand> GetDerived(int input_index, const tensorflow::Tensor& input,
                                                  const float* b, int variant, int64_t k,
                                                  int64_t n, const Derive& derive,
                                                  const GemmPacker& packer, const TaskRunner& run);

  // Bytes of all the packed operands held now (read on every call: no lock).
  int64_t PackedBytes() const;

  ~PackedWeights();

  // New buffers of one input after which it is no longer cached.
  static constexpr int kMaxMoves = 8;

 private:
  // B, k, n, ldb, tb and the derived variant (0: B itself).
  using Key = std::tuple<const float*, int64_t, int64_t, int64_t, bool, int>;
  struct Entry {
    int input_index;
    tensorflow::Tensor held;  // keeps B's buffer alive and unshared-free
    std::shared_ptr<const PackedOperand> packed;
  };
  // Drops the entries of `input_index` packed from another buffer than
  // `current`; returns how many it dropped.
  int EvictStaleLocked(int input_index, const void* current);
  // The cached entry of `key`, or a new one whose op(B) (k x n, row stride ldb)
  // is `source`, or what `derive` writes.
  std::shared_ptr<const PackedOperand> Lookup(int input_index, const tensorflow::Tensor& input,
                                              const Key& key, const float* source, int64_t k,
                                              int64_t n, int64_t ldb, bool tb,
                                              const Derive* derive, const GemmPacker& packer,
                                              const TaskRunner& run);

  std::mutex mu_;
  std::map<Key, Entry> entries_;
  std::atomic<int64_t> bytes_{0};  // the packed bytes of entries_, kept as they change
  // Inputs whose buffer changed on most calls (a variable read in copy-on-read
  // mode, or one assigned every step): packing them once per call in one
  // thread would be slower than each block packing its part, so they are not
  // cached any more.
  std::map<int, int> moves_;
  std::set<int> uncached_;
};

// True unless DISC_TF_PACK_WEIGHTS is "0" (read once per process).
bool PackWeightsEnabled();

}  // namespace disc_tf

#endif  // DISC_TF_CC_RAL_PACKED_WEIGHTS_H_
