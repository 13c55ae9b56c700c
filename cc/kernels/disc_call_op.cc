// disc_call_op.cc -- DiscCall: a DiscCluster execution named by a number, for
// disc_tf.load's direct calls (disc_tf/direct_call.py).
//
// TF's eager runtime converts, copies and hashes every attribute of an op on
// each execution. A DiscCluster node carries a dozen (output shapes, the
// fallback function, artifact keys...): an op with those attributes and a kernel
// that does nothing took 31 us an execution where one with four took 17 (AVX2,
// 2 cores), while the recommender's call at one row runs its kernels in 25 us.
// So disc_tf.load records each cluster's attributes once, with
// DiscClusterRegister, under a number of this process, and each call executes
// DiscCall with its input and output types, its fallback function and that
// number. A DiscCall kernel builds the DiscCluster kernel of the recorded node
// once and runs it: the same artifact, fallback, weight caches and errors as the
// DiscCluster op.
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cc/kernels/cluster_attrs.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/node_def.pb.h"
#include "tensorflow/core/framework/node_properties.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/lib/strings/proto_serialization.h"

namespace disc_tf {
namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::NodeDef;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;

REGISTER_OP("DiscClusterRegister")
    .Attr("id: int")
    DISC_TF_CLUSTER_ATTRS
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Records a DiscCluster node's attributes (all but `id`, which names them) for
DiscCall. An `id` names one node for the life of the process: recording other
attributes under it fails.
)doc");

REGISTER_OP("DiscCall")
    .Input("inputs: Tin")
    .Output("outputs: Tout")
    .Attr("Tin: list(type) >= 0")
    .Attr("Tout: list(type) >= 0")
    .Attr("id: int")
    .Attr("fallback: func")
    .SetShapeFn(tensorflow::shape_inference::UnknownShape)
    .Doc(R"doc(
Runs the DiscCluster node DiscClusterRegister recorded under `id`, on these
inputs: the same results and errors as that node.

fallback: the node's fallback function. Named here too: TF's eager runtime runs an
  op inside a function whose library holds only the functions its attributes name.
)doc");

// `message`'s bytes with its maps in key order, so that equal messages compare equal.
std::string Deterministic(const google::protobuf::MessageLite& message) {
  std::string bytes;
  tensorflow::SerializeToStringDeterministic(message, &bytes);
  return bytes;
}

// The recorded nodes, by id.
std::mutex& RegistryMutex() {
  static std::mutex* const mu = new std::mutex;
  return *mu;
}

std::map<int64_t, NodeDef>& Registry() {
  static auto* const nodes = new std::map<int64_t, NodeDef>;
  return *nodes;
}

absl::Status Record(int64_t id, NodeDef node) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  auto [it, added] = Registry().emplace(id, node);
  if (!added && Deterministic(it->second) != Deterministic(node)) {
    return absl::AlreadyExistsError(
        absl::StrCat("DiscClusterRegister: id ", id, " already names another node"));
  }
  return absl::OkStatus();
}

absl::Status Lookup(int64_t id, NodeDef* node) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  auto it = Registry().find(id);
  if (it == Registry().end()) {
    return absl::NotFoundError(
        absl::StrCat("DiscCall: no DiscCluster node is recorded under id ", id,
                     " (DiscClusterRegister records one)"));
  }
  *node = it->second;
  return absl::OkStatus();
}

// Records its node at construction, when the runtime first executes it with
// these attributes; executing it does nothing more.
class DiscClusterRegisterOp : public OpKernel {
 public:
  explicit DiscClusterRegisterOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    int64_t id = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("id", &id));
    NodeDef node;
    node.set_op("DiscCluster");
    node.set_name(absl::StrCat("disc_call_", id));
    node.set_device(def().device());
    for (const auto& [name, value] : def().attr()) {
      if (name != "id") (*node.mutable_attr())[name] = value;
    }
    tensorflow::DataTypeVector inputs;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("Tin", &inputs));
    for (size_t i = 0; i < inputs.size(); ++i) node.add_input(absl::StrCat("input_", i));
    OP_REQUIRES_OK(ctx, Record(id, std::move(node)));
  }

  void Compute(OpKernelContext*) override {}
};

// Builds the recorded node's DiscCluster kernel and runs it.
class DiscCallOp : public AsyncOpKernel {
 public:
  explicit DiscCallOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    int64_t id = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("id", &id));
    NodeDef node;
    OP_REQUIRES_OK(ctx, Lookup(id, &node));
    std::shared_ptr<const tensorflow::NodeProperties> props;
    OP_REQUIRES_OK(ctx, tensorflow::NodeProperties::CreateFromNodeDef(
                            std::move(node), tensorflow::OpRegistry::Global(), &props));
    tensorflow::NameAttrList fallback;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("fallback", &fallback));
    const auto recorded = props->node_def.attr().find("fallback");
    OP_REQUIRES(ctx,
                props->input_types == input_types() &&
                    props->output_types == output_types() &&
                    recorded != props->node_def.attr().end() &&
                    Deterministic(recorded->second.func()) == Deterministic(fallback),
                absl::InvalidArgumentError(absl::StrCat(
                    "DiscCall: the input or output types or the fallback function differ "
                    "from those of the node recorded under id ", id)));
    OpKernel* kernel = nullptr;
    OP_REQUIRES_OK(ctx, tensorflow::CreateOpKernel(
                            ctx->device_type(), ctx->device(),
                            ctx->device()->GetAllocator(tensorflow::AllocatorAttributes()),
                            ctx->function_library(), ctx->resource_manager(), props,
                            ctx->graph_def_version(), &kernel));
    cluster_.reset(kernel);
    OP_REQUIRES(ctx, kernel->AsAsync() != nullptr,
                absl::InternalError("DiscCall: the DiscCluster kernel is not asynchronous"));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    cluster_->AsAsync()->ComputeAsync(ctx, std::move(done));
  }

 private:
  std::unique_ptr<OpKernel> cluster_;
};

}  // namespace
}  // namespace disc_tf

namespace tensorflow {
REGISTER_KERNEL_BUILDER(Name("DiscClusterRegister").Device(DEVICE_CPU),
                        ::disc_tf::DiscClusterRegisterOp);
REGISTER_KERNEL_BUILDER(Name("DiscCall").Device(DEVICE_CPU), ::disc_tf::DiscCallOp);
}  // namespace tensorflow
