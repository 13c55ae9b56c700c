// emu_host_runtime.cc -- the emulated RAL (emu_ral.h: disc_entry, the launch,
// GEMM, copy and memset callbacks over the emulator) as one translation unit.
// The cuda-emu build compiles it once per process and links the object into
// every artifact, next to the host runner as generated; it references the
// runner's disc_cuda_entry and the device unit's disc_emu_launch and
// disc_emu_global, which each artifact's own units define. Without the prebuilt
// parts the host unit includes emu_ral.h itself, as this file does.
#include "emu_ral.h"
