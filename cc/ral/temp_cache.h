// temp_cache.h -- small scratch buffers a DiscCluster kernel keeps for reuse.
//
// A call's host runner allocates every temporary it needs through the RAL's
// alloc_temp and frees it after its last reader. On a small call those
// allocations cost more than they should: MobileNetV2 at 1 x 96 x 96 makes
// about 140 of them a call (activations and per-channel batch-norm vectors),
// and glibc's malloc consolidates its fast bins on most large requests and
// frees, which took about 9% of the calling thread's time.
//
// A freed temporary of at most kLargestKept bytes therefore goes back to its
// kernel's TempCache instead of the allocator, and a later alloc_temp of about
// its size, in the same call or a later one, takes it. The buffers stay TF
// tensors from the kernel's allocator, so TF's memory accounting sees them.
// What is kept is bounded:
//   - per kernel, by the most temporary bytes one of its calls held at once;
//   - process-wide, by DISC_TF_TEMP_KEEP_MB (default 256; 0 keeps nothing).
// The counters temp_reuses and temp_kept_bytes (stats.h) report the reuse and
// the bytes kept now. DISC_TF_TEMP_POISON=1 fills each buffer kept with 0xff
// bytes, so that tests catch a kernel reading a temporary it has not written.
#ifndef DISC_TF_CC_RAL_TEMP_CACHE_H_
#define DISC_TF_CC_RAL_TEMP_CACHE_H_

#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/tensor.h"

namespace disc_tf {

// The kept scratch of one DiscCluster kernel. Thread-safe: concurrent calls of
// one kernel share it.
class TempCache {
 public:
  TempCache() = default;
  ~TempCache();
  TempCache(const TempCache&) = delete;
  TempCache& operator=(const TempCache&) = delete;

  // Moves into *out a kept buffer of at least `bytes` and not much more (at
  // most a quarter more, or 4 KiB more for small ones); false when none fits.
  bool Take(int64_t bytes, tensorflow::Tensor* out);

  // Keeps `t`, a buffer of `bytes` a call no longer uses, unless it is over
  // kLargestKept bytes, or keeping it would hold more than the most temporary
  // bytes one call held at once (the largest `call_peak` given so far: the
  // calling call's most so far) or pass the process-wide bound; it is then
  // released.
  void Keep(tensorflow::Tensor t, int64_t bytes, int64_t call_peak);

  // The largest buffer kept: the per-channel vectors and small activations that
  // make most of a call's allocations. Larger ones go back to the allocator: a
  // later call of another shape would seldom take them, and kept through it they
  // would add to its peak (the bench's MobileNetV2 stream: 1.46x TF's activation
  // memory with every buffer kept, 0.81x with large ones kept within a call only,
  // 0.66x with none).
  static constexpr int64_t kLargestKept = 64 << 10;

  // Releases everything kept.
  void Clear();

 private:
  std::mutex mu_;
  // (size in bytes, buffer), unordered: a call's temps number in the hundreds at
  // most, and a vector keeps Take and Keep free of allocations once it has grown.
  std::vector<std::pair<int64_t, tensorflow::Tensor>> kept_;
  int64_t kept_bytes_ = 0;
  int64_t most_held_ = 0;  // the most temporary bytes one call held at once
};

}  // namespace disc_tf

#endif  // DISC_TF_CC_RAL_TEMP_CACHE_H_
