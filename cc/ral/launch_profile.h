// launch_profile.h -- per-launch wall time of compiled clusters, for tuning.
//
// Off unless DISC_TF_PROFILE is set (read once per process). Then every
// parallel_for and GEMM that an artifact issues through the RAL is timed and
// added to a process-wide table keyed by (cluster, launch number within one
// call, kind). Launch numbers count launches in the fusion plan's kernel order
// (`disc-tf inspect --until fusion`, or fusion_plan.txt in DISC_TF_DUMP_DIR); a
// GEMM epilogue runs inside its GEMM's launch, whose detail says "+epilogue". Each
// call's whole disc_entry is a row of kind "call" at launch -1 (its time beyond the
// sum of its launches is the host runner's own); it is no launch site and has no share.
// The table is written at process exit, slowest first, to the
// file DISC_TF_PROFILE names, or to stderr when it is "1" or "stderr".
#ifndef DISC_TF_CC_RAL_LAUNCH_PROFILE_H_
#define DISC_TF_CC_RAL_LAUNCH_PROFILE_H_

#include <chrono>
#include <cstdint>
#include <string>

namespace disc_tf {
namespace profile {

// The row of a call's whole disc_entry: its kind and launch number.
constexpr char kCallKind[] = "call";
constexpr int32_t kCallLaunch = -1;

// True when DISC_TF_PROFILE is set.
bool Enabled();

// Adds one launch to the table. `detail` describes the work (e.g. GEMM
// sizes); only the first detail seen for a key is kept.
void Record(const std::string& cluster, int32_t launch, const char* kind,
            double seconds, const std::string& detail);

// Times one launch from construction to destruction when profiling is on.
class LaunchTimer {
 public:
  LaunchTimer(const std::string* cluster, int32_t* counter, const char* kind)
      : cluster_(cluster), counter_(counter), kind_(kind) {
    if (cluster_ != nullptr) {
      launch_ = (*counter_)++;
      start_ = std::chrono::steady_clock::now();
    }
  }
  ~LaunchTimer() {
    if (cluster_ == nullptr) return;
    const std::chrono::duration<double> d = std::chrono::steady_clock::now() - start_;
    Record(*cluster_, launch_, kind_, d.count(), detail);
  }
  LaunchTimer(const LaunchTimer&) = delete;
  LaunchTimer& operator=(const LaunchTimer&) = delete;

  std::string detail;  // filled by the caller, optional

 private:
  const std::string* cluster_;
  int32_t* counter_;
  const char* kind_;
  int32_t launch_ = 0;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace profile
}  // namespace disc_tf

#endif  // DISC_TF_CC_RAL_LAUNCH_PROFILE_H_
