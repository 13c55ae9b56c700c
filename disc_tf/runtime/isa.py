"""Which x86-64 levels the CPU kernels are compiled for.

An artifact ``optimize`` writes travels to other machines, so by default its
kernels carry clones for every level (AVX-512, AVX2, baseline x86-64) and the
loader picks the best the CPU has. A JIT compile (``disc_tf.jit``,
``TF_DISC_ENABLE=1``) runs where it is built, so by default it compiles for this
host's level alone: a third of the code to compile, the same code the clone
would have picked.

``isa`` is "portable" (every level), "host" (this machine's level alone) or a
list of levels; a list of more than one level gets the baseline too (the
loader's fallback). ``$DISC_TF_ISA`` overrides the default of both: "host",
"portable", or one level (capped at the host's, so that a test on an AVX-512
machine runs the AVX2 code path with ``DISC_TF_ISA=x86-64-v3``).
"""

from __future__ import annotations

import functools
import logging
import os
import pathlib
from collections.abc import Sequence

log = logging.getLogger("disc_tf.runtime")

#: The levels, best first (GCC's ``-march`` names); the last is the baseline.
LEVELS = ("x86-64-v4", "x86-64-v3", "x86-64")
PORTABLE = LEVELS

#: /proc/cpuinfo flags each level needs beyond the one below it.
_NEEDS = {
    "x86-64-v3": {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"},
    "x86-64-v4": {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"},
}


def level_of(flags: set[str]) -> str:
    """The best level a CPU with these ``/proc/cpuinfo`` flags runs."""
    if not _NEEDS["x86-64-v3"] <= flags:
        return "x86-64"
    return "x86-64-v4" if _NEEDS["x86-64-v4"] <= flags else "x86-64-v3"


@functools.cache
def host_level() -> str:
    """The best level this CPU runs (from ``/proc/cpuinfo``; the baseline if unknown)."""
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return LEVELS[-1]
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return level_of(set(line.partition(":")[2].split()))


def _cap(level: str) -> str:
    """``level``, or the host's if the host runs less."""
    host = host_level()
    return level if LEVELS.index(level) >= LEVELS.index(host) else host


def resolve(isa: str | Sequence[str] | None, default: str) -> tuple[str, ...]:
    """The levels to compile for, best first. ``isa`` None takes ``$DISC_TF_ISA``,
    else ``default`` ("host" or "portable"). ValueError names the choices."""
    if isa is None:
        raw = os.environ.get("DISC_TF_ISA", "").strip()
        if raw in LEVELS:
            return (_cap(raw),)
        if raw and raw not in ("host", "portable"):
            log.warning("DISC_TF_ISA=%r is not one of host, portable, %s; using %r", raw,
                        ", ".join(LEVELS), default)
            raw = ""
        isa = raw or default
    if isa == "host":
        return (host_level(),)
    if isa == "portable":
        return PORTABLE
    levels = (isa,) if isinstance(isa, str) else tuple(isa)
    unknown = [v for v in levels if v not in LEVELS]
    if unknown or not levels:
        raise ValueError(f"isa {isa!r}: expected 'host', 'portable' or levels among "
                         f"{', '.join(LEVELS)}")
    ordered = tuple(v for v in LEVELS if v in levels)
    if len(ordered) > 1 and ordered[-1] != LEVELS[-1]:
        ordered += (LEVELS[-1],)
    return ordered


def compile_flags(levels: Sequence[str]) -> list[str]:
    """Compiler flags for kernel units built for ``levels``: one level is that
    ``-march`` and no clones; several are ``target_clones`` of each (the prelude's
    ``DISC_CLONES``)."""
    if tuple(levels) == PORTABLE:
        return []  # the prelude's own DISC_CLONES
    if len(levels) == 1:
        return [f"-march={levels[0]}", "-DDISC_CLONES="]
    clones = ", ".join(f'"arch={v}"' if v != LEVELS[-1] else '"default"' for v in levels)
    return [f"-DDISC_CLONES=__attribute__((target_clones({clones})))"]
