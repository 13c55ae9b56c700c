"""Gathers read in place by the GEMM that reads them: an embedding lookup's rows go
straight from the table into the GEMM's per-task scratch (RAL ``sgemm_gathered_a``)
instead of into a [ids..., depth] buffer first.

A library GEMM qualifies when its A is, as stored, the result of an index kernel that
only gathers rows of a 2-D f32 table (``torch_index_select`` along dim 0, no batch
dims) and nothing else reads that result (no other kernel, not a cluster result). The
GEMM must contract A's last dim without batch dims or a transpose (of A or B: the RAL
service reads B row-major), so that row i of A
is table row ``ids[i]`` (ids flattened). The gather kernel goes, and the GEMM reads
the table and the ids instead: ``KernelOp.attrs["gathered_a"]`` names them and the
GEMM's inputs become (table, B, ids). The GEMM checks the indices as the gather did.
"""

from __future__ import annotations

from disc_tf.fusion.plan import Access, Buffer, Kernel, gemm_form


def plan_gathered_a(order: list[Kernel], buffers: dict[str, Buffer]) -> list[Kernel]:
    """Folds each qualifying row gather into the GEMM reading it (see the module
    docstring); returns the launch order without the folded gather kernels."""
    writer = {buf: k for k in order for _, buf in k.outputs}
    readers: dict[str, list[Kernel]] = {}
    for k in order:
        for a in k.inputs:
            readers.setdefault(a.buffer, []).append(k)
    folded: set[str] = set()
    for gemm in order:
        gather = _row_gather_feeding(gemm, buffers, writer, readers)
        if gather is None:
            continue
        a_buffer = gemm.inputs[0].buffer
        table, ids = gather.inputs
        rhs = gemm.inputs[1]
        gemm.ops[0].attrs["gathered_a"] = {"table": table.buffer, "ids": ids.buffer,
                                           "tf_node": gather.ops[0].tf_node}
        gemm.inputs = [Access(table.buffer), rhs, Access(ids.buffer)]
        folded.add(gather.name)
        del buffers[a_buffer]
    return [k for k in order if k.name not in folded]


def _row_gather_feeding(gemm: Kernel, buffers: dict[str, Buffer], writer: dict[str, Kernel],
                        readers: dict[str, list[Kernel]]) -> Kernel | None:
    """The index kernel gathering table rows that only ``gemm`` reads, as its A; or None."""
    if gemm.kind != "library" or gemm.ops[0].op != "dot_general" or len(gemm.inputs) != 2:
        return None
    attrs = gemm.ops[0].attrs
    if "strided" in attrs or "c_layout" in attrs:
        return None
    a, b = gemm.inputs
    if not (a.is_identity and a.window is None and a.part_of is None and b.is_identity):
        return None
    lhs, rhs = buffers[a.buffer], buffers[b.buffer]
    form = gemm_form(len(lhs.dims), len(rhs.dims), attrs)
    if (form is None or form.batch or form.transpose_a or form.transpose_b
            or lhs.elem != "f32" or form.k != [len(lhs.dims) - 1]):
        return None
    gather = writer.get(a.buffer)
    if (gather is None or gather.kind != "index" or len(gather.ops) != 1
            or len(gather.outputs) != 1 or lhs.role != "temp"
            or readers.get(a.buffer) != [gemm]
            or any(other.alias_of == a.buffer for other in buffers.values())):
        return None
    op = gather.ops[0]
    if op.op != "torch_index_select" or op.attrs.get("dim") != 0 or op.attrs.get("batch_dims"):
        return None
    table, ids = gather.inputs
    if not (table.is_identity and table.window is None and ids.is_identity and ids.window is None):
        return None
    tbuf, ibuf = buffers[table.buffer], buffers[ids.buffer]
    if len(tbuf.dims) != 2 or tbuf.elem != "f32" or ibuf.elem not in ("i32", "i64"):
        return None
    return gather
