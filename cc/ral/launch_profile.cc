// launch_profile.cc -- the process-wide launch table behind DISC_TF_PROFILE.
#include "cc/ral/launch_profile.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace disc_tf {
namespace profile {

namespace {

struct Entry {
  int64_t calls = 0;
  double seconds = 0;
  std::string detail;
};

using Key = std::tuple<std::string, int32_t, std::string>;  // cluster, launch, kind

struct Table {
  std::mutex mu;
  std::map<Key, Entry> entries;

  void Write() {
    const char* dest = std::getenv("DISC_TF_PROFILE");
    if (dest == nullptr || entries.empty()) return;
    const std::string where = dest;
    FILE* out = (where == "1" || where == "stderr") ? stderr : std::fopen(dest, "w");
    if (out == nullptr) return;
    std::vector<std::pair<Key, Entry>> rows(entries.begin(), entries.end());
    std::sort(rows.begin(), rows.end(), [](const auto& x, const auto& y) {
      return x.second.seconds > y.second.seconds;
    });
    // A "call" row (a whole disc_entry, launch -1) holds its launches: no launch site.
    auto is_call = [](const Key& key) { return std::get<2>(key) == kCallKind; };
    double total = 0;
    size_t sites = 0;
    for (const auto& r : rows) {
      if (is_call(r.first)) continue;
      total += r.second.seconds;
      ++sites;
    }
    std::fprintf(out, "disc_tf launch profile: %.3f ms in %zu launch sites\n",
                 total * 1e3, sites);
    std::fprintf(out, "%-24s %6s %-8s %8s %10s %10s %6s  %s\n", "cluster", "launch", "kind",
                 "calls", "total ms", "mean us", "share", "detail");
    for (const auto& [key, e] : rows) {
      char share[16] = "-";
      if (!is_call(key))
        std::snprintf(share, sizeof share, "%.1f%%", total > 0 ? 100.0 * e.seconds / total : 0.0);
      std::fprintf(out, "%-24s %6d %-8s %8lld %10.3f %10.1f %6s  %s\n",
                   std::get<0>(key).c_str(), std::get<1>(key), std::get<2>(key).c_str(),
                   static_cast<long long>(e.calls), e.seconds * 1e3,
                   e.seconds * 1e6 / static_cast<double>(std::max<int64_t>(e.calls, 1)),
                   share, e.detail.c_str());
    }
    if (out != stderr) std::fclose(out);
  }
};

Table& GetTable() {
  static Table* table = new Table();  // written by the atexit hook below
  return *table;
}

void WriteAtExit() { GetTable().Write(); }

}  // namespace

bool Enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("DISC_TF_PROFILE");
    if (v == nullptr || *v == '\0') return false;
    std::atexit(&WriteAtExit);
    return true;
  }();
  return enabled;
}

void Record(const std::string& cluster, int32_t launch, const char* kind,
            double seconds, const std::string& detail) {
  Table& t = GetTable();
  std::lock_guard<std::mutex> lock(t.mu);
  Entry& e = t.entries[Key(cluster, launch, kind)];
  ++e.calls;
  e.seconds += seconds;
  if (e.detail.empty()) e.detail = detail;
}

}  // namespace profile
}  // namespace disc_tf
