"""CPU backend: the generated host runner of one cluster, around its kernels.

The emitted sources include only ``disc_ral.h`` and the C library: a translation
unit per distinct kernel (``cpu_units.py``; kernels from ``cpu_kernels.py``) and
the host runner. The host runner (``disc_entry``) checks inputs, computes every
symbolic dim, runs the host shape checks, allocates outputs and temporaries
through the RAL and launches the kernel units (or the speculative plan's).
"""

from __future__ import annotations

import hashlib

from disc_tf.codegen.cpu_conv import CONV_WINDOWS_SUPPORT
from disc_tf.codegen.cpu_fold import begin_lines, plan_folds
from disc_tf.codegen.cpu_index import IndexKernelEmitter
from disc_tf.codegen.cpu_kernels import KernelEmitter
from disc_tf.codegen.cpu_layers import layers_launch
from disc_tf.codegen.cpu_ops import (
    ITEMSIZE,
    MATH,
    PRELUDE,
    RAL_DTYPE,
    STORAGE,
    VECTOR_MATH,
    literal,
)
from disc_tf.codegen.cpu_text import comment, format_text, host_expr, product, sym
from disc_tf.codegen.cpu_units import PLACEHOLDER, KernelUnit, code_key, share
from disc_tf.fusion.plan import Buffer, FusionPlan
from disc_tf.sources import Sources, SourceUnit

#: Bumped whenever generated code changes meaning; part of the cache key.
CODEGEN_VERSION = "cpu-12"


_ARITH_CXX = {
    "addi": "{0} + {1}", "subi": "{0} - {1}", "muli": "{0} * {1}",
    "floordivsi": "disc_floordiv({0}, {1})", "ceildivsi": "disc_ceildiv({0}, {1})",
    "remsi": "disc_rem({0}, {1})", "maxsi": "disc_max({0}, {1})", "minsi": "disc_min({0}, {1})",
}
_PREDICATE_CXX = {"eq": "==", "ne": "!=", "slt": "<", "sle": "<=", "sgt": ">", "sge": ">="}


def _arith_cxx(plan: FusionPlan, d) -> str:
    """C++ of an "arith" symbol over its (already defined) components."""
    args = [sym(c, plan) for c in d.components]
    if d.op.startswith("select_"):
        a, b, c, e = args
        return f"({a} {_PREDICATE_CXX[d.op[len('select_'):]]} {b}) ? {c} : {e}"
    return _ARITH_CXX[d.op].format(*args)


def _define_exprs(plan: FusionPlan, syms: list[int], done: set[int], lines: list[str]) -> None:
    """Defines the "expr"/"arith" symbols among ``syms`` (and those they use) not yet defined."""
    for s in syms:
        d = plan.symbols[s]
        if d.kind not in ("expr", "arith") or s in done:
            continue
        if d.kind == "expr":
            _define_exprs(plan, list(d.scalar.symbols), done, lines)
            lines.append(f"  const int64_t s{s} = {host_expr(d.scalar, plan)};  // {d.scalar}")
        else:
            _define_exprs(plan, list(d.components), done, lines)
            lines.append(f"  const int64_t s{s} = {_arith_cxx(plan, d)};  // {d}")
        done.add(s)


def emitter_for(kernel, plan: FusionPlan) -> KernelEmitter:
    """The emitter of one planned kernel."""
    if kernel.kind == "index":
        return IndexKernelEmitter(kernel, plan)
    return KernelEmitter(kernel, plan)


def _const_data(b: Buffer) -> str:
    values = ", ".join(literal(v, b.elem) for v in b.const_value.reshape(-1))
    n = max(1, b.const_value.size)
    return f"static const {STORAGE[b.elem]} {b.name}_data[{n}] = {{{values}}};"


def _reshape_check(plan: FusionPlan, check, lines: list[str]) -> None:
    tf = format_text(check.tf_node)
    n_in = product(check.operands[0], plan)
    n_out = product(check.result, plan)
    prefix = f"TF op '{tf}': Input to reshape is a tensor with %lld values, but the requested shape"
    lines.append(f"  // element counts of TF op '{comment(check.tf_node)}'")
    lines.append("  {")
    lines.append(f"    const int64_t n_in = {n_in};")
    if check.multiple_of:
        lines.append(f"    if (n_in % {check.multiple_of} != 0) {{")
        lines.append(f'      snprintf(msg, sizeof(msg), "{prefix} requires a multiple of '
                     f'{check.multiple_of}", (long long)n_in);')
        lines.append("      return disc_fail(ral, DISC_INVALID_ARGUMENT, msg);")
        lines.append("    }")
    lines.append(f"    const int64_t n_out = {n_out};")
    lines.append("    if (n_in != n_out) {")
    lines.append(f'      snprintf(msg, sizeof(msg), "{prefix} has %lld", (long long)n_in, '
                 "(long long)n_out);")
    lines.append("      return disc_fail(ral, DISC_INVALID_ARGUMENT, msg);")
    lines.append("    }")
    lines.append("  }")


def _nonnegative_check(plan: FusionPlan, check, lines: list[str]) -> None:
    tf = format_text(check.tf_node)
    dims = [sym(s, plan) for s in check.result]
    lines.append(f"  // dims computed on the host for TF op '{comment(check.tf_node)}'")
    lines.append(f"  if ({' || '.join(f'{d} < 0' for d in dims)}) {{")
    fmt = ", ".join("%lld" for _ in dims)
    args = ", ".join(f"(long long){d}" for d in dims)
    lines.append(f'    snprintf(msg, sizeof(msg), "TF op \'{tf}\': dimension sizes must be '
                 f'non-negative, got [{fmt}]", {args});')
    lines.append("    return disc_fail(ral, DISC_INVALID_ARGUMENT, msg);")
    lines.append("  }")


_C_PREDICATES = {"eq": "==", "ne": "!=", "slt": "<", "sle": "<=", "sgt": ">", "sge": ">="}


def _require_check(plan: FusionPlan, check, lines: list[str]) -> None:
    tf = format_text(check.tf_node)
    text = format_text(check.message)
    a, b = (sym(s, plan) for s in check.result)
    lines.append(f"  // TF op '{comment(check.tf_node)}': {comment(check.message)}")
    lines.append(f"  if (!({a} {_C_PREDICATES[check.predicate]} {b})) {{")
    lines.append(f'    snprintf(msg, sizeof(msg), "TF op \'{tf}\': {text}: %lld", (long long){a});')
    lines.append("    return disc_fail(ral, DISC_INVALID_ARGUMENT, msg);")
    lines.append("  }")


def _slice_check(plan: FusionPlan, check, lines: list[str]) -> None:
    tf = format_text(check.tf_node)
    start, limit, dims = check.operands
    lines.append(f"  // slice bounds of TF op '{comment(check.tf_node)}'")
    for d, (lo, hi, n) in enumerate(zip(start, limit, dims)):
        lo, hi, n = sym(lo, plan), sym(hi, plan), sym(n, plan)
        lines.append(f"  if ({lo} < 0 || {hi} < {lo} || {hi} > {n}) {{")
        lines.append(f'    snprintf(msg, sizeof(msg), "TF op \'{tf}\': slice [%lld, %lld) of dim {d} '
                     f'is out of bounds [0, %lld)", (long long){lo}, (long long){hi}, (long long){n});')
        lines.append("    return disc_fail(ral, DISC_INVALID_ARGUMENT, msg);")
        lines.append("  }")


def _check_conditions(plan: FusionPlan, check, n: int, lines: list[str],
                      defined: set[int]) -> tuple[str, str, str]:
    """(C++ failure condition, comment, message prefix) of one non-reshape check.

    A broadcast check first defines the broadcast symbols it computes (those an
    earlier check has not already defined; ``defined`` is updated).
    """
    if check.kind == "broadcast":
        lines.append(f"  bool ok{n} = true;")
        for s in check.result:
            if plan.symbols[s].kind == "broadcast" and s not in defined:
                defined.add(s)
                expr = "1"
                for c in plan.symbols[s].components:
                    expr = f"disc_bcast_dim({expr}, {sym(c, plan)}, &ok{n})"
                lines.append(f"  const int64_t s{s} = {expr};")
        return f"!ok{n}", "numpy broadcast", "Incompatible shapes: "
    if check.kind == "matmul":
        conds = [f"{sym(check.operands[0][i], plan)} != {sym(check.operands[1][j], plan)}"
                 for i, j in check.dims]
        return " || ".join(conds), "batch and contracting dims", "Matrix size-incompatible: "
    if check.kind == "expand":
        conds = []
        for i, d in check.dims:
            o, r = sym(check.operands[0][i], plan), sym(check.result[d], plan)
            conds.append(f"({o} != 1 && {o} != {r})")
        return " || ".join(conds), "broadcast operand dims", "Incompatible shapes: "
    shapes = check.operands
    conds = [f"{sym(a, plan)} != {sym(b, plan)}"
             for s in shapes[1:] for a, b in zip(shapes[0], s) if a != b]
    return " || ".join(conds) or "false", "shapes must be equal", "shapes must be equal: "


def host_checks(plan: FusionPlan, lines: list[str]) -> None:
    """Host-side shape checks, each failing with a TF-style InvalidArgument."""
    defined: set[int] = set()
    broadcast_defined: set[int] = set()
    for n, check in enumerate(plan.checks):
        used = [x for s in check.operands + [check.result] for x in s]
        used += [c for x in check.result if plan.symbols[x].kind == "broadcast"
                 for c in plan.symbols[x].components]
        _define_exprs(plan, used, defined, lines)
        if check.kind == "reshape":
            _reshape_check(plan, check, lines)
            continue
        if check.kind == "nonnegative":
            _nonnegative_check(plan, check, lines)
            continue
        if check.kind == "slice":
            _slice_check(plan, check, lines)
            continue
        if check.kind == "require":
            _require_check(plan, check, lines)
            continue
        shapes = check.operands + ([check.result] if check.kind == "expand" else [])
        tf = check.tf_node.replace("\\", "\\\\").replace('"', '\\"')
        condition, what, prefix = _check_conditions(plan, check, n, lines, broadcast_defined)
        lines.append(f"  // {what} for TF op '{comment(check.tf_node)}'")
        lines.append(f"  if ({condition}) {{")
        for i, s in enumerate(shapes):
            lines.append(f"    const int64_t c{n}_{i}[] = {{{', '.join(sym(x, plan) for x in s) or '0'}}};")
        ptrs = ", ".join(f"c{n}_{i}" for i in range(len(shapes)))
        lines.append(f"      const int64_t* shapes[] = {{{ptrs}}};")
        lines.append(f"      const int ranks[] = {{{', '.join(str(len(s)) for s in shapes)}}};")
        if check.kind == "matmul":
            lines.append(f'      return disc_fail_matmul(ral, "TF op \'{tf}\': {prefix}", shapes, ranks);')
        else:
            lines.append(f'      return disc_fail_shapes(ral, "TF op \'{tf}\': {prefix}", '
                         f"{len(shapes)}, shapes, ranks);")
        lines.append("  }")
    _define_exprs(plan, list(range(len(plan.symbols))), defined, lines)


def size_checks(plans: list[FusionPlan], lines: list[str]) -> None:
    """Every allocated buffer's byte size must fit in int64: dims that broadcasting
    or host arithmetic computes could otherwise overflow into a too-small buffer."""
    seen: set[str] = set()
    lines.append("  // ---- buffer sizes (overflow -> ResourceExhausted, never a short buffer)")
    for p in plans:
        for b in p.buffers.values():
            if b.role not in ("output", "temp") or len(b.dims) < 2 or b.name in seen:
                continue
            seen.add(b.name)
            dims = ", ".join(sym(s, p) for s in b.dims)
            lines.append(f"  {{ const int64_t d[] = {{{dims}}};")
            lines.append(f"    if (disc_size_overflows(d, {len(b.dims)}, {ITEMSIZE[b.elem]}))")
            lines.append(f'      return disc_fail(ral, DISC_RESOURCE_EXHAUSTED, "cluster '
                         f'{comment(p.cluster_name)}: {b.name} would exceed the address space"); }}')


def _temp_bytes(b: Buffer, plan: FusionPlan) -> str:
    """A temp's bytes as a host-runner expression."""
    return f"{product(b.dims, plan)} * {ITEMSIZE[b.elem]}"


def _alloc_temp(b: Buffer, nbytes: str, declare: bool = True, indent: str = "  ") -> list[str]:
    """Host-runner lines allocating temp ``b`` (declaring its pointer unless it is
    declared already) and counting its bytes."""
    st = STORAGE[b.elem]
    lhs = f"{st}* {b.name}" if declare else b.name
    return [f"{indent}{lhs} = static_cast<{st}*>(ral->alloc_temp(ral, {nbytes}));",
            f"{indent}if (!{b.name} && {nbytes} != 0) return 1;",
            f"{indent}temp_bytes += {nbytes};",
            f"{indent}if (temp_bytes > peak_temp_bytes) peak_temp_bytes = temp_bytes;"]


def _launch_sequence(plan: FusionPlan, emitters: list[KernelEmitter],
                     fold_base: int | None = None) -> list[str]:
    """Temp allocation, kernel launches and early frees of one plan, in order. With
    ``fold_base`` (the top-level runner), kernels reading only cluster inputs ask the
    RAL for results kept from an earlier call first (``cpu_fold``; sites from
    ``fold_base``)."""
    out: list[str] = []
    # A view (reshape) is its root buffer's memory, which lives until the
    # view's last reader too.
    ptr = {name: plan.root(name) for name in plan.buffers}
    out.append("  int64_t temp_bytes = 0, peak_temp_bytes = 0;")
    size_of: dict[str, str] = {}
    # A GEMM epilogue (and a GEMM chained after it) runs inside its GEMM's launch: its
    # outputs are allocated there.
    index = {k.name: n for n, k in enumerate(plan.kernels)}
    def inside(k) -> list[str]:  # the kernels that run in k's launch (a layer's epilogue too)
        names = [name for name in (*k.shares_a, k.epilogue, k.chain, k.a_producer) if name]
        for name in k.layers:
            layer = plan.kernels[index[name]]
            names += [name, *([layer.epilogue] if layer.epilogue else [])]
        return names

    inside_a_gemm = {index[name] for k in plan.kernels for name in inside(k)}
    later_layers = {name for k in plan.kernels for name in k.layers}
    # A depthwise convolution making a GEMM's A, and its epilogue, run in that launch:
    # GEMM name -> [convolution, its epilogue]
    made_by = {k.name: [k.a_producer, plan.kernels[index[k.a_producer]].epilogue]
               for k in plan.kernels if k.a_producer}
    producers = {index[names[0]] for names in made_by.values()}
    # Where each kernel's reads are done: at its own place, or, for a GEMM sharing A
    # with a later one (or a convolution making a later one's A), at that launch (it
    # runs there, after its own place).
    done_at = list(range(len(plan.kernels)))
    for n, k in enumerate(plan.kernels):
        for name in [*k.shares_a, *made_by.get(k.name, [])]:
            done_at[index[name]] = max(done_at[index[name]], n)
    # A temp reusing another's memory (the buffer planner's decision) keeps that
    # memory alive: the allocation is freed after the last reader of either.
    last_use: dict[str, int] = {}
    for n, k in enumerate(plan.kernels):
        for a in k.inputs:
            memory = plan.memory(a.buffer)
            last_use[memory] = max(last_use.get(memory, 0), done_at[n])
    # C of a GEMM computed block by block in scratch (attention's scores), and the
    # results of a convolution making a GEMM's A per task: no memory
    scratch_c = {k.outputs[0][1] for k in plan.kernels if k.c_in_scratch}
    scratch_c |= {b for names in made_by.values() for name in names
                  for _, b in plan.kernels[index[name]].outputs}
    alone = [n for n, k in enumerate(plan.kernels) if n not in inside_a_gemm and
             n not in producers and not (k.a_producer or k.shares_a or k.epilogue or k.layers)]
    folds = plan_folds(plan, alone, fold_base) if fold_base is not None else {}
    fold_of = {b: f for f in folds.values() for b in f.outputs}
    for n, (k, e) in enumerate(zip(plan.kernels, emitters)):
        writers = [] if n in inside_a_gemm else [k]
        if k.name not in later_layers:  # the first layer's launch allocates for them all
            writers += [plan.kernels[index[name]] for name in inside(k)]
        if n in folds:  # its outputs: kept ones, or temps allocated as usual
            fold = folds[n]
            size_of.update({b: _temp_bytes(plan.buffers[b], plan) for b in fold.outputs})
            out.extend(begin_lines(plan, fold, size_of))
            out.append(f"  if ({fold.var} < 0) {{")
            for b in fold.outputs:
                out.extend(_alloc_temp(plan.buffers[b], size_of[b], declare=False, indent="    "))
            out.append("  }")
            out.append(f"  if ({fold.var} <= 0) {{")
            out.extend("  " + line for line in e.launch(ptr))
            out.append(f"    if ({fold.var} == 0) ral->fold_done(ral, {fold.site});")
            out.append("  }")
            writers = []
        for _, bname in [o for w in writers for o in w.outputs]:
            b = plan.buffers[bname]
            if b.role == "output":  # as late as TF would: no output held while others compute
                st = STORAGE[b.elem]
                out.append(f"  {b.name} = static_cast<{st}*>("
                           f"ral->alloc_output(ral, {b.index}, {len(b.dims)}, {b.name}_dims));")
                out.append(f"  if (!{b.name} && {product(b.dims, plan)} != 0) return 1;")
            if b.role != "temp":
                continue
            st = STORAGE[b.elem]
            nbytes = _temp_bytes(b, plan)
            if plan.memory(bname) in scratch_c:
                out.append(f"  {st}* {b.name} = nullptr;  // only ever a block at a time, in "
                           "the GEMM's per-thread scratch")
                continue
            if b.reuses:
                out.append(f"  {st}* {b.name} = reinterpret_cast<{st}*>({b.reuses});  "
                           f"// in place of {b.reuses}: same proven size, last read by this kernel")
                continue
            size_of[b.name] = nbytes
            out.extend(_alloc_temp(b, nbytes))
        if n in producers or n in folds:
            pass  # runs in the launch of the GEMM whose A it makes, or above
        elif k.layers:
            run = [plan.kernels[index[name]] for name in [k.name, *k.layers]]
            out.extend(layers_launch(e, ptr, [
                (emitters[index[g.name]], emitters[index[g.epilogue]] if g.epilogue else None)
                for g in run]))
        elif k.name in later_layers:
            pass  # runs in the first layer's launch
        elif k.a_producer:
            conv = plan.kernels[index[k.a_producer]]
            out.extend(e.library_launch(
                ptr, epilogue=emitters[index[k.epilogue]] if k.epilogue else None,
                producer=(emitters[index[conv.name]], emitters[index[conv.epilogue]])))
        elif k.shares_a:
            out.extend(e.library_launch(
                ptr, epilogue=emitters[index[k.epilogue]] if k.epilogue else None,
                shares=[emitters[index[name]] for name in k.shares_a]))
        elif k.epilogue and k.kind == "index":  # a depthwise convolution's
            out.extend(e.launch(ptr, epilogue=emitters[index[k.epilogue]]))
        elif k.epilogue:
            out.extend(e.library_launch(ptr, epilogue=emitters[index[k.epilogue]],
                                        chain=emitters[index[k.chain]] if k.chain else None))
        elif n not in inside_a_gemm:
            out.extend(e.launch(ptr))
        for bname, last in last_use.items():
            if last == n and plan.buffers[bname].role == "temp" and bname in size_of:
                if bname in fold_of:  # a kept result stays with the RAL
                    out.append(f"  if ({fold_of[bname].var} < 0) {{ ral->free_temp(ral, {bname}); "
                               f"temp_bytes -= {size_of[bname]}; }}")
                    continue
                out.append(f"  ral->free_temp(ral, {bname});")
                out.append(f"  temp_bytes -= {size_of[bname]};")
    out.append("  disc_last_peak_temp_bytes = peak_temp_bytes;")
    return out


def signature_checks(plan: FusionPlan, input_names: list[str], out: list[str]) -> None:
    """Host-runner lines checking input count, ranks, dtypes and static dims, then
    defining the symbols read from input dims (shared by the CPU and CUDA runners)."""
    n_in, n_out = len(plan.arg_elems), len(plan.result_buffers)
    out.append("  // ---- signature checks")
    out.append(f"  if (ral->num_inputs != {n_in} || ral->num_outputs != {n_out})")
    out.append(f'    return disc_fail(ral, DISC_INTERNAL, "cluster {comment(plan.cluster_name)}: '
               f'expected {n_in} inputs and {n_out} outputs");')
    out.append("  char msg[256];")
    for i, (elem, rank) in enumerate(zip(plan.arg_elems, plan.arg_ranks)):
        name = input_names[i].replace('"', "'") if i < len(input_names) else f"arg{i}"
        out.append(f"  if (ral->input_rank(ral, {i}) != {rank} || "
                   f"ral->input_dtype(ral, {i}) != {RAL_DTYPE[elem]}) {{")
        out.append(f'    snprintf(msg, sizeof(msg), "input {i} ({comment(name)}): expected rank {rank} '
                   f'{elem}, got rank %d dtype %d", (int)ral->input_rank(ral, {i}), '
                   f"(int)ral->input_dtype(ral, {i}));")
        out.append("    return disc_fail(ral, DISC_INVALID_ARGUMENT, msg);")
        out.append("  }")
    out.append("  // ---- input dims (host metadata)")
    for i, rank in enumerate(plan.arg_ranks):
        if rank:
            out.append(f"  const int64_t* arg{i}_dims = ral->input_dims(ral, {i});")
    for i, dims in enumerate(plan.arg_dims):
        for d, size in enumerate(dims):
            if size is not None:
                out.append(f"  if (arg{i}_dims[{d}] != {size}) {{")
                out.append(f'    snprintf(msg, sizeof(msg), "input {i}: dim {d} is %lld, the graph says '
                           f'{size}", (long long)arg{i}_dims[{d}]);')
                out.append("    return disc_fail(ral, DISC_INVALID_ARGUMENT, msg);")
                out.append("  }")
    for s, d in enumerate(plan.symbols):
        if d.kind == "arg":
            out.append(f"  const int64_t s{s} = arg{d.arg[0]}_dims[{d.arg[1]}];")


#: The function an artifact runs its cluster with (see disc_ral.h).
ENTRY = "disc_entry"


def artifact_exports(num_kernels: int) -> list[str]:
    """The lines exporting what a loader asks an artifact first (ABI, kernel count)."""
    return ['extern "C" int32_t disc_abi_version(void) { return DISC_RAL_ABI_VERSION; }',
            f'extern "C" int32_t disc_num_kernels(void) {{ return {num_kernels}; }}']


def _prologue(title: list[str]) -> list[str]:
    """The lines every translation unit starts with: ``title`` comments, includes and
    the prelude (internal to the unit)."""
    return [*title, "#include <stdint.h>", "#include <stdio.h>", '#include "disc_ral.h"', MATH,
            VECTOR_MATH, "", "namespace {", PRELUDE, "}  // namespace", ""]


def unit_source(unit: KernelUnit) -> SourceUnit:
    """The translation unit of one kernel unit. Nothing in it names a cluster, and its
    content key leaves out the comments (the TF ops it fuses), so the same kernel of
    another cluster or model has the same key."""
    title = [f"// Generated by disc_tf ({CODEGEN_VERSION}): kernel unit {unit.name}."]
    prologue = "\n".join(_prologue(title))
    key = hashlib.sha256("\0".join([prologue, code_key(unit.code)]).encode()).hexdigest()
    return SourceUnit(unit.name, prologue + "\n" + unit.code + "\n", key)


def emit_cpu(plan: FusionPlan, input_names: list[str], output_names: list[str],
             entry: str = ENTRY) -> Sources:
    """The C++ sources of one cluster: a translation unit per distinct kernel and the
    host runner (``disc_entry``). A runner under another ``entry`` name is part of a
    loop cluster's artifact (its body or condition): it exports that function alone."""
    emitters = [emitter_for(k, plan) for k in plan.kernels]
    spec_emitters = ([emitter_for(k, plan.speculative) for k in plan.speculative.kernels]
                     if plan.speculative else [])
    all_emitters = emitters + spec_emitters
    for e in all_emitters:
        e.fn = PLACEHOLDER
    kernel_texts = tuple(e.source() for e in all_emitters)
    units = share(all_emitters, list(kernel_texts))
    title = [
        f"// Generated by disc_tf ({CODEGEN_VERSION}) for cluster '{comment(plan.cluster_name)}'.",
        "// Inputs:  " + comment(", ".join(f"arg{i}={n}" for i, n in enumerate(input_names))),
        "// Outputs: " + comment(", ".join(f"result{i}={n}" for i, n in enumerate(output_names))),
    ]
    kernels = _prologue(title[:1] + ["// Its kernels, each distinct one once (a translation unit "
                                     "each when built)."])
    for u in units:
        kernels += [u.code, ""]
    out = _prologue(title + ["// The host runner."])
    plans = [plan] + ([plan.speculative] if plan.speculative else [])
    out.append("namespace {")
    for p in plans:
        out.extend(_const_data(b) for b in p.buffers.values() if b.role == "const")
    if any(k.kind == "library" and k.ops[0].op in ("conv_rows", "conv_taps")
           for p in plans for k in p.kernels):
        out.append(CONV_WINDOWS_SUPPORT)
    out.append("}  // namespace")
    out.append("")
    out.append("// ---- the kernel units this runner launches")
    for u in units:
        out += [u.interface, ""]
    out.append("// Peak bytes of temporaries in this thread's last call (read by tests/bench).")
    out.append("static thread_local int64_t disc_last_peak_temp_bytes = 0;")
    if entry == ENTRY:
        out.append('extern "C" int64_t disc_peak_temp_bytes(void) '
                   '{ return disc_last_peak_temp_bytes; }')
        out += artifact_exports(plan.num_kernels)
    out.append("")
    out.append(f'extern "C" int32_t {entry}(disc_ral* ral) {{')
    signature_checks(plan, input_names, out)
    out.append("  // ---- shape computation and checks")
    host_checks(plan, out)
    size_checks(plans, out)
    out.append("  // ---- buffers")
    for b, owner in {b.name: (b, q) for q in plans for b in q.buffers.values()}.values():
        st = STORAGE[b.elem]
        if b.role == "input":
            out.append(f"  const {st}* {b.name} = static_cast<const {st}*>(ral->input_data(ral, {b.index}));")
        elif b.role == "const":
            out.append(f"  const {st}* {b.name} = {b.name}_data;")
        elif b.role == "host":
            values = ", ".join(f"({st})({host_expr(h, owner)})" for h in b.host_elements) or "0"
            out.append(f"  const {st} {b.name}_data[] = {{{values}}};  // computed from dims")
            out.append(f"  const {st}* {b.name} = {b.name}_data;")
        elif b.role == "output":  # allocated right before its writer (_launch_sequence)
            dims = ", ".join(sym(s, plan) for s in b.dims) or "0"
            out.append(f"  const int64_t {b.name}_dims[] = {{{dims}}};")
            out.append(f"  {st}* {b.name} = nullptr;")
    # Folding sites: the general plan's kernel positions, then the speculative plan's.
    top = 0 if entry == ENTRY else None
    spec_top = len(plan.kernels) if entry == ENTRY else None
    if plan.speculative is None:
        out.extend(_launch_sequence(plan, emitters, top))
    else:
        conds = [
            f"{sym(c, plan)} == s{s}"
            for s in plan.speculated_symbols
            for c in plan.symbols[s].components
        ]
        out.append(f"  if ({' && '.join(conds)}) {{")
        out.append(f"    // speculation: no unknown dim is broadcast in this call -> "
                   f"{len(plan.speculative.kernels)} kernel(s)")
        out.extend("  " + line for line in _launch_sequence(plan.speculative, spec_emitters,
                                                            spec_top))
        out.append(f"  }} else {{  // general case -> {len(plan.kernels)} kernel(s)")
        out.extend("  " + line for line in _launch_sequence(plan, emitters, top))
        out.append("  }")
    out.append("  return 0;")
    out.append("}")
    return Sources("cpu", "\n".join(kernels), "\n".join(out) + "\n",
                   units=tuple(unit_source(u) for u in units),
                   kernel_texts=kernel_texts)
