// emu_runtime.cc -- the CUDA emulator's launch loop (disc_emu::Run: fiber
// stacks, the block scheduler, warp collectives, the SIGFPE trap) as one
// translation unit. The cuda-emu build compiles it once and links the object
// into every artifact, whose device unit only declares Run
// (DISC_EMU_RUN_EXTERN); it is built with hidden visibility, so each artifact
// keeps its own copy, as when the header defines it inline.
#define DISC_EMU_RUN_LINKAGE
#include "cuda_emulator.h"
