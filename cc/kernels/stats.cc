// stats.cc -- process-wide DISC runtime counters.
#include "cc/kernels/stats.h"

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_set>

namespace disc_tf {
namespace stats {

namespace {

constexpr const char* kNames[kNumCounters] = {
    "clusters", "compilations", "cache_hits", "fallbacks", "kernels", "peak_temp_bytes",
    "packed_weights", "untrusted", "rebuilds", "pool_wakes",
    "resident_weight_gemms", "masked_elements", "temp_reuses", "temp_kept_bytes",
    "folded_reuses", "register_epilogues", "layer_blocks"};

std::atomic<int64_t> g_counters[kNumCounters];

// Guards g_seen and makes NoteCluster/Reset atomic with respect to each other.
std::mutex& SeenMu() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}

std::unordered_set<std::string>& Seen() {
  static auto* seen = new std::unordered_set<std::string>;
  return *seen;
}

int IndexOf(const char* name) {
  if (name == nullptr) return -1;
  for (int i = 0; i < kNumCounters; ++i) {
    if (std::strcmp(kNames[i], name) == 0) return i;
  }
  return -1;
}

}  // namespace

const char* CounterName(int c) {
  return (c >= 0 && c < kNumCounters) ? kNames[c] : "";
}

void Add(Counter c, int64_t n) {
  if (c < 0 || c >= kNumCounters) return;
  g_counters[c].fetch_add(n, std::memory_order_relaxed);
}

bool Add(const std::string& name, int64_t n) {
  const int i = IndexOf(name.c_str());
  if (i < 0) return false;
  g_counters[i].fetch_add(n, std::memory_order_relaxed);
  return true;
}

bool NoteCluster(const std::string& sha256, int64_t num_kernels) {
  std::lock_guard<std::mutex> lock(SeenMu());
  if (!Seen().insert(sha256).second) return false;
  g_counters[kClusters].fetch_add(1, std::memory_order_relaxed);
  g_counters[kKernels].fetch_add(num_kernels, std::memory_order_relaxed);
  return true;
}

void NoteMax(Counter c, int64_t value) {
  if (c < 0 || c >= kNumCounters) return;
  int64_t seen = g_counters[c].load(std::memory_order_relaxed);
  while (value > seen &&
         !g_counters[c].compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

void Get(int64_t out[kNumCounters]) {
  for (int i = 0; i < kNumCounters; ++i) {
    out[i] = g_counters[i].load(std::memory_order_relaxed);
  }
}

void Reset() {
  std::lock_guard<std::mutex> lock(SeenMu());
  Seen().clear();
  for (int i = 0; i < kNumCounters; ++i) {
    if (i == kTempKeptBytes) continue;  // a level: the kept buffers stay kept
    g_counters[i].store(0, std::memory_order_relaxed);
  }
}

}  // namespace stats
}  // namespace disc_tf

extern "C" {

void disc_stats_get(int64_t out[disc_tf::stats::kNumCounters]) {
  if (out != nullptr) disc_tf::stats::Get(out);
}

void disc_stats_reset(void) { disc_tf::stats::Reset(); }

int32_t disc_stats_add(const char* name, int64_t n) {
  if (name == nullptr) return 0;
  return disc_tf::stats::Add(std::string(name), n) ? 1 : 0;
}

int32_t disc_stats_note_cluster(const char* sha, int64_t num_kernels) {
  return disc_tf::stats::NoteCluster(sha ? std::string(sha) : std::string(),
                                     num_kernels)
             ? 1
             : 0;
}

}  // extern "C"
