"""GEMM epilogues: a kernel reading a GEMM's result runs inside the GEMM (or inside
a depthwise convolution, on the pixels of each of its tasks).

The RAL computes a GEMM as blocks of C, one task each; with an epilogue it runs
the consumer kernel on each block right after computing it, on the same thread,
while the block is still in cache (``sgemm_epilogue``, RAL ABI 4). The bias,
activation and residual that follow a MatMul then cost no extra pass over C in
memory and no extra launch.

Legality only; the kernel stays a kernel of the plan (and is still counted),
its launch moves into the GEMM's. A loop or stitch kernel E is the epilogue of
library kernel L when:

* E's iteration space is C's shape (dim classes equal), or that of a view
  (reshape) of C whose rows split C's evenly, so E's row-major index of element
  (q, i, j) of product q is C's; and E reads C once, at its own index;
* every other buffer E reads is written before L starts (E now runs during L);
* E's outputs do not live in memory that L reads (A or B of other blocks) or
  that a kernel between L and E still reads (an in-place reuse).
"""

from __future__ import annotations

from collections.abc import Callable

from disc_tf.fusion.masked_columns import masked_input
from disc_tf.fusion.plan import Buffer, Kernel, depthwise_f32, gemm_form, memory_of, root_of

#: Kernels that can run on a block of C: loop kernels on any block, stitch kernels
#: (a row-wise reduction and its consumers: layer norm, softmax) on blocks of whole
#: rows, which the GEMM then only cuts by rows.
EPILOGUE_KINDS = ("loop", "stitch")


def plan_epilogues(order: list[Kernel], buffers: dict[str, Buffer],
                   same_dim: Callable[[int, int], bool],
                   constant: Callable[[int], int | None]) -> None:
    """Sets ``epilogue`` (and ``epilogue_full_rows``) on every library kernel of
    ``order`` that takes one."""
    def root(name: str) -> str:
        return root_of(buffers, name)

    def memory(name: str) -> str:
        return memory_of(buffers, name)

    first_write = first_writes(order, buffers)
    taken: set[str] = set()
    for li, lib in enumerate(order):
        # A dilated conv_taps adds into C once per tap: no block is final. (conv_rows
        # runs the epilogue with its last GEMM, which finishes each block.)
        # A depthwise convolution (f32) runs a loop kernel on each task's pixels.
        depthwise = depthwise_f32(lib, buffers)
        if not depthwise and (lib.kind != "library" or not (
                lib.ops[0].op in ("dot_general", "conv_rows")
                or (lib.ops[0].op == "conv_taps" and lib.ops[0].attrs["dilation"] == 1))):
            continue
        if "c_layout" in lib.ops[0].attrs:
            continue  # C is not row-major where the epilogue would read it
        (_, c_name), = lib.outputs
        c = buffers[c_name]
        for ei in range(li + 1, len(order)):
            e = order[ei]
            if e.name in taken or e.kind not in EPILOGUE_KINDS:
                continue
            read = _read_of_c(e, c_name, root)
            if read is None:
                continue
            seen = buffers[read]  # C, or a view (reshape) of it: the same flat order
            if not seen.dims or len(e.dims) != len(seen.dims) or not all(
                    same_dim(a, b) for a, b in zip(e.dims, seen.dims)):
                continue
            # E's rows must not straddle C's: its row length divides C's.
            split_rows = not same_dim(seen.dims[-1], c.dims[-1])
            n, w = constant(c.dims[-1]), constant(seen.dims[-1])
            if split_rows and not (n and w and n % w == 0):
                continue
            if depthwise and (split_rows or e.kind != "loop"):
                continue
            if not _ready_before(e, c_name, li, first_write, root):
                continue
            between = {memory(a.buffer) for k in order[li + 1:ei] for a in k.inputs}
            lib_reads = {memory(a.buffer) for a in lib.inputs}
            if any(memory(b) in lib_reads or (buffers[b].reuses and memory(b) in between)
                   for _, b in e.outputs):
                continue
            lib.epilogue = e.name
            lib.epilogue_full_rows = e.kind == "stitch" or split_rows
            taken.add(e.name)
            break


def first_writes(order: list[Kernel], buffers: dict[str, Buffer]) -> dict[str, int]:
    """Root buffer -> position in ``order`` of the first kernel writing it."""
    first: dict[str, int] = {}
    for n, k in enumerate(order):
        for _, b in k.outputs:
            first.setdefault(root_of(buffers, b), n)
    return first


def _read_of_c(e: Kernel, c_name: str, root) -> str | None:
    """The buffer (C or a view of C) through which E reads C's memory, if E reads it
    through exactly one access, at E's own index."""
    reads = [a for a in e.inputs if root(a.buffer) == c_name]
    if len(reads) == 1 and reads[0].is_identity and reads[0].window is None:
        return reads[0].buffer
    return None


def _ready_before(e: Kernel, c_name: str, li: int, first_write: dict[str, int],
                  root) -> bool:
    """Every buffer E reads, C aside, is written before kernel ``li`` runs."""
    for a in e.inputs:
        r = root(a.buffer)
        if r != c_name and first_write.get(r, -1) >= li:
            return False
    return True


def plan_chains(order: list[Kernel], buffers: dict[str, Buffer],
                same_dim: Callable[[int, int], bool]) -> None:
    """Sets ``chain`` on every library kernel L1 whose row-wise epilogue E (a stitch
    kernel on whole rows of C) writes the A operand of a later GEMM L2: L2 then runs on
    the rows of each block of C right after E, on the same thread (attention:
    P = softmax(Q Kᵀ) and P · V per block of query rows, P still in cache). L2 must:

    * read E's result as its A, not transposed, with the same products in the same
      order ([batch..., m, k], k being C's n) and m = C's m;
    * read a B written before L1 starts;
    * write memory that no kernel from L1 to L2 reads or writes (it is written earlier
      now, while they run).
    """
    def memory(name: str) -> str:
        return memory_of(buffers, name)

    def root(name: str) -> str:
        return root_of(buffers, name)

    by_name = {k.name: n for n, k in enumerate(order)}
    first_write = first_writes(order, buffers)
    chained: set[str] = set()
    for li, lib in enumerate(order):
        if (lib.kind != "library" or lib.ops[0].op != "dot_general" or lib.epilogue is None
                or "gathered_a" in lib.ops[0].attrs):
            continue
        ei = by_name[lib.epilogue]
        e = order[ei]
        (_, c_name), = lib.outputs
        c = buffers[c_name]
        if e.kind != "stitch" or len(e.dims) != len(c.dims) or not all(
                same_dim(a, b) for a, b in zip(e.dims, c.dims)):
            continue
        results = {b for _, b in e.outputs}
        for l2i in range(ei + 1, len(order)):
            l2 = order[l2i]
            if (l2.kind != "library" or l2.ops[0].op != "dot_general" or l2.epilogue
                    or "gathered_a" in l2.ops[0].attrs
                    or l2.chain or l2.name in chained or not l2.inputs
                    or l2.inputs[0].buffer not in results or not l2.inputs[0].is_identity):
                continue
            if not _rows_of_products(l2, buffers[l2.inputs[0].buffer], c, same_dim):
                continue
            if first_write.get(root(l2.inputs[1].buffer), -1) >= li:
                continue
            written = {memory(b) for _, b in l2.outputs}
            touched = {memory(a.buffer) for k in order[li:l2i + 1] for a in k.inputs}
            touched |= {memory(b) for k in order[li:l2i] for _, b in k.outputs}
            if written & touched:
                continue
            lib.chain = l2.name
            chained.add(l2.name)
            break


def plan_block_scratch(order: list[Kernel], buffers: dict[str, Buffer]) -> None:
    """Sets ``c_in_scratch`` on every chained GEMM L1 whose C no kernel but L1, its
    epilogue E and the chained L2 touches: C a dense temp of its own memory, written
    as the GEMM's products (no reader's layout), E's results written in C's place (P),
    read by E at its own index and by L2 alone. C then need not exist whole: each
    block of C lives in the thread's scratch while E and L2 run on it (attention
    without its S x S matrix in memory)."""
    by_name = {k.name: k for k in order}
    for lib in order:
        if not lib.chain or lib.epilogue is None or "c_layout" in lib.ops[0].attrs:
            continue
        e, l2 = by_name[lib.epilogue], by_name[lib.chain]
        (_, c_name), = lib.outputs
        c = buffers[c_name]
        if c.role != "temp" or c.alias_of or c.reuses:
            continue
        users = {lib.name, e.name, l2.name}
        memory = c_name
        if any(memory_of(buffers, n) == memory for k in order if k.name not in users
               for n in [a.buffer for a in k.inputs] + [b for _, b in k.outputs]):
            continue  # another kernel touches C's memory
        if any(memory_of(buffers, b) != memory for _, b in e.outputs):
            continue  # E writes elsewhere too: that result must stay in memory
        if [a.buffer for a in e.inputs if memory_of(buffers, a.buffer) == memory] != [c_name]:
            continue  # E reads C once, itself (no view), at its own index
        if not all(a.is_identity for a in e.inputs if a.buffer == c_name):
            continue
        l2_reads = [a for a in l2.inputs if memory_of(buffers, a.buffer) == memory]
        if len(l2_reads) != 1 or l2_reads[0] is not l2.inputs[0]:
            continue  # L2 reads P as its A only
        if any(memory_of(buffers, b) == memory for _, b in l2.outputs):
            continue
        lib.c_in_scratch = True
        lib.masked_by = masked_input(lib, e, buffers)


def _rows_of_products(l2: Kernel, a: Buffer, c: Buffer,
                      same_dim: Callable[[int, int], bool]) -> bool:
    """Whether GEMM ``l2`` reads ``a`` (shaped as C) as row-major products [batch..., m, k]
    in C's product order, not transposed: row i of product q of C is row i of its A."""
    nb = len(c.dims) - 2
    if len(a.dims) != len(c.dims) or not all(same_dim(x, y) for x, y in zip(a.dims, c.dims)):
        return False
    attrs = l2.ops[0].attrs
    if "strided" in attrs:
        f = attrs["strided"]
        return ([b[0] for b in f["batch"]] == list(range(nb)) and f["m"] == nb
                and f["k_lhs"] == nb + 1 and not f["transpose_a"])
    return (attrs.get("lhs_batch") == list(range(nb)) and attrs.get("lhs_contract") == [nb + 1]
            and len(a.dims) == nb + 2)


def plan_shared_a(order: list[Kernel], buffers: dict[str, Buffer],
                  same_dim: Callable[[int, int], bool]) -> None:
    """Sets ``shares_a`` on the last of every run of consecutive GEMMs that read the
    same A (Q, K and V projected from one input): one launch then computes each row
    block of all of them, the block's rows of A read once into cache, and the last
    one's epilogue runs on the block. Each of the run must be a plain GEMM without
    batch dims ([m.., k] x [k, n] or [n, k]), A read as stored; none with a chain, all
    but the last without an epilogue; all results of one shape, in memory none of them
    reads; and the last one's epilogue may read the others' results only at its own
    index (the rows its block has)."""
    by_name = {k.name: k for k in order}
    run: list[Kernel] = []

    def flush() -> None:  # the shared launch runs no chain (``shared_a_launch``)
        if len(run) > 1 and not run[-1].chain and _group_legal(run, by_name, buffers, same_dim):
            run[-1].shares_a = [k.name for k in run[:-1]]
        run.clear()

    for k in order:
        if not plain_gemm(k, buffers):
            flush()
            continue
        if run and (k.inputs[0].buffer != run[0].inputs[0].buffer
                    or run[-1].epilogue or run[-1].chain):
            flush()
        run.append(k)
    flush()


def plain_gemm(k: Kernel, buffers: dict[str, Buffer]) -> bool:
    """A library dot_general without batch dims, A not transposed, both read as stored."""
    if k.kind != "library" or k.ops[0].op != "dot_general" or "strided" in k.ops[0].attrs:
        return False
    if len(k.inputs) != 2 or not all(a.is_identity and a.window is None for a in k.inputs):
        return False
    lhs, rhs = (buffers[a.buffer] for a in k.inputs)
    form = gemm_form(len(lhs.dims), len(rhs.dims), k.ops[0].attrs)
    return form is not None and not form.batch and not form.transpose_a


def _group_legal(run: list[Kernel], by_name: dict[str, Kernel], buffers: dict[str, Buffer],
                 same_dim: Callable[[int, int], bool]) -> bool:
    """The shape, memory and epilogue conditions of ``plan_shared_a`` for ``run``."""
    outs = [buffers[k.outputs[0][1]] for k in run]
    first = buffers[run[0].inputs[0].buffer]
    if any(len(o.dims) != len(outs[0].dims) or not all(same_dim(x, y) for x, y in zip(
            o.dims, outs[0].dims)) for o in outs):
        return False
    if any(len(buffers[k.inputs[0].buffer].dims) != len(first.dims) for k in run):
        return False
    read = {memory_of(buffers, a.buffer) for k in run for a in k.inputs}
    if any(memory_of(buffers, o.name) in read for o in outs):
        return False
    last = run[-1]
    if last.epilogue is not None:
        e = by_name[last.epilogue]
        if any(memory_of(buffers, b) in read for _, b in e.outputs):
            return False  # E writes (in place) over what another member's blocks still read
        roots = {root_of(buffers, k.outputs[0][1]) for k in run[:-1]}
        for a in e.inputs:
            if root_of(buffers, a.buffer) in roots and not (a.is_identity and a.window is None):
                return False
    return True


def hoist_epilogue_inputs(order: list[Kernel], buffers: dict[str, Buffer]) -> list[Kernel]:
    """``order`` with the kernels that the one reader E of a GEMM's result still needs
    from between the GEMM and E moved to just before the GEMM, where none of them needs
    the GEMM: E can then run as its epilogue (``_ready_before``). GPT-2's causal mask,
    computed for every layer by one kernel after the first layer's scores GEMM, kept that
    layer's softmax out of it. Runs before the buffer planner, while every buffer is
    written once: a kernel may move earlier when everything it reads is written before
    its new place."""
    order = list(order)
    i = 0
    while i < len(order):
        lib = order[i]
        i += 1
        if lib.kind != "library" or lib.ops[0].op != "dot_general" or len(lib.outputs) != 1:
            continue
        li = i - 1
        c = root_of(buffers, lib.outputs[0][1])
        readers = [j for j in range(li + 1, len(order))
                   if any(root_of(buffers, a.buffer) == c for a in order[j].inputs)]
        if len(readers) != 1 or order[readers[0]].kind not in ("loop", "stitch"):
            continue  # an epilogue is a loop or stitch kernel
        writer = {root_of(buffers, b): j for j, k in enumerate(order) for _, b in k.outputs}
        # E's inputs written after the GEMM, and theirs: what each of them reads is then
        # written before the GEMM or by another of them (none reads C: E is its one
        # reader), so they can all run before it
        need: set[int] = set()
        stack = [readers[0]]
        while stack:
            for a in order[stack.pop()].inputs:
                w = writer.get(root_of(buffers, a.buffer))
                if w is not None and w > li and w not in need:
                    need.add(w)
                    stack.append(w)
        if not need or any(order[j].kind == "library" for j in need):
            continue  # GEMMs keep their order (the projections sharing A stay as planned)
        moved = [order[j] for j in sorted(need)]
        rest = [k for j, k in enumerate(order[li + 1:], li + 1) if j not in need]
        order = order[:li] + moved + [lib] + rest
        i = li + len(moved) + 1
    return order
