// packed_weights.cc -- see packed_weights.h.
#include "cc/ral/packed_weights.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "cc/kernels/stats.h"

namespace disc_tf {
namespace {

// Bytes of packed weights held by every cache of the process.
std::atomic<int64_t> g_packed_bytes{0};

int64_t BudgetBytes() {
  static const int64_t budget = [] {
    const char* env = std::getenv("DISC_TF_PACKED_WEIGHTS_MB");
    int64_t mb = 4096;
    if (env != nullptr && *env != '\0') mb = std::max<int64_t>(0, std::atoll(env));
    return mb << 20;
  }();
  return budget;
}

}  // namespace

bool PackWeightsEnabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("DISC_TF_PACK_WEIGHTS");
    return env == nullptr || std::string(env) != "0";
  }();
  return enabled;
}

int64_t PackedWeights::PackedBytes() const { return bytes_.load(std::memory_order_relaxed); }

PackedWeights::~PackedWeights() {
  for (const auto& [key, entry] : entries_)
    g_packed_bytes.fetch_sub(entry.packed->floats * 4, std::memory_order_relaxed);
}

int PackedWeights::EvictStaleLocked(int input_index, const void* current) {
  int dropped = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.input_index == input_index && it->second.held.data() != current) {
      g_packed_bytes.fetch_sub(it->second.packed->floats * 4, std::memory_order_relaxed);
      bytes_.fetch_sub(it->second.packed->floats * 4, std::memory_order_relaxed);
      it = entries_.erase(it);
      ++dropped;
    } else {
      ++it;
    }
  }
  return dropped;
}

std::shared_ptr<const PackedOperand> PackedWeights::Get(
    int input_index, const tensorflow::Tensor& input, const float* b, int64_t k, int64_t n,
    int64_t ldb, bool tb, const GemmPacker& packer, const TaskRunner& run) {
  return Lookup(input_index, input, Key{b, k, n, ldb, tb, 0}, b, k, n, ldb, tb, nullptr, packer,
                run);
}

std::shared_ptr<const PackedOperand> PackedWeights::GetDerived(
    int input_index, const tensorflow::Tensor& input, const float* b, int variant, int64_t k,
    int64_t n, const Derive& derive, const GemmPacker& packer, const TaskRunner& run) {
  return Lookup(input_index, input, Key{b, k, n, n, false, variant}, nullptr, k, n, n, false,
                &derive, packer, run);
}

std::shared_ptr<const PackedOperand> PackedWeights::Lookup(
    int input_index, const tensorflow::Tensor& input, const Key& key, const float* b, int64_t k,
    int64_t n, int64_t ldb, bool tb, const Derive* derive, const GemmPacker& packer,
    const TaskRunner& run) {
  if (!PackWeightsEnabled() || packer.pack_b == nullptr) return nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) return it->second.packed;
    if (uncached_.count(input_index) != 0) return nullptr;
    // The input moved to a new buffer (a new variable value): the packed
    // copies of its old value are never read again.
    if (EvictStaleLocked(input_index, input.data()) > 0 &&
        ++moves_[input_index] >= kMaxMoves) {
      uncached_.insert(input_index);
      return nullptr;
    }
  }
  const int64_t floats = packer.packed_size(k, n);
  const int64_t bytes = floats * 4;
  if (g_packed_bytes.fetch_add(bytes, std::memory_order_relaxed) + bytes > BudgetBytes()) {
    g_packed_bytes.fetch_sub(bytes, std::memory_order_relaxed);
    return nullptr;
  }
  auto packed = std::make_shared<PackedOperand>();
  packed->data.reset(static_cast<float*>(aligned_alloc(64, (bytes + 63) / 64 * 64)));
  if (packed->data == nullptr) {
    g_packed_bytes.fetch_sub(bytes, std::memory_order_relaxed);
    return nullptr;
  }
  packed->floats = floats;
  std::unique_ptr<float[]> derived;
  if (derive != nullptr) {
    derived.reset(new (std::nothrow) float[k * n]);
    if (derived == nullptr) {
      g_packed_bytes.fetch_sub(bytes, std::memory_order_relaxed);
      return nullptr;
    }
    (*derive)(derived.get());
    b = derived.get();
  }
  // Column ranges of whole panels, packed in parallel: panel q of the whole
  // operand starts at q * panel * k floats, wherever the range starts.
  const int64_t panel = packer.panel();
  const int64_t chunk = std::max<int64_t>(1, (1 << 18) / std::max<int64_t>(k, 1) / panel) * panel;
  float* out = packed->data.get();
  run((n + chunk - 1) / chunk, [&](int64_t t) {
    const int64_t j0 = t * chunk, cols = std::min(chunk, n - j0);
    packer.pack_b(k, cols, tb ? b + j0 * ldb : b + j0, ldb, tb ? 1 : 0, out + j0 * k);
  });
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = entries_.try_emplace(key, Entry{input_index, input, packed});
  if (!inserted) {
    // Another call packed the same operand meanwhile: keep one copy.
    g_packed_bytes.fetch_sub(bytes, std::memory_order_relaxed);
    return it->second.packed;
  }
  bytes_.fetch_add(bytes, std::memory_order_relaxed);
  stats::Add(stats::kPackedWeights, 1);
  return packed;
}

}  // namespace disc_tf
