"""Compiler driver: generated C++ -> shared object, through the cache.

The compiler is ``$DISC_TF_CXX`` (default ``g++``); a compile is killed after
``$DISC_TF_COMPILE_TIMEOUT`` seconds (default 300). A missing compiler, a
rejected source or a timeout raises ``CompileError``; the optimizer then leaves
the cluster as TF ops.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable

from disc_tf.errors import CompileError
from disc_tf.runtime import cache, elf_check, native, remote_cache

__all__ = ["Artifact", "CompileError", "build", "cache_key", "cached_build", "cached_object",
           "compile_timeout",
           "compiler_version", "cxx", "resolve", "run", "run_for_output"]

log = logging.getLogger("disc_tf.runtime")

#: The default C++ compiler; ``$DISC_TF_CXX`` overrides it.
CXX = "g++"
DEFAULT_COMPILE_TIMEOUT = 300.0
CXX_FLAGS = [
    "-std=c++17", "-O3", "-shared", "-fPIC", "-fwrapv", "-fno-math-errno",
    "-ffp-contract=off", "-fno-exceptions", "-fno-rtti",
    "-fopenmp-simd",  # honours `#pragma omp simd` (no OpenMP runtime)
    # Floating-point operations raise no trap the kernels look at, so GCC may compute
    # both arms of a select: without it, a Select/SelectV2 whose arm multiplies or
    # adds is "control flow" to the vectorizer and the whole fused loop stays scalar
    # (the recommender's feature normalisation: 5.8 ns per element). Values are the
    # same: this permits speculation, not reassociation or other rounding.
    "-fno-trapping-math",
]
#: glibc's vector math library backs the vectorized expf/logf/tanhf/powf calls.
LINK_FLAGS = ["-lmvec", "-lm"]


@dataclasses.dataclass
class Artifact:
    """A compiled cluster: the shared object's bytes and what describes it."""

    data: bytes
    sha256: str
    num_kernels: int
    cache_key: str
    from_cache: bool
    compile_seconds: float
    #: kernel units (CPU) this build compiled, and took from the kernel cache
    units_compiled: int = 0
    units_cached: int = 0
    #: compiler seconds of each translation unit this build compiled
    unit_seconds: dict[str, float] = dataclasses.field(default_factory=dict)


def cxx() -> str:
    """The C++ compiler command: ``$DISC_TF_CXX``, else ``g++``."""
    return os.environ.get("DISC_TF_CXX", "").strip() or CXX


def compile_timeout() -> float:
    """Seconds a compile may run: ``$DISC_TF_COMPILE_TIMEOUT``, else 300."""
    raw = os.environ.get("DISC_TF_COMPILE_TIMEOUT", "").strip()
    if not raw:
        return DEFAULT_COMPILE_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if value <= 0:
        log.warning("DISC_TF_COMPILE_TIMEOUT=%r is not a positive number of seconds; using %g",
                    raw, DEFAULT_COMPILE_TIMEOUT)
        return DEFAULT_COMPILE_TIMEOUT
    return value


def resolve(compiler: str) -> str:
    """The path of ``compiler``; CompileError if it is not installed."""
    path = shutil.which(compiler)
    if path is None:
        where = "$DISC_TF_CXX" if os.environ.get("DISC_TF_CXX", "").strip() else "PATH"
        raise CompileError(
            f"C++ compiler {compiler!r} not found (looked up via {where}); install g++ or "
            "point DISC_TF_CXX at a C++17 compiler"
        )
    return path


def run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    """Runs ``cmd``; on timeout kills its whole process group (the driver's
    cc1plus/ld children too) and raises CompileError."""
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    except OSError as e:
        raise CompileError(f"cannot run C++ compiler {cmd[0]!r}: {e}") from e
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise CompileError(
            f"{cmd[0]} did not finish within {timeout:g}s (DISC_TF_COMPILE_TIMEOUT)"
        ) from None
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@functools.cache
def _compiler_version(path: str) -> str:
    proc = run([path, "--version"], min(compile_timeout(), 60.0))
    lines = proc.stdout.splitlines()
    if proc.returncode != 0 or not lines:
        raise CompileError(f"{path} --version failed (exit {proc.returncode}): "
                           f"{proc.stderr.strip()[-1000:]}")
    return lines[0]


def compiler_version() -> str:
    """First line of ``<compiler> --version`` (part of every cache key)."""
    return _compiler_version(resolve(cxx()))


def cache_key(source: str, target: str = "cpu") -> str:
    """Key of a generated source: hash of it, the RAL, flags, compiler, target.

    Raises CompileError when there is no usable compiler.
    """
    ral = (native.ral_include_dir() / "disc_ral.h").read_bytes()
    h = hashlib.sha256()
    for part in (source.encode(), ral, " ".join(CXX_FLAGS + LINK_FLAGS).encode(),
                 cxx().encode(), compiler_version().encode(), target.encode()):
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


def _run_compiler(source: str, name: str) -> bytes:
    compiler = resolve(cxx())
    with tempfile.TemporaryDirectory(prefix="disc_tf_build_") as tmp:
        src = pathlib.Path(tmp) / f"{name}.cc"
        out = pathlib.Path(tmp) / f"{name}.so"
        src.write_text(source)
        cmd = [compiler, *CXX_FLAGS, f"-I{native.ral_include_dir()}", str(src), "-o", str(out),
               *LINK_FLAGS]
        return run_for_output(cmd, out, "shared object")


def run_for_output(cmd: list[str], out: pathlib.Path, what: str) -> bytes:
    """Runs compiler command ``cmd`` (within the compile timeout) and returns the bytes
    it wrote to ``out``; CompileError if it fails or writes nothing."""
    proc = run(cmd, compile_timeout())
    if proc.returncode != 0:
        raise CompileError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n"
                           f"{proc.stderr[-4000:]}")
    try:
        data = out.read_bytes()
    except OSError as e:
        raise CompileError(f"{' '.join(cmd)} wrote no {what}: {e}") from e
    if not data:
        raise CompileError(f"{' '.join(cmd)} wrote an empty {what}")
    return data


def build(source: str, name: str, num_kernels: int, target: str = "cpu") -> Artifact:
    """Returns the artifact of ``source``, compiling it unless cached.

    Counts ``compilations`` or ``cache_hits`` in ``disc_tf.stats()``; a failed
    compile counts neither and raises CompileError.
    """
    return cached_build(cache_key(source, target), name, num_kernels, target,
                        lambda: _run_compiler(source, name))


def _hit(key: str, name: str, target: str, repair: bool) -> Artifact | None:
    """The cached artifact of ``key`` if it is sound (``cache.lookup``) and loadable."""
    hit = cache.lookup(key, repair=repair)
    if hit is None:
        return None
    data, info = hit
    problem = elf_check.artifact_problem(data, target)
    if problem is not None:  # authentic but not loadable: an older disc_tf's, or a bug
        log.warning("cluster %s: cached artifact %s is not loadable (%s); rebuilding", name,
                    key[:12], problem)
        return None
    native.load().py.add_stat("cache_hits", 1)
    log.info("cluster %s: %s artifact %s from cache", name, target, key[:12])
    return Artifact(data, info["sha256"], info["num_kernels"], key, True, 0.0)


def _remote_hit(key: str, name: str, target: str,
                entry: remote_cache.Entry | None) -> Artifact | None:
    """The remote tier's verified ``entry`` of ``key`` if it is loadable, stored in
    the local cache too (call under ``cache.key_lock(key)``)."""
    if entry is None:
        return None
    data, info = entry
    problem = elf_check.artifact_problem(data, target)
    if problem is not None:
        log.warning("cluster %s: remote artifact %s is not loadable (%s); rebuilding", name,
                    key[:12], problem)
        return None
    try:
        cache.store(key, data, info)
    except OSError as e:
        log.warning("cluster %s: remote artifact not stored in the local cache (%s)", name, e)
    native.load().py.add_stat("cache_hits", 1)
    log.info("cluster %s: %s artifact %s from the remote cache", name, target, key[:12])
    return Artifact(data, info["sha256"], info["num_kernels"], key, True, 0.0)


def cached_object(key: str, name: str, kind: str, make: Callable[[], bytes],
                  problem: Callable[[bytes], str | None] | None = None) -> tuple[bytes, bool]:
    """(bytes of a build part under ``key``, whether this call made them): a sound
    entry of the artifact cache (not refused by ``problem``), else ``make()``'s bytes,
    made under the key's lock (processes starting together make them once) and stored
    as an authenticated object entry. A store that fails only warns."""

    def hit(repair: bool) -> bytes | None:
        found = cache.lookup(key, repair=repair, suffix=cache.OBJECT)
        if found is None or (problem is not None and problem(found[0]) is not None):
            return None
        return found[0]

    data = hit(repair=False)
    if data is not None:
        return data, False
    with cache.key_lock(key, compile_timeout()) as locked:
        data = hit(repair=locked)
        if data is not None:
            return data, False
        data = make()
        try:
            cache.store(key, data, {"sha256": hashlib.sha256(data).hexdigest(),
                                    "num_kernels": 0, "name": name, "kind": kind},
                        suffix=cache.OBJECT)
        except OSError as e:
            log.warning("%s %s: not stored in the cache (%s)", kind, name, e)
    return data, True


def cached_build(key: str, name: str, num_kernels: int, target: str,
                 compile_fn: Callable[[], bytes]) -> Artifact:
    """The artifact stored under ``key``, or ``compile_fn()``'s bytes stored there.

    A sound entry is read without a lock (so a read-only cache serves); else the
    key's lock is taken (waiting at most the compile timeout), so concurrent
    processes compile once. Then the remote tier (``remote_cache.py``, where
    configured) is asked, under its fleet-wide build lock, so processes on other
    hosts compile once too; its hit is stored locally. The compiler's output must
    be a loadable artifact of ``target`` (CompileError otherwise), and is stored
    locally and remotely. A store that fails (a full disk, a read-only cache, an
    unreachable server) only warns: the artifact is returned, and travels in the
    model. Counts ``compilations`` or ``cache_hits``.
    """
    hit = _hit(key, name, target, repair=False)
    if hit is not None:
        return hit
    start = time.perf_counter()
    with cache.key_lock(key, compile_timeout()) as locked:
        hit = _hit(key, name, target, repair=locked)
        if hit is not None:
            return hit
        with remote_cache.claim(key, compile_timeout()) as entry:
            hit = _remote_hit(key, name, target, entry)
            if hit is not None:
                return hit
            data = compile_fn()
            problem = elf_check.artifact_problem(data, target)
            if problem is not None:
                raise CompileError(f"cluster {name}: the compiler exited 0 but its output is not "
                                   f"a loadable {target} artifact: {problem}")
            seconds = time.perf_counter() - start
            sha = hashlib.sha256(data).hexdigest()
            info = {"sha256": sha, "num_kernels": num_kernels, "name": name,
                    "compile_seconds": seconds, "target": target}
            try:
                cache.store(key, data, info)
            except OSError as e:
                log.warning("cluster %s: artifact not stored in the cache (%s); it is kept in "
                            "memory and in the model", name, e)
            remote_cache.store(key, data, info)
    native.load().py.add_stat("compilations", 1)
    log.info("cluster %s: %s artifact compiled in %.2fs (%d kernels)", name, target, seconds,
             num_kernels)
    return Artifact(data, sha, num_kernels, key, False, seconds)
