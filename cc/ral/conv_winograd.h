// conv_winograd.h -- a stride-1, undilated Conv1D whose kernel width is a multiple
// of 3, by Winograd's minimal filtering F(m, 3), m = 2, 4 or 6, over groups of three
// taps.
//
// A unit is m output columns: columns m q .. m q + m - 1 of tap group j (taps 3j,
// 3j + 1, 3j + 2 of the filter, g0 g1 g2: each ci x co) read the m + 2 input columns
// d0.. from m q + 3j - pad (zeros outside the input). The m + 2 parts V_u (of the
// input columns, 1 x ci each) and G_u (of the taps) give M_u = V_u G_u, and each
// output is a sum of M_u. F(2, 3):
//   V0 = d0 - d2,  V1 = d1 + d2,  V2 = d2 - d1,  V3 = d3 - d1
//   G0 = g0,       G1 = (g0 + g1 + g2) / 2,  G2 = (g0 - g1 + g2) / 2,  G3 = g2
//   y0 = M0 + M1 + M2,  y1 = M3 + M1 - M2.
// F(4, 3), from the points 0, 1, -1, 2, -2 and infinity:
//   V0 = 4 d0 - 5 d2 + d4,            V5 = 4 d1 - 5 d3 + d5,
//   V1 = -4 (d1 + d2) + d3 + d4,      V2 = 4 (d1 - d2) - d3 + d4,
//   V3 = 2 (d3 - d1) + d4 - d2,       V4 = 2 (d1 - d3) + d4 - d2;
//   G0 = g0 / 4,  G1 = -(g0 + g1 + g2) / 6,  G2 = -(g0 - g1 + g2) / 6,
//   G3 = g0 / 24 + g1 / 12 + g2 / 6,  G4 = g0 / 24 - g1 / 12 + g2 / 6,  G5 = g2;
//   with a = M1 + M2, b = M1 - M2, c = M3 + M4, d = M3 - M4:
//   y0 = M0 + a + c,  y1 = b + 2 d,  y2 = a + 4 c,  y3 = M5 + b + 8 d.
// F(6, 3), from the points 0, 1, -1, 2, -2, 1/2, -1/2 and infinity:
//   V0 = d0 - d6 + 21/4 (d4 - d2),    V7 = d7 - d1 + 21/4 (d3 - d5),
//   V1, V2 = e1 +- o1:  e1 = d2 + d6 - 17/4 d4,  o1 = d1 + d5 - 17/4 d3,
//   V3, V4 = e2 +- o2:  e2 = d2 / 4 - 5/4 d4 + d6,  o2 = d1 / 2 - 5/2 d3 + 2 d5,
//   V5, V6 = e3 +- o3:  e3 = 4 d2 - 5 d4 + d6,  o3 = 2 d1 - 5/2 d3 + d5 / 2;
//   G0 = g0,  G1, G2 = -2/9 (g0 +- g1 + g2),  G3, G4 = g0 / 90 +- g1 / 45 + 2/45 g2,
//   G5, G6 = 32/45 g0 +- 16/45 g1 + 8/45 g2,  G7 = g2;
//   with a_k, b_k = M_{2k-1} +- M_{2k} (the points +-1, +-2, +-1/2 for k = 1, 2, 3):
//   y0 = M0 + a1 + a2 + a3,  y5 = M7 + b1 + 32 b2 + b3 / 32, and between them
//   y_i = a1 + 2^i a2 + 2^-i a3 (i even) or b1 + 2^i b2 + 2^-i b3 (i odd).
// Concatenating the groups along the channels (V_u: 1 x groups * ci, G_u:
// groups * ci x co) makes each M_u one GEMM row for all groups: m + 2 GEMMs of depth
// kw / 3 * ci per unit, where the direct conv does m of depth kw * ci: 2/3 of the
// multiply-adds for F(2, 3), 1/2 for F(4, 3), 4/9 for F(6, 3). The G_u are the filter's, packed once
// (PackedWeights); V_u is built per tile of units in per-thread scratch (at most
// kWinogradTileFloats, kept by the thread as the GEMM block's packing buffer is),
// where the padding's zeros cost nothing, so no column of the output needs a copy of
// its window. The GEMMs write M0 and M_{m+1} straight into the unit's first and last
// output rows; the others go to scratch and the output transform combines them.
//
// TF-free, so that a test harness runs the tile exactly as the RAL does.
#ifndef DISC_TF_CC_RAL_CONV_WINOGRAD_H_
#define DISC_TF_CC_RAL_CONV_WINOGRAD_H_

#include <stdint.h>

#include "cc/ral/gemm_kernels.h"

namespace disc_tf {

// The most transformed operands of one conv: F(6, 3)'s V_0..V_7 and G_0..G_7.
constexpr int kWinogradMaxParts = 8;

// One Conv1D: x [batch, width, ci] -> c [batch, ow, co]; filter [kw, ci, co]
// (TF's HWIO with H = 1); output column o reads input columns o - pad ..
// o - pad + kw - 1. m: outputs per unit, 2, 4 or 6 (F(m, 3)).
struct WinogradConv1D {
  int64_t width = 0, ci = 0, co = 0, kw = 0, pad = 0, ow = 0;
  const float* x = nullptr;
  float* c = nullptr;
  int m = 2;
  // Transformed operands (and GEMMs) per unit.
  int parts() const { return m + 2; }
  // Depth of each GEMM: the tap groups' channels side by side.
  int64_t depth() const { return kw / 3 * ci; }
  // Units per image (the last one is short when m does not divide ow).
  int64_t units() const { return (ow + m - 1) / m; }
};

// A tile's scratch (its V_u and the M_u not written into C) is at most this many
// floats (2 MiB), as many units as fit, within [kWinogradMinTileUnits,
// kWinogradMaxTileUnits]. Each tile streams all the packed G_u past its rows, so the
// more units a tile has the fewer times the G_u are read from L3: on Sapphire Rapids
// (2 MiB L2) a kernel-9 256 -> 1024 conv at T 400-800 ran 1.15-1.3x slower in F(2, 3)
// tiles of 36-72 pairs than in tiles of 100-200 (bench/CONV.md, "Winograd").
constexpr int64_t kWinogradTileFloats = 512 * 1024;
constexpr int64_t kWinogradMinTileUnits = 12;
constexpr int64_t kWinogradMaxTileUnits = 128;

// Units per tile for `parts` GEMMs of `depth` over co output channels.
int64_t WinogradTileUnits(int parts, int64_t depth, int64_t co);

// How the threads share one conv: tiles of `units` units of one image, over `cols`
// output channels each (all of them, or whole 64-column panels).
struct WinogradSplit {
  int64_t units = 1, cols = 1;
  int64_t row_tiles = 1, col_blocks = 1;  // per image
};

// As few row tiles as the scratch allows (WinogradTileUnits units each, in 6-unit
// multiples: whole register tiles of the GEMM block), since each streams all the
// G_u. Where the images' row tiles do not share out evenly over the threads, the
// channels are cut too (64-column blocks, each reading its part of the G_u), so that
// the tasks do; where full_rows (an epilogue over whole rows) forbids that, one
// image takes more row tiles, a multiple of the threads.
WinogradSplit ChooseWinogradSplit(int64_t batch, int64_t units, int parts, int64_t depth,
                                  int64_t co, int64_t threads, bool full_rows);

// Writes G_u (u in [0, m + 2)) of F(m, 3) for filter w: depth x co floats,
// row-major, rows j * ci .. j * ci + ci - 1 from tap group j; only the elements
// [e0, e1) of each group's ci x co matrix (parallel callers take disjoint ranges).
void WinogradFilter(const float* w, int64_t kw, int64_t ci, int64_t co, int m, int u,
                    int64_t e0, int64_t e1, float* g);

// Floats of scratch one tile of `units` units over `cols` output channels needs
// (64-byte aligned by the caller).
int64_t WinogradScratchFloats(const WinogradConv1D& conv, int64_t units, int64_t cols);

// This thread's scratch of at least `floats` floats, 64-byte aligned, kept for
// the thread's lifetime (as the GEMM block's packing buffer is); null if memory
// ran out.
float* WinogradScratch(int64_t floats);

// Inputs the transforms take as a direct convolution would: below this size (2^64), so
// that sums of a few of them times the transforms' coefficients stay far from overflow.
constexpr float kWinogradInputLimit = 18446744073709551616.0f;

// True if each of the n floats at x is finite and at most kWinogradInputLimit in size.
// The transforms add and subtract a tile's inputs, so a NaN or infinity would reach
// every output of its tile, where TF's convolution has it reach only the outputs whose
// window holds it; the RAL declines Winograd for an input that is not (the GEMM path
// gives TF's answer).
bool WinogradInputSafe(const float* x, int64_t n);

// The ISA the transforms run in: the GEMM block's, so that an AVX2 block runs AVX2
// transforms on an AVX-512 host too (as on an AVX2-only machine, and as
// DISC_TF_GEMM_ISA / DISC_TF_ISA cap it), not the ISA of the CPU.
enum class WinogradIsa { kAvx2, kAvx512 };

// Output columns [m u0, min(m u1, ow)) and channels [j0, j1) of image n: V_u of the
// tile into scratch, the m + 2 GEMMs (packed[u]: G_u packed for `gemm`, j0 a
// multiple of its panel), the first and last written into C's rows, and the output
// transform combining the others with them.
void WinogradTile(const WinogradConv1D& conv, WinogradIsa isa, const float* const packed[],
                  disc_gemm_prepacked_block_fn gemm, int64_t n, int64_t u0, int64_t u1,
                  int64_t j0, int64_t j1, float* scratch);

}  // namespace disc_tf

#endif  // DISC_TF_CC_RAL_CONV_WINOGRAD_H_
