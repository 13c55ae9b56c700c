// disc_serving_host.cc -- a model server's view of a disc_tf model: C++ only, no Python.
//
// A template for a TF Serving build and the host of the serving tests
// (tests/serving). It registers the disc_tf op library with TF_LoadLibrary,
// loads a SavedModel with TF_LoadSessionFromSavedModel -- TensorFlow's C API
// around tensorflow::LoadSavedModel, the SavedModelBundle loader TF Serving
// uses (the pip wheel exports the C API, not LoadSavedModel itself) -- finds
// the tensors of one signature in the MetaGraphDef's signature_def, and runs
// requests through the session from one or more threads.
//
//   disc_serving_host --model DIR --op-lib LIB --requests FILE
//       [--signature serving_default] [--out FILE] [--expected FILE]
//       [--rtol 1e-4] [--atol 1e-5] [--threads 1] [--seconds 0]
//
// Tensor files (requests, outputs, expected outputs) are a sequence of float32
// tensors, each `int32 rank, int64 dims[rank], float data[]` (little-endian).
// A request is one tensor per signature input, a response one per output, both
// in the order of their signature keys, sorted.
//
// --seconds 0: each thread runs every request once (thread t starts at request
// t), and --out writes thread 0's responses. --seconds S: each thread runs the
// requests round robin for S seconds. --expected checks every response.
// The last line on stdout is a JSON summary: calls, errors, mismatches, latency
// percentiles (upper bounds of 1%-wide buckets), RSS before the first request
// and once a second, and the op library's counters (disc_stats_get). Exit
// status: 0 with no error and no mismatch, 1 otherwise, 2 if it cannot start.
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tensorflow/c/c_api.h"
#include "tensorflow/core/protobuf/meta_graph.pb.h"

namespace {

using Clock = std::chrono::steady_clock;

// A float32 tensor of a tensor file.
struct HostTensor {
  std::vector<int64_t> dims;
  std::vector<float> data;
};

using Message = std::vector<HostTensor>;  // one request or one response

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "disc_serving_host: %s\n", what.c_str());
  std::exit(2);
}

// Reads a tensor file as messages of `per_message` tensors each.
std::vector<Message> ReadTensorFile(const std::string& path, size_t per_message) {
  std::ifstream in(path, std::ios::binary);
  if (!in) Die("cannot open " + path);
  std::vector<Message> messages;
  Message current;
  int32_t rank;
  while (in.read(reinterpret_cast<char*>(&rank), sizeof rank)) {
    if (rank < 0 || rank > 32) Die("bad rank in " + path);
    HostTensor t;
    t.dims.resize(rank);
    in.read(reinterpret_cast<char*>(t.dims.data()), rank * sizeof(int64_t));
    int64_t n = 1;
    for (int64_t d : t.dims) n *= d;
    t.data.resize(n);
    in.read(reinterpret_cast<char*>(t.data.data()), n * sizeof(float));
    if (!in) Die("truncated tensor file " + path);
    current.push_back(std::move(t));
    if (current.size() == per_message) messages.push_back(std::move(current)), current.clear();
  }
  if (!current.empty()) Die(path + " does not hold whole messages");
  return messages;
}

void WriteTensorFile(const std::string& path, const std::vector<Message>& messages) {
  std::ofstream out(path, std::ios::binary);
  for (const Message& m : messages) {
    for (const HostTensor& t : m) {
      int32_t rank = static_cast<int32_t>(t.dims.size());
      out.write(reinterpret_cast<const char*>(&rank), sizeof rank);
      out.write(reinterpret_cast<const char*>(t.dims.data()), rank * sizeof(int64_t));
      out.write(reinterpret_cast<const char*>(t.data.data()), t.data.size() * sizeof(float));
    }
  }
  if (!out) Die("cannot write " + path);
}

// The first difference between `got` and `want`, or "" if they match.
std::string Compare(const Message& got, const Message& want, double rtol, double atol) {
  if (got.size() != want.size()) return "another number of outputs";
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i].dims != want[i].dims) return "output " + std::to_string(i) + ": shape differs";
    for (size_t j = 0; j < want[i].data.size(); ++j) {
      double g = got[i].data[j], w = want[i].data[j];
      if (std::isnan(g) && std::isnan(w)) continue;
      if (!(std::fabs(g - w) <= atol + rtol * std::fabs(w))) {
        std::ostringstream s;
        s << "output " << i << " element " << j << ": " << g << " vs " << w;
        return s.str();
      }
    }
  }
  return "";
}

// A loaded SavedModel and the tensors of one signature, sorted by key.
struct Model {
  TF_Session* session = nullptr;
  TF_Graph* graph = nullptr;
  std::vector<std::string> input_keys, output_keys;
  std::vector<TF_Output> inputs, outputs;
};

// "name:index" of a signature TensorInfo, resolved in the graph.
TF_Output Resolve(TF_Graph* graph, const tensorflow::TensorInfo& info) {
  if (info.dtype() != tensorflow::DT_FLOAT) Die(info.name() + " is not float32");
  const std::string& name = info.name();
  size_t colon = name.rfind(':');
  std::string op = name.substr(0, colon);
  int index = colon == std::string::npos ? 0 : std::atoi(name.c_str() + colon + 1);
  TF_Operation* oper = TF_GraphOperationByName(graph, op.c_str());
  if (oper == nullptr) Die("no operation " + op + " in the graph");
  return TF_Output{oper, index};
}

Model LoadModel(const std::string& dir, const std::string& signature) {
  Model m;
  TF_Status* status = TF_NewStatus();
  TF_SessionOptions* options = TF_NewSessionOptions();
  TF_Buffer* meta = TF_NewBuffer();
  m.graph = TF_NewGraph();
  const char* tags[] = {"serve"};
  m.session = TF_LoadSessionFromSavedModel(options, nullptr, dir.c_str(), tags, 1, m.graph,
                                           meta, status);
  if (TF_GetCode(status) != TF_OK) Die("loading " + dir + ": " + TF_Message(status));
  tensorflow::MetaGraphDef meta_graph;
  if (!meta_graph.ParseFromArray(meta->data, static_cast<int>(meta->length))) {
    Die("cannot parse the MetaGraphDef");
  }
  auto sig = meta_graph.signature_def().find(signature);
  if (sig == meta_graph.signature_def().end()) Die("no signature " + signature);
  std::map<std::string, tensorflow::TensorInfo> in(sig->second.inputs().begin(),
                                                   sig->second.inputs().end());
  std::map<std::string, tensorflow::TensorInfo> out(sig->second.outputs().begin(),
                                                    sig->second.outputs().end());
  for (const auto& [key, info] : in) {
    m.input_keys.push_back(key);
    m.inputs.push_back(Resolve(m.graph, info));
  }
  for (const auto& [key, info] : out) {
    m.output_keys.push_back(key);
    m.outputs.push_back(Resolve(m.graph, info));
  }
  TF_DeleteBuffer(meta);
  TF_DeleteSessionOptions(options);
  TF_DeleteStatus(status);
  return m;
}

// Runs one request; returns "" or the session's error.
std::string Run(const Model& m, const Message& request, Message* response) {
  std::vector<TF_Tensor*> in;
  for (const HostTensor& t : request) {
    size_t bytes = t.data.size() * sizeof(float);
    TF_Tensor* tensor = TF_AllocateTensor(TF_FLOAT, t.dims.data(),
                                          static_cast<int>(t.dims.size()), bytes);
    if (bytes > 0) std::memcpy(TF_TensorData(tensor), t.data.data(), bytes);
    in.push_back(tensor);
  }
  std::vector<TF_Tensor*> out(m.outputs.size(), nullptr);
  TF_Status* status = TF_NewStatus();
  TF_SessionRun(m.session, nullptr, m.inputs.data(), in.data(), static_cast<int>(in.size()),
                m.outputs.data(), out.data(), static_cast<int>(out.size()), nullptr, 0,
                nullptr, status);
  std::string error = TF_GetCode(status) == TF_OK ? "" : TF_Message(status);
  TF_DeleteStatus(status);
  for (TF_Tensor* t : in) TF_DeleteTensor(t);
  response->clear();
  for (TF_Tensor* t : out) {
    if (t == nullptr) continue;
    HostTensor h;
    for (int d = 0; d < TF_NumDims(t); ++d) h.dims.push_back(TF_Dim(t, d));
    const float* data = static_cast<const float*>(TF_TensorData(t));
    h.data.assign(data, data + TF_TensorElementCount(t));
    response->push_back(std::move(h));
    TF_DeleteTensor(t);
  }
  return error;
}

// Resident set size in MiB ("VmRSS" or "VmHWM" of /proc/self/status).
double RssMb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::atof(line.c_str() + std::strlen(field) + 1) / 1024;
  }
  return -1;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
    out += c;
  }
  return out + "\"";
}

std::string JsonList(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? "," : "") + items[i];
  return out + "]";
}

// The op library's counters (cc/kernels/stats.h: disc_stats_get), by name.
std::string StatsJson(const std::string& op_lib) {
  static const char* kNames[] = {"clusters", "compilations", "cache_hits", "fallbacks",
                                 "kernels",  "peak_temp_bytes", "packed_weights",
                                 "untrusted", "rebuilds", "pool_wakes",
                                 "resident_weight_gemms", "masked_elements",
                                 "temp_reuses", "temp_kept_bytes", "folded_reuses",
                                 "register_epilogues", "layer_blocks"};
  void* handle = dlopen(op_lib.c_str(), RTLD_NOW | RTLD_NOLOAD);
  auto get = handle ? reinterpret_cast<void (*)(int64_t*)>(dlsym(handle, "disc_stats_get"))
                    : nullptr;
  if (get == nullptr) return "null";
  int64_t values[64] = {0};  // room for counters added after this host was written
  get(values);
  std::vector<std::string> fields;
  for (size_t i = 0; i < sizeof kNames / sizeof kNames[0]; ++i) {
    fields.push_back(JsonString(kNames[i]) + ":" + std::to_string(values[i]));
  }
  std::string out = JsonList(fields);
  return "{" + out.substr(1, out.size() - 2) + "}";
}

struct Options {
  std::string model, op_lib, requests, out, expected, signature = "serving_default";
  double rtol = 1e-4, atol = 1e-5, seconds = 0;
  int threads = 1;
};

Options ParseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (i + 1 >= argc) Die("missing value for " + flag);
    std::string value = argv[++i];
    if (flag == "--model") o.model = value;
    else if (flag == "--op-lib") o.op_lib = value;
    else if (flag == "--requests") o.requests = value;
    else if (flag == "--signature") o.signature = value;
    else if (flag == "--out") o.out = value;
    else if (flag == "--expected") o.expected = value;
    else if (flag == "--rtol") o.rtol = std::atof(value.c_str());
    else if (flag == "--atol") o.atol = std::atof(value.c_str());
    else if (flag == "--threads") o.threads = std::max(1, std::atoi(value.c_str()));
    else if (flag == "--seconds") o.seconds = std::atof(value.c_str());
    else Die("unknown flag " + flag);
  }
  if (o.model.empty() || o.requests.empty()) Die("--model and --requests are required");
  if (!o.out.empty() && o.seconds > 0) Die("--out needs --seconds 0");
  return o;
}

// Latencies in buckets 1% wide (1 us to over 2 min): constant memory however long
// the run, so that RSS measures the server, not this record.
struct Histogram {
  static constexpr double kStep = 1.01;
  std::vector<int64_t> counts = std::vector<int64_t>(1900, 0);

  void Add(double us) {
    size_t b = us <= 1 ? 0 : static_cast<size_t>(std::log(us) / std::log(kStep)) + 1;
    ++counts[std::min(b, counts.size() - 1)];
  }
  void Merge(const Histogram& other) {
    for (size_t b = 0; b < counts.size(); ++b) counts[b] += other.counts[b];
  }
  int64_t Total() const {
    int64_t n = 0;
    for (int64_t c : counts) n += c;
    return n;
  }
  // The upper bound of the bucket holding the p-th percentile.
  double Percentile(double p) const {
    const double rank = p / 100 * Total();
    int64_t seen = 0;
    for (size_t b = 0; b < counts.size(); ++b) {
      seen += counts[b];
      if (seen > 0 && seen >= rank) return std::pow(kStep, static_cast<double>(b));
    }
    return 0;
  }
};

// What the request threads share.
struct Shared {
  std::mutex mu;
  int64_t errors = 0, mismatches = 0;
  std::string first_error;
  Histogram latency_us;
};

void Serve(const Options& o, const Model& m, const std::vector<Message>& requests,
           const std::vector<Message>& expected, int thread, Shared* shared,
           std::vector<Message>* responses) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(o.seconds);
  Histogram latency_us;
  int64_t errors = 0, mismatches = 0;
  std::string first_error;
  Message response;
  for (size_t n = 0; o.seconds > 0 ? Clock::now() < deadline : n < requests.size(); ++n) {
    size_t r = (thread + n) % requests.size();
    auto start = Clock::now();
    std::string error = Run(m, requests[r], &response);
    latency_us.Add(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    if (error.empty() && !expected.empty()) {
      std::string diff = Compare(response, expected[r], o.rtol, o.atol);
      if (!diff.empty()) ++mismatches, error = "request " + std::to_string(r) + ": " + diff;
    } else if (!error.empty()) {
      ++errors;
    }
    if (!error.empty() && first_error.empty()) first_error = error;
    if (responses != nullptr) responses->push_back(response);
  }
  std::lock_guard<std::mutex> lock(shared->mu);
  shared->errors += errors;
  shared->mismatches += mismatches;
  if (shared->first_error.empty()) shared->first_error = first_error;
  shared->latency_us.Merge(latency_us);
}

std::string Fixed(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = ParseArgs(argc, argv);
  if (!o.op_lib.empty()) {
    TF_Status* status = TF_NewStatus();
    TF_LoadLibrary(o.op_lib.c_str(), status);  // the handle stays loaded for the process
    if (TF_GetCode(status) != TF_OK) Die("loading " + o.op_lib + ": " + TF_Message(status));
    TF_DeleteStatus(status);
  }
  const Model m = LoadModel(o.model, o.signature);
  const auto requests = ReadTensorFile(o.requests, m.inputs.size());
  if (requests.empty()) Die("no requests in " + o.requests);
  std::vector<Message> expected;
  if (!o.expected.empty()) expected = ReadTensorFile(o.expected, m.outputs.size());
  if (!expected.empty() && expected.size() != requests.size()) {
    Die("--expected holds another number of responses than --requests has requests");
  }

  std::vector<std::string> rss_mb = {Fixed(RssMb("VmRSS:"))};
  std::atomic<bool> done{false};
  std::thread sampler([&] {  // one RSS sample a second while requests run
    for (auto next = Clock::now() + std::chrono::seconds(1); !done; next += std::chrono::seconds(1)) {
      while (!done && Clock::now() < next) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (!done) rss_mb.push_back(Fixed(RssMb("VmRSS:")));
    }
  });
  Shared shared;
  std::vector<Message> responses;
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < o.threads; ++t) {
    threads.emplace_back(Serve, std::cref(o), std::cref(m), std::cref(requests),
                         std::cref(expected), t, &shared,
                         t == 0 && !o.out.empty() ? &responses : nullptr);
  }
  for (std::thread& t : threads) t.join();
  const double wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  done = true;
  sampler.join();
  rss_mb.push_back(Fixed(RssMb("VmRSS:")));
  if (!o.out.empty()) WriteTensorFile(o.out, responses);

  std::vector<std::string> in_keys, out_keys;
  for (const auto& k : m.input_keys) in_keys.push_back(JsonString(k));
  for (const auto& k : m.output_keys) out_keys.push_back(JsonString(k));
  std::printf(
      "{\"inputs\":%s,\"outputs\":%s,\"threads\":%d,\"calls\":%lld,\"errors\":%lld,"
      "\"mismatches\":%lld,\"first_error\":%s,\"wall_s\":%.3f,\"p50_us\":%.1f,"
      "\"p99_us\":%.1f,\"max_us\":%.1f,\"rss_mb\":%s,\"peak_rss_mb\":%.1f,\"stats\":%s}\n",
      JsonList(in_keys).c_str(), JsonList(out_keys).c_str(), o.threads,
      static_cast<long long>(shared.latency_us.Total()), static_cast<long long>(shared.errors),
      static_cast<long long>(shared.mismatches), JsonString(shared.first_error).c_str(), wall_s,
      shared.latency_us.Percentile(50), shared.latency_us.Percentile(99),
      shared.latency_us.Percentile(100), JsonList(rss_mb).c_str(), RssMb("VmHWM:"),
      StatsJson(o.op_lib).c_str());
  std::fflush(stdout);
  return shared.errors == 0 && shared.mismatches == 0 ? 0 : 1;
}
