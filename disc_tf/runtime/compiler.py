"""Compiler driver: generated C++ -> shared object, through the cache."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import pathlib
import subprocess
import tempfile
import time

from disc_tf.runtime import cache, native

log = logging.getLogger("disc_tf.runtime")

CXX = "g++"
CXX_FLAGS = [
    "-std=c++17", "-O3", "-shared", "-fPIC", "-fwrapv", "-fno-math-errno",
    "-ffp-contract=off", "-fno-exceptions", "-fno-rtti",
]
#: glibc's vector math library backs the vectorized expf/logf/tanhf/powf calls.
LINK_FLAGS = ["-lmvec", "-lm"]


class CompileError(RuntimeError):
    """The C++ compiler rejected a generated source (a disc_tf bug)."""


@dataclasses.dataclass
class Artifact:
    """A compiled cluster: the shared object's bytes and what describes it."""

    data: bytes
    sha256: str
    num_kernels: int
    cache_key: str
    from_cache: bool
    compile_seconds: float


@functools.cache
def compiler_version() -> str:
    """First line of ``g++ --version`` (part of every cache key)."""
    out = subprocess.run([CXX, "--version"], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()[0]


def cache_key(source: str, target: str = "cpu") -> str:
    """Key of a generated source: hash of it, the RAL, flags, compiler, target."""
    ral = (native.ral_include_dir() / "disc_ral.h").read_bytes()
    h = hashlib.sha256()
    for part in (source.encode(), ral, " ".join(CXX_FLAGS + LINK_FLAGS).encode(),
                 compiler_version().encode(), target.encode()):
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


def _run_compiler(source: str, name: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="disc_tf_build_") as tmp:
        src = pathlib.Path(tmp) / f"{name}.cc"
        out = pathlib.Path(tmp) / f"{name}.so"
        src.write_text(source)
        cmd = [CXX, *CXX_FLAGS, f"-I{native.ral_include_dir()}", str(src), "-o", str(out), *LINK_FLAGS]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise CompileError(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")
        return out.read_bytes()


def build(source: str, name: str, num_kernels: int, target: str = "cpu") -> Artifact:
    """Returns the artifact of ``source``, compiling it unless cached.

    Counts ``compilations`` or ``cache_hits`` in ``disc_tf.stats()``.
    """
    key = cache_key(source, target)
    stats = native.load().py
    start = time.perf_counter()
    with cache.key_lock(key):
        hit = cache.lookup(key)
        if hit is not None:
            data, info = hit
            stats.add_stat("cache_hits", 1)
            log.info("cluster %s: artifact %s from cache", name, key[:12])
            return Artifact(data, info["sha256"], info["num_kernels"], key, True, 0.0)
        data = _run_compiler(source, name)
        seconds = time.perf_counter() - start
        sha = hashlib.sha256(data).hexdigest()
        cache.store(key, data, {"sha256": sha, "num_kernels": num_kernels, "name": name,
                                "compile_seconds": seconds, "target": target})
    stats.add_stat("compilations", 1)
    log.info("cluster %s: compiled in %.2fs (%d kernels)", name, seconds, num_kernels)
    return Artifact(data, sha, num_kernels, key, False, seconds)
