// disc_ral_tf.cc -- the DISC RAL on a TensorFlow OpKernelContext.
#define EIGEN_USE_THREADS

#include "cc/ral/disc_ral_tf.h"
#include "cc/ral/aligned_buffer.h"
#include "cc/ral/column_steps.h"
#include "cc/ral/conv_winograd.h"
#include "cc/ral/gemm_kernels.h"
#include "cc/ral/gemm_split.h"
#include "cc/ral/run_tasks.h"
#include "cc/ral/spin_pool.h"
#include "cc/ral/launch_profile.h"
#include "cc/kernels/stats.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/device_base.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/platform/logging.h"
#include "tensorflow/core/platform/threadpool.h"
#include "unsupported/Eigen/CXX11/Tensor"

namespace disc_tf {

namespace {

using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

// Loops cheaper than this (total * cost_per_unit, in cycles) run inline.
constexpr double kInlineCostThreshold = 20000.0;
constexpr uintptr_t kTempAlignment = 64;

// The kernel's intra-op pool, or null when it has one thread or none.
tensorflow::thread::ThreadPool* IntraOpPool(OpKernelContext* ctx) {
  if (ctx->device() == nullptr) return nullptr;
  const tensorflow::DeviceBase::CpuWorkerThreads* workers =
      ctx->device()->tensorflow_cpu_worker_threads();
  if (workers == nullptr || workers->num_threads <= 1) return nullptr;
  return workers->workers;
}

// The pool a launch runs its tasks on (RunTasks' Pool): the RAL's SpinPool
// (spin_pool.h), or with DISC_TF_TASK_POOL=tf the kernel's intra-op pool itself;
// `threads` counts the caller, as the intra-op pool's size does. No pool (tasks
// inline) when the intra-op pool has one thread or none.
struct TaskPool {
  SpinPool* spin = nullptr;
  tensorflow::thread::ThreadPool* intra_op = nullptr;
  int threads = 1;
  std::atomic<bool>* scheduled = nullptr;  // set once a launch hands tasks to the pool
  bool none() const { return spin == nullptr && intra_op == nullptr; }
  int NumThreads() const { return threads; }
  void Schedule(std::function<void()> job) const {
    if (spin != nullptr) {
      spin->Schedule(std::move(job));
    } else {
      intra_op->Schedule(std::move(job));
    }
  }
};

bool UseIntraOpPool() {
  const char* v = std::getenv("DISC_TF_TASK_POOL");
  return v != nullptr && std::string(v) == "tf";
}

// The workers are shared by every call of the process and never stopped. When
// the system refuses a worker thread, the launches use the workers there are
// (none: tasks inline), with one warning.
TaskPool TaskPoolFor(OpKernelContext* ctx) {
  tensorflow::thread::ThreadPool* intra_op = IntraOpPool(ctx);
  if (intra_op == nullptr) return {};
  const int threads = intra_op->NumThreads();
  static const bool use_intra_op = UseIntraOpPool();
  if (use_intra_op) return {nullptr, intra_op, threads};
  static SpinPool* const pool = new SpinPool(SpinMicrosFromEnv(), PinWorkersFromEnv());
  static std::atomic<int> workers{0};  // started so far (only grows)
  static std::atomic<bool> refused{false};
  int have = workers.load(std::memory_order_acquire);
  if (have < threads - 1 && !refused.load(std::memory_order_relaxed)) {
    have = pool->Reserve(threads - 1);
    for (int seen = workers.load(); seen < have && !workers.compare_exchange_weak(seen, have);) {
    }
    if (have < threads - 1 && pool->Refused() && !refused.exchange(true)) {
      LOG(WARNING) << "disc_tf: the system refused a RAL worker thread; kernels run on "
                   << have + 1 << " thread(s) instead of " << threads;
    }
  }
  const int usable = std::min(threads, have + 1);
  if (usable <= 1) return {};
  return {pool, nullptr, usable};
}

// The pool of the call `r`, noting in r->scheduled_tasks when it is used.
TaskPool TaskPoolOf(TfRal* r) {
  TaskPool pool = TaskPoolFor(r->ctx);
  pool.scheduled = &r->scheduled_tasks;
  return pool;
}

// RunTasks on `pool` (inline when it is none, or with `inline_only`).
void RunOn(const TaskPool& pool, int64_t tasks, const std::function<void(int64_t)>& fn,
           bool inline_only = false) {
  const bool threaded = !pool.none() && !inline_only && tasks > 1;
  if (threaded && pool.scheduled != nullptr)
    pool.scheduled->store(true, std::memory_order_relaxed);
  RunTasks(threaded ? &pool : nullptr, tasks, fn);
}

}  // namespace

void WakeTaskPool(OpKernelContext* ctx) {
  const TaskPool pool = TaskPoolFor(ctx);
  if (pool.spin == nullptr) return;
  const int woken = pool.spin->Wake(pool.threads - 1);
  if (woken > 0) stats::Add(stats::kPoolWakes, woken);
}

namespace {

bool CheckInput(TfRal* r, int32_t i, const char* what) {
  if (i < 0 || i >= r->num_inputs) {
    r->SetError(DISC_INTERNAL, absl::StrCat(what, ": input index ", i,
                                            " out of range [0, ",
                                            r->num_inputs, ")"));
    return false;
  }
  return true;
}

int32_t RalInputRank(disc_ral* ral, int32_t i) {
  TfRal* r = TfRal::From(ral);
  if (!CheckInput(r, i, "input_rank")) return -1;
  return r->dim_begin[i + 1] - r->dim_begin[i];
}

const int64_t* RalInputDims(disc_ral* ral, int32_t i) {
  TfRal* r = TfRal::From(ral);
  if (!CheckInput(r, i, "input_dims")) return nullptr;
  return r->dims.data() + r->dim_begin[i];
}

int32_t RalInputDtype(disc_ral* ral, int32_t i) {
  TfRal* r = TfRal::From(ral);
  if (!CheckInput(r, i, "input_dtype")) return -1;
  return static_cast<int32_t>(r->inputs[i].dtype());
}

const void* RalInputData(disc_ral* ral, int32_t i) {
  TfRal* r = TfRal::From(ral);
  if (!CheckInput(r, i, "input_data")) return nullptr;
  return r->inputs[i].tensor_data().data();
}

void* RalAllocOutput(disc_ral* ral, int32_t i, int32_t rank,
                     const int64_t* dims) {
  TfRal* r = TfRal::From(ral);
  if (i < 0 || i >= r->num_outputs) {
    r->SetError(DISC_INTERNAL, absl::StrCat("alloc_output: output index ", i,
                                            " out of range [0, ",
                                            r->num_outputs, ")"));
    return nullptr;
  }
  if (rank < 0 || (rank > 0 && dims == nullptr)) {
    r->SetError(DISC_INTERNAL,
                absl::StrCat("alloc_output: invalid rank ", rank,
                             " for output ", i));
    return nullptr;
  }
  TensorShape shape;
  for (int32_t d = 0; d < rank; ++d) {
    if (dims[d] < 0) {
      r->SetError(DISC_INTERNAL,
                  absl::StrCat("alloc_output: negative dimension ", dims[d],
                               " at axis ", d, " of output ", i));
      return nullptr;
    }
    absl::Status s = shape.AddDimWithStatus(dims[d]);
    if (!s.ok()) {
      r->SetError(DISC_INVALID_ARGUMENT,
                  absl::StrCat("alloc_output: output ", i, ": ", s.message()));
      return nullptr;
    }
  }
  std::lock_guard<std::mutex> lock(r->mu);
  Tensor* out = nullptr;
  absl::Status s = r->ctx->allocate_output(i, shape, &out);
  if (!s.ok() || out == nullptr) {
    // Recorded without taking the lock again (we hold it).
    if (r->error_code == DISC_OK) {
      r->error_code = (s.code() == absl::StatusCode::kResourceExhausted ||
                       s.ok())
                          ? DISC_RESOURCE_EXHAUSTED
                          : DISC_INTERNAL;
      r->error_message =
          absl::StrCat("alloc_output: failed to allocate output ", i,
                       " of shape ", shape.DebugString(), ": ",
                       s.ok() ? "allocator returned null" : s.message());
    }
    return nullptr;
  }
  r->output_allocated[i] = true;
  if (out->NumElements() == 0) return nullptr;
  return const_cast<char*>(out->tensor_data().data());
}

void* RalAllocTemp(disc_ral* ral, int64_t bytes) {
  TfRal* r = TfRal::From(ral);
  if (bytes < 0) {
    r->SetError(DISC_INTERNAL,
                absl::StrCat("alloc_temp: negative size ", bytes));
    return nullptr;
  }
  // Always hand out a distinct non-null pointer, even for 0 bytes.
  const int64_t n = std::max<int64_t>(bytes, 1);
  std::lock_guard<std::mutex> lock(r->mu);
  Tensor t;
  absl::Status s;
  if (r->temp_cache == nullptr || !r->temp_cache->Take(n, &t)) {
    s = r->ctx->allocate_temp(tensorflow::DT_INT8, TensorShape({n}), &t);
  }
  char* p = s.ok() ? const_cast<char*>(t.tensor_data().data()) : nullptr;
  if (p == nullptr) {
    if (r->error_code == DISC_OK) {
      r->error_code = DISC_RESOURCE_EXHAUSTED;
      r->error_message = absl::StrCat(
          "alloc_temp: failed to allocate ", bytes, " bytes",
          s.ok() ? std::string() : absl::StrCat(": ", s.message()));
    }
    return nullptr;
  }
  if (reinterpret_cast<uintptr_t>(p) % kTempAlignment != 0) {
    if (r->error_code == DISC_OK) {
      r->error_code = DISC_INTERNAL;
      r->error_message = "alloc_temp: allocator returned memory that is not "
                         "64-byte aligned";
    }
    return nullptr;
  }
  r->temp_bytes += t.TotalBytes();
  r->temp_peak = std::max(r->temp_peak, r->temp_bytes);
  r->temps.push_back(std::move(t));
  return p;
}

void RalFreeTemp(disc_ral* ral, void* ptr) {
  if (ptr == nullptr) return;
  TfRal* r = TfRal::From(ral);
  std::lock_guard<std::mutex> lock(r->mu);
  for (auto it = r->temps.rbegin(); it != r->temps.rend(); ++it) {
    if (it->tensor_data().data() == ptr) {
      const int64_t size = it->TotalBytes();
      r->temp_bytes -= size;
      if (r->temp_cache != nullptr) r->temp_cache->Keep(std::move(*it), size, r->temp_peak);
      r->temps.erase(std::next(it).base());
      return;
    }
  }
  // Unknown pointers are ignored: they are released at the end of the call
  // or were never ours.
}

void RalParallelFor(disc_ral* ral, int64_t total, double cost_per_unit,
                    disc_range_fn fn, void* closure) {
  if (total <= 0 || fn == nullptr) return;
  TfRal* r = TfRal::From(ral);
  profile::LaunchTimer timer(r->profile_key(), &r->launches, "kernel");
  if (r->profiling) timer.detail = absl::StrCat("n=", total, " cost=", cost_per_unit);
  const TaskPool pool = TaskPoolOf(r);
  if (!(cost_per_unit >= 1.0)) cost_per_unit = 1.0;  // also catches NaN
  const double work = static_cast<double>(total) * cost_per_unit;
  if (pool.none() || total == 1 || work < kInlineCostThreshold) {
    fn(closure, 0, total);
    return;
  }
  // Ranges of equal length: up to two per thread, none cheaper than running
  // inline would be.
  const int64_t most = std::min<int64_t>(2 * pool.NumThreads(), total);
  const int64_t tasks =
      std::max<int64_t>(1, std::min<double>(most, std::floor(work / kInlineCostThreshold)));
  const int64_t chunk = (total + tasks - 1) / tasks;
  RunOn(pool, (total + chunk - 1) / chunk, [&](int64_t t) {
    fn(closure, t * chunk, std::min(total, (t + 1) * chunk));
  });
}

// ---- GEMM
//
// Fast path: a GEMM block built for the CPU's ISA (gemm_kernels.h), one row
// block of one product per task on TF's intra-op pool. Fallback (a CPU
// without AVX2/FMA, or DISC_TF_GEMM_ISA=baseline): Eigen tensor contractions
// on the kernel's Eigen ThreadPoolDevice, as TF's own MatMul Eigen path.
// DISC_TF_GEMM_ISA=avx2|baseline caps the choice; without it, DISC_TF_ISA
// (the generated kernels' level: x86-64-v3 = avx2, x86-64 = baseline) does.

using Index = Eigen::DenseIndex;
using ConstMatrix =
    Eigen::TensorMap<Eigen::Tensor<const float, 2, Eigen::RowMajor, Index>>;
using Matrix = Eigen::TensorMap<Eigen::Tensor<float, 2, Eigen::RowMajor, Index>>;

// The GEMM entry points of one ISA (gemm_kernels.h).
struct GemmIsa {
  const char* name = "baseline";  // "avx512", "avx2" or "baseline" (Eigen)
  disc_gemm_block_fn block = nullptr;  // null: the Eigen fallback
  disc_gemm_prepacked_block_fn prepacked = nullptr;
  // prepacked without prefetching B: for a B that stays in L2 between calls.
  disc_gemm_prepacked_block_fn prepacked_resident = nullptr;
  GemmPacker packer;
  // How this ISA's block shares a prepacked product among threads (gemm_split.h).
  PrepackedRows rows = PrepackedRows::kColumnsFirst;
  // prepacked with a column epilogue on registers (ABI 11), and that epilogue as a pass.
  disc_gemm_prepacked_columns_fn prepacked_columns = nullptr;
  disc_gemm_column_pass_fn column_pass = nullptr;
  bool fetch = true;  // prepacked prefetches B (not prepacked_resident)
};

#define DISC_GEMM_ISA_ENTRIES(isa)                                             \
  GemmIsa {                                                                    \
    #isa, &disc_gemm_block_##isa, &disc_gemm_prepacked_block_##isa,           \
        &disc_gemm_prepacked_block_resident_##isa,                             \
        GemmPacker{&disc_gemm_panel_##isa, &disc_gemm_packed_size_##isa,       \
                   &disc_gemm_pack_b_##isa},                                   \
        PrepackedRowsFor(#isa, L2CacheBytes()),                                \
        &disc_gemm_prepacked_block_columns_##isa, &disc_gemm_column_pass_##isa, \
        true,                                                                  \
  }

// The GEMM for this CPU (no block: the Eigen fallback).
// The cap DISC_TF_GEMM_ISA, else DISC_TF_ISA, asks for ("" for none).
std::string GemmIsaCap() {
  const char* gemm = std::getenv("DISC_TF_GEMM_ISA");
  if (gemm != nullptr && *gemm != '\0') return gemm;
  const char* level = std::getenv("DISC_TF_ISA");
  const std::string want = level ? level : "";
  if (want == "x86-64") return "baseline";
  if (want == "x86-64-v3") return "avx2";
  return "";
}

GemmIsa PickGemm() {
  const std::string want = GemmIsaCap();
  if (want == "baseline") return {};
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  const bool avx2 =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512cd") &&
                      __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512vl");
  if (avx512 && want != "avx2") return DISC_GEMM_ISA_ENTRIES(avx512);
  if (avx2) return DISC_GEMM_ISA_ENTRIES(avx2);
#endif
  return {};
}

const GemmIsa& Gemm() {
  static const GemmIsa isa = PickGemm();
  return isa;
}

// The GEMM for one call: where the calling kernel's packed weights stay in L2
// between calls (TfRal::weights_resident), its prepacked block does not prefetch B.
// Counted per GEMM launch that takes it (stats::kResidentWeightGemms).
const GemmIsa& Gemm(const TfRal* r) {
  static const GemmIsa resident = [] {
    GemmIsa isa = Gemm();
    if (isa.prepacked_resident != nullptr) {
      isa.prepacked = isa.prepacked_resident;
      isa.fetch = false;
    }
    return isa;
  }();
  if (!r->weights_resident || resident.prepacked == nullptr) return Gemm();
  stats::Add(stats::kResidentWeightGemms, 1);
  return resident;
}

}  // namespace

// The GEMM this process uses (read by tests through the Python extension).
extern "C" const char* disc_gemm_isa(void) { return Gemm().name; }

namespace {

// C[m x n] = op(A) * op(B), all densely packed row-major.
template <typename Device>
void ContractPacked(const Device& d, int64_t m, int64_t n, int64_t k,
                    const float* a, bool ta, const float* b, bool tb,
                    float* c, bool accumulate) {
  ConstMatrix A(a, ta ? k : m, ta ? m : k);
  ConstMatrix B(b, tb ? n : k, tb ? k : n);
  Matrix C(c, m, n);
  Eigen::array<Eigen::IndexPair<Index>, 1> dims;
  dims[0] = Eigen::IndexPair<Index>(ta ? 0 : 1, tb ? 1 : 0);
  if (accumulate) {
    C.device(d) += A.contract(B, dims);
  } else {
    C.device(d) = A.contract(B, dims);
  }
}

// The fallback with arbitrary row strides (not produced by generated code).
void ContractStrided(int64_t m, int64_t n, int64_t k, const float* a,
                     int64_t lda, bool ta, const float* b, int64_t ldb,
                     bool tb, float* c, int64_t ldc, bool accumulate) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) {
        const float x = ta ? a[p * lda + i] : a[i * lda + p];
        const float y = tb ? b[j * ldb + p] : b[p * ldb + j];
        acc += static_cast<double>(x) * y;
      }
      c[i * ldc + j] = static_cast<float>(acc) + (accumulate ? c[i * ldc + j] : 0.0f);
    }
  }
}

// Where product q's operand starts: q = outer * inner_count + inner.
struct BatchStrides {
  int64_t inner_count, outer, inner;
  int64_t operator()(int64_t q) const {
    return (q / inner_count) * outer + (q % inner_count) * inner;
  }
};

// ABI 11's column_epilogue called as an epilogue: the steps over a block of product q
// of C, with the ISA's vectors where there is a GEMM block (the same results).
void RalColumnEpilogue(void* closure, int64_t q, int64_t i0, int64_t i1, int64_t j0,
                       int64_t j1) {
  const disc_column_epilogue& e = *static_cast<const disc_column_epilogue*>(closure);
  const int64_t first = (q * e.rows + i0) * e.cols + j0;
  const GemmIsa& isa = Gemm();
  if (isa.column_pass != nullptr) {
    isa.column_pass(i1 - i0, j1 - j0, e.c + first, e.cols, &e, e.out + first, j0);
    return;
  }
  for (int64_t i = 0; i < i1 - i0; ++i)
    for (int64_t j = 0; j < j1 - j0; ++j)
      e.out[first + i * e.cols + j] =
          DiscColumnSteps(e, e.c[first + i * e.cols + j], j0 + j, first + i * e.cols + j);
}

// DISC_TF_REGISTER_EPILOGUE=0 (read once per process): column epilogues run as passes
// over each block of C instead (the same results; for tests and measurements).
bool RegisterEpiloguesOn() {
  static const bool on = [] {
    const char* v = std::getenv("DISC_TF_REGISTER_EPILOGUE");
    return v == nullptr || std::string(v) != "0";
  }();
  return on;
}

// Whether the GEMM block can run column epilogue `e` on the registers of a C whose
// row stride is ldc (e's own row length) where they are on: at most DISC_COLUMN_STEPS
// steps, DISC_MATRIX_STEPS of them reading a residual (the block copies that many
// residuals' rows per edge tile).
bool BlockRunsColumns(const GemmIsa& isa, const disc_column_epilogue& e, int64_t ldc) {
  if (isa.prepacked_columns == nullptr || !RegisterEpiloguesOn() || ldc != e.cols ||
      e.steps < 0 || e.steps > DISC_COLUMN_STEPS)
    return false;
  int matrix_steps = 0;
  for (int s = 0; s < e.steps; ++s) matrix_steps += DiscIsMatrixStep(e.step[s].op);
  return matrix_steps <= DISC_MATRIX_STEPS;
}

// The column epilogue `fn` and `closure` describe, when the GEMM block can run it on
// registers for C at c (row stride ldc, products at stride_c, `batch` of them): the
// layout the epilogue indexes C by must be C's. Otherwise null: it runs as an epilogue.
const disc_column_epilogue* OnRegisters(const GemmIsa& isa, disc_gemm_epilogue_fn fn,
                                        void* closure, bool accumulate, int64_t batch,
                                        const float* c, int64_t ldc, BatchStrides stride_c) {
  if (fn != &RalColumnEpilogue || accumulate) return nullptr;
  const auto* e = static_cast<const disc_column_epilogue*>(closure);
  if (e->c != c || !BlockRunsColumns(isa, *e, ldc)) return nullptr;
  for (int64_t q = 1; q < batch; ++q)
    if (stride_c(q) != q * e->rows * e->cols) return nullptr;
  return e;
}

// The consumer fused into a GEMM (ABI 4): called on each finished block of C.
struct GemmEpilogue {
  disc_gemm_epilogue_fn fn = nullptr;
  void* closure = nullptr;
  bool full_rows = false;
  bool accumulate = false;  // C += op(A) op(B) (ABI 4)
  void operator()(int64_t q, int64_t i0, int64_t i1, int64_t j0, int64_t j1) const {
    if (fn != nullptr) fn(closure, q, i0, i1, j0, j1);
  }
};

// The call's constant input holding the `extent` floats from b, or -1 (the first in
// constant_inputs order where several do).
int ConstantInputHolding(TfRal* r, const float* b, int64_t extent) {
  if (r->packed_weights == nullptr) return -1;
  const std::vector<TfRal::ConstantSpan>& spans = r->constant_spans;
  const float* last = b + extent;
  // Spans starting at or before b, latest first, while one of them may still reach.
  auto j = std::upper_bound(spans.begin(), spans.end(), b,
                            [](const float* p, const TfRal::ConstantSpan& s) {
                              return p < s.begin;
                            });
  const TfRal::ConstantSpan* found = nullptr;
  for (; j != spans.begin() && (j - 1)->reach >= last; --j) {
    const TfRal::ConstantSpan& s = *(j - 1);
    if (s.end >= last && (found == nullptr || s.rank < found->rank)) found = &s;
  }
  if (found != nullptr) return found->input;
  for (const TfRal::FoldedSpan& s : r->folded_spans)  // results kept from weights
    if (s.begin <= b && last <= s.end) return s.index;
  return -1;
}

// Runs packing tasks on the call's pool.
TaskRunner PackingRunner(TfRal* r) {
  return [r](int64_t tasks, const std::function<void(int64_t)>& fn) {
    RunOn(TaskPoolOf(r), tasks, fn);
  };
}

// op(B) packed once, when B (k x n, or n x k with tb) lies in one of the
// call's constant inputs; null otherwise (each block then packs its own).
std::shared_ptr<const PackedOperand> PrepackedB(TfRal* r, const GemmIsa& isa, const float* b,
                                                int64_t k, int64_t n, int64_t ldb, bool tb) {
  if (isa.prepacked == nullptr) return nullptr;
  const int64_t extent = tb ? (n - 1) * ldb + k : (k - 1) * ldb + n;  // floats B spans
  const int i = ConstantInputHolding(r, b, extent);
  if (i < 0) return nullptr;
  return r->packed_weights->Get(i, r->ConstantTensor(i), b, k, n, ldb, tb, isa.packer,
                                PackingRunner(r));
}

// op(B) packed once when every product reads the same B (one product, or B's batch
// strides 0) and it lies in a constant input; null otherwise.
std::shared_ptr<const PackedOperand> SharedPrepackedB(TfRal* r, const GemmIsa& isa,
                                                      int64_t batch, BatchStrides stride_b,
                                                      const float* b, int64_t k, int64_t n,
                                                      int64_t ldb, bool tb) {
  if (k <= 0 || n <= 0 || (batch != 1 && (stride_b.outer != 0 || stride_b.inner != 0)))
    return nullptr;
  return PrepackedB(r, isa, b, k, n, ldb, tb);
}

// How each of `batch` products is cut for a pool of `threads`: only when it is big
// and the products are too few to keep the pool busy, by the prepacked rule of the
// ISA when B is packed.
GemmSplit ProductSplit(const GemmIsa& isa, bool packed_b, int64_t batch, int64_t m, int64_t n,
                       int64_t k, int64_t threads, bool full_rows) {
  const double work = static_cast<double>(m) * n * k;
  if (threads <= 1 || work < kSmallGemm || batch >= threads) return {};
  const int64_t per_product = (threads + batch - 1) / batch;
  return packed_b ? ChoosePrepackedSplit(m, n, k, per_product, full_rows, isa.rows)
                  : ChooseGemmSplit(m, n, k, per_product, full_rows);
}

// Columns of C an elementwise epilogue follows the GEMM by, within one block of a
// prepacked product (a multiple of 64, so of every ISA's panel). BERT-small's FFN
// launch with GELU at 300 rows (AVX2, two threads): 0.79-0.84 -> 0.76-0.81 ms, its
// stream 1-2% faster on AVX2 and AVX-512; the recommender tower ties.
constexpr int64_t kEpilogueChunkColumns = 256;

// This core's L2 in bytes, read once (sysconf asks the CPU, a trap in a VM).
int64_t L2Bytes() {
  static const int64_t bytes = L2CacheBytes();
  return bytes;
}

// Rows of C an epilogue follows the GEMM by, within one block of a prepacked product:
// all of them, unless the block's C chunk of `cols` columns would leave half of L2
// before the epilogue reads it back while B's chunk (k x cols) is small beside it (a
// 32nd of L2: each chunk of rows reads B's chunk again). Then as many 6-row tiles as
// fill a quarter of L2: a tall product of a small B (MobileNetV2's 1 x 1 convolutions,
// 50176 x 16 x 96 at 4 x 224 x 224: blocks of 12544 rows, 4.8 MiB of C) otherwise
// wrote its C to memory and read it back for the epilogue. The recommender's
// 1024-row blocks (1 MiB of C, B's chunk 64 x 256 or 512 x 256) stay whole: cut
// by a quarter of L2, its stream ran at 0.87-0.99 of before on the AVX2 block (6
// rounds, Sapphire Rapids; with a codegen change that alone measured 0.97-0.99).
int64_t EpilogueChunkRows(const GemmEpilogue& epilogue, int64_t rows, int64_t cols, int64_t k) {
  if (epilogue.fn == nullptr || cols <= 0) return std::max<int64_t>(rows, 1);
  const int64_t l2_floats = L2Bytes() / static_cast<int64_t>(sizeof(float));
  if (2 * rows * cols <= l2_floats || 32 * k * cols > l2_floats) return std::max<int64_t>(rows, 1);
  return std::max<int64_t>(6, l2_floats / 4 / cols / 6 * 6);
}

// Columns of one product per task when the products of a shared A are cut by columns
// (a multiple of 64, so of every ISA's panel): 6 tasks for BERT's Q, K and V of 256.
constexpr int64_t kSharedAColumnChunk = 128;

// Epilogues of fewer floats of C than this run on the caller alone.
constexpr int64_t kThreadedEpilogueFloats = 16 * 1024;

// Runs a row-wise `epilogue` on all of C (m x n, one product) by blocks of whole rows,
// one per thread, after the product's blocks (ColumnsThenRows).
void EpilogueByRows(const TaskPool& pool, const GemmEpilogue& epilogue, int64_t m, int64_t n) {
  const int64_t threads = pool.NumThreads();
  const RowBlocks rows(m, (m + threads - 1) / threads, 1);
  RunOn(pool, rows.count, [&](int64_t t) { epilogue(0, rows.begin(t), rows.end(t), 0, n); },
        /*inline_only=*/m * n < kThreadedEpilogueFloats);
}

void SgemmImpl(TfRal* r, int64_t batch, int64_t m, int64_t n, int64_t k,
               const float* a, int64_t lda, BatchStrides stride_a, int transpose_a,
               const float* b, int64_t ldb, BatchStrides stride_b, int transpose_b,
               float* c, int64_t ldc, BatchStrides stride_c, GemmEpilogue epilogue = {}) {
  if (batch < 0 || m < 0 || n < 0 || k < 0) {
    r->SetError(DISC_INTERNAL,
                absl::StrCat("sgemm_batched: negative size: batch ", batch,
                             ", m ", m, ", n ", n, ", k ", k));
    return;
  }
  profile::LaunchTimer timer(r->profile_key(), &r->launches, "gemm");
  if (r->profiling) {
    timer.detail = absl::StrCat("batch=", batch, " m=", m, " n=", n, " k=", k,
                                transpose_a ? " ta" : "", transpose_b ? " tb" : "",
                                epilogue.fn ? " +epilogue" : "");
  }
  if (batch == 0 || m == 0 || n == 0) return;
  const bool ta = transpose_a != 0, tb = transpose_b != 0;
  if (k == 0) {
    for (int64_t q = 0; q < batch; ++q) {
      if (!epilogue.accumulate) {
        for (int64_t i = 0; i < m; ++i) std::fill_n(c + stride_c(q) + i * ldc, n, 0.0f);
      }
      epilogue(q, 0, m, 0, n);
    }
    return;
  }
  tensorflow::thread::ThreadPool* pool = IntraOpPool(r->ctx);
  const double work = static_cast<double>(m) * n * k;
  const GemmIsa& isa = Gemm(r);
  const disc_gemm_block_fn block = isa.block;
  if (block != nullptr) {
    // One B for every product: packed once per weight, or per block.
    const std::shared_ptr<const PackedOperand> prepacked =
        SharedPrepackedB(r, isa, batch, stride_b, b, k, n, ldb, tb);
    if (prepacked != nullptr && r->profiling) timer.detail += " prepacked";
    const float* packed_b = prepacked ? prepacked->data.get() : nullptr;
    // Tasks: (product, row block, column block) of C.
    const TaskPool tasks_pool = TaskPoolOf(r);
    // A row-wise epilogue of few rows, or of a large B, follows the whole product
    // (ColumnsThenRows).
    const bool columns_then_rows = packed_b != nullptr && epilogue.fn != nullptr &&
                                   epilogue.full_rows && batch == 1 && work >= kSmallGemm &&
                                   ColumnsThenRows(m, tasks_pool.NumThreads(),
                                                   static_cast<double>(k) * n);
    const GemmEpilogue block_epilogue =
        columns_then_rows ? GemmEpilogue{nullptr, nullptr, false, epilogue.accumulate}
                          : epilogue;
    // A column epilogue runs on each tile of C as the block stores it (ABI 11).
    const disc_column_epilogue* columns =
        packed_b != nullptr
            ? OnRegisters(isa, block_epilogue.fn, block_epilogue.closure,
                          block_epilogue.accumulate, batch, c, ldc, stride_c)
            : nullptr;
    if (columns != nullptr) stats::Add(stats::kRegisterEpilogues, 1);
    const GemmSplit split = ProductSplit(isa, packed_b != nullptr, batch, m, n, k,
                                         tasks_pool.NumThreads(), block_epilogue.full_rows);
    const RowBlocks row_blocks = RowBlocks::Of(split, m);
    const int64_t cols = split.cols(n);
    const int64_t col_blocks = (n + cols - 1) / cols;
    const int64_t blocks = row_blocks.count * col_blocks;
    // Within a block of a prepacked product, the epilogue follows the GEMM by chunks:
    // an elementwise one by chunks of columns, as soon as each is done, while that part
    // of C is still in L2 (a block of one thread's rows is up to 1-2 MiB of C;
    // docs/architecture.md, "Epilogues by chunks"), any other after all of them; and
    // both by chunks of rows where a block's C would leave L2 first. Column chunks
    // start on multiples of 64 (j0 is one), so on every ISA's panels.
    const int64_t step =
        block_epilogue.fn != nullptr && !block_epilogue.full_rows && columns == nullptr
            ? kEpilogueChunkColumns : cols;
    const int64_t block_rows = row_blocks.end(0) - row_blocks.begin(0);
    const int64_t row_step =
        packed_b == nullptr || columns != nullptr
            ? block_rows
            : EpilogueChunkRows(block_epilogue, block_rows, std::min(step, cols), k);
    if (r->profiling) {
      timer.detail += absl::StrCat(" blocks=", row_blocks.count, "x", col_blocks,
                                   columns_then_rows ? " then rows" : "",
                                   columns != nullptr ? " on registers" : "");
      if (row_step < block_rows) {
        absl::StrAppend(&timer.detail, " epilogue by ", row_step, " rows");
      }
    }
    auto task = [=](int64_t t) {
      const int64_t q = t / blocks;
      const int64_t i0 = row_blocks.begin((t % blocks) / col_blocks);
      const int64_t i1 = row_blocks.end((t % blocks) / col_blocks);
      const int64_t j0 = (t % blocks) % col_blocks * cols, j1 = std::min(n, j0 + cols);
      const float* aq = a + stride_a(q) + (ta ? i0 : i0 * lda);
      float* cq = c + stride_c(q) + i0 * ldc + j0;
      if (packed_b == nullptr) {
        const float* bq = b + stride_b(q) + (tb ? j0 * ldb : j0);
        block(i1 - i0, j1 - j0, k, aq, lda, ta, bq, ldb, tb, cq, ldc,
              block_epilogue.accumulate);
        block_epilogue(q, i0, i1, j0, j1);
        return;
      }
      for (int64_t r0 = i0; r0 < i1; r0 += row_step) {
        const int64_t r1 = std::min(i1, r0 + row_step);
        const float* ar = aq + (ta ? r0 - i0 : (r0 - i0) * lda);
        float* cr = cq + (r0 - i0) * ldc;
        for (int64_t c0 = j0; c0 < j1; c0 += step) {
          const int64_t c1 = std::min(j1, c0 + step);
          if (columns != nullptr) {
            float* out = columns->out + (q * columns->rows + r0) * columns->cols + c0;
            isa.prepacked_columns(r1 - r0, c1 - c0, k, ar, lda, ta, packed_b + c0 * k,
                                  cr + (c0 - j0), ldc, columns, out, c0, isa.fetch);
            continue;
          }
          isa.prepacked(r1 - r0, c1 - c0, k, ar, lda, ta, packed_b + c0 * k, cr + (c0 - j0),
                        ldc, block_epilogue.accumulate);
          block_epilogue(q, r0, r1, c0, c1);
        }
      }
    };
    const int64_t tasks = batch * blocks;
    // Small products run on the caller alone: a helper's wake-up costs more.
    RunOn(tasks_pool, tasks, task, /*inline_only=*/work * batch < kSmallGemm);
    if (columns_then_rows) EpilogueByRows(tasks_pool, epilogue, m, n);
    return;
  }
  const bool packed = lda == (ta ? m : k) && ldb == (tb ? k : n) && ldc == n;
  auto one = [=](int64_t q, bool threaded, const Eigen::ThreadPoolDevice* d) {
    const float* aq = a + stride_a(q);
    const float* bq = b + stride_b(q);
    float* cq = c + stride_c(q);
    const bool acc = epilogue.accumulate;
    if (!packed) {
      ContractStrided(m, n, k, aq, lda, ta, bq, ldb, tb, cq, ldc, acc);
    } else if (threaded) {
      ContractPacked(*d, m, n, k, aq, ta, bq, tb, cq, acc);
    } else {
      ContractPacked(Eigen::DefaultDevice(), m, n, k, aq, ta, bq, tb, cq, acc);
    }
  };
  const Eigen::ThreadPoolDevice* device = &r->ctx->eigen_cpu_device();
  if (batch == 1 || pool == nullptr ||
      (work >= kSmallGemm && batch < device->numThreads())) {
    for (int64_t q = 0; q < batch; ++q) {
      one(q, true, device);
      epilogue(q, 0, m, 0, n);
    }
    return;
  }
  // Many (or small) products: one product per task on the intra-op pool.
  const int64_t cost = static_cast<int64_t>(std::min(work * 2.0, 1e15));
  pool->ParallelFor(batch, cost, [&](int64_t begin, int64_t end) {
    for (int64_t q = begin; q < end; ++q) {
      one(q, false, device);
      epilogue(q, 0, m, 0, n);
    }
  });
}

void RalSgemmBatched(disc_ral* ral, int64_t batch, int64_t m, int64_t n,
                     int64_t k, const float* a, int64_t lda, int64_t stride_a,
                     int transpose_a, const float* b, int64_t ldb,
                     int64_t stride_b, int transpose_b, float* c, int64_t ldc,
                     int64_t stride_c) {
  SgemmImpl(TfRal::From(ral), batch, m, n, k, a, lda, {1, stride_a, 0}, transpose_a, b,
            ldb, {1, stride_b, 0}, transpose_b, c, ldc, {1, stride_c, 0});
}

// sgemm_strided and sgemm_epilogue: products q = qo * batch_inner + qi.
void SgemmTwoLevel(TfRal* r, const char* name, int64_t batch_outer, int64_t batch_inner,
                   int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                   int64_t stride_a_outer, int64_t stride_a_inner, int transpose_a,
                   const float* b, int64_t ldb, int64_t stride_b_outer,
                   int64_t stride_b_inner, int transpose_b, float* c, int64_t ldc,
                   int64_t stride_c_outer, int64_t stride_c_inner, GemmEpilogue epilogue) {
  if (batch_outer < 0 || batch_inner < 0) {
    r->SetError(DISC_INTERNAL,
                absl::StrCat(name, ": negative batch ", batch_outer, " x ", batch_inner));
    return;
  }
  if (batch_inner == 0) return;
  SgemmImpl(r, batch_outer * batch_inner, m, n, k, a, lda,
            {batch_inner, stride_a_outer, stride_a_inner}, transpose_a, b, ldb,
            {batch_inner, stride_b_outer, stride_b_inner}, transpose_b, c, ldc,
            {batch_inner, stride_c_outer, stride_c_inner}, epilogue);
}

void RalSgemmStrided(disc_ral* ral, int64_t batch_outer, int64_t batch_inner,
                     int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                     int64_t stride_a_outer, int64_t stride_a_inner, int transpose_a,
                     const float* b, int64_t ldb, int64_t stride_b_outer,
                     int64_t stride_b_inner, int transpose_b, float* c, int64_t ldc,
                     int64_t stride_c_outer, int64_t stride_c_inner) {
  SgemmTwoLevel(TfRal::From(ral), "sgemm_strided", batch_outer, batch_inner, m, n, k, a, lda,
                stride_a_outer, stride_a_inner, transpose_a, b, ldb, stride_b_outer,
                stride_b_inner, transpose_b, c, ldc, stride_c_outer, stride_c_inner, {});
}

void RalSgemmEpilogue(disc_ral* ral, int64_t batch_outer, int64_t batch_inner, int64_t m,
                      int64_t n, int64_t k, const float* a, int64_t lda,
                      int64_t stride_a_outer, int64_t stride_a_inner, int transpose_a,
                      const float* b, int64_t ldb, int64_t stride_b_outer,
                      int64_t stride_b_inner, int transpose_b, float* c, int64_t ldc,
                      int64_t stride_c_outer, int64_t stride_c_inner,
                      disc_gemm_epilogue_fn epilogue, void* closure, int32_t full_rows,
                      int32_t accumulate) {
  SgemmTwoLevel(TfRal::From(ral), "sgemm_epilogue", batch_outer, batch_inner, m, n, k, a, lda,
                stride_a_outer, stride_a_inner, transpose_a, b, ldb, stride_b_outer,
                stride_b_inner, transpose_b, c, ldc, stride_c_outer, stride_c_inner,
                GemmEpilogue{epilogue, closure, full_rows != 0, accumulate != 0});
}

void RalSgemmSharedA(disc_ral* ral, int32_t count, int64_t m, int64_t k, const float* a,
                     int64_t lda, const float* const* b, const int64_t* ldb,
                     const int32_t* transpose_b, const int64_t* n, float* const* c,
                     const int64_t* ldc, disc_gemm_epilogue_fn epilogue_fn, void* closure) {
  TfRal* r = TfRal::From(ral);
  if (count <= 0 || m < 0 || k < 0) {
    r->SetError(DISC_INTERNAL, absl::StrCat("sgemm_shared_a: count ", count, ", m ", m,
                                            ", k ", k));
    return;
  }
  int64_t total_n = 0;
  for (int32_t p = 0; p < count; ++p) {
    if (n[p] < 0) {
      r->SetError(DISC_INTERNAL, absl::StrCat("sgemm_shared_a: negative n ", n[p]));
      return;
    }
    total_n += n[p];
  }
  const GemmEpilogue epilogue{epilogue_fn, closure, true, false};
  const int64_t last_n = n[count - 1];
  const GemmIsa& isa = Gemm(r);
  if (isa.block == nullptr || k == 0) {  // each product on its own, then the epilogue
    for (int32_t p = 0; p < count; ++p)
      SgemmImpl(r, 1, m, n[p], k, a, lda, {1, 0, 0}, 0, b[p], ldb[p], {1, 0, 0},
                transpose_b[p], c[p], ldc[p], {1, 0, 0});
    if (m > 0 && !r->has_error()) epilogue(0, 0, m, 0, last_n);
    return;
  }
  profile::LaunchTimer timer(r->profile_key(), &r->launches, "gemm");
  if (r->profiling) {
    timer.detail = absl::StrCat("shared A: ", count, " products m=", m, " k=", k,
                                " n=", total_n, epilogue_fn ? " +epilogue" : "");
  }
  if (m == 0) return;
  std::vector<std::shared_ptr<const PackedOperand>> packed(count);
  for (int32_t p = 0; p < count; ++p)
    packed[p] = PrepackedB(r, isa, b[p], k, n[p], ldb[p], transpose_b[p] != 0);
  // A B not packed is packed by every block that reads it: no small row blocks then.
  const bool all_packed = std::all_of(packed.begin(), packed.end(),
                                      [](const auto& p) { return p != nullptr; });
  const TaskPool tasks_pool = TaskPoolOf(r);
  const int threads = tasks_pool.NumThreads();
  const double work = static_cast<double>(m) * total_n * k;
  if (all_packed && work >= kSmallGemm &&
      ColumnsThenRows(m, threads, static_cast<double>(k) * total_n)) {
    // Few rows, or a B past the L2 blocks' bound: the threads share the products'
    // columns, kSharedAColumnChunk at a time, and the epilogue follows on whole rows
    // (ColumnsThenRows).
    std::vector<std::pair<int32_t, int64_t>> chunks;  // (product, first column)
    for (int32_t p = 0; p < count; ++p) {
      for (int64_t c0 = 0; c0 < n[p]; c0 += kSharedAColumnChunk) chunks.emplace_back(p, c0);
    }
    if (r->profiling) timer.detail += absl::StrCat(" blocks=1x", chunks.size(), " then rows");
    RunOn(tasks_pool, static_cast<int64_t>(chunks.size()), [&](int64_t t) {
      const auto [p, c0] = chunks[t];
      const int64_t c1 = std::min(n[p], c0 + kSharedAColumnChunk);
      isa.prepacked(m, c1 - c0, k, a, lda, 0, packed[p]->data.get() + c0 * k, c[p] + c0,
                    ldc[p], 0);
    });
    EpilogueByRows(tasks_pool, epilogue, m, last_n);
    return;
  }
  GemmSplit split;
  if (threads > 1 && work >= kSmallGemm)
    split = ChoosePrepackedSplit(m, total_n, k, threads, /*full_rows=*/true,
                                 all_packed ? isa.rows : PrepackedRows::kColumnsFirst);
  const RowBlocks row_blocks = RowBlocks::Of(split, m);
  if (r->profiling) timer.detail += absl::StrCat(" blocks=", row_blocks.count, "x1");
  RunOn(tasks_pool, row_blocks.count, [&](int64_t t) {
    const int64_t i0 = row_blocks.begin(t), i1 = row_blocks.end(t);
    for (int32_t p = 0; p < count; ++p) {
      if (n[p] == 0) continue;
      if (packed[p] != nullptr) {
        isa.prepacked(i1 - i0, n[p], k, a + i0 * lda, lda, 0, packed[p]->data.get(),
                      c[p] + i0 * ldc[p], ldc[p], 0);
      } else {
        isa.block(i1 - i0, n[p], k, a + i0 * lda, lda, 0, b[p], ldb[p], transpose_b[p],
                  c[p] + i0 * ldc[p], ldc[p], 0);
      }
    }
    epilogue(0, i0, i1, 0, last_n);
  }, /*inline_only=*/work < kSmallGemm);
}

void RalSgemmRows(disc_ral* ral, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                  int transpose_a, const float* b, int64_t ldb, int transpose_b, float* c,
                  int64_t ldc, int32_t accumulate) {
  if (m < 0 || n < 0 || k < 0) {
    TfRal::From(ral)->SetError(DISC_INTERNAL, absl::StrCat("sgemm_rows: negative size: m ", m,
                                                           ", n ", n, ", k ", k));
    return;
  }
  if (m == 0 || n == 0) return;
  const disc_gemm_block_fn block = Gemm().block;
  if (block != nullptr) {
    block(m, n, k, a, lda, transpose_a, b, ldb, transpose_b, c, ldc, accumulate);
  } else {
    ContractStrided(m, n, k, a, lda, transpose_a != 0, b, ldb, transpose_b != 0, c, ldc,
                    accumulate != 0);
  }
}

// ---- Single-thread blocks of the scratch-C (ABI 7) and gathered-A (ABI 8) GEMMs

// C (rows x cols, ldc) = op(A) op(B) on this thread: B packed (packed_b, at the
// block's first column), else the ISA's GEMM block, else Eigen (densely stored
// operands) or the strided loop.
void BlockProduct(const GemmIsa& isa, int64_t rows, int64_t cols, int64_t k, const float* a,
                  int64_t lda, bool ta, const float* packed_b, const float* b, int64_t ldb,
                  bool tb, float* c, int64_t ldc) {
  if (k == 0) {
    for (int64_t i = 0; i < rows; ++i) std::fill_n(c + i * ldc, cols, 0.0f);
  } else if (packed_b != nullptr) {
    isa.prepacked(rows, cols, k, a, lda, ta, packed_b, c, ldc, 0);
  } else if (isa.block != nullptr) {
    isa.block(rows, cols, k, a, lda, ta, b, ldb, tb, c, ldc, 0);
  } else if (!ta && lda == k && ldb == (tb ? k : cols) && ldc == cols) {
    ContractPacked(Eigen::DefaultDevice(), rows, cols, k, a, false, b, tb, c, false);
  } else {
    ContractStrided(rows, cols, k, a, lda, ta, b, ldb, tb, c, ldc, false);
  }
}

// ---- GEMMs whose C lives in per-block scratch (ABI 7)

// Floats of one task's block of C (1 MiB): a long sequence's rows of scores are cut
// into blocks of fewer rows so that each stays in L2 while its consumers run.
constexpr int64_t kScratchBlockFloats = 256 * 1024;

// Rows of the sub-blocks a task cuts its block into where a mask bounds the columns
// (ABI 9): a causal mask's rows [i0, i1) need i1 columns, so sub-blocks of 24 rows
// compute about half of an S x S product plus 12 rows' worth.
constexpr int64_t kMaskedBlockRows = 24;

// Rows [i0, i1) of product q under a mask (ABI 9), on this thread: op(B) packed once
// (unless packed_b has it already) into the thread's packing buffer, then for each
// sub-block of kMaskedBlockRows rows the columns cols() asks for into c (row stride
// n) and fn on them. Returns the elements of C not computed, or -1 when out of memory.
int64_t MaskedBlocks(const GemmIsa& isa, int64_t q, int64_t i0, int64_t i1, int64_t n,
                     int64_t k, const float* a, int64_t lda, bool ta, const float* packed_b,
                     const float* b, int64_t ldb, bool tb, float* c, disc_gemm_scratch_fn fn,
                     void* closure, disc_gemm_cols_fn cols) {
  if (packed_b == nullptr && isa.prepacked != nullptr && k > 0) {
    thread_local AlignedBuffer packing;
    float* packed = packing.Reserve(isa.packer.packed_size(k, n));
    if (packed == nullptr) return -1;
    isa.packer.pack_b(k, n, b, ldb, tb, packed);
    packed_b = packed;
  }
  // A packed block's panels but the last are full: it computes whole panels, or to the end.
  const int64_t panel = packed_b != nullptr ? isa.packer.panel() : 1;
  int64_t masked = 0;
  for (int64_t s0 = i0; s0 < i1; s0 += kMaskedBlockRows) {
    const int64_t s1 = std::min(i1, s0 + kMaskedBlockRows);
    const int64_t asked = std::clamp<int64_t>(cols(closure, q, s0, s1), 0, n);
    const int64_t needed = std::min(n, (asked + panel - 1) / panel * panel);
    masked += (s1 - s0) * (n - needed);
    const float* a_rows = a + (ta ? s0 : s0 * lda);
    if (packed_b != nullptr && needed > 0 && k > 0) {
      isa.prepacked_resident(s1 - s0, needed, k, a_rows, lda, ta, packed_b, c, n, 0);
    } else {
      BlockProduct(isa, s1 - s0, needed, k, a_rows, lda, ta, nullptr, b, ldb, tb, c, n);
    }
    fn(closure, q, s0, s1, c, n);
  }
  return masked;
}

void ScratchCGemm(disc_ral* ral, int64_t batch_outer, int64_t batch_inner, int64_t m, int64_t n,
                  int64_t k, const float* a, int64_t lda, int64_t stride_a_outer,
                  int64_t stride_a_inner, int transpose_a, const float* b, int64_t ldb,
                  int64_t stride_b_outer, int64_t stride_b_inner, int transpose_b,
                  disc_gemm_scratch_fn fn, void* closure, disc_gemm_cols_fn cols) {
  TfRal* r = TfRal::From(ral);
  if (batch_outer < 0 || batch_inner < 0 || m < 0 || n < 0 || k < 0 || fn == nullptr) {
    r->SetError(DISC_INTERNAL, absl::StrCat("sgemm_scratch_c: batch ", batch_outer, " x ",
                                            batch_inner, ", m ", m, ", n ", n, ", k ", k));
    return;
  }
  const int64_t batch = batch_outer * batch_inner;
  profile::LaunchTimer timer(r->profile_key(), &r->launches, "gemm");
  if (batch == 0 || m == 0) return;
  const BatchStrides stride_a{std::max<int64_t>(batch_inner, 1), stride_a_outer, stride_a_inner};
  const BatchStrides stride_b{std::max<int64_t>(batch_inner, 1), stride_b_outer, stride_b_inner};
  const bool ta = transpose_a != 0, tb = transpose_b != 0;
  const GemmIsa& isa = Gemm(r);
  const std::shared_ptr<const PackedOperand> prepacked =
      SharedPrepackedB(r, isa, batch, stride_b, b, k, n, ldb, tb);
  const float* packed_b = prepacked ? prepacked->data.get() : nullptr;
  const TaskPool pool = TaskPoolOf(r);
  const double work = static_cast<double>(m) * n * k;
  const int64_t split_rows = ProductSplit(isa, packed_b != nullptr, batch, m, n, k,
                                          pool.NumThreads(), /*full_rows=*/true).rows(m);
  const int64_t rows =
      CapRows(split_rows, std::max<int64_t>(1, kScratchBlockFloats / std::max<int64_t>(n, 1)));
  // One product (a projection and its row-wise epilogue) keeps C whole, as a temp of
  // this launch, where scratch would cost time: with few rows the threads share C's
  // columns first (as sgemm_epilogue does; cutting rows would stream all of B once per
  // thread), and where the 1 MiB blocks are shorter than the split's and B does not
  // stay in L2, each extra block would stream all of B again.
  const bool few_rows = packed_b != nullptr && batch == 1 && n > 0 && work >= kSmallGemm &&
                        ColumnsThenRows(m, pool.NumThreads());
  const bool cut_short = packed_b != nullptr && batch == 1 && rows < split_rows &&
                         k * n * static_cast<int64_t>(sizeof(float)) > L2Bytes() / 2;
  if (few_rows || cut_short) {
    float* c = static_cast<float*>(RalAllocTemp(ral, m * n * static_cast<int64_t>(sizeof(float))));
    if (c == nullptr) return;  // the error is set
    const GemmSplit split =
        ProductSplit(isa, true, 1, m, n, k, pool.NumThreads(), /*full_rows=*/!few_rows);
    const RowBlocks row_blocks = RowBlocks::Of(split, m);
    // whole rows per block unless the epilogue follows on rows of its own
    const int64_t cols = few_rows ? split.cols(n) : n, col_blocks = (n + cols - 1) / cols;
    if (r->profiling) {
      timer.detail = absl::StrCat("batch=1 m=", m, " n=", n, " k=", k, ta ? " ta" : "",
                                  " +C whole prepacked blocks=", row_blocks.count, "x",
                                  col_blocks, few_rows ? " then rows" : "");
    }
    RunOn(pool, row_blocks.count * col_blocks, [&](int64_t t) {
      const int64_t i0 = row_blocks.begin(t / col_blocks), i1 = row_blocks.end(t / col_blocks);
      const int64_t j0 = t % col_blocks * cols, j1 = std::min(n, j0 + cols);
      isa.prepacked(i1 - i0, j1 - j0, k, a + (ta ? i0 : i0 * lda), lda, ta, packed_b + j0 * k,
                    c + i0 * n + j0, n, 0);
      if (!few_rows) fn(closure, 0, i0, i1, c + i0 * n, n);
    });
    if (few_rows) {
      const int64_t threads = pool.NumThreads();
      const RowBlocks by_rows(m, (m + threads - 1) / threads, 1);
      RunOn(pool, by_rows.count, [&](int64_t t) {
        fn(closure, 0, by_rows.begin(t), by_rows.end(t), c + by_rows.begin(t) * n, n);
      }, /*inline_only=*/m * n < kThreadedEpilogueFloats);
    }
    RalFreeTemp(ral, c);
    return;
  }
  const RowBlocks row_blocks(m, rows);
  if (r->profiling) {
    timer.detail = absl::StrCat("batch=", batch, " m=", m, " n=", n, " k=", k,
                                ta ? " ta" : "", tb ? " tb" : "", " +scratch C",
                                cols != nullptr ? " masked columns" : "",
                                packed_b ? " prepacked" : "", " blocks=", row_blocks.count,
                                "x1");
  }
  std::atomic<bool> short_of_memory{false};
  std::atomic<int64_t> masked{0};  // elements of C a mask made needless
  RunOn(pool, batch * row_blocks.count, [&](int64_t t) {
    const int64_t q = t / row_blocks.count;
    const int64_t i0 = row_blocks.begin(t % row_blocks.count);
    const int64_t i1 = row_blocks.end(t % row_blocks.count);
    thread_local AlignedBuffer scratch;
    // under a mask, C is a sub-block of kMaskedBlockRows rows at a time (MaskedBlocks)
    const int64_t c_rows = cols != nullptr ? std::min(i1 - i0, kMaskedBlockRows) : i1 - i0;
    float* c = scratch.Reserve(std::max<int64_t>(1, c_rows * n));
    if (c == nullptr) {
      short_of_memory = true;
      return;
    }
    if (cols != nullptr) {
      const int64_t skipped = MaskedBlocks(isa, q, i0, i1, n, k, a + stride_a(q), lda, ta,
                                           packed_b, b + stride_b(q), ldb, tb, c, fn, closure,
                                           cols);
      if (skipped < 0) short_of_memory = true;
      if (skipped > 0) masked += skipped;
      return;
    }
    BlockProduct(isa, i1 - i0, n, k, a + stride_a(q) + (ta ? i0 : i0 * lda), lda, ta,
                 packed_b, b + stride_b(q), ldb, tb, c, n);
    fn(closure, q, i0, i1, c, n);
  }, /*inline_only=*/work * batch < kSmallGemm);
  if (masked > 0) stats::Add(stats::kMaskedElements, masked);
  if (short_of_memory)
    r->SetError(DISC_RESOURCE_EXHAUSTED, "sgemm_scratch_c: out of memory for a block of C");
}

void RalSgemmScratchC(disc_ral* ral, int64_t batch_outer, int64_t batch_inner, int64_t m,
                      int64_t n, int64_t k, const float* a, int64_t lda, int64_t stride_a_outer,
                      int64_t stride_a_inner, int transpose_a, const float* b, int64_t ldb,
                      int64_t stride_b_outer, int64_t stride_b_inner, int transpose_b,
                      disc_gemm_scratch_fn fn, void* closure) {
  ScratchCGemm(ral, batch_outer, batch_inner, m, n, k, a, lda, stride_a_outer, stride_a_inner,
               transpose_a, b, ldb, stride_b_outer, stride_b_inner, transpose_b, fn, closure,
               nullptr);
}

// ---- ... computing only the columns a mask leaves (ABI 9)

void RalSgemmScratchCCols(disc_ral* ral, int64_t batch_outer, int64_t batch_inner, int64_t m,
                          int64_t n, int64_t k, const float* a, int64_t lda,
                          int64_t stride_a_outer, int64_t stride_a_inner, int transpose_a,
                          const float* b, int64_t ldb, int64_t stride_b_outer,
                          int64_t stride_b_inner, int transpose_b, disc_gemm_scratch_fn fn,
                          void* closure, disc_gemm_cols_fn cols) {
  ScratchCGemm(ral, batch_outer, batch_inner, m, n, k, a, lda, stride_a_outer, stride_a_inner,
               transpose_a, b, ldb, stride_b_outer, stride_b_inner, transpose_b, fn, closure,
               cols);
}

// ---- GEMMs whose A is made per task (ABI 8)

// Floats of one task's rows of A (4 MiB): more rows per task stream B fewer times.
constexpr int64_t kGatheredBlockFloats = 1024 * 1024;

void RalSgemmGatheredA(disc_ral* ral, int64_t m, int64_t n, int64_t k,
                       disc_gemm_gather_fn rows_fn, void* rows_closure, const float* b,
                       int64_t ldb, float* c, int64_t ldc, disc_gemm_epilogue_fn epilogue_fn,
                       void* closure, int32_t full_rows) {
  TfRal* r = TfRal::From(ral);
  if (m < 0 || n < 0 || k < 0 || rows_fn == nullptr) {
    r->SetError(DISC_INTERNAL, absl::StrCat("sgemm_gathered_a: m ", m, ", n ", n, ", k ", k));
    return;
  }
  profile::LaunchTimer timer(r->profile_key(), &r->launches, "gathered");
  if (m == 0 || n == 0) return;
  const GemmIsa& isa = Gemm(r);
  const std::shared_ptr<const PackedOperand> prepacked =
      SharedPrepackedB(r, isa, 1, BatchStrides{1, 0, 0}, b, k, n, ldb, false);
  const float* packed_b = prepacked ? prepacked->data.get() : nullptr;
  const TaskPool pool = TaskPoolOf(r);
  const double work = static_cast<double>(m) * n * k;
  // Whole rows: each task gathers its rows once and streams all of B past them (and
  // without a GEMM block, Eigen wants a dense block of C). Where A is smaller than B
  // and fits one task, columns instead: each task gathers all of A again but streams
  // only its part of B (a 3x3 512 -> 512 conv at 7 x 7: rows took 1.3x as long).
  GemmSplit split = ProductSplit(isa, packed_b != nullptr, 1, m, n, k, pool.NumThreads(),
                                 /*full_rows=*/true);
  // Also where the rows make one block alone (fewer than 16: MobileNetV2's last stage
  // at a 96 x 96 input is 3 x 3 pixels, 9 rows of 960 channels into 320 columns), which
  // left the other threads idle.
  if (full_rows == 0 && isa.block != nullptr && (split.row_blocks > 1 || work >= kSmallGemm) &&
      m < n && m * k <= kGatheredBlockFloats) {
    GemmSplit by_cols;
    by_cols.col_blocks = std::max<int64_t>(1, std::min<int64_t>(pool.NumThreads(), n / 64));
    // Only where every thread gets columns (whole 64-column panels): 96 columns were one
    // block, the launch ran on one thread. Rows there: MobileNetV2's 7 x 8 stage at
    // [1, 98, 118, 3] (56 rows, 64 or 96 columns) 1.15-1.29x faster a launch, the call
    // 1.04x on the AVX2 block, 1.02x on AVX-512 (alternating in one process, 12 rounds).
    // Uneven panels still beat rows at fewer rows (16 x 160: rows were 1.2x slower).
    if (by_cols.col_blocks >= pool.NumThreads()) split = by_cols;
  }
  // A task's rows of A are read once for each panel of B: at most kGatheredBlockFloats
  // of them, or, where B is small (an RGB stem's 27 x 32), as many as keep A and C's
  // rows in L2 (B's traffic no longer matters there; a 4 x 160 x 160 stem in two blocks
  // of 12800 rows, 1.4 + 1.6 MiB, took 1.1x as long as the gathered patches).
  const bool small_b = static_cast<double>(k) * n <= kSmallPackedFloats;
  const int64_t most = small_b ? kScratchBlockFloats / std::max<int64_t>(k + n, 1)
                               : kGatheredBlockFloats / std::max<int64_t>(k, 1);
  const int64_t rows = CapRows(split.rows(m), std::max<int64_t>(1, most));
  const int64_t cols = split.cols(n);
  const RowBlocks row_blocks(m, rows, split.row_align);
  const int64_t col_blocks = (n + cols - 1) / cols;
  if (r->profiling) {
    timer.detail = absl::StrCat("m=", m, " n=", n, " k=", k, " (rows of A per task)",
                                epilogue_fn ? " +epilogue" : "", packed_b ? " prepacked" : "",
                                " blocks=", row_blocks.count, "x", col_blocks);
  }
  const GemmEpilogue epilogue{epilogue_fn, closure, full_rows != 0, false};
  const disc_column_epilogue* columns =
      packed_b != nullptr && k > 0
          ? OnRegisters(isa, epilogue_fn, closure, false, 1, c, ldc, BatchStrides{1, 0, 0})
          : nullptr;
  if (columns != nullptr) {
    stats::Add(stats::kRegisterEpilogues, 1);
    if (r->profiling) timer.detail += " on registers";
  }
  std::atomic<bool> short_of_memory{false};
  RunOn(pool, row_blocks.count * col_blocks, [&](int64_t t) {
    const int64_t i0 = row_blocks.begin(t / col_blocks), i1 = row_blocks.end(t / col_blocks);
    const int64_t j0 = t % col_blocks * cols, j1 = std::min(n, j0 + cols);
    thread_local AlignedBuffer scratch;
    float* a = scratch.Reserve(std::max<int64_t>(1, (i1 - i0) * k));
    if (a == nullptr) {
      short_of_memory = true;
      return;
    }
    rows_fn(rows_closure, i0, i1, a);
    // j0 is a multiple of 64, so of every ISA's panel
    if (columns != nullptr) {
      isa.prepacked_columns(i1 - i0, j1 - j0, k, a, k, 0, packed_b + j0 * k, c + i0 * ldc + j0,
                            ldc, columns, columns->out + i0 * columns->cols + j0, j0,
                            isa.fetch);
      return;
    }
    BlockProduct(isa, i1 - i0, j1 - j0, k, a, k, false,
                 packed_b != nullptr ? packed_b + j0 * k : nullptr, b + j0, ldb, false,
                 c + i0 * ldc + j0, ldc);
    epilogue(0, i0, i1, j0, j1);
  }, /*inline_only=*/work < kSmallGemm);
  if (short_of_memory)
    r->SetError(DISC_RESOURCE_EXHAUSTED, "sgemm_gathered_a: out of memory for a block of A");
}

// ---- GEMMs each reading the last one's result (ABI 12)

// `e` for the rows [i0, i1) of a layer's C that lie at c_rows (row stride n): its c,
// and its out where it is C's place, based so that element (i, j) of C is
// c_rows[(i - i0) * n + j] (a block in scratch, or C itself in memory).
disc_column_epilogue ColumnsAt(const disc_column_epilogue& e, float* c_rows, int64_t i0,
                               int64_t n) {
  disc_column_epilogue moved = e;
  float* base = reinterpret_cast<float*>(reinterpret_cast<uintptr_t>(c_rows) -
                                         static_cast<uintptr_t>(i0 * n) * sizeof(float));
  if (e.out == e.c) moved.out = base;
  moved.c = base;
  return moved;
}

// A layer's `rows` epilogue as an ABI-4 epilogue of whole rows of C at c (row stride n).
struct RowsOnC {
  disc_gemm_scratch_fn fn;
  void* closure;
  float* c;
  int64_t n;
  static void Run(void* p, int64_t q, int64_t i0, int64_t i1, int64_t, int64_t) {
    const RowsOnC& h = *static_cast<const RowsOnC*>(p);
    h.fn(h.closure, q, i0, i1, h.c + i0 * h.n, h.n);
  }
};

// DISC_TF_LAYER_BLOCKS=0 (read once per process): sgemm_layers runs its layers one
// launch each, as without the fusion (the same results; for tests and measurements).
bool LayerBlocksOn() {
  static const bool on = [] {
    const char* v = std::getenv("DISC_TF_LAYER_BLOCKS");
    return v == nullptr || std::string(v) != "0";
  }();
  return on;
}

// The layers one launch each (few rows for the pool: each layer's columns are shared
// among the threads as sgemm_epilogue shares them), a C that is NULL in a temp.
void LayersOneByOne(disc_ral* ral, int64_t m, int64_t k, const float* a, int64_t lda,
                    int32_t count, const disc_gemm_layer* layers) {
  TfRal* r = TfRal::From(ral);
  const float* a_p = a;
  int64_t k_p = k, lda_p = lda;
  float* last_temp = nullptr;  // the temp holding the previous layer's C, if any
  for (int32_t p = 0; p < count && !r->has_error(); ++p) {
    const disc_gemm_layer& layer = layers[p];
    float* c = layer.c;
    float* temp = nullptr;
    if (c == nullptr) {
      temp = static_cast<float*>(
          RalAllocTemp(ral, m * layer.n * static_cast<int64_t>(sizeof(float))));
      if (temp == nullptr) break;  // the error is set
      c = temp;
    }
    disc_column_epilogue columns{};
    RowsOnC rows{layer.rows, layer.closure, c, layer.n};
    GemmEpilogue epilogue;
    if (layer.columns != nullptr) {
      columns = ColumnsAt(*layer.columns, c, 0, layer.n);
      epilogue = GemmEpilogue{&RalColumnEpilogue, &columns, false, false};
    } else if (layer.rows != nullptr) {
      epilogue = GemmEpilogue{&RowsOnC::Run, &rows, true, false};
    }
    SgemmImpl(r, 1, m, layer.n, k_p, a_p, lda_p, {1, 0, 0}, 0, layer.b, layer.ldb, {1, 0, 0},
              layer.transpose_b, c, layer.n, {1, 0, 0}, epilogue);
    if (last_temp != nullptr) RalFreeTemp(ral, last_temp);
    last_temp = temp;
    const bool in_place = layer.result == nullptr;
    a_p = in_place ? (layer.columns != nullptr ? columns.out : c) : layer.result;
    k_p = lda_p = layer.n;
  }
  if (last_temp != nullptr) RalFreeTemp(ral, last_temp);
}

void RalSgemmLayers(disc_ral* ral, int64_t m, int64_t k, const float* a, int64_t lda,
                    int32_t count, const disc_gemm_layer* layers) {
  TfRal* r = TfRal::From(ral);
  bool bad = m < 0 || k < 0 || count < 1 || layers == nullptr;
  for (int32_t p = 0; !bad && p < count; ++p)
    bad = layers[p].n < 0 || (layers[p].rows != nullptr && layers[p].columns != nullptr) ||
          (layers[p].columns != nullptr && layers[p].columns->cols != layers[p].n);
  if (bad) {
    r->SetError(DISC_INTERNAL, absl::StrCat("sgemm_layers: m ", m, ", k ", k, ", count ",
                                            count));
    return;
  }
  if (m == 0) return;
  const TaskPool pool = TaskPoolOf(r);
  const int64_t threads = pool.NumThreads();
  std::vector<int64_t> depth(count);  // each layer's k
  double b_floats = 0;                // every layer's B
  for (int32_t p = 0; p < count; ++p) {
    depth[p] = p == 0 ? k : layers[p - 1].n;
    b_floats += static_cast<double>(depth[p]) * layers[p].n;
  }
  // Too few rows to give every thread blocks of its own, or B too big to stream once a
  // block (each layer alone cuts columns there: BERT-base's 768 x 3072 FFN, whose run
  // by 18-row blocks took 1.03x as long, AVX2 on Zen 3).
  if (ColumnsThenRows(m, threads) || b_floats > kRowBlockMaxPackedFloats || !LayerBlocksOn()) {
    LayersOneByOne(ral, m, k, a, lda, count, layers);
    return;
  }
  const GemmIsa& isa = Gemm(r);  // counted once a GEMM, as one launch each would be
  if (&isa != &Gemm() && count > 1) stats::Add(stats::kResidentWeightGemms, count - 1);
  profile::LaunchTimer timer(r->profile_key(), &r->launches, "layers");
  // Each layer's B packed once where it is a weight, and its scratch.
  std::vector<std::shared_ptr<const PackedOperand>> packed(count);
  std::vector<int64_t> scratch_at(count, -1);
  std::vector<bool> on_registers(count);
  int64_t scratch_row = 0, widest = 1;  // floats of one row of every scratch C
  int64_t registers = 0;                // layers whose epilogue runs on registers
  double work = 0;
  for (int32_t p = 0; p < count; ++p) {
    const disc_gemm_layer& layer = layers[p];
    if (depth[p] > 0 && layer.n > 0) {
      packed[p] = PrepackedB(r, isa, layer.b, depth[p], layer.n, layer.ldb,
                             layer.transpose_b != 0);
    }
    on_registers[p] = layer.columns != nullptr && packed[p] != nullptr &&
                      BlockRunsColumns(isa, *layer.columns, layer.n);
    registers += on_registers[p];
    if (layer.c == nullptr) {
      scratch_at[p] = scratch_row;
      scratch_row += (layer.n + 15) / 16 * 16;  // each C's rows 64-byte aligned
    }
    widest = std::max(widest, layer.n);
    work += static_cast<double>(m) * layer.n * depth[p];
  }
  const RowBlocks row_blocks =
      LayerRowBlocks(m, threads, std::max(widest, scratch_row), L2Bytes());
  if (r->profiling) {
    timer.detail = absl::StrCat("m=", m, " k=", k, " layers=", count, " n=");
    for (int32_t p = 0; p < count; ++p) {
      absl::StrAppend(&timer.detail, p ? "," : "", layers[p].n,
                      layers[p].c == nullptr ? "(scratch)" : "",
                      on_registers[p] ? "(registers)" : "");
    }
    absl::StrAppend(&timer.detail, " blocks=", row_blocks.count);
  }
  if (registers > 0) stats::Add(stats::kRegisterEpilogues, registers);
  stats::Add(stats::kLayerBlocks, 1);
  std::atomic<bool> short_of_memory{false};
  RunOn(pool, row_blocks.count, [&](int64_t t) {
    const int64_t i0 = row_blocks.begin(t), i1 = row_blocks.end(t), rows = i1 - i0;
    thread_local AlignedBuffer scratch;
    float* block = scratch_row > 0 ? scratch.Reserve(rows * scratch_row) : nullptr;
    if (scratch_row > 0 && block == nullptr) {
      short_of_memory = true;
      return;
    }
    const float* a_rows = a + i0 * lda;
    int64_t lda_rows = lda;
    for (int32_t p = 0; p < count; ++p) {
      const disc_gemm_layer& layer = layers[p];
      const int64_t n = layer.n;
      float* c_rows = layer.c != nullptr ? layer.c + i0 * n : block + rows * scratch_at[p];
      disc_column_epilogue columns{};
      if (layer.columns != nullptr) columns = ColumnsAt(*layer.columns, c_rows, i0, n);
      const float* packed_b = packed[p] ? packed[p]->data.get() : nullptr;
      if (n > 0 && on_registers[p]) {
        isa.prepacked_columns(rows, n, depth[p], a_rows, lda_rows, 0, packed_b, c_rows, n,
                              &columns, columns.out + i0 * n, 0, isa.fetch);
      } else if (n > 0) {
        BlockProduct(isa, rows, n, depth[p], a_rows, lda_rows, false, packed_b, layer.b,
                     layer.ldb, layer.transpose_b != 0, c_rows, n);
        if (layer.columns != nullptr) RalColumnEpilogue(&columns, 0, i0, i1, 0, n);
      }
      if (layer.rows != nullptr) layer.rows(layer.closure, 0, i0, i1, c_rows, n);
      a_rows = layer.result != nullptr ? layer.result + i0 * n
               : layer.columns != nullptr ? columns.out + i0 * n : c_rows;
      lda_rows = n;
    }
  }, /*inline_only=*/work < kSmallGemm);
  if (short_of_memory)
    r->SetError(DISC_RESOURCE_EXHAUSTED, "sgemm_layers: out of memory for a block of C");
}

// ---- Conv1D by Winograd F(2, 3), F(4, 3) or F(6, 3) (conv_winograd.h)

// DISC_TF_WINOGRAD (read once per process): "0" runs every Conv1D as the direct
// GEMM over its windows, "2", "4" or "6" takes F(2, 3), F(4, 3) or F(6, 3) wherever
// Winograd runs; unset (or anything else), WinogradOutputsPerUnit chooses.
int WinogradSetting() {
  static const int setting = [] {
    const char* env = std::getenv("DISC_TF_WINOGRAD");
    const std::string value = env == nullptr ? "" : env;
    return value == "0" ? 0 : value == "2" ? 2 : value == "4" ? 4 : value == "6" ? 6 : -1;
  }();
  return setting;
}

// Output columns below which the direct GEMM runs instead (8 pairs): with few rows
// both read their filter once per block, and F(2, 3)'s four G_u are 4/3 of the filter.
constexpr int64_t kWinogradMinOutputs = 15;

// F(m, 3)'s m for a conv of ow output columns; 0: the direct GEMM. F(4, 3) does 3/4
// of F(2, 3)'s multiply-adds through six G_u (twice the filter) where F(2, 3) streams
// four; with the channels cut rather than the rows (ChooseWinogradSplit) it was the
// faster from 64 output columns on, on the AVX-512 and the AVX2 block (at 32 a tie,
// and 1.04x slower on AVX2: bench/CONV.md, "F(4, 3)"). Below that F(2, 3), whose
// rounding is also the smaller (bounds in test_conv_winograd_tiles.py).
constexpr int64_t kWinograd4MinOutputs = 64;
// F(6, 3) does 8/9 of F(4, 3)'s multiply-adds through eight G_u (8/3 of the filter).
// Kernel 9, 256 -> 1024, F(4, 3) / F(6, 3) time: AVX2 block 1.10 / 1.11 / 1.15x at
// T = 200 / 400 / 800, AVX-512 block 1.03 / 1.05 / 1.04x (a tie); both tie at 128 and
// F(6, 3) is slower below (bench/CONV.md, "F(6, 3)").
constexpr int64_t kWinograd6MinOutputs = 128;
int WinogradOutputsPerUnit(int64_t ow) {
  const int setting = WinogradSetting();
  if (setting == 0 || ow < kWinogradMinOutputs) return 0;
  if (setting > 0) return setting;
  return ow >= kWinograd6MinOutputs ? 6 : ow >= kWinograd4MinOutputs ? 4 : 2;
}

// The G_u variants of F(m, 3) in the weight cache: 1-4 for F(2, 3), 11-16 for
// F(4, 3), 21-28 for F(6, 3).
int WinogradVariant(int m, int u) { return (m == 6 ? 21 : m == 4 ? 11 : 1) + u; }

// G_0.. of F(m, 3) for filter w (kw x ci x co, the cluster's constant input
// `input`), packed once; false (parts unset) when packing is off or short of memory.
bool WinogradPackedParts(TfRal* r, const GemmIsa& isa, int input, const float* w, int64_t kw,
                         int64_t ci, int64_t co, int m,
                         std::shared_ptr<const PackedOperand> parts[]) {
  const WinogradConv1D shape{0, ci, co, kw, 0, 0, nullptr, nullptr, m};
  const TaskRunner run = PackingRunner(r);
  for (int u = 0; u < shape.parts(); ++u) {
    parts[u] = r->packed_weights->GetDerived(
        input, r->ConstantTensor(input), w, WinogradVariant(m, u), shape.depth(), co,
        [&](float* g) {  // in ranges of 64 K elements of each tap on the pool
          constexpr int64_t kChunk = 1 << 16;
          const int64_t tap = ci * co;
          run((tap + kChunk - 1) / kChunk, [&](int64_t t) {
            WinogradFilter(w, kw, ci, co, m, u, t * kChunk, std::min(tap, (t + 1) * kChunk), g);
          });
        },
        isa.packer, run);
    if (parts[u] == nullptr) return false;
  }
  return true;
}

int32_t RalConv1dWinograd(disc_ral* ral, int64_t batch, int64_t width, int64_t ci, int64_t co,
                          int64_t kw, int64_t pad, int64_t ow, const float* x, const float* w,
                          float* c, disc_gemm_epilogue_fn epilogue_fn, void* closure,
                          int32_t full_rows) {
  TfRal* r = TfRal::From(ral);
  const GemmIsa& isa = Gemm(r);
  const int setting = WinogradSetting();
  if (isa.prepacked == nullptr || setting == 0 || kw <= 0 || kw % 3 != 0 || batch <= 0 ||
      width < 0 || ci <= 0 || co <= 0 || ow <= 0)
    return 0;
  const int input = ConstantInputHolding(r, w, kw * ci * co);
  if (input < 0) return 0;
  // Every F(m, 3) a call of this filter may take is packed at its first call, whatever
  // that call's width takes (the direct GEMM included), so that one warm-up call at any
  // shape (disc_tf.load's) leaves none for a request to pack.
  const int m = WinogradOutputsPerUnit(ow);
  std::shared_ptr<const PackedOperand> parts[kWinogradMaxParts];
  // This call's variant first (it has the first claim on the packing budget).
  const bool ready = m != 0 && WinogradPackedParts(r, isa, input, w, kw, ci, co, m, parts);
  for (const int variant : {2, 4, 6}) {
    if (variant == m || (setting > 0 && setting != variant)) continue;
    std::shared_ptr<const PackedOperand> unused[kWinogradMaxParts];
    WinogradPackedParts(r, isa, input, w, kw, ci, co, variant, unused);
  }
  // A NaN, infinity or huge input: the GEMM path, whose outputs it reaches as TF's.
  if (!ready || !WinogradInputSafe(x, batch * width * ci)) return 0;
  const WinogradConv1D conv{width, ci, co, kw, pad, ow, x, c, m};
  const int64_t depth = conv.depth();
  const float* packed[kWinogradMaxParts];
  for (int u = 0; u < conv.parts(); ++u) packed[u] = parts[u]->data.get();
  profile::LaunchTimer timer(r->profile_key(), &r->launches,
                             m == 6 ? "winograd6" : m == 4 ? "winograd4" : "winograd2");
  const TaskPool pool = TaskPoolOf(r);
  const int64_t units = conv.units();
  const WinogradSplit split = ChooseWinogradSplit(batch, units, conv.parts(), depth, co,
                                                  pool.NumThreads(), full_rows != 0);
  if (r->profiling) {
    timer.detail = absl::StrCat("F(", m, ",3) batch=", batch, " ow=", ow, " ci=", ci,
                                " co=", co, " kw=", kw, epilogue_fn ? " +epilogue" : "",
                                " tiles=", split.row_tiles, "x", split.col_blocks);
  }
  const GemmEpilogue epilogue{epilogue_fn, closure, full_rows != 0, false};
  const WinogradIsa transforms =
      std::strcmp(isa.name, "avx512") == 0 ? WinogradIsa::kAvx512 : WinogradIsa::kAvx2;
  const int64_t per_image = split.row_tiles * split.col_blocks;
  std::atomic<bool> short_of_memory{false};
  RunOn(pool, batch * per_image, [&](int64_t t) {
    const int64_t n = t / per_image;
    const int64_t u0 = (t % per_image) / split.col_blocks * split.units;
    const int64_t j0 = (t % per_image) % split.col_blocks * split.cols;
    const int64_t u1 = std::min(units, u0 + split.units), j1 = std::min(co, j0 + split.cols);
    float* scratch = WinogradScratch(WinogradScratchFloats(conv, u1 - u0, j1 - j0));
    if (scratch == nullptr) {
      short_of_memory = true;
      return;
    }
    WinogradTile(conv, transforms, packed, isa.prepacked, n, u0, u1, j0, j1, scratch);
    epilogue(n, m * u0, std::min(ow, m * u1), j0, j1);
  });
  if (short_of_memory)
    r->SetError(DISC_RESOURCE_EXHAUSTED, "conv1d_winograd: out of memory for a tile's scratch");
  return 1;
}

void RalSetError(disc_ral* ral, int32_t code, const char* message) {
  TfRal::From(ral)->SetError(code, message ? message : "");
}

}  // namespace

absl::Status DiscErrorToStatus(int32_t code, const std::string& message) {
  switch (code) {
    case DISC_OK:
      return absl::OkStatus();
    case DISC_INVALID_ARGUMENT:
      return absl::InvalidArgumentError(message);
    case DISC_RESOURCE_EXHAUSTED:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

void TfRal::SetConstantInputs(PackedWeights* weights, const std::vector<int>& constants) {
  packed_weights = weights;
  constant_spans.clear();
  constant_input.assign(inputs.size(), 0);
  for (int i : constants)
    if (i >= 0 && i < static_cast<int>(inputs.size())) constant_input[i] = 1;
  for (int rank = 0; rank < static_cast<int>(constants.size()); ++rank) {
    const int i = constants[rank];
    const tensorflow::Tensor& t = inputs[i];
    if (t.dtype() != tensorflow::DT_FLOAT || !t.IsInitialized()) continue;
    const float* base = reinterpret_cast<const float*>(t.tensor_data().data());
    if (base != nullptr)
      constant_spans.push_back({base, base + t.NumElements(), nullptr, i, rank});
  }
  std::sort(constant_spans.begin(), constant_spans.end(),
            [](const ConstantSpan& a, const ConstantSpan& b) { return a.begin < b.begin; });
  const float* reach = nullptr;
  for (ConstantSpan& s : constant_spans) {
    reach = std::max(reach, s.end);
    s.reach = reach;
  }
}

TfRal::TfRal(OpKernelContext* c, std::vector<Tensor> values, std::string cluster)
    : disc_ral{}, ctx(c), inputs(std::move(values)) {
  profiling = profile::Enabled();
  if (profiling) profile_cluster = std::move(cluster);
  abi_version = DISC_RAL_ABI_VERSION;
  num_inputs = static_cast<int32_t>(inputs.size());
  num_outputs = ctx->num_outputs();
  input_rank = &RalInputRank;
  input_dims = &RalInputDims;
  input_dtype = &RalInputDtype;
  input_data = &RalInputData;
  alloc_output = &RalAllocOutput;
  alloc_temp = &RalAllocTemp;
  free_temp = &RalFreeTemp;
  parallel_for = &RalParallelFor;
  set_error = &RalSetError;
  sgemm_batched = &RalSgemmBatched;
  sgemm_strided = &RalSgemmStrided;
  sgemm_epilogue = &RalSgemmEpilogue;
  sgemm_rows = &RalSgemmRows;
  sgemm_shared_a = &RalSgemmSharedA;
  conv1d_winograd = &RalConv1dWinograd;
  sgemm_scratch_c = &RalSgemmScratchC;
  sgemm_gathered_a = &RalSgemmGatheredA;
  sgemm_scratch_c_cols = &RalSgemmScratchCCols;
  fold_begin = &RalFoldBegin;
  fold_done = &RalFoldDone;
  column_epilogue = &RalColumnEpilogue;
  sgemm_layers = &RalSgemmLayers;

  dim_begin.resize(num_inputs + 1);
  int32_t total = 0;
  for (int i = 0; i < num_inputs; ++i) {
    dim_begin[i] = total;
    total += inputs[i].dims();
  }
  dim_begin[num_inputs] = total;
  dims.resize(std::max<int32_t>(total, 1));  // non-null data() even where all are scalars
  for (int i = 0; i < num_inputs; ++i) {
    const TensorShape& s = inputs[i].shape();
    for (int d = 0; d < s.dims(); ++d) dims[dim_begin[i] + d] = s.dim_size(d);
  }
  output_allocated.assign(num_outputs, false);
}

TfRal::~TfRal() { ReleaseTemps(); }

const Tensor& TfRal::ConstantTensor(int i) const {
  if (i < static_cast<int>(inputs.size())) return inputs[i];
  for (const FoldedSpan& s : folded_spans)
    if (s.index == i) return *s.tensor;
  return inputs.at(i);  // never: ConstantInputHolding only names these
}

bool TfRal::has_error() const {
  std::lock_guard<std::mutex> lock(mu);
  return error_code != DISC_OK;
}

absl::Status TfRal::status() const {
  std::lock_guard<std::mutex> lock(mu);
  return DiscErrorToStatus(error_code, error_message);
}

void TfRal::SetError(int32_t code, const std::string& message) {
  std::lock_guard<std::mutex> lock(mu);
  if (error_code != DISC_OK) return;  // keep the first error
  error_code = code == DISC_OK ? DISC_INTERNAL : code;
  error_message = message.empty() ? std::string("unknown error") : message;
}

void TfRal::ReleaseTemps() {
  std::lock_guard<std::mutex> lock(mu);
  if (temp_cache != nullptr) {
    for (Tensor& t : temps) {
      const int64_t size = t.TotalBytes();
      temp_cache->Keep(std::move(t), size, temp_peak);
    }
  }
  temps.clear();
  temp_bytes = 0;
}

}  // namespace disc_tf
