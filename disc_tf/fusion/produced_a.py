"""A depthwise convolution's pixels made where the GEMM reading them needs them: the
projection after a depthwise convolution (MobileNet's inverted residual blocks: a 3x3
depthwise conv, its batch norm and ReLU6, then a 1x1 conv) has each of its tasks
compute its rows of A, the convolution and its epilogue over those pixels, into
scratch of its own thread (RAL ``sgemm_gathered_a``) and multiply them there, instead
of reading a [pixels, channels] tensor the convolution wrote whole and its epilogue
rewrote.

A library GEMM L qualifies when its A is, as stored, the result of a loop kernel E
that is the epilogue of a depthwise convolution D (``depthwise_f32``), E reads D's
result once at its own index, and nothing else reads either result (no other kernel,
no view, not a cluster result), and no kernel launched from D up to L (or L's own
epilogue) writes memory D or E reads: the buffer planner placed those writes with D
at its own place. L contracts A's last dim without batch dims, a transpose or a layout
of its own, and shares no launch; its own epilogue stays. E reads no gathered rows
(their id check would leave the GEMM's launch).
``Kernel.a_producer`` names D on L; D and E then run in L's launch and their results
have no memory (the host runner declares them null; each task points them at its
scratch). Runs after the epilogue and scratch passes, on which it relies.
"""

from __future__ import annotations

from disc_tf.fusion.plan import Buffer, Kernel, depthwise_f32, gemm_form, memory_of


def plan_produced_a(order: list[Kernel], buffers: dict[str, Buffer]) -> None:
    """Sets ``a_producer`` on each qualifying GEMM (see the module docstring) and
    gives the memory of its A and of the convolution's result back: a temp that
    was to reuse either gets its own."""
    producer_of = {k.epilogue: k for k in order if k.kind == "index" and k.epilogue}
    writer = {b: k for k in order for _, b in k.outputs}
    readers: dict[str, list[Kernel]] = {}
    for k in order:
        for a in k.inputs:
            readers.setdefault(a.buffer, []).append(k)
    sharing = {name for k in order for name in k.shares_a}
    for gemm in order:
        if not _qualifies(gemm, buffers, sharing):
            continue
        a_buffer = gemm.inputs[0].buffer
        e = writer.get(a_buffer)
        if e is None or e.kind != "loop" or len(e.outputs) != 1:
            continue
        d = producer_of.get(e.name)
        if d is None or not depthwise_f32(d, buffers):
            continue
        (_, d_out), = d.outputs
        reads = [a for a in e.inputs if a.buffer == d_out]
        if (len(reads) != 1 or not reads[0].is_identity or reads[0].window is not None
                or readers.get(d_out) != [e] or readers.get(a_buffer) != [gemm]):
            continue
        if not all(_private_temp(b, buffers) for b in (d_out, a_buffer)):
            continue
        if any(a.gather is not None or a.ids_for is not None for a in e.inputs):
            continue  # its launch lines check ids and may return: not inside the GEMM's
        if _overwrites_inputs(order, d, e, gemm, buffers):
            continue
        gemm.a_producer = d.name
        for b in buffers.values():
            if b.reuses in (d_out, a_buffer):
                b.reuses = None  # the memory it was to take is never allocated
        buffers[d_out].reuses = buffers[a_buffer].reuses = None


def _qualifies(gemm: Kernel, buffers: dict[str, Buffer], sharing: set[str]) -> bool:
    """True if ``gemm`` is a plain f32 product whose A (its last dim contracted) could
    be made per task: one launch of its own, C in memory, no layout or transpose."""
    if (gemm.kind != "library" or len(gemm.ops) != 1 or gemm.ops[0].op != "dot_general"
            or len(gemm.inputs) != 2 or len(gemm.outputs) != 1 or gemm.chain
            or gemm.shares_a or gemm.name in sharing or gemm.c_in_scratch
            or gemm.a_producer):
        return False
    attrs = gemm.ops[0].attrs
    if {"strided", "c_layout", "gathered_a"} & set(attrs):
        return False
    a, b = gemm.inputs
    if not (a.is_identity and a.window is None and a.part_of is None and b.is_identity
            and b.window is None):
        return False
    lhs, rhs = buffers[a.buffer], buffers[b.buffer]
    form = gemm_form(len(lhs.dims), len(rhs.dims), attrs)
    return (form is not None and not form.batch and not form.transpose_a
            and not form.transpose_b and lhs.elem == "f32" and rhs.elem == "f32"
            and form.k == [len(lhs.dims) - 1])


def _overwrites_inputs(order: list[Kernel], d: Kernel, e: Kernel, gemm: Kernel,
                       buffers: dict[str, Buffer]) -> bool:
    """True if a kernel launched after ``d`` up to ``gemm``'s launch (its epilogue too)
    writes memory an input of ``d`` or ``e`` lives in: the buffer planner let it (those
    inputs were dead after ``d``), but moved into ``gemm``'s launch, ``d`` and ``e`` read
    them there."""
    reads = {memory_of(buffers, a.buffer) for k in (d, e) for a in k.inputs}
    names = [k.name for k in order]
    later = order[names.index(d.name) + 1:names.index(gemm.name) + 1]
    later += [k for k in order if k.name == gemm.epilogue]
    return any(memory_of(buffers, b) in reads for k in later if k is not e
               for _, b in k.outputs)


def _private_temp(name: str, buffers: dict[str, Buffer]) -> bool:
    """True if ``name`` is a temp of its own that no view aliases."""
    b = buffers[name]
    return (b.role == "temp" and b.alias_of is None
            and not any(o.alias_of == name for o in buffers.values()))
