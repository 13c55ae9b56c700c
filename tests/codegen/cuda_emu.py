"""Runs CUDA artifacts without a GPU: the host runner as built, the device code
compiled by g++ against ``cuda_emulator.h`` (see ``cuda_emu_host.cc``)."""

from __future__ import annotations

import pathlib
import re
import subprocess

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
RAL_DIR = HERE.parents[1] / "cc" / "ral"
TF_DTYPE = {np.dtype(np.float32): 1, np.dtype(np.int32): 3, np.dtype(np.int64): 9,
            np.dtype(np.bool_): 10, np.dtype(np.float16): 19}

_KERNEL = re.compile(r'extern "C" __global__ void __launch_bounds__\(\d+\) (\w+)\(const (\w+) a\)')
_GLOBAL = re.compile(r"__device__ const [\w ]+? (\w+)\[")
_FUNCTIONS = re.compile(r"kFunctions\[\] = \{(.*)\};")


def build_host(tmp: pathlib.Path) -> pathlib.Path:
    """The emulating host program."""
    exe = tmp / "cuda_emu_host"
    subprocess.run(["g++", "-std=c++17", "-O1", f"-I{RAL_DIR}", str(HERE / "cuda_emu_host.cc"),
                    "-o", str(exe), "-ldl"], check=True)
    return exe


def build_device(device: str, host: str, tmp: pathlib.Path) -> pathlib.Path:
    """Device code of one artifact as a CPU shared object exporting emu_launch/emu_global."""
    tmp.mkdir(parents=True, exist_ok=True)
    for header in ("cuda_fp16.h", "cuda_bf16.h"):
        (tmp / header).write_text("// provided by cuda_emulator.h\n")
    (tmp / "kernels.cu").write_text(device)
    structs = dict(_KERNEL.findall(device))
    order = re.findall(r'"(\w+)"', _FUNCTIONS.search(host).group(1))
    cases = [f"    case {i}: disc_emu::Run(grid, block, shared, [&] {{ {name}(*static_cast<const "
             f"{structs[name]}*>(params[0])); }}); return 0;" for i, name in enumerate(order)]
    globals_ = [f'  if (!std::strcmp(name, "{g}")) return (void*){g};' for g in _GLOBAL.findall(device)]
    (tmp / "emu.cc").write_text("\n".join([
        '#include "cuda_emulator.h"',
        '#include "kernels.cu"',
        'extern "C" int32_t emu_launch(int32_t f, uint32_t grid, uint32_t block, uint32_t shared,',
        "                              void** params) {",
        "  switch (f) {", *cases, "  }", "  return 1;", "}",
        'extern "C" void* emu_global(const char* name) {', *globals_, "  return nullptr;", "}", ""]))
    out = tmp / "emu.so"
    subprocess.run(["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-Wno-unknown-pragmas",
                    f"-I{tmp}", f"-I{HERE}", str(tmp / "emu.cc"), "-o", str(out)], check=True)
    return out


def run(host_exe: pathlib.Path, artifact: bytes, emu_so: pathlib.Path, tmp: pathlib.Path,
        inputs: list[np.ndarray], out_dtypes: list[np.dtype]) -> tuple[str, list[np.ndarray]]:
    """(host stdout, outputs) of one call of the artifact on ``inputs``."""
    tmp.mkdir(parents=True, exist_ok=True)
    so = tmp / "artifact.so"
    so.write_bytes(artifact)
    args = []
    for i, x in enumerate(inputs):
        path = tmp / f"in{i}.bin"
        path.write_bytes(np.ascontiguousarray(x).tobytes())
        dims = "x".join(str(d) for d in x.shape)
        args.append(f"{TF_DTYPE[x.dtype]}:{dims}:{path}" if dims else f"{TF_DTYPE[x.dtype]}:{path}")
    sizes = ",".join(str(np.dtype(d).itemsize) for d in out_dtypes)
    proc = subprocess.run([str(host_exe), str(so), str(emu_so), str(tmp), sizes, *args],
                          capture_output=True, text=True, check=True, timeout=120)
    outs = []
    if proc.stdout.endswith("rc 0\n"):
        for i, dt in enumerate(out_dtypes):
            shape = tuple(int(d) for d in (tmp / f"out{i}.shape").read_text().split())
            outs.append(np.frombuffer((tmp / f"out{i}.bin").read_bytes(), dtype=dt).reshape(shape))
    return proc.stdout, outs
