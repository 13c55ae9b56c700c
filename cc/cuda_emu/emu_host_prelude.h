// emu_host_prelude.h -- every header the host translation unit of a `cuda-emu`
// artifact includes (emu_ral.h's and the host runner's). The build compiles it
// once into a precompiled header and puts it first in each host unit; the
// includes that follow in the unit then cost nothing (their guards are set).
#ifndef DISC_CUDA_EMU_HOST_PRELUDE_H_
#define DISC_CUDA_EMU_HOST_PRELUDE_H_

#include <stdint.h>
#include <stdio.h>

#include <cstddef>
#include <cstring>
#include <string>

#include "cublas_emu.h"
#include "cublas_gemm.h"
#include "disc_ral_cuda.h"
#include "ral_forward.h"

#endif  // DISC_CUDA_EMU_HOST_PRELUDE_H_
