// cuda_bf16.h of the CUDA emulator: its types come from cuda_emulator.h.
#include "cuda_emulator.h"
