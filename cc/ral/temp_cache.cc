// temp_cache.cc -- small scratch buffers a DiscCluster kernel keeps for reuse.
#include "cc/ral/temp_cache.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "cc/kernels/stats.h"

namespace disc_tf {

namespace {

// Bytes kept by all kernels of the process.
std::atomic<int64_t> g_kept_total{0};

// The largest kept buffer a request of `bytes` may take.
int64_t MostFor(int64_t bytes) {
  const int64_t quarter = bytes + bytes / 4;
  const int64_t small = bytes + 4096;
  return quarter > small ? quarter : small;
}

// DISC_TF_TEMP_POISON=1: fill every buffer kept with 0xff bytes (NaN as float,
// -1 as int), so that a kernel reading a temporary before writing it shows in
// its results (a test switch; glibc and TF's allocators hand out stale memory too).
bool Poison() {
  static const bool poison = [] {
    const char* v = std::getenv("DISC_TF_TEMP_POISON");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return poison;
}

// The process-wide bound in bytes (DISC_TF_TEMP_KEEP_MB, read once).
int64_t ProcessLimit() {
  static const int64_t limit = [] {
    const char* v = std::getenv("DISC_TF_TEMP_KEEP_MB");
    if (v == nullptr || *v == '\0') return int64_t{256} << 20;
    char* end = nullptr;
    const long long mb = std::strtoll(v, &end, 10);
    if (end == v || mb < 0) return int64_t{256} << 20;
    return static_cast<int64_t>(mb) << 20;
  }();
  return limit;
}

}  // namespace

TempCache::~TempCache() { Clear(); }

bool TempCache::Take(int64_t bytes, tensorflow::Tensor* out) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t most = MostFor(bytes);
  size_t best = kept_.size();
  for (size_t i = 0; i < kept_.size(); ++i) {  // the smallest that fits
    const int64_t size = kept_[i].first;
    if (size >= bytes && size <= most && (best == kept_.size() || size < kept_[best].first)) {
      best = i;
    }
  }
  if (best == kept_.size()) return false;
  const int64_t size = kept_[best].first;
  *out = std::move(kept_[best].second);
  if (best + 1 != kept_.size()) kept_[best] = std::move(kept_.back());
  kept_.pop_back();
  kept_bytes_ -= size;
  g_kept_total.fetch_sub(size, std::memory_order_relaxed);
  stats::Add(stats::kTempKeptBytes, -size);
  stats::Add(stats::kTempReuses, 1);
  return true;
}

void TempCache::Keep(tensorflow::Tensor t, int64_t bytes, int64_t call_peak) {
  if (bytes > kLargestKept) return;  // `t` is released as it goes
  std::lock_guard<std::mutex> lock(mu_);
  if (call_peak > most_held_) most_held_ = call_peak;
  if (kept_bytes_ + bytes > most_held_) return;
  const int64_t total = g_kept_total.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  if (total > ProcessLimit()) {
    g_kept_total.fetch_sub(bytes, std::memory_order_relaxed);
    return;
  }
  if (Poison()) std::memset(const_cast<char*>(t.tensor_data().data()), 0xff, bytes);
  kept_.emplace_back(bytes, std::move(t));
  kept_bytes_ += bytes;
  stats::Add(stats::kTempKeptBytes, bytes);
}

void TempCache::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  kept_.clear();
  g_kept_total.fetch_sub(kept_bytes_, std::memory_order_relaxed);
  stats::Add(stats::kTempKeptBytes, -kept_bytes_);
  kept_bytes_ = 0;
}

}  // namespace disc_tf
