// folded_values.cc -- results of weight-only kernels kept across calls (RAL ABI 10).
#include "cc/ral/folded_values.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "cc/kernels/stats.h"
#include "cc/ral/disc_ral_tf.h"

namespace disc_tf {

namespace {

// DISC_TF_FOLD=0 turns folding off (read once).
bool FoldingOn() {
  static const bool on = [] {
    const char* v = std::getenv("DISC_TF_FOLD");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return on;
}

bool SameBuffer(const tensorflow::Tensor& held, const tensorflow::Tensor& now) {
  return held.dtype() == now.dtype() && held.shape() == now.shape() &&
         held.tensor_data().data() == now.tensor_data().data();
}

// Lets this call's GEMMs find `e`'s outputs as weights they may pack once.
void ShowAsWeights(TfRal* r, int32_t site, const FoldedEntry& e) {
  if (r->packed_weights == nullptr || e.outputs.size() > 1024) return;
  for (size_t i = 0; i < e.outputs.size(); ++i) {
    const tensorflow::Tensor& t = e.outputs[i];
    const float* begin = reinterpret_cast<const float*>(t.tensor_data().data());
    r->folded_spans.push_back({begin, begin + t.NumElements() / 4,
                               FoldedIndex(r->num_inputs, site, static_cast<int>(i)), &t});
  }
}

}  // namespace

std::shared_ptr<const FoldedEntry> FoldedValues::Find(
    int32_t site, const std::vector<tensorflow::Tensor>& values, const int32_t* inputs,
    int32_t n_inputs, const int64_t* key, int32_t n_key, const int64_t* bytes, int32_t n_outputs,
    bool* off) {
  std::lock_guard<std::mutex> lock(mu_);
  Site& s = sites_[site];
  *off = s.moves >= kMaxMoves;
  if (s.entry == nullptr || *off) return nullptr;
  const FoldedEntry& e = *s.entry;
  bool same = e.inputs.size() == static_cast<size_t>(n_inputs) &&
              e.key.size() == static_cast<size_t>(n_key) &&
              e.outputs.size() == static_cast<size_t>(n_outputs) &&
              std::equal(key, key + n_key, e.key.begin());
  for (int32_t j = 0; same && j < n_inputs; ++j) same = SameBuffer(e.inputs[j], values[inputs[j]]);
  for (int32_t i = 0; same && i < n_outputs; ++i)
    same = e.outputs[i].NumElements() == std::max<int64_t>(bytes[i], 1);
  if (same) return s.entry;
  // A new value, or dims that change with the call's shapes (a broadcast to the batch)
  if (++s.moves >= kMaxMoves) {
    *off = true;
    s.entry.reset();  // and its references to the old buffers
  }
  return nullptr;
}

void FoldedValues::Publish(int32_t site, std::shared_ptr<const FoldedEntry> entry) {
  std::shared_ptr<const FoldedEntry> old;  // released outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  Site& s = sites_[site];
  if (s.moves < kMaxMoves) old = std::exchange(s.entry, std::move(entry));
}

int32_t RalFoldBegin(disc_ral* ral, int32_t site, const int32_t* inputs, int32_t n_inputs,
                     const int64_t* key, int32_t n_key, const int64_t* bytes,
                     int32_t n_outputs, void** outs) {
  TfRal* r = TfRal::From(ral);
  if (r->folded == nullptr || !FoldingOn() || n_inputs <= 0 || n_outputs <= 0 || n_key < 0)
    return -1;
  int64_t total = 0;
  for (int32_t i = 0; i < n_outputs; ++i) {
    if (bytes[i] < 0) return -1;
    total += bytes[i];
  }
  if (total > kMostFoldedBytes) return -1;
  for (int32_t j = 0; j < n_inputs; ++j) {
    const int32_t i = inputs[j];
    if (i < 0 || i >= static_cast<int32_t>(r->constant_input.size()) || !r->constant_input[i] ||
        !r->inputs[i].IsInitialized())
      return -1;
  }
  bool off = false;
  if (std::shared_ptr<const FoldedEntry> e =
          r->folded->Find(site, r->inputs, inputs, n_inputs, key, n_key, bytes, n_outputs, &off)) {
    for (int32_t i = 0; i < n_outputs; ++i)
      outs[i] = const_cast<char*>(e->outputs[i].tensor_data().data());
    ShowAsWeights(r, site, *e);
    r->folds_held.push_back(std::move(e));
    stats::Add(stats::kFoldedReuses, 1);
    // The launch profile numbers launches in call order: the skipped one keeps its
    // number, so that every later launch keeps its row across calls.
    if (r->profiling && total > 0) ++r->launches;
    return 1;
  }
  if (off) return -1;
  auto e = std::make_shared<FoldedEntry>();
  for (int32_t j = 0; j < n_inputs; ++j) e->inputs.push_back(r->inputs[inputs[j]]);
  e->key.assign(key, key + n_key);
  for (int32_t i = 0; i < n_outputs; ++i) {
    tensorflow::Tensor t;
    // int8 elements: any output's bytes; TF's CPU allocator aligns to 64 bytes.
    if (!r->ctx
             ->allocate_temp(tensorflow::DT_INT8,
                             tensorflow::TensorShape({std::max<int64_t>(bytes[i], 1)}), &t)
             .ok())
      return -1;  // computed into temporaries instead, which report the shortage
    outs[i] = const_cast<char*>(t.tensor_data().data());
    e->outputs.push_back(std::move(t));
  }
  r->folds_pending.emplace_back(site, std::move(e));
  return 0;
}

void RalFoldDone(disc_ral* ral, int32_t site) {
  TfRal* r = TfRal::From(ral);
  auto& pending = r->folds_pending;
  auto it = std::find_if(pending.begin(), pending.end(),
                         [site](const auto& p) { return p.first == site; });
  if (it == pending.end() || r->folded == nullptr) return;
  std::shared_ptr<const FoldedEntry> e = std::move(it->second);
  pending.erase(it);
  r->folded->Publish(site, e);
  ShowAsWeights(r, site, *e);
  r->folds_held.push_back(std::move(e));  // this call reads it even if replaced meanwhile
}

}  // namespace disc_tf
