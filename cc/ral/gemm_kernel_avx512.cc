// gemm_kernel_avx512.cc -- the GEMM block for avx512; built with that ISA's flags
// (see disc_tf/runtime/native_build.py, ISA_SOURCES) and nothing else.
#define DISC_GEMM_ISA(name) name##_avx512
#include "cc/ral/gemm_kernel_impl.h"
