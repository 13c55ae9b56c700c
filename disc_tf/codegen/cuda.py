"""CUDA backend: device code (for nvcc) and host runner (for the C++ compiler)
of one cluster, from the same FusionPlan the CPU backend consumes.

The host runner (``disc_cuda_entry``) checks inputs, computes every symbolic
dim on the host from input shapes (so it never waits for the GPU), runs the
host shape checks, allocates outputs and temporaries through the RAL and
queues the kernels emitted by ``cuda_kernels.py`` on the RAL's stream.

``emit_cuda`` returns both as a typed pair (``disc_tf.sources.Sources``).
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from disc_tf.codegen.cpu import host_checks, signature_checks, size_checks
from disc_tf.codegen.cpu_ops import PRELUDE
from disc_tf.codegen.cpu_text import comment, host_expr, product, sym
from disc_tf.codegen.cuda_index import CudaIndexEmitter
from disc_tf.codegen.cuda_kernels import CudaKernelEmitter
from disc_tf.codegen.cuda_ops import (
    DEVICE_PRELUDE,
    HOST_PRELUDE,
    ITEMSIZE,
    STORAGE,
    CudaCodegenError,
    check_elem,
    cuda_literal,
)
from disc_tf.fusion.plan import Buffer, FusionPlan
from disc_tf.sources import Sources

#: Bumped whenever generated code changes meaning; part of the cache key.
CODEGEN_VERSION = "cuda-1"
#: Bytes of kernel parameters every CUDA version takes (12.1+ takes 32764 on Volta+).
MAX_PARAM_BYTES = 4096
#: A field of an argument struct: its array length, if any (every field is 8 bytes).
_FIELD = re.compile(r"^\s+[^/]*?\b\w+(?:\[(\d+)\])?;")
#: Buffer roles the host runner can place in device memory.
BUFFER_ROLES = ("input", "output", "temp", "const", "alias", "host")
#: The line between the device source and the host source in ``emit_cuda``'s text.


def _device_const(b: Buffer, prefix: str = "") -> str:
    """A constant tensor as a ``__device__`` array, stored as its storage type's bits."""
    if b.elem in ("f16", "bf16"):
        dtype = np.float16 if b.elem == "f16" else np.float32
        raw = np.asarray(b.const_value, dtype=dtype).reshape(-1)
        if b.elem == "f16":
            bits = raw.view(np.uint16)
        else:  # round to nearest even (NaN stays NaN: its high bits are kept)
            u = raw.view(np.uint32).astype(np.uint64)
            rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
            bits = np.where(np.isnan(raw), u >> 16 | 0x40, rounded)
        values = ", ".join(f"0x{int(v):04x}" for v in bits)
        n = max(1, raw.size)
        return f"__device__ const unsigned short {prefix}{b.name}_data[{n}] = {{{values}}};"
    values = ", ".join(cuda_literal(v, b.elem) for v in b.const_value.reshape(-1))
    n = max(1, b.const_value.size)
    return f"__device__ const {STORAGE[b.elem]} {prefix}{b.name}_data[{n}] = {{{values}}};"


def _fill(b: Buffer, prefix: str) -> str:
    """The name of a host-computed buffer's fill kernel (its struct: capitalized)."""
    return f"{prefix}{b.name}_fill"


def _host_fill_struct(b: Buffer, prefix: str = "") -> str:
    n = max(1, len(b.host_elements))
    return "\n".join([f"struct {_fill(b, prefix).capitalize()} {{  // {b.name}: computed from dims",
                      f"  DISC_OUT({STORAGE[b.elem]}) out;", f"  {STORAGE[b.elem]} v[{n}];", "};"])


def _host_fill_device(b: Buffer, prefix: str = "") -> str:
    """A kernel writing a host-computed array (its values travel in the launch's
    parameters, stream-ordered: no copy service, no wait) into device memory."""
    if b.elem in ("f16", "bf16"):
        raise CudaCodegenError(f"CUDA codegen: host-computed buffer {b.name} of {b.elem}")
    return "\n".join([
        _host_fill_struct(b, prefix),
        f'extern "C" __global__ void __launch_bounds__(32) {_fill(b, prefix)}(const '
        f"{_fill(b, prefix).capitalize()} a) {{",
        f"  for (int i = threadIdx.x; i < {len(b.host_elements)}; i += blockDim.x) "
        "a.out[i] = a.v[i];",
        "}"])


def _host_fill_launch(b: Buffer, owner: FusionPlan, functions: list[str],
                      prefix: str = "") -> list[str]:
    n = len(b.host_elements)
    lines = [f"  void* {b.name} = ral->alloc_temp(ral, {max(1, n) * ITEMSIZE[b.elem]});",
             f"  if (!{b.name}) return 1;",
             f"  {{  // {b.name}: {n} value(s) computed from dims",
             f"    {_fill(b, prefix).capitalize()} k{{}};", f"    k.out = {b.name};"]
    lines += [f"    k.v[{i}] = ({STORAGE[b.elem]})({host_expr(h, owner)});"
              for i, h in enumerate(b.host_elements)]
    lines += ["    void* params[] = {&k};",
              f"    if (cu->launch(cu, {functions.index(_fill(b, prefix))} /* {_fill(b, prefix)} */, 1, "
              "32, 0, params)) return 1;", "  }"]
    return lines


def _launch_sequence(plan: FusionPlan, emitters: list[CudaKernelEmitter]) -> list[str]:
    """Temp allocation, kernel launches and (stream-ordered) frees of one plan."""
    out: list[str] = []
    ptr = {name: plan.root(name) for name in plan.buffers}
    # A temp reusing another's memory (the buffer planner's decision) keeps that
    # memory alive: it is freed after the last reader of either.
    last_use: dict[str, int] = {}
    for n, k in enumerate(plan.kernels):
        for a in k.inputs:
            last_use[plan.memory(a.buffer)] = n
    for n, (k, e) in enumerate(zip(plan.kernels, emitters)):
        for _, bname in k.outputs:
            b = plan.buffers[bname]
            if b.role == "temp" and b.reuses:
                out.append(f"  void* {b.name} = {b.reuses};  // in place of {b.reuses}: same "
                           "proven size, last read by this kernel")
            elif b.role == "temp":
                nbytes = f"{product(b.dims, plan)} * {ITEMSIZE[b.elem]}"
                out.append(f"  const int64_t {b.name}_bytes = {nbytes};")
                out.append(f"  void* {b.name} = ral->alloc_temp(ral, {b.name}_bytes);")
                out.append(f"  if (!{b.name} && {b.name}_bytes != 0) return 1;")
                out.append(f"  temp_bytes += {b.name}_bytes;")
                out.append("  if (temp_bytes > peak_temp_bytes) peak_temp_bytes = temp_bytes;")
        out.extend(e.launch(ptr))
        for bname, last in last_use.items():
            if last == n and plan.buffers[bname].role == "temp":
                out.append(f"  ral->free_temp(ral, {bname});")
                out.append(f"  temp_bytes -= {bname}_bytes;")
    out.append("  disc_last_peak_temp_bytes = peak_temp_bytes;")
    return out


def _buffers(plans: list[FusionPlan], out: list[str], functions: list[str], prefix: str) -> None:
    plan = plans[0]
    for b, owner in {b.name: (b, p) for p in plans for b in p.buffers.values()}.values():
        if b.role == "host":
            out.extend(_host_fill_launch(b, owner, functions, prefix))
        elif b.role == "input":
            out.append(f"  const void* {b.name} = ral->input_data(ral, {b.index});")
        elif b.role == "const":
            out.append(f'  const void* {b.name} = cu->device_global(cu, "{prefix}{b.name}_data");')
            out.append(f"  if (!{b.name}) return 1;")
        elif b.role == "output":
            dims = ", ".join(sym(s, plan) for s in b.dims) or "0"
            out.append(f"  const int64_t {b.name}_dims[] = {{{dims}}};")
            out.append(f"  void* {b.name} = ral->alloc_output(ral, {b.index}, {len(b.dims)}, "
                       f"{b.name}_dims);")
            out.append(f"  if (!{b.name} && {product(b.dims, plan)} != 0) return 1;")


def param_bytes(struct: str) -> int:
    """Bytes of an argument struct (its fields are 8-byte scalars and arrays of them)."""
    total = 0
    for line in struct.splitlines()[1:]:
        m = _FIELD.match(line)
        if m:
            total += 8 * int(m.group(1) or 1)
    return total


def repr_c(text: str) -> str:
    """``text`` as a C string literal (generated names: no quotes or backslashes)."""
    return f'"{text}"'


def cuda_exports(num_kernels: int, functions: list[str]) -> list[str]:
    """What a CUDA artifact exports besides its entry (``disc_ral_cuda.h``); the
    function list is the host runner's ``kFunctions``."""
    return [
        'extern "C" int32_t disc_abi_version(void) { return DISC_RAL_ABI_VERSION; }',
        'extern "C" int32_t disc_cuda_abi_version(void) { return DISC_RAL_CUDA_ABI_VERSION; }',
        f'extern "C" int32_t disc_num_kernels(void) {{ return {num_kernels}; }}',
        'extern "C" const char* disc_target(void) { return "cuda"; }',
        f'extern "C" int32_t disc_cuda_num_functions(void) {{ return {len(functions)}; }}',
        'extern "C" const char* disc_cuda_function_name(int32_t i) {',
        f"  return i >= 0 && i < {len(functions)} ? kFunctions[i] : nullptr;",
        "}",
    ]


def emit_cuda(plan: FusionPlan, input_names: list[str], output_names: list[str],
              entry: str | None = None) -> Sources:
    """Device and host sources of one cluster; ``entry``: the runner is a step of a
    loop cluster, named so, with its device symbols prefixed by it and no exports.

    Raises CudaCodegenError for a plan the backend cannot compile exactly.
    """
    prefix = f"{entry}_" if entry else ""
    plans = [plan] + ([plan.speculative] if plan.speculative else [])
    for p in plans:
        for b in p.buffers.values():
            check_elem(b.elem, f"buffer {b.name}")
            if b.role not in BUFFER_ROLES:
                raise CudaCodegenError(f"CUDA codegen: buffer {b.name} has role {b.role!r}; "
                                       f"supported: {', '.join(BUFFER_ROLES)}")
    functions: list[str] = []
    hosts = list({b.name: b for p in plans for b in p.buffers.values() if b.role == "host"}.values())
    functions += [_fill(b, prefix) for b in hosts]
    emitters = [[(CudaIndexEmitter if k.kind == "index" else CudaKernelEmitter)(
        dataclasses.replace(k, name=prefix + k.name), p, functions) for k in p.kernels]
        for p in plans]
    title = (f"// Generated by disc_tf ({CODEGEN_VERSION}) for cluster "
             f"'{comment(plan.cluster_name)}'.")
    device = [title, "// Device code: nvcc -fatbin for sm_80 and sm_90.", DEVICE_PRELUDE]
    for p in plans:
        device.extend(_device_const(b, prefix) for b in p.buffers.values() if b.role == "const")
    device.extend(_host_fill_device(b, prefix) for b in hosts)
    device.append("")
    kernel_texts = tuple(e.device_source() for group in emitters for e in group)
    for text in kernel_texts:
        device.append(text)
        device.append("")
    host = [
        title,
        "// Inputs:  " + comment(", ".join(f"arg{i}={n}" for i, n in enumerate(input_names))),
        "// Outputs: " + comment(", ".join(f"result{i}={n}" for i, n in enumerate(output_names))),
        "#include <stdint.h>",
        "#include <stdio.h>",
        '#include "disc_ral_cuda.h"',
        "",
        "namespace {",
        PRELUDE,
        HOST_PRELUDE,
        *(_host_fill_struct(b, prefix) for b in hosts),
    ]
    for e in (e for group in emitters for e in group):
        if e.k.kind != "library":
            host.append(e.struct())
            if param_bytes(host[-1]) > MAX_PARAM_BYTES:
                raise CudaCodegenError(
                    f"CUDA codegen: kernel {e.k.name} takes {param_bytes(host[-1])} bytes of "
                    f"parameters; a launch takes at most {MAX_PARAM_BYTES}")
    host += ["}  // namespace", ""]
    names = ", ".join(repr_c(f) for f in functions) or "nullptr"
    host += [
        f"static const char* const kFunctions[] = {{{names}}};",
        "// Peak bytes of device temporaries in this thread's last call (tests, bench).",
        "static thread_local int64_t disc_last_peak_temp_bytes = 0;",
    ]
    if entry is None:
        host += [*cuda_exports(plan.num_kernels, functions),
                 'extern "C" int64_t disc_peak_temp_bytes(void) { return disc_last_peak_temp_bytes; }']
    host += [
        "",
        f'extern "C" int32_t {entry or "disc_cuda_entry"}(disc_ral_cuda* cu) {{',
        "  disc_ral* ral = &cu->base;  // the services shared with the CPU RAL",
        "  if (cu->cuda_abi_version != DISC_RAL_CUDA_ABI_VERSION)",
        '    return disc_fail(ral, DISC_INTERNAL, "CUDA RAL ABI version mismatch");',
    ]
    body: list[str] = []
    signature_checks(plan, input_names, body)
    body.append("  // ---- shape computation and checks")
    host_checks(plan, body)
    size_checks(plans, body)
    body.append("  // ---- buffers (device memory)")
    body.append("  int64_t temp_bytes = 0, peak_temp_bytes = 0;  // device temporaries held")
    _buffers(plans, body, functions, prefix)
    if plan.speculative is None:
        body.extend(_launch_sequence(plan, emitters[0]))
    else:
        conds = [f"{sym(c, plan)} == s{s}" for s in plan.speculated_symbols
                 for c in plan.symbols[s].components]
        body.append(f"  if ({' && '.join(conds)}) {{")
        body.append(f"    // speculation: nothing broadcast in this call -> "
                    f"{len(plan.speculative.kernels)} kernel(s)")
        body.extend("  " + x for x in _launch_sequence(plan.speculative, emitters[1]))
        body.append(f"  }} else {{  // general case -> {len(plan.kernels)} kernel(s)")
        body.extend("  " + x for x in _launch_sequence(plan, emitters[0]))
        body.append("  }")
    host += body + ["  return 0;", "}"]
    globals_ = tuple(dict.fromkeys(f"{prefix}{b.name}_data" for p in plans
                                   for b in p.buffers.values() if b.role == "const"))
    return Sources("cuda", "\n".join(device), "\n".join(host) + "\n",
                   kernel_texts=kernel_texts, functions=tuple(functions), device_globals=globals_)
