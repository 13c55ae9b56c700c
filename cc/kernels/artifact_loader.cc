// artifact_loader.cc -- verifies, loads and caches cluster artifacts.
#include "cc/kernels/artifact_loader.h"

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace disc_tf {

// ---------------------------------------------------------------------------
// SHA-256 (FIPS 180-4).
// ---------------------------------------------------------------------------
namespace {

constexpr uint32_t kSha256K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1,
    0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3,
    0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147,
    0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
    0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

inline uint32_t Rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

class Sha256 {
 public:
  Sha256() {
    state_[0] = 0x6a09e667;
    state_[1] = 0xbb67ae85;
    state_[2] = 0x3c6ef372;
    state_[3] = 0xa54ff53a;
    state_[4] = 0x510e527f;
    state_[5] = 0x9b05688c;
    state_[6] = 0x1f83d9ab;
    state_[7] = 0x5be0cd19;
  }

  void Update(const uint8_t* data, size_t n) {
    total_bytes_ += n;
    if (buffered_ > 0) {
      const size_t take = std::min(n, size_t{64} - buffered_);
      std::memcpy(buffer_ + buffered_, data, take);
      buffered_ += take;
      data += take;
      n -= take;
      if (buffered_ == 64) {
        Block(buffer_);
        buffered_ = 0;
      }
    }
    while (n >= 64) {
      Block(data);
      data += 64;
      n -= 64;
    }
    if (n > 0) {
      std::memcpy(buffer_, data, n);
      buffered_ = n;
    }
  }

  std::string HexDigest() {
    const uint64_t bit_len = total_bytes_ * 8;
    uint8_t pad[72] = {0x80};
    const size_t pad_len =
        (buffered_ < 56) ? (56 - buffered_) : (120 - buffered_);
    Update(pad, pad_len);
    uint8_t len_be[8];
    for (int i = 0; i < 8; ++i) {
      len_be[i] = static_cast<uint8_t>(bit_len >> (56 - 8 * i));
    }
    Update(len_be, 8);
    static const char kHex[] = "0123456789abcdef";
    std::string out;
    out.reserve(64);
    for (uint32_t word : state_) {
      for (int shift = 28; shift >= 0; shift -= 4) {
        out.push_back(kHex[(word >> shift) & 0xf]);
      }
    }
    return out;
  }

 private:
  void Block(const uint8_t* p) {
    uint32_t w[64];
    for (int i = 0; i < 16; ++i) {
      w[i] = (uint32_t{p[4 * i]} << 24) | (uint32_t{p[4 * i + 1]} << 16) |
             (uint32_t{p[4 * i + 2]} << 8) | uint32_t{p[4 * i + 3]};
    }
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 =
          Rotr(w[i - 15], 7) ^ Rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 =
          Rotr(w[i - 2], 17) ^ Rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
    uint32_t e = state_[4], f = state_[5], g = state_[6], h = state_[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t s1 = Rotr(e, 6) ^ Rotr(e, 11) ^ Rotr(e, 25);
      const uint32_t ch = (e & f) ^ (~e & g);
      const uint32_t t1 = h + s1 + ch + kSha256K[i] + w[i];
      const uint32_t s0 = Rotr(a, 2) ^ Rotr(a, 13) ^ Rotr(a, 22);
      const uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
      const uint32_t t2 = s0 + maj;
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    state_[0] += a;
    state_[1] += b;
    state_[2] += c;
    state_[3] += d;
    state_[4] += e;
    state_[5] += f;
    state_[6] += g;
    state_[7] += h;
  }

  uint32_t state_[8];
  uint8_t buffer_[64];
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

// ---------------------------------------------------------------------------
// Loading.
// ---------------------------------------------------------------------------

std::string ErrnoString(int err) {
  char buf[256];
  // GNU strerror_r returns a char*; it may or may not use buf.
  const char* s = strerror_r(err, buf, sizeof(buf));
  return s ? std::string(s) : std::string("errno ") + std::to_string(err);
}

bool EnvTrue(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return false;
  std::string s = absl::AsciiStrToLower(v);
  return s == "1" || s == "true" || s == "yes" || s == "on";
}

absl::Status WriteAll(int fd, absl::string_view bytes,
                      const std::string& what) {
  const char* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(
          absl::StrCat("writing ", what, ": ", ErrnoString(errno)));
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// dlopen()s `path` and resolves the artifact's symbols into `art`.
absl::Status OpenAndResolve(const std::string& path, LoadedArtifact* art) {
  dlerror();  // clear
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    return absl::InternalError(
        absl::StrCat("dlopen failed: ", err ? err : "unknown error"));
  }
  // From here on the handle is never closed (artifacts are never unloaded).
  art->handle = handle;
  art->path = path;
  art->abi_version =
      reinterpret_cast<int32_t (*)(void)>(::dlsym(handle, "disc_abi_version"));
  art->num_kernels =
      reinterpret_cast<int32_t (*)(void)>(::dlsym(handle, "disc_num_kernels"));
  art->entry =
      reinterpret_cast<int32_t (*)(disc_ral*)>(::dlsym(handle, "disc_entry"));
  art->peak_temp_bytes =
      reinterpret_cast<int64_t (*)(void)>(::dlsym(handle, "disc_peak_temp_bytes"));
  art->cuda_entry = ::dlsym(handle, "disc_cuda_entry");
  std::string missing;
  if (art->abi_version == nullptr) missing += " disc_abi_version";
  if (art->num_kernels == nullptr) missing += " disc_num_kernels";
  if (art->entry == nullptr && art->cuda_entry == nullptr) {
    missing += " disc_entry (or disc_cuda_entry)";
  }
  if (!missing.empty()) {
    return absl::InternalError(
        absl::StrCat("artifact does not export:", missing));
  }
  const int32_t abi = art->abi_version();
  // The RAL table only grows: an artifact of an older ABI (>= 2) still runs.
  if (abi < 2 || abi > DISC_RAL_ABI_VERSION) {
    return absl::InternalError(
        absl::StrCat("artifact ABI version ", abi, " is not supported by the runtime's ",
                     DISC_RAL_ABI_VERSION));
  }
  return absl::OkStatus();
}

// Loads through an anonymous in-memory file. The fd is deliberately kept open
// for the life of the process: /proc/self/fd/N names are then never reused,
// so the dynamic loader cannot confuse two artifacts by name.
absl::Status LoadFromMemfd(absl::string_view bytes, const std::string& sha,
                           LoadedArtifact* art) {
  const std::string name = absl::StrCat("disc_tf_", sha.substr(0, 16));
  const int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("memfd_create: ", ErrnoString(errno)));
  }
  absl::Status s = WriteAll(fd, bytes, "memfd");
  if (!s.ok()) {
    ::close(fd);
    return s;
  }
  s = OpenAndResolve(absl::StrCat("/proc/self/fd/", fd), art);
  if (!s.ok() && art->handle == nullptr) ::close(fd);
  return s;
}

// Loads through an unnamed file (O_TMPFILE) in $TMPDIR (else /tmp), for hosts
// where memfd_create is missing or disabled (DISC_TF_NO_MEMFD). The file never
// has a name, so nobody can open or swap it between the write and the dlopen of
// /proc/self/fd/N; its fd stays open for the life of the process, like memfd's.
absl::Status LoadFromUnnamedFile(absl::string_view bytes, const std::string& sha,
                                 LoadedArtifact* art) {
  const char* env = std::getenv("TMPDIR");
  const std::string dir = (env != nullptr && env[0] != '\0') ? env : "/tmp";
  const int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0700);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("unnamed file in ", dir, ": ", ErrnoString(errno)));
  }
  absl::Status s = WriteAll(fd, bytes, "unnamed file");
  if (!s.ok()) {
    ::close(fd);
    return s;
  }
  (void)sha;
  s = OpenAndResolve(absl::StrCat("/proc/self/fd/", fd), art);
  if (!s.ok() && art->handle == nullptr) ::close(fd);
  return s;
}

struct RegistryEntry {
  absl::Status status;
  std::unique_ptr<LoadedArtifact> artifact;
};

std::mutex& RegistryMu() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}

std::map<std::string, RegistryEntry>& Registry() {
  static auto* registry = new std::map<std::string, RegistryEntry>;
  return *registry;
}

// A shared object whose headers point past its end loads fine with dlopen and
// then dies with SIGBUS on first touch; refuse it before dlopen instead.
absl::Status CheckElfBounds(absl::string_view bytes) {
  const uint64_t size = bytes.size();
  Elf64_Ehdr eh;
  if (size < sizeof(eh)) return absl::InvalidArgumentError("artifact too small to be ELF");
  std::memcpy(&eh, bytes.data(), sizeof(eh));
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
      eh.e_type != ET_DYN) {
    return absl::InvalidArgumentError("artifact is not a 64-bit ELF shared object");
  }
  auto within = [size](uint64_t offset, uint64_t length) {
    return offset <= size && length <= size - offset;
  };
  if (eh.e_phentsize != sizeof(Elf64_Phdr) ||
      !within(eh.e_phoff, uint64_t{eh.e_phnum} * sizeof(Elf64_Phdr))) {
    return absl::InvalidArgumentError("artifact program headers lie outside the file");
  }
  if (eh.e_shnum != 0 && !within(eh.e_shoff, uint64_t{eh.e_shnum} * eh.e_shentsize)) {
    return absl::InvalidArgumentError("artifact section headers lie outside the file");
  }
  for (int i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph;
    std::memcpy(&ph, bytes.data() + eh.e_phoff + i * sizeof(Elf64_Phdr), sizeof(ph));
    if (ph.p_type == PT_LOAD && !within(ph.p_offset, ph.p_filesz)) {
      return absl::InvalidArgumentError("artifact segment lies outside the file (truncated?)");
    }
  }
  // The entry points this kernel calls, defined and exported as functions in
  // the dynamic symbol table (as disc_tf/runtime/elf_check.py checks them).
  if (eh.e_shnum == 0 || eh.e_shentsize != sizeof(Elf64_Shdr)) {
    return absl::InvalidArgumentError("artifact has no section headers");
  }
  std::vector<Elf64_Shdr> sections(eh.e_shnum);
  std::memcpy(sections.data(), bytes.data() + eh.e_shoff, eh.e_shnum * sizeof(Elf64_Shdr));
  std::set<std::string> exported;
  for (const Elf64_Shdr& sh : sections) {
    if (sh.sh_type != SHT_NOBITS && !within(sh.sh_offset, sh.sh_size)) {
      return absl::InvalidArgumentError("artifact section lies outside the file (truncated?)");
    }
    if (sh.sh_type != SHT_DYNSYM) continue;
    if (sh.sh_entsize != sizeof(Elf64_Sym) || sh.sh_link >= eh.e_shnum) {
      return absl::InvalidArgumentError("artifact has a malformed dynamic symbol table");
    }
    const Elf64_Shdr& strtab = sections[sh.sh_link];
    if (!within(strtab.sh_offset, strtab.sh_size)) {
      return absl::InvalidArgumentError("artifact string table lies outside the file");
    }
    for (uint64_t at = 0; at + sizeof(Elf64_Sym) <= sh.sh_size; at += sizeof(Elf64_Sym)) {
      Elf64_Sym sym;
      std::memcpy(&sym, bytes.data() + sh.sh_offset + at, sizeof(sym));
      const int bind = ELF64_ST_BIND(sym.st_info);
      if (sym.st_shndx == SHN_UNDEF || ELF64_ST_TYPE(sym.st_info) != STT_FUNC ||
          (bind != STB_GLOBAL && bind != STB_WEAK) || sym.st_name >= strtab.sh_size) {
        continue;
      }
      const char* name = bytes.data() + strtab.sh_offset + sym.st_name;
      exported.insert(std::string(name, strnlen(name, strtab.sh_size - sym.st_name)));
    }
  }
  std::string missing;
  for (const char* name : {"disc_abi_version", "disc_num_kernels"}) {
    if (!exported.count(name)) absl::StrAppend(&missing, " ", name);
  }
  if (!exported.count("disc_entry") && !exported.count("disc_cuda_entry")) {
    absl::StrAppend(&missing, " disc_entry (or disc_cuda_entry)");
  }
  if (!missing.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("artifact does not export:", missing));
  }
  return absl::OkStatus();
}

RegistryEntry LoadUncached(absl::string_view bytes, const std::string& sha) {
  RegistryEntry entry;
  entry.status = CheckElfBounds(bytes);
  if (!entry.status.ok()) return entry;
  auto art = std::make_unique<LoadedArtifact>();
  art->sha256 = sha;
  absl::Status mem_status = absl::UnavailableError("disabled");
  if (!EnvTrue("DISC_TF_NO_MEMFD")) {
    mem_status = LoadFromMemfd(bytes, sha, art.get());
    if (mem_status.ok()) {
      entry.artifact = std::move(art);
      return entry;
    }
    if (art->handle != nullptr) {
      // The object loaded but is not a usable artifact; a file would not help.
      entry.status = mem_status;
      return entry;
    }
  }
  absl::Status file_status = LoadFromUnnamedFile(bytes, sha, art.get());
  if (file_status.ok()) {
    entry.artifact = std::move(art);
    return entry;
  }
  if (art->handle != nullptr) {
    entry.status = file_status;
  } else {
    entry.status = absl::InternalError(absl::StrCat(
        "could not load artifact ", sha, ": in-memory load: ",
        mem_status.message(), "; unnamed file load: ", file_status.message()));
  }
  return entry;
}

}  // namespace

std::string Sha256Hex(const void* data, size_t size) {
  Sha256 h;
  h.Update(static_cast<const uint8_t*>(data), size);
  return h.HexDigest();
}

absl::Status LoadArtifact(absl::string_view bytes,
                          absl::string_view expected_sha256_hex,
                          const LoadedArtifact** out) {
  *out = nullptr;
  if (bytes.empty()) {
    return absl::NotFoundError("the cluster has no compiled artifact");
  }
  const std::string expected = absl::AsciiStrToLower(expected_sha256_hex);
  const std::string actual = Sha256Hex(bytes.data(), bytes.size());
  if (expected != actual) {
    return absl::InvalidArgumentError(
        absl::StrCat("artifact sha256 mismatch: expected '", expected,
                     "', got '", actual, "'"));
  }
  std::lock_guard<std::mutex> lock(RegistryMu());
  auto& registry = Registry();
  auto it = registry.find(actual);
  if (it == registry.end()) {
    it = registry.emplace(actual, LoadUncached(bytes, actual)).first;
  }
  if (!it->second.status.ok()) return it->second.status;
  *out = it->second.artifact.get();
  return absl::OkStatus();
}

}  // namespace disc_tf
