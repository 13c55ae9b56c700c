// conv_winograd.h -- a stride-1, undilated Conv1D whose kernel width is a multiple
// of 3, by Winograd's minimal filtering F(2, 3) over groups of three taps.
//
// Output columns 2p and 2p + 1 of tap group j (taps 3j, 3j + 1, 3j + 2 of the
// filter, g0 g1 g2: each ci x co) read the four input columns d0..d3 from
// 2p + 3j - pad (zeros outside the input). With
//   V0 = d0 - d2,  V1 = d1 + d2,  V2 = d2 - d1,  V3 = d3 - d1      (1 x ci each)
//   G0 = g0,       G1 = (g0 + g1 + g2) / 2,  G2 = (g0 - g1 + g2) / 2,  G3 = g2
// and M_u = V_u G_u, the two outputs are
//   y(2p)     = M0 + M1 + M2      (= d0 g0 + d1 g1 + d2 g2)
//   y(2p + 1) = M3 + M1 - M2      (= d1 g0 + d2 g1 + d3 g2).
// Concatenating the groups along the channels (V_u: 1 x groups * ci, G_u:
// groups * ci x co) makes each M_u one GEMM row for all groups: four GEMMs of
// depth kw / 3 * ci per pair of outputs, where the direct conv does two of depth
// kw * ci: 2/3 of the multiply-adds. The four G_u are the filter's, packed once
// (PackedWeights); V_u is built per tile of output pairs in per-thread scratch
// (at most kWinogradTileFloats, kept by the thread as the GEMM block's packing
// buffer is),
// where the padding's zeros cost nothing, so no column of the output needs a
// copy of its window.
//
// TF-free, so that a test harness runs the tile exactly as the RAL does.
#ifndef DISC_TF_CC_RAL_CONV_WINOGRAD_H_
#define DISC_TF_CC_RAL_CONV_WINOGRAD_H_

#include <stdint.h>

#include "cc/ral/gemm_kernels.h"

namespace disc_tf {

// The transformed operands: V_0..V_3 and G_0..G_3.
constexpr int kWinogradParts = 4;

// One Conv1D: x [batch, width, ci] -> c [batch, ow, co]; filter [kw, ci, co]
// (TF's HWIO with H = 1); output column o reads input columns o - pad ..
// o - pad + kw - 1.
struct WinogradConv1D {
  int64_t width = 0, ci = 0, co = 0, kw = 0, pad = 0, ow = 0;
  const float* x = nullptr;
  float* c = nullptr;
  // Depth of each of the four GEMMs: the tap groups' channels side by side.
  int64_t depth() const { return kw / 3 * ci; }
  // Output pairs per image (the last one is single when ow is odd).
  int64_t pairs() const { return (ow + 1) / 2; }
};

// A tile's scratch (its four V_u and two of the M_u) is at most this many floats
// (2 MiB), as many output pairs as fit, within [kWinogradMinTilePairs,
// kWinogradMaxTilePairs]. Each tile streams all four packed G_u past its rows, so
// the more pairs a tile has the fewer times the G_u are read from L3: on Sapphire
// Rapids (2 MiB L2) a kernel-9 256 -> 1024 conv at T 400-800 ran 1.15-1.3x slower in
// tiles of 36-72 pairs than in tiles of 100-200 (bench/CONV.md, "Winograd").
constexpr int64_t kWinogradTileFloats = 512 * 1024;
constexpr int64_t kWinogradMinTilePairs = 12;
constexpr int64_t kWinogradMaxTilePairs = 128;

// Output pairs per tile for GEMMs of `depth` over co output channels.
int64_t WinogradTilePairs(int64_t depth, int64_t co);

// How the threads share one conv: tiles of `pairs` output pairs of one image,
// over `cols` output channels each (all of them, or whole 64-column panels).
struct WinogradSplit {
  int64_t pairs = 1, cols = 1;
  int64_t row_tiles = 1, col_blocks = 1;  // per image
};

// Tiles of at most WinogradTilePairs pairs, as many per thread where one image
// has them (6-pair multiples: whole register tiles of the GEMM block); an image
// with fewer tiles than threads cuts its channels too (each block reads its part
// of the G_u), unless full_rows (an epilogue over whole rows) forbids it.
WinogradSplit ChooseWinogradSplit(int64_t batch, int64_t pairs, int64_t depth, int64_t co,
                                  int64_t threads, bool full_rows);

// Writes G_u (u in [0, 4)) of filter w: depth x co floats, row-major, rows
// j * ci .. j * ci + ci - 1 from tap group j; only the elements [e0, e1) of each
// group's ci x co matrix (parallel callers take disjoint ranges).
void WinogradFilter(const float* w, int64_t kw, int64_t ci, int64_t co, int u, int64_t e0,
                    int64_t e1, float* g);

// Floats of scratch one tile of `pairs` output pairs over `cols` output channels
// needs (64-byte aligned by the caller).
int64_t WinogradScratchFloats(const WinogradConv1D& conv, int64_t pairs, int64_t cols);

// This thread's scratch of at least `floats` floats, 64-byte aligned, kept for
// the thread's lifetime (as the GEMM block's packing buffer is); null if memory
// ran out.
float* WinogradScratch(int64_t floats);

// Output columns [2 p0, min(2 p1, ow)) and channels [j0, j1) of image n: V_u of
// the tile into scratch, the four GEMMs (packed[u]: G_u packed for `gemm`, j0 a
// multiple of its panel), the first and fourth written into C's rows, and the
// output transform adding M1 and M2 to them.
void WinogradTile(const WinogradConv1D& conv, const float* const packed[kWinogradParts],
                  disc_gemm_prepacked_block_fn gemm, int64_t n, int64_t p0, int64_t p1,
                  int64_t j0, int64_t j1, float* scratch);

}  // namespace disc_tf

#endif  // DISC_TF_CC_RAL_CONV_WINOGRAD_H_
