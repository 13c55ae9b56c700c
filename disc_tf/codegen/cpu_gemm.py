"""Host-runner lines of library kernels: GEMMs through the RAL over operands as
stored, transposed ones read in place (``sgemm_strided``); with a fused consumer
run on each block of C (``sgemm_epilogue``, see ``fusion/epilogue.py``), and a
GEMM chained on its rows (``sgemm_rows``); several reading one A as one launch
(``sgemm_shared_a``). Convolutions are ``cpu_conv.py``'s."""

from __future__ import annotations

from typing import TYPE_CHECKING

from disc_tf.codegen.cpu_column_epilogue import closure_lines, column_chain
from disc_tf.codegen.cpu_ops import STORAGE
from disc_tf.codegen.cpu_text import bad_index_lines, comment, product, strided_gemm_exprs, sym
from disc_tf.fusion.plan import Buffer, Kernel, gemm_form

if TYPE_CHECKING:
    from disc_tf.codegen.cpu_kernels import KernelEmitter


def library_launch(em: KernelEmitter, buffer_ptr: dict[str, str],
                   epilogue: KernelEmitter | None = None,
                   chain: KernelEmitter | None = None) -> list[str]:
    """Host-runner lines of a library kernel: one two-level-batched GEMM call over its
    operands as stored (a plain batched GEMM is the batch x 1 case), with the
    ``epilogue`` kernel run on each block of C when the plan fused one, and the
    ``chain`` GEMM on the block's rows after it."""
    k = em.k
    (op,) = k.ops
    if "gathered_a" in op.attrs:
        return gathered_launch(em, buffer_ptr, epilogue)
    if epilogue is not None:
        return epilogue_launch(em, buffer_ptr, epilogue, chain)
    lhs, rhs = (em.buf(a) for a in k.inputs)
    g = gemm_operands(em)
    sa, sb, sc = g["sa"], g["sb"], g["sc"]
    (_, out_name), = k.outputs
    return [
        f"  {{  // {k.name}: library GEMM for {comment(op.tf_node)}"
        + (", operands read in place" if "strided" in op.attrs else ""),
        *g["lines"],
        "    if (outer > 0 && inner > 0 && m > 0 && n > 0) {",
        f"      ral->sgemm_strided(ral, outer, inner, m, n, kk, {buffer_ptr[lhs.name]}, "
        f"{g['lda']}, {sa[0]}, {sa[1]}, {g['ta']},",
        f"                         {buffer_ptr[rhs.name]}, {g['ldb']}, {sb[0]}, {sb[1]}, "
        f"{g['tb']},",
        f"                         {buffer_ptr[out_name]}, {g['ldc']}, {sc[0]}, {sc[1]});",
        "    }",
        "  }",
    ]


def gathered_launch(em: KernelEmitter, buffer_ptr: dict[str, str],
                    epilogue: KernelEmitter | None = None) -> list[str]:
    """A GEMM whose A is the table rows a gather picks (``fusion/gathered_a.py``):
    each task of ``sgemm_gathered_a`` copies its rows from the table into its own
    scratch, so the gathered tensor is never written; an index outside the table
    gives TF's InvalidArgument once the GEMM is done (its row reads as zeros)."""
    plan, k = em.plan, em.k
    (op,) = k.ops
    g = op.attrs["gathered_a"]
    table, rhs, ids = (em.buf(a) for a in k.inputs)
    (_, out_name), = k.outputs
    form = gemm_form(len(ids.dims) + 1, len(rhs.dims), op.attrs)
    assert form is not None and not form.batch and not form.transpose_b, op.attrs
    id_type = STORAGE[ids.elem]
    title = (f"  {{  // {k.name}: library GEMM for {comment(op.tf_node)}, its A the rows of "
             f"{table.name} that {comment(g['tf_node'])} picks, read in place")
    lines = [
        *_gathered_head(title, epilogue, product(ids.dims, plan),
                        product([rhs.dims[p] for p in form.n], plan), sym(table.dims[1], plan)),
        "    struct TableRows {  // rows [i0, i1) of A: table rows ids[i0..i1)",
        "      const float* table;",
        f"      const {id_type}* ids;",
        "      int64_t rows, depth, bad;",
        "      // rows of no floats are not looked up, so their ids are not checked (TF's",
        "      // gather and the index kernel check only a non-empty result's)",
        "      static void copy(void* p, int64_t i0, int64_t i1, float* dst) {",
        "        TableRows& g = *static_cast<TableRows*>(p);",
        "        for (int64_t i = i0; i < i1 && g.depth > 0; ++i, dst += g.depth) {",
        "          const int64_t idx = (int64_t)g.ids[i];",
        "          if (idx < 0 || idx >= g.rows) {",
        "            __atomic_store_n(&g.bad, idx, __ATOMIC_RELAXED);",
        "            __builtin_memset(dst, 0, g.depth * sizeof(float));",
        "          } else {",
        "            __builtin_memcpy(dst, g.table + idx * g.depth, g.depth * sizeof(float));",
        "          }",
        "        }",
        "      }",
        "    };",
        f"    TableRows rows{{{buffer_ptr[table.name]}, reinterpret_cast<const {id_type}*>("
        f"{buffer_ptr[ids.name]}),",
        f"                   {sym(table.dims[0], plan)}, kk, INT64_MIN}};",
    ]
    epi, fn, closure = _optional_epilogue(epilogue, buffer_ptr, k)
    lines += epi
    full_rows = int(k.epilogue_full_rows) if epilogue is not None else 0
    return lines + [
        "    if (m > 0 && n > 0) {",
        f"      ral->sgemm_gathered_a(ral, m, n, kk, &TableRows::copy, &rows, "
        f"{buffer_ptr[rhs.name]}, {product([rhs.dims[p] for p in form.ldb], plan)},",
        f"                            {buffer_ptr[out_name]}, n, {fn}, {closure}, {full_rows});",
        "    } else if (m > 0 && kk > 0) {  // no column of C: the ids are checked all the same",
        "      for (int64_t i = 0; i < m && rows.bad == INT64_MIN; ++i) {",
        "        const int64_t idx = (int64_t)rows.ids[i];",
        "        if (idx < 0 || idx >= rows.rows) rows.bad = idx;",
        "      }",
        "    }",
        "    if (rows.bad != INT64_MIN) {",
        *bad_index_lines(g["tf_node"], "rows.bad", "rows.rows", "      "),
        "    }",
        "  }",
    ]


def _gathered_head(title: str, epilogue: KernelEmitter | None, m: str, n: str,
                   kk: str) -> list[str]:
    """The opening lines of an ``sgemm_gathered_a`` launch: its title (naming the
    epilogue run on each block) and m, n and kk."""
    return [
        title + (f"; {epilogue.k.name} ({comment(', '.join(epilogue.k.tf_ops))}) on each "
                 "block" if epilogue is not None else ""),
        f"    const int64_t m = {m};",
        f"    const int64_t n = {n};",
        f"    const int64_t kk = {kk};",
    ]


def produced_launch(em: KernelEmitter, buffer_ptr: dict[str, str],
                    epilogue: KernelEmitter | None,
                    producer: tuple[KernelEmitter, KernelEmitter]) -> list[str]:
    """A GEMM whose A is a depthwise convolution's result after its epilogue
    (``fusion/produced_a.py``): each task of ``sgemm_gathered_a`` runs the convolution
    (``producer[0]``) on its rows of A, the output pixels, and the convolution's
    epilogue (``producer[1]``) on them in place, in its own scratch, then multiplies
    them; neither result is ever in memory whole."""
    plan, k = em.plan, em.k
    (op,) = k.ops
    conv, conv_epi = producer
    lhs, rhs = (em.buf(a) for a in k.inputs)
    (_, out_name), = k.outputs
    form = gemm_form(len(lhs.dims), len(rhs.dims), op.attrs)
    assert form is not None and not form.batch and not form.transpose_b, op.attrs
    (_, conv_out), = conv.k.outputs
    read = next(i for i, a in enumerate(conv_epi.k.inputs) if a.buffer == conv_out)
    (ca, ea, ee) = (conv.args, conv_epi.args, conv_epi.epilogue_struct)
    title = (f"  {{  // {k.name}: library GEMM for {comment(op.tf_node)}, its A made per task by "
             f"{conv.k.name} ({comment(', '.join(conv.k.tf_ops))}) and {conv_epi.k.name} "
             f"({comment(', '.join(conv_epi.k.tf_ops))}) in scratch")
    lines = [
        *_gathered_head(title, epilogue, product(lhs.dims[:-1], plan),
                        product([rhs.dims[p] for p in form.n], plan), sym(lhs.dims[-1], plan)),
        f"    const {ea} epi_args = [&] {{  // {conv_epi.k.name}'s args but its input and result",
        *conv_epi.launch_args(buffer_ptr),
        "      return k;",
        "    }();",
        f"    const {ca} conv_args = [&] {{  // {conv.k.name}'s args but its result",
        f"    {ca} k{{}};",
        *conv.fill_args(buffer_ptr),
        "      return k;",
        "    }();",
        "    struct ProducedRows {  // rows [i0, i1) of A: output pixels i0..i1 of the conv",
        f"      const {ca}* conv;",
        f"      const {ea}* epi;",
        "      int64_t depth;",
        "      static void make(void* p, int64_t i0, int64_t i1, float* dst) {",
        "        const ProducedRows& g = *static_cast<const ProducedRows*>(p);",
        "        // both kernels address pixel i at base + i * depth: here dst + (i - i0) * depth",
        "        float* base = reinterpret_cast<float*>(reinterpret_cast<uintptr_t>(dst) -",
        "                                               (uintptr_t)(i0 * g.depth) * sizeof(float));",
        f"        {ea} e = *g.epi;",
        f"        e.in{read} = base;",
        "        e.out0 = base;  // in place: an elementwise kernel",
        f"        const {ee} epi{{&e, 1, 1}};",
        f"        {ca} c = *g.conv;",
        "        int64_t bad = INT64_MIN;",
        "        c.bad = &bad;",
        "        c.out0 = base;",
        f"        c.epilogue = &{conv_epi.fn}_epilogue;",
        f"        c.closure = const_cast<{ee}*>(&epi);",
        f"        {conv.fn}_index(&c, i0, i1);",
        "      }",
        "    };",
        "    const ProducedRows rows{&conv_args, &epi_args, kk};",
    ]
    epi, fn, closure = _optional_epilogue(epilogue, buffer_ptr, k)
    full_rows = int(k.epilogue_full_rows) if epilogue is not None else 0
    return lines + epi + [
        "    if (m > 0 && n > 0) {",
        "      ral->sgemm_gathered_a(ral, m, n, kk, &ProducedRows::make, "
        "const_cast<ProducedRows*>(&rows),",
        f"                            {buffer_ptr[rhs.name]}, "
        f"{product([rhs.dims[p] for p in form.ldb], plan)}, {buffer_ptr[out_name]}, n, {fn},",
        f"                            {closure}, {full_rows});",
        "    }",
        "  }",
    ]


def epilogue_closure(epilogue: KernelEmitter, buffer_ptr: dict[str, str], rows: str,
                     cols: str, registers_of: Kernel | None = None) -> tuple[list[str], str, str]:
    """Host lines building ``epilogue``'s args and the closure ``epi`` a GEMM hands it
    (``rows`` rows of C per product, ``cols`` columns), and the function and closure
    arguments of ``sgemm_epilogue``. With ``registers_of`` (the GEMM, where the RAL
    calls the epilogue with C as the GEMM wrote it), an epilogue of column steps goes
    to the RAL as such, to run on C's registers (``cpu_column_epilogue.py``)."""
    struct = epilogue.epilogue_struct
    lines = epilogue.launch_args(buffer_ptr) + [
        f"    const int64_t inner_rows = k.dims[{epilogue.rank - 1}];  // the epilogue's row length",
        f"    const {struct} epi{{&k, {rows}, inner_rows > 0 ? {cols} / inner_rows : 1}};"]
    fn, closure = f"{epilogue.fn}_epilogue", f"const_cast<{struct}*>(&epi)"
    chain = column_chain(epilogue.plan, registers_of, epilogue.k) if registers_of else None
    if chain is None:
        return lines, fn, closure
    lines += closure_lines(chain, rows, cols)
    return (lines, f"(on_registers ? ral->column_epilogue : {fn})",
            f"(on_registers ? static_cast<void*>(&col) : static_cast<void*>({closure}))")


def _optional_epilogue(epilogue: KernelEmitter | None, buffer_ptr: dict[str, str],
                       registers_of: Kernel | None = None) -> tuple[list[str], str, str]:
    """``epilogue_closure`` over m rows of n columns, or no lines and null function and
    closure without an epilogue."""
    if epilogue is None:
        return [], "nullptr", "nullptr"
    return epilogue_closure(epilogue, buffer_ptr, "m", "n", registers_of)


def gemm_operands(em: KernelEmitter) -> dict:
    """A dot_general library kernel as a two-level-batched GEMM: host ``lines``
    defining outer, inner, m, n and kk, n's expression (plain GEMMs), the leading
    dims, the (outer, inner) batch strides of A, B and C (``sa``, ``sb``, ``sc``) and
    the transposes."""
    plan, k = em.plan, em.k
    (op,) = k.ops
    lhs, rhs = (em.buf(a) for a in k.inputs)
    if "strided" in op.attrs:
        f = op.attrs["strided"]
        g = strided_gemm_exprs(f, lhs, rhs, plan)
        sc, ldc = ["inner * m * n", "m * n"], "n"
        if "c_layout" in op.attrs:  # C written where its transposing reader wants it
            layout = op.attrs["c_layout"]
            out = plan.buffers[k.outputs[0][1]]

            def stride(d: int) -> str:
                return product(out.dims[d + 1:], plan)

            sc = [stride(d) for d in layout["batch"]] + ["0"] * (2 - len(layout["batch"]))
            ldc = stride(layout["m"])
        return {**g, "ta": int(f["transpose_a"]), "tb": int(f["transpose_b"]),
                "sc": sc, "ldc": ldc}
    form = gemm_form(len(lhs.dims), len(rhs.dims), op.attrs)
    if form is None:
        raise ValueError(f"{k.name}: dot_general {op.attrs} is not a GEMM")

    def of(buf: Buffer, positions: list[int]) -> str:
        return product([buf.dims[p] for p in positions], plan)

    n = of(rhs, form.n)
    return {"lines": [f"    const int64_t outer = {of(lhs, form.batch)}, inner = 1;",
                      f"    const int64_t m = {of(lhs, form.m)};",
                      f"    const int64_t n = {n};",
                      f"    const int64_t kk = {of(lhs, form.k)};"],
            "n": n, "sa": [of(lhs, form.stride_a), "0"], "sb": [of(rhs, form.stride_b), "0"],
            "lda": of(lhs, form.lda), "ldb": of(rhs, form.ldb),
            "ta": int(form.transpose_a), "tb": int(form.transpose_b), "sc": ["m * n", "0"],
            "ldc": "n"}


def epilogue_launch(em: KernelEmitter, buffer_ptr: dict[str, str],
                    epilogue: KernelEmitter, chain: KernelEmitter | None = None) -> list[str]:
    """The GEMM through ``sgemm_epilogue``: the epilogue kernel's args, then the
    GEMM (a plain batched one as a two-level batch of batch x 1); with ``chain``, the
    GEMM reading the epilogue's result runs on each block's rows after it."""
    k = em.k
    (op,) = k.ops
    lhs, rhs = (em.buf(a) for a in k.inputs)
    (_, out_name), = k.outputs
    e = epilogue.k.name
    title = (f"  {{  // {k.name}: library GEMM for {comment(op.tf_node)}, "
             f"{e} ({comment(', '.join(epilogue.k.tf_ops))}) on each block")
    if chain is not None:
        title += f", then {chain.k.name} ({comment(chain.k.ops[0].tf_node)}) on its rows"
    g = gemm_operands(em)
    assert g["ldc"] == "n", f"{k.name}: a GEMM with an epilogue writes C row-major"
    lines = [title, *g["lines"]]
    scratch = k.c_in_scratch
    # the RAL calls the epilogue on C as the GEMM wrote it: not on scratch, nor by a chain
    epi, fn, closure = epilogue_closure(epilogue, buffer_ptr, "m", "n",
                                        k if chain is None and not scratch else None)
    lines += epi
    if chain is not None:
        chain_lines, fn, closure = _chain_closure(
            chain, buffer_ptr, fn, closure, epilogue if scratch else None, out_name,
            k.masked_by)
        lines += chain_lines
    elif scratch:
        lines += [
            "    // C never exists whole: each task's rows of it, all columns, in the thread's",
            f"    // scratch, where {e} runs on them",
            "    struct Scratch {",
            "      disc_gemm_epilogue_fn epilogue;",
            "      void* closure;",
            *scratch_block(epilogue, out_name, "Scratch"),
            "    };",
            f"    Scratch scratch{{{fn}, {closure}}};",
        ]
    sa, sb, sc = g["sa"], g["sb"], g["sc"]
    # C only ever in each block's scratch (the epilogue and chain run on it there), else in memory
    masked = k.masked_by is not None  # only ever set with C in scratch and a chain
    name = ("sgemm_scratch_c_cols" if masked else "sgemm_scratch_c") if scratch else "sgemm_epilogue"
    call = f"      ral->{name}("
    pad = " " * len(call)
    holder = "Chain::block, &chain" if chain is not None else "Scratch::block, &scratch"
    if masked:
        holder += ", &Chain::cols"
    c_args = ([f"&{holder});"] if scratch else [
        f"{buffer_ptr[out_name]}, n, {sc[0]}, {sc[1]},",
        f"{fn}, {closure}, {int(k.epilogue_full_rows)}, 0);"])
    lines += [
        "    if (outer > 0 && inner > 0 && m > 0 && n > 0) {",
        f"{call}ral, outer, inner, m, n, kk, {buffer_ptr[lhs.name]}, "
        f"{g['lda']}, {sa[0]}, {sa[1]}, {g['ta']},",
        f"{pad}{buffer_ptr[rhs.name]}, {g['ldb']}, {sb[0]}, {sb[1]}, {g['tb']},",
        *(pad + arg for arg in c_args),
        "    }",
    ]
    if chain is not None:  # no column of C: the chained GEMM's depth is 0, its result zeros
        lines += [
            "    else if (outer > 0 && inner > 0 && m > 0) {",
            "      for (int64_t q = 0; q < outer * inner; ++q) chain.rows(q, 0, m, 0);",
            "    }",
        ]
    return lines + ["  }"]


def shared_a_launch(em: KernelEmitter, buffer_ptr: dict[str, str],
                    shares: list[KernelEmitter], epilogue: KernelEmitter | None) -> list[str]:
    """GEMMs reading one A (``shares`` then ``em``) as one ``sgemm_shared_a`` launch:
    each row block of every product, then ``epilogue`` (``em``'s) on the block."""
    members = [*shares, em]
    count = len(members)
    names = ", ".join(m.k.name for m in members)
    tf_ops = ", ".join(comment(m.k.ops[0].tf_node) for m in members)
    title = f"  {{  // {names}: library GEMMs for {tf_ops}, reading one A, as one launch"
    if epilogue is not None:
        title += f"; {epilogue.k.name} ({comment(', '.join(epilogue.k.tf_ops))}) on each row block"
    operands = [gemm_operands(m) for m in members]
    g = operands[-1]  # m and kk are every member's: the same A
    a_ptr = buffer_ptr[em.buf(em.k.inputs[0]).name]
    b_ptrs = [buffer_ptr[m.buf(m.k.inputs[1]).name] for m in members]
    c_ptrs = [buffer_ptr[m.k.outputs[0][1]] for m in members]
    lines = [title, *g["lines"]]
    lines += [f"    const int64_t n_{i} = {o['n']};" for i, o in enumerate(operands)]
    lines += [
        f"    const float* const bs[{count}] = {{{', '.join(b_ptrs)}}};",
        f"    const int64_t ldbs[{count}] = {{{', '.join(o['ldb'] for o in operands)}}};",
        f"    const int32_t tbs[{count}] = {{{', '.join(str(o['tb']) for o in operands)}}};",
        f"    const int64_t ns[{count}] = {{{', '.join(f'n_{i}' for i in range(count))}}};",
        f"    float* const cs[{count}] = {{{', '.join(c_ptrs)}}};",
        f"    const int64_t ldcs[{count}] = {{{', '.join(f'n_{i}' for i in range(count))}}};",
    ]
    epi, fn, closure = _optional_epilogue(epilogue, buffer_ptr)
    lines += epi
    lines += [
        "    if (outer > 0 && m > 0) {",
        f"      ral->sgemm_shared_a(ral, {count}, m, kk, {a_ptr}, {g['lda']}, bs, ldbs, tbs, "
        "ns, cs, ldcs,",
        f"                          {fn}, {closure});",
        "    }",
        "  }",
    ]
    return lines


def _chain_closure(chain: KernelEmitter, buffer_ptr: dict[str, str], epilogue_fn: str,
                   epilogue_closure: str, scratch_of: KernelEmitter | None = None,
                   c_name: str = "", masked_by: int | None = None
                   ) -> tuple[list[str], str, str]:
    """Host lines of the closure that runs the epilogue on a block of C and then the
    chained GEMM (``chain``, reading the epilogue's result as A) on the block's rows,
    and the function and closure arguments of ``sgemm_epilogue``. With ``scratch_of``
    (the epilogue, C named ``c_name``, in per-block scratch) the closure's ``block``
    runs both on a block where ``sgemm_scratch_c`` computed it; with ``masked_by`` (the
    epilogue's mask input) its ``cols`` counts the columns a block needs."""
    k = chain.k
    lhs, rhs = (chain.buf(a) for a in k.inputs)
    (_, out_name), = k.outputs
    g = gemm_operands(chain)
    sa, sb, sc = g["sa"], g["sb"], g["sc"]
    assert g["ta"] == 0, f"{k.name}: a chained GEMM reads its A rows as they are stored"
    return [
        f"    // {k.name} ({comment(k.ops[0].tf_node)}): C2 = A2 * op(B2) on the rows of A2 that",
        "    // each block's epilogue just wrote, on the thread that wrote them",
        "    struct Chain {",
        "      disc_ral* ral;",
        "      disc_gemm_epilogue_fn epilogue;",
        "      void* closure;",
        "      int64_t inner, n, kk;",
        "      const float* a;",
        "      int64_t lda, sa_outer, sa_inner;",
        "      const float* b;",
        "      int64_t ldb, sb_outer, sb_inner;",
        "      int tb;",
        "      float* c;",
        "      int64_t ldc, sc_outer, sc_inner;",
        "      // Rows [i0, i1) of product q of C2, from `depth` columns of A2's rows at",
        "      // a_rows (row stride lda_rows).",
        "      void rows_of(const float* a_rows, int64_t lda_rows, int64_t q, int64_t i0, "
        "int64_t i1,",
        "                   int64_t depth) const {",
        "        const int64_t qo = q / inner, qi = q % inner;  // the same product of C",
        "        ral->sgemm_rows(ral, i1 - i0, n, depth, a_rows, lda_rows, 0,",
        "                        b + qo * sb_outer + qi * sb_inner, ldb, tb,",
        "                        c + qo * sc_outer + qi * sc_inner + i0 * ldc, ldc, 0);",
        "      }",
        "      // ... with A2 in memory.",
        "      void rows(int64_t q, int64_t i0, int64_t i1, int64_t depth) const {",
        "        const int64_t qo = q / inner, qi = q % inner;",
        "        rows_of(a + qo * sa_outer + qi * sa_inner + i0 * lda, lda, q, i0, i1, depth);",
        "      }",
        "      static void run(void* p, int64_t q, int64_t i0, int64_t i1, int64_t j0, "
        "int64_t j1) {",
        "        const Chain& h = *static_cast<const Chain*>(p);",
        "        h.epilogue(h.closure, q, i0, i1, j0, j1);",
        "        h.rows(q, i0, i1, h.kk);",
        "      }",
        *(scratch_block(scratch_of, c_name, "Chain",
                        chain.plan.memory(lhs.name) == chain.plan.memory(c_name))
          if scratch_of is not None else []),
        *(_mask_cols(scratch_of, masked_by)
          if scratch_of is not None and masked_by is not None else []),
        "    };",
        "    Chain chain{};",
        "    {",
        *("  " + line for line in g["lines"]),
        f"      chain = Chain{{ral, {epilogue_fn}, {epilogue_closure}, inner, n, kk,",
        f"                    {buffer_ptr[lhs.name]}, {g['lda']}, {sa[0]}, {sa[1]},",
        f"                    {buffer_ptr[rhs.name]}, {g['ldb']}, {sb[0]}, {sb[1]}, {g['tb']},",
        f"                    {buffer_ptr[out_name]}, {g['ldc']}, {sc[0]}, {sc[1]}}};",
        "    }",
    ], "&Chain::run", "&chain"


def scratch_block(epilogue: KernelEmitter, c_name: str, holder: str = "Chain",
                  a2_in_scratch: bool = True, in_scratch: bool = True) -> list[str]:
    """``<holder>::block``: the epilogue, and with ``Chain`` the chained GEMM, on rows
    [i0, i1) of product q of C where they lie, in scratch (row stride n): the
    epilogue's args copied with its read of C and its results written in C's place
    (if any) based so that element (q, i, j) of the dense C is cb[(i - i0) * n + j].
    The chained GEMM reads its A there (``a2_in_scratch``: the epilogue's result in
    C's place, attention's P) or in memory (the result in a residual's place)."""
    plan, e = epilogue.plan, epilogue.k
    memory = plan.memory(c_name)
    fields = [f"in{i}" for i, a in enumerate(e.inputs) if plan.memory(a.buffer) == memory]
    fields += [f"out{j}" for j, (_, b) in enumerate(e.outputs) if plan.memory(b) == memory]
    where = (["in scratch (cb, row stride n: C never", "exists whole)"] if in_scratch
             else ["where they lie (cb, row stride n: C in", "memory)"])
    return [
        f"      // Rows [i0, i1) of product q of C {where[0]}",
        f"      // {where[1]}: {e.name} on them there, its C and its results based at",
        "      // the block" + ((", then the chained GEMM reading its A " +
                              ("there." if a2_in_scratch else "in memory."))
                             if holder == "Chain" else "."),
        "      static void block(void* p, int64_t q, int64_t i0, int64_t i1, float* cb, "
        "int64_t ldcb) {",
        f"        const {holder}& h = *static_cast<const {holder}*>(p);",
        f"        const auto& e = *static_cast<const {epilogue.epilogue_struct}*>(h.closure);",
        f"        {epilogue.args} k2 = *e.args;",
        "        const uintptr_t before = static_cast<uintptr_t>((q * e.m + i0) * ldcb) * "
        "sizeof(float);",
        "        float* const base = reinterpret_cast<float*>(reinterpret_cast<uintptr_t>(cb) - "
        "before);",
        *(f"        k2.{f} = base;" for f in fields),
        f"        const {epilogue.epilogue_struct} e2{{&k2, e.m, e.t}};",
        "        h.epilogue(const_cast<void*>(static_cast<const void*>(&e2)), q, i0, i1, 0, "
        "ldcb);",
        *((_nonzero_depth() + ["        h.rows_of(cb, ldcb, q, i0, i1, depth);"]
           if a2_in_scratch else ["        h.rows(q, i0, i1, h.kk);"])
          if holder == "Chain" else []),
        "      }",
    ]


def _nonzero_depth() -> list[str]:
    """Lines setting ``depth``: one past the last column of the block's rows of A2 (in
    scratch at cb) holding a value other than zero. Columns past it add nothing to the
    chained product (a mask's zeros in P: a causal mask's upper triangle, a padding
    mask's tail), so its depth stops there."""
    return [
        "        // P's columns past the last nonzero on these rows add nothing to P V",
        "        int64_t depth = 0;",
        "        for (int64_t i = 0; i < i1 - i0 && depth < h.kk; ++i) {",
        "          const float* row = cb + i * ldcb;",
        "          for (int64_t j = h.kk; j > depth; --j) {",
        "            if (row[j - 1] != 0.0f) {",
        "              depth = j;",
        "              break;",
        "            }",
        "          }",
        "        }",
    ]


def _mask_cols(epilogue: KernelEmitter, mask: int) -> list[str]:
    """``Chain::cols`` (``disc_gemm_cols_fn``): the columns of C that rows [i0, i1) of
    product q need, up to the last true element of the epilogue's input ``mask`` on
    them, walked by the epilogue's own dims and strides (C's dims: products, rows,
    columns)."""
    e = epilogue.k
    r = len(e.dims)
    return [
        f"      // Columns of C rows [i0, i1) of product q need: to the last true in{mask} of",
        f"      // {e.name} ({comment(str(e.inputs[mask]))}) on them; past it its select takes",
        "      // the other arm, whatever C holds.",
        "      static int64_t cols(void* p, int64_t q, int64_t i0, int64_t i1) {",
        "        const Chain& h = *static_cast<const Chain*>(p);",
        f"        const auto& a = *static_cast<const {epilogue.epilogue_struct}*>(h.closure)->args;",
        "        int64_t base = 0, rest = q;",
        f"        for (int d = {r - 3}; d >= 0; --d) {{",
        f"          base += rest % a.dims[d] * a.in{mask}_strides[d];",
        "          rest /= a.dims[d];",
        "        }",
        f"        const int64_t n = a.dims[{r - 1}], row_stride = a.in{mask}_strides[{r - 2}];",
        f"        const int64_t col_stride = a.in{mask}_strides[{r - 1}];",
        "        int64_t need = 0;",
        "        for (int64_t i = i0; i < i1 && need < n; ++i) {",
        f"          const bool* row = a.in{mask} + base + i * row_stride;",
        "          for (int64_t j = n; j > need; --j) {",
        "            if (row[(j - 1) * col_stride]) {",
        "              need = j;",
        "              break;",
        "            }",
        "          }",
        "        }",
        "        return need;",
        "      }",
    ]
