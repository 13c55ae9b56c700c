// graph_pass.cc -- clusters graphs as TensorFlow builds them for execution.
//
// A GraphOptimizationPass at POST_REWRITE_FOR_EXEC (after placement and the
// feed/fetch rewrite) that, when TF_DISC_ENABLE=1, hands each graph to the
// host's compiler (graph_compiler.h: disc_tf in-process, or a subprocess where
// there is no Python) and, if that returns a rewritten GraphDef (DiscCluster
// nodes + fallback functions), swaps it in. Any failure leaves the graph as it
// was: this pass never fails the user's graph. DISC_TF_COMPILE_MODE=sync
// compiles before the graph runs; async (the default) rewrites the graph at
// once and switches each cluster to its artifact when it is built.

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cc/kernels/graph_compiler.h"
#include "tensorflow/core/common_runtime/graph_constructor.h"
#include "tensorflow/core/common_runtime/optimization_registry.h"
#include "tensorflow/core/common_runtime/placer.h"
#include "tensorflow/core/framework/function.h"
#include "tensorflow/core/framework/function.pb.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/graph.pb.h"
#include "tensorflow/core/framework/tensor_shape.pb.h"
#include "tensorflow/core/graph/graph.h"
#include "tensorflow/core/platform/logging.h"

namespace disc_tf {
namespace {

using tensorflow::FunctionDef;
using tensorflow::FunctionLibraryDefinition;
using tensorflow::Graph;
using tensorflow::GraphDef;
using tensorflow::GraphOptimizationPass;
using tensorflow::GraphOptimizationPassOptions;
using tensorflow::Node;

constexpr char kDiscOp[] = "DiscCluster";
constexpr char kFallbackPrefix[] = "disc_fallback_";

bool Enabled() {
  const char* v = std::getenv("TF_DISC_ENABLE");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

// Logs the first failure at WARNING, the rest at VLOG(1).
void LogFailure(const std::string& what) {
  static std::atomic<bool> logged{false};
  if (!logged.exchange(true)) {
    LOG(WARNING) << "disc_tf graph pass left a graph unchanged: " << what;
  } else {
    VLOG(1) << "disc_tf graph pass left a graph unchanged: " << what;
  }
}

// Ops that are bookkeeping rather than computation.
bool IsStructural(const Node* n) {
  const std::string& op = n->type_string();
  return op == "_Arg" || op == "_Retval" || op == "_Send" || op == "_Recv" ||
         op == "_HostSend" || op == "_HostRecv" || op == "Placeholder" ||
         op == "PlaceholderWithDefault" || op == "NoOp" || op == "Const" ||
         op == "Identity" || op == "IdentityN" || op == "_DeviceArg" ||
         op == "_DeviceRetval";
}

// Ops no cluster takes: checkpoint and variable plumbing. A graph of nothing
// else (the restore and save graphs every SavedModel load runs) is not worth a
// compiler call, which in a host without Python is a process start.
bool NeverClustered(const Node* n) {
  static const auto* ops = new std::set<std::string>{
      "RestoreV2", "SaveV2", "MergeV2Checkpoints", "ShardedFilename", "StringJoin",
      "StaticRegexFullMatch", "VarHandleOp", "AssignVariableOp", "VarIsInitializedOp",
      "DestroyResourceOp", "ReadVariableOp"};
  return ops->count(n->type_string()) != 0;
}

bool IsBoundary(const Node* n) {
  const std::string& op = n->type_string();
  return op == "_Arg" || op == "_Retval" || op == "_Send" || op == "_Recv" ||
         op == "_HostSend" || op == "_HostRecv" || op == "Placeholder" ||
         op == "PlaceholderWithDefault" || op == "_DeviceArg" ||
         op == "_DeviceRetval";
}

thread_local bool in_pass = false;

// Session graphs: the feed rewrite replaces each fed Placeholder by an _Arg
// named "_arg_<placeholder>_<output>_<index>" that carries no shape. The shapes
// are recorded from the placed full graph (POST_PLACEMENT), per session.
using ShapeMap = std::map<std::string, tensorflow::TensorShapeProto>;

std::mutex& ShapesMu() {
  static auto* mu = new std::mutex;
  return *mu;
}

std::map<const void*, ShapeMap>& SessionShapes() {
  static auto* m = new std::map<const void*, ShapeMap>;
  return *m;
}

class RecordPlaceholderShapesPass : public GraphOptimizationPass {
 public:
  absl::Status Run(const GraphOptimizationPassOptions& options) override {
    if (!Enabled() || options.is_function_graph || options.session_options == nullptr ||
        options.graph == nullptr || *options.graph == nullptr) {
      return absl::OkStatus();
    }
    ShapeMap shapes;
    for (Node* n : (*options.graph)->op_nodes()) {
      if (n->type_string() != "Placeholder") continue;
      auto it = n->def().attr().find("shape");
      if (it != n->def().attr().end() && it->second.has_shape()) {
        shapes[n->name()] = it->second.shape();
      }
    }
    std::lock_guard<std::mutex> lock(ShapesMu());
    SessionShapes()[options.session_options] = std::move(shapes);
    return absl::OkStatus();
  }
};

// Adds `_output_shapes` to the shapeless _Arg nodes of a session graph.
void AnnotateSessionArgs(const GraphOptimizationPassOptions& options, GraphDef* gdef) {
  if (options.is_function_graph || options.session_options == nullptr) return;
  std::lock_guard<std::mutex> lock(ShapesMu());
  auto found = SessionShapes().find(options.session_options);
  if (found == SessionShapes().end()) return;
  const ShapeMap& shapes = found->second;
  for (tensorflow::NodeDef& nd : *gdef->mutable_node()) {
    if (nd.op() != "_Arg" || nd.attr().count("_output_shapes") != 0) continue;
    const std::string& name = nd.name();
    if (!absl::StartsWith(name, "_arg_")) continue;
    // "_arg_" + placeholder + "_0_" + arg index: strip the index, then "_0".
    size_t last = name.rfind('_');
    if (last == std::string::npos || last < 5) continue;
    std::string stem = name.substr(5, last - 5);
    if (!absl::EndsWith(stem, "_0")) continue;
    auto it = shapes.find(stem.substr(0, stem.size() - 2));
    if (it == shapes.end()) continue;
    *(*nd.mutable_attr())["_output_shapes"].mutable_list()->add_shape() = it->second;
  }
}

class DiscClusterPass : public GraphOptimizationPass {
 public:
  absl::Status Run(const GraphOptimizationPassOptions& options) override {
    if (!Enabled() || in_pass || options.graph == nullptr || *options.graph == nullptr) {
      return absl::OkStatus();
    }
    if (options.function_def != nullptr &&
        absl::StartsWith(options.function_def->signature().name(), kFallbackPrefix)) {
      return absl::OkStatus();
    }
    const GraphCompiler compiler = ChooseGraphCompiler();
    if (compiler == GraphCompiler::kNone) return absl::OkStatus();
    in_pass = true;
    Optimize(options, compiler);
    in_pass = false;
    return absl::OkStatus();
  }

 private:
  static void Optimize(const GraphOptimizationPassOptions& options, GraphCompiler compiler) {
    Graph* graph = options.graph->get();
    int compute_ops = 0;
    std::vector<std::string> protected_names;
    for (Node* n : graph->op_nodes()) {
      if (n->type_string() == kDiscOp) return;  // already optimized
      if (absl::StartsWith(n->type_string(), kFallbackPrefix)) return;
      if (!IsStructural(n) && !NeverClustered(n)) ++compute_ops;
      if (IsBoundary(n)) {
        protected_names.push_back(n->name());
        if (n->type_string() == "_Retval" || n->type_string() == "_Send" ||
            n->type_string() == "_HostSend" || n->type_string() == "_DeviceRetval") {
          for (const tensorflow::Edge* e : n->in_edges()) {
            if (e->src()->IsOp()) protected_names.push_back(e->src()->name());
          }
        }
      }
    }
    if (compute_ops < 2) return;

    GraphDef gdef;
    graph->ToGraphDef(&gdef, /*include_flib_def=*/false);
    const FunctionLibraryDefinition& flib =
        options.flib_def != nullptr ? *options.flib_def : graph->flib_def();
    *gdef.mutable_library() = flib.ReachableDefinitions(gdef).ToProto();
    AnnotateSessionArgs(options, &gdef);
    std::string bytes;
    if (!gdef.SerializeToString(&bytes)) {
      LogFailure("cannot serialize the graph");
      return;
    }
    std::string result;
    absl::Status compiled = CompileGraph(compiler, bytes, protected_names, SyncCompile(), &result);
    if (!compiled.ok()) {
      LogFailure(std::string(compiled.message()));
      return;
    }
    if (result.empty()) return;  // nothing to compile
    GraphDef new_gdef;
    if (!new_gdef.ParseFromString(result)) {
      LogFailure("cannot parse the optimized graph");
      return;
    }
    NoteArtifactsBuiltHere(new_gdef);
    absl::Status s = Install(options, std::move(new_gdef));
    if (!s.ok()) LogFailure(std::string(s.message()));
  }

  // Adds the new functions and swaps the rebuilt graph into options.graph.
  static absl::Status Install(const GraphOptimizationPassOptions& options, GraphDef gdef) {
    Graph* old_graph = options.graph->get();
    tensorflow::FunctionDefLibrary new_functions;
    for (const FunctionDef& fdef : gdef.library().function()) {
      const std::string& name = fdef.signature().name();
      bool known = old_graph->flib_def().Contains(name) ||
                   (options.flib_def != nullptr && options.flib_def->Contains(name));
      if (!known) *new_functions.add_function() = fdef;
    }
    gdef.clear_library();

    auto new_graph = std::make_unique<Graph>(old_graph->flib_def());
    TF_RETURN_IF_ERROR(new_graph->AddFunctionLibrary(new_functions));
    tensorflow::GraphConstructorOptions opts;
    opts.allow_internal_ops = true;
    opts.add_default_attributes = true;
    TF_RETURN_IF_ERROR(tensorflow::ConvertGraphDefToGraph(opts, std::move(gdef), new_graph.get()));

    // The graph is placed: every node needs an assigned device. Kept nodes
    // request the device they were assigned (ToGraphDef writes it into the
    // NodeDef), so placing again keeps them there and places the new ones.
    if (options.device_set == nullptr) {
      return absl::FailedPreconditionError("no device set to place the new nodes");
    }
    const std::string fn_name =
        options.function_def != nullptr ? options.function_def->signature().name() : "";
    tensorflow::Placer placer(new_graph.get(), fn_name, &new_graph->flib_def(),
                              options.device_set, options.default_function_device);
    TF_RETURN_IF_ERROR(placer.Run());

    if (options.flib_def != nullptr) {
      for (const FunctionDef& fdef : new_functions.function()) {
        if (!options.flib_def->Contains(fdef.signature().name())) {
          TF_RETURN_IF_ERROR(options.flib_def->AddFunctionDef(fdef));
        }
      }
    }
    *options.graph = std::move(new_graph);
    return absl::OkStatus();
  }
};

}  // namespace
}  // namespace disc_tf

namespace tensorflow {
REGISTER_OPTIMIZATION(OptimizationPassRegistry::POST_PLACEMENT, 50,
                      ::disc_tf::RecordPlaceholderShapesPass);
REGISTER_OPTIMIZATION(OptimizationPassRegistry::POST_REWRITE_FOR_EXEC, 50,
                      ::disc_tf::DiscClusterPass);
}  // namespace tensorflow
