// subprocess_compiler.h -- the graph pass's compiler when there is no Python.
//
// A host without a Python interpreter (a model server that links the op
// library) cannot call disc_tf in-process. It runs
//   $DISC_TF_PYTHON -m disc_tf compile-graph --graph G --protected P
//       --out-dir D --mode sync|async
// instead (see disc_tf/graph_service.py for the line protocol), bounded by
// DISC_TF_SUBPROCESS_TIMEOUT seconds (default 600). Any failure -- no
// interpreter, a crash, a timeout, an unreadable answer -- is reported and the
// graph keeps its original ops.
#ifndef DISC_TF_CC_KERNELS_SUBPROCESS_COMPILER_H_
#define DISC_TF_CC_KERNELS_SUBPROCESS_COMPILER_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace disc_tf {

// Compiles `graph_bytes` (a serialized GraphDef) in a subprocess. On success
// `*result` is the rewritten GraphDef, or empty when there was nothing to
// compile. With `async`, `*result` comes back before compilation finishes: a
// background thread keeps reading the subprocess and publishes each artifact
// under its pending key (pending_artifacts.h), failing the keys it never got.
absl::Status CompileInSubprocess(const std::string& graph_bytes,
                                 const std::vector<std::string>& protected_names,
                                 bool async, std::string* result);

}  // namespace disc_tf

#endif  // DISC_TF_CC_KERNELS_SUBPROCESS_COMPILER_H_
