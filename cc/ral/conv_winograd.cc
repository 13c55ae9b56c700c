// conv_winograd.cc -- see conv_winograd.h.
#include "cc/ral/conv_winograd.h"

#include "cc/ral/aligned_buffer.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace disc_tf {
namespace {

// Scratch parts start on 64-byte boundaries.
int64_t Aligned(int64_t floats) { return (floats + 15) / 16 * 16; }

// The transforms stream memory; built for each ISA (chosen once at load) so that
// they run in whole vectors: baseline SSE2 took a seventh of a kernel-3 tile's time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DISC_WINOGRAD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DISC_WINOGRAD_CLONES
#endif

// V_0..V_3 of one group of one pair (n floats each, `part` floats apart).
DISC_WINOGRAD_CLONES
void InputTransform(int64_t n, const float* __restrict d0, const float* __restrict d1,
                    const float* __restrict d2, const float* __restrict d3,
                    float* __restrict v, int64_t part) {
  float* __restrict v0 = v;
  float* __restrict v1 = v + part;
  float* __restrict v2 = v + 2 * part;
  float* __restrict v3 = v + 3 * part;
  for (int64_t e = 0; e < n; ++e) {
    v0[e] = d0[e] - d2[e];
    v1[e] = d1[e] + d2[e];
    v2[e] = d2[e] - d1[e];
    v3[e] = d3[e] - d1[e];
  }
}

// y0 += m1 + m2 and, when y1 is not null, y1 += m1 - m2 (n floats each).
DISC_WINOGRAD_CLONES
void OutputTransform(int64_t n, const float* __restrict m1, const float* __restrict m2,
                     float* __restrict y0, float* __restrict y1) {
  if (y1 == nullptr) {
    for (int64_t e = 0; e < n; ++e) y0[e] += m1[e] + m2[e];
    return;
  }
  for (int64_t e = 0; e < n; ++e) {
    y0[e] += m1[e] + m2[e];
    y1[e] += m1[e] - m2[e];
  }
}

}  // namespace

int64_t WinogradTilePairs(int64_t depth, int64_t co) {
  const int64_t per_pair = kWinogradParts * depth + 2 * co;  // scratch floats
  return std::clamp<int64_t>(kWinogradTileFloats / std::max<int64_t>(per_pair, 1),
                             kWinogradMinTilePairs, kWinogradMaxTilePairs);
}

WinogradSplit ChooseWinogradSplit(int64_t batch, int64_t pairs, int64_t depth, int64_t co,
                                  int64_t threads, bool full_rows) {
  WinogradSplit split;
  threads = std::max<int64_t>(1, threads);
  const int64_t most = WinogradTilePairs(depth, co);
  int64_t tiles = (pairs + most - 1) / most;
  // One image: a multiple of the threads, where 6-pair tiles allow.
  if (batch == 1 && tiles % threads != 0 && pairs >= 6 * threads)
    tiles = (tiles + threads - 1) / threads * threads;
  const int64_t per_tile = (pairs + tiles - 1) / tiles;
  split.pairs = std::min(pairs, (per_tile + 5) / 6 * 6);
  split.row_tiles = (pairs + split.pairs - 1) / split.pairs;
  split.cols = co;
  if (!full_rows && batch * split.row_tiles < threads) {
    const int64_t want = (threads + batch * split.row_tiles - 1) / (batch * split.row_tiles);
    const int64_t blocks = std::max<int64_t>(1, std::min(want, co / 64));
    split.cols = std::min(co, ((co + blocks - 1) / blocks + 63) / 64 * 64);
  }
  split.col_blocks = (co + split.cols - 1) / split.cols;
  return split;
}

void WinogradFilter(const float* w, int64_t kw, int64_t ci, int64_t co, int u, int64_t e0,
                    int64_t e1, float* g) {
  const int64_t tap = ci * co;  // floats of one tap's ci x co matrix
  for (int64_t j = 0; j < kw / 3; ++j) {
    const float* g0 = w + 3 * j * tap;
    const float* g1 = g0 + tap;
    const float* g2 = g1 + tap;
    float* out = g + j * tap;
    for (int64_t e = e0; e < e1; ++e) {
      switch (u) {
        case 0: out[e] = g0[e]; break;
        case 1: out[e] = 0.5f * (g0[e] + g1[e] + g2[e]); break;
        case 2: out[e] = 0.5f * (g0[e] - g1[e] + g2[e]); break;
        default: out[e] = g2[e]; break;
      }
    }
  }
}

int64_t WinogradScratchFloats(const WinogradConv1D& conv, int64_t pairs, int64_t cols) {
  return kWinogradParts * Aligned(pairs * conv.depth()) + 2 * Aligned(pairs * cols) +
         Aligned(conv.ci);
}

float* WinogradScratch(int64_t floats) {
  thread_local AlignedBuffer buffer;
  return buffer.Reserve(floats);
}

void WinogradTile(const WinogradConv1D& conv, const float* const packed[kWinogradParts],
                  disc_gemm_prepacked_block_fn gemm, int64_t n, int64_t p0, int64_t p1,
                  int64_t j0, int64_t j1, float* scratch) {
  const int64_t pairs = p1 - p0, cols = j1 - j0, ci = conv.ci, co = conv.co;
  const int64_t depth = conv.depth(), part = Aligned(pairs * depth);
  if (pairs <= 0 || cols <= 0) return;
  float* v = scratch;  // V_u: part floats each, pairs x depth
  float* m1 = v + kWinogradParts * part;
  float* m2 = m1 + Aligned(pairs * cols);
  float* zeros = m2 + Aligned(pairs * cols);  // an input column of the padding
  std::memset(zeros, 0, ci * sizeof(float));
  const float* image = conv.x + n * conv.width * ci;
  auto column = [&](int64_t col) {
    return col >= 0 && col < conv.width ? image + col * ci : zeros;
  };
  // The input transform: each pair's four columns per tap group.
  for (int64_t p = p0; p < p1; ++p) {
    for (int64_t j = 0; j < conv.kw / 3; ++j) {
      const int64_t first = 2 * p + 3 * j - conv.pad;
      const float* d0 = column(first);
      const float* d1 = column(first + 1);
      const float* d2 = column(first + 2);
      const float* d3 = column(first + 3);
      InputTransform(ci, d0, d1, d2, d3, v + (p - p0) * depth + j * ci, part);
    }
  }
  // C's even rows get M0 and its odd rows M3 straight from the GEMM (rows 2 co
  // apart); the last pair of an odd-width output has no odd row.
  float* even = conv.c + (n * conv.ow + 2 * p0) * co + j0;
  float* odd = even + co;
  const int64_t odd_rows = 2 * p1 > conv.ow ? pairs - 1 : pairs;
  gemm(pairs, cols, depth, v, depth, 0, packed[0] + j0 * depth, even, 2 * co, 0);
  gemm(pairs, cols, depth, v + part, depth, 0, packed[1] + j0 * depth, m1, cols, 0);
  gemm(pairs, cols, depth, v + 2 * part, depth, 0, packed[2] + j0 * depth, m2, cols, 0);
  if (odd_rows > 0)
    gemm(odd_rows, cols, depth, v + 3 * part, depth, 0, packed[3] + j0 * depth, odd, 2 * co, 0);
  // The output transform: y(2p) = M0 + M1 + M2, y(2p + 1) = M3 + M1 - M2.
  for (int64_t i = 0; i < pairs; ++i) {
    float* y0 = even + 2 * i * co;
    OutputTransform(cols, m1 + i * cols, m2 + i * cols, y0, i < odd_rows ? y0 + co : nullptr);
  }
}

}  // namespace disc_tf
