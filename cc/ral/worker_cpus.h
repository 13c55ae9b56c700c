// worker_cpus.h -- the CPU each of the RAL's worker threads is pinned to.
// Header-only and free of TensorFlow (spin_pool.h includes it).
//
// Why pin: a worker free to move shared a core with the thread that called it
// for milliseconds after each idle gap. On a 2-core virtual machine (AVX2, Zen 3)
// the Keras encoder's call at 6 x 118 tokens took 2.5 ms back to back and 5.4-5.6
// ms after a 20 ms pause, even with one call between the pause and the timed one;
// with the worker pinned, 2.7-3.5 ms (bench/GEMM.md, "Pinned workers"). ONNX
// Runtime pins its intra-op threads the same way: one CPU each, leaving one for
// the caller.
#ifndef DISC_TF_CC_RAL_WORKER_CPUS_H_
#define DISC_TF_CC_RAL_WORKER_CPUS_H_

#include <algorithm>
#include <vector>

namespace disc_tf {

// The CPUs for `workers` worker threads, one each: the CPUs of `allowed` (the
// starting thread's, ascending) that follow `current` (the CPU it runs on), in
// turn, wrapping round, so that `current` is the last any worker takes. The
// caller keeps `current`; processes whose first calls start on different CPUs
// pin their workers to different ones. Empty (leave the workers unpinned) when
// `allowed` has fewer than workers + 1 CPUs, as then some CPU would hold two
// threads that poll. A `current` outside `allowed` (unknown: -1) counts as
// allowed's first.
inline std::vector<int> WorkerCpus(const std::vector<int>& allowed, int current,
                                   int workers) {
  const int n = static_cast<int>(allowed.size());
  if (workers <= 0 || n < workers + 1) return {};
  const auto at = std::find(allowed.begin(), allowed.end(), current);
  const int start = at == allowed.end() ? 0 : static_cast<int>(at - allowed.begin());
  std::vector<int> cpus;
  cpus.reserve(workers);
  for (int k = 1; k <= workers; ++k) cpus.push_back(allowed[(start + k) % n]);
  return cpus;
}

}  // namespace disc_tf

#endif  // DISC_TF_CC_RAL_WORKER_CPUS_H_
