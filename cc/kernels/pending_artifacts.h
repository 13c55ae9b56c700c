// pending_artifacts.h -- artifacts compiled in the background, by key.
//
// With asynchronous compilation the graph pass rewrites a cluster into a
// DiscCluster node whose `artifact` is empty and whose `pending_key` names a
// compilation still running. Until the compiler publishes that key, the node
// runs its fallback function (the original ops); every call after the
// publication runs the compiled artifact. A key that failed stays on the
// fallback for good. The switch is per call, so no call is lost or mixed.
#ifndef DISC_TF_CC_KERNELS_PENDING_ARTIFACTS_H_
#define DISC_TF_CC_KERNELS_PENDING_ARTIFACTS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "cc/kernels/artifact_loader.h"

namespace disc_tf {

enum class PendingState : int32_t {
  kUnknown = 0,  // nothing published for the key yet
  kReady = 1,    // compiled and loaded
  kFailed = 2,   // compiling or loading failed; use the fallback
};

// Loads `bytes` (checked against `sha256_hex`) and makes it the artifact of
// `key`. A load failure marks the key failed and is returned. The first
// publication of a key wins; later ones are ignored.
absl::Status PublishPending(const std::string& key, absl::string_view bytes,
                            const std::string& sha256_hex, int64_t num_kernels);

// Marks `key` failed (the compiler gave up); `reason` is logged once.
void FailPending(const std::string& key, const std::string& reason);

// The state of `key`; sets *out when it is kReady. A lookup while the key is
// still unknown counts a call that ran the fallback (PendingCalls).
PendingState LookupPending(const std::string& key, const LoadedArtifact** out);

// The state of `key`, counting no call (for the compiler side).
PendingState PendingStateOf(const std::string& key);

// Calls that ran `key`'s fallback while it was compiling: the compile queue
// builds the hottest waiting cluster first.
int64_t PendingCalls(const std::string& key);

}  // namespace disc_tf

extern "C" {
// C entry points for the Python compiler thread (ctypes). Publish returns 1 if
// the artifact loaded, 0 if not; state returns a PendingState value.
__attribute__((visibility("default"))) int32_t disc_pending_publish(
    const char* key, const char* data, int64_t size, const char* sha256_hex,
    int64_t num_kernels);
__attribute__((visibility("default"))) void disc_pending_fail(const char* key,
                                                              const char* reason);
__attribute__((visibility("default"))) int32_t disc_pending_state(const char* key);
__attribute__((visibility("default"))) int64_t disc_pending_calls(const char* key);
}

#endif  // DISC_TF_CC_KERNELS_PENDING_ARTIFACTS_H_
