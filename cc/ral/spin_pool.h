// spin_pool.h -- the RAL's own worker threads for RunTasks: after each job a
// worker keeps polling for the next one for a short while before it sleeps.
// Header-only and free of TensorFlow, so that a benchmark harness
// (bench/gemm_libs) runs GEMM blocks on the same pool.
//
// Why not TensorFlow's intra-op pool: its threads sleep a few microseconds
// after their last job, and waking a sleeping thread (a futex wake, and on a
// virtual machine the wake of an idle virtual CPU) took longer than a small
// GEMM block. A 16 x 512 x 256 product (27 us on two threads when the helper
// is awake) took 44 us on TF's pool, no faster than one thread (47 us; AVX2,
// 2 cores, bench/GEMM.md). The launches of one cluster call come a few
// microseconds apart, and a serving loop's calls tens of microseconds apart,
// so a worker that polls for `spin_us` after each job is awake for all of
// them, and sleeps when the process is idle. ONNX Runtime's intra-op threads
// poll the same way. With `pin_workers`, each worker runs on a CPU of its own
// (worker_cpus.h), as ONNX Runtime's do.
#ifndef DISC_TF_CC_RAL_SPIN_POOL_H_
#define DISC_TF_CC_RAL_SPIN_POOL_H_

#include <stdint.h>
#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <functional>
#include <mutex>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "cc/ral/worker_cpus.h"

namespace disc_tf {

// How long the RAL's workers poll after a job (DISC_TF_SPIN_US, microseconds, default 200,
// at most a second; 0: they sleep at once), read here so that a harness's pool polls as
// the RAL's does.
inline int64_t SpinMicrosFromEnv() {
  const char* v = std::getenv("DISC_TF_SPIN_US");
  if (v == nullptr || *v == '\0') return 200;
  char* end = nullptr;
  const long long us = std::strtoll(v, &end, 10);
  return end != v && *end == '\0' && us >= 0 ? std::min<long long>(us, 1000000) : 200;
}

// Whether the RAL's workers are pinned to a CPU each (DISC_TF_PIN_WORKERS, default 1;
// 0 leaves them to the scheduler; worker_cpus.h says why).
inline bool PinWorkersFromEnv() {
  const char* v = std::getenv("DISC_TF_PIN_WORKERS");
  return v == nullptr || std::string_view(v) != "0";
}

// Worker threads taking jobs from one queue. Thread-safe; jobs of several
// callers may be queued at once. Workers are started on demand (Reserve) and
// live as long as the pool.
class SpinPool {
 public:
  // spin_us: how long a worker polls for a job after its last one (0: it
  // sleeps at once). pin_workers: pin each worker to a CPU of its own (Linux).
  explicit SpinPool(int64_t spin_us, bool pin_workers = false)
      : spin_(std::chrono::microseconds(spin_us)), pin_workers_(pin_workers) {}

  ~SpinPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  SpinPool(const SpinPool&) = delete;
  SpinPool& operator=(const SpinPool&) = delete;

  // Starts workers until there are at least `workers`; returns how many there
  // are. Never throws: when the system refuses a thread (a thread limit, no
  // memory) the pool stays at the workers it has and stops trying.
  // Workers inherit the starting thread's CPU affinity and signal mask; with
  // pin_workers, each is then pinned to one of those CPUs (WorkerCpus: the ones
  // after the CPU the starting thread runs on), where there are enough of them.
  int Reserve(int workers) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::vector<int> cpus =
        pin_workers_ && static_cast<int>(threads_.size()) < workers ? CpusFor(workers)
                                                                    : std::vector<int>();
    while (!refused_ && static_cast<int>(threads_.size()) < workers) {
      try {
        threads_.emplace_back([this] { Loop(); });
      } catch (...) {  // std::system_error from std::thread, or bad_alloc
        refused_ = true;
        break;
      }
#if defined(__linux__)
      pthread_setname_np(threads_.back().native_handle(), "disc_tf_worker");
      const size_t k = threads_.size() - 1;
      if (k < cpus.size()) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpus[k], &one);
        // A refusal (a CPU taken away meanwhile) leaves the worker unpinned.
        pthread_setaffinity_np(threads_.back().native_handle(), sizeof(one), &one);
      }
#endif
    }
    return static_cast<int>(threads_.size());
  }

  // True once the system refused a thread.
  bool Refused() {
    std::lock_guard<std::mutex> lock(mu_);
    return refused_;
  }

  // Wakes up to `workers` sleeping workers with an empty job each, so that they
  // poll (for spin_us) when a caller's first real job comes: waking a sleeping
  // worker (a futex wake, and on a virtual machine an idle virtual CPU) took
  // 50-100 us here, more than a small product takes. Nothing when none sleeps, or
  // when workers do not poll (spin_us 0). Returns how many it woke.
  int Wake(int workers) {
    if (spin_.count() <= 0) return 0;
    int woken = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      woken = std::max(0, std::min(workers, sleepers_ - static_cast<int>(jobs_.size())));
      for (int i = 0; i < woken; ++i) jobs_.push_back([] {});
      queued_.fetch_add(woken, std::memory_order_release);
    }
    for (int i = 0; i < woken; ++i) wake_.notify_one();
    return woken;
  }

  // Queues `job` for the next free worker.
  void Schedule(std::function<void()> job) {
    bool sleeping;
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(std::move(job));
      queued_.fetch_add(1, std::memory_order_release);
      sleeping = sleepers_ > 0;
    }
    if (sleeping) wake_.notify_one();
  }

 private:
  // Takes a queued job, if any (mu_ held).
  bool PopLocked(std::function<void()>* job) {
    if (jobs_.empty()) return false;
    *job = std::move(jobs_.front());
    jobs_.pop_front();
    queued_.fetch_sub(1, std::memory_order_relaxed);
    return true;
  }

  // The CPUs to pin `workers` workers to (empty: leave them unpinned).
  static std::vector<int> CpusFor(int workers) {
#if defined(__linux__)
    cpu_set_t mask;
    CPU_ZERO(&mask);
    if (sched_getaffinity(0, sizeof(mask), &mask) != 0) return {};
    std::vector<int> allowed;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &mask)) allowed.push_back(cpu);
    }
    return WorkerCpus(allowed, sched_getcpu(), workers);
#else
    (void)workers;
    return {};
#endif
  }

  // Polls for a job until spin_ has passed since the last one.
  bool PollFor(std::function<void()>* job) {
    if (spin_.count() <= 0) return false;
    const auto deadline = std::chrono::steady_clock::now() + spin_;
    for (;;) {
      for (int i = 0; i < 64; ++i) {
        if (queued_.load(std::memory_order_acquire) > 0) {
          std::lock_guard<std::mutex> lock(mu_);
          if (PopLocked(job)) return true;
        }
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
      }
      if (std::chrono::steady_clock::now() >= deadline) return false;
    }
  }

  void Loop() {
    for (;;) {
      std::function<void()> job;
      if (!PollFor(&job)) {
        std::unique_lock<std::mutex> lock(mu_);
        ++sleepers_;
        wake_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
        --sleepers_;
        if (!PopLocked(&job)) return;  // stopping, nothing queued
      }
      job();
    }
  }

  const std::chrono::nanoseconds spin_;
  const bool pin_workers_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_;
  std::atomic<int64_t> queued_{0};
  int sleepers_ = 0;
  bool stop_ = false;
  bool refused_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace disc_tf

#endif  // DISC_TF_CC_RAL_SPIN_POOL_H_
