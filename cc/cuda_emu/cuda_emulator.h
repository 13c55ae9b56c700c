// cuda_emulator.h -- the CUDA execution model on a CPU thread, for running the
// CUDA backend's generated device code where there is no GPU (the `cuda-emu`
// target; tests). The device source is compiled by the host C++ compiler with
// this header included first (-include), in place of the CUDA headers.
//
// What is emulated, with the semantics a GPU has:
// * A launch: a 1-D grid of 1-D blocks, checked as the driver checks it (grid
//   >= 1, block in [1, 1024], dynamic shared memory within the 48 KiB default).
//   Blocks run one after another; the threads of a block run as fibers
//   (cooperative user-level threads) on the calling thread, so `__shared__`
//   data (thread-local statics) is shared by the block's threads only.
// * __syncthreads: a block-wide barrier. A thread that exits while others wait
//   at one, or threads waiting at different barriers in a way no schedule can
//   complete, is reported as an error (on a GPU: a hang or undefined
//   behaviour), as is a warp collective some lane of its mask never reaches.
// * Warp collectives (__shfl*_sync, __ballot_sync, __any_sync, __all_sync,
//   __syncwarp) in lock step: every lane of the mask must arrive at the same
//   collective with the same mask before any of them continues; a lane reading
//   a lane outside the mask is an error; `width` behaves as documented.
// * Atomics (the block's fibers never run at once, and blocks run in sequence,
//   so a plain read-modify-write is atomic).
// * Dynamic shared memory is filled with 0xFF bytes (NaN for floats) before
//   each block: code that reads it before writing it gives NaN, not zero.
// * fp16 as _Float16, bf16 with round-to-nearest-even conversions.
// * An integer division by zero, or of the most negative value by -1, in device
//   code (SIGFPE on x86; a GPU computes an unspecified value) ends the launch with
//   an error instead of the process.
//
// This header is the device side only and includes C headers only, so that a
// device unit parses in a few hundredths of a second: the launch loop (fibers, the
// block scheduler, warp collectives, the SIGFPE trap) is emu_runtime.cc, one
// translation unit that every artifact links (hidden: each artifact has its own).
// The math the device code calls comes from device_include/math.h, the emulator's
// <math.h>, as a GPU's comes from CUDA's.
//
// Errors are reported by disc_emu::Launch's return value and message.
#ifndef DISC_CUDA_EMULATOR_H_
#define DISC_CUDA_EMULATOR_H_

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ static thread_local
#define __restrict__ __restrict
#define DISC_DYNAMIC_SMEM(name) double* name = disc_emu::DynamicShared()

struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};
inline thread_local uint3 threadIdx, blockIdx;
inline thread_local dim3 blockDim, gridDim;
#define warpSize 32

namespace disc_emu {

enum class Collective { kShflIdx, kShflUp, kShflDown, kShflXor, kBallot, kAny, kAll, kSyncWarp };

// ---- the launch loop's entry points (emu_runtime.cc) -------------------------

// The running block's dynamic shared memory.
double* DynamicShared();
// A block-wide barrier: suspends the calling thread until its block's threads all
// reach one.
void SyncThreads();
// Suspends the calling thread at warp collective `op` until every lane of `mask`
// is there; returns its result for this lane (the operand of the lane it reads,
// or the vote).
uint64_t WarpCollective(Collective op, unsigned mask, uint64_t value, int arg, int width);
// Runs `body(closure)` as every thread of a grid x block launch. Returns false with
// the reason in `error` (at most `error_size` bytes) for an invalid configuration,
// a deadlock or a division by zero.
bool Run(uint32_t grid, uint32_t block, uint32_t shared_bytes, void (*body)(void*),
         void* closure, char* error, size_t error_size);

// A kernel bound to its argument struct (the one kernelParams pointer the
// generated host runner passes).
template <typename Args>
struct Bound {
  void (*kernel)(Args);
  const Args* args;
  static void Call(void* self) {
    const Bound* b = static_cast<const Bound*>(self);
    b->kernel(*b->args);
  }
};

template <typename Args>
bool Launch(void (*kernel)(Args), uint32_t grid, uint32_t block, uint32_t shared_bytes,
            void** params, char* error, size_t error_size) {
  Bound<Args> bound{kernel, static_cast<const Args*>(params[0])};
  return Run(grid, block, shared_bytes, &Bound<Args>::Call, &bound, error, error_size);
}

template <typename T>
T Shuffle(Collective op, unsigned mask, T v, int arg, int width) {
  static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes");
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof(T));
  bits = WarpCollective(op, mask, bits, arg, width);
  T out;
  memcpy(&out, &bits, sizeof(T));
  return out;
}

}  // namespace disc_emu

// ---- the device API ---------------------------------------------------------

inline void __syncthreads() { disc_emu::SyncThreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  disc_emu::WarpCollective(disc_emu::Collective::kSyncWarp, mask, 0, 0, 32);
}
template <typename T>
T __shfl_sync(unsigned mask, T v, int src, int width = warpSize) {
  return disc_emu::Shuffle(disc_emu::Collective::kShflIdx, mask, v, src, width);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
  return disc_emu::Shuffle(disc_emu::Collective::kShflUp, mask, v, static_cast<int>(delta), width);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
  return disc_emu::Shuffle(disc_emu::Collective::kShflDown, mask, v, static_cast<int>(delta), width);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = warpSize) {
  return disc_emu::Shuffle(disc_emu::Collective::kShflXor, mask, v, lane_mask, width);
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return static_cast<unsigned>(
      disc_emu::WarpCollective(disc_emu::Collective::kBallot, mask, predicate != 0, 0, 32));
}
inline int __any_sync(unsigned mask, int predicate) {
  return static_cast<int>(
      disc_emu::WarpCollective(disc_emu::Collective::kAny, mask, predicate != 0, 0, 32));
}
inline int __all_sync(unsigned mask, int predicate) {
  return static_cast<int>(
      disc_emu::WarpCollective(disc_emu::Collective::kAll, mask, predicate != 0, 0, 32));
}

template <typename T>
T atomicAdd(T* address, T v) {
  const T old = *address;
  *address = old + v;
  return old;
}
template <typename T>
T atomicMax(T* address, T v) {
  const T old = *address;
  *address = old < v ? v : old;
  return old;
}
template <typename T>
T atomicMin(T* address, T v) {
  const T old = *address;
  *address = v < old ? v : old;
  return old;
}
template <typename T>
T atomicExch(T* address, T v) {
  const T old = *address;
  *address = v;
  return old;
}
template <typename T>
T atomicCAS(T* address, T compare, T v) {
  const T old = *address;
  if (old == compare) *address = v;
  return old;
}

// CUDA's intrinsics, as the builtins <cmath>'s float overloads call.
inline float rsqrtf(float x) { return 1.0f / __builtin_sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / __builtin_sqrt(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __expf(float x) { return __builtin_expf(x); }
inline float __logf(float x) { return __builtin_logf(x); }

// ---- fp16 and bf16 ----------------------------------------------------------

using __half = _Float16;
inline float __half2float(__half h) { return static_cast<float>(h); }
inline __half __float2half_rn(float f) { return static_cast<__half>(f); }

// bf16 as CUDA's: conversions from and to float round to nearest even.
struct __nv_bfloat16 {
  uint16_t bits;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) {  // NOLINT: implicit, as cuda_bf16.h's
    uint32_t u;
    memcpy(&u, &f, 4);
    bits = __builtin_isnan(f) ? static_cast<uint16_t>((u >> 16) | 0x40)
                              : static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
  }
  operator float() const {  // NOLINT
    const uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
};
inline float __bfloat162float(__nv_bfloat16 h) { return static_cast<float>(h); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }

#endif  // DISC_CUDA_EMULATOR_H_
