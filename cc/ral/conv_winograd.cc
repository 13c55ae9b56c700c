// conv_winograd.cc -- see conv_winograd.h.
#include "cc/ral/conv_winograd.h"

#include "cc/ral/aligned_buffer.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>

namespace disc_tf {
namespace {

// Scratch parts start on 64-byte boundaries.
int64_t Aligned(int64_t floats) { return (floats + 15) / 16 * 16; }

// The transforms stream memory and run in whole vectors (baseline SSE2 took a seventh
// of a kernel-3 tile's time): each is inlined into a dispatcher built for the GEMM
// block's ISA (WinogradIsa), below.
#define DISC_WINOGRAD_BODY __attribute__((always_inline)) inline

// F(2, 3)'s V_0..V_3 of one group of one unit (n floats each, `part` floats apart).
DISC_WINOGRAD_BODY
void InputTransform2(int64_t n, const float* const* __restrict d, float* __restrict v,
                     int64_t part) {
  const float* __restrict d0 = d[0];
  const float* __restrict d1 = d[1];
  const float* __restrict d2 = d[2];
  const float* __restrict d3 = d[3];
  float* __restrict v0 = v;
  float* __restrict v1 = v + part;
  float* __restrict v2 = v + 2 * part;
  float* __restrict v3 = v + 3 * part;
  #pragma omp simd
  for (int64_t e = 0; e < n; ++e) {
    v0[e] = d0[e] - d2[e];
    v1[e] = d1[e] + d2[e];
    v2[e] = d2[e] - d1[e];
    v3[e] = d3[e] - d1[e];
  }
}

// F(4, 3)'s V_0..V_5 of one group of one unit.
DISC_WINOGRAD_BODY
void InputTransform4(int64_t n, const float* const* __restrict d, float* __restrict v,
                     int64_t part) {
  const float* __restrict d0 = d[0];
  const float* __restrict d1 = d[1];
  const float* __restrict d2 = d[2];
  const float* __restrict d3 = d[3];
  const float* __restrict d4 = d[4];
  const float* __restrict d5 = d[5];
  float* __restrict v0 = v;
  float* __restrict v1 = v + part;
  float* __restrict v2 = v + 2 * part;
  float* __restrict v3 = v + 3 * part;
  float* __restrict v4 = v + 4 * part;
  float* __restrict v5 = v + 5 * part;
  #pragma omp simd
  for (int64_t e = 0; e < n; ++e) {
    const float s12 = d1[e] + d2[e], t12 = d1[e] - d2[e], t31 = d3[e] - d1[e];
    const float e42 = d4[e] - d2[e];
    v0[e] = 4.0f * d0[e] - 5.0f * d2[e] + d4[e];
    v1[e] = -4.0f * s12 + d3[e] + d4[e];
    v2[e] = 4.0f * t12 - d3[e] + d4[e];
    v3[e] = 2.0f * t31 + e42;
    v4[e] = -2.0f * t31 + e42;
    v5[e] = 4.0f * d1[e] - 5.0f * d3[e] + d5[e];
  }
}

// F(6, 3)'s V_0..V_7 of one group of one unit (the points 0, +-1, +-2, +-1/2 and
// infinity; the pairs of a point and its negative share their even and odd halves).
DISC_WINOGRAD_BODY
void InputTransform6(int64_t n, const float* const* __restrict d, float* __restrict v,
                     int64_t part) {
  #pragma omp simd
  for (int64_t e = 0; e < n; ++e) {
    float x[8];
    for (int i = 0; i < 8; ++i) x[i] = d[i][e];
    const float even1 = x[2] + x[6] - 4.25f * x[4], odd1 = x[1] + x[5] - 4.25f * x[3];
    const float even2 = 0.25f * x[2] - 1.25f * x[4] + x[6];
    const float odd2 = 0.5f * x[1] - 2.5f * x[3] + 2.0f * x[5];
    const float even3 = 4.0f * x[2] - 5.0f * x[4] + x[6];
    const float odd3 = 2.0f * x[1] - 2.5f * x[3] + 0.5f * x[5];
    v[e] = x[0] - x[6] + 5.25f * (x[4] - x[2]);
    v[part + e] = even1 + odd1;
    v[2 * part + e] = even1 - odd1;
    v[3 * part + e] = even2 + odd2;
    v[4 * part + e] = even2 - odd2;
    v[5 * part + e] = even3 + odd3;
    v[6 * part + e] = even3 - odd3;
    v[7 * part + e] = x[7] - x[1] + 5.25f * (x[3] - x[5]);
  }
}

// F(2, 3): y0 += m1 + m2 and, when y[1] is not null, y1 += m1 - m2 (n floats each).
DISC_WINOGRAD_BODY
void OutputTransform2(int64_t n, const float* const* __restrict m, float* const* y) {
  const float* __restrict m1 = m[0];
  const float* __restrict m2 = m[1];
  float* __restrict y0 = y[0];
  float* __restrict y1 = y[1];
  if (y1 == nullptr) {
    #pragma omp simd
    for (int64_t e = 0; e < n; ++e) y0[e] += m1[e] + m2[e];
    return;
  }
  #pragma omp simd
  for (int64_t e = 0; e < n; ++e) {
    y0[e] += m1[e] + m2[e];
    y1[e] += m1[e] - m2[e];
  }
}

// F(4, 3), y0 and y3 already holding M0 and M5: y0 += a + c, y1 = b + 2 d,
// y2 = a + 4 c, y3 += b + 8 d (a = m1 + m2, b = m1 - m2, c = m3 + m4, d = m3 - m4);
// the y that are null are past the output's end (then so are those after them).
DISC_WINOGRAD_BODY
void OutputTransform4(int64_t n, const float* const* __restrict m, float* const* y) {
  const float* __restrict m1 = m[0];
  const float* __restrict m2 = m[1];
  const float* __restrict m3 = m[2];
  const float* __restrict m4 = m[3];
  float* __restrict y0 = y[0];
  float* __restrict y1 = y[1];
  float* __restrict y2 = y[2];
  float* __restrict y3 = y[3];
  if (y3 != nullptr) {
    #pragma omp simd
    for (int64_t e = 0; e < n; ++e) {
      const float a = m1[e] + m2[e], b = m1[e] - m2[e], c = m3[e] + m4[e], d = m3[e] - m4[e];
      y0[e] += a + c;
      y1[e] = b + 2.0f * d;
      y2[e] = a + 4.0f * c;
      y3[e] += b + 8.0f * d;
    }
    return;
  }
  #pragma omp simd
  for (int64_t e = 0; e < n; ++e) {  // the output's last unit, 1-3 columns
    const float a = m1[e] + m2[e], c = m3[e] + m4[e];
    y0[e] += a + c;
    if (y1 != nullptr) y1[e] = (m1[e] - m2[e]) + 2.0f * (m3[e] - m4[e]);
    if (y2 != nullptr) y2[e] = a + 4.0f * c;
  }
}

// F(6, 3)'s six outputs of element e (y0 and y5 without M0 and M7).
struct Outputs6 {
  float y[6];
  Outputs6(const float* const* __restrict m, int64_t e) {
    const float a1 = m[0][e] + m[1][e], b1 = m[0][e] - m[1][e], a2 = m[2][e] + m[3][e];
    const float b2 = m[2][e] - m[3][e], a3 = m[4][e] + m[5][e], b3 = m[4][e] - m[5][e];
    y[0] = a1 + a2 + a3;
    y[1] = b1 + 2.0f * b2 + 0.5f * b3;
    y[2] = a1 + 4.0f * a2 + 0.25f * a3;
    y[3] = b1 + 8.0f * b2 + 0.125f * b3;
    y[4] = a1 + 16.0f * a2 + 0.0625f * a3;
    y[5] = b1 + 32.0f * b2 + 0.03125f * b3;
  }
};

// F(6, 3), y0 and y5 already holding M0 and M7: with a_k and b_k the sum and the
// difference of the M_u of the points +-1, +-2, +-1/2 (k = 1, 2, 3),
// y_i (+)= a1 + 2^i a2 + 2^-i a3 for even i, b1 + 2^i b2 + 2^-i b3 for odd i; the y
// that are null are past the output's end (then so are those after them).
DISC_WINOGRAD_BODY
void OutputTransform6(int64_t n, const float* const* __restrict m, float* const* y) {
  float* __restrict y0 = y[0];
  float* __restrict y1 = y[1];
  float* __restrict y2 = y[2];
  float* __restrict y3 = y[3];
  float* __restrict y4 = y[4];
  float* __restrict y5 = y[5];
  if (y5 != nullptr) {
    #pragma omp simd
    for (int64_t e = 0; e < n; ++e) {
      const Outputs6 o(m, e);
      y0[e] += o.y[0];
      y1[e] = o.y[1];
      y2[e] = o.y[2];
      y3[e] = o.y[3];
      y4[e] = o.y[4];
      y5[e] += o.y[5];
    }
    return;
  }
  #pragma omp simd
  for (int64_t e = 0; e < n; ++e) {  // the output's last unit, 1-5 columns
    const Outputs6 o(m, e);
    y0[e] += o.y[0];
    for (int r = 1; r < 5 && y[r] != nullptr; ++r) y[r][e] = o.y[r];
  }
}

// The transforms of F(m, 3) in one target ISA: GCC inlines the bodies above and
// vectorises their `omp simd` loops for it (conv_winograd.cc is built with
// -fopenmp-simd: native_build.py's SOURCE_FLAGS).
#if defined(__x86_64__) && defined(__GNUC__)
#define DISC_WINOGRAD_TARGET(target_isa) __attribute__((target(target_isa)))
#else
#define DISC_WINOGRAD_TARGET(target_isa)
#endif
#define DISC_WINOGRAD_TRANSFORMS(Isa, target_isa)                                          \
  DISC_WINOGRAD_TARGET(target_isa) void InputTransform##Isa(                               \
      int m, int64_t n, const float* const* d, float* v, int64_t part) {                   \
    if (m == 6) return InputTransform6(n, d, v, part);                                     \
    if (m == 4) return InputTransform4(n, d, v, part);                                     \
    InputTransform2(n, d, v, part);                                                        \
  }                                                                                        \
  DISC_WINOGRAD_TARGET(target_isa) void OutputTransform##Isa(                              \
      int m, int64_t n, const float* const* ms, float* const* y) {                         \
    if (m == 6) return OutputTransform6(n, ms, y);                                         \
    if (m == 4) return OutputTransform4(n, ms, y);                                         \
    OutputTransform2(n, ms, y);                                                            \
  }
DISC_WINOGRAD_TRANSFORMS(Avx2, "avx2,fma")
DISC_WINOGRAD_TRANSFORMS(Avx512, "avx512f,avx512vl,avx2,fma")

}  // namespace

int64_t WinogradTileUnits(int parts, int64_t depth, int64_t co) {
  const int64_t per_unit = parts * depth + (parts - 2) * co;  // scratch floats
  return std::clamp<int64_t>(kWinogradTileFloats / std::max<int64_t>(per_unit, 1),
                             kWinogradMinTileUnits, kWinogradMaxTileUnits);
}

WinogradSplit ChooseWinogradSplit(int64_t batch, int64_t units, int parts, int64_t depth,
                                  int64_t co, int64_t threads, bool full_rows) {
  WinogradSplit split;
  threads = std::max<int64_t>(1, threads);
  const int64_t most = WinogradTileUnits(parts, depth, co);
  int64_t tiles = (units + most - 1) / most;
  // Each row tile streams all the G_u, a column block only its part: where the
  // tiles do not share out evenly, blocks of columns make up the difference, and
  // more row tiles only where the epilogue wants whole rows.
  split.cols = co;
  const int64_t tasks = batch * tiles;
  if (tasks % threads != 0) {
    if (!full_rows && co >= 128) {
      const int64_t want = tasks < threads ? (threads + tasks - 1) / tasks
                                           : threads / std::gcd(tasks, threads);
      const int64_t blocks = std::max<int64_t>(1, std::min(want, co / 64));
      split.cols = std::min(co, ((co + blocks - 1) / blocks + 63) / 64 * 64);
    } else if (batch == 1 && units >= 6 * threads) {
      tiles = (tiles + threads - 1) / threads * threads;  // 6-unit tiles allow it
    }
  }
  const int64_t per_tile = (units + tiles - 1) / tiles;
  split.units = std::min(units, (per_tile + 5) / 6 * 6);
  split.row_tiles = (units + split.units - 1) / split.units;
  split.col_blocks = (co + split.cols - 1) / split.cols;
  return split;
}

void WinogradFilter(const float* w, int64_t kw, int64_t ci, int64_t co, int m, int u,
                    int64_t e0, int64_t e1, float* g) {
  const int64_t tap = ci * co;  // floats of one tap's ci x co matrix
  // Row u of G: the weights of g0, g1, g2 in G_u.
  static constexpr float kG2[4][3] = {
      {1.0f, 0.0f, 0.0f}, {0.5f, 0.5f, 0.5f}, {0.5f, -0.5f, 0.5f}, {0.0f, 0.0f, 1.0f}};
  static constexpr float kG4[6][3] = {{0.25f, 0.0f, 0.0f},
                                      {-1.0f / 6, -1.0f / 6, -1.0f / 6},
                                      {-1.0f / 6, 1.0f / 6, -1.0f / 6},
                                      {1.0f / 24, 1.0f / 12, 1.0f / 6},
                                      {1.0f / 24, -1.0f / 12, 1.0f / 6},
                                      {0.0f, 0.0f, 1.0f}};
  static constexpr float kG6[8][3] = {{1.0f, 0.0f, 0.0f},
                                      {-2.0f / 9, -2.0f / 9, -2.0f / 9},
                                      {-2.0f / 9, 2.0f / 9, -2.0f / 9},
                                      {1.0f / 90, 1.0f / 45, 2.0f / 45},
                                      {1.0f / 90, -1.0f / 45, 2.0f / 45},
                                      {32.0f / 45, 16.0f / 45, 8.0f / 45},
                                      {32.0f / 45, -16.0f / 45, 8.0f / 45},
                                      {0.0f, 0.0f, 1.0f}};
  const float* row = m == 6 ? kG6[u] : m == 4 ? kG4[u] : kG2[u];
  for (int64_t j = 0; j < kw / 3; ++j) {
    const float* g0 = w + 3 * j * tap;
    const float* g1 = g0 + tap;
    const float* g2 = g1 + tap;
    float* out = g + j * tap;
    #pragma omp simd
    for (int64_t e = e0; e < e1; ++e) out[e] = row[0] * g0[e] + row[1] * g1[e] + row[2] * g2[e];
  }
}

int64_t WinogradScratchFloats(const WinogradConv1D& conv, int64_t units, int64_t cols) {
  return conv.parts() * Aligned(units * conv.depth()) +
         (conv.parts() - 2) * Aligned(units * cols) + Aligned(conv.ci);
}

float* WinogradScratch(int64_t floats) {
  thread_local AlignedBuffer buffer;
  return buffer.Reserve(floats);
}

void WinogradTile(const WinogradConv1D& conv, WinogradIsa isa, const float* const packed[],
                  disc_gemm_prepacked_block_fn gemm, int64_t n, int64_t u0, int64_t u1,
                  int64_t j0, int64_t j1, float* scratch) {
  const int64_t units = u1 - u0, cols = j1 - j0, ci = conv.ci, co = conv.co;
  const int m = conv.m, parts = conv.parts();
  const int64_t depth = conv.depth(), part = Aligned(units * depth);
  const int64_t mpart = Aligned(units * cols);
  if (units <= 0 || cols <= 0) return;
  float* v = scratch;  // V_u: part floats each, units x depth
  float* mid = v + parts * part;  // M_1..M_{parts-2}: mpart floats each, units x cols
  float* zeros = mid + (parts - 2) * mpart;  // an input column of the padding
  std::memset(zeros, 0, ci * sizeof(float));
  const float* image = conv.x + n * conv.width * ci;
  const bool avx512 = isa == WinogradIsa::kAvx512;
  const auto input_transform = avx512 ? &InputTransformAvx512 : &InputTransformAvx2;
  const auto output_transform = avx512 ? &OutputTransformAvx512 : &OutputTransformAvx2;
  // The input transform: each unit's m + 2 columns per tap group.
  const float* d[kWinogradMaxParts];
  for (int64_t q = u0; q < u1; ++q) {
    for (int64_t j = 0; j < conv.kw / 3; ++j) {
      const int64_t first = m * q + 3 * j - conv.pad;
      for (int i = 0; i < parts; ++i) {
        const int64_t col = first + i;
        d[i] = col >= 0 && col < conv.width ? image + col * ci : zeros;
      }
      input_transform(m, ci, d, v + (q - u0) * depth + j * ci, part);
    }
  }
  // C's first row of each unit gets M0 and its last row M_{parts-1} straight from
  // the GEMM (rows m co apart); a short last unit has no last row.
  float* first = conv.c + (n * conv.ow + m * u0) * co + j0;
  float* last = first + (m - 1) * co;
  const int64_t full_units = m * u1 > conv.ow ? units - 1 : units;
  gemm(units, cols, depth, v, depth, 0, packed[0] + j0 * depth, first, m * co, 0);
  for (int u = 1; u < parts - 1; ++u)
    gemm(units, cols, depth, v + u * part, depth, 0, packed[u] + j0 * depth,
         mid + (u - 1) * mpart, cols, 0);
  if (full_units > 0)
    gemm(full_units, cols, depth, v + (parts - 1) * part, depth, 0,
         packed[parts - 1] + j0 * depth, last, m * co, 0);
  // The output transform: each unit's middle M_u combined into its m rows.
  const float* ms[kWinogradMaxParts - 2];
  float* y[kWinogradMaxParts - 2];
  for (int64_t i = 0; i < units; ++i) {
    const int64_t rows = std::min<int64_t>(m, conv.ow - m * (u0 + i));
    for (int u = 0; u < parts - 2; ++u) ms[u] = mid + u * mpart + i * cols;
    for (int r = 0; r < m; ++r) y[r] = r < rows ? first + (m * i + r) * co : nullptr;
    output_transform(m, cols, ms, y);
  }
}

bool WinogradInputSafe(const float* x, int64_t n) {
  // Blocks of 4096, each one vectorized pass (NaN fails the comparison), so that an
  // unsafe input stops the scan early.
  for (int64_t i0 = 0; i0 < n; i0 += 4096) {
    const int64_t i1 = std::min(n, i0 + 4096);
    int32_t unsafe = 0;
#pragma omp simd reduction(| : unsafe)
    for (int64_t i = i0; i < i1; ++i) unsafe |= !(__builtin_fabsf(x[i]) <= kWinogradInputLimit);
    if (unsafe != 0) return false;
  }
  return true;
}

}  // namespace disc_tf
