// cluster_rebuild.cc -- the fallback function, compiled on this host.
#include "cc/kernels/cluster_rebuild.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/kernels/artifact_trust.h"
#include "cc/kernels/graph_compiler.h"
#include "tensorflow/core/common_runtime/function_body.h"
#include "tensorflow/core/common_runtime/function_def_utils.h"
#include "tensorflow/core/common_runtime/graph_constructor.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/function.pb.h"
#include "tensorflow/core/framework/graph.pb.h"
#include "tensorflow/core/framework/graph_to_functiondef.h"
#include "tensorflow/core/framework/node_def.pb.h"
#include "tensorflow/core/framework/tensor_shape.pb.h"
#include "tensorflow/core/graph/graph.h"

namespace disc_tf {

using tensorflow::FunctionDef;
using tensorflow::FunctionLibraryDefinition;
using tensorflow::GraphDef;
using tensorflow::NodeDef;

constexpr char kRebuiltPrefix[] = "disc_rebuilt_";

namespace {

// The fallback's body as a GraphDef with its library; each _Arg of unknown
// rank gets `input_shapes[index]`. `protected_names` are the
// arguments, results and the nodes results read, as the graph pass keeps them.
absl::Status BodyGraph(const FunctionLibraryDefinition& base, const FunctionDef& fdef,
                       const std::vector<tensorflow::PartialTensorShape>& input_shapes,
                       GraphDef* gdef, std::vector<std::string>* protected_names) {
  std::unique_ptr<tensorflow::FunctionBody> body;
  TF_RETURN_IF_ERROR(tensorflow::FunctionDefToBodyHelper(
      fdef, tensorflow::AttrSlice(&fdef.attr()), &base, &body));
  body->graph->ToGraphDef(gdef);
  *gdef->mutable_library() = base.ReachableDefinitions(fdef).ToProto();
  for (NodeDef& nd : *gdef->mutable_node()) {
    if (nd.op() == "_Arg" || nd.op() == "_Retval") protected_names->push_back(nd.name());
    if (nd.op() == "_Retval" && nd.input_size() > 0) {
      const std::string& in = nd.input(0);
      protected_names->push_back(in.substr(0, in.find(':')));
    }
    if (nd.op() != "_Arg") continue;
    auto recorded = nd.attr().find("_output_shapes");
    if (recorded != nd.attr().end() && recorded->second.list().shape_size() == 1 &&
        !recorded->second.list().shape(0).unknown_rank()) {
      continue;  // the function knows the argument's rank
    }
    const int64_t index = nd.attr().at("index").i();
    if (index < 0 || index >= static_cast<int64_t>(input_shapes.size())) continue;
    auto* shapes = (*nd.mutable_attr())["_output_shapes"].mutable_list();
    shapes->clear_shape();
    input_shapes[index].AsProto(shapes->add_shape());
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RebuildCluster(const FunctionLibraryDefinition& base, const std::string& fallback,
                            const std::vector<tensorflow::PartialTensorShape>& input_shapes,
                            RebuiltCluster* out) {
  const FunctionDef* fdef = base.Find(fallback);
  if (fdef == nullptr) {
    return absl::NotFoundError(absl::StrCat("no fallback function '", fallback, "'"));
  }
  GraphDef gdef;
  std::vector<std::string> protected_names;
  TF_RETURN_IF_ERROR(BodyGraph(base, *fdef, input_shapes, &gdef, &protected_names));
  std::string bytes;
  if (!gdef.SerializeToString(&bytes)) return absl::InternalError("cannot serialize the cluster");

  const GraphCompiler compiler = ChooseGraphCompiler();
  std::string result;
  TF_RETURN_IF_ERROR(CompileGraph(compiler, bytes, protected_names, SyncCompile(), &result));
  GraphDef rebuilt;
  if (result.empty()) return absl::FailedPreconditionError("the compiler found nothing to compile");
  if (!rebuilt.ParseFromString(result)) {
    return absl::InternalError("cannot parse the compiler's graph");
  }

  NoteArtifactsBuiltHere(rebuilt);
  auto lib = std::make_unique<FunctionLibraryDefinition>(base);
  for (const FunctionDef& f : rebuilt.library().function()) {
    if (!lib->Contains(f.signature().name())) TF_RETURN_IF_ERROR(lib->AddFunctionDef(f));
  }
  rebuilt.clear_library();
  tensorflow::Graph graph(*lib);
  tensorflow::GraphConstructorOptions opts;
  opts.allow_internal_ops = true;
  opts.add_default_attributes = true;
  TF_RETURN_IF_ERROR(tensorflow::ConvertGraphDefToGraph(opts, std::move(rebuilt), &graph));
  FunctionDef function;
  const std::string name = absl::StrCat(kRebuiltPrefix, fallback);
  TF_RETURN_IF_ERROR(tensorflow::GraphToFunctionDef(graph, name, &function));
  if (lib->Contains(name)) TF_RETURN_IF_ERROR(lib->RemoveFunction(name));
  TF_RETURN_IF_ERROR(lib->AddFunctionDef(function));
  out->lib = std::move(lib);
  out->function = name;
  return absl::OkStatus();
}

}  // namespace disc_tf
