"""Hides AVX-512 from every peer's CPUID, so that all of them, ONNX Runtime included, take
their AVX2 code paths on an AVX-512 host (``bench.run --hide-avx512``).

``DISC_TF_ISA``, ``ONEDNN_MAX_CPU_ISA`` and ``XLA_FLAGS`` cap disc_tf, TF and XLA, but ONNX
Runtime's MLAS picks its kernels from CPUID alone. ``cpuid_mask/hide_avx512.c`` is an
LD_PRELOAD shim that uses Linux's CPUID faulting to clear the AVX-512 and AMX bits for the
processes that load it. The cores, caches and clock stay the host's: this measures the AVX2
code paths of all peers on one machine, not an AVX2-only CPU.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

SHIM_DIR = pathlib.Path(__file__).resolve().parent / "cpuid_mask"
SHIM = SHIM_DIR / "build" / "hide_avx512.so"

_CHECK = ("import numpy; f = numpy._core._multiarray_umath.__cpu_features__; "
          "print(int(f['AVX2']), int(f['AVX512F']))")


def build() -> pathlib.Path:
    """Builds the shim unless it is up to date; returns its path."""
    if not SHIM.exists() or SHIM.stat().st_mtime < (SHIM_DIR / "hide_avx512.c").stat().st_mtime:
        subprocess.run(["bash", str(SHIM_DIR / "build.sh")], check=True)
    return SHIM


def enable() -> str:
    """Builds the shim when needed, preloads it into every process started from here on,
    and checks that a child process sees AVX2 without AVX-512; returns the shim's path."""
    build()
    preload = os.environ.get("LD_PRELOAD", "")
    if str(SHIM) not in preload.split():
        os.environ["LD_PRELOAD"] = f"{SHIM} {preload}".strip()
    seen = subprocess.run([sys.executable, "-c", _CHECK], capture_output=True, text=True,
                          check=True).stdout.split()
    if seen != ["1", "0"]:
        raise RuntimeError(f"the CPUID shim did not hide AVX-512 (numpy sees AVX2, AVX512F = "
                           f"{seen}); this kernel or hypervisor may lack CPUID faulting")
    return str(SHIM)
