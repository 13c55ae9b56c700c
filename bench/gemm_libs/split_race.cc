// split_race.cc -- ways of cutting one prepacked GEMM for two threads, raced in
// one process: the RAL's AVX2 (or AVX-512) block, its task pool
// (cc/ral/spin_pool.h) and RunTasks, a bias + ReLU epilogue on each block right
// after it, as the RAL runs it.
//
//   split_race M K N [ROUNDS [avx2|avx512]]   # built by build.sh next to gemm_libs
//
// Candidates: `columns` (ChoosePrepackedSplit's columns-first split), `full_rows`
// (its rows-only split, as for a row-wise epilogue), `ral` (the split the RAL
// takes on this ISA: gemm_split.h, PrepackedRowsFor), `blocks48`, `thread_rows_small_b`
// and `tall` (each rule of gemm_split.h, whichever the ISA takes), `rowsR` for each R of
// $SPLIT_RACE_ROWS (default 48,96,192: blocks of about R rows where packed B is
// within kRowBlockMaxPackedFloats, else as `columns`), `rows48_any` (48-row blocks
// whatever B's size: what that bound was measured with), `halves` (one block of whole
// rows per thread), `column_halves` (one block of all rows per thread) and `colsW` for each W
// of $SPLIT_RACE_COLS (default 64,128: blocks of all rows and W columns). Each round
// times every candidate (best of 5 calls), in an order rotated by one each round; prints
// per candidate the median time and the median [range] of columns / candidate
// over the rounds (> 1: faster).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cc/ral/gemm_split.h"
#include "cc/ral/run_tasks.h"
#include "cc/ral/spin_pool.h"

extern "C" {
int64_t disc_gemm_packed_size_avx2(int64_t k, int64_t n);
void disc_gemm_pack_b_avx2(int64_t k, int64_t n, const float* b, int64_t ldb, int tb, float* out);
void disc_gemm_prepacked_block_avx2(int64_t m, int64_t n, int64_t k, const float* a,
                                    int64_t lda, int ta, const float* packed_b, float* c,
                                    int64_t ldc, int accumulate);
int64_t disc_gemm_packed_size_avx512(int64_t k, int64_t n);
void disc_gemm_pack_b_avx512(int64_t k, int64_t n, const float* b, int64_t ldb, int tb,
                             float* out);
void disc_gemm_prepacked_block_avx512(int64_t m, int64_t n, int64_t k, const float* a,
                                      int64_t lda, int ta, const float* packed_b, float* c,
                                      int64_t ldc, int accumulate);
}

namespace {

struct Pool {  // RunTasks' view: the caller and one worker
  disc_tf::SpinPool* pool;
  int NumThreads() const { return 2; }
  void Schedule(std::function<void()> job) const { pool->Schedule(std::move(job)); }
};

struct Candidate {
  std::string name;
  bool full_rows = false;
  disc_tf::PrepackedRows rule = disc_tf::PrepackedRows::kColumnsFirst;
  int64_t row_block = 0;  // > 0: blocks of about this many rows
  bool any_size = false;  // row blocks without ChoosePrepackedSplit's bound on B
  int64_t col_width = 0;  // > 0: blocks of all rows and this many columns (ONNX Runtime's
                          // MLAS cuts a product wider than tall so, 8 slices per thread)
};

void BiasRelu(float* c, int64_t ldc, const float* bias, int64_t i0, int64_t i1, int64_t j0,
              int64_t j1) {
  for (int64_t i = i0; i < i1; ++i)
    for (int64_t j = j0; j < j1; ++j) c[i * ldc + j] = std::max(c[i * ldc + j] + bias[j], 0.0f);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: split_race M K N [ROUNDS [avx2|avx512]]\n");
    return 2;
  }
  const int64_t m = atoll(argv[1]), k = atoll(argv[2]), n = atoll(argv[3]);
  const int rounds = argc > 4 ? atoi(argv[4]) : 9;
  const std::string isa = argc > 5 ? argv[5] : "avx2";
  const bool avx512 = isa == "avx512";
  if (!avx512 && isa != "avx2") {
    fprintf(stderr, "split_race: ISA must be avx2 or avx512, not %s\n", isa.c_str());
    return 2;
  }
  const auto packed_size = avx512 ? disc_gemm_packed_size_avx512 : disc_gemm_packed_size_avx2;
  const auto pack_b = avx512 ? disc_gemm_pack_b_avx512 : disc_gemm_pack_b_avx2;
  const auto block = avx512 ? disc_gemm_prepacked_block_avx512 : disc_gemm_prepacked_block_avx2;
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> a(m * k), b(k * n), c(m * n), bias(n, 0.01f);
  for (float& x : a) x = u(rng);
  for (float& x : b) x = u(rng);
  std::vector<float> packed(packed_size(k, n));
  pack_b(k, n, b.data(), n, 0, packed.data());
  // Polling and pinned as the RAL's workers are (DISC_TF_SPIN_US, DISC_TF_PIN_WORKERS).
  disc_tf::SpinPool spin(disc_tf::SpinMicrosFromEnv(), disc_tf::PinWorkersFromEnv());
  spin.Reserve(1);
  const Pool pool{&spin};
  std::vector<Candidate> cands = {{"columns"}, {"full_rows", true}};
  cands.push_back(
      {"ral", false, disc_tf::PrepackedRowsFor(isa.c_str(), disc_tf::L2CacheBytes())});
  cands.push_back({"blocks48", false, disc_tf::PrepackedRows::kBlocksOf48});
  cands.push_back({"thread_rows_small_b", false, disc_tf::PrepackedRows::kThreadRowsSmallB});
  cands.push_back({"tall", false, disc_tf::PrepackedRows::kTallProducts});
  const char* rows_list = getenv("SPLIT_RACE_ROWS");
  for (const char* p = rows_list != nullptr ? rows_list : "48,96,192"; *p != '\0';) {
    char* end = nullptr;
    const long long r = strtoll(p, &end, 10);
    if (end == p || r < 6) {
      fprintf(stderr, "split_race: SPLIT_RACE_ROWS is a list of row counts >= 6\n");
      return 2;
    }
    cands.push_back({"rows" + std::to_string(r), false, disc_tf::PrepackedRows::kColumnsFirst,
                     static_cast<int64_t>(r)});
    p = *end == ',' ? end + 1 : end;
  }
  const char* cols_list = getenv("SPLIT_RACE_COLS");
  for (const char* p = cols_list != nullptr ? cols_list : "64,128"; *p != '\0';) {
    char* end = nullptr;
    const long long w = strtoll(p, &end, 10);
    if (end == p || w < 64 || w % 64 != 0) {
      fprintf(stderr, "split_race: SPLIT_RACE_COLS is a list of multiples of 64\n");
      return 2;
    }
    Candidate cand{"cols" + std::to_string(w)};
    cand.col_width = w;
    cands.push_back(cand);
    p = *end == ',' ? end + 1 : end;
  }
  cands.push_back({"rows48_any", false, disc_tf::PrepackedRows::kColumnsFirst, 48, true});
  cands.push_back({"halves", false, disc_tf::PrepackedRows::kColumnsFirst, -1});
  cands.push_back({"column_halves", false, disc_tf::PrepackedRows::kColumnsFirst, -2});
  auto run = [&](const Candidate& cand) {
    disc_tf::GemmSplit s = disc_tf::ChoosePrepackedSplit(m, n, k, 2, cand.full_rows, cand.rule);
    const bool b_fits = static_cast<double>(k) * n <= disc_tf::kRowBlockMaxPackedFloats;
    if (cand.col_width > 0) {
      s = disc_tf::GemmSplit{};
      s.col_blocks = (n + cand.col_width - 1) / cand.col_width;
    } else if (cand.row_block == -1) {  // one block of whole rows per thread
      s = disc_tf::GemmSplit{};
      s.row_blocks = 2;
      s.row_align = 6;
    } else if (cand.row_block == -2) {  // one block of whole columns per thread
      s = disc_tf::GemmSplit{};
      s.col_blocks = 2;
    } else if (cand.row_block > 0 && m >= 2 * cand.row_block && (b_fits || cand.any_size)) {
      s = disc_tf::GemmSplit{};
      s.row_blocks = 2 * ((m + 2 * cand.row_block - 1) / (2 * cand.row_block));
      s.row_align = 6;
    }
    const disc_tf::RowBlocks row_blocks = disc_tf::RowBlocks::Of(s, m);
    const int64_t cols = s.cols(n);
    const int64_t col_blocks = (n + cols - 1) / cols;
    const int64_t blocks = row_blocks.count * col_blocks;
    disc_tf::RunTasks(&pool, blocks, [&](int64_t t) {
      const int64_t i0 = row_blocks.begin(t / col_blocks), j0 = t % col_blocks * cols;
      const int64_t i1 = row_blocks.end(t / col_blocks), j1 = std::min(n, j0 + cols);
      block(i1 - i0, j1 - j0, k, a.data() + i0 * k, k, 0, packed.data() + j0 * k,
            c.data() + i0 * n + j0, n, 0);
      BiasRelu(c.data(), n, bias.data(), i0, i1, j0, j1);
    });
  };
  std::vector<std::vector<double>> times(cands.size());
  for (const Candidate& cand : cands) run(cand);  // warm up
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < cands.size(); ++i) {
      const size_t ci = (i + r) % cands.size();
      double best = 1e30;
      for (int rep = 0; rep < 5; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        run(cands[ci]);
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      times[ci].push_back(best);
    }
  }
  printf("%lldx%lldx%lld (2 threads, %s block, bias + ReLU per block)\n",
         static_cast<long long>(m), static_cast<long long>(k), static_cast<long long>(n),
         avx512 ? "AVX-512" : "AVX2");
  for (size_t ci = 0; ci < cands.size(); ++ci) {
    std::vector<double> ratio;
    for (int r = 0; r < rounds; ++r) ratio.push_back(times[0][r] / times[ci][r]);
    std::sort(ratio.begin(), ratio.end());
    const double t = Median(times[ci]);
    printf("  %-9s %9.3f ms %6.1f GF/s  columns/this %.2f [%.2f-%.2f]\n", cands[ci].name.c_str(),
           t * 1e3, 2.0 * m * n * k / t / 1e9, Median(ratio), ratio.front(), ratio.back());
  }
  return 0;
}
