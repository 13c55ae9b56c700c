"""C in per-block scratch for a GEMM whose row-wise epilogue is C's only reader (a
residual and layer norm after a projection), where the epilogue's result can take
the memory of the residual instead of C's.

A GEMM with such an epilogue wrote C and the epilogue wrote its result in C's
place: C's memory lived from the GEMM to the layer norm's reader, and the residual's
died at the epilogue. When C is never whole (``sgemm_scratch_c``: each task computes
its rows of C, all columns, into scratch of its own thread and runs the epilogue on
them there) and the result takes the residual's memory, the call holds one tensor of
C's size less while the GEMM runs (in a FastSpeech-like conv block, the residual, the
[T, 1024] hidden tensor and C were the peak).

``scratch_candidates`` runs before in-place reuse: it names the Cs to keep out of it
(GEMM L without batch dims, C a dense temp of its own that one stitch kernel E reads,
once, at its own index, where E also reads at its own index a temp R of C's proven
size, dying there, that neither L nor a kernel between L and E reads, and E has no
second result of C's size: E's result then takes R's memory, not C's).
``plan_epilogue_scratch`` runs after the epilogue, chain and shared-A passes: it sets
``c_in_scratch`` on each such L that took E as its epilogue and shares no launch, and
whose C's memory nothing but L and E touches. A GEMM chained on L's blocks (reading
E's result as its A) then reads that result from memory, where E wrote it.
"""

from __future__ import annotations

from disc_tf.fusion.memory_plan import last_uses, size_key
from disc_tf.fusion.plan import Buffer, Kernel, gemm_form, memory_of, root_of
from disc_tf.fusion.symbols import SymbolTable


def scratch_candidates(order: list[Kernel], buffers: dict[str, Buffer], symbols: SymbolTable,
                       enabled: bool = True) -> frozenset[str]:
    """The Cs that should give their memory to no one (see the module docstring);
    none unless ``enabled``."""
    if not enabled:
        return frozenset()

    def root(name: str) -> str:
        return root_of(buffers, name)

    last_use = last_uses(order, buffers)
    position = {k.name: n for n, k in enumerate(order)}
    found = set()
    for lib in order:
        if lib.kind != "library" or lib.ops[0].op != "dot_general" or len(lib.outputs) != 1:
            continue
        if {"c_layout", "gathered_a", "strided"} & set(lib.ops[0].attrs):
            continue
        lhs, rhs = (buffers[a.buffer] for a in lib.inputs[:2])
        form = gemm_form(len(lhs.dims), len(rhs.dims), lib.ops[0].attrs)
        if form is None or form.batch:
            continue  # a projection (attention's batched products have their own scratch)
        (_, c), = lib.outputs
        if buffers[c].role != "temp" or buffers[c].alias_of:
            continue
        reads = [(k, a) for k in order for a in k.inputs if root(a.buffer) == c]
        if len(reads) != 1:
            continue
        e, read = reads[0]
        if e.kind != "stitch" or not read.is_identity or read.window is not None:
            continue
        lib_reads = {root(a.buffer) for a in lib.inputs}
        # read between L and E, R could not take E's result (E would then not be L's epilogue)
        lib_reads |= {root(a.buffer) for k in order[position[lib.name] + 1:position[e.name]]
                      for a in k.inputs}
        if sum(buffers[b].role == "temp" and size_key(buffers[b], symbols) ==
               size_key(buffers[c], symbols) for _, b in e.outputs) > 1:
            continue  # a second result of C's size would have taken C's memory
        counts: dict[str, int] = {}
        for a in e.inputs:
            counts[root(a.buffer)] = counts.get(root(a.buffer), 0) + 1
        if any(a is not read and a.is_identity and a.window is None and counts[root(a.buffer)] == 1
               and buffers[root(a.buffer)].role == "temp" and root(a.buffer) not in lib_reads
               and last_use[root(a.buffer)] == position[e.name]
               and size_key(buffers[root(a.buffer)], symbols) == size_key(buffers[c], symbols)
               for a in e.inputs):
            found.add(c)
    return frozenset(found)


def plan_epilogue_scratch(order: list[Kernel], buffers: dict[str, Buffer],
                          candidates: frozenset[str]) -> None:
    """Sets ``c_in_scratch`` on each candidate's GEMM that may have C in per-block
    scratch with its epilogue alone (see the module docstring)."""
    by_name = {k.name: k for k in order}
    sharing = {name for k in order for name in k.shares_a}
    for lib in order:
        if (lib.kind != "library" or not lib.epilogue or lib.c_in_scratch
                or lib.shares_a or lib.name in sharing or len(lib.outputs) != 1):
            continue
        (_, c), = lib.outputs
        if c not in candidates or buffers[c].reuses:
            continue
        e = by_name[lib.epilogue]
        users = {lib.name, e.name}  # a chained GEMM reads E's result, in memory
        if any(memory_of(buffers, n) == c for k in order if k.name not in users
               for n in [a.buffer for a in k.inputs] + [b for _, b in k.outputs]):
            continue  # another kernel touches C's memory
        if any(memory_of(buffers, b) == c for _, b in e.outputs):
            continue  # E's result would be in scratch
        reads = [a for a in e.inputs if memory_of(buffers, a.buffer) == c]
        if len(reads) != 1 or not reads[0].is_identity or reads[0].window is not None:
            continue
        lib.c_in_scratch = True
