// artifact_trust.cc -- signature checks for embedded artifacts (see the header).
#include "cc/kernels/artifact_trust.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cc/kernels/artifact_loader.h"
#include "tensorflow/core/platform/logging.h"

namespace disc_tf {
namespace {

constexpr size_t kEd25519KeyBytes = 32;
constexpr size_t kEd25519SigBytes = 64;
constexpr size_t kSecretBytes = 32;
// DER SubjectPublicKeyInfo of an Ed25519 key, before its 32 key bytes.
constexpr unsigned char kEd25519SpkiPrefix[] = {0x30, 0x2a, 0x30, 0x05, 0x06, 0x03,
                                                0x2b, 0x65, 0x70, 0x03, 0x21, 0x00};

// The bytes of a hex string ("" if it is not one).
std::string Unhex(const std::string& hex) {
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    c = absl::ascii_tolower(static_cast<unsigned char>(c));
    return (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
  };
  std::string out;
  if (hex.size() % 2 != 0) return out;
  out.reserve(hex.size() / 2);
  for (size_t i = 0; i < hex.size(); i += 2) {
    const int hi = nibble(hex[i]), lo = nibble(hex[i + 1]);
    if (hi < 0 || lo < 0) return "";
    out.push_back(static_cast<char>(hi * 16 + lo));
  }
  return out;
}

// Key id: the first 16 hex digits of the SHA-256 of the raw public key.
std::string KeyId(const std::string& raw_key) {
  return Sha256Hex(raw_key.data(), raw_key.size()).substr(0, 16);
}

// The raw Ed25519 key of a PEM "PUBLIC KEY" file, or an error.
bool ParsePublicKeyPem(const std::string& path, std::string* raw, std::string* error) {
  std::ifstream in(path);
  if (!in) {
    *error = absl::StrCat("cannot read trusted key file ", path);
    return false;
  }
  std::stringstream text;
  text << in.rdbuf();
  const std::string pem = text.str();
  const std::string begin = "-----BEGIN PUBLIC KEY-----";
  const std::string end = "-----END PUBLIC KEY-----";
  const size_t b = pem.find(begin);
  const size_t e = pem.find(end);
  std::string der;
  if (b == std::string::npos || e == std::string::npos || e < b ||
      !absl::Base64Unescape(absl::StripAsciiWhitespace(
                                pem.substr(b + begin.size(), e - b - begin.size())),
                            &der) ||
      der.size() != sizeof(kEd25519SpkiPrefix) + kEd25519KeyBytes ||
      std::memcmp(der.data(), kEd25519SpkiPrefix, sizeof(kEd25519SpkiPrefix)) != 0) {
    *error = absl::StrCat(path, " is not a PEM Ed25519 public key");
    return false;
  }
  *raw = der.substr(sizeof(kEd25519SpkiPrefix));
  return true;
}

// Ed25519 verification through the system's libcrypto, resolved at run time so
// that the op library needs no OpenSSL to build or load.
struct LibCrypto {
  void* (*new_raw_public_key)(int, void*, const unsigned char*, size_t) = nullptr;
  void (*pkey_free)(void*) = nullptr;
  void* (*md_ctx_new)() = nullptr;
  void (*md_ctx_free)(void*) = nullptr;
  int (*digest_verify_init)(void*, void**, const void*, void*, void*) = nullptr;
  int (*digest_verify)(void*, const unsigned char*, size_t, const unsigned char*,
                       size_t) = nullptr;
  std::string error;  // why it is unusable
};

constexpr int kNidEd25519 = 1087;  // NID_ED25519, stable since OpenSSL 1.1.1

const LibCrypto& Crypto() {
  static const LibCrypto* lib = [] {
    auto* l = new LibCrypto;
    void* h = nullptr;
    // RTLD_DEEPBIND: libtensorflow_framework exports BoringSSL's EVP_* symbols,
    // which would otherwise win over libcrypto's own inside libcrypto (its
    // EVP_PKEY_new_raw_public_key then fails) in a host that links TF.
    for (const char* name : {"libcrypto.so.3", "libcrypto.so.1.1", "libcrypto.so"}) {
      h = ::dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (h != nullptr) break;
    }
    if (h == nullptr) {
      l->error = "OpenSSL's libcrypto is not installed, so no Ed25519 signature verifies";
      return l;
    }
    auto sym = [&](const char* name, auto* out) {
      *out = reinterpret_cast<std::remove_pointer_t<decltype(out)>>(::dlsym(h, name));
      if (*out == nullptr && l->error.empty()) {
        l->error = absl::StrCat("libcrypto lacks ", name, ", so no Ed25519 signature verifies");
      }
    };
    sym("EVP_PKEY_new_raw_public_key", &l->new_raw_public_key);
    sym("EVP_PKEY_free", &l->pkey_free);
    sym("EVP_MD_CTX_new", &l->md_ctx_new);
    sym("EVP_MD_CTX_free", &l->md_ctx_free);
    sym("EVP_DigestVerifyInit", &l->digest_verify_init);
    sym("EVP_DigestVerify", &l->digest_verify);
    return l;
  }();
  return *lib;
}

bool Ed25519Verify(const std::string& raw_key, const std::string& message,
                   const std::string& signature, std::string* error) {
  const LibCrypto& c = Crypto();
  if (!c.error.empty()) {
    *error = c.error;
    return false;
  }
  void* key = c.new_raw_public_key(kNidEd25519, nullptr,
                                   reinterpret_cast<const unsigned char*>(raw_key.data()),
                                   raw_key.size());
  if (key == nullptr) {
    *error = "libcrypto rejected the public key";
    return false;
  }
  void* ctx = c.md_ctx_new();
  bool ok = ctx != nullptr &&
            c.digest_verify_init(ctx, nullptr, nullptr, nullptr, key) == 1 &&
            c.digest_verify(ctx, reinterpret_cast<const unsigned char*>(signature.data()),
                            signature.size(),
                            reinterpret_cast<const unsigned char*>(message.data()),
                            message.size()) == 1;
  if (ctx != nullptr) c.md_ctx_free(ctx);
  c.pkey_free(key);
  if (!ok) *error = "the signature does not verify";
  return ok;
}

std::string HmacSha256Hex(const std::string& key, const std::string& message) {
  std::string block(64, '\0');
  std::memcpy(&block[0], key.data(), std::min<size_t>(key.size(), 64));
  std::string inner(64, '\0'), outer(64, '\0');
  for (int i = 0; i < 64; ++i) {
    inner[i] = static_cast<char>(block[i] ^ 0x36);
    outer[i] = static_cast<char>(block[i] ^ 0x5c);
  }
  inner += message;
  outer += Unhex(Sha256Hex(inner.data(), inner.size()));
  return Sha256Hex(outer.data(), outer.size());
}

// This user's secret (the artifact cache's key file), or "" when it is absent,
// unreadable or could have been written by anyone else.
std::string LocalSecret(std::string* why) {
  std::string path;
  if (const char* p = std::getenv("DISC_TF_CACHE_KEY_FILE"); p != nullptr && *p != '\0') {
    path = p;
  } else if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    path = absl::StrCat(home, "/.config/disc_tf/cache.key");
  } else {
    *why = "no key file (HOME is not set)";
    return "";
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    *why = absl::StrCat("no readable key file ", path);
    return "";
  }
  struct stat st;
  std::string secret(kSecretBytes + 1, '\0');
  ssize_t n = -1;
  if (::fstat(fd, &st) == 0 && st.st_uid == ::geteuid() && (st.st_mode & 077) == 0) {
    n = ::read(fd, &secret[0], secret.size());
  } else {
    *why = absl::StrCat("key file ", path, " is not this user's with mode 0600");
  }
  ::close(fd);
  if (n != static_cast<ssize_t>(kSecretBytes)) {
    if (why->empty()) *why = absl::StrCat("key file ", path, " does not hold 32 bytes");
    return "";
  }
  secret.resize(kSecretBytes);
  return secret;
}

struct TrustConfig {
  std::mutex mu;
  bool policy_set = false;
  ArtifactPolicy policy = ArtifactPolicy::kTrusted;
  bool keys_set = false;
  std::map<std::string, std::string> keys;  // key id -> raw key
  std::set<std::string> built_here;  // sha256 of artifacts this process compiled
};

TrustConfig& Config() {
  static auto* c = new TrustConfig;
  return *c;
}

bool ParsePolicy(const std::string& s, ArtifactPolicy* out) {
  const std::string v = absl::AsciiStrToLower(absl::StripAsciiWhitespace(s));
  if (v == "trusted" || v.empty()) {
    *out = ArtifactPolicy::kTrusted;
  } else if (v == "rebuild") {
    *out = ArtifactPolicy::kRebuild;
  } else if (v == "fallback") {
    *out = ArtifactPolicy::kFallback;
  } else {
    return false;
  }
  return true;
}

bool LoadKeys(const std::string& paths, std::map<std::string, std::string>* keys,
              std::string* error) {
  for (absl::string_view p : absl::StrSplit(paths, ':', absl::SkipWhitespace())) {
    std::string raw;
    if (!ParsePublicKeyPem(std::string(p), &raw, error)) return false;
    (*keys)[KeyId(raw)] = raw;
  }
  return true;
}

// The trusted keys: disc_trust_configure's, else $DISC_TF_TRUSTED_KEYS (read
// once; a file that does not parse is reported and trusts nothing).
std::map<std::string, std::string> TrustedKeys(TrustConfig& c) {
  if (!c.keys_set) {
    c.keys_set = true;
    if (const char* env = std::getenv("DISC_TF_TRUSTED_KEYS"); env != nullptr) {
      std::string error;
      if (!LoadKeys(env, &c.keys, &error)) {
        LOG(WARNING) << "DISC_TF_TRUSTED_KEYS: " << error << "; no key is trusted";
        c.keys.clear();
      }
    }
  }
  return c.keys;
}

const char* PolicyName(ArtifactPolicy p) {
  switch (p) {
    case ArtifactPolicy::kRebuild:
      return "rebuild";
    case ArtifactPolicy::kFallback:
      return "fallback";
    default:
      return "trusted";
  }
}

void CopyOut(const std::string& s, char* buf, int64_t size) {
  if (buf == nullptr || size <= 0) return;
  const size_t n = std::min<size_t>(s.size(), static_cast<size_t>(size - 1));
  std::memcpy(buf, s.data(), n);
  buf[n] = '\0';
}

}  // namespace

ArtifactPolicy CurrentArtifactPolicy() {
  TrustConfig& c = Config();
  std::lock_guard<std::mutex> lock(c.mu);
  if (!c.policy_set) {
    c.policy_set = true;
    const char* env = std::getenv("DISC_TF_ARTIFACTS");
    if (env != nullptr && !ParsePolicy(env, &c.policy)) {
      LOG(WARNING) << "DISC_TF_ARTIFACTS='" << env
                   << "' is not trusted, rebuild or fallback; using trusted";
      c.policy = ArtifactPolicy::kTrusted;
    }
  }
  return c.policy;
}

std::string ArtifactMessage(const std::string& sha256_hex) {
  return absl::StrCat("disc_tf artifact v1\n", absl::AsciiStrToLower(sha256_hex), "\n");
}

TrustVerdict CheckArtifactTrust(const std::string& sha256_hex,
                                const std::vector<std::string>& signatures, bool ed25519) {
  TrustVerdict v;
  if (signatures.empty()) {
    v.reason = "the artifact is not signed";
    return v;
  }
  const std::string message = ArtifactMessage(sha256_hex);
  std::map<std::string, std::string> keys;
  {
    TrustConfig& c = Config();
    std::lock_guard<std::mutex> lock(c.mu);
    keys = TrustedKeys(c);
  }
  std::vector<std::string> why;
  for (const std::string& sig : signatures) {
    std::vector<std::string> parts = absl::StrSplit(sig, ':');
    if (parts.size() == 2 && parts[0] == "local") {
      std::string error;
      const std::string secret = LocalSecret(&error);
      if (secret.empty()) {
        why.push_back(absl::StrCat("local signature: ", error));
      } else if (HmacSha256Hex(secret, message) == absl::AsciiStrToLower(parts[1])) {
        v.trusted = true;
        v.reason = "signed by this user's key";
        return v;
      } else {
        why.push_back("the local signature is not this user's over these bytes");
      }
    } else if (parts.size() == 3 && parts[0] == "ed25519" && !ed25519) {
      why.push_back("ed25519 signatures are not used (DISC_TF_ARTIFACTS=rebuild)");
    } else if (parts.size() == 3 && parts[0] == "ed25519") {
      auto key = keys.find(parts[1]);
      const std::string raw_sig = Unhex(parts[2]);
      std::string error;
      if (key == keys.end()) {
        why.push_back(absl::StrCat("ed25519 key ", parts[1], " is not trusted here"));
      } else if (raw_sig.size() != kEd25519SigBytes) {
        why.push_back(absl::StrCat("ed25519 signature by ", parts[1], " is malformed"));
      } else if (Ed25519Verify(key->second, message, raw_sig, &error)) {
        v.trusted = true;
        v.reason = absl::StrCat("signed by trusted key ", parts[1]);
        return v;
      } else {
        why.push_back(absl::StrCat("ed25519 key ", parts[1], ": ", error));
      }
    } else {
      why.push_back("a signature of unknown form");
    }
  }
  v.reason = absl::StrCat("no signature vouches for it (", absl::StrJoin(why, "; "), ")");
  return v;
}

void NoteBuiltHere(const std::string& sha256_hex) {
  TrustConfig& c = Config();
  std::lock_guard<std::mutex> lock(c.mu);
  c.built_here.insert(absl::AsciiStrToLower(sha256_hex));
}

TrustVerdict MayLoadEmbedded(const std::string& sha256_hex,
                             const std::vector<std::string>& signatures) {
  {
    TrustConfig& c = Config();
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.built_here.count(absl::AsciiStrToLower(sha256_hex)) != 0) {
      return {true, "built by this process"};
    }
  }
  return CheckArtifactTrust(sha256_hex, signatures,
                            CurrentArtifactPolicy() != ArtifactPolicy::kRebuild);
}

}  // namespace disc_tf

extern "C" {

int32_t disc_trust_configure(const char* policy, const char* key_paths, char* error,
                             int64_t error_size) {
  using namespace disc_tf;  // NOLINT
  ArtifactPolicy p = ArtifactPolicy::kTrusted;
  const bool set_policy = policy != nullptr && *policy != '\0';
  if (set_policy && !ParsePolicy(policy, &p)) {
    CopyOut(absl::StrCat("unknown artifact policy '", policy,
                         "' (expected trusted, rebuild or fallback)"),
            error, error_size);
    return -1;
  }
  std::map<std::string, std::string> keys;
  std::string key_error;
  if (key_paths != nullptr && !LoadKeys(key_paths, &keys, &key_error)) {
    CopyOut(key_error, error, error_size);
    return -1;
  }
  TrustConfig& c = Config();
  std::lock_guard<std::mutex> lock(c.mu);
  if (set_policy) {
    c.policy = p;
    c.policy_set = true;
  }
  if (key_paths != nullptr) {
    c.keys = std::move(keys);
    c.keys_set = true;
  }
  return 0;
}

int32_t disc_trust_check(const char* sha256_hex, const char* signatures, char* reason,
                         int64_t reason_size) {
  using namespace disc_tf;  // NOLINT
  std::vector<std::string> sigs;
  if (signatures != nullptr) {
    sigs = absl::StrSplit(signatures, '\n', absl::SkipEmpty());
  }
  const TrustVerdict v = MayLoadEmbedded(sha256_hex ? sha256_hex : "", sigs);
  CopyOut(v.reason, reason, reason_size);
  return v.trusted ? 1 : 0;
}

const char* disc_trust_policy(void) {
  return disc_tf::PolicyName(disc_tf::CurrentArtifactPolicy());
}

}  // extern "C"
