// DiscVariableBundle: N variable handles -> one handle to a VariableBundle.
#include "cc/kernels/variable_bundle.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_handle.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"

namespace disc_tf {

std::string VariableBundle::DebugString() const {
  return absl::StrCat("disc_tf VariableBundle of ", vars_.size(), " variables");
}

namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::Var;

REGISTER_OP("DiscVariableBundle")
    .Input("handles: N * resource")
    .Output("bundle: resource")
    .Attr("N: int >= 1")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
One handle to a fixed list of resource variables, for a DiscCluster op's
`bundled_inputs` or `bundled_input_ranges` (disc_tf.load's direct calls). The
bundle keeps a reference to each variable; the DiscCluster op reads their values
when it runs.

handles: the variables' handles; each must name an existing variable.
)doc");

class DiscVariableBundleOp : public OpKernel {
 public:
  explicit DiscVariableBundleOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    std::vector<tensorflow::core::RefCountPtr<Var>> vars(ctx->num_inputs());
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      OP_REQUIRES_OK(ctx, tensorflow::LookupResource(
                              ctx, tensorflow::HandleFromInput(ctx, i), &vars[i]));
    }
    Tensor* out = nullptr;
    tensorflow::AllocatorAttributes host;
    host.set_on_host(true);
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tensorflow::TensorShape({}), &out, host));
    // The handle owns the bundle: it lives as long as a tensor holding the handle.
    out->scalar<tensorflow::ResourceHandle>()() =
        tensorflow::ResourceHandle::MakeRefCountingHandle(
            new VariableBundle(std::move(vars)), ctx->device()->name());
  }
};

}  // namespace
}  // namespace disc_tf

namespace tensorflow {
REGISTER_KERNEL_BUILDER(Name("DiscVariableBundle").Device(DEVICE_CPU),
                        ::disc_tf::DiscVariableBundleOp);
}  // namespace tensorflow
