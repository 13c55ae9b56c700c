"""Host-runner lines of library kernels: GEMMs through the RAL over operands as
stored, transposed ones read in place (``sgemm_strided``); with a fused consumer
run on each block of C (``sgemm_epilogue``, see ``fusion/epilogue.py``), and a
GEMM chained on its rows (``sgemm_rows``); several reading one A as one launch
(``sgemm_shared_a``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from disc_tf.codegen.cpu_text import comment, product, strided_gemm_exprs, sym
from disc_tf.fusion.plan import Buffer, gemm_form

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
    if op.op == "conv_taps":
        return conv_taps_launch(em, buffer_ptr, epilogue)
    if epilogue is not None:
        return epilogue_launch(em, buffer_ptr, epilogue, chain)
    lhs, rhs = (em.buf(a) for a in k.inputs)
    g = _gemm_operands(em)
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
        f"                         {buffer_ptr[out_name]}, n, {sc[0]}, {sc[1]});",
        "    }",
        "  }",
    ]


def _epilogue_closure(epilogue: KernelEmitter, buffer_ptr: dict[str, str], rows: str,
                      cols: str) -> tuple[list[str], str, str]:
    """Host lines building ``epilogue``'s args and the closure ``epi`` a GEMM hands it
    (``rows`` rows of C per product, ``cols`` columns), and the function and closure
    arguments of ``sgemm_epilogue``."""
    struct = epilogue.epilogue_struct
    lines = epilogue.launch_args(buffer_ptr) + [
        f"    const int64_t inner_rows = k.dims[{epilogue.rank - 1}];  // the epilogue's row length",
        f"    const {struct} epi{{&k, {rows}, inner_rows > 0 ? {cols} / inner_rows : 1}};"]
    return lines, f"{epilogue.fn}_epilogue", f"const_cast<{struct}*>(&epi)"


def _gemm_operands(em: KernelEmitter) -> dict:
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
        return {**g, "ta": int(f["transpose_a"]), "tb": int(f["transpose_b"]),
                "sc": ["inner * m * n", "m * n"]}
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
            "ta": int(form.transpose_a), "tb": int(form.transpose_b), "sc": ["m * n", "0"]}


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
    g = _gemm_operands(em)
    lines = [title, *g["lines"]]
    epi, fn, closure = _epilogue_closure(epilogue, buffer_ptr, "m", "n")
    lines += epi
    if chain is not None:
        chain_lines, fn, closure = _chain_closure(chain, buffer_ptr, fn, closure)
        lines += chain_lines
    sa, sb, sc = g["sa"], g["sb"], g["sc"]
    lines += [
        "    if (outer > 0 && inner > 0 && m > 0 && n > 0) {",
        f"      ral->sgemm_epilogue(ral, outer, inner, m, n, kk, {buffer_ptr[lhs.name]}, "
        f"{g['lda']}, {sa[0]}, {sa[1]}, {g['ta']},",
        f"                          {buffer_ptr[rhs.name]}, {g['ldb']}, {sb[0]}, {sb[1]}, "
        f"{g['tb']},",
        f"                          {buffer_ptr[out_name]}, n, {sc[0]}, {sc[1]},",
        f"                          {fn}, {closure}, {int(k.epilogue_full_rows)}, 0);",
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
    operands = [_gemm_operands(m) for m in members]
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
    fn, closure = "nullptr", "nullptr"
    if epilogue is not None:
        epi, fn, closure = _epilogue_closure(epilogue, buffer_ptr, "m", "n")
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
                   epilogue_closure: str) -> tuple[list[str], str, str]:
    """Host lines of the closure that runs the epilogue on a block of C and then the
    chained GEMM (``chain``, reading the epilogue's result as A) on the block's rows,
    and the function and closure arguments of ``sgemm_epilogue``."""
    k = chain.k
    lhs, rhs = (chain.buf(a) for a in k.inputs)
    (_, out_name), = k.outputs
    g = _gemm_operands(chain)
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
        "      int64_t sc_outer, sc_inner;",
        "      // Rows [i0, i1) of product q of C2, from `depth` columns of A2.",
        "      void rows(int64_t q, int64_t i0, int64_t i1, int64_t depth) const {",
        "        const int64_t qo = q / inner, qi = q % inner;  // the same product of C",
        "        ral->sgemm_rows(ral, i1 - i0, n, depth,",
        "                        a + qo * sa_outer + qi * sa_inner + i0 * lda, lda, 0,",
        "                        b + qo * sb_outer + qi * sb_inner, ldb, tb,",
        "                        c + qo * sc_outer + qi * sc_inner + i0 * n, n, 0);",
        "      }",
        "      static void run(void* p, int64_t q, int64_t i0, int64_t i1, int64_t j0, "
        "int64_t j1) {",
        "        const Chain& h = *static_cast<const Chain*>(p);",
        "        h.epilogue(h.closure, q, i0, i1, j0, j1);",
        "        h.rows(q, i0, i1, h.kk);",
        "      }",
        "    };",
        "    Chain chain{};",
        "    {",
        *("  " + line for line in g["lines"]),
        f"      chain = Chain{{ral, {epilogue_fn}, {epilogue_closure}, inner, n, kk,",
        f"                    {buffer_ptr[lhs.name]}, {g['lda']}, {sa[0]}, {sa[1]},",
        f"                    {buffer_ptr[rhs.name]}, {g['ldb']}, {sb[0]}, {sb[1]}, {g['tb']},",
        f"                    {buffer_ptr[out_name]}, {sc[0]}, {sc[1]}}};",
        "    }",
    ], "&Chain::run", "&chain"


def conv_taps_launch(em: KernelEmitter, buffer_ptr: dict[str, str],
                     epilogue: KernelEmitter | None = None) -> list[str]:
    """A stride-1 Conv1D (NHWC with H = 1): without dilation one GEMM over the
    input's overlapping windows (``conv_windows_launch``, with the fused
    ``epilogue`` if any), else one per tap."""
    if em.k.ops[0].attrs["dilation"] == 1:
        return conv_windows_launch(em, buffer_ptr, epilogue)
    if epilogue is not None:
        raise ValueError(f"{em.k.name}: a dilated Conv1D takes no epilogue")
    return conv_per_tap_launch(em, buffer_ptr)


def _conv_dims(em: KernelEmitter) -> tuple[Buffer, Buffer, str, dict, list[str]]:
    """A conv_taps kernel's input, filter, output name and attrs, and the host lines
    naming its sizes (batch, width, ci, co, ow, pad)."""
    plan, k = em.plan, em.k
    (op,) = k.ops
    x, w = (em.buf(a) for a in k.inputs)
    (_, out_name), = k.outputs
    out = plan.buffers[out_name]
    a = op.attrs
    return x, w, out_name, a, [
        f"    const int64_t batch = {sym(x.dims[0], plan)}, width = {sym(x.dims[2], plan)};",
        f"    const int64_t ci = {sym(x.dims[3], plan)}, co = {sym(w.dims[3], plan)};",
        f"    const int64_t ow = {sym(out.dims[2], plan)}, pad = {sym(a['pad_left'], plan)};",
    ]


def conv_windows_launch(em: KernelEmitter, buffer_ptr: dict[str, str],
                        epilogue: KernelEmitter | None = None) -> list[str]:
    """A stride-1, undilated Conv1D as one GEMM with k = kw * ci: the window of
    output column c is the kw * ci floats of the (padded) input from column c, so
    the windows of consecutive outputs overlap, ci floats apart (lda = ci), and A
    is the input itself, read in place. With padding, A is a copy of x with the
    zero columns around it (ow + kw - 1 columns, a kw-th of the windows' size).
    One GEMM of the whole depth reads B once and writes each block of C once,
    where one GEMM per tap adds into all of C kw times, so a consumer can run on
    each finished block of C (``epilogue``)."""
    k, op = em.k, em.k.ops[0]
    x, w, out_name, a, dims = _conv_dims(em)
    xp, wp, cp = buffer_ptr[x.name], buffer_ptr[w.name], buffer_ptr[out_name]
    title = (f"  {{  // {k.name}: {comment(op.tf_node)} as one GEMM over overlapping windows"
             " of the input (no im2col buffer)")
    fn, closure, full_rows, epi = "nullptr", "nullptr", 0, []
    if epilogue is not None:
        title += (f", {epilogue.k.name} ({comment(', '.join(epilogue.k.tf_ops))}) on each "
                  "block")
        epi, fn, closure = _epilogue_closure(epilogue, buffer_ptr, "ow", "co")
        full_rows = int(k.epilogue_full_rows)
    return [
        title,
        *dims,
        f"    const int64_t kw = {a['kw']}, kdim = kw * ci;",
        "    const int64_t cols = ow + kw - 1;  // input columns the windows span",
        *epi,
        "    if (batch > 0 && ow > 0 && co > 0) {",
        f"      const float* windows = {xp};",
        "      int64_t stride = width * ci;  // between batch elements",
        "      float* padded = nullptr;",
        "      if (pad != 0 || cols > width) {  // windows reach into the padding: copy x padded",
        "        padded = static_cast<float*>(ral->alloc_temp(ral, batch * cols * ci * sizeof(float)));",
        "        if (!padded && ci != 0) return 1;",
        "        for (int64_t n = 0; n < batch; ++n) {",
        "          for (int64_t q = 0; q < cols; ++q) {",
        "            const int64_t col = q - pad;",
        "            float* dst = padded + (n * cols + q) * ci;",
        "            if (col < 0 || col >= width) {",
        "              __builtin_memset(dst, 0, ci * sizeof(float));",
        "            } else {",
        f"              __builtin_memcpy(dst, {xp} + (n * width + col) * ci, ci * sizeof(float));",
        "            }",
        "          }",
        "        }",
        "        windows = padded;",
        "        stride = cols * ci;",
        "      }",
        f"      ral->sgemm_epilogue(ral, batch, 1, ow, co, kdim, windows, ci, stride, 0, 0, {wp},",
        f"                          co, 0, 0, 0, {cp}, co, ow * co, 0, {fn}, {closure}, "
        f"{full_rows}, 0);",
        "      if (padded) ral->free_temp(ral, padded);",
        "    }",
        "  }",
    ]


def conv_per_tap_launch(em: KernelEmitter, buffer_ptr: dict[str, str]) -> list[str]:
    """A stride-1 dilated Conv1D (NHWC with H = 1) as one GEMM per filter tap j: output
    columns whose input column ``ow + j * dilation - pad_left`` exists get
    x[n, 0, that column, :] @ w[0, j], added to the result (the first tap writes,
    and zeroes the columns it does not reach)."""
    k, op = em.k, em.k.ops[0]
    x, w, out_name, a, dims = _conv_dims(em)
    c_ptr = buffer_ptr[out_name]
    return [
        f"  {{  // {k.name}: {comment(op.tf_node)} as {a['kw']} GEMMs, one per filter tap"
        " (no im2col buffer)",
        *dims,
        f"    for (int64_t j = 0; j < {a['kw']}; ++j) {{",
        f"      const int64_t shift = j * {a['dilation']} - pad;  // input column of output 0",
        "      const int64_t lo = shift < 0 ? -shift : 0;",
        "      const int64_t hi = width - shift < ow ? width - shift : ow;",
        "      if (j == 0) {  // the columns the first tap does not write start at zero",
        "        for (int64_t n = 0; n < batch; ++n) {",
        "          for (int64_t c = 0; c < ow; ++c) {",
        "            if (c >= lo && c < hi) continue;",
        f"            for (int64_t o = 0; o < co; ++o) {c_ptr}[(n * ow + c) * co + o] = 0.0f;",
        "          }",
        "        }",
        "      }",
        "      if (hi > lo && batch > 0 && co > 0) {",
        f"        ral->sgemm_epilogue(ral, batch, 1, hi - lo, co, ci,"
        f" {buffer_ptr[x.name]} + (lo + shift) * ci, ci, width * ci, 0, 0,",
        f"                            {buffer_ptr[w.name]} + j * ci * co, co, 0, 0, 0,",
        f"                            {c_ptr} + lo * co, co, ow * co, 0, nullptr, nullptr, 0,"
        " j > 0);",
        "      }",
        "    }",
        "  }",
    ]
