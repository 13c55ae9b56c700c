"""GEMM results written in the layout their reader wants.

Attention's context ``P · V`` is a GEMM over products [batch, heads] of [seq, dim]
blocks, and the model reads it transposed, as [batch, seq, heads, dim] (then viewed
as [batch, seq, heads * dim] by the output projection). Planned as it stands, a loop
kernel copies the GEMM's result into that layout: one more launch and one more pass
over the result. The RAL's GEMM writes each product at its own offset with its own
leading dim, so it can write the reader's layout itself.

A library GEMM L and the loop kernel K after it are merged when:

* K only copies (one op: a conversion to the same type) one input, L's result C,
  through a transpose (no broadcast, no window) into one buffer O;
* C's last dim (the GEMM's n) is O's last dim, so C's rows stay contiguous in O:
  each product (q0, q1) of C starts at O's stride of the batch dims it runs along,
  and row i of it at i times O's stride of the dim m runs along (the leading dim);
* L is a GEMM the RAL runs as a two-level batch (at most two batch dims, one
  contracted dim), C is a temp that nothing else reads, and O owns its memory.

L then writes O (``attrs["c_layout"]``: the O dims C's batch dims and m run along,
and the TF node of the copy),
K goes, and so does C. The pass runs before the buffer planner. A GEMM writing a
layout takes no epilogue (the epilogue reads C at its own row-major index).
"""

from __future__ import annotations

from collections.abc import Callable

from disc_tf.fusion.plan import Access, Buffer, Kernel, gemm_form, root_of, strided_gemm


def plan_result_layouts(order: list[Kernel], buffers: dict[str, Buffer],
                        results: set[str],
                        same_dim: Callable[[int, int], bool]) -> list[Kernel]:
    """``order`` without the copy kernels whose GEMM now writes their output in its
    layout (sets ``c_layout``, and ``strided`` where the GEMM had no such form, on
    each such GEMM's op; drops its old result buffer)."""
    # Built once, before any merge, and not updated by one. After a merge the map is
    # stale only for the copy's output O, which it still gives to the (dropped) copy
    # kernel rather than to the GEMM now writing it. That is safe: a later copy reading
    # O then finds a "loop" writer and is not merged, which is what we want, as a GEMM
    # writes one layout only. C, the buffer the GEMM gave up, had no other reader.
    writer = {b: k for k in order for _, b in k.outputs}
    readers: dict[str, list[Kernel]] = {}
    for k in order:
        for a in k.inputs:
            readers.setdefault(root_of(buffers, a.buffer), []).append(k)
    gone: set[int] = set()
    for copy in order:
        merge = _mergeable(copy, buffers, writer, readers, results, same_dim)
        if merge is None:
            continue
        gemm, form, layout = merge
        (value, c_name), = gemm.outputs
        (_, out_name), = copy.outputs
        op = gemm.ops[0]
        op.attrs["strided"] = form
        op.attrs["c_layout"] = layout
        gemm.outputs = [(value, out_name)]
        del buffers[c_name]
        gone.add(id(copy))
    return [k for k in order if id(k) not in gone]


def _mergeable(copy: Kernel, buffers: dict[str, Buffer], writer: dict[str, Kernel],
               readers: dict[str, list[Kernel]], results: set[str],
               same_dim: Callable[[int, int], bool]) -> tuple[Kernel, dict, dict] | None:
    """(the GEMM, its two-level-batch form, the layout) if ``copy`` is a transposing
    copy of a GEMM's result that the GEMM can write itself, else None."""
    if copy.kind != "loop" or len(copy.inputs) != 1 or len(copy.outputs) != 1:
        return None
    if len(copy.ops) != 1:
        return None
    op = copy.ops[0]
    if op.op != "convert" or op.operands != [("in", 0)] or op.elem != op.operand_elems[0]:
        return None
    acc = copy.inputs[0]
    if (acc.dims is None or acc.window is not None or acc.part_of is not None
            or any(e != "no" for e in acc.expand)):
        return None
    c_name, (_, out_name) = acc.buffer, copy.outputs[0]
    c, out = buffers[c_name], buffers[out_name]
    gemm = writer.get(c_name)
    if (gemm is None or gemm.kind != "library" or gemm.ops[0].op != "dot_general"
            or len(gemm.outputs) != 1 or c.role != "temp" or c.alias_of is not None
            or c_name in results or readers.get(c_name) != [copy]
            or out.alias_of is not None or out.elem != c.elem):
        return None
    rank = len(c.dims)
    perm = acc.dims  # C dim t runs along kernel (and O) dim perm[t]
    if (len(copy.dims) != rank or len(out.dims) != rank
            or not all(same_dim(a, b) for a, b in zip(copy.dims, out.dims))
            or perm[rank - 1] != rank - 1):
        return None
    form = _two_level_form(gemm, buffers)
    if form is None or len(form["batch"]) != rank - 2:
        return None
    return gemm, form, {"batch": perm[:rank - 2], "m": perm[rank - 2], "tf_node": op.tf_node}


def _two_level_form(gemm: Kernel, buffers: dict[str, Buffer]) -> dict | None:
    """The GEMM's operands as a two-level-batched GEMM over their memory: its
    ``strided`` form, or that of operands read as stored; None if it has none."""
    op = gemm.ops[0]
    if "strided" in op.attrs:
        return op.attrs["strided"]
    if len(gemm.inputs) != 2 or not all(a.is_identity and a.window is None
                                        for a in gemm.inputs):
        return None
    lhs, rhs = (buffers[a.buffer] for a in gemm.inputs)
    if gemm_form(len(lhs.dims), len(rhs.dims), op.attrs) is None:
        return None
    return strided_gemm(op.attrs, list(range(len(lhs.dims))), list(range(len(rhs.dims))))


def plan_transposed_products(order: list[Kernel], buffers: dict[str, Buffer],
                             results: set[str]) -> None:
    """GEMMs whose one reader reads their result C with its two matrix dims swapped
    (keras-hub GPT-2's scores, softmax taken over the columns of K Qᵀ) compute Cᵀ
    instead, their operands swapped (``B^T A^T``, the dot_general's lhs and rhs
    exchanged): the reader then reads it at its own index, so the row-wise epilogue,
    the chained GEMM and per-block scratch of attention apply. Only for a GEMM writing
    no reader's layout whose C is a temp nothing else reads, and whose swapped form is
    still a GEMM (operands read through transposes: their ``strided`` form swapped)."""
    readers: dict[str, list[tuple[Kernel, Access]]] = {}
    for k in order:
        for a in k.inputs:
            readers.setdefault(root_of(buffers, a.buffer), []).append((k, a))
    for lib in order:
        if lib.kind != "library" or lib.ops[0].op != "dot_general" or len(lib.inputs) != 2:
            continue
        op = lib.ops[0]
        if "c_layout" in op.attrs or len(lib.outputs) != 1:
            continue
        (_, c_name), = lib.outputs
        c = buffers[c_name]
        if c.role != "temp" or c.alias_of is not None or c_name in results:
            continue
        uses = readers.get(c_name, [])
        if len(uses) != 1:
            continue
        reader, acc = uses[0]
        rank, nb = len(c.dims), len(c.dims) - 2
        if (acc.buffer != c_name or acc.dims != [*range(nb), nb + 1, nb]
                or any(e != "no" for e in acc.expand) or acc.window is not None
                or acc.part_of is not None or len(reader.dims) != rank):
            continue
        lhs, rhs = lib.inputs
        if not (lhs.is_identity and rhs.is_identity):
            continue
        swapped = {**op.attrs, "lhs_batch": op.attrs["rhs_batch"],
                   "rhs_batch": op.attrs["lhs_batch"], "lhs_contract": op.attrs["rhs_contract"],
                   "rhs_contract": op.attrs["lhs_contract"]}
        if "strided" in op.attrs:  # operands read through transposes: the form swapped
            f = op.attrs["strided"]
            swapped["strided"] = {
                "batch": [(r, q) for q, r in f["batch"]], "m": f["n"], "k_lhs": f["k_rhs"],
                "k_rhs": f["k_lhs"], "n": f["m"],
                # each buffer's contiguous dim is one of its two matrix dims
                "transpose_a": not f["transpose_b"], "transpose_b": not f["transpose_a"]}
        elif gemm_form(len(buffers[rhs.buffer].dims), len(buffers[lhs.buffer].dims),
                       swapped) is None:
            continue
        op.attrs = swapped
        lib.inputs = [rhs, lhs]
        c.dims = [*c.dims[:nb], c.dims[nb + 1], c.dims[nb]]
        lib.dims = [*lib.dims[:nb], lib.dims[nb + 1], lib.dims[nb]]
        acc.dims, acc.expand = None, None
