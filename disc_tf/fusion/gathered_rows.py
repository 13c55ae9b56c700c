"""Gathers read in place by loop and stitch kernels: an embedding lookup's rows are
read straight from the table by the kernel that consumes them (token plus position
embeddings and their layer norm, a scaled lookup) instead of being copied into a
[ids..., depth] buffer by an index kernel first.

An index kernel qualifies when it only gathers rows of a 2-D table
(``torch_index_select`` along dim 0, no batch dims, table and ids read as stored),
its result is a temp that nothing views, and every kernel reading that result is a
loop or stitch kernel reading it through a map whose last dim runs along the
kernel's last dim, unexpanded and unsliced (broadcasts and transposes of the other
dims are fine). Each such read becomes a read of the table (``Access.gather``), with
the ids as one more input (``Access.ids_for``): per row of the kernel, the row
pointer is table row ``ids[r]``, where r is the row the gathered tensor would hold
there (its offset through the gathered tensor's strides, divided by the depth). The
gather kernel goes; the host runner checks every id against the table before the
reader's launch, as the gather kernel's check did (TF's InvalidArgument).

A gathered tensor read by a reduce, index or library kernel (other than a GEMM's A:
``gathered_a.py``), through a window or as a concatenation's part, or returned from
the cluster keeps its index kernel.
"""

from __future__ import annotations

from collections.abc import Callable

from disc_tf.fusion.plan import Access, Buffer, Kernel, RowGather

_ID_ELEMS = ("i32", "i64")


def plan_gathered_rows(order: list[Kernel], buffers: dict[str, Buffer]) -> list[Kernel]:
    """Folds each qualifying row gather into the kernels reading it (see the
    module docstring); returns the launch order without the folded gather kernels."""
    def rewrite(gather: Kernel, k: Kernel, i: int) -> None:
        table, ids = gather.inputs
        (_, out), = gather.outputs
        k.inputs.append(Access(ids.buffer, ids_for=i))
        dims, expand = mapped(k, i)
        k.inputs[i] = Access(table.buffer, dims=dims, expand=expand,
                             gather=RowGather(len(k.inputs) - 1, list(buffers[out].dims),
                                              gather.ops[0].tf_node))

    return fold_into_readers(order, buffers, lambda k: _row_gather(k, buffers),
                             lambda k, i, rank: reads_rows(k, i, rank), rewrite)


def fold_into_readers(order: list[Kernel], buffers: dict[str, Buffer],
                      source: Callable[[Kernel], bool],
                      reader_ok: Callable[[Kernel, int, int], bool],
                      rewrite: Callable[[Kernel, Kernel, int], None]) -> list[Kernel]:
    """Drops each kernel ``source`` accepts whose one result is a temp that nothing
    views and every read of which ``reader_ok(reader, input, rank of the result)``
    accepts: ``rewrite(kernel, reader, input)`` makes each such read go to the
    kernel's own inputs instead. Returns the launch order without the dropped kernels
    (their results' buffers go too)."""
    readers: dict[str, list[tuple[Kernel, int]]] = {}
    for k in order:
        for i, a in enumerate(k.inputs):
            readers.setdefault(a.buffer, []).append((k, i))
    folded: set[str] = set()
    for kernel in order:
        if not source(kernel):
            continue
        (_, out), = kernel.outputs
        reads = readers.get(out, [])
        if (buffers[out].role != "temp" or not reads
                or any(b.alias_of == out for b in buffers.values())
                or not all(reader_ok(k, i, len(buffers[out].dims)) for k, i in reads)):
            continue
        for k, i in reads:
            rewrite(kernel, k, i)
        folded.add(kernel.name)
        del buffers[out]
    return [k for k in order if k.name not in folded]


def mapped(kernel: Kernel, i: int) -> tuple[list[int], list[str]]:
    """The dims map and expansion of input ``i`` of ``kernel``, explicit for an
    identity read."""
    acc, rank = kernel.inputs[i], len(kernel.dims)
    return (list(acc.dims) if acc.dims is not None else list(range(rank)),
            list(acc.expand) if acc.expand is not None else ["no"] * rank)


def _row_gather(kernel: Kernel, buffers: dict[str, Buffer]) -> bool:
    """True if ``kernel`` only gathers rows of a 2-D table by ids read as stored."""
    if kernel.kind != "index" or len(kernel.ops) != 1 or len(kernel.outputs) != 1:
        return False
    op = kernel.ops[0]
    if op.op != "torch_index_select" or op.attrs.get("dim") != 0 or op.attrs.get("batch_dims"):
        return False
    if len(kernel.inputs) != 2 or kernel.epilogue:
        return False
    table, ids = kernel.inputs
    if not all(a.is_identity and a.window is None for a in (table, ids)):
        return False
    tbuf, ibuf = buffers[table.buffer], buffers[ids.buffer]
    return (len(tbuf.dims) == 2 and tbuf.role != "host" and ibuf.role != "host"
            and ibuf.elem in _ID_ELEMS)


def reads_rows(kernel: Kernel, i: int, rank: int, windows: bool = False,
               kinds: tuple[str, ...] = ("loop", "stitch")) -> bool:
    """True if input ``i`` of ``kernel`` (a tensor of ``rank`` dims) is read by a
    kernel of ``kinds`` with its last dim along the kernel's last, as stored, through
    no other map than a broadcast or transpose (which a read in place can take over),
    or with ``windows`` a slice of step 1 too."""
    acc = kernel.inputs[i]
    if acc.window is not None and not (windows and all(s == 1 for s in acc.window[1])):
        return False
    if kernel.kind not in kinds or not kernel.dims or (
            acc.part_of is not None or acc.gather is not None or acc.ids_for is not None
            or acc.pad is not None):
        return False
    if acc.dims is None:
        return rank == len(kernel.dims)
    if not acc.dims:  # a scalar read through a broadcast: no row of its own
        return False
    return (acc.dims[-1] == len(kernel.dims) - 1 and acc.expand[-1] == "no"
            and min(acc.dims) >= 0)
