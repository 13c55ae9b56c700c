// graph_compiler.cc -- compiles a GraphDef in-process or in a subprocess.
#include "cc/kernels/graph_compiler.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "cc/kernels/artifact_trust.h"
#include "cc/kernels/subprocess_compiler.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/node_def.pb.h"

namespace disc_tf {
namespace {

constexpr char kPyModule[] = "disc_tf.enable";
constexpr char kPyFunction[] = "_optimize_serialized";

}  // namespace

bool EnvIs(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && absl::AsciiStrToLower(v) == value;
}

namespace {

// The subset of the CPython C API the pass uses, looked up in the process.
struct PyApi {
  using PyObj = void;
  int (*IsInitialized)() = nullptr;
  int (*IsFinalizing)() = nullptr;  // optional
  int (*GILStateEnsure)() = nullptr;
  void (*GILStateRelease)(int) = nullptr;
  PyObj* (*ImportModule)(const char*) = nullptr;
  PyObj* (*GetAttrString)(PyObj*, const char*) = nullptr;
  PyObj* (*BytesFromStringAndSize)(const char*, ssize_t) = nullptr;
  int (*BytesAsStringAndSize)(PyObj*, char**, ssize_t*) = nullptr;
  PyObj* (*ListNew)(ssize_t) = nullptr;
  int (*ListSetItem)(PyObj*, ssize_t, PyObj*) = nullptr;
  PyObj* (*UnicodeFromStringAndSize)(const char*, ssize_t) = nullptr;
  PyObj* (*TupleNew)(ssize_t) = nullptr;
  int (*TupleSetItem)(PyObj*, ssize_t, PyObj*) = nullptr;
  PyObj* (*CallObject)(PyObj*, PyObj*) = nullptr;
  void (*DecRef)(PyObj*) = nullptr;
  PyObj* (*ErrOccurred)() = nullptr;
  void (*ErrPrint)() = nullptr;
  PyObj* None = nullptr;
  bool ok = false;
};

template <typename T>
bool Lookup(const char* name, T* out) {
  *out = reinterpret_cast<T>(dlsym(RTLD_DEFAULT, name));
  return *out != nullptr;
}

const PyApi& Python() {
  static const PyApi* api = [] {
    auto* a = new PyApi;
    bool ok = Lookup("Py_IsInitialized", &a->IsInitialized) &&
              Lookup("PyGILState_Ensure", &a->GILStateEnsure) &&
              Lookup("PyGILState_Release", &a->GILStateRelease) &&
              Lookup("PyImport_ImportModule", &a->ImportModule) &&
              Lookup("PyObject_GetAttrString", &a->GetAttrString) &&
              Lookup("PyBytes_FromStringAndSize", &a->BytesFromStringAndSize) &&
              Lookup("PyBytes_AsStringAndSize", &a->BytesAsStringAndSize) &&
              Lookup("PyList_New", &a->ListNew) &&
              Lookup("PyList_SetItem", &a->ListSetItem) &&
              Lookup("PyUnicode_FromStringAndSize", &a->UnicodeFromStringAndSize) &&
              Lookup("PyTuple_New", &a->TupleNew) &&
              Lookup("PyTuple_SetItem", &a->TupleSetItem) &&
              Lookup("PyObject_CallObject", &a->CallObject) &&
              Lookup("Py_DecRef", &a->DecRef) &&
              Lookup("PyErr_Occurred", &a->ErrOccurred) &&
              Lookup("PyErr_Print", &a->ErrPrint);
    a->None = dlsym(RTLD_DEFAULT, "_Py_NoneStruct");
    if (!Lookup("Py_IsFinalizing", &a->IsFinalizing)) {
      Lookup("_Py_IsFinalizing", &a->IsFinalizing);
    }
    a->ok = ok && a->None != nullptr;
    return a;
  }();
  return *api;
}

// Calls disc_tf.enable._optimize_serialized(graph_bytes, protected_names).
// Returns true and fills `result` if Python returned bytes; false if it
// returned None or failed (`error` says why when it failed).
bool CallPython(const std::string& graph_bytes,
                const std::vector<std::string>& protected_names,
                std::string* result, std::string* error) {
  const PyApi& py = Python();
  int gil = py.GILStateEnsure();
  bool got = false;
  void* module = nullptr;
  void* fn = nullptr;
  void* args = nullptr;
  void* ret = nullptr;
  do {
    module = py.ImportModule(kPyModule);
    if (module == nullptr) {
      *error = absl::StrCat("cannot import ", kPyModule);
      break;
    }
    fn = py.GetAttrString(module, kPyFunction);
    if (fn == nullptr) {
      *error = absl::StrCat(kPyModule, " has no ", kPyFunction);
      break;
    }
    args = py.TupleNew(2);
    if (args == nullptr) break;
    void* bytes = py.BytesFromStringAndSize(graph_bytes.data(),
                                            static_cast<ssize_t>(graph_bytes.size()));
    if (bytes == nullptr || py.TupleSetItem(args, 0, bytes) != 0) break;
    void* names = py.ListNew(static_cast<ssize_t>(protected_names.size()));
    if (names == nullptr || py.TupleSetItem(args, 1, names) != 0) break;
    bool names_ok = true;
    for (size_t i = 0; i < protected_names.size(); ++i) {
      void* s = py.UnicodeFromStringAndSize(protected_names[i].data(),
                                            static_cast<ssize_t>(protected_names[i].size()));
      if (s == nullptr || py.ListSetItem(names, static_cast<ssize_t>(i), s) != 0) {
        names_ok = false;
        break;
      }
    }
    if (!names_ok) break;
    ret = py.CallObject(fn, args);
    if (ret == nullptr) {
      *error = absl::StrCat(kPyModule, ".", kPyFunction, " raised");
      break;
    }
    if (ret == py.None) break;
    char* data = nullptr;
    ssize_t size = 0;
    if (py.BytesAsStringAndSize(ret, &data, &size) != 0) {
      *error = absl::StrCat(kPyFunction, " returned neither bytes nor None");
      break;
    }
    result->assign(data, static_cast<size_t>(size));
    got = true;
  } while (false);
  if (py.ErrOccurred() != nullptr) {
    if (error->empty()) *error = "Python error";
    py.ErrPrint();  // prints and clears
  }
  if (ret != nullptr) py.DecRef(ret);
  if (args != nullptr) py.DecRef(args);
  if (fn != nullptr) py.DecRef(fn);
  if (module != nullptr) py.DecRef(module);
  py.GILStateRelease(gil);
  return got;
}

}  // namespace

bool SyncCompile() {
  const char* mode = std::getenv("DISC_TF_COMPILE_MODE");
  if (mode != nullptr && *mode != '\0') return EnvIs("DISC_TF_COMPILE_MODE", "sync");
  const char* strict = std::getenv("DISC_TF_STRICT");
  if (strict == nullptr) return false;
  const std::string s = absl::AsciiStrToLower(strict);
  return s == "1" || s == "true" || s == "yes" || s == "on";
}

GraphCompiler ChooseGraphCompiler() {
  const PyApi& py = Python();
  const bool python = py.ok && py.IsInitialized() != 0;
  if (python && py.IsFinalizing != nullptr && py.IsFinalizing() != 0) {
    return GraphCompiler::kNone;
  }
  if (EnvIs("DISC_TF_COMPILER", "subprocess") ||
      (!python && !EnvIs("DISC_TF_COMPILER", "inprocess"))) {
    return GraphCompiler::kSubprocess;
  }
  return python ? GraphCompiler::kInProcess : GraphCompiler::kNone;
}

absl::Status CompileGraph(GraphCompiler compiler, const std::string& graph_bytes,
                          const std::vector<std::string>& protected_names, bool sync,
                          std::string* result) {
  result->clear();
  switch (compiler) {
    case GraphCompiler::kSubprocess:
      return CompileInSubprocess(graph_bytes, protected_names, /*async=*/!sync, result);
    case GraphCompiler::kInProcess: {
      std::string error;
      // disc_tf.enable.compile_mode() reads the same environment as SyncCompile.
      if (!CallPython(graph_bytes, protected_names, result, &error) && !error.empty()) {
        return absl::InternalError(error);
      }
      return absl::OkStatus();
    }
    default:
      return absl::FailedPreconditionError("no compiler: the Python interpreter is exiting");
  }
}

void NoteArtifactsBuiltHere(const tensorflow::GraphDef& gdef) {
  for (const tensorflow::NodeDef& nd : gdef.node()) {
    if (nd.op() != "DiscCluster") continue;
    auto artifact = nd.attr().find("artifact");
    auto sha = nd.attr().find("artifact_sha256");
    if (artifact != nd.attr().end() && !artifact->second.s().empty() &&
        sha != nd.attr().end()) {
      NoteBuiltHere(sha->second.s());
    }
  }
}

}  // namespace disc_tf
