// hide_avx512.so: an LD_PRELOAD shim that makes this process (and every process it starts
// with the same environment) see a CPU without AVX-512 or AMX, so that every library picks
// its AVX2 code path by itself: ONNX Runtime's MLAS, oneDNN inside TensorFlow, XLA's LLVM,
// numpy and disc_tf's own kernels and RAL. Used by `bench.run --hide-avx512`.
//
// How: Linux's CPUID faulting (arch_prctl ARCH_SET_CPUID, 0) makes each CPUID instruction
// raise SIGSEGV. The handler below runs the real CPUID with faulting briefly off, clears the
// AVX-512, AMX and AVX-VNNI feature bits and the XSAVE state components that only they use,
// and steps over the instruction. The setting is per thread, kept by fork and clone and
// reset by execve, which is why the shim is preloaded rather than set once.
//
// A SIGSEGV handler installed later through sigaction() or signal() is kept as the next handler: faults
// that are not CPUID reach it, as they would without the shim.
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <cpuid.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);

static struct sigaction next_handler;  // what the program asked for on SIGSEGV
static int active;

static long set_cpuid_enabled(int enabled) {
  return syscall(SYS_arch_prctl, ARCH_SET_CPUID, enabled);
}

// Clears what an AVX2-only x86-64-v3 CPU (Haswell, Zen 3) does not have.
static void mask(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
  enum { EAX, EBX, ECX, EDX };
  if (leaf == 7 && sub == 0) {
    // EBX: AVX512 F, DQ, IFMA, PF, ER, CD, BW, VL.
    r[EBX] &= ~((1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) |
                (1u << 28) | (1u << 30) | (1u << 31));
    // ECX: AVX512 VBMI, VBMI2, VNNI, BITALG, VPOPCNTDQ.
    r[ECX] &= ~((1u << 1) | (1u << 6) | (1u << 11) | (1u << 12) | (1u << 14));
    // EDX: AVX512 4VNNIW, 4FMAPS, VP2INTERSECT, AMX-BF16, AVX512-FP16, AMX-TILE, AMX-INT8.
    r[EDX] &= ~((1u << 2) | (1u << 3) | (1u << 8) | (1u << 22) | (1u << 23) | (1u << 24) |
                (1u << 25));
  } else if (leaf == 7 && sub == 1) {
    // EAX: AVX-VNNI, AVX512-BF16, AMX-FP16, AVX-IFMA; EDX: AVX10.
    r[EAX] &= ~((1u << 4) | (1u << 5) | (1u << 21) | (1u << 23));
    r[EDX] &= ~(1u << 19);
  } else if (leaf == 0xD && sub == 0) {
    // XCR0 components the OS may enable: opmask, ZMM_Hi256, Hi16_ZMM, TILECFG, TILEDATA.
    r[EAX] &= ~((1u << 5) | (1u << 6) | (1u << 7) | (1u << 17) | (1u << 18));
  } else if (leaf == 0x1D || leaf == 0x1E || leaf == 0x24) {
    r[EAX] = r[EBX] = r[ECX] = r[EDX] = 0;  // AMX tile and TMUL info, AVX10 info
  }
}

static void on_segv(int sig, siginfo_t *info, void *raw) {
  ucontext_t *uc = (ucontext_t *)raw;
  greg_t *g = uc->uc_mcontext.gregs;
  const unsigned char *ip = (const unsigned char *)g[REG_RIP];
  if (ip[0] == 0x0F && ip[1] == 0xA2) {
    uint32_t r[4];
    const uint32_t leaf = (uint32_t)g[REG_RAX], sub = (uint32_t)g[REG_RCX];
    set_cpuid_enabled(1);
    __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
    set_cpuid_enabled(0);
    mask(leaf, sub, r);
    g[REG_RAX] = r[0];
    g[REG_RBX] = r[1];
    g[REG_RCX] = r[2];
    g[REG_RDX] = r[3];
    g[REG_RIP] += 2;
    return;
  }
  // Not CPUID: what the program installed, or the default (the fault repeats and kills).
  if (next_handler.sa_flags & SA_SIGINFO) {
    next_handler.sa_sigaction(sig, info, raw);
  } else if (next_handler.sa_handler != SIG_DFL && next_handler.sa_handler != SIG_IGN) {
    next_handler.sa_handler(sig);
  } else {
    signal(SIGSEGV, SIG_DFL);
  }
}

static sigaction_fn real_sigaction(void) {
  static sigaction_fn fn;
  if (!fn) fn = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
  return fn;
}

int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
  if (sig != SIGSEGV || !active) return real_sigaction()(sig, act, old);
  if (old) *old = next_handler;
  if (act) next_handler = *act;
  return 0;
}

// signal() reaches the kernel through glibc's internal sigaction, so it is caught here too.
sighandler_t signal(int sig, sighandler_t handler) {
  if (sig != SIGSEGV || !active) {
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    return real_sigaction()(sig, &sa, &old) == 0 ? old.sa_handler : SIG_ERR;
  }
  const sighandler_t previous = next_handler.sa_handler;
  memset(&next_handler, 0, sizeof next_handler);
  next_handler.sa_handler = handler;
  return previous;
}

__attribute__((constructor)) static void hide_avx512(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  if (real_sigaction()(SIGSEGV, &sa, &next_handler) != 0) return;
  if (set_cpuid_enabled(0) != 0) {  // no CPUID faulting here: leave the process as it was
    real_sigaction()(SIGSEGV, &next_handler, NULL);
    return;
  }
  active = 1;
}
