// disc_ral_tf.cc -- the DISC RAL on a TensorFlow OpKernelContext.
#include "cc/ral/disc_ral_tf.h"

#include <algorithm>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/device_base.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/platform/threadpool.h"

namespace disc_tf {

namespace {

using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

// Loops cheaper than this (total * cost_per_unit, in cycles) run inline.
constexpr double kInlineCostThreshold = 20000.0;
constexpr uintptr_t kTempAlignment = 64;

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
  return static_cast<int32_t>(r->dims[i].size());
}

const int64_t* RalInputDims(disc_ral* ral, int32_t i) {
  TfRal* r = TfRal::From(ral);
  if (!CheckInput(r, i, "input_dims")) return nullptr;
  return r->dims[i].data();
}

int32_t RalInputDtype(disc_ral* ral, int32_t i) {
  TfRal* r = TfRal::From(ral);
  if (!CheckInput(r, i, "input_dtype")) return -1;
  return static_cast<int32_t>(r->ctx->input_dtype(i));
}

const void* RalInputData(disc_ral* ral, int32_t i) {
  TfRal* r = TfRal::From(ral);
  if (!CheckInput(r, i, "input_data")) return nullptr;
  const Tensor& t = r->ctx->input(i);
  return t.tensor_data().data();
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
  absl::Status s = r->ctx->allocate_temp(tensorflow::DT_INT8, TensorShape({n}),
                                         &t);
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
  r->temps.push_back(std::move(t));
  return p;
}

void RalFreeTemp(disc_ral* ral, void* ptr) {
  if (ptr == nullptr) return;
  TfRal* r = TfRal::From(ral);
  std::lock_guard<std::mutex> lock(r->mu);
  for (auto it = r->temps.rbegin(); it != r->temps.rend(); ++it) {
    if (it->tensor_data().data() == ptr) {
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
  tensorflow::thread::ThreadPool* pool = nullptr;
  if (r->ctx->device() != nullptr) {
    const tensorflow::DeviceBase::CpuWorkerThreads* workers =
        r->ctx->device()->tensorflow_cpu_worker_threads();
    if (workers != nullptr && workers->num_threads > 1) pool = workers->workers;
  }
  if (!(cost_per_unit >= 1.0)) cost_per_unit = 1.0;  // also catches NaN
  const double work = static_cast<double>(total) * cost_per_unit;
  if (pool == nullptr || total == 1 || work < kInlineCostThreshold) {
    fn(closure, 0, total);
    return;
  }
  const int64_t cost = cost_per_unit > 1e15
                           ? static_cast<int64_t>(1e15)
                           : static_cast<int64_t>(cost_per_unit);
  pool->ParallelFor(total, cost, [fn, closure](int64_t begin, int64_t end) {
    fn(closure, begin, end);
  });
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

TfRal::TfRal(OpKernelContext* c) : ctx(c) {
  abi_version = DISC_RAL_ABI_VERSION;
  num_inputs = ctx->num_inputs();
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

  dims.resize(num_inputs);
  for (int i = 0; i < num_inputs; ++i) {
    const TensorShape& s = ctx->input(i).shape();
    dims[i].resize(s.dims());
    for (int d = 0; d < s.dims(); ++d) dims[i][d] = s.dim_size(d);
  }
  output_allocated.assign(num_outputs, false);
}

TfRal::~TfRal() { ReleaseTemps(); }

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
  temps.clear();
}

}  // namespace disc_tf
