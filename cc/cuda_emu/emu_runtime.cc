// emu_runtime.cc -- the CUDA emulator's launch loop: fiber stacks, the block
// scheduler, warp collectives and the SIGFPE trap behind the device API of
// cuda_emulator.h (disc_emu::Run, SyncThreads, WarpCollective, DynamicShared).
// The cuda-emu build compiles it once per process and links the object into every
// artifact; it is built with hidden visibility, so each artifact keeps its own copy
// (a process runs thousands of artifacts, each with its own emulator state).

// The SIGFPE trap jumps from a fiber's stack back to the launching thread's:
// _FORTIFY_SOURCE's longjmp check would take that for a corrupt stack and abort.
// Undefined before any system header.
#undef _FORTIFY_SOURCE

#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include "cuda_emulator.h"

namespace disc_emu {
namespace {

constexpr unsigned kMaxBlock = 1024;
constexpr unsigned kMaxDynamicShared = 48 * 1024;
constexpr size_t kStackBytes = 256 * 1024;

enum class Wait { kRunnable, kSync, kWarp, kDone };

const char* CollectiveName(Collective c) {
  static const char* const names[] = {"__shfl_sync",   "__shfl_up_sync", "__shfl_down_sync",
                                      "__shfl_xor_sync", "__ballot_sync",  "__any_sync",
                                      "__all_sync",      "__syncwarp"};
  return names[static_cast<int>(c)];
}

// One thread of the running block.
struct Fiber {
  void* sp = nullptr;  // saved stack pointer while switched out
#if !defined(__x86_64__)
  ucontext_t context;
#endif
  unsigned tid = 0;
  Wait wait = Wait::kRunnable;
  Collective op = Collective::kSyncWarp;  // the warp collective it waits at
  unsigned mask = 0;
  uint64_t value = 0;  // its operand (bits)
  int arg = 0;         // source lane, delta or lane mask
  int width = 32;
  uint64_t result = 0;
};

// The state of the block being run on this thread.
struct BlockRun {
  std::vector<Fiber> fibers;
  Fiber* current = nullptr;
  void* scheduler_sp = nullptr;
#if !defined(__x86_64__)
  ucontext_t scheduler_context;
#endif
  void (*body)(void*) = nullptr;  // runs the kernel for the current thread
  void* closure = nullptr;
  std::vector<double> dynamic;
};
thread_local BlockRun* g_block = nullptr;

// The fiber stacks of one launch: one mapping, a guard page (an overflow
// faults) at the low end of each stack; unmapped when the launch ends (every
// artifact carries its own copy of the emulator, so nothing is kept between
// launches: a process runs thousands of artifacts).
struct Stacks {
  char* base = nullptr;
  size_t count = 0;
  bool Map(size_t n) {
    void* p = ::mmap(nullptr, n * kStackBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return false;
    base = static_cast<char*>(p);
    count = n;
    for (size_t i = 0; i < n; ++i) ::mprotect(base + i * kStackBytes, 4096, PROT_NONE);
    return true;
  }
  char* Get(size_t i) const { return base + i * kStackBytes; }
  ~Stacks() {
    if (base != nullptr) ::munmap(base, count * kStackBytes);
  }
};

[[noreturn]] void FiberMain();

#if defined(__x86_64__)
// Saves the callee-saved registers, MXCSR and the x87 control word on the
// current stack, stores the stack pointer in *from and resumes the context
// whose stack pointer is `to`.
__attribute__((naked, noinline)) void SwitchTo(void** /*from*/, void* /*to*/) {
  asm volatile(
      "pushq %rbp\n\t"
      "pushq %rbx\n\t"
      "pushq %r12\n\t"
      "pushq %r13\n\t"
      "pushq %r14\n\t"
      "pushq %r15\n\t"
      "subq $8, %rsp\n\t"
      "stmxcsr (%rsp)\n\t"
      "fnstcw 4(%rsp)\n\t"
      "movq %rsp, (%rdi)\n\t"
      "movq %rsi, %rsp\n\t"
      "ldmxcsr (%rsp)\n\t"
      "fldcw 4(%rsp)\n\t"
      "addq $8, %rsp\n\t"
      "popq %r15\n\t"
      "popq %r14\n\t"
      "popq %r13\n\t"
      "popq %r12\n\t"
      "popq %rbx\n\t"
      "popq %rbp\n\t"
      "ret\n\t");
}

// A fresh fiber's stack: SwitchTo "returns" into FiberMain with the stack
// aligned as at a function's entry.
void* InitStack(char* stack, Fiber*) {
  uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + kStackBytes) & ~uintptr_t{15};
  auto* slot = reinterpret_cast<uint64_t*>(top);
  slot[-1] = 0;                                               // FiberMain's return address
  slot[-2] = reinterpret_cast<uint64_t>(&FiberMain);         // popped by `ret`
  for (int r = 3; r <= 8; ++r) slot[-r] = 0;                  // rbp rbx r12..r15
  const uint32_t control[2] = {0x1F80u, 0x037Fu};             // MXCSR, x87 control word
  std::memcpy(&slot[-9], control, sizeof(control));
  return &slot[-9];
}

void EnterFiber(BlockRun* b, Fiber* f) { SwitchTo(&b->scheduler_sp, f->sp); }
void LeaveFiber(BlockRun* b, Fiber* f) { SwitchTo(&f->sp, b->scheduler_sp); }
#else
void* InitStack(char* stack, Fiber* f) {
  getcontext(&f->context);
  f->context.uc_stack.ss_sp = stack + 4096;
  f->context.uc_stack.ss_size = kStackBytes - 4096;
  f->context.uc_link = nullptr;
  makecontext(&f->context, reinterpret_cast<void (*)()>(&FiberMain), 0);
  return nullptr;
}
void EnterFiber(BlockRun* b, Fiber* f) { swapcontext(&b->scheduler_context, &f->context); }
void LeaveFiber(BlockRun* b, Fiber* f) { swapcontext(&f->context, &b->scheduler_context); }
#endif

[[noreturn]] void FiberMain() {
  BlockRun* b = g_block;
  b->body(b->closure);
  b = g_block;  // unchanged: fibers never migrate between threads
  b->current->wait = Wait::kDone;
  LeaveFiber(b, b->current);
  __builtin_unreachable();
}

// Suspends the calling thread until the scheduler releases it.
void Suspend(Wait why) {
  BlockRun* b = g_block;
  b->current->wait = why;
  LeaveFiber(b, b->current);
}

std::string Lane(unsigned tid) {
  return "thread " + std::to_string(tid) + " (warp " + std::to_string(tid / 32) + " lane " +
         std::to_string(tid % 32) + ")";
}

// Completes the collective the lanes of `mask` in warp `w` wait at, if they all
// do; false with *error set if they cannot (a lane exited or waits elsewhere).
bool ResolveWarp(BlockRun* b, unsigned w, unsigned mask, bool* done, std::string* error) {
  Fiber* lanes[32] = {};
  const size_t n = b->fibers.size();
  for (unsigned l = 0; l < 32; ++l) {
    if (!(mask >> l & 1u)) continue;
    if (w * 32 + l >= n) {
      *error = "warp " + std::to_string(w) + ": mask names lane " + std::to_string(l) +
               ", which does not exist in a block of " + std::to_string(n) + " threads";
      return false;
    }
    lanes[l] = &b->fibers[w * 32 + l];
  }
  Fiber* first = nullptr;
  for (Fiber* f : lanes) {
    if (f == nullptr) continue;
    if (f->wait == Wait::kRunnable) return true;  // not there yet
    if (f->wait != Wait::kWarp) {
      *error = Lane(f->tid) + (f->wait == Wait::kDone ? " exited" : " waits at __syncthreads") +
               " while lanes of its warp wait for it at a warp collective";
      return false;
    }
    if (first == nullptr) first = f;
    if (f->op != first->op || f->mask != first->mask) {
      *error = Lane(first->tid) + " waits at " + CollectiveName(first->op) + " but " +
               Lane(f->tid) + " at " + CollectiveName(f->op) + " (or another mask)";
      return false;
    }
  }
  uint64_t ballot = 0;
  bool any = false, all = true;
  for (unsigned l = 0; l < 32; ++l) {
    if (lanes[l] == nullptr) continue;
    ballot |= (lanes[l]->value != 0 ? 1ull : 0ull) << l;
    any = any || lanes[l]->value != 0;
    all = all && lanes[l]->value != 0;
  }
  for (unsigned l = 0; l < 32; ++l) {
    Fiber* f = lanes[l];
    if (f == nullptr) continue;
    const int width = f->width;
    if (width < 1 || width > 32 || (width & (width - 1)) != 0) {
      *error = Lane(f->tid) + ": shuffle width " + std::to_string(width) + " is not a power of 2 <= 32";
      return false;
    }
    const unsigned group = l / width * width;
    unsigned src = l;
    switch (f->op) {
      case Collective::kShflIdx: src = group + static_cast<unsigned>(f->arg) % width; break;
      case Collective::kShflUp: src = l % width >= static_cast<unsigned>(f->arg) ? l - f->arg : l; break;
      case Collective::kShflDown:
        src = l % width + static_cast<unsigned>(f->arg) < static_cast<unsigned>(width) ? l + f->arg : l;
        break;
      case Collective::kShflXor: {
        const unsigned x = l ^ static_cast<unsigned>(f->arg);
        src = x < group + width ? x : l;  // a later group: its own value
        break;
      }
      default: break;
    }
    switch (f->op) {
      case Collective::kBallot: f->result = ballot; break;
      case Collective::kAny: f->result = any; break;
      case Collective::kAll: f->result = all; break;
      case Collective::kSyncWarp: f->result = 0; break;
      default:
        if (src >= 32 || lanes[src] == nullptr) {
          *error = Lane(f->tid) + ": " + CollectiveName(f->op) + " reads lane " +
                   std::to_string(src) + ", outside the mask";
          return false;
        }
        f->result = lanes[src]->value;
    }
  }
  for (Fiber* f : lanes) {
    if (f != nullptr) f->wait = Wait::kRunnable;
  }
  *done = true;
  return true;
}

// Runs one block to completion; false with *error set on a deadlock.
bool RunBlock(BlockRun* b, std::string* error) {
  for (;;) {
    for (Fiber& f : b->fibers) {
      if (f.wait != Wait::kRunnable) continue;
      b->current = &f;
      threadIdx.x = f.tid;
      EnterFiber(b, &f);
    }
    // Every thread now waits or is done.
    bool progressed = false;
    const unsigned warps = static_cast<unsigned>((b->fibers.size() + 31) / 32);
    for (unsigned w = 0; w < warps; ++w) {
      for (size_t t = w * 32; t < b->fibers.size() && t < (w + 1) * 32u; ++t) {
        Fiber& f = b->fibers[t];
        if (f.wait != Wait::kWarp) continue;
        if (!(f.mask >> (t % 32) & 1u)) {
          *error = Lane(f.tid) + " calls " + CollectiveName(f.op) + " with a mask without its lane";
          return false;
        }
        if (!ResolveWarp(b, w, f.mask, &progressed, error)) return false;
      }
    }
    if (progressed) continue;
    size_t at_sync = 0, done = 0;
    for (const Fiber& f : b->fibers) {
      at_sync += f.wait == Wait::kSync;
      done += f.wait == Wait::kDone;
    }
    if (done == b->fibers.size()) return true;
    if (at_sync == b->fibers.size()) {
      for (Fiber& f : b->fibers) f.wait = Wait::kRunnable;
      continue;
    }
    for (const Fiber& f : b->fibers) {
      if (f.wait == Wait::kSync) {
        *error = Lane(f.tid) + " waits at __syncthreads, which " + std::to_string(done) +
                 " thread(s) of its block exited without reaching and " +
                 std::to_string(b->fibers.size() - done - at_sync) + " wait at a warp collective";
        return false;
      }
    }
    *error = "threads wait at warp collectives that cannot complete";
    return false;
  }
}

// SIGFPE inside an emulated launch jumps back to it (the launch's fibers are
// abandoned); elsewhere the signal goes to the handler installed before ours.
thread_local sigjmp_buf* g_trap = nullptr;
struct sigaction g_previous_fpe;

void OnFpe(int sig, siginfo_t* info, void* context) {
  if (g_trap != nullptr) siglongjmp(*g_trap, 1);  // x86 reports both kinds as FPE_INTDIV
  if (g_previous_fpe.sa_flags & SA_SIGINFO) {
    g_previous_fpe.sa_sigaction(sig, info, context);
  } else if (g_previous_fpe.sa_handler != SIG_IGN && g_previous_fpe.sa_handler != SIG_DFL) {
    g_previous_fpe.sa_handler(sig);
  } else {
    ::signal(sig, SIG_DFL);  // returning re-executes the instruction: the default action
  }
}

bool InstallFpeTrap() {
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_sigaction = OnFpe;
  action.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&action.sa_mask);
  return ::sigaction(SIGFPE, &action, &g_previous_fpe) == 0;
}

// Run with the reason of a failure in *error.
bool RunBlocks(uint32_t grid, uint32_t block, uint32_t shared_bytes, void (*body)(void*),
               void* closure, std::string* error) {
  if (grid < 1 || block < 1 || block > kMaxBlock) {
    *error = "invalid launch configuration: grid " + std::to_string(grid) + ", block " +
             std::to_string(block) + " (block must be in [1, 1024], grid at least 1)";
    return false;
  }
  if (shared_bytes > kMaxDynamicShared) {
    *error = "launch asks for " + std::to_string(shared_bytes) +
             " bytes of dynamic shared memory; the limit without opt-in is 49152";
    return false;
  }
  Stacks stacks;
  if (!stacks.Map(block)) {
    *error = "cannot map " + std::to_string(block) + " fiber stacks";
    return false;
  }
  BlockRun run;
  run.body = body;
  run.closure = closure;
  run.fibers.resize(block);
  run.dynamic.resize(shared_bytes / sizeof(double) + 1);
  BlockRun* outer = g_block;
  g_block = &run;
  blockDim.x = block;
  gridDim.x = grid;
  static const bool trap_installed = InstallFpeTrap();
  (void)trap_installed;
  bool ok = true;
  volatile uint32_t failed_block = 0;
  sigjmp_buf trap;
  sigjmp_buf* const outer_trap = g_trap;
  if (sigsetjmp(trap, 1) != 0) {
    g_trap = outer_trap;
    g_block = outer;
    *error = "block " + std::to_string(failed_block) +
             ": integer division by zero, or of the most negative value by -1, in device "
             "code (SIGFPE; a GPU would compute an unspecified value)";
    return false;
  }
  g_trap = &trap;
  for (uint32_t blk = 0; blk < grid && ok; ++blk) {
    failed_block = blk;
    blockIdx.x = blk;
    std::memset(run.dynamic.data(), 0xFF, run.dynamic.size() * sizeof(double));
    for (uint32_t t = 0; t < block; ++t) {
      Fiber& f = run.fibers[t];
      f = Fiber();
      f.tid = t;
      f.sp = InitStack(stacks.Get(t), &f);
    }
    if (ok && !RunBlock(&run, error)) {
      *error = "block " + std::to_string(blk) + ": " + *error;
      ok = false;
    }
  }
  g_trap = outer_trap;
  g_block = outer;
  return ok;
}

}  // namespace

double* DynamicShared() { return g_block->dynamic.data(); }

void SyncThreads() { Suspend(Wait::kSync); }

uint64_t WarpCollective(Collective op, unsigned mask, uint64_t value, int arg, int width) {
  Fiber* f = g_block->current;
  f->op = op;
  f->mask = mask;
  f->value = value;
  f->arg = arg;
  f->width = width;
  Suspend(Wait::kWarp);
  return f->result;
}

bool Run(uint32_t grid, uint32_t block, uint32_t shared_bytes, void (*body)(void*),
         void* closure, char* error, size_t error_size) {
  std::string why;
  if (RunBlocks(grid, block, shared_bytes, body, closure, &why)) return true;
  std::snprintf(error, error_size, "%s", why.c_str());
  return false;
}

}  // namespace disc_emu
