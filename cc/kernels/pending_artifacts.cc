// pending_artifacts.cc -- the process-wide table of background compilations.
#include "cc/kernels/pending_artifacts.h"

#include <map>
#include <mutex>
#include <string>

#include "cc/kernels/stats.h"
#include "tensorflow/core/platform/logging.h"

namespace disc_tf {
namespace {

struct Entry {
  PendingState state = PendingState::kUnknown;
  const LoadedArtifact* artifact = nullptr;
  int64_t calls = 0;  // lookups while unknown: calls that ran the fallback
};

std::mutex& Mu() {
  static auto* mu = new std::mutex;
  return *mu;
}

std::map<std::string, Entry>& Table() {
  static auto* table = new std::map<std::string, Entry>;
  return *table;
}

}  // namespace

absl::Status PublishPending(const std::string& key, absl::string_view bytes,
                            const std::string& sha256_hex, int64_t num_kernels) {
  {
    std::lock_guard<std::mutex> lock(Mu());
    if (Table()[key].state != PendingState::kUnknown) return absl::OkStatus();
  }
  const LoadedArtifact* loaded = nullptr;
  absl::Status s = LoadArtifact(bytes, sha256_hex, &loaded);
  std::lock_guard<std::mutex> lock(Mu());
  Entry& e = Table()[key];
  if (e.state != PendingState::kUnknown) return absl::OkStatus();
  if (!s.ok()) {
    e.state = PendingState::kFailed;
    LOG(WARNING) << "disc_tf: compiled cluster " << key
                 << " cannot be loaded; its original ops keep running: " << s.message();
    return s;
  }
  e.state = PendingState::kReady;
  e.artifact = loaded;
  if (num_kernels <= 0) num_kernels = loaded->num_kernels();
  stats::NoteCluster(loaded->sha256, num_kernels);
  return absl::OkStatus();
}

void FailPending(const std::string& key, const std::string& reason) {
  std::lock_guard<std::mutex> lock(Mu());
  Entry& e = Table()[key];
  if (e.state != PendingState::kUnknown) return;
  e.state = PendingState::kFailed;
  LOG(WARNING) << "disc_tf: cluster " << key
               << " was not compiled; its original ops keep running: " << reason;
}

PendingState LookupPending(const std::string& key, const LoadedArtifact** out) {
  std::lock_guard<std::mutex> lock(Mu());
  Entry& e = Table()[key];
  if (e.state == PendingState::kUnknown) ++e.calls;
  if (e.state == PendingState::kReady) *out = e.artifact;
  return e.state;
}

PendingState PendingStateOf(const std::string& key) {
  std::lock_guard<std::mutex> lock(Mu());
  auto it = Table().find(key);
  return it == Table().end() ? PendingState::kUnknown : it->second.state;
}

int64_t PendingCalls(const std::string& key) {
  std::lock_guard<std::mutex> lock(Mu());
  auto it = Table().find(key);
  return it == Table().end() ? 0 : it->second.calls;
}

}  // namespace disc_tf

extern "C" {

int32_t disc_pending_publish(const char* key, const char* data, int64_t size,
                             const char* sha256_hex, int64_t num_kernels) {
  if (key == nullptr || data == nullptr || sha256_hex == nullptr || size < 0) return 0;
  absl::Status s = disc_tf::PublishPending(
      key, absl::string_view(data, static_cast<size_t>(size)), sha256_hex, num_kernels);
  return s.ok() ? 1 : 0;
}

void disc_pending_fail(const char* key, const char* reason) {
  if (key == nullptr) return;
  disc_tf::FailPending(key, reason != nullptr ? reason : "");
}

int32_t disc_pending_state(const char* key) {
  return key == nullptr ? 0 : static_cast<int32_t>(disc_tf::PendingStateOf(key));
}

int64_t disc_pending_calls(const char* key) {
  return key == nullptr ? 0 : disc_tf::PendingCalls(key);
}

}  // extern "C"
