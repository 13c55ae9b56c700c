"""CUDA compiler driver: device code -> fatbin (nvcc), host runner + fatbin ->
shared object (the C++ compiler), through the artifact cache.

The device code is built for every architecture in ``CUDA_ARCHS`` (SASS) plus
PTX of the newest (JIT-compiled by drivers of later GPUs). The fatbin is
embedded in the artifact's read-only data as ``disc_cuda_fatbin``; the
artifact needs no CUDA library to load (the host loads the fatbin with the
driver API). nvcc is ``$DISC_TF_NVCC``, else ``nvcc`` on PATH, else
``/usr/local/cuda/bin/nvcc``; no GPU is needed to build.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import pathlib
import shutil
import struct
import tempfile

from disc_tf.runtime import compiler, native
from disc_tf.runtime.compiler import Artifact, CompileError
from disc_tf.sources import Sources

log = logging.getLogger("disc_tf.runtime")

#: GPU architectures that get SASS; PTX is added for the last one.
CUDA_ARCHS = ("80", "90")
NVCC_FLAGS = ["-std=c++17", "-O3", "--fatbin"]
HOST_FLAGS = [*compiler.CXX_FLAGS, "-Wl,-z,defs"]
_FALLBACK_NVCC = "/usr/local/cuda/bin/nvcc"
_FATBIN_MAGIC = 0xBA55ED50
#: Assembler source that embeds the fatbin (written next to it at build time).
_EMBED_ASM = """\
  .section .rodata
  .balign 64
  .globl disc_cuda_fatbin
  .type disc_cuda_fatbin, @object
disc_cuda_fatbin:
  .incbin "{fatbin}"
  .globl disc_cuda_fatbin_end
disc_cuda_fatbin_end:
  .size disc_cuda_fatbin, disc_cuda_fatbin_end - disc_cuda_fatbin
  .section .note.GNU-stack,"",@progbits
"""
#: Host code that reports the embedded fatbin's size.
_SIZE_FN = """
extern "C" const unsigned char disc_cuda_fatbin[];
extern "C" const unsigned char disc_cuda_fatbin_end[];
extern "C" uint64_t disc_cuda_fatbin_size(void) {
  return (uint64_t)(disc_cuda_fatbin_end - disc_cuda_fatbin);
}
"""


def nvcc() -> str:
    """The nvcc command: ``$DISC_TF_NVCC``, ``nvcc`` on PATH, or the CUDA default path.

    Raises CompileError when none exists.
    """
    configured = os.environ.get("DISC_TF_NVCC", "").strip()
    for candidate in ([configured] if configured else ["nvcc", _FALLBACK_NVCC]):
        path = shutil.which(candidate)
        if path:
            return path
    where = "$DISC_TF_NVCC" if configured else f"PATH and {_FALLBACK_NVCC}"
    raise CompileError(f"nvcc not found (looked up via {where}); install the CUDA toolkit "
                       "or point DISC_TF_NVCC at nvcc")


@functools.cache
def _nvcc_version(path: str) -> str:
    proc = compiler.run([path, "--version"], min(compiler.compile_timeout(), 60.0))
    lines = [x for x in proc.stdout.splitlines() if x.strip()]
    if proc.returncode != 0 or not lines:
        raise CompileError(f"{path} --version failed (exit {proc.returncode})")
    return lines[-1]


def gencode_flags() -> list[str]:
    """``-gencode`` flags: SASS for every arch in CUDA_ARCHS, PTX for the newest."""
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in CUDA_ARCHS[:-1]]
    last = CUDA_ARCHS[-1]
    return flags + [f"-gencode=arch=compute_{last},code=[sm_{last},compute_{last}]"]


def ral_cuda_header() -> pathlib.Path:
    """``disc_ral_cuda.h``: next to ``disc_ral.h`` if installed there, else in the
    source tree's ``cc/ral``."""
    for d in (native.ral_include_dir(), pathlib.Path(__file__).resolve().parents[2] / "cc" / "ral"):
        if (d / "disc_ral_cuda.h").is_file():
            return d / "disc_ral_cuda.h"
    raise CompileError("disc_ral_cuda.h not found (neither installed nor in cc/ral)")


def cache_key(sources: Sources) -> str:
    """Key of CUDA sources: both, both RAL headers, flags, both compilers, the target."""
    h = hashlib.sha256()
    parts = [sources.text.encode(), *(u.text.encode() for u in sources.units),
             (native.ral_include_dir() / "disc_ral.h").read_bytes(),
             ral_cuda_header().read_bytes(), " ".join(NVCC_FLAGS + gencode_flags()).encode(),
             " ".join(HOST_FLAGS).encode(), compiler.cxx().encode(),
             compiler.compiler_version().encode(), _nvcc_version(nvcc()).encode(), b"cuda"]
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


def _check(proc, cmd: list[str], what: str) -> None:
    if proc.returncode != 0:
        raise CompileError(f"{' '.join(cmd)} failed (exit {proc.returncode}) {what}:\n"
                           f"{proc.stderr[-4000:]}")


def compile_fatbin(device_source: str, tmp: pathlib.Path) -> pathlib.Path:
    """Runs nvcc on ``device_source`` in ``tmp``; returns the fatbin's path."""
    src, out = tmp / "kernels.cu", tmp / "kernels.fatbin"
    src.write_text(device_source)
    cmd = [nvcc(), *NVCC_FLAGS, *gencode_flags(), str(src), "-o", str(out)]
    _check(compiler.run(cmd, compiler.compile_timeout()), cmd, "compiling device code")
    if not out.is_file() or out.stat().st_size == 0:
        raise CompileError(f"{' '.join(cmd)} wrote no fatbin")
    return out


def _run_compilers(sources: Sources, name: str) -> bytes:
    device, host = sources.device, sources.host
    include = native.ral_include_dir()
    cuda_include = ral_cuda_header().parent
    cxx = shutil.which(compiler.cxx())
    if cxx is None:
        raise CompileError(f"C++ compiler {compiler.cxx()!r} not found")
    with tempfile.TemporaryDirectory(prefix="disc_tf_cuda_") as tmp_name:
        tmp = pathlib.Path(tmp_name)
        fatbin = compile_fatbin(device, tmp)
        (tmp / "embed.S").write_text(_EMBED_ASM.replace("{fatbin}", str(fatbin)))
        (tmp / f"{name}.cc").write_text(host + _SIZE_FN)
        steps = []  # a loop's step runners, one translation unit each
        for unit in sources.units:
            steps.append(tmp / f"{unit.name}.cc")
            steps[-1].write_text(unit.text)
        out = tmp / f"{name}.so"
        cmd = [cxx, *HOST_FLAGS, f"-I{include}", f"-I{cuda_include}", str(tmp / f"{name}.cc"),
               *map(str, steps), str(tmp / "embed.S"), "-o", str(out)]
        proc = compiler.run(cmd, compiler.compile_timeout())
        _check(proc, cmd, "compiling the host runner")
        data = out.read_bytes() if out.is_file() else b""
        if not data:
            raise CompileError(f"{' '.join(cmd)} wrote no shared object")
        return data


def build(sources: Sources, name: str, num_kernels: int, levels: tuple[str, ...] = ()) -> Artifact:
    """The artifact of CUDA sources (device and host runner), compiling unless cached
    (``levels``, the CPU's x86-64 levels, do not apply)."""
    if sources.target != "cuda" or not sources.host:
        raise CompileError(f"cluster {name}: not CUDA sources (target {sources.target!r})")
    return compiler.cached_build(cache_key(sources), name, num_kernels, "cuda",
                                 lambda: _run_compilers(sources, name))


def embedded_fatbin(artifact: bytes) -> bytes:
    """The fatbin a CUDA artifact carries (found by its header); raises ValueError."""
    start = artifact.find(struct.pack("<I", _FATBIN_MAGIC))
    if start < 0:
        raise ValueError("the artifact carries no CUDA fatbin")
    _, _, header, size = struct.unpack_from("<IHHQ", artifact, start)
    return artifact[start:start + header + size]


def fatbin_entries(fatbin: bytes) -> list[tuple[str, int]]:
    """(kind "sass" | "ptx", sm number) of every entry of a fatbin."""
    magic, _, header, size = struct.unpack_from("<IHHQ", fatbin, 0)
    if magic != _FATBIN_MAGIC:
        raise ValueError("not a CUDA fatbin")
    entries, off = [], header
    while off < header + size:
        kind, _, entry_header, payload = struct.unpack_from("<HHIQ", fatbin, off)
        arch = struct.unpack_from("<I", fatbin, off + 28)[0]
        entries.append(({1: "ptx", 2: "sass"}.get(kind, str(kind)), arch))
        off += entry_header + payload
    return entries
