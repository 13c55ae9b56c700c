"""The CPU build: kernel units compiled in parallel through the kernel cache, then
linked with the host runner into the cluster's one shared object.

A cluster's artifact is cached whole (``compiler.cached_build``). On a miss each
kernel unit's object file is looked up by its content key, so a kernel that an
earlier cluster or model compiled (a transformer's layers share most of theirs)
is not compiled again; the missing objects and the host runner are compiled on
``$DISC_TF_COMPILE_JOBS`` processes at once (default: the cores this process may
use), each killed after ``$DISC_TF_COMPILE_TIMEOUT`` seconds, and linked.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import logging
import os
import pathlib
import tempfile
import time

from disc_tf.errors import CompileError
from disc_tf.runtime import compiler, elf_check, isa, native
from disc_tf.sources import Sources, SourceUnit

log = logging.getLogger("disc_tf.runtime")

#: Flags of every kernel unit (``compiler.CXX_FLAGS`` less ``-shared``).
COMPILE_FLAGS = [f for f in compiler.CXX_FLAGS if f != "-shared"]
#: The host runner's: straight-line shape arithmetic and launches, no loop worth -O3
#: (it was the longest compile of bert_small's cluster, 0.8 s, and is 0.45 s at -O1).
HOST_FLAGS = ["-O1" if f == "-O3" else f for f in COMPILE_FLAGS]


@dataclasses.dataclass
class UnitCounts:
    """How a build got its kernel objects: compiled, or from the kernel cache."""

    compiled: int = 0
    cached: int = 0
    #: compiler seconds of each translation unit compiled (kernel units, host runner)
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)


def compile_jobs() -> int:
    """Compiler processes run at once: ``$DISC_TF_COMPILE_JOBS``, else the usable cores."""
    raw = os.environ.get("DISC_TF_COMPILE_JOBS", "").strip()
    if raw:
        try:
            value = int(raw)
        except ValueError:
            value = 0
        if value > 0:
            return value
        log.warning("DISC_TF_COMPILE_JOBS=%r is not a positive integer; using the core count",
                    raw)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def unit_flags(levels: tuple[str, ...] = isa.PORTABLE) -> list[str]:
    """Flags of kernel units built for the x86-64 ``levels`` (``runtime/isa.py``)."""
    return COMPILE_FLAGS + isa.compile_flags(levels)


def _toolchain(flags: list[str]) -> list[bytes]:
    """What every object depends on besides its text: RAL header, flags, compiler."""
    ral = (native.ral_include_dir() / "disc_ral.h").read_bytes()
    return [ral, " ".join(flags).encode(), compiler.cxx().encode(),
            compiler.compiler_version().encode()]


def object_key(unit: SourceUnit, levels: tuple[str, ...] = isa.PORTABLE) -> str:
    """Cache key of a kernel unit's object file, built for ``levels``."""
    h = hashlib.sha256(b"cpu-object")
    for part in [unit.content_key.encode(), *_toolchain(unit_flags(levels))]:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


def cluster_key(sources: Sources, levels: tuple[str, ...] = isa.PORTABLE) -> str:
    """Cache key of a cluster's artifact: every unit's content key, the host runner,
    the flags of both and the toolchain."""
    parts = [u.content_key for u in sources.units] + [
        sources.host, " ".join(HOST_FLAGS), " ".join(unit_flags(levels))]
    return compiler.cache_key("\0".join(parts), "cpu")


def _compile(text: str, name: str, out_dir: pathlib.Path,
             flags: list[str] = COMPILE_FLAGS) -> bytes:
    """Compiles one translation unit to an object file; returns its bytes."""
    src, obj = out_dir / f"{name}.cc", out_dir / f"{name}.o"
    src.write_text(text)
    cmd = [compiler.resolve(compiler.cxx()), *flags, f"-I{native.ral_include_dir()}",
           "-c", str(src), "-o", str(obj)]
    data = compiler.run_for_output(cmd, obj, "object file")
    problem = elf_check.object_problem(data)
    if problem is not None:
        raise CompileError(f"{' '.join(cmd)} exited 0 but its output is not a loadable object "
                           f"file: {problem}")
    return data


def _timed_compile(text: str, name: str, out_dir: pathlib.Path,
                   flags: list[str]) -> tuple[bytes, float]:
    start = time.perf_counter()
    data = _compile(text, name, out_dir, flags)
    return data, time.perf_counter() - start


def _cached_object(unit: SourceUnit, out_dir: pathlib.Path,
                   levels: tuple[str, ...]) -> tuple[bytes, float | None]:
    """(object of ``unit`` for ``levels``, compiler seconds or None if it came from
    the kernel cache). A miss is compiled and stored under the key's lock, so
    processes starting together compile it once."""
    seconds: list[float] = []

    def make() -> bytes:
        data, took = _timed_compile(unit.text, unit.name, out_dir, unit_flags(levels))
        seconds.append(took)
        return data

    data, _ = compiler.cached_object(object_key(unit, levels), unit.name, "kernel object", make,
                                     problem=elf_check.object_problem)
    return data, (seconds[0] if seconds else None)


def compile_and_link(sources: Sources, name: str, counts: UnitCounts,
                     levels: tuple[str, ...] = isa.PORTABLE) -> bytes:
    """The shared object of ``sources``: kernel objects for ``levels`` (cached or
    compiled) and the host runner compiled on ``compile_jobs()`` processes, then
    linked."""
    with tempfile.TemporaryDirectory(prefix="disc_tf_build_") as tmp:
        out = pathlib.Path(tmp)
        with concurrent.futures.ThreadPoolExecutor(compile_jobs()) as pool:
            host = pool.submit(_timed_compile, sources.host, f"{name}_host", out, HOST_FLAGS)
            kernels = [pool.submit(_cached_object, u, out, levels) for u in sources.units]
            data, counts.seconds["host runner"] = host.result()
            objects = [data]
            for unit, f in zip(sources.units, kernels):
                data, seconds = f.result()
                objects.append(data)
                if seconds is None:
                    counts.cached += 1
                else:
                    counts.compiled += 1
                    counts.seconds[unit.name] = seconds
        paths = []
        for n, data in enumerate(objects):
            path = out / f"part{n}.o"
            path.write_bytes(data)
            paths.append(str(path))
        so = out / f"{name}.so"
        cmd = [compiler.resolve(compiler.cxx()), "-shared", *paths, "-o", str(so),
               *compiler.LINK_FLAGS]
        return compiler.run_for_output(cmd, so, "shared object")


def build(sources: Sources, name: str, num_kernels: int,
          levels: tuple[str, ...] = isa.PORTABLE) -> compiler.Artifact:
    """The artifact of a cluster's CPU sources with kernels for the x86-64 ``levels``,
    from the cache or built (counted in ``compilations``/``cache_hits``); the
    artifact says how many of its kernel units were compiled and how many came from
    the kernel cache."""
    counts = UnitCounts()
    start = time.perf_counter()
    artifact = compiler.cached_build(cluster_key(sources, levels), name, num_kernels, "cpu",
                                     lambda: compile_and_link(sources, name, counts, levels))
    artifact.units_compiled, artifact.units_cached = counts.compiled, counts.cached
    artifact.unit_seconds = dict(counts.seconds)
    if not artifact.from_cache:
        log.info("cluster %s: %d kernel units compiled, %d from the kernel cache, for %s "
                 "(%.2fs, %d jobs)", name, counts.compiled, counts.cached, ", ".join(levels),
                 time.perf_counter() - start, compile_jobs())
    return artifact
