// A fixed list of resource variables behind one handle, for disc_tf.load's direct
// calls.
//
// A DiscCluster op fed N variable handles pays TF's eager runtime for each of them on
// every call (device and resource dtype/shape lookups per input, then one more
// function argument): about 1.7 us a handle on these cores, 0.45 ms a call for
// MobileNetV2's 260 variables. disc_tf.load bundles each cluster's variables once
// (DiscVariableBundle) and feeds the op the bundle; the op reads every variable
// when it runs, as it reads a handle, so assignments after load are seen.
#ifndef DISC_TF_CC_KERNELS_VARIABLE_BUNDLE_H_
#define DISC_TF_CC_KERNELS_VARIABLE_BUNDLE_H_

#include <string>
#include <vector>

#include "tensorflow/core/framework/resource_base.h"
#include "tensorflow/core/framework/resource_var.h"

namespace disc_tf {

// The variables, in the order of the positions the DiscCluster op's `bundled_inputs`
// and `bundled_input_ranges` name. Holds a reference to each (as the variables'
// handles do).
class VariableBundle : public tensorflow::ResourceBase {
 public:
  explicit VariableBundle(std::vector<tensorflow::core::RefCountPtr<tensorflow::Var>> vars)
      : vars_(std::move(vars)) {}

  const std::vector<tensorflow::core::RefCountPtr<tensorflow::Var>>& vars() const {
    return vars_;
  }

  std::string DebugString() const override;

 private:
  const std::vector<tensorflow::core::RefCountPtr<tensorflow::Var>> vars_;
};

}  // namespace disc_tf

#endif  // DISC_TF_CC_KERNELS_VARIABLE_BUNDLE_H_
