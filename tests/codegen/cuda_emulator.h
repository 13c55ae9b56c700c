// A tiny CUDA execution model on CPU threads, for tests on machines without a
// GPU: generated device code is compiled by g++ against this header and each
// launch runs its blocks one after another, every thread of a block on its
// own std::thread. Covers what the generated kernels use: thread and block
// indices, __syncthreads, __shfl_xor_sync, block-shared arrays (function
// statics: blocks never overlap), dynamic shared memory, fp16 (_Float16) and
// bf16 conversions.
#ifndef DISC_TF_TESTS_CUDA_EMULATOR_H_
#define DISC_TF_TESTS_CUDA_EMULATOR_H_

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __restrict__ __restrict
#define DISC_DYNAMIC_SMEM(name) double* name = disc_emu::current->dynamic.data()

struct disc_emu_dim3 {
  unsigned x = 1, y = 1, z = 1;
};
inline thread_local disc_emu_dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace disc_emu {

struct Block {
  Block(unsigned threads, unsigned shared_bytes)
      : sync(threads), warps((threads + 31) / 32), dynamic(shared_bytes / 8 + 1) {
    for (auto& w : warps) w = std::make_unique<Warp>();
  }
  struct Warp {
    std::barrier<> bar{32};
    uint64_t slots[32];
  };
  std::barrier<> sync;
  std::vector<std::unique_ptr<Warp>> warps;
  std::vector<double> dynamic;  // dynamic shared memory
};
inline thread_local Block* current = nullptr;

// Runs `kernel` on a grid x block launch (1-D), blocks in sequence.
inline void Run(unsigned grid, unsigned block, unsigned shared_bytes,
                const std::function<void()>& kernel) {
  for (unsigned b = 0; b < grid; ++b) {
    Block state(block, shared_bytes);
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < block; ++t) {
      threads.emplace_back([&, b, t] {
        current = &state;
        threadIdx.x = t;
        blockIdx.x = b;
        blockDim.x = block;
        gridDim.x = grid;
        kernel();
      });
    }
    for (auto& th : threads) th.join();
  }
}

}  // namespace disc_emu

inline void __syncthreads() { disc_emu::current->sync.arrive_and_wait(); }

template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int mask) {
  static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
  auto& w = *disc_emu::current->warps[threadIdx.x / 32];
  const unsigned lane = threadIdx.x % 32;
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  w.slots[lane] = bits;
  w.bar.arrive_and_wait();
  bits = w.slots[lane ^ static_cast<unsigned>(mask)];
  w.bar.arrive_and_wait();
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

using __half = _Float16;
inline float __half2float(__half h) { return static_cast<float>(h); }
inline __half __float2half_rn(float f) { return static_cast<__half>(f); }

struct __nv_bfloat16 {
  uint16_t bits;
};
inline float __bfloat162float(__nv_bfloat16 h) {
  const uint32_t u = static_cast<uint32_t>(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return {static_cast<uint16_t>((u >> 16) | 0x40)};
  return {static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16)};
}

#endif  // DISC_TF_TESTS_CUDA_EMULATOR_H_
