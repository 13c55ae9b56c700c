// split_race.cc -- ways of cutting one prepacked GEMM for two threads, raced in
// one process: the RAL's AVX2 block, its task pool (cc/ral/spin_pool.h) and
// RunTasks, a bias + ReLU epilogue on each block right after it, as the RAL runs it.
//
//   split_race M K N [ROUNDS]      # built by build.sh next to gemm_libs
//
// Candidates: `before` (ChoosePrepackedSplit without row blocks), `full_rows` (its
// rows-only split, as for a row-wise epilogue), `rows48` (the RAL's AVX2 split,
// kRowBlockRows), `rows96`, `rows192` (the last three only where packed B is within
// kRowBlockMaxPackedFloats, else as `before`), and `rows48_any` (48-row blocks
// whatever B's size: what that bound was measured with). Each round times every candidate (best of 5
// calls), in an order rotated by one each round; prints per candidate the median
// time and the median [range] of before / candidate over the rounds (> 1: faster).
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
}

namespace {

struct Pool {  // RunTasks' view: the caller and one worker
  disc_tf::SpinPool* pool;
  int NumThreads() const { return 2; }
  void Schedule(std::function<void()> job) const { pool->Schedule(std::move(job)); }
};

struct Candidate {
  std::string name;
  bool full_rows;
  int64_t row_block;
  bool any_size = false;  // row blocks without ChoosePrepackedSplit's bound on B
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
    fprintf(stderr, "usage: split_race M K N [ROUNDS]\n");
    return 2;
  }
  const int64_t m = atoll(argv[1]), k = atoll(argv[2]), n = atoll(argv[3]);
  const int rounds = argc > 4 ? atoi(argv[4]) : 9;
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> a(m * k), b(k * n), c(m * n), bias(n, 0.01f);
  for (float& x : a) x = u(rng);
  for (float& x : b) x = u(rng);
  std::vector<float> packed(disc_gemm_packed_size_avx2(k, n));
  disc_gemm_pack_b_avx2(k, n, b.data(), n, 0, packed.data());
  disc_tf::SpinPool spin(200);
  spin.Reserve(1);
  const Pool pool{&spin};
  const std::vector<Candidate> cands = {{"before", false, 0},
                                        {"full_rows", true, 0},
                                        {"rows48", false, disc_tf::kRowBlockRows},
                                        {"rows96", false, 96},
                                        {"rows192", false, 192},
                                        {"rows48_any", false, disc_tf::kRowBlockRows, true}};
  auto run = [&](const Candidate& cand) {
    disc_tf::GemmSplit s =
        disc_tf::ChoosePrepackedSplit(m, n, k, 2, cand.full_rows, cand.row_block);
    if (cand.any_size && m >= 2 * cand.row_block) {
      s = disc_tf::GemmSplit{};
      s.row_blocks = 2 * ((m + 2 * cand.row_block - 1) / (2 * cand.row_block));
      s.row_align = 6;
    }
    const int64_t rows = s.rows(m), cols = s.cols(n);
    const int64_t col_blocks = (n + cols - 1) / cols;
    const int64_t blocks = (m + rows - 1) / rows * col_blocks;
    disc_tf::RunTasks(&pool, blocks, [&](int64_t t) {
      const int64_t i0 = t / col_blocks * rows, j0 = t % col_blocks * cols;
      const int64_t i1 = std::min(m, i0 + rows), j1 = std::min(n, j0 + cols);
      disc_gemm_prepacked_block_avx2(i1 - i0, j1 - j0, k, a.data() + i0 * k, k, 0,
                                     packed.data() + j0 * k, c.data() + i0 * n + j0, n, 0);
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
  printf("%lldx%lldx%lld (2 threads, AVX2 block, bias + ReLU per block)\n",
         static_cast<long long>(m), static_cast<long long>(k), static_cast<long long>(n));
  for (size_t ci = 0; ci < cands.size(); ++ci) {
    std::vector<double> ratio;
    for (int r = 0; r < rounds; ++r) ratio.push_back(times[0][r] / times[ci][r]);
    std::sort(ratio.begin(), ratio.end());
    const double t = Median(times[ci]);
    printf("  %-9s %9.3f ms %6.1f GF/s  before/this %.2f [%.2f-%.2f]\n", cands[ci].name.c_str(),
           t * 1e3, 2.0 * m * n * k / t / 1e9, Median(ratio), ratio.front(), ratio.back());
  }
  return 0;
}
