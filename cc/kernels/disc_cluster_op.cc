// disc_cluster_op.cc -- the DiscCluster op: runs a compiled cluster artifact,
// or the cluster's original ops (the `fallback` function) when the artifact
// is missing, unusable or disabled. An embedded artifact is loaded only when a
// trusted signature vouches for it (artifact_trust.h); otherwise the cluster is
// rebuilt on this host from the fallback function (cluster_rebuild.h), or runs
// the fallback, as the artifact policy says.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "cc/kernels/artifact_loader.h"
#include "cc/kernels/artifact_trust.h"
#include "cc/kernels/cluster_attrs.h"
#include "cc/kernels/cluster_rebuild.h"
#include "cc/kernels/pending_artifacts.h"
#ifdef DISC_TF_GPU
#include "cc/kernels/gpu_runner.h"
#endif
#include "cc/kernels/stats.h"
#include "cc/kernels/variable_bundle.h"
#include "cc/ral/cache_size.h"
#include "cc/ral/disc_ral_tf.h"
#include "cc/ral/launch_profile.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/function.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/tensor_util.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/platform/logging.h"

namespace disc_tf {
namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::AttrSlice;
using tensorflow::FunctionLibraryRuntime;
using tensorflow::NameAttrList;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::PartialTensorShape;
using tensorflow::Tensor;
using tensorflow::Var;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("DiscCluster")
    .Input("inputs: Tin")
    .Output("outputs: Tout")
    DISC_TF_CLUSTER_ATTRS
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      std::vector<PartialTensorShape> shapes;
      TF_RETURN_IF_ERROR(c->GetAttr("output_shapes", &shapes));
      if (static_cast<int>(shapes.size()) != c->num_outputs()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "DiscCluster: output_shapes has ", shapes.size(),
            " entries but the op has ", c->num_outputs(), " outputs"));
      }
      for (int i = 0; i < c->num_outputs(); ++i) {
        ShapeHandle h;
        TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shapes[i], &h));
        c->set_output(i, h);
      }
      return absl::OkStatus();
    })
    .Doc(R"doc(
Runs a compiled DISC cluster.

artifact: the compiled shared object (see disc_ral.h); empty means the
  cluster always runs `fallback`.
artifact_sha256: lowercase hex SHA-256 of `artifact`.
artifact_signatures: signatures of the artifact ("ed25519:<key id>:<hex>" by a
  key the host trusts, "local:<hex>" by this user's own compiler); an artifact
  no signature vouches for is never loaded (see DISC_TF_ARTIFACTS).
fallback: a function with the same inputs and outputs that computes the
  cluster with the original TensorFlow ops.
output_shapes: the static shape (usually with unknown dims) of each output.
pending_key: set when `artifact` is still being compiled in the background:
  calls run `fallback` until the compiler publishes this key, then the
  published artifact.
inputs: the cluster's inputs. A resource input (a variable's handle) stands
  for the variable's value, read when the op runs; graphs feed values through
  ReadVariableOp, disc_tf.load's direct calls feed handles.
bundled_inputs: empty, or the positions (ascending) in the cluster's inputs of
  variables that come from a DiscVariableBundle, fed as the op's last input; the
  op's other inputs fill the remaining positions in order. disc_tf.load's direct
  calls feed one bundle instead of many handles (cc/kernels/variable_bundle.h).
bundled_input_ranges: more of bundled_inputs' positions, as [begin, end) pairs,
  ascending and after them.
constant_input_ranges: more of constant_inputs' positions, as [begin, end) pairs.
  disc_tf.load's direct calls send both lists as runs (MobileNetV2's step: four
  ints instead of 520), as TF's eager runtime converts and copies every attr of
  an op on each call.
)doc");

bool EnvTrue(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return false;
  const std::string s = absl::AsciiStrToLower(v);
  return s == "1" || s == "true" || s == "yes" || s == "on";
}

// True the first time (kind, cluster, artifact) is seen in this process.
bool FirstTime(const char* kind, const std::string& cluster_name, const std::string& sha) {
  static std::mutex* mu = new std::mutex;
  static auto* seen = new std::set<std::string>;
  std::lock_guard<std::mutex> lock(*mu);
  return seen->insert(absl::StrCat(kind, "\n", cluster_name, "\n", sha)).second;
}

// Logs `reason` once per (cluster, artifact) per process.
void WarnOnce(const std::string& cluster_name, const std::string& sha,
              const std::string& reason) {
  if (!FirstTime("fallback", cluster_name, sha)) return;
  LOG(WARNING) << "DiscCluster '" << cluster_name
               << "': falling back to the original TensorFlow ops: " << reason;
}

// Logs once per (cluster, artifact) that the cluster is compiled here instead.
void LogRebuildOnce(const std::string& cluster_name, const std::string& sha,
                    const std::string& reason) {
  if (!FirstTime("rebuild", cluster_name, sha)) return;
  LOG(INFO) << "DiscCluster '" << cluster_name << "': not loading its embedded artifact ("
            << reason << "); compiling the cluster on this host instead";
}

// Cluster inputs a range attr may name: far more than any cluster has (a bound on
// what a malformed attr makes the kernel allocate).
constexpr int32_t kMaxRangeInput = 1 << 20;

// Appends the positions of the [begin, end) pairs `ranges` (attr `attr`) to `out`:
// non-empty, ascending, after out's last, and below `limit`.
absl::Status AppendRanges(const std::string& prefix, const char* attr,
                          const std::vector<int32_t>& ranges, int32_t limit,
                          std::vector<int32_t>* out) {
  if (ranges.size() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, attr, " must hold pairs"));
  }
  for (size_t k = 0; k < ranges.size(); k += 2) {
    const int32_t begin = ranges[k], end = ranges[k + 1];
    const int64_t after = out->empty() ? 0 : int64_t{out->back()} + 1;
    if (begin < after || end <= begin || end > limit) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, attr, " must be ascending, non-empty [begin, end) pairs within [0, ",
          limit, ")"));
    }
    for (int32_t i = begin; i < end; ++i) out->push_back(i);
  }
  return absl::OkStatus();
}

absl::Status WithPrefix(const absl::Status& s, const std::string& prefix) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

class DiscClusterOp : public AsyncOpKernel {
 public:
  explicit DiscClusterOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("output_shapes", &output_shapes_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("artifact_sha256", &sha256_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("fallback", &fallback_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("cluster_name", &cluster_name_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_kernels", &num_kernels_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("pending_key", &pending_key_));
    std::vector<int32_t> constant_inputs;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("constant_inputs", &constant_inputs));
    std::vector<int32_t> bundled, bundled_ranges, constant_ranges;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("bundled_inputs", &bundled));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("bundled_input_ranges", &bundled_ranges));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("constant_input_ranges", &constant_ranges));
    if (cluster_name_.empty()) cluster_name_ = name();
    on_gpu_ = ctx->device_type() == tensorflow::DeviceType(tensorflow::DEVICE_GPU);
    prefix_ = absl::StrCat("DiscCluster '", cluster_name_, "': ");
    OP_REQUIRES_OK(ctx, AppendRanges(prefix_, "bundled_input_ranges", bundled_ranges,
                                     kMaxRangeInput, &bundled));
    num_cluster_inputs_ = num_inputs();
    if (!bundled.empty()) {
      OP_REQUIRES(ctx,
                  num_inputs() >= 1 &&
                      input_type(num_inputs() - 1) == tensorflow::DT_RESOURCE,
                  absl::InvalidArgumentError(absl::StrCat(
                      prefix_, "bundled_inputs needs a bundle handle as the last input")));
      num_cluster_inputs_ = num_inputs() - 1 + static_cast<int>(bundled.size());
      for (size_t k = 0; k < bundled.size(); ++k) {
        OP_REQUIRES(ctx, bundled[k] >= 0 && bundled[k] < num_cluster_inputs_ &&
                             (k == 0 || bundled[k] > bundled[k - 1]),
                    absl::InvalidArgumentError(absl::StrCat(
                        prefix_, "bundled_inputs must be ascending positions below ",
                        num_cluster_inputs_)));
      }
      bundled_inputs_.assign(bundled.begin(), bundled.end());
    }
    OP_REQUIRES(ctx,
                static_cast<int>(output_shapes_.size()) == num_outputs(),
                absl::InvalidArgumentError(absl::StrCat(
                    prefix_, "output_shapes has ", output_shapes_.size(),
                    " entries but the op has ", num_outputs(), " outputs")));
    {
      std::vector<int32_t> runs;  // constant_input_ranges' positions, after the list's
      OP_REQUIRES_OK(ctx, AppendRanges(prefix_, "constant_input_ranges", constant_ranges,
                                       num_cluster_inputs_, &runs));
      constant_inputs.insert(constant_inputs.end(), runs.begin(), runs.end());
    }
    for (int32_t i : constant_inputs) {
      OP_REQUIRES(ctx, i >= 0 && i < num_cluster_inputs_,
                  absl::InvalidArgumentError(absl::StrCat(
                      prefix_, "constant_inputs names input ", i, " of ",
                      num_cluster_inputs_)));
      constant_inputs_.push_back(i);
    }

    if (EnvTrue("DISC_TF_FORCE_FALLBACK")) {
      VLOG(1) << prefix_ << "DISC_TF_FORCE_FALLBACK is set; using fallback";
      fallback_reason_ = "DISC_TF_FORCE_FALLBACK is set";
      pending_key_.clear();
      return;
    }
    std::string artifact;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("artifact", &artifact));
    if (artifact.empty()) {
      VLOG(1) << prefix_ << "no artifact; using fallback";
      fallback_reason_ = "the node carries no compiled artifact";
      return;
    }
    std::vector<std::string> signatures;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("artifact_signatures", &signatures));
    const TrustVerdict trust = MayLoadEmbedded(sha256_, signatures);
    if (!trust.trusted) {  // never dlopen-ed
      stats::Add(stats::kUntrusted, 1);
      if (CurrentArtifactPolicy() == ArtifactPolicy::kFallback) {
        WarnOnce(cluster_name_, sha256_, absl::StrCat("its artifact is not trusted: ",
                                                      trust.reason, " (DISC_TF_ARTIFACTS=fallback)"));
        fallback_reason_ = absl::StrCat("its artifact is not trusted: ", trust.reason);
      } else {
        LogRebuildOnce(cluster_name_, sha256_, trust.reason);
        rebuild_ = true;
        fallback_reason_ = absl::StrCat("its artifact is not trusted (", trust.reason, ")");
      }
      return;
    }
    const LoadedArtifact* loaded = nullptr;
    absl::Status s = LoadArtifact(artifact, sha256_, &loaded);
    if (!s.ok()) {
      WarnOnce(cluster_name_, sha256_, std::string(s.message()));
      fallback_reason_ = absl::StrCat("its artifact did not load: ", s.message());
      return;
    }
    const std::string refused = Refusal(loaded);
    if (!refused.empty()) {
      WarnOnce(cluster_name_, sha256_, refused);
      fallback_reason_ = refused;
      return;
    }
    artifact_.store(loaded, std::memory_order_release);
    pending_key_.clear();
    int64_t kernels = num_kernels_;
    if (kernels <= 0) kernels = loaded->num_kernels();
    stats::NoteCluster(loaded->sha256, kernels);
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    std::vector<Tensor> inputs;
    const LoadedArtifact* artifact = CurrentArtifact();
    // Workers woken now are polling by the first launch, after the inputs are read; only
    // for a call as large as one that ran tasks on them (wake_from_).
    const int64_t elements = artifact != nullptr ? InputElements(ctx) : 0;
    if (artifact != nullptr && elements >= wake_from_.load(std::memory_order_relaxed))
      WakeTaskPool(ctx);
    // The compiled code runs before this returns, so it reads variables in
    // copy-on-read mode under their shared locks, held till then, as TF's
    // ResourceGather does, instead of copying them (an embedding table a call reads
    // a few rows of); the fallback, which finishes later, reads copies.
    std::optional<HeldVariables> held;
    if (artifact != nullptr) held.emplace();
    std::vector<int> sparse_written;  // inputs so read: not constant for the weight cache
    absl::Status s = InputValues(ctx, &inputs, held ? &*held : nullptr, &sparse_written);
    if (!s.ok()) {
      held.reset();
      ctx->SetStatus(WithPrefix(s, prefix_));
      done();
      return;
    }
    if (artifact != nullptr) {
      RunArtifact(ctx, artifact, std::move(inputs), sparse_written, elements);
      held.reset();
      done();
      return;
    }
    if (rebuild_) {
      std::shared_ptr<const RebuiltCluster> rebuilt = Rebuilt(ctx->function_library(), inputs);
      if (rebuilt != nullptr) {
        RunFunction(ctx, rebuilt.get(), std::move(inputs), std::move(done));
        return;
      }
    }
    if (EnvTrue("DISC_TF_STRICT")) {
      ctx->SetStatus(absl::FailedPreconditionError(absl::StrCat(
          prefix_, "strict mode (DISC_TF_STRICT): this call would run the original TF ops "
          "instead of compiled code: ", FallbackReason())));
      done();
      return;
    }
    stats::Add(stats::kFallbacks, 1);
    RunFunction(ctx, nullptr, std::move(inputs), std::move(done));
  }

 private:
  // Why a call runs the fallback function (for strict mode's error).
  std::string FallbackReason() {
    if (rebuild_) {
      std::lock_guard<std::mutex> lock(rebuild_mu_);
      if (!rebuild_error_.empty()) return rebuild_error_;
    }
    if (!pending_key_.empty()) {
      return pending_failed_.load(std::memory_order_relaxed)
                 ? "its background compile failed"
                 : "its artifact is still being compiled in the background "
                   "(DISC_TF_COMPILE_MODE=sync waits for it)";
    }
    return fallback_reason_.empty() ? "no artifact is available" : fallback_reason_;
  }

  // Variables read in place for one call: their references and shared locks (the
  // locks go first: members are destroyed in reverse order).
  struct HeldVariables {
    std::vector<tensorflow::core::RefCountPtr<Var>> vars;
    std::vector<tensorflow::tf_shared_lock> locks;
  };

  // The value of every input: the input itself, or for a resource input the
  // variable's current value, read as ReadVariableOp does (shared lock). The
  // reference held for the call makes a concurrent assignment write a new buffer
  // instead of this one. In copy-on-read mode (a sparse op has touched the
  // variable: scatter updates then write its buffer in place) the value is a copy,
  // or, with `held`, the variable itself: `held` keeps a reference and a shared
  // lock of each such variable (taken once, in address order, as TF's
  // MaybeLockVariableInputMutexesInOrder does, so that two calls cannot wait on
  // each other through queued writers) for the caller to keep while it reads the
  // values; such inputs go into `in_place`: a scatter update may change them in
  // place between calls, so no packed copy of them may be kept.
  absl::Status InputValues(OpKernelContext* ctx, std::vector<Tensor>* values,
                           HeldVariables* held, std::vector<int>* in_place) const {
    const int n = num_cluster_inputs_;
    std::vector<tensorflow::core::RefCountPtr<Var>> vars(n);
    std::vector<int> fed(n);  // the op input feeding each cluster input (-1: the bundle's)
    TF_RETURN_IF_ERROR(BundledVariables(ctx, &vars, &fed));
    for (int i = 0; i < n; ++i) {
      if (fed[i] >= 0 && ctx->input_dtype(fed[i]) == tensorflow::DT_RESOURCE) {
        TF_RETURN_IF_ERROR(tensorflow::LookupResource(
            ctx, tensorflow::HandleFromInput(ctx, fed[i]), &vars[i]));
      }
    }
    std::vector<Var*> in_mode;  // distinct, in copy-on-read mode, by mutex address
    if (held != nullptr) {
      for (const auto& var : vars) {
        if (var && var->copy_on_read_mode.load()) in_mode.push_back(var.get());
      }
      std::sort(in_mode.begin(), in_mode.end(), [](Var* a, Var* b) {
        return std::less<const void*>()(a->mu(), b->mu());
      });
      in_mode.erase(std::unique(in_mode.begin(), in_mode.end()), in_mode.end());
      for (Var* var : in_mode) {
        var->Ref();
        held->vars.emplace_back(var);
        held->locks.emplace_back(*var->mu());
      }
    }
    values->reserve(n);
    for (int i = 0; i < n; ++i) {
      if (!vars[i]) {
        values->push_back(ctx->input(fed[i]));
        continue;
      }
      Var* var = vars[i].get();
      const bool locked = std::find(in_mode.begin(), in_mode.end(), var) != in_mode.end();
      std::optional<tensorflow::tf_shared_lock> lock;
      if (!locked) lock.emplace(*var->mu());
      if (!var->is_initialized) {
        return absl::FailedPreconditionError(absl::StrCat(
            "input ", i, " reads an uninitialized variable"));
      }
      const Tensor& value = *var->tensor();
      // A variable that turned copy-on-read after the locks were taken is copied.
      const bool copy = !locked && var->copy_on_read_mode.load();
      values->push_back(copy ? tensorflow::tensor::DeepCopy(value) : value);
      if (locked) in_place->push_back(i);
    }
    return absl::OkStatus();
  }

  // Fills `fed` with the op input feeding each cluster input, and `vars` at the
  // positions bundled_inputs_ names with the bundle's variables (fed -1).
  absl::Status BundledVariables(OpKernelContext* ctx,
                                std::vector<tensorflow::core::RefCountPtr<Var>>* vars,
                                std::vector<int>* fed) const {
    if (bundled_inputs_.empty()) {
      for (int i = 0; i < num_cluster_inputs_; ++i) (*fed)[i] = i;
      return absl::OkStatus();
    }
    tensorflow::core::RefCountPtr<VariableBundle> bundle;
    TF_RETURN_IF_ERROR(tensorflow::LookupResource(
        ctx, tensorflow::HandleFromInput(ctx, ctx->num_inputs() - 1), &bundle));
    const auto& bundled = bundle->vars();
    if (bundled.size() != bundled_inputs_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the variable bundle holds ", bundled.size(), " variables, bundled_inputs names ",
          bundled_inputs_.size()));
    }
    size_t k = 0;
    int next = 0;  // the next op input not the bundle
    for (int i = 0; i < num_cluster_inputs_; ++i) {
      if (k < bundled_inputs_.size() && bundled_inputs_[k] == i) {
        bundled[k]->Ref();
        (*vars)[i].reset(bundled[k].get());
        (*fed)[i] = -1;
        ++k;
      } else {
        (*fed)[i] = next++;
      }
    }
    return absl::OkStatus();
  }

  // The artifact to run for this call, or null for the fallback. A pending
  // key is looked up until the background compiler has published it.
  const LoadedArtifact* CurrentArtifact() {
    const LoadedArtifact* artifact = artifact_.load(std::memory_order_acquire);
    if (artifact != nullptr || pending_key_.empty() ||
        pending_failed_.load(std::memory_order_relaxed)) {
      return artifact;
    }
    const LoadedArtifact* found = nullptr;
    switch (LookupPending(pending_key_, &found)) {
      case PendingState::kReady: {
        const std::string refused = Refusal(found);
        if (!refused.empty()) {  // compiled for the other device kind
          WarnOnce(cluster_name_, found->sha256, refused);
          pending_failed_.store(true, std::memory_order_relaxed);
          return nullptr;
        }
        artifact_.store(found, std::memory_order_release);
        return found;
      }
      case PendingState::kFailed:
        pending_failed_.store(true, std::memory_order_relaxed);
        return nullptr;
      default:
        return nullptr;
    }
  }

  // Why this kernel cannot run `loaded` (empty if it can): an artifact of the
  // other device kind. (The GPU kernel declares no HostMemory argument, so TF
  // places all its inputs and outputs, int32 ones too, in device memory.)
  std::string Refusal(const LoadedArtifact* loaded) const {
    if (!on_gpu_) {
      return loaded->entry != nullptr ? "" : "a CUDA artifact given to the CPU kernel";
    }
#ifdef DISC_TF_GPU
    return loaded->cuda_entry == nullptr ? "a CPU artifact given to the GPU kernel" : "";
#else
    return "this op library was built without the GPU kernel";
#endif
  }

  // Elements of the call's tensor inputs (a variable or bundle handle counts none): the
  // size that decides whether a call wakes the RAL's workers (wake_from_).
  static int64_t InputElements(OpKernelContext* ctx) {
    int64_t elements = 0;
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      if (ctx->input_dtype(i) != tensorflow::DT_RESOURCE) {
        elements += ctx->input(i).NumElements();
      }
    }
    return elements;
  }

  // Runs the artifact on `inputs` (`elements`: InputElements); the constant inputs but
  // `sparse_written` may keep packed copies across calls.
  void RunArtifact(OpKernelContext* ctx, const LoadedArtifact* artifact,
                   std::vector<Tensor> inputs, const std::vector<int>& sparse_written,
                   int64_t elements) {
    absl::Status s;
    std::vector<int> constants;
    for (int i : constant_inputs_) {
      if (std::find(sparse_written.begin(), sparse_written.end(), i) == sparse_written.end())
        constants.push_back(i);
    }
    {
      // The launch profile's cluster: its name and artifact, so that clusters of one
      // name in different models (each model's first is disc_cluster_0) stay apart.
      TfRal ral(ctx, std::move(inputs),
                profile::Enabled()
                    ? absl::StrCat(cluster_name_, "@", artifact->sha256.substr(0, 8))
                    : std::string());
      if (!on_gpu_) {
        ral.temp_cache = &temp_cache_;
        ral.folded = &folded_;
      }
      if (!constants.empty() && !on_gpu_) {
        ral.SetConstantInputs(&packed_weights_, constants);
        // Weights that fit in half of a core's L2 stay there between calls (the
        // Keras encoder's 0.8 MiB): their GEMMs skip prefetching B, which costs
        // 1-10% there and gains up to 1.5x where B comes from L3 or memory
        // (bench/GEMM.md, "Prefetching packed B"). Decided per kernel: clusters of
        // one model that each fit but together do not still count as resident.
        static const int64_t half_l2 = L2CacheBytes() / 2;
        const int64_t packed = packed_weights_.PackedBytes();
        ral.weights_resident = packed > 0 && packed <= half_l2;
      }
      int32_t rc = 0;
      // The whole disc_entry (host runner and launches) is the profile's call row:
      // what it takes beyond the launches' sum is the host runner's own time.
      int32_t entry_launch = profile::kCallLaunch;
      profile::LaunchTimer entry_timer(ral.profile_key(), &entry_launch, profile::kCallKind);
      if (ral.profiling) entry_timer.detail = "disc_entry: the host runner and its launches";
      try {
#ifdef DISC_TF_GPU
        rc = on_gpu_ ? RunCudaArtifact(ctx, *artifact, &ral) : artifact->entry(ral.ral());
#else
        rc = artifact->entry(ral.ral());
#endif
      } catch (const std::exception& e) {
        ral.SetError(DISC_INTERNAL,
                     absl::StrCat("artifact threw an exception: ", e.what()));
        rc = DISC_INTERNAL;
      } catch (...) {
        ral.SetError(DISC_INTERNAL, "artifact threw an unknown exception");
        rc = DISC_INTERNAL;
      }
      s = ral.status();
      if (ral.scheduled_tasks.load(std::memory_order_relaxed) && !on_gpu_) {
        int64_t from = wake_from_.load(std::memory_order_relaxed);
        while (elements < from &&
               !wake_from_.compare_exchange_weak(from, elements, std::memory_order_relaxed)) {
        }
      }
      if (rc == 0 && artifact->peak_temp_bytes != nullptr) {
        stats::NoteMax(stats::kPeakTempBytes, artifact->peak_temp_bytes());
      }
      if (rc != 0 && s.ok()) {
        s = absl::InternalError(absl::StrCat(
            "disc_entry returned ", rc, " without reporting an error"));
      }
      if (s.ok()) s = CheckOutputs(ctx, ral);
    }  // temps released here
    if (!s.ok()) ctx->SetStatus(WithPrefix(s, prefix_));
  }

  absl::Status CheckOutputs(OpKernelContext* ctx, const TfRal& ral) const {
    for (int i = 0; i < num_outputs(); ++i) {
      const Tensor* t = ctx->mutable_output(i);
      if (!ral.output_allocated[i] || t == nullptr) {
        return absl::InternalError(
            absl::StrCat("the artifact did not produce output ", i));
      }
      const PartialTensorShape& expected = output_shapes_[i];
      if (!expected.IsCompatibleWith(PartialTensorShape(t->shape().dim_sizes()))) {
        return absl::InternalError(absl::StrCat(
            "output ", i, " has shape ", t->shape().DebugString(),
            ", incompatible with the declared ", expected.DebugString()));
      }
    }
    return absl::OkStatus();
  }

  // The cluster rebuilt on this host, building it on the first call (the
  // calls meanwhile wait); null when rebuilding failed (fallback_reason_ says
  // why). The inputs give each argument's rank where the function does not.
  std::shared_ptr<const RebuiltCluster> Rebuilt(FunctionLibraryRuntime* lib,
                                                const std::vector<Tensor>& inputs) {
    std::lock_guard<std::mutex> lock(rebuild_mu_);
    if (rebuilt_ != nullptr || !rebuild_error_.empty()) return rebuilt_;
    absl::Status s;
    auto rebuilt = std::make_shared<RebuiltCluster>();
    if (lib == nullptr || lib->GetFunctionLibraryDefinition() == nullptr) {
      s = absl::FailedPreconditionError("no function library");
    } else {
      std::vector<PartialTensorShape> shapes;
      for (const Tensor& t : inputs) {
        shapes.emplace_back(std::vector<int64_t>(t.dims(), -1));
      }
      s = RebuildCluster(*lib->GetFunctionLibraryDefinition(), fallback_.name(), shapes,
                         rebuilt.get());
    }
    if (!s.ok()) {
      rebuild_error_ = absl::StrCat(
          "its artifact is not trusted and rebuilding it here failed: ", s.message());
      WarnOnce(cluster_name_, sha256_, rebuild_error_);
      return nullptr;
    }
    stats::Add(stats::kRebuilds, 1);
    rebuilt_ = std::move(rebuilt);
    return rebuilt_;
  }

  // The instantiated fallback function (or with `rebuilt`, the rebuilt one)
  // for `lib`, instantiating it once.
  absl::Status GetHandle(FunctionLibraryRuntime* lib, const RebuiltCluster* rebuilt,
                         FunctionLibraryRuntime::Handle* handle) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& handles = rebuilt != nullptr ? rebuilt_handles_ : handles_;
    auto it = handles.find(lib);
    if (it != handles.end()) {
      *handle = it->second;
      return absl::OkStatus();
    }
    if (rebuilt != nullptr) {
      FunctionLibraryRuntime::InstantiateOptions options;
      options.lib_def = rebuilt->lib.get();
      TF_RETURN_IF_ERROR(lib->Instantiate(rebuilt->function, AttrSlice(), options, handle));
    } else {
      TF_RETURN_IF_ERROR(lib->Instantiate(
          fallback_.name(), AttrSlice(&fallback_.attr()), handle));
    }
    handles.emplace(lib, *handle);
    return absl::OkStatus();
  }

  // Runs the fallback function, or the cluster rebuilt here when `rebuilt`.
  void RunFunction(OpKernelContext* ctx, const RebuiltCluster* rebuilt,
                   std::vector<Tensor> inputs, DoneCallback done) {
    FunctionLibraryRuntime* lib = ctx->function_library();
    if (lib == nullptr) {
      ctx->SetStatus(absl::InternalError(absl::StrCat(
          prefix_, "no function library to run the fallback function")));
      done();
      return;
    }
    FunctionLibraryRuntime::Handle handle;
    absl::Status s = GetHandle(lib, rebuilt, &handle);
    if (!s.ok()) {
      ctx->SetStatus(WithPrefix(
          s, absl::StrCat(prefix_, "instantiating function '",
                          rebuilt != nullptr ? rebuilt->function : fallback_.name(), "': ")));
      done();
      return;
    }

    // Everything the asynchronous call refers to lives until it completes.
    struct CallState {
      FunctionLibraryRuntime::Options opts;
      std::vector<Tensor> args;
      std::vector<Tensor> rets;
    };
    auto* state = new CallState;
    state->opts.rendezvous = ctx->rendezvous();
    state->opts.cancellation_manager = ctx->cancellation_manager();
    state->opts.collective_executor = ctx->collective_executor();
    state->opts.step_container = ctx->step_container();
    state->opts.runner = ctx->runner();
    state->opts.run_all_kernels_inline = ctx->run_all_kernels_inline();
    state->opts.coordination_service_agent = ctx->coordination_service_agent();
    state->args = std::move(inputs);
    lib->Run(state->opts, handle, state->args, &state->rets,
             [this, ctx, state, done = std::move(done)](const absl::Status& st) {
               std::unique_ptr<CallState> owned(state);
               if (!st.ok()) {
                 ctx->SetStatus(st);
               } else {
                 ctx->SetStatus(SetFallbackOutputs(ctx, owned->rets));
               }
               done();
             });
  }

  absl::Status SetFallbackOutputs(OpKernelContext* ctx,
                                  const std::vector<Tensor>& rets) const {
    if (static_cast<int>(rets.size()) != num_outputs()) {
      return absl::InternalError(absl::StrCat(
          prefix_, "fallback function returned ", rets.size(),
          " values, expected ", num_outputs()));
    }
    for (int i = 0; i < num_outputs(); ++i) {
      if (rets[i].dtype() != output_type(i)) {
        return absl::InternalError(absl::StrCat(
            prefix_, "fallback output ", i, " has type ",
            tensorflow::DataTypeString(rets[i].dtype()), ", expected ",
            tensorflow::DataTypeString(output_type(i))));
      }
      ctx->set_output(i, rets[i]);
    }
    return absl::OkStatus();
  }

  std::vector<PartialTensorShape> output_shapes_;
  std::string sha256_;
  NameAttrList fallback_;
  std::string fallback_reason_;  // set when the constructor settles on the fallback
  std::string cluster_name_;
  int64_t num_kernels_ = 0;
  std::string prefix_;
  std::string pending_key_;  // empty unless compiled in the background
  // Inputs that hold weights (Const or ReadVariableOp outputs) and the GEMM
  // operands packed from them, reused across calls (cc/ral/packed_weights.h).
  std::vector<int> constant_inputs_;
  // Cluster inputs (positions) read from the variable bundle fed last, and how many
  // inputs the cluster has (the op's own count less the bundle plus those).
  std::vector<int> bundled_inputs_;
  int num_cluster_inputs_ = 0;
  PackedWeights packed_weights_;
  // Small temporaries its calls freed, kept for later allocations (cc/ral/temp_cache.h).
  TempCache temp_cache_;
  // Results of its weight-only kernels, kept across calls (cc/ral/folded_values.h).
  FoldedValues folded_;
  std::atomic<const LoadedArtifact*> artifact_{nullptr};  // null => fallback
  std::atomic<bool> pending_failed_{false};
  // The fewest input elements (InputElements) of a call that ran tasks on the RAL's
  // workers: a call of as many or more wakes them first (WakeTaskPool). A call that
  // runs every launch on its own thread (the recommender at one row) then never wakes a
  // worker it would not use: the wake is a futex syscall on the caller's thread, about
  // a tenth of such a call.
  std::atomic<int64_t> wake_from_{std::numeric_limits<int64_t>::max()};
  bool on_gpu_ = false;  // the GPU kernel: runs CUDA artifacts on TF's stream

  // Set when the embedded artifact is not trusted and the policy rebuilds it.
  bool rebuild_ = false;
  std::mutex rebuild_mu_;
  std::shared_ptr<const RebuiltCluster> rebuilt_;  // guarded by rebuild_mu_
  std::string rebuild_error_;                      // guarded by rebuild_mu_; set on failure

  std::mutex mu_;
  std::map<FunctionLibraryRuntime*, FunctionLibraryRuntime::Handle> handles_;
  std::map<FunctionLibraryRuntime*, FunctionLibraryRuntime::Handle> rebuilt_handles_;
};

}  // namespace
}  // namespace disc_tf

namespace tensorflow {
REGISTER_KERNEL_BUILDER(Name("DiscCluster").Device(DEVICE_CPU),
                        ::disc_tf::DiscClusterOp);
#ifdef DISC_TF_GPU
// Built where CUDA headers exist (the driver and cuBLAS are loaded with dlopen at
// run time, so the library links and loads without them).
REGISTER_KERNEL_BUILDER(Name("DiscCluster").Device(DEVICE_GPU),
                        ::disc_tf::DiscClusterOp);
#endif
}  // namespace tensorflow
