// cluster_rebuild.h -- compiles a DiscCluster node's cluster again on this host.
//
// A node whose embedded artifact is not trusted (artifact_trust.h) still
// carries its cluster: the fallback function, the original TF ops. Rebuilding
// hands that function's body to this host's compiler (graph_compiler.h), as the
// TF_DISC_ENABLE graph pass hands it a graph, and turns the rewritten graph
// back into a function with the fallback's signature, whose DiscCluster nodes
// carry artifacts this host built (signed with this user's key) or pending
// keys. The compiler's artifact cache makes a second rebuild of the same
// cluster a lookup.
#ifndef DISC_TF_CC_KERNELS_CLUSTER_REBUILD_H_
#define DISC_TF_CC_KERNELS_CLUSTER_REBUILD_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tensorflow/core/framework/function.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace disc_tf {

struct RebuiltCluster {
  // The base library plus the rebuilt function and the fallbacks it names;
  // instantiate `function` with InstantiateOptions::lib_def = lib.
  std::unique_ptr<tensorflow::FunctionLibraryDefinition> lib;
  std::string function;
};

// Rebuilds the cluster whose fallback function is `fallback` in `base`.
// `input_shapes` gives each argument's shape where the function does not
// (usually: the rank of a first call's inputs, every dim unknown).
absl::Status RebuildCluster(const tensorflow::FunctionLibraryDefinition& base,
                            const std::string& fallback,
                            const std::vector<tensorflow::PartialTensorShape>& input_shapes,
                            RebuiltCluster* out);

}  // namespace disc_tf

#endif  // DISC_TF_CC_KERNELS_CLUSTER_REBUILD_H_
