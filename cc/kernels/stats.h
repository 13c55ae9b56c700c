// stats.h -- process-wide DISC runtime counters.
//
// Counters: clusters, compilations, cache_hits, fallbacks, kernels, the maximum
// peak_temp_bytes, packed_weights (GEMM weight operands packed into a
// kernel's cache, packed_weights.h), untrusted (embedded artifacts refused by
// the trust policy), rebuilds (clusters compiled again here), pool_wakes
// (sleeping RAL workers a call woke before its first launch, spin_pool.h) and
// resident_weight_gemms (GEMM launches of calls whose kernel's packed weights fit in
// half of a core's L2, which read them without prefetching, gemm_kernels.h) and
// masked_elements (elements of attention scores not computed, since the mask's select
// takes its other arm there: sgemm_scratch_c_cols in disc_ral.h), temp_reuses
// (temporaries a call took from its kernel's kept scratch instead of the
// allocator) and temp_kept_bytes (the bytes of scratch all kernels keep now,
// temp_cache.h; a level, which Reset() leaves as it is), folded_reuses (launches
// of weight-only kernels a call skipped, their results kept from an earlier call:
// folded_values.h), register_epilogues (GEMM launches whose epilogue, a chain of
// per-column and constant steps, ran on each tile of C as it was stored: ABI 11's
// column_epilogue in disc_ral.h), layer_blocks (launches of GEMMs each reading the last
// one's result that ran every layer on a block of rows before the next block: ABI 12's
// sgemm_layers). `clusters`
// and `kernels` count distinct cluster artifacts (by sha256) seen since the
// last Reset(). The same counters are exported with C linkage so that other
// shared objects (the Python extension) can read them.
#ifndef DISC_TF_CC_KERNELS_STATS_H_
#define DISC_TF_CC_KERNELS_STATS_H_

#include <cstdint>
#include <string>

namespace disc_tf {
namespace stats {

// Index of each counter in the array filled by Get()/disc_stats_get().
enum Counter : int {
  kClusters = 0,
  kCompilations = 1,
  kCacheHits = 2,
  kFallbacks = 3,
  kKernels = 4,
  kPeakTempBytes = 5,  // the most temporary bytes one cluster call held (a maximum)
  kPackedWeights = 6,  // weight operands packed once for reuse across calls
  kUntrusted = 7,      // embedded artifacts not loaded: no trusted signature
  kRebuilds = 8,       // clusters rebuilt on this host instead (artifact_trust.h)
  kPoolWakes = 9,      // sleeping RAL workers woken at a call's start (WakeTaskPool)
  kResidentWeightGemms = 10,  // GEMM launches reading packed weights kept in L2 (no prefetch)
  kMaskedElements = 11,  // elements of C not computed: a mask selects them away (ABI 9)
  kTempReuses = 12,      // temporaries taken from a kernel's kept scratch (temp_cache.h)
  kTempKeptBytes = 13,   // bytes of scratch kept now: a level, which Reset() keeps
  kFoldedReuses = 14,    // launches skipped: their results kept from an earlier call
  kRegisterEpilogues = 15,  // GEMM launches that ran their column epilogue on registers
  kLayerBlocks = 16,  // sgemm_layers launches that ran every layer block by block
  kNumCounters = 17,
};

// Name of counter `c` ("clusters", "compilations", ...).
const char* CounterName(int c);

// Adds n to the named counter. Returns false for an unknown name.
bool Add(const std::string& name, int64_t n);
void Add(Counter c, int64_t n);

// Counts a cluster artifact: increments clusters by 1 and kernels by
// num_kernels the first time `sha256` is seen since the last Reset().
// Returns true if it was counted.
bool NoteCluster(const std::string& sha256, int64_t num_kernels);

// Raises counter `c` to `value` if it is larger (for maxima such as peak bytes).
void NoteMax(Counter c, int64_t value);

// Copies the counters into out[kNumCounters].
void Get(int64_t out[kNumCounters]);

// Zeroes all counters and forgets the seen artifacts.
void Reset();

}  // namespace stats
}  // namespace disc_tf

extern "C" {
__attribute__((visibility("default"))) void disc_stats_get(int64_t out[disc_tf::stats::kNumCounters]);
__attribute__((visibility("default"))) void disc_stats_reset(void);
// Returns 1 if `name` is a known counter, 0 otherwise.
__attribute__((visibility("default"))) int32_t disc_stats_add(const char* name,
                                                              int64_t n);
// Returns 1 if the artifact was counted (first time since reset), else 0.
__attribute__((visibility("default"))) int32_t disc_stats_note_cluster(
    const char* sha, int64_t num_kernels);
}

#endif  // DISC_TF_CC_KERNELS_STATS_H_
