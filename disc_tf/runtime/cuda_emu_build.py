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

Most of a unit's compile used to be what every unit shares: parsing the C++
library headers, and compiling the emulator's launch loop and RAL. So the device
unit sees C headers only: ``cuda_emulator.h`` is the device API, and the emulator's
``device_include/math.h`` stands in for ``<math.h>`` (as CUDA's does on a GPU);
and each process prepares once (``prebuilt_dir``) the two objects that every
artifact links: ``emu_runtime.cc`` (the launch loop) and ``emu_host_runtime.cc``
(``emu_ral.h``), so the host unit is the host runner as generated, which includes
only C headers and the RAL's. They are kept in the artifact cache (authenticated
like kernel objects) and copied into a directory private to the process. Where
they cannot be made, each build compiles them with its units; the artifact
behaves the same.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import functools
import hashlib
import logging
import pathlib
import shutil
import subprocess
import tempfile
import threading

from disc_tf.runtime import compiler, elf_check, native
from disc_tf.runtime.compiler import Artifact, CompileError
from disc_tf.sources import Sources

TARGET = "cuda-emu"
#: Flags of both translation units: the CPU backend's numerics (no contraction), and
#: nvcc's language level (C++17: code the GPU build would reject fails here too; its
#: headers also parse faster than C++20's).
FLAGS = ["-std=c++17", "-O1", "-fPIC", "-fwrapv", "-fno-math-errno", "-ffp-contract=off",
         "-fno-exceptions", "-fno-rtti", "-pthread", "-Wno-unknown-pragmas",
         "-Wno-attributes", "-Wno-psabi"]
LINK_FLAGS = ["-shared", "-pthread", "-Wl,-z,defs"]


@functools.cache
def link_flags() -> list[str]:
    """LINK_FLAGS, with binutils' gold where the host has it: an emulator artifact is
    four small objects, which gold links in a quarter of the default linker's 0.12 s."""
    return [*LINK_FLAGS, "-fuse-ld=gold"] if shutil.which("ld.gold") else list(LINK_FLAGS)

#: The emulator's symbols stay in the artifact (each has its own emulator).
HIDDEN = ["-fvisibility=hidden"]
#: The emulator's device API, included first in the device unit.
EMULATOR_HEADER = "cuda_emulator.h"
#: The objects every artifact links, prepared once per process: output name ->
#: (source in cc/cuda_emu, flags beyond FLAGS).
PREBUILT = {"emu_runtime.o": ("emu_runtime.cc", HIDDEN),
            "emu_host_runtime.o": ("emu_host_runtime.cc", [])}

log = logging.getLogger("disc_tf.runtime")


def _source_dir() -> pathlib.Path:
    return pathlib.Path(__file__).resolve().parents[2] / "cc"


def header_dirs() -> dict[str, pathlib.Path]:
    """The directories the two translation units include from."""
    cc = _source_dir()
    dirs = {"emu": cc / "cuda_emu", "emu_include": cc / "cuda_emu" / "include",
            "emu_device_include": cc / "cuda_emu" / "device_include",
            "ral_cuda": cc / "ral_cuda", "ral": native.ral_include_dir(), "ral_src": cc / "ral"}
    if not (dirs["emu"] / EMULATOR_HEADER).is_file():
        raise CompileError(f"the CUDA emulator's headers are not in {dirs['emu']}")
    return dirs


def _headers() -> list[pathlib.Path]:
    d = header_dirs()
    return [d["emu"] / EMULATOR_HEADER, d["emu"] / "cublas_emu.h", d["emu"] / "emu_ral.h",
            d["emu"] / "emu_runtime.cc", d["emu_device_include"] / "math.h",
            d["emu"] / "emu_host_runtime.cc",
            d["ral_cuda"] / "cublas_gemm.h",
            d["ral_cuda"] / "ral_forward.h", d["ral_src"] / "disc_ral_cuda.h",
            d["ral"] / "disc_ral.h", *sorted(d["emu_include"].glob("*.h"))]


def _includes() -> list[str]:
    d = header_dirs()
    return [f"-I{d['emu_include']}", f"-I{d['emu']}", f"-I{d['ral_cuda']}",
            f"-I{d['ral']}", f"-I{d['ral_src']}"]


def device_flags() -> list[str]:
    """Flags of the device unit beyond FLAGS and its include path: the emulator included
    first, by absolute path (a bare name would be looked up in the working directory)."""
    return [*HIDDEN, "-include", str(header_dirs()["emu"] / EMULATOR_HEADER)]


def device_includes() -> list[str]:
    """The device unit's include path: the emulator's ``<math.h>`` first."""
    return [f"-I{header_dirs()['emu_device_include']}", *_includes()]


def device_unit(sources: Sources) -> str:
    """The device translation unit: the kernels as generated, then the dispatch
    the emulated RAL calls (launch index -> kernel) and the device globals."""
    cases = [f"    case {i}: ok = disc_emu::Launch(&{name}, grid, block, shared_bytes, params, "
             f"error, error_size); break;" for i, name in enumerate(sources.functions)]
    globals_ = [f'  if (!strcmp(name, "{g}")) return (void*){g};'
                for g in sources.device_globals]
    return "\n".join([
        sources.device,
        "",
        "// ---- cuda-emu: launch dispatch (the host runner's function order) ----",
        'extern "C" __attribute__((visibility("hidden"))) int32_t disc_emu_launch(',
        "    int32_t function, uint32_t grid, uint32_t block, uint32_t shared_bytes,",
        "    void** params, char* error, uint64_t error_size) {",
        "  bool ok = false;",
        "  switch (function) {",
        *cases,
        '    default: snprintf(error, error_size, "no device function %d", (int)function);',
        "  }",
        "  return ok ? 0 : 1;",
        "}",
        'extern "C" __attribute__((visibility("hidden"))) void* disc_emu_global(const char* name) {',
        *globals_,
        "  return nullptr;",
        "}",
        "",
    ])


def host_unit(sources: Sources, ral_linked: bool = False) -> str:
    """The host translation unit: the runner as generated, then the emulated RAL
    (unless ``ral_linked``: the prebuilt ``emu_host_runtime.o`` brings it)."""
    if ral_linked:
        return sources.host
    return sources.host + '\n#include "emu_ral.h"  // cuda-emu: disc_entry over the emulator\n'


def cache_key(sources: Sources) -> str:
    """Key of a cuda-emu artifact: both translation units as compiled (the sources with
    the dispatch around them: the functions and device globals), the loop units, the
    emulator and RAL headers, the flags, the compiler and the target."""
    h = hashlib.sha256()
    parts = [device_unit(sources).encode(), host_unit(sources, ral_linked=True).encode(),
             *(u.text.encode() for u in sources.units),
             *(p.read_bytes() for p in _headers()),
             " ".join(FLAGS + HIDDEN + ["-include", EMULATOR_HEADER] + link_flags()).encode(),
             compiler.cxx().encode(), compiler.compiler_version().encode(), TARGET.encode()]
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


_prebuilt_lock = threading.Lock()
#: Key of the sources and toolchain -> this process's directory of prebuilt outputs
#: (None: they could not be made; units are compiled without them).
_prebuilt: dict[str, pathlib.Path | None] = {}


def _prebuilt_keys() -> dict[str, str]:
    """Cache key of each ``PREBUILT`` output: its source, every emulator and RAL header
    (read once for all), its flags and the compiler."""
    headers = hashlib.sha256(b"".join(hashlib.sha256(p.read_bytes()).digest()
                                      for p in _headers())).digest()
    toolchain = [compiler.cxx().encode(), compiler.compiler_version().encode()]
    keys = {}
    for output, (source, extra) in PREBUILT.items():
        h = hashlib.sha256(b"cuda-emu prebuilt")
        for part in [output.encode(), source.encode(), headers,
                     " ".join(FLAGS + extra).encode(), *toolchain]:
            h.update(hashlib.sha256(part).digest())
        keys[output] = h.hexdigest()
    return keys


def _runtime_command(output: str, out: pathlib.Path) -> list[str]:
    """The compiler command of ``PREBUILT[output]``, writing ``out``."""
    source, extra = PREBUILT[output]
    return [compiler.resolve(compiler.cxx()), *FLAGS, *extra, *_includes(), "-c",
            str(header_dirs()["emu"] / source), "-o", str(out)]


def _prebuild(output: str, key: str, out_dir: pathlib.Path) -> None:
    """Writes ``out_dir/output`` (cache key ``key``): from the artifact cache, else
    compiled (under the key's lock, so processes starting together compile it once)
    and stored there."""
    data, made = compiler.cached_object(
        key, output, "cuda-emu prebuilt",
        lambda: compiler.run_for_output(_runtime_command(output, out_dir / output),
                                        out_dir / output, output),
        problem=elf_check.object_problem)
    if not made:
        (out_dir / output).write_bytes(data)


def prebuilt_dir() -> pathlib.Path | None:
    """This process's directory (private, removed at exit) of the ``PREBUILT``
    objects; made on first use. None if they cannot all be made (a warning says
    why; each build then compiles them with its units)."""
    keys = _prebuilt_keys()
    key = "".join(keys.values())
    with _prebuilt_lock:
        if key in _prebuilt:
            return _prebuilt[key]
        out: pathlib.Path | None = pathlib.Path(tempfile.mkdtemp(prefix="disc_tf_emu_prebuilt_"))
        atexit.register(shutil.rmtree, out, True)
        try:
            with concurrent.futures.ThreadPoolExecutor(len(PREBUILT)) as pool:
                for done in [pool.submit(_prebuild, o, k, out) for o, k in keys.items()]:
                    done.result()
        except (CompileError, OSError) as e:
            log.warning("cuda-emu: no prebuilt launch loop and RAL (%s); each build "
                        "compiles them", e)
            shutil.rmtree(out, ignore_errors=True)
            out = None
        _prebuilt[key] = out
        return out


def _compile(sources: Sources, name: str) -> bytes:
    cxx = shutil.which(compiler.cxx())
    if cxx is None:
        raise CompileError(f"C++ compiler {compiler.cxx()!r} not found")
    includes = _includes()
    pre = prebuilt_dir()
    timeout = compiler.compile_timeout()
    with tempfile.TemporaryDirectory(prefix="disc_tf_cuda_emu_") as tmp_name:
        tmp = pathlib.Path(tmp_name)
        (tmp / "device.cc").write_text(device_unit(sources))
        (tmp / "host.cc").write_text(host_unit(sources, ral_linked=pre is not None))
        cmds = [[cxx, *FLAGS, *device_flags(), *device_includes(), "-c", str(tmp / "device.cc"),
                 "-o", str(tmp / "device.o")],
                [cxx, *FLAGS, *includes, "-c", str(tmp / "host.cc"),
                 "-o", str(tmp / "host.o")]]
        objects = ["device.o", "host.o"]
        for unit in sources.units:  # a loop's step runners, one translation unit each
            (tmp / f"{unit.name}.cc").write_text(unit.text)
            cmds.append([cxx, *FLAGS, *includes, "-c", str(tmp / f"{unit.name}.cc"),
                         "-o", str(tmp / f"{unit.name}.o")])
            objects.append(f"{unit.name}.o")
        if pre is not None:  # the launch loop and the RAL: linked prebuilt
            linked = [str(pre / o) for o in PREBUILT]
        else:  # compiled here (the RAL is in the host unit)
            cmds.append(_runtime_command("emu_runtime.o", tmp / "emu_runtime.o"))
            linked = [str(tmp / "emu_runtime.o")]
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
        link = [cxx, *link_flags(), *(str(tmp / o) for o in objects), *linked, "-o", str(out)]
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
