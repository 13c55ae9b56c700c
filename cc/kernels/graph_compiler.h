// graph_compiler.h -- the host's compiler for a GraphDef, with or without Python.
//
// The graph pass (TF_DISC_ENABLE) and the DiscCluster kernel's local rebuild
// (artifact_trust.h) hand a serialized GraphDef to disc_tf and get it back with
// its clusters as DiscCluster nodes. In a process with an initialized Python
// interpreter that is `disc_tf.enable._optimize_serialized`, called in-process
// (the CPython C API is resolved with dlsym, so the op library needs no
// libpython); elsewhere (a model server) `python -m disc_tf compile-graph` in a
// subprocess (subprocess_compiler.h). DISC_TF_COMPILER=inprocess|subprocess
// forces one. DISC_TF_COMPILE_MODE=sync compiles before returning; async (the
// default) returns at once with pending keys (pending_artifacts.h).
#ifndef DISC_TF_CC_KERNELS_GRAPH_COMPILER_H_
#define DISC_TF_CC_KERNELS_GRAPH_COMPILER_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tensorflow/core/framework/graph.pb.h"

namespace disc_tf {

enum class GraphCompiler { kNone, kInProcess, kSubprocess };

// The compiler this process uses now: kNone while its Python interpreter is
// finalizing, or when DISC_TF_COMPILER=inprocess and there is no interpreter.
GraphCompiler ChooseGraphCompiler();

// Whether compiles finish before CompileGraph returns: DISC_TF_COMPILE_MODE=sync,
// or strict mode (DISC_TF_STRICT) without a DISC_TF_COMPILE_MODE, as
// disc_tf.enable.compile_mode() decides for the in-process compiler.
bool SyncCompile();

// True if $name is `value`, ignoring case.
bool EnvIs(const char* name, const char* value);

// Compiles `graph_bytes` (a serialized GraphDef whose nodes in
// `protected_names` keep their names) with `compiler`, synchronously when
// `sync`. `*result` is the rewritten GraphDef, or empty when there was nothing
// to compile.
absl::Status CompileGraph(GraphCompiler compiler, const std::string& graph_bytes,
                          const std::vector<std::string>& protected_names, bool sync,
                          std::string* result);

// Records the artifacts of the DiscCluster nodes of `gdef` (a graph this
// process's compiler returned) as built here (artifact_trust.h).
void NoteArtifactsBuiltHere(const tensorflow::GraphDef& gdef);

}  // namespace disc_tf

#endif  // DISC_TF_CC_KERNELS_GRAPH_COMPILER_H_
