// artifact_loader.h -- process-wide registry of loaded cluster artifacts.
//
// An artifact is a shared object (see cc/ral/disc_ral.h; a CUDA one:
// cc/ral/disc_ral_cuda.h) carried as bytes in a DiscCluster node. It is verified against its SHA-256, loaded once per
// process (from an in-memory file when possible, so no writable cache is
// needed) and never unloaded.
#ifndef DISC_TF_CC_KERNELS_ARTIFACT_LOADER_H_
#define DISC_TF_CC_KERNELS_ARTIFACT_LOADER_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "cc/ral/disc_ral.h"

namespace disc_tf {

// A loaded artifact. Lives until the process exits.
struct LoadedArtifact {
  std::string sha256;  // lowercase hex
  std::string path;    // the path it was dlopen-ed from
  void* handle = nullptr;
  int32_t (*abi_version)(void) = nullptr;
  int32_t (*num_kernels)(void) = nullptr;
  int32_t (*entry)(disc_ral*) = nullptr;  // null for a CUDA artifact
  // A CUDA artifact's entry (disc_ral_cuda.h: disc_cuda_entry); null for a CPU one.
  void* cuda_entry = nullptr;
  // Optional: temporary bytes the calling thread's last call held at its peak.
  int64_t (*peak_temp_bytes)(void) = nullptr;
};

// Lowercase hex SHA-256 of `data`.
std::string Sha256Hex(const void* data, size_t size);

// Verifies that sha256(bytes) == expected_sha256_hex (case-insensitive),
// then returns the process-wide LoadedArtifact for it, loading it on first
// use. Load failures are remembered: later calls with the same sha return the
// same error without retrying. Thread-safe.
absl::Status LoadArtifact(absl::string_view bytes,
                          absl::string_view expected_sha256_hex,
                          const LoadedArtifact** out);

}  // namespace disc_tf

#endif  // DISC_TF_CC_KERNELS_ARTIFACT_LOADER_H_
