// disc_py.cc -- the `_disc_py` Python extension: access to the DISC runtime
// counters that live in libdisc_tf_ops.so (linked, so both share one copy).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <string>

#include "cc/kernels/stats.h"

namespace py = pybind11;

// The GEMM the op library picked for this process (disc_ral_tf.cc).
extern "C" const char* disc_gemm_isa(void);

namespace {

std::map<std::string, int64_t> Stats() {
  int64_t values[disc_tf::stats::kNumCounters] = {0};
  disc_stats_get(values);
  std::map<std::string, int64_t> out;
  for (int i = 0; i < disc_tf::stats::kNumCounters; ++i) {
    out[disc_tf::stats::CounterName(i)] = values[i];
  }
  return out;
}

void AddStat(const std::string& name, int64_t n) {
  if (disc_stats_add(name.c_str(), n) == 0) {
    throw py::key_error("unknown DISC stat: " + name);
  }
}

bool NoteCluster(const std::string& sha, int64_t num_kernels) {
  return disc_stats_note_cluster(sha.c_str(), num_kernels) != 0;
}

}  // namespace

PYBIND11_MODULE(_disc_py, m) {
  m.doc() = "DISC runtime counters shared with the DiscCluster op library.";
  m.def("stats", &Stats,
        "Returns the counters: clusters, compilations, cache_hits, fallbacks, "
        "kernels.");
  m.def("reset_stats", []() { disc_stats_reset(); },
        "Zeroes all counters and forgets the cluster artifacts seen.");
  m.def("add_stat", &AddStat, py::arg("name"), py::arg("n") = 1,
        "Adds n to the named counter (KeyError for an unknown name).");
  m.def("gemm_isa", []() { return std::string(disc_gemm_isa()); },
        "The RAL's GEMM for this process: avx512, avx2 or baseline (Eigen).");
  m.def("note_cluster", &NoteCluster, py::arg("sha"), py::arg("num_kernels"),
        "Counts a cluster artifact once per reset; returns True if counted.");
}
