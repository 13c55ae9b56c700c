"""The ``cuda-emu`` target: the CUDA backend's generated sources, built for the CPU.

The device code is compiled by the C++ compiler against the CUDA emulator
(``cc/cuda_emu/cuda_emulator.h``: grids, blocks as fibers, ``__syncthreads``,
lock-step warp collectives, shared memory), with a generated dispatch that runs
launch ``i`` of the host runner's function list; the host runner is compiled
unchanged and linked with ``cc/cuda_emu/emu_ral.h``, which exports the CPU
entry point (``disc_entry``). The result is a CPU artifact the CPU
``DiscCluster`` kernel loads and runs: the whole GPU code path -- plan, device
code, host runner, launch configuration, the cuBLAS call mapping -- without a
GPU. It is for testing that path, not for speed.
"""

from __future__ import annotations

import hashlib
import pathlib
import shutil
import subprocess
import tempfile

from disc_tf.runtime import compiler, native
from disc_tf.runtime.compiler import Artifact, CompileError
from disc_tf.sources import Sources

TARGET = "cuda-emu"
#: Flags of both translation units (the CPU backend's numerics: no contraction).
FLAGS = ["-std=c++20", "-O1", "-fPIC", "-fwrapv", "-fno-math-errno", "-ffp-contract=off",
         "-fno-exceptions", "-fno-rtti", "-pthread", "-Wno-unknown-pragmas",
         "-Wno-attributes", "-Wno-psabi"]
LINK_FLAGS = ["-shared", "-pthread", "-Wl,-z,defs"]


def _source_dir() -> pathlib.Path:
    return pathlib.Path(__file__).resolve().parents[2] / "cc"


def header_dirs() -> dict[str, pathlib.Path]:
    """The directories the two translation units include from."""
    cc = _source_dir()
    dirs = {"emu": cc / "cuda_emu", "emu_include": cc / "cuda_emu" / "include",
            "ral_cuda": cc / "ral_cuda", "ral": native.ral_include_dir(), "ral_src": cc / "ral"}
    if not (dirs["emu"] / "cuda_emulator.h").is_file():
        raise CompileError(f"the CUDA emulator's headers are not in {dirs['emu']}")
    return dirs


def _headers() -> list[pathlib.Path]:
    d = header_dirs()
    return [d["emu"] / "cuda_emulator.h", d["emu"] / "cublas_emu.h", d["emu"] / "emu_ral.h",
            d["ral_cuda"] / "cublas_gemm.h", d["ral_src"] / "disc_ral_cuda.h",
            d["ral"] / "disc_ral.h"]


def device_unit(sources: Sources) -> str:
    """The device translation unit: the kernels as generated, then the dispatch
    the emulated RAL calls (launch index -> kernel) and the device globals."""
    cases = [f"    case {i}: ok = disc_emu::Launch(&{name}, grid, block, shared_bytes, params, "
             f"&why); break;" for i, name in enumerate(sources.functions)]
    globals_ = [f'  if (!std::strcmp(name, "{g}")) return (void*){g};'
                for g in sources.device_globals]
    return "\n".join([
        sources.device,
        "",
        "// ---- cuda-emu: launch dispatch (the host runner's function order) ----",
        'extern "C" __attribute__((visibility("hidden"))) int32_t disc_emu_launch(',
        "    int32_t function, uint32_t grid, uint32_t block, uint32_t shared_bytes,",
        "    void** params, char* error, uint64_t error_size) {",
        "  std::string why;",
        "  bool ok = false;",
        "  switch (function) {",
        *cases,
        '    default: why = "no device function " + std::to_string(function);',
        "  }",
        '  if (!ok) std::snprintf(error, error_size, "%s", why.c_str());',
        "  return ok ? 0 : 1;",
        "}",
        'extern "C" __attribute__((visibility("hidden"))) void* disc_emu_global(const char* name) {',
        *globals_,
        "  return nullptr;",
        "}",
        "",
    ])


def host_unit(sources: Sources) -> str:
    """The host translation unit: the runner as generated, then the emulated RAL."""
    return sources.host + '\n#include "emu_ral.h"  // cuda-emu: disc_entry over the emulator\n'


def cache_key(sources: Sources) -> str:
    """Key of a cuda-emu artifact: both sources, the emulator and RAL headers, the
    flags, the compiler and the target."""
    h = hashlib.sha256()
    parts = [sources.text.encode(), *(u.text.encode() for u in sources.units),
             "\n".join(sources.functions).encode(),
             "\n".join(sources.device_globals).encode(),
             *(p.read_bytes() for p in _headers()), " ".join(FLAGS + LINK_FLAGS).encode(),
             compiler.cxx().encode(), compiler.compiler_version().encode(), TARGET.encode()]
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


def _compile(sources: Sources, name: str) -> bytes:
    cxx = shutil.which(compiler.cxx())
    if cxx is None:
        raise CompileError(f"C++ compiler {compiler.cxx()!r} not found")
    d = header_dirs()
    includes = [f"-I{d['emu_include']}", f"-I{d['emu']}", f"-I{d['ral_cuda']}",
                f"-I{d['ral']}", f"-I{d['ral_src']}"]
    timeout = compiler.compile_timeout()
    with tempfile.TemporaryDirectory(prefix="disc_tf_cuda_emu_") as tmp_name:
        tmp = pathlib.Path(tmp_name)
        (tmp / "device.cc").write_text(device_unit(sources))
        (tmp / "host.cc").write_text(host_unit(sources))
        cmds = [[cxx, *FLAGS, "-fvisibility=hidden", "-include", "cuda_emulator.h",
                 *includes, "-c", str(tmp / "device.cc"),
                 "-o", str(tmp / "device.o")],
                [cxx, *FLAGS, *includes, "-c", str(tmp / "host.cc"), "-o", str(tmp / "host.o")]]
        for unit in sources.units:  # a loop's step runners, one translation unit each
            (tmp / f"{unit.name}.cc").write_text(unit.text)
            cmds.append([cxx, *FLAGS, *includes, "-c", str(tmp / f"{unit.name}.cc"),
                         "-o", str(tmp / f"{unit.name}.o")])
        procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for c in cmds]
        for cmd, proc in zip(cmds, procs):
            try:
                _, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired as e:
                for p in procs:
                    p.kill()
                raise CompileError(f"{' '.join(cmd)} timed out after {timeout:.0f}s") from e
            if proc.returncode != 0:
                raise CompileError(f"{' '.join(cmd)} failed (exit {proc.returncode}) "
                                   f"building cluster {name} for cuda-emu:\n{err[-4000:]}")
        out = tmp / f"{name}.so"
        objects = ["device.o", "host.o", *(f"{u.name}.o" for u in sources.units)]
        link = [cxx, *LINK_FLAGS, *(str(tmp / o) for o in objects), "-o", str(out)]
        proc = compiler.run(link, timeout)
        if proc.returncode != 0:
            raise CompileError(f"{' '.join(link)} failed (exit {proc.returncode}):\n"
                               f"{proc.stderr[-4000:]}")
        return out.read_bytes()


def build(sources: Sources, name: str, num_kernels: int, levels: tuple[str, ...] = ()) -> Artifact:
    """The cuda-emu artifact of CUDA sources, compiling unless cached (``levels``,
    the CPU's x86-64 levels, do not apply: the emulator is built for the baseline)."""
    if sources.target != "cuda" or not sources.host:
        raise CompileError(f"cluster {name}: not CUDA sources (target {sources.target!r})")
    return compiler.cached_build(cache_key(sources), name, num_kernels, TARGET,
                                 lambda: _compile(sources, name))
