// cluster_attrs.h -- the attributes of a DiscCluster node, for every op that
// takes them all: DiscCluster itself (disc_cluster_op.cc) and
// DiscClusterRegister (disc_call_op.cc), which records them for DiscCall.
#ifndef DISC_TF_CC_KERNELS_CLUSTER_ATTRS_H_
#define DISC_TF_CC_KERNELS_CLUSTER_ATTRS_H_

// Appended to a REGISTER_OP chain.
#define DISC_TF_CLUSTER_ATTRS                            \
  .Attr("Tin: list(type) >= 0")                          \
      .Attr("Tout: list(type) >= 0")                     \
      .Attr("output_shapes: list(shape) >= 0")           \
      .Attr("artifact: string")                          \
      .Attr("artifact_sha256: string")                   \
      .Attr("artifact_signatures: list(string) = []")    \
      .Attr("fallback: func")                            \
      .Attr("cluster_name: string = ''")                 \
      .Attr("num_kernels: int = 0")                      \
      .Attr("pending_key: string = ''")                  \
      .Attr("constant_inputs: list(int) = []")           \
      .Attr("bundled_inputs: list(int) = []")            \
      .Attr("bundled_input_ranges: list(int) = []")      \
      .Attr("constant_input_ranges: list(int) = []")

#endif  // DISC_TF_CC_KERNELS_CLUSTER_ATTRS_H_
