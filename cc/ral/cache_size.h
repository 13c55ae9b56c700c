// cache_size.h -- this core's L2 size, by which the GEMM sizes its blocks
// (gemm_kernel_impl.h) and chooses its cuts (gemm_split.h).
//
// The function has internal linkage: the GEMM block's translation units, each
// built for one ISA, include it without sharing a copy with code built for the
// baseline ISA (an inline function of external linkage may be merged across them).
#ifndef DISC_TF_CC_RAL_CACHE_SIZE_H_
#define DISC_TF_CC_RAL_CACHE_SIZE_H_

#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

namespace disc_tf {
namespace {

// This core's L2 in bytes: $DISC_TF_L2_BYTES where set (tests; a machine whose
// sysconf is wrong), else sysconf, else 512 KiB.
inline int64_t L2CacheBytes() {
  const char* forced = getenv("DISC_TF_L2_BYTES");
  if (forced != nullptr && atoll(forced) > 0) return atoll(forced);
  const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  return l2 > 0 ? l2 : 512 * 1024;
}

}  // namespace
}  // namespace disc_tf

#endif  // DISC_TF_CC_RAL_CACHE_SIZE_H_
