// artifact_trust.h -- which embedded artifacts this process may load.
//
// A DiscCluster node carries a shared object. Loading it runs its code (its
// constructors run inside dlopen), so a node's artifact is loaded only when
// one of its signatures (the node's `artifact_signatures`) vouches for it:
//
//   ed25519:<key id>:<signature hex>  -- by a key this host trusts
//       ($DISC_TF_TRUSTED_KEYS: ':'-separated PEM files of Ed25519 public
//       keys; verified with the system's OpenSSL libcrypto, loaded at run
//       time; without it no Ed25519 signature verifies);
//   local:<hmac hex>                   -- an HMAC-SHA256 under this user's
//       private secret (the artifact cache's key file, 0600), which this
//       user's own compiler attaches to everything it builds.
//
// Both sign ArtifactMessage(sha256): they vouch for the bytes, that the key
// holder's compiler built them. (A SHA-256 alone proves nothing: it travels
// beside the bytes it describes.) Which cluster runs them is the model's
// business, as its fallback functions are: a model edited to hand one
// cluster's signed artifact to another runs only code the key holder built.
//
// The policy ($DISC_TF_ARTIFACTS, or disc_trust_configure) says what a node
// whose artifact is not vouched for does:
//   trusted  (default) -- rebuild the cluster on this host from its fallback
//                         function, and run that;
//   rebuild            -- the same, and Ed25519 signatures count for nothing:
//                         only this user's own artifacts load;
//   fallback           -- run the fallback function (TF's own ops).
// DISC_TF_FORCE_FALLBACK=1 loads no native code at all.
#ifndef DISC_TF_CC_KERNELS_ARTIFACT_TRUST_H_
#define DISC_TF_CC_KERNELS_ARTIFACT_TRUST_H_

#include <cstdint>
#include <string>
#include <vector>

namespace disc_tf {

enum class ArtifactPolicy : int32_t { kTrusted = 0, kRebuild = 1, kFallback = 2 };

// The process's policy: the last disc_trust_configure, else $DISC_TF_ARTIFACTS
// (an unknown value is reported once and read as `trusted`).
ArtifactPolicy CurrentArtifactPolicy();

// The message a signature signs.
std::string ArtifactMessage(const std::string& sha256_hex);

struct TrustVerdict {
  bool trusted = false;
  std::string reason;  // why not (or which signature vouched)
};

// Whether `signatures` vouch for the artifact `sha256_hex` (Ed25519 ones only
// with `ed25519`).
TrustVerdict CheckArtifactTrust(const std::string& sha256_hex,
                                const std::vector<std::string>& signatures, bool ed25519);

// Records that this process's own compiler produced the artifact `sha256_hex`
// (a rebuild, the graph pass): nodes carrying it load it under every policy.
void NoteBuiltHere(const std::string& sha256_hex);

// Whether a node carrying this artifact may load it under the current policy
// (the verdict says why not): built by this process, signed by this user, or
// -- unless the policy is `rebuild` -- signed by a trusted key.
TrustVerdict MayLoadEmbedded(const std::string& sha256_hex,
                             const std::vector<std::string>& signatures);

}  // namespace disc_tf

extern "C" {
// Sets the policy ("trusted", "rebuild", "fallback"; null or "" keeps it) and
// the trusted keys (':'-separated PEM paths; null keeps them, "" trusts none).
// Returns 0, or -1 with `error` filled when the policy is unknown or a key file
// does not parse (nothing changes then).
__attribute__((visibility("default"))) int32_t disc_trust_configure(
    const char* policy, const char* key_paths, char* error, int64_t error_size);
// 1 if `signatures` ('\n'-separated) vouch for the artifact under the current
// policy, else 0 with the reason in `reason`.
__attribute__((visibility("default"))) int32_t disc_trust_check(
    const char* sha256_hex, const char* signatures, char* reason, int64_t reason_size);
// The current policy as a string ("trusted", "rebuild", "fallback").
__attribute__((visibility("default"))) const char* disc_trust_policy(void);
}

#endif  // DISC_TF_CC_KERNELS_ARTIFACT_TRUST_H_
