"""Pads read in place by loop kernels: ``tf.pad`` with a constant whose result
elementwise kernels read (a sequence shifted by a step, columns padded before a
scale) is read by them from the unpadded tensor, with no padded copy in memory and
no pad kernel.

An index kernel qualifies when it is one ``dynamic_pad`` of a dense buffer by a
constant scalar with no interior padding, its result is a temp that nothing views,
and every kernel reading that result is a loop kernel reading it as
``gathered_rows.reads_rows`` allows (its last dim along the kernel's, unexpanded), or
through a slice of step 1 (``pad(x)[:, :-1]``, a sequence shifted by a step: the
slice of a pad is a pad of the slice, its padding before less the slice's start).
Each read becomes a read of the unpadded buffer (``Access.pad``): per row of the
kernel the host-filled low edge and size along each dim tell whether the row lies
inside the tensor and where, and the row's columns run as three plain loops: the
constant, the tensor's columns, the constant.

Stitch kernels keep the pad kernel: their passes over a row load it eight columns at
a time, and a load that picks the constant or the element per column made a padded
softmax 1.4-1.8x slower than the pad kernel and a plain read (AVX-512).

A pooling window (``reduce_window``) reads its pad in place too when the pad's constant
is the fold's start value and adding it to the fold changes nothing (a max from the
lowest value, a sum from 0: a SAME MaxPool or AvgPool): the window then skips the taps
outside the tensor. The pad kernel was a padded copy of the pool's input, as long as
the pool itself or longer (4 x 112 x 112 x 64: 7.7 ms against 0.8 for the pool).
"""

from __future__ import annotations

from collections.abc import Callable

from disc_tf.fusion.gathered_rows import fold_into_readers, mapped, plan_gathered_rows, reads_rows
from disc_tf.fusion.plan import Access, Buffer, Kernel, PadRead


def plan_reads_in_place(order: list[Kernel], buffers: dict[str, Buffer],
                        constant: Callable[[int], int | None]) -> list[Kernel]:
    """Row gathers, then constant pads, read in place by the loop and stitch kernels
    reading them (``gathered_rows``, this module); returns the launch order left."""
    order = plan_padded_reads(plan_gathered_rows(order, buffers), buffers, constant)
    return plan_pooled_pads(order, buffers, constant)


def plan_padded_reads(order: list[Kernel], buffers: dict[str, Buffer],
                      constant: Callable[[int], int | None]) -> list[Kernel]:
    """Folds each qualifying pad into the kernels reading it (see the module
    docstring); returns the launch order without the folded pad kernels."""
    def rewrite(pad: Kernel, k: Kernel, i: int) -> None:
        op, acc = pad.ops[0], k.inputs[i]
        (_, out), = pad.outputs
        read = PadRead(list(op.attrs["low"]), list(buffers[out].dims), op.operands[1][1],
                       op.tf_node)
        if acc.window is not None:  # a slice of the padded tensor: a pad of the slice
            read.starts, read.dims = list(acc.window[0]), list(acc.window[2])
        dims, expand = mapped(k, i)
        k.inputs[i] = Access(pad.inputs[0].buffer, dims=dims, expand=expand, pad=read)

    return fold_into_readers(
        order, buffers, lambda k: _constant_pad(k, buffers, constant),
        lambda k, i, rank: reads_rows(k, i, rank, windows=True, kinds=("loop",)), rewrite)


def _constant_pad(kernel: Kernel, buffers: dict[str, Buffer],
                  constant: Callable[[int], int | None]) -> bool:
    """True if ``kernel`` only pads a dense buffer by a constant, with no interior."""
    if kernel.kind != "index" or len(kernel.ops) != 1 or len(kernel.outputs) != 1:
        return False
    op = kernel.ops[0]
    if op.op != "dynamic_pad" or len(op.operands) != 2 or op.operands[0] != ("in", 0):
        return False
    if op.operands[1][0] != "const" or any(constant(s) != 0 for s in op.attrs["interior"]):
        return False
    if len(kernel.inputs) != 1 or kernel.epilogue:
        return False
    x = kernel.inputs[0]
    return (x.is_identity and x.window is None and buffers[x.buffer].role != "host"
            and buffers[x.buffer].elem == op.elem)


#: Folds whose result a tap equal to their start value leaves as it is.
_SKIPPABLE = frozenset({"add", "maximum", "minimum"})


def plan_pooled_pads(order: list[Kernel], buffers: dict[str, Buffer],
                     constant: Callable[[int], int | None]) -> list[Kernel]:
    """Folds each constant pad that only pooling windows read, with their start value as
    its constant, into them (the module docstring); returns the launch order left. The
    innermost dim must not be padded: a window over the outer dims runs a row of it at
    a time (``cpu_index_rows.channel_window_source``)."""
    pad_value = {}
    for k in order:
        if _constant_pad(k, buffers, constant):
            (_, out), source = k.outputs[0], k.inputs[0].buffer
            low = k.ops[0].attrs["low"]
            if (low and constant(low[-1]) == 0
                    and buffers[out].dims[-1] == buffers[source].dims[-1]):
                pad_value[out] = k.ops[0].operands[1][1]

    def reader_ok(k: Kernel, i: int, rank: int) -> bool:
        if k.kind != "index" or len(k.ops) != 1 or i != 0 or k.epilogue:
            return False
        op, acc = k.ops[0], k.inputs[0]
        return (op.op == "reduce_window" and op.attrs["combiner"] in _SKIPPABLE
                and "low" not in op.attrs and acc.is_identity and acc.window is None
                and acc.buffer in pad_value and op.attrs["init"] == pad_value[acc.buffer])

    def rewrite(pad: Kernel, k: Kernel, i: int) -> None:
        k.ops[0].attrs["low"] = list(pad.ops[0].attrs["low"])
        k.inputs[i] = Access(pad.inputs[0].buffer)

    return fold_into_readers(order, buffers, lambda k: _constant_pad(k, buffers, constant),
                             reader_ok, rewrite)
