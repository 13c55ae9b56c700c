// gemm_kernel_impl.h -- the body of one ISA variant of the GEMM block.
//
// Included by exactly one translation unit per ISA, which first defines
// DISC_GEMM_ISA(name) to append its ISA to an exported name, and includes
// nothing else. All the rest is in an anonymous namespace, so nothing
// compiled here for the TU's ISA is shared with code built for the baseline ISA.
//
// One microkernel does every product: a tile of kRows x V vectors of C lives
// in registers while rows of B stream through it and op(A) is read one
// broadcast element at a time (A is never packed; a transposed A is read in
// place). B is read either as stored (few rows, no transpose) or from a
// block packed panel by panel into a per-thread buffer.
#ifndef DISC_TF_CC_RAL_GEMM_KERNEL_IMPL_H_
#define DISC_TF_CC_RAL_GEMM_KERNEL_IMPL_H_

#if !defined(DISC_GEMM_ISA)
#error "define DISC_GEMM_ISA(name) before including this file"
#endif

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>

#include "cc/ral/aligned_buffer.h"
#include "cc/ral/cache_size.h"
#include "cc/ral/column_steps.h"
#include "cc/ral/disc_ral.h"
#include "cc/ral/gemm_kernels.h"

namespace {

#if defined(__AVX512F__)
using Vec = __m512;
constexpr int kLanes = 16, kRows = 6, kVecs = 4;  // 24 accumulators of 32 registers
inline Vec Load(const float* p) { return _mm512_loadu_ps(p); }
inline void Store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec Splat(float x) { return _mm512_set1_ps(x); }
inline Vec Zero() { return _mm512_setzero_ps(); }
inline Vec MulAdd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec Add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec Sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec Mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
// a > b ? a : b and a < b ? a : b, b where either is NaN (the instructions' rule).
inline Vec Max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
inline Vec Min(Vec a, Vec b) { return _mm512_min_ps(a, b); }
// a where a is NaN, else b.
inline Vec NanOr(Vec a, Vec b) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), b, a);
}
#else
using Vec = __m256;
constexpr int kLanes = 8, kRows = 6, kVecs = 2;  // 12 accumulators of 16 registers
inline Vec Load(const float* p) { return _mm256_loadu_ps(p); }
inline void Store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec Splat(float x) { return _mm256_set1_ps(x); }
inline Vec Zero() { return _mm256_setzero_ps(); }
inline Vec MulAdd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec Add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Vec Sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
inline Vec Mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline Vec Max(Vec a, Vec b) { return _mm256_max_ps(a, b); }
inline Vec Min(Vec a, Vec b) { return _mm256_min_ps(a, b); }
inline Vec NanOr(Vec a, Vec b) { return _mm256_blendv_ps(b, a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q)); }
#endif
constexpr int64_t kPanel = kLanes * kVecs;  // columns of one full tile

// Times the tile's k loop is unrolled: 4 on both ISAs (interleaved rounds:
// bench/GEMM.md). AVX2: the 6 x 2-vector tile's step is 12 FMAs, 8 loads and the
// loop's own add and branch; unrolled 4 times the block runs 1-8% faster at two
// threads (5-8% at k = 1024-2304) and 0-7% at one, twice is slower (Zen 3).
// AVX-512: the 6 x 4-vector step is 24 FMAs and 10 loads; unrolled 4 times
// 1-8% faster at one and two threads (Sapphire Rapids; twice: about the same).
// A benchmark build may set it (bench/gemm_libs, DISC_VARIANT_FLAGS).
#if !defined(DISC_GEMM_K_UNROLL)
#define DISC_GEMM_K_UNROLL 4
#endif
#define DISC_GEMM_PRAGMA(text) _Pragma(#text)
#define DISC_GEMM_UNROLL(n) DISC_GEMM_PRAGMA(GCC unroll n)

inline int64_t RoundUp(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// op(A)[r, p]: A is [m x k] (row stride lda), or with TA its transpose is.
template <bool TA>
inline float AElem(const float* a, int64_t lda, int r, int64_t p) {
  return TA ? a[p * lda + r] : a[r * lda + p];
}

// ---- Column epilogues (disc_ral.h, ABI 11) run on a tile as it is stored.
//
// Each step gives the bits column_steps.h computes for one element (a maximum or
// minimum against a constant: FormOf below).

// Where a tile's results go: `out` for its first element (row stride ldo), `j` the
// column of C it starts at (which element of each step's column it reads), `at` the
// index of that element in C's layout and `ldm` a row's stride there (where each
// matrix step reads: e->cols, or a tile's own padded copy).
struct ColumnStore {
  const disc_column_epilogue* e = nullptr;
  float* out = nullptr;
  int64_t ldo = 0;
  int64_t j = 0;
  int64_t at = 0;
  int64_t ldm = 0;
  ColumnStore At(int64_t i, int64_t dj) const {
    return {e, out + i * ldo + dj, ldo, j + dj, at + i * ldm + dj, ldm};
  }
  // A block of `e`'s result from `out` (which lies in e->out) on, C's column j first.
  static ColumnStore Block(const disc_column_epilogue* e, float* out, int64_t j) {
    return {e, out, e->cols, j, out - e->out, e->cols};
  }
};

// A column epilogue whose column operands are copied for the w < kPanel columns of
// one panel, zeros after them, so that a tile of that panel loads whole vectors
// (its columns from 0: a ColumnStore over it has j = 0).
struct PaddedColumns {
  disc_column_epilogue e;
  alignas(64) float columns[DISC_COLUMN_STEPS][kPanel];
  void Fill(const disc_column_epilogue& from, int64_t j, int64_t w) {
    e = from;
    for (int s = 0; s < e.steps; ++s) {
      if (!DiscIsColumnStep(e.step[s].op)) continue;
      std::fill_n(std::copy_n(e.step[s].operand + j, w, columns[s]), kPanel - w, 0.0f);
      e.step[s].operand = columns[s];
    }
  }
};

// How a maximum or minimum against a constant c runs, as disc_max / disc_min
// (column_steps.h). With c first it is the instruction with c first. With x first:
// where c is not zero, x ties with c only where it has c's bits, so the instruction with
// c first gives the same (one instruction, where the NaN fix-up took three: ReLU6's
// bound 6); against +0 a tie (x = -0 or +0) takes +0, which adding +0 to the
// instruction's result gives while leaving every other value, NaN too, as it is (ReLU's
// and ReLU6's 0); against -0, the instruction with x first and x put back where NaN.
enum class ExtremumForm { kConstantFirst, kPlusZeroed, kNanFixed };
inline ExtremumForm FormOf(const disc_column_step& st) {
  if (!st.value_first || st.constant != 0.0f) return ExtremumForm::kConstantFirst;
  return std::signbit(st.constant) ? ExtremumForm::kNanFixed : ExtremumForm::kPlusZeroed;
}

// The steps on R x V vectors of C (columns j .. j + V * kLanes; element `at` of C's
// layout first, rows ldm apart there), step by step.
template <int R, int V>
inline void VectorColumns(const disc_column_epilogue& e, int64_t j, int64_t at, int64_t ldm,
                          Vec (&x)[R][V]) {
  for (int s = 0; s < e.steps; ++s) {
    const disc_column_step& st = e.step[s];
    if (DiscIsMatrixStep(st.op)) {
      const float* m = st.operand + at;
      for (int r = 0; r < R; ++r)
        for (int v = 0; v < V; ++v) {
          const Vec y = Load(m + r * ldm + v * kLanes);
          x[r][v] = st.op == DISC_MATRIX_ADD ? Add(x[r][v], y) : Mul(x[r][v], y);
        }
      continue;
    }
    Vec y[V];
    for (int v = 0; v < V; ++v) {
      y[v] = DiscIsColumnStep(st.op) ? Load(st.operand + j + v * kLanes) : Splat(st.constant);
    }
    switch (st.op) {
      case DISC_COLUMN_MUL:
      case DISC_CONSTANT_MUL:
        for (int r = 0; r < R; ++r)
          for (int v = 0; v < V; ++v) x[r][v] = Mul(x[r][v], y[v]);
        break;
      case DISC_COLUMN_ADD:
      case DISC_CONSTANT_ADD:
        for (int r = 0; r < R; ++r)
          for (int v = 0; v < V; ++v) x[r][v] = Add(x[r][v], y[v]);
        break;
      case DISC_COLUMN_SUB:
        for (int r = 0; r < R; ++r)
          for (int v = 0; v < V; ++v) x[r][v] = Sub(x[r][v], y[v]);
        break;
      case DISC_CONSTANT_MAX:
      case DISC_CONSTANT_MIN: {
        const bool is_max = st.op == DISC_CONSTANT_MAX;
        const ExtremumForm form = FormOf(st);
        for (int r = 0; r < R; ++r)
          for (int v = 0; v < V; ++v) {
            const Vec c_first = is_max ? Max(y[v], x[r][v]) : Min(y[v], x[r][v]);
            if (form == ExtremumForm::kConstantFirst) {
              x[r][v] = c_first;
            } else if (form == ExtremumForm::kPlusZeroed) {
              x[r][v] = Add(c_first, Zero());
            } else {
              x[r][v] = NanOr(x[r][v], is_max ? Max(x[r][v], y[v]) : Min(x[r][v], y[v]));
            }
          }
        break;
      }
      default:
        break;
    }
  }
}

// Independent accumulator chains a tile needs to keep the FMA units busy (two
// FMA pipes of latency 4). A tile of fewer than this many vectors of C splits k
// into kSplits(R, V) interleaved partial sums, added at the end: a one-row tile
// (m = 1, a GEMV) otherwise waits on its own FMA latency, at half the speed
// or less on AVX2's two accumulators.
constexpr int kChains = 8;
constexpr int kSplits(int r, int v) {
  return r * v >= kChains ? 1 : (kChains / (r * v) > 4 ? 4 : kChains / (r * v));
}

// Software prefetches of packed B a full tile may issue in its k loop (flags).
// The hardware prefetchers stop at each 4 KiB page; a block of packed B read from
// memory by its first tile of rows alone is read faster than it arrives (about
// 15% of the block's time with 24 blocks of B in turn; bench/GEMM.md, "Prefetching
// packed B").
// kFetchAhead: the tile's own B, kFetchRows rows ahead, to L1 (the first tile of rows
//   to read a block, which reads it from memory).
// kFetchNext: lines of the block the product reads next, to L2, one line every
//   2^shift steps of k, so that every tile of the current block brings a share.
// A benchmark build may turn both off (bench/gemm_libs, DISC_VARIANT_FLAGS).
#if !defined(DISC_GEMM_PREFETCH)
#define DISC_GEMM_PREFETCH 1
#endif
constexpr int kFetchAhead = 1, kFetchNext = 2;
constexpr int64_t kFetchRows = 64;
constexpr int64_t kLineFloats = 64 / sizeof(float);

// C[0:R, 0:V*kLanes] (+)= op(A)[0:R, 0:k] * B[0:k, 0:V*kLanes]; rows of B are
// ldb floats apart. F: the prefetches above; `next` and `shift` serve kFetchNext.
template <int R, int V, bool TA, int F = 0>
inline void Tile(int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                 float* c, int64_t ldc, bool accumulate, const float* next = nullptr,
                 int shift = 0, const ColumnStore* store = nullptr) {
  const int64_t next_mask = (int64_t{1} << shift) - 1;
  constexpr int U = kSplits(R, V);
  Vec acc[U][R][V];
  for (int u = 0; u < U; ++u)
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < V; ++v)
        acc[u][r][v] = u == 0 && accumulate ? Load(c + r * ldc + v * kLanes) : Zero();
  int64_t p = 0;
  DISC_GEMM_UNROLL(DISC_GEMM_K_UNROLL)
  for (; p + U <= k; p += U) {
    for (int u = 0; u < U; ++u) {
      const float* row = b + (p + u) * ldb;
      if ((F & kFetchAhead) && p + u + kFetchRows < k)
        for (int l = 0; l < V * kLanes / kLineFloats; ++l)
          _mm_prefetch(reinterpret_cast<const char*>(row + kFetchRows * ldb + l * kLineFloats),
                       _MM_HINT_T0);
      if ((F & kFetchNext) && ((p + u) & next_mask) == 0)
        _mm_prefetch(reinterpret_cast<const char*>(next + ((p + u) >> shift) * kLineFloats),
                     _MM_HINT_T1);
      Vec bv[V];
      for (int v = 0; v < V; ++v) bv[v] = Load(row + v * kLanes);
      for (int r = 0; r < R; ++r) {
        const Vec av = Splat(AElem<TA>(a, lda, r, p + u));
        for (int v = 0; v < V; ++v) acc[u][r][v] = MulAdd(av, bv[v], acc[u][r][v]);
      }
    }
  }
  for (; p < k; ++p) {  // the last k % U rows of B
    const float* row = b + p * ldb;
    Vec bv[V];
    for (int v = 0; v < V; ++v) bv[v] = Load(row + v * kLanes);
    for (int r = 0; r < R; ++r) {
      const Vec av = Splat(AElem<TA>(a, lda, r, p));
      for (int v = 0; v < V; ++v) acc[0][r][v] = MulAdd(av, bv[v], acc[0][r][v]);
    }
  }
  for (int u = 1; u < U; ++u)
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < V; ++v) acc[0][r][v] = Add(acc[0][r][v], acc[u][r][v]);
  if (store != nullptr) {  // the epilogue on registers, stored where its result goes
    VectorColumns<R, V>(*store->e, store->j, store->at, store->ldm, acc[0]);
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < V; ++v) Store(store->out + r * store->ldo + v * kLanes, acc[0][r][v]);
    return;
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) Store(c + r * ldc + v * kLanes, acc[0][r][v]);
}

// As Tile, but only the first w < V*kLanes columns of C exist: the tile is
// computed in a local buffer and its first w columns copied (or added) to C.
// With `store` (its epilogue padded to the tile's width: PaddedColumns), the steps run
// on the buffer's vectors (after C's partial sums are added, as above) and its first w
// columns go to the store's out.
template <int R, int V, bool TA>
inline void EdgeTile(int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                     float* c, int64_t ldc, bool accumulate, int64_t w,
                     const ColumnStore* store = nullptr) {
  constexpr int kWidth = V * kLanes;
  alignas(64) float tile[R * kWidth];
  Tile<R, V, TA>(k, a, lda, b, ldb, tile, kWidth, false);
  if (store != nullptr) {
    Vec x[R][V];
    for (int r = 0; r < R; ++r) {
      float* row = tile + r * kWidth;
      if (accumulate)
        for (int64_t j = 0; j < w; ++j) row[j] = c[r * ldc + j] + row[j];
      for (int v = 0; v < V; ++v) x[r][v] = Load(row + v * kLanes);
    }
    // Matrix steps read the tile's w columns from a zero-padded copy of their rows.
    disc_column_epilogue e = *store->e;
    alignas(64) float rows[DISC_MATRIX_STEPS][R * kWidth];
    for (int s = 0, copies = 0; s < e.steps; ++s) {
      if (!DiscIsMatrixStep(e.step[s].op)) continue;
      float* copy = rows[copies++];
      for (int r = 0; r < R; ++r)
        std::fill_n(std::copy_n(e.step[s].operand + store->at + r * store->ldm, w,
                                copy + r * kWidth), kWidth - w, 0.0f);
      e.step[s].operand = copy;
    }
    VectorColumns<R, V>(e, store->j, 0, kWidth, x);
    for (int r = 0; r < R; ++r) {
      for (int v = 0; v < V; ++v) Store(tile + r * kWidth + v * kLanes, x[r][v]);
      std::copy_n(tile + r * kWidth, w, store->out + r * store->ldo);
    }
    return;
  }
  for (int r = 0; r < R; ++r) {
    float* out = c + r * ldc;
    const float* in = tile + r * kWidth;
    for (int64_t j = 0; j < w; ++j) out[j] = accumulate ? out[j] + in[j] : in[j];
  }
}

template <int R, int V, bool TA>
inline void AnyTile(int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                    float* c, int64_t ldc, bool accumulate, int64_t w,
                    const ColumnStore* store = nullptr) {
  if (w == V * kLanes) {
    Tile<R, V, TA>(k, a, lda, b, ldb, c, ldc, accumulate, nullptr, 0, store);
  } else {
    EdgeTile<R, V, TA>(k, a, lda, b, ldb, c, ldc, accumulate, w, store);
  }
}

// Rows [0, m) of one panel of C, w <= V*kLanes columns wide: kRows rows at a
// time, then the remainder.
template <int V, bool TA>
void Panel(int64_t m, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
           float* c, int64_t ldc, bool accumulate, int64_t w,
           const ColumnStore* store = nullptr) {
  const int64_t row_step = TA ? 1 : lda;  // op(A) row i starts at a + i * row_step
  int64_t i = 0;
  // A panel narrower than its tiles reads its columns' operands from a padded copy.
  PaddedColumns padded;
  ColumnStore edge;
  if (store != nullptr && w < V * kLanes) {
    padded.Fill(*store->e, store->j, w);
    edge = ColumnStore{&padded.e, store->out, store->ldo, 0, store->at, store->ldm};
    store = &edge;
  }
  ColumnStore at;
  // The tile's own store, at row i of this panel.
  auto tile_store = [&](int64_t row) -> const ColumnStore* {
    if (store == nullptr) return nullptr;
    at = store->At(row, 0);
    return &at;
  };
  for (; i + kRows <= m; i += kRows)
    AnyTile<kRows, V, TA>(k, a + i * row_step, lda, b, ldb, c + i * ldc, ldc, accumulate, w,
                          tile_store(i));
  const float* ai = a + i * row_step;
  float* ci = c + i * ldc;
  const ColumnStore* si = tile_store(i);
  switch (m - i) {
    case 1: AnyTile<1, V, TA>(k, ai, lda, b, ldb, ci, ldc, accumulate, w, si); break;
    case 2: AnyTile<2, V, TA>(k, ai, lda, b, ldb, ci, ldc, accumulate, w, si); break;
    case 3: AnyTile<3, V, TA>(k, ai, lda, b, ldb, ci, ldc, accumulate, w, si); break;
    case 4: AnyTile<4, V, TA>(k, ai, lda, b, ldb, ci, ldc, accumulate, w, si); break;
    case 5: AnyTile<5, V, TA>(k, ai, lda, b, ldb, ci, ldc, accumulate, w, si); break;
    default: break;
  }
  static_assert(kRows == 6, "the remainder cases above cover 1 .. kRows - 1 rows");
}

// Panel for a width w <= kPanel known only at run time (V = w / kLanes, rounded up).
template <bool TA>
void PanelOfWidth(int64_t m, int64_t k, const float* a, int64_t lda, const float* b,
                  int64_t ldb, float* c, int64_t ldc, bool accumulate, int64_t w,
                  const ColumnStore* store = nullptr) {
  switch ((w + kLanes - 1) / kLanes) {
    case 1: Panel<1, TA>(m, k, a, lda, b, ldb, c, ldc, accumulate, w, store); break;
    case 2: Panel<2, TA>(m, k, a, lda, b, ldb, c, ldc, accumulate, w, store); break;
#if defined(__AVX512F__)
    case 3: Panel<3, TA>(m, k, a, lda, b, ldb, c, ldc, accumulate, w, store); break;
    case 4: Panel<4, TA>(m, k, a, lda, b, ldb, c, ldc, accumulate, w, store); break;
#endif
    default: break;
  }
  static_assert(kVecs == 2 || kVecs == 4, "the cases above cover 1 .. kVecs vectors");
}

// PanelOfWidth with op(A)'s transpose known only at run time.
void PanelOfWidth(bool ta, int64_t m, int64_t k, const float* a, int64_t lda, const float* b,
                  int64_t ldb, float* c, int64_t ldc, bool accumulate, int64_t w) {
  if (ta) {
    PanelOfWidth<true>(m, k, a, lda, b, ldb, c, ldc, accumulate, w);
  } else {
    PanelOfWidth<false>(m, k, a, lda, b, ldb, c, ldc, accumulate, w);
  }
}

// ---- Few rows: B streamed as stored, no packing.
//
// Packing B costs about as much as the product when the block has few rows
// (m = 16, k = n = 768: the copy reads and writes 2.3 MB for 19 MFLOP). With
// few rows, each tile of C stays in registers while k rows of B stream
// through: B is read once from memory per column panel and from cache for
// each further tile of rows.

// Blocks with at most this many rows take the streamed path (measured: see
// docs/architecture.md, "GEMM").
constexpr int64_t kStreamedMaxRows = 96;

// Rows of B per pass over a panel: kDepth x kPanel floats (64 KiB with AVX-512)
// stay in L2 while every tile of rows reads them.
constexpr int64_t kDepth = 256;

// The whole panels of C = A * B (no transposes); returns the columns done.
int64_t StreamedGemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                     const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  const int64_t done = n / kPanel * kPanel;
  for (int64_t j = 0; j < done; j += kPanel) {
    for (int64_t p = 0; p < k; p += kDepth) {
      Panel<kVecs, false>(m, std::min(kDepth, k - p), a + p, lda, b + p * ldb + j, ldb,
                          c + j, ldc, accumulate || p > 0, kPanel);
    }
  }
  return done;
}

// ---- B packed: blocks of op(B) copied panel by panel into a per-thread buffer.
//
// A packed block holds kc rows of nc columns of op(B) as consecutive panels;
// panel q holds columns [q*kPanel, q*kPanel + w) (w = kPanel but for the last,
// rounded up to whole vectors and zero padded) as kc rows of its padded width.
// The microkernel then reads B contiguously from L2 and a transposed B costs
// nothing extra (the transpose happens in the copy). Measured single-thread
// on this project's AVX-512 machine: 250-270 GF/s against 180-250 for Eigen's
// packed GEMM on the bench's shapes (docs/architecture.md, "GEMM").

// Rows and columns of op(B) per packed block: at most 2 MiB of floats.
constexpr int64_t kPackDepth = 1024;
constexpr int64_t kPackCols = 8 * kPanel;

// A 64-byte aligned buffer of at least `floats` floats owned by this thread
// (kept for the thread's lifetime: at most one packed block), or null if
// memory ran out.
float* ThreadBuffer(int64_t floats) {
  thread_local disc_tf::AlignedBuffer buffer;
  return buffer.Reserve(floats);
}

// dst[c * ldd + r] = src[r * lds + c] for r, c in [0, 8): an 8 x 8 transpose
// in eight AVX registers (both ISA variants have AVX).
inline void Transpose8x8(const float* src, int64_t lds, float* dst, int64_t ldd) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
  for (int i = 0; i < 8; i += 2) {  // interleave row pairs: (0 1) (2 3) ...
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {  // pairs of pairs: 4 rows per 128-bit lane
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {  // low lanes of rows 0-3 with those of 4-7, then high
    _mm256_storeu_ps(dst + i * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}

// Packs op(B)[0:kc, 0:nc] (B as stored: [k x n], or [n x k] with tb) to `out`.
void PackBlock(int64_t kc, int64_t nc, const float* b, int64_t ldb, bool tb, float* out) {
  for (int64_t j0 = 0; j0 < nc; j0 += kPanel) {
    const int64_t w = std::min(kPanel, nc - j0);
    const int64_t width = RoundUp(w, kLanes);
    if (tb) {
      // Column j of op(B) is row j of B: read rows, write columns of the panel,
      // 8 x 8 blocks at a time, the rest one element at a time.
      const float* rows = b + j0 * ldb;
      const int64_t w8 = w / 8 * 8, k8 = kc / 8 * 8;
      for (int64_t j = 0; j < w8; j += 8)
        for (int64_t p = 0; p < k8; p += 8)
          Transpose8x8(rows + j * ldb + p, ldb, out + p * width + j, width);
      for (int64_t j = 0; j < w; ++j) {
        const float* src = rows + j * ldb;
        for (int64_t p = j < w8 ? k8 : 0; p < kc; ++p) out[p * width + j] = src[p];
      }
      for (int64_t p = 0; p < kc; ++p)
        for (int64_t j = w; j < width; ++j) out[p * width + j] = 0.0f;
    } else {
      for (int64_t p = 0; p < kc; ++p) {
        const float* src = b + p * ldb + j0;
        float* dst = out + p * width;
        for (int64_t j = 0; j < w; ++j) dst[j] = src[j];
        for (int64_t j = w; j < width; ++j) dst[j] = 0.0f;
      }
    }
    out += kc * width;
  }
}

// C = op(A) op(B) without a packing buffer (only if memory ran out).
void ReferenceGemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, bool ta,
                   const float* b, int64_t ldb, bool tb, float* c, int64_t ldc,
                   bool accumulate) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int64_t p = 0; p < k; ++p)
        acc += (ta ? a[p * lda + i] : a[i * lda + p]) * (tb ? b[j * ldb + p] : b[p * ldb + j]);
      c[i * ldc + j] = accumulate ? c[i * ldc + j] + acc : acc;
    }
  }
}

void PackedGemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, bool ta,
                const float* b, int64_t ldb, bool tb, float* c, int64_t ldc,
                bool accumulate) {
  float* packed = ThreadBuffer(std::min(k, kPackDepth) * RoundUp(std::min(n, kPackCols), kLanes));
  if (packed == nullptr) {
    ReferenceGemm(m, n, k, a, lda, ta, b, ldb, tb, c, ldc, accumulate);
    return;
  }
  for (int64_t j0 = 0; j0 < n; j0 += kPackCols) {
    const int64_t nc = std::min(kPackCols, n - j0);
    for (int64_t p0 = 0; p0 < k; p0 += kPackDepth) {
      const int64_t kc = std::min(kPackDepth, k - p0);
      PackBlock(kc, nc, tb ? b + j0 * ldb + p0 : b + p0 * ldb + j0, ldb, tb, packed);
      const float* a0 = ta ? a + p0 * lda : a + p0;
      const bool acc = accumulate || p0 > 0;
      const float* panel = packed;
      for (int64_t q = 0; q < nc; q += kPanel) {
        const int64_t w = std::min(kPanel, nc - q);
        const int64_t width = RoundUp(w, kLanes);
        PanelOfWidth(ta, m, kc, a0, lda, panel, width, c + j0 + q, ldc, acc, w);
        panel += kc * width;
      }
    }
  }
}

// True if C = op(A) op(B) needs no product: nothing to write (m or n is 0),
// or k == 0, where C is zeroed (or, accumulating, left as it is).
bool Empty(int64_t m, int64_t n, int64_t k, float* c, int64_t ldc, bool accumulate) {
  if (m <= 0 || n <= 0) return true;
  if (k > 0) return false;
  if (!accumulate)
    for (int64_t i = 0; i < m; ++i) std::fill_n(c + i * ldc, n, 0.0f);
  return true;
}

// A full tile (kRows x kPanel) of a prepacked product with the prefetches `flags`.
template <bool TA>
void FetchingTile(int flags, int64_t k, const float* a, int64_t lda, const float* b,
                  int64_t ldb, float* c, int64_t ldc, bool accumulate, const float* next,
                  int shift, const ColumnStore* store = nullptr) {
  switch (DISC_GEMM_PREFETCH ? flags : 0) {
    case kFetchAhead:
      Tile<kRows, kVecs, TA, kFetchAhead>(k, a, lda, b, ldb, c, ldc, accumulate, nullptr, 0,
                                          store);
      break;
    case kFetchNext:
      Tile<kRows, kVecs, TA, kFetchNext>(k, a, lda, b, ldb, c, ldc, accumulate, next, shift,
                                         store);
      break;
    case kFetchAhead | kFetchNext:
      Tile<kRows, kVecs, TA, kFetchAhead | kFetchNext>(k, a, lda, b, ldb, c, ldc, accumulate,
                                                       next, shift, store);
      break;
    default:
      Tile<kRows, kVecs, TA>(k, a, lda, b, ldb, c, ldc, accumulate, nullptr, 0, store);
  }
}

// How the full tiles reading one stretch of packed B (`tiles` of them, each kc steps
// of k) share the prefetch of the `lines` cache lines of the stretch read next: tile
// t fetches from line t * per_tile on, one line every 2^shift steps of its k loop,
// so per_tile to twice as many lines (a tile reads up to per_tile lines past its
// share). A tile whose share starts past the stretch fetches nothing (Fetches). With
// fewer steps than lines per tile (AVX-512 panels under 4 tiles of rows), the tiles
// fetch one line a step: part of the stretch.
struct NextFetch {
  int64_t lines = 0;
  int64_t per_tile = 0;
  int shift = 0;
  bool Fetches(int64_t tile) const { return per_tile > 0 && tile * per_tile < lines; }
};
NextFetch PlanNextFetch(int64_t lines, int64_t tiles, int64_t kc) {
  NextFetch plan;
  if (lines <= 0 || tiles <= 0) return plan;
  plan.lines = lines;
  plan.per_tile = (lines + tiles - 1) / tiles;
  while (plan.shift < 16 && (kc >> (plan.shift + 1)) >= plan.per_tile) ++plan.shift;
  return plan;
}

// Packed floats of op(B) rows [p0, p0 + kc) of the panel at column q (the panels
// before q are full): where they start.
inline const float* PanelRows(const float* packed, int64_t n, int64_t k, int64_t q,
                              int64_t p0) {
  return packed + q * k + p0 * RoundUp(std::min(kPanel, n - q), kLanes);
}

// C = op(A) * pre-packed op(B), panel by panel: each panel's rows of B stay in L2
// while every 6-row tile of A streams past them.
// Each panel's first tile of rows prefetches its rows of B ahead of it, and every
// full tile a share of the stretch of B read next (the next depth, else the next panel).
// With `store`, the last pass over k runs its column epilogue as each tile is stored.
template <bool TA>
void PrepackedPanels(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                     const float* packed, float* c, int64_t ldc, bool accumulate, bool fetch,
                     const ColumnStore* store) {
  const int64_t tiles = m / kRows;
  ColumnStore at;
  for (int64_t q = 0; q < n; q += kPanel) {
    const int64_t w = std::min(kPanel, n - q);
    const int64_t width = RoundUp(w, kLanes);
    for (int64_t p0 = 0; p0 < k; p0 += kPackDepth) {
      const int64_t kc = std::min(kPackDepth, k - p0);
      const float* a0 = TA ? a + p0 * lda : a + p0;
      const float* b0 = PanelRows(packed, n, k, q, p0);
      const bool acc = accumulate || p0 > 0;
      const bool last = store != nullptr && p0 + kc == k;
      // Rows from i on of this panel: where they go.
      auto rows_store = [&](int64_t i) -> const ColumnStore* {
        if (!last) return nullptr;
        at = store->At(i, q);
        return &at;
      };
      if (w < kPanel || tiles == 0 || !fetch) {
        PanelOfWidth<TA>(m, kc, a0, lda, b0, width, c + q, ldc, acc, w, rows_store(0));
        continue;
      }
      const int64_t nq = p0 + kc < k ? q : q + kPanel, np0 = p0 + kc < k ? p0 + kc : 0;
      const float* next = nq < n ? PanelRows(packed, n, k, nq, np0) : nullptr;
      const int64_t next_lines =
          next ? std::min(kPackDepth, k - np0) * RoundUp(std::min(kPanel, n - nq), kLanes) /
                     kLineFloats
               : 0;
      const NextFetch plan = PlanNextFetch(next_lines, tiles, kc);
      const int64_t row_step = TA ? 1 : lda;
      for (int64_t t = 0; t < tiles; ++t) {
        const bool fetch_next = next != nullptr && plan.Fetches(t);
        const int flags = (t == 0 ? kFetchAhead : 0) | (fetch_next ? kFetchNext : 0);
        const float* tile_next = fetch_next ? next + t * plan.per_tile * kLineFloats : nullptr;
        FetchingTile<TA>(flags, kc, a0 + t * kRows * row_step, lda, b0, width,
                         c + t * kRows * ldc + q, ldc, acc, tile_next, plan.shift,
                         rows_store(t * kRows));
      }
      const int64_t done = tiles * kRows;
      PanelOfWidth<TA>(m - done, kc, a0 + done * row_step, lda, b0, width, c + done * ldc + q,
                       ldc, acc, w, rows_store(done));
    }
  }
}

// Packed floats of B per block of columns in PrepackedStrips: a quarter of the core's
// L2 (L2CacheBytes, cache_size.h), within 32 K-256 K floats. Measured
// with the AVX2 block: 32 K floats on Zen 3 (512 KiB of L2); on Sapphire Rapids (2 MiB)
// 128 K floats, 1.06-1.08x at two threads where k or n is 2304-3072 against 32 K, ties
// at BERT-small's shapes (bench/GEMM.md, "AVX2 block on Sapphire Rapids").
// A block has at most kStripMaxColumns columns: 8 panels of the AVX2 block, what 32 K
// floats hold at k = 256 (the whole L2's quarter there was 0.98x).
// A benchmark build may fix it (bench/gemm_libs, DISC_VARIANT_FLAGS).
constexpr int64_t kStripMaxColumns = 128;
int64_t StripBlockFloats() {
#if defined(DISC_GEMM_STRIP_BLOCK_FLOATS)
  return DISC_GEMM_STRIP_BLOCK_FLOATS;
#else
  static const int64_t floats = std::clamp<int64_t>(
      disc_tf::L2CacheBytes() / 4 / static_cast<int64_t>(sizeof(float)), 32 * 1024, 256 * 1024);
  return floats;
#endif
}

// C = op(A) * pre-packed op(B), strip by strip: for each block of columns whose
// packed panels fit in StripBlockFloats() (in L2), each 6-row strip of A is read
// once for all of the block's panels (from L1), where PrepackedPanels reads all
// of A once per panel. The same tiles, each summed over k in the same order.
// With `store`, as PrepackedPanels.
template <bool TA>
void PrepackedStrips(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                     const float* packed, float* c, int64_t ldc, bool accumulate, bool fetch,
                     const ColumnStore* store) {
  ColumnStore at;
  for (int64_t p0 = 0; p0 < k; p0 += kPackDepth) {
    const int64_t kc = std::min(kPackDepth, k - p0);
    const bool acc = accumulate || p0 > 0;
    const bool last_depth = store != nullptr && p0 + kc == k;
    const int64_t block =
        std::clamp(StripBlockFloats() / kc / kPanel * kPanel, kPanel, kStripMaxColumns);
    // The block read next: the next columns at this depth, else the first at the next.
    const int64_t np0 = p0 + kc;
    const int64_t next_kc = std::min(kPackDepth, k - np0);
    for (int64_t j0 = 0; j0 < n; j0 += block) {
      const int64_t j1 = std::min(n, j0 + block);
      const bool last = j1 == n;
      const int64_t nj0 = last ? 0 : j1, nk = last ? np0 : p0, nkc = last ? next_kc : kc;
      const bool has_next = fetch && nk < k;
      // Panel j0 + x of this block prefetches panel nj0 + x of the next (kc rows of
      // kPanel floats: kc * kPanel / kLineFloats lines), a share per full strip.
      const NextFetch plan = PlanNextFetch(has_next ? nkc * kPanel / kLineFloats : 0,
                                           m / kRows, kc);
      for (int64_t i = 0; i < m; i += kRows) {
        const int64_t rows = std::min<int64_t>(kRows, m - i);
        const float* strip = TA ? a + p0 * lda + i : a + i * lda + p0;
        for (int64_t q = j0; q < j1; q += kPanel) {
          const int64_t w = std::min(kPanel, n - q);
          const int64_t width = RoundUp(w, kLanes);
          const float* b0 = PanelRows(packed, n, k, q, p0);
          float* cq = c + i * ldc + q;
          const ColumnStore* sq = nullptr;
          if (last_depth) {
            at = store->At(i, q);
            sq = &at;
          }
          if (rows == kRows && w == kPanel) {
            const int64_t nq = nj0 + (q - j0);
            const bool fetch_next = has_next && nq < n && plan.Fetches(i / kRows);
            const int flags =
                (fetch && i == 0 ? kFetchAhead : 0) | (fetch_next ? kFetchNext : 0);
            const float* next =
                fetch_next
                    ? PanelRows(packed, n, k, nq, nk) + i / kRows * plan.per_tile * kLineFloats
                    : nullptr;
            FetchingTile<TA>(flags, kc, strip, lda, b0, width, cq, ldc, acc, next, plan.shift,
                             sq);
          } else {
            PanelOfWidth<TA>(rows, kc, strip, lda, b0, width, cq, ldc, acc, w, sq);
          }
        }
      }
    }
  }
}

// Which loop order a prepacked product takes. AVX2 (Zen 3, prepacked B, the RAL's
// split, interleaved rounds): strips are 4-12% faster where k is 64-256 and A has
// 1024-2048 rows (the recommender's MLP), ties elsewhere (0.97-1.03 on BERT's and the
// Conv1D stack's shapes); bench/GEMM.md, "AVX2 block". AVX-512 (Sapphire Rapids): strips
// tie with panels (0.97-1.06), so panels, as before; bench/GEMM.md, "AVX-512 block".
// A benchmark build may set it (bench/gemm_libs, DISC_VARIANT_FLAGS).
#if !defined(DISC_GEMM_STRIPS)
#if defined(__AVX512F__)
#define DISC_GEMM_STRIPS 0
#else
#define DISC_GEMM_STRIPS 1
#endif
#endif

// fetch: prefetch packed B (kFetchAhead, kFetchNext); off where B stays in L2.
void PrepackedGemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, bool ta,
                   const float* packed, float* c, int64_t ldc, bool accumulate, bool fetch,
                   const ColumnStore* store = nullptr) {
  if (DISC_GEMM_STRIPS == 0 && ta) {
    PrepackedPanels<true>(m, n, k, a, lda, packed, c, ldc, accumulate, fetch, store);
  } else if (DISC_GEMM_STRIPS == 0) {
    PrepackedPanels<false>(m, n, k, a, lda, packed, c, ldc, accumulate, fetch, store);
  } else if (ta) {
    PrepackedStrips<true>(m, n, k, a, lda, packed, c, ldc, accumulate, fetch, store);
  } else {
    PrepackedStrips<false>(m, n, k, a, lda, packed, c, ldc, accumulate, fetch, store);
  }
}

// The column epilogue over rows [0, m) and columns [0, n) of a block of C (at c, row
// stride ldc; column j of C first), vector by vector, then element by element.
void ColumnPass(int64_t m, int64_t n, const float* c, int64_t ldc, const ColumnStore& store) {
  const disc_column_epilogue& e = *store.e;
  for (int64_t i = 0; i < m; ++i) {
    const float* row = c + i * ldc;
    float* out = store.out + i * store.ldo;
    int64_t j = 0;
    const int64_t at = store.at + i * store.ldm;
    for (; j + kLanes <= n; j += kLanes) {
      Vec x[1][1] = {{Load(row + j)}};
      VectorColumns<1, 1>(e, store.j + j, at + j, store.ldm, x);
      Store(out + j, x[0][0]);
    }
    for (; j < n; ++j) out[j] = DiscColumnSteps(e, row[j], store.j + j, at + j);
  }
}

}  // namespace

extern "C" void DISC_GEMM_ISA(disc_gemm_block)(int64_t m, int64_t n, int64_t k,
                                               const float* a, int64_t lda, int ta,
                                               const float* b, int64_t ldb, int tb,
                                               float* c, int64_t ldc, int accumulate) {
  if (Empty(m, n, k, c, ldc, accumulate != 0)) return;
  if (!ta && !tb && m <= kStreamedMaxRows && n >= kPanel) {
    const int64_t done = StreamedGemm(m, n, k, a, lda, b, ldb, c, ldc, accumulate != 0);
    if (done == n) return;
    b += done;  // the last, partial panel packed
    c += done;
    n -= done;
  }
  PackedGemm(m, n, k, a, lda, ta != 0, b, ldb, tb != 0, c, ldc, accumulate != 0);
}

extern "C" int64_t DISC_GEMM_ISA(disc_gemm_panel)(void) { return kPanel; }

extern "C" int64_t DISC_GEMM_ISA(disc_gemm_packed_size)(int64_t k, int64_t n) {
  return k * RoundUp(n, kLanes);
}

extern "C" void DISC_GEMM_ISA(disc_gemm_pack_b)(int64_t k, int64_t n, const float* b,
                                                int64_t ldb, int tb, float* out) {
  PackBlock(k, n, b, ldb, tb != 0, out);
}

extern "C" void DISC_GEMM_ISA(disc_gemm_prepacked_block)(int64_t m, int64_t n, int64_t k,
                                                         const float* a, int64_t lda,
                                                         int ta, const float* packed_b,
                                                         float* c, int64_t ldc,
                                                         int accumulate) {
  if (Empty(m, n, k, c, ldc, accumulate != 0)) return;
  PrepackedGemm(m, n, k, a, lda, ta != 0, packed_b, c, ldc, accumulate != 0, true);
}

extern "C" void DISC_GEMM_ISA(disc_gemm_prepacked_block_columns)(
    int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, int ta,
    const float* packed_b, float* c, int64_t ldc, const disc_column_epilogue* e, float* out,
    int64_t j, int fetch) {
  const ColumnStore store = ColumnStore::Block(e, out, j);
  if (k == 0) {  // C = 0, then the steps
    for (int64_t i = 0; i < m; ++i)
      for (int64_t x = 0; x < n; ++x)
        out[i * e->cols + x] = DiscColumnSteps(*e, 0.0f, j + x, store.at + i * e->cols + x);
    return;
  }
  if (m <= 0 || n <= 0) return;
  PrepackedGemm(m, n, k, a, lda, ta != 0, packed_b, c, ldc, false, fetch != 0, &store);
}

extern "C" void DISC_GEMM_ISA(disc_gemm_column_pass)(int64_t m, int64_t n, const float* c,
                                                     int64_t ldc,
                                                     const disc_column_epilogue* e,
                                                     float* out, int64_t j) {
  ColumnPass(m, n, c, ldc, ColumnStore::Block(e, out, j));
}

extern "C" void DISC_GEMM_ISA(disc_gemm_prepacked_block_resident)(
    int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, int ta,
    const float* packed_b, float* c, int64_t ldc, int accumulate) {
  if (Empty(m, n, k, c, ldc, accumulate != 0)) return;
  PrepackedGemm(m, n, k, a, lda, ta != 0, packed_b, c, ldc, accumulate != 0, false);
}

#endif  // DISC_TF_CC_RAL_GEMM_KERNEL_IMPL_H_
