// gemm_libs.cc -- the RAL's float GEMM microkernel against GEMM libraries,
// kernel only: C[m x n] = A[m x k] * B[k x n], row-major fp32, B a model
// constant packed once per shape before timing (outside the timed loop).
//
// Candidates (each built in only if its HAVE_* macro is defined, see build.sh):
//   disc        disc_gemm_prepacked_block_<isa> (cc/ral), split over threads as
//               the RAL's SgemmImpl splits a prepacked product (disc_ral_tf.cc)
//   disc_variant  the same block built again with DISC_VARIANT_FLAGS
//               (kernel_variant.cc), split and run the same way
//   mkl_packed  cblas_sgemm_pack once, cblas_sgemm_compute per call
//   mkl_sgemm   plain cblas_sgemm (packs B inside every call)
//   xsmm        libxsmm_smmdispatch JIT kernels on 64-column panels of B
//               packed once; threads as for disc (libxsmm has none of its own)
//   blis        bli_sgemm (no pre-packed API: packs inside every call)
//   dnnl_rt     oneDNN matmul with m a runtime dim, weights reordered once
//   dnnl_fixed  oneDNN matmul created for this m, weights reordered once
//
// Per shape: every candidate is checked against a double-precision reference
// on a few rows, warmed up, then timed in interleaved rounds (each round runs
// every candidate once, in an order rotated by one each round, as a batch of
// back-to-back calls timed as a whole). Prints one JSON object per line.
//
//   gemm_libs --isa avx512|avx2 --threads 1|2 [--rounds 7] [--batch-ms 20]
//             [--gap-ms 10] [--shapes 16x768x768,...] [--only disc,mkl_packed]
//             [--b-copies 24]   # disc: calls take B's packed copies in turn (a
//                               # model's weights come from L3 or memory, not L2)
//   gemm_libs --serve --isa avx512 --threads 2   # batches on request (call_path.py)
//
// The ISA caps of the libraries are environment variables read at their
// start-up (run.py sets them): MKL_ENABLE_INSTRUCTIONS, ONEDNN_MAX_CPU_ISA,
// LIBXSMM_TARGET, BLIS_ARCH_TYPE; --isa picks the microkernel's entry point.
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cc/ral/gemm_kernels.h"
#include "cc/ral/gemm_split.h"
#include "cc/ral/run_tasks.h"
#include "cc/ral/spin_pool.h"

#ifdef HAVE_MKL
#include <mkl.h>
#endif
#ifdef HAVE_DISC_VARIANT  // kernel_variant.cc
#define DISC_VARIANT_DECLS(isa)                                                          \
  extern "C" int64_t disc_gemm_packed_size_##isa##_variant(int64_t, int64_t);            \
  extern "C" void disc_gemm_pack_b_##isa##_variant(int64_t, int64_t, const float*,       \
                                                   int64_t, int, float*);                \
  extern "C" void disc_gemm_prepacked_block_##isa##_variant(                             \
      int64_t, int64_t, int64_t, const float*, int64_t, int, const float*, float*, int64_t, int);
DISC_VARIANT_DECLS(avx2)
DISC_VARIANT_DECLS(avx512)
#endif
#ifdef HAVE_XSMM
#include <libxsmm.h>
#endif
#ifdef HAVE_BLIS  // blis_glue.cc
extern "C" {
void glue_blis_init(int threads);
const char* glue_blis_version(void);
const char* glue_blis_arch(void);
int glue_blis_threads(void);
void glue_blis_sgemm(long m, long n, long k, const float* a, const float* b, float* c);
}
#endif
#ifdef HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

float* AllocFloats(size_t n) {
  size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
  return static_cast<float*>(aligned_alloc(64, std::max<size_t>(bytes, 64)));
}
struct FreeDeleter {
  void operator()(void* p) const { free(p); }
};
using Floats = std::unique_ptr<float, FreeDeleter>;

// ---- The RAL's task pool (cc/ral/spin_pool.h) with one worker: the caller and
// the worker take tasks from a shared counter, as in the RAL. The worker polls and
// is pinned as the RAL's are (DISC_TF_SPIN_US, DISC_TF_PIN_WORKERS).
class Helper {
 public:
  Helper() : pool_(disc_tf::SpinMicrosFromEnv(), disc_tf::PinWorkersFromEnv()) {
    pool_.Reserve(1);
  }
  int NumThreads() const { return 2; }  // the caller's and the worker
  void Schedule(std::function<void()> job) { pool_.Schedule(std::move(job)); }

 private:
  disc_tf::SpinPool pool_;
};

// Tasks run as the RAL runs them: cc/ral/run_tasks.h (the caller and one helper).
using disc_tf::RunTasks;

// ---- The RAL's split of a prepacked product: cc/ral/gemm_split.h.

// Runs block(i0, i1, j0, j1) over the RAL's blocks of C (j0: a multiple of 64);
// `rows` as the RAL passes it for the ISA (gemm_split.h, PrepackedRowsFor).
void SplitGemm(Helper* pool, int64_t m, int64_t n, int64_t k, disc_tf::PrepackedRows rows_rule,
               const std::function<void(int64_t, int64_t, int64_t, int64_t)>& block) {
  const double work = static_cast<double>(m) * n * k;
  disc_tf::GemmSplit split;
  if (pool != nullptr && work >= disc_tf::kSmallGemm)
    split = disc_tf::ChoosePrepackedSplit(m, n, k, 2, /*full_rows=*/false, rows_rule);
  const disc_tf::RowBlocks row_blocks = disc_tf::RowBlocks::Of(split, m);
  const int64_t cols = split.cols(n);
  const int64_t col_blocks = (n + cols - 1) / cols;
  const int64_t blocks = row_blocks.count * col_blocks;
  auto task = [&](int64_t t) {
    const int64_t j0 = t % col_blocks * cols;
    block(row_blocks.begin(t / col_blocks), row_blocks.end(t / col_blocks), j0,
          std::min(n, j0 + cols));
  };
  RunTasks(work < disc_tf::kSmallGemm ? nullptr : pool, blocks, task);
}

// ---- Candidates.
struct Problem {
  int64_t m, k, n;
  const float* a;  // [m x k]
  const float* b;  // [k x n]
  int threads;
  std::string isa;  // microkernel entry: avx512 | avx2
  int b_copies = 1;  // disc: packed copies of B, one per call in turn
};

// The RAL's rule for sharing a product among threads on this ISA.
disc_tf::PrepackedRows RowRule(const Problem& p) {
  return disc_tf::PrepackedRowsFor(p.isa.c_str(), disc_tf::L2CacheBytes());
}

class Candidate {
 public:
  virtual ~Candidate() = default;
  virtual void Run(float* c) = 0;
  size_t packed_bytes = 0;  // B's copy kept across calls (0: none)
  std::string note;         // implementation detail to report
};

class Disc : public Candidate {
 public:
  // variant: the block of kernel_variant.cc (build.sh's DISC_VARIANT_FLAGS).
  Disc(const Problem& p, Helper* pool, bool variant = false) : p_(p), pool_(pool) {
    const bool avx512 = p.isa == "avx512";
    size_ = avx512 ? &disc_gemm_packed_size_avx512 : &disc_gemm_packed_size_avx2;
    disc_gemm_pack_b_fn pack = avx512 ? &disc_gemm_pack_b_avx512 : &disc_gemm_pack_b_avx2;
    block_ = avx512 ? &disc_gemm_prepacked_block_avx512 : &disc_gemm_prepacked_block_avx2;
#ifdef HAVE_DISC_VARIANT
    if (variant) {
      size_ = avx512 ? &disc_gemm_packed_size_avx512_variant : &disc_gemm_packed_size_avx2_variant;
      pack = avx512 ? &disc_gemm_pack_b_avx512_variant : &disc_gemm_pack_b_avx2_variant;
      block_ = avx512 ? &disc_gemm_prepacked_block_avx512_variant
                      : &disc_gemm_prepacked_block_avx2_variant;
    }
#else
    (void)variant;
#endif
    const int64_t floats = size_(p.k, p.n);
    for (int i = 0; i < std::max(1, p.b_copies); ++i) {
      packed_.emplace_back(AllocFloats(floats));
      pack(p.k, p.n, p.b, p.n, 0, packed_.back().get());
    }
    packed_bytes = floats * sizeof(float);
    note = p.isa + (packed_.size() > 1 ? " B x" + std::to_string(packed_.size()) : "");
  }
  void Run(float* c) override {
    const Problem& p = p_;
    const float* packed = packed_[next_++ % packed_.size()].get();
    SplitGemm(pool_, p.m, p.n, p.k, RowRule(p), [&](int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
      block_(i1 - i0, j1 - j0, p.k, p.a + i0 * p.k, p.k, 0, packed + j0 * p.k,
             c + i0 * p.n + j0, p.n, 0);
    });
  }

 private:
  Problem p_;
  Helper* pool_;
  disc_gemm_packed_size_fn size_;
  disc_gemm_prepacked_block_fn block_;
  std::vector<Floats> packed_;
  size_t next_ = 0;
};

#ifdef HAVE_MKL
class MklPacked : public Candidate {
 public:
  explicit MklPacked(const Problem& p) : p_(p) {
    packed_bytes = cblas_sgemm_pack_get_size(CblasBMatrix, p.m, p.n, p.k);
    packed_.reset(AllocFloats(packed_bytes / sizeof(float) + 1));
    cblas_sgemm_pack(CblasRowMajor, CblasBMatrix, CblasNoTrans, p.m, p.n, p.k, 1.0f, p.b, p.n,
                     packed_.get());
  }
  void Run(float* c) override {
    cblas_sgemm_compute(CblasRowMajor, CblasNoTrans, CblasPacked, p_.m, p_.n, p_.k, p_.a, p_.k,
                        packed_.get(), p_.n, 0.0f, c, p_.n);
  }

 private:
  Problem p_;
  Floats packed_;
};

class MklSgemm : public Candidate {
 public:
  explicit MklSgemm(const Problem& p) : p_(p) {}
  void Run(float* c) override {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, p_.m, p_.n, p_.k, 1.0f, p_.a, p_.k,
                p_.b, p_.n, 0.0f, c, p_.n);
  }

 private:
  Problem p_;
};
#endif

#ifdef HAVE_XSMM
// libxsmm is column-major: row-major C = A B is column-major C' = B' A', so a
// kernel's "A" is a panel of B (w columns, row stride w), its "B" is rows of A.
// B is packed once into panels of kPanel columns (the last one narrower), k
// rows each; the product runs panel by panel in k blocks of kDepth, as the
// microkernel's prepacked path does.
class Xsmm : public Candidate {
 public:
  static constexpr int64_t kPanel = 64, kDepth = 1024;
  Xsmm(const Problem& p, Helper* pool) : p_(p), pool_(pool) {
    packed_.reset(AllocFloats(p.k * p.n));
    float* out = packed_.get();
    for (int64_t j0 = 0; j0 < p.n; j0 += kPanel) {
      const int64_t w = std::min(kPanel, p.n - j0);
      for (int64_t r = 0; r < p.k; ++r)
        memcpy(out + r * w, p.b + r * p.n + j0, w * sizeof(float));
      out += p.k * w;
    }
    packed_bytes = p.k * p.n * sizeof(float);
    note = libxsmm_get_target_arch();
  }
  void Run(float* c) override {
    const Problem& p = p_;
    SplitGemm(pool_, p.m, p.n, p.k, RowRule(p), [&](int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
      Block(i1 - i0, j0, j1, p.a + i0 * p.k, c + i0 * p.n);
    });
  }
  bool ok = true;

 private:
  libxsmm_smmfunction Kernel(int64_t w, int64_t rows, int64_t kc, bool accumulate) {
    const libxsmm_blasint lda = w, ldb = p_.k, ldc = p_.n;
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    const int flags = LIBXSMM_GEMM_FLAG_NONE;
    return libxsmm_smmdispatch(w, rows, kc, &lda, &ldb, &ldc, &alpha, &beta, &flags, nullptr);
  }
  void Block(int64_t rows, int64_t j0, int64_t j1, const float* a, float* c) {
    for (int64_t q = j0; q < j1; q += kPanel) {
      const int64_t w = std::min(kPanel, p_.n - q);
      const float* panel = packed_.get() + q * p_.k;
      for (int64_t p0 = 0; p0 < p_.k; p0 += kDepth) {
        const int64_t kc = std::min(kDepth, p_.k - p0);
        libxsmm_smmfunction kernel = Kernel(w, rows, kc, p0 > 0);  // a cached lookup
        if (kernel == nullptr) {
          ok = false;
          return;
        }
        kernel(panel + p0 * w, a + p0, c + q);
      }
    }
  }
  Problem p_;
  Helper* pool_;
  Floats packed_;
};
#endif

#ifdef HAVE_BLIS
class Blis : public Candidate {
 public:
  explicit Blis(const Problem& p) : p_(p) { note = glue_blis_arch(); }
  void Run(float* c) override { glue_blis_sgemm(p_.m, p_.n, p_.k, p_.a, p_.b, c); }

 private:
  Problem p_;
};
#endif

#ifdef HAVE_DNNL
class Dnnl : public Candidate {
 public:
  // runtime_m: one primitive for every m (src/dst rows DNNL_RUNTIME_DIM_VAL).
  Dnnl(const Problem& p, dnnl::engine& eng, dnnl::stream& strm, bool runtime_m)
      : eng_(eng), strm_(strm) {
    using dnnl::memory;
    using tag = memory::format_tag;
    const auto f32 = memory::data_type::f32;
    const memory::dim rows = runtime_m ? DNNL_RUNTIME_DIM_VAL : p.m;
    const memory::desc src({rows, p.k}, f32, tag::ab), dst({rows, p.n}, f32, tag::ab);
    const memory::desc user_w({p.k, p.n}, f32, tag::ab);
    dnnl::matmul::primitive_desc pd;
    try {
      pd = dnnl::matmul::primitive_desc(
          dnnl::matmul::desc(src, memory::desc({p.k, p.n}, f32, tag::any), dst), eng);
    } catch (const dnnl::error&) {  // no blocked weights for this case: plain ones
      pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, user_w, dst), eng);
    }
    prim_ = dnnl::matmul(pd);
    weights_ = memory(pd.weights_desc(), eng);
    memory user(user_w, eng, const_cast<float*>(p.b));
    dnnl::reorder(user, weights_).execute(strm, user, weights_);
    strm.wait();
    src_ = memory(memory::desc({p.m, p.k}, f32, tag::ab), eng, const_cast<float*>(p.a));
    dst_desc_ = memory::desc({p.m, p.n}, f32, tag::ab);
    packed_bytes = pd.weights_desc().get_size();
    note = std::string(pd.impl_info_str()) +
           (pd.weights_desc() == user_w ? " weights:plain" : " weights:blocked");
  }
  void Run(float* c) override {
    dnnl::memory dst(dst_desc_, eng_, c);
    prim_.execute(strm_, {{DNNL_ARG_SRC, src_}, {DNNL_ARG_WEIGHTS, weights_}, {DNNL_ARG_DST, dst}});
    strm_.wait();
  }

 private:
  dnnl::engine& eng_;
  dnnl::stream& strm_;
  dnnl::matmul prim_;
  dnnl::memory weights_, src_;
  dnnl::memory::desc dst_desc_;
};
#endif

// ---- Driver.
struct Options {
  std::string isa = "avx512";
  int threads = 1, rounds = 7;
  double batch_ms = 20;
  int gap_ms = 10;
  int b_copies = 1;
  std::vector<std::array<int64_t, 3>> shapes;  // m, k, n
  std::vector<std::string> only;
};

bool Wanted(const Options& o, const std::string& name) {
  return o.only.empty() || std::find(o.only.begin(), o.only.end(), name) != o.only.end();
}

std::string Json(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += (ch == '\n' ? ' ' : ch);
  }
  return out + "\"";
}

// Largest relative error of C's rows {0, m/2, m-1} against a double reference.
double CheckRows(const Problem& p, const float* c) {
  double worst = 0;
  for (int64_t i : {int64_t{0}, p.m / 2, p.m - 1}) {
    for (int64_t j = 0; j < p.n; ++j) {
      double ref = 0, mag = 0;
      for (int64_t q = 0; q < p.k; ++q) {
        ref += static_cast<double>(p.a[i * p.k + q]) * p.b[q * p.n + j];
        mag += std::fabs(static_cast<double>(p.a[i * p.k + q]) * p.b[q * p.n + j]);
      }
      worst = std::max(worst, std::fabs(c[i * p.n + j] - ref) / (mag + 1e-30));
    }
  }
  return worst;
}

void Info(const Options& o) {
  printf("{\"type\": \"info\", \"isa\": %s, \"threads\": %d, \"omp_max_threads\": %d",
         Json(o.isa).c_str(), o.threads, omp_get_max_threads());
#ifdef HAVE_MKL
  char version[256];
  mkl_get_version_string(version, sizeof(version));
  printf(", \"mkl\": %s, \"mkl_cbwr_auto_branch\": %d, \"mkl_max_threads\": %d",
         Json(version).c_str(), mkl_cbwr_get_auto_branch(), mkl_get_max_threads());
#endif
#ifdef HAVE_XSMM
  printf(", \"libxsmm\": %s, \"libxsmm_target\": %s", Json(LIBXSMM_CONFIG_VERSION).c_str(),
         Json(libxsmm_get_target_arch()).c_str());
#endif
#ifdef HAVE_BLIS
  printf(", \"blis\": %s, \"blis_arch\": %s, \"blis_threads\": %d",
         Json(glue_blis_version()).c_str(), Json(glue_blis_arch()).c_str(), glue_blis_threads());
#endif
#ifdef HAVE_DNNL
  const dnnl_version_t* v = dnnl_version();
  printf(", \"onednn\": \"%d.%d.%d\", \"onednn_cpu_runtime\": %u", v->major, v->minor, v->patch,
         v->cpu_runtime);
#endif
  printf("}\n");
  fflush(stdout);
}

void RunShape(const Options& o, int64_t m, int64_t k, int64_t n, Helper* pool, void* dnnl_ctx) {
  std::mt19937 rng(static_cast<unsigned>(m * 1000003 + k * 1009 + n));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  Floats a(AllocFloats(m * k)), b(AllocFloats(k * n)), c(AllocFloats(m * n));
  for (int64_t i = 0; i < m * k; ++i) a.get()[i] = dist(rng);
  for (int64_t i = 0; i < k * n; ++i) b.get()[i] = dist(rng);
  const Problem p{m, k, n, a.get(), b.get(), o.threads, o.isa, o.b_copies};

  std::vector<std::pair<std::string, std::unique_ptr<Candidate>>> cands;
  cands.emplace_back("disc", std::make_unique<Disc>(p, pool));
#ifdef HAVE_DISC_VARIANT
  if (Wanted(o, "disc_variant"))
    cands.emplace_back("disc_variant", std::make_unique<Disc>(p, pool, true));
#endif
#ifdef HAVE_MKL
  if (Wanted(o, "mkl_packed")) cands.emplace_back("mkl_packed", std::make_unique<MklPacked>(p));
  if (Wanted(o, "mkl_sgemm")) cands.emplace_back("mkl_sgemm", std::make_unique<MklSgemm>(p));
#endif
#ifdef HAVE_XSMM
  if (Wanted(o, "xsmm")) cands.emplace_back("xsmm", std::make_unique<Xsmm>(p, pool));
#endif
#ifdef HAVE_BLIS
  if (Wanted(o, "blis")) cands.emplace_back("blis", std::make_unique<Blis>(p));
#endif
#ifdef HAVE_DNNL
  auto* ctx = static_cast<std::pair<dnnl::engine, dnnl::stream>*>(dnnl_ctx);
  if (Wanted(o, "dnnl_rt"))
    cands.emplace_back("dnnl_rt", std::make_unique<Dnnl>(p, ctx->first, ctx->second, true));
  if (Wanted(o, "dnnl_fixed"))
    cands.emplace_back("dnnl_fixed", std::make_unique<Dnnl>(p, ctx->first, ctx->second, false));
#else
  (void)dnnl_ctx;
#endif

  // Check, warm up, and size the batch from disc's time per call.
  std::vector<double> err(cands.size());
  for (size_t i = 0; i < cands.size(); ++i) {
    memset(c.get(), 0xff, m * n * sizeof(float));  // NaN: unwritten output shows
    cands[i].second->Run(c.get());
    err[i] = CheckRows(p, c.get());
    for (int w = 0; w < 3; ++w) cands[i].second->Run(c.get());
  }
  double one = 1e9;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = Clock::now();
    cands[0].second->Run(c.get());
    one = std::min(one, Seconds(t0, Clock::now()));
  }
  const int calls = static_cast<int>(
      std::clamp(o.batch_ms * 1e-3 / std::max(one, 1e-7), 1.0, 20000.0));

  std::vector<std::vector<double>> times(cands.size());
  for (int r = 0; r < o.rounds; ++r) {
    for (size_t j = 0; j < cands.size(); ++j) {
      const size_t i = (j + r) % cands.size();
      Candidate& cand = *cands[i].second;
      // Idle first, so that no thread of the previous candidate still spins
      // (libgomp's workers spin up to a few ms after a parallel region).
      std::this_thread::sleep_for(std::chrono::milliseconds(o.gap_ms));
      const auto t0 = Clock::now();
      for (int call = 0; call < calls; ++call) cand.Run(c.get());
      times[i].push_back(Seconds(t0, Clock::now()) / calls);
    }
  }

  printf("{\"type\": \"shape\", \"m\": %ld, \"k\": %ld, \"n\": %ld, \"calls\": %d, \"cands\": {",
         (long)m, (long)k, (long)n, calls);
  for (size_t i = 0; i < cands.size(); ++i) {
    printf("%s%s: {\"err\": %.3g, \"packed_bytes\": %zu, \"note\": %s, \"s\": [", i ? ", " : "",
           Json(cands[i].first).c_str(), err[i], cands[i].second->packed_bytes,
           Json(cands[i].second->note).c_str());
    for (size_t r = 0; r < times[i].size(); ++r) printf("%s%.4g", r ? ", " : "", times[i][r]);
    printf("]}");
  }
  printf("}}\n");
  fflush(stdout);
}

// --serve: reads "m k n calls" lines, answers each with the seconds per call
// of one batch of the microkernel (disc) on that shape, so that another
// process can interleave these batches with its own (call_path.py).
void Serve(const Options& o, Helper* pool) {
  struct Case {
    Floats a, b, c;
    std::unique_ptr<Disc> disc;
  };
  std::vector<std::pair<std::array<int64_t, 3>, Case>> cases;
  long m, k, n, calls;
  while (scanf("%ld %ld %ld %ld", &m, &k, &n, &calls) == 4) {
    const std::array<int64_t, 3> key{m, k, n};
    auto it = std::find_if(cases.begin(), cases.end(), [&](auto& e) { return e.first == key; });
    if (it == cases.end()) {
      Case cs;
      cs.a.reset(AllocFloats(m * k));
      cs.b.reset(AllocFloats(k * n));
      cs.c.reset(AllocFloats(m * n));
      for (long i = 0; i < m * k; ++i) cs.a.get()[i] = static_cast<float>(i % 7) * 0.1f;
      for (long i = 0; i < k * n; ++i) cs.b.get()[i] = static_cast<float>(i % 5) * 0.1f;
      cs.disc = std::make_unique<Disc>(Problem{m, k, n, cs.a.get(), cs.b.get(), o.threads, o.isa},
                                       pool);
      for (int w = 0; w < 3; ++w) cs.disc->Run(cs.c.get());
      cases.emplace_back(key, std::move(cs));
      it = cases.end() - 1;
    }
    const auto t0 = Clock::now();
    for (long i = 0; i < calls; ++i) it->second.disc->Run(it->second.c.get());
    printf("%.6g\n", Seconds(t0, Clock::now()) / std::max(calls, 1L));
    fflush(stdout);
  }
}

std::vector<std::string> SplitList(const char* s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (const char* q = s;; ++q) {
    if (*q == sep || *q == '\0') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
      if (*q == '\0') break;
    } else {
      cur += *q;
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  bool serve = false;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--serve") {
      serve = true;
      --i;
      continue;
    }
    if (i + 1 >= argc) break;
    const char* v = argv[i + 1];
    if (flag == "--isa") o.isa = v;
    else if (flag == "--threads") o.threads = atoi(v);
    else if (flag == "--rounds") o.rounds = atoi(v);
    else if (flag == "--batch-ms") o.batch_ms = atof(v);
    else if (flag == "--gap-ms") o.gap_ms = atoi(v);
    else if (flag == "--b-copies") o.b_copies = atoi(v);
    else if (flag == "--only") o.only = SplitList(v, ',');
    else if (flag == "--shapes") {
      for (const std::string& s : SplitList(v, ',')) {
        long m, k, n;
        if (sscanf(s.c_str(), "%ldx%ldx%ld", &m, &k, &n) == 3) o.shapes.push_back({m, k, n});
      }
    } else {
      fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (o.isa != "avx512" && o.isa != "avx2") {
    fprintf(stderr, "--isa must be avx512 or avx2\n");
    return 2;
  }
  omp_set_num_threads(o.threads);
#ifdef HAVE_MKL
  mkl_set_num_threads(o.threads);
#endif
#ifdef HAVE_XSMM
  libxsmm_init();
#endif
#ifdef HAVE_BLIS
  glue_blis_init(o.threads);
#endif
  void* dnnl_ctx = nullptr;
#ifdef HAVE_DNNL
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  std::pair<dnnl::engine, dnnl::stream> ctx{eng, dnnl::stream(eng)};
  dnnl_ctx = &ctx;
#endif
  std::unique_ptr<Helper> pool;
  if (o.threads >= 2) pool = std::make_unique<Helper>();
  if (serve) {
    Serve(o, pool.get());
    return 0;
  }
  Info(o);
  for (const auto& s : o.shapes) RunShape(o, s[0], s[1], s[2], pool.get(), dnnl_ctx);
#ifdef HAVE_XSMM
  libxsmm_finalize();
#endif
  return 0;
}
