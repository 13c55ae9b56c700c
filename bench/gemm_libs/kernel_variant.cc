// kernel_variant.cc -- the RAL's GEMM block (cc/ral/gemm_kernel_impl.h) built a
// second time, with the extra flags of DISC_VARIANT_FLAGS (build.sh), under the
// names disc_gemm_*_<isa>_variant: the harness races it against the RAL's own
// build as the candidate "disc_variant" (a change to the block measured in
// interleaved rounds, e.g. DISC_VARIANT_FLAGS=-DDISC_GEMM_K_UNROLL=1).
#if defined(__AVX512F__)
#define DISC_GEMM_ISA(name) name##_avx512_variant
#else
#define DISC_GEMM_ISA(name) name##_avx2_variant
#endif
#include "cc/ral/gemm_kernel_impl.h"
