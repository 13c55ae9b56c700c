// run_tasks.h -- runs numbered tasks on a thread pool and the calling thread.
// Header-only and free of TensorFlow, so that a benchmark harness
// (bench/gemm_libs) runs GEMM blocks exactly as the RAL does.
#ifndef DISC_TF_CC_RAL_RUN_TASKS_H_
#define DISC_TF_CC_RAL_RUN_TASKS_H_

#include <stdint.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>

namespace disc_tf {

// Runs fn(t) for every t in [0, tasks): the calling thread and up to
// NumThreads() - 1 pool threads take tasks from a shared counter until none
// is left, so a helper that wakes late costs nothing (the caller takes its
// tasks), and the caller never competes with a full pool for the cores. The
// caller spins briefly for tasks still running elsewhere, then sleeps.
// Helpers share the counters by reference count and call fn only for a task
// they took, so one that starts after RunTasks returned takes none and
// touches nothing of the caller's. Without a pool (or with one task) the
// caller runs every task itself.
// Pool: anything with NumThreads() and Schedule(std::function<void()>), such as
// TensorFlow's thread::ThreadPool.
template <typename Pool>
void RunTasks(Pool* pool, int64_t tasks, const std::function<void(int64_t)>& fn) {
  if (pool == nullptr || tasks <= 1) {
    for (int64_t t = 0; t < tasks; ++t) fn(t);
    return;
  }
  struct State {
    std::atomic<int64_t> next{0}, done{0};
    int64_t total = 0;
    const std::function<void(int64_t)>* fn = nullptr;
    std::mutex mu;
    std::condition_variable finished;
  };
  auto state = std::make_shared<State>();
  state->total = tasks;
  state->fn = &fn;
  auto work = [](State& s) {
    for (int64_t t; (t = s.next.fetch_add(1, std::memory_order_relaxed)) < s.total;) {
      (*s.fn)(t);
      if (s.done.fetch_add(1, std::memory_order_acq_rel) + 1 == s.total) {
        std::lock_guard<std::mutex> lock(s.mu);
        s.finished.notify_all();
      }
    }
  };
  const int64_t helpers = std::min<int64_t>(pool->NumThreads() - 1, tasks - 1);
  for (int64_t i = 0; i < helpers; ++i) pool->Schedule([state, work] { work(*state); });
  work(*state);
  for (int spin = 0; spin < 4096; ++spin) {
    if (state->done.load(std::memory_order_acquire) == tasks) return;
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  std::unique_lock<std::mutex> lock(state->mu);
  state->finished.wait(lock, [&] { return state->done.load(std::memory_order_acquire) == tasks; });
}

}  // namespace disc_tf

#endif  // DISC_TF_CC_RAL_RUN_TASKS_H_
