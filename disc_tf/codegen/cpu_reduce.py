"""CPU reduce kernels: reductions over leading, middle or all dims (one output
element per task), with their producers evaluated in place (input fusion).

Accuracy is the first concern here: a sum of 10^8 floats folded left to right
into one float accumulator stops growing once the partial sum is large (2^24
ones sum to 2^24, and any more add nothing). Each task therefore folds its
elements in *blocks* of ``DISC_REDUCE_BLOCK`` into eight lane accumulators,
combines the lanes as a tree, and combines the blocks pairwise
(``disc_cascade``, a binary counter of partial sums): an element passes through
at most ``BLOCK / 8 + 3 + log2(blocks)`` roundings, as in Eigen's (TF's) tree
reduction. Few outputs over many elements are cut into *parts* (one task each,
``disc_reduce_parts``, chosen from the sizes only so results never depend on
the thread count); the host combines each output's parts pairwise too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from disc_tf.codegen.cpu_ops import COMPUTE, STORAGE, expression, literal
from disc_tf.codegen.cpu_text import accumulator_elem, comment, product, rounds_once
from disc_tf.ops.elementwise import arg_reduce_start

if TYPE_CHECKING:
    from disc_tf.codegen.cpu_kernels import KernelEmitter


def combiner_lambda(combiner: str, elem: str, ctype: str | None = None) -> str:
    """A C++ lambda folding two accumulator values of type ``elem`` (held in C++
    type ``ctype``, by default its compute type) with ``combiner``."""
    ct = ctype or COMPUTE[elem]
    body = expression(combiner, ["x", "y"], elem, [elem, elem], {})
    return f"[]({ct} x, {ct} y) {{ return {body}; }}"


def _kept_bases(em: KernelEmitter, kept: list[int], n_in: int) -> list[str]:
    """Lines computing ``base{i}``: input i's offset of output element ``o``."""
    lines = ["    int64_t rem = o;"] if kept else []
    lines += [f"    int64_t base{i} = 0;" for i in range(n_in)]
    for d in reversed(kept):
        lines.append(f"    {{ const int64_t idx = rem % a.dims[{d}]; rem /= a.dims[{d}];")
        lines += [f"      base{i} += idx * a.in{i}_strides[{d}];" for i in range(n_in)]
        lines.append("    }")
    return lines


def _element(em: KernelEmitter, index: str, indent: str) -> list[str]:
    """Lines loading every input at ``off{i} + index * step`` and evaluating the
    producers; the folded value is the reduce op's operand."""
    k = em.k
    names = {o.value: f"v{i}" for i, o in enumerate(k.ops)}
    lines = []
    for i, acc in enumerate(k.inputs):
        ct = COMPUTE[em.buf(acc).elem]
        lines.append(f"{indent}const {ct} x{i} = ({ct})a.in{i}[off{i} + ({index}) * {{st{i}}}];")
    for o in k.ops[:-1]:
        args = [em.ref(kd, rf, e, names, "x") for (kd, rf), e in zip(o.operands, o.operand_elems)]
        lines.append(f"{indent}const {COMPUTE[o.elem]} {names[o.value]} = "
                     f"{expression(o.op, args, o.elem, o.operand_elems, o.attrs)};"
                     f"  // {comment(o.tf_node)}: {o.op}")
    return lines


def fold_reduce(em: KernelEmitter, kept: list[int]) -> str:
    """The reduce kernel: task ``t`` folds part ``t % parts`` of output ``t / parts``.

    The reduced elements are visited as runs along the innermost reduced dim
    (one division per reduced dim per run, not per element); inside a run,
    groups of eight go to eight lanes (contiguous loads when every input's
    stride along the run is 1), and every ``DISC_REDUCE_BLOCK`` elements the
    lanes are combined and pushed into the task's pairwise cascade.
    """
    k = em.k
    op = k.ops[-1]
    n_in = len(k.inputs)
    acc_elem = accumulator_elem(op.elem, op.attrs["combiner"])
    at = COMPUTE[acc_elem]
    init = literal(op.attrs["init"], acc_elem)
    names = {o.value: f"v{i}" for i, o in enumerate(k.ops)}
    value = em.ref(*op.operands[0], op.elem, names, "x")
    inner = k.reduce_dims[-1]
    outer = k.reduce_dims[:-1]
    what = (f"{comment(', '.join(k.tf_ops))}, producers evaluated in place" if len(k.ops) > 1
            else comment(op.tf_node))
    lines = [
        f"// {what}: reduce dims {k.reduce_dims} by {op.attrs['combiner']}; runs along dim"
        f" {inner}, eight lanes, blocks of DISC_REDUCE_BLOCK combined pairwise.",
        f"DISC_CLONES DISC_ENTRY void {em.fn}_reduce(void* p, int64_t begin, int64_t end) {{",
        f"  const {em.args}& a = *static_cast<const {em.args}*>(p);",
        f"  const auto comb = {combiner_lambda(op.attrs['combiner'], acc_elem)};",
        f"  const int64_t run = a.dims[{inner}];  // the innermost reduced dim",
        *[f"  const int64_t st{i} = a.in{i}_strides[{inner}];" for i in range(n_in)],
        "  const bool contiguous = " + " && ".join(f"st{i} == 1" for i in range(n_in)) + ";",
        "  for (int64_t t = begin; t < end; ++t) {",
        "    const int64_t o = t / a.parts, part = t % a.parts;",
        *_kept_bases(em, kept, n_in),
        "    // this part's elements [q, q_end) of the output's a.reduced, balanced",
        "    const int64_t share = a.reduced / a.parts, extra = a.reduced % a.parts;",
        "    int64_t q = share * part + (part < extra ? part : extra);",
        "    const int64_t q_end = q + share + (part < extra ? 1 : 0);",
        f"    disc_cascade<{at}> blocks;",
        f"    {at} lane[8];",
        f"    for (int l = 0; l < 8; ++l) lane[l] = {init};",
        "    int64_t filled = 0;  // elements in the current block",
        "    while (q < q_end) {",
        "      int64_t rq = q / run;",
        "      const int64_t j = q - rq * run;",
        *[f"      int64_t off{i} = base{i} + j * st{i};" for i in range(n_in)],
    ]
    for d in reversed(outer):
        lines.append(f"      {{ const int64_t idx = rq % a.dims[{d}]; rq /= a.dims[{d}];")
        lines += [f"        off{i} += idx * a.in{i}_strides[{d}];" for i in range(n_in)]
        lines.append("      }")
    lines += [
        "      int64_t n = run - j < q_end - q ? run - j : q_end - q;",
        "      q += n;",
        "      while (n > 0) {",
        "        const int64_t take = DISC_REDUCE_BLOCK - filled < n ? DISC_REDUCE_BLOCK - filled : n;",
        "        int64_t i = 0;",
    ]

    def lanes(stride: bool) -> list[str]:
        body = _element(em, "i + l", "              ")
        body = [_strided(x, stride, n_in) for x in body]
        return ["            #pragma omp simd",
                "            for (int l = 0; l < 8; ++l) {",
                *body,
                f"              lane[l] = comb(lane[l], {value});",
                "            }"]

    lines += [
        "        if (contiguous) {",
        "          for (; i + 8 <= take; i += 8) {",
        *lanes(stride=False),
        "          }",
        "        } else {",
        "          for (; i + 8 <= take; i += 8) {",
        *lanes(stride=True),
        "          }",
        "        }",
        "        for (; i < take; ++i) {",
        *[_strided(x, True, n_in) for x in _element(em, "i", "          ")],
        f"          lane[i & 7] = comb(lane[i & 7], {value});",
        "        }",
        *[f"        off{i} += take * st{i};" for i in range(n_in)],
        "        n -= take;",
        "        filled += take;",
        "        if (filled == DISC_REDUCE_BLOCK) {  // a full block: into the cascade",
        "          blocks.push(disc_tree8(lane, comb), comb);",
        f"          for (int l = 0; l < 8; ++l) lane[l] = {init};",
        "          filled = 0;",
        "        }",
        "      }",
        "    }",
        "    blocks.push(disc_tree8(lane, comb), comb);",
        f"    {at} acc = blocks.total({init}, comb);",
        "    if (a.parts > 1) {",
        "      a.partials[t] = acc;",
        "    } else {",
    ]
    if rounds_once(op.elem):
        lines.append(f"      acc = disc_round_{op.elem}((float)acc);  // accumulated in float, rounded once")
    (_, out_name), = k.outputs
    lines += [
        f"      a.out0[o] = ({STORAGE[em.plan.buffers[out_name].elem]})acc;",
        "    }",
        "  }",
        "}",
        "",
        "// The parts of each output, combined pairwise (the host runs this once a call).",
        f"DISC_ENTRY void {em.fn}_combine(const {em.args}& a, int64_t outputs) {{",
        f"  const auto comb = {combiner_lambda(op.attrs['combiner'], acc_elem)};",
        "  for (int64_t o = 0; o < outputs; ++o) {",
        f"    disc_cascade<{at}> parts;",
        "    for (int64_t part = 0; part < a.parts; ++part)",
        "      parts.push(a.partials[o * a.parts + part], comb);",
        f"    {at} acc = parts.total({init}, comb);",
    ]
    if rounds_once(op.elem):
        lines.append(f"    acc = disc_round_{op.elem}((float)acc);")
    lines += [
        f"    a.out0[o] = ({STORAGE[em.plan.buffers[out_name].elem]})acc;",
        "  }",
        "}",
    ]
    return "\n".join(lines)


def _strided(line: str, stride: bool, n_in: int) -> str:
    """``line`` with each input's run stride placeholder filled: ``st{i}``, or 1."""
    for i in range(n_in):
        line = line.replace(f"{{st{i}}}", f"st{i}" if stride else "1")
    return line


def arg_reduce(em: KernelEmitter, kept: list[int]) -> str:
    """ArgMax/ArgMin over one dim: the position of the first extreme value, by TF's
    rule (from the type's lowest value at position 0: NaNs never count)."""
    k = em.k
    (op,) = k.ops
    (axis,) = k.reduce_dims
    in_elem = em.buf(k.inputs[0]).elem
    vt = COMPUTE[in_elem]
    out = STORAGE[em.plan.buffers[k.outputs[0][1]].elem]
    better = ">" if op.attrs["direction"] == "max" else "<"
    start = arg_reduce_start(in_elem, op.attrs["direction"])
    return "\n".join([
        f"// {comment(op.tf_node)}: arg{op.attrs['direction']} along dim {axis}",
        f"DISC_CLONES DISC_ENTRY void {em.fn}_reduce(void* p, int64_t begin, int64_t end) {{",
        f"  const {em.args}& a = *static_cast<const {em.args}*>(p);",
        "  for (int64_t o = begin; o < end; ++o) {",
        *_kept_bases(em, kept, 1),
        f"    {vt} best = {start};",
        "    int64_t at = 0;",
        "    for (int64_t q = 0; q < a.reduced; ++q) {",
        f"      const {vt} v = ({vt})a.in0[base0 + q * a.in0_strides[{axis}]];",
        f"      if (v {better} best) {{ best = v; at = q; }}",
        "    }",
        f"    a.out0[o] = ({out})at;",
        "  }",
        "}",
    ])


#: Columns one task of a column reduction folds (consecutive outputs).
COLUMN_BLOCK = 32


def has_columns(em: KernelEmitter) -> bool:
    """True if the kernel keeps its innermost dim (a column reduction): it then has a
    version folding blocks of consecutive outputs, picked when every input is
    contiguous along that dim."""
    return em.rank - 1 not in em.k.reduce_dims and em.k.ops[-1].op != "arg_reduce"


def column_reduce(em: KernelEmitter, kept: list[int]) -> str:
    """Task ``t``: part ``t % parts`` of the outputs [c0, c0 + 64) of one row of
    outputs (the innermost kept dim, contiguous in every input). The reduced
    elements are visited in order, each a contiguous run of the block's columns
    loaded as vectors; each column folds DISC_REDUCE_BLOCK elements at a time into
    its own pairwise cascade."""
    k = em.k
    op = k.ops[-1]
    n_in, r = len(k.inputs), em.rank
    acc_elem = accumulator_elem(op.elem, op.attrs["combiner"])
    at = COMPUTE[acc_elem]
    init = literal(op.attrs["init"], acc_elem)
    names = {o.value: f"v{i}" for i, o in enumerate(k.ops)}
    value = em.ref(*op.operands[0], op.elem, names, "x")
    outer = [d for d in kept if d != r - 1]
    (_, out_name), = k.outputs
    store = STORAGE[em.plan.buffers[out_name].elem]
    result = f"disc_round_{op.elem}((float)acc)" if rounds_once(op.elem) else "acc"
    lines = [
        f"// {comment(', '.join(k.tf_ops))}: reduce dims {k.reduce_dims} by "
        f"{op.attrs['combiner']}, {COLUMN_BLOCK} contiguous columns a task.",
        f"DISC_CLONES DISC_ENTRY void {em.fn}_columns(void* p, int64_t begin, int64_t end) {{",
        f"  const {em.args}& a = *static_cast<const {em.args}*>(p);",
        f"  const auto comb = {combiner_lambda(op.attrs['combiner'], acc_elem)};",
        f"  const int64_t cols = a.dims[{r - 1}];",
        f"  const int64_t blocks = (cols + {COLUMN_BLOCK - 1}) / {COLUMN_BLOCK};",
        "  for (int64_t t = begin; t < end; ++t) {",
        "    const int64_t part = t % a.parts, unit = t / a.parts;",
        f"    const int64_t c0 = unit % blocks * {COLUMN_BLOCK}, row = unit / blocks;",
        f"    const int64_t width = cols - c0 < {COLUMN_BLOCK} ? cols - c0 : {COLUMN_BLOCK};",
        *(["    int64_t rem = row;"] if outer else []),
        *[f"    int64_t base{i} = c0;" for i in range(n_in)],
    ]
    for d in reversed(outer):
        lines.append(f"    {{ const int64_t idx = rem % a.dims[{d}]; rem /= a.dims[{d}];")
        lines += [f"      base{i} += idx * a.in{i}_strides[{d}];" for i in range(n_in)]
        lines.append("    }")
    lines += [
        "    const int64_t share = a.reduced / a.parts, extra = a.reduced % a.parts;",
        "    const int64_t q0 = share * part + (part < extra ? part : extra);",
        "    const int64_t q_end = q0 + share + (part < extra ? 1 : 0);",
        f"    disc_cascade<{at}> blocks_of[{COLUMN_BLOCK}];",
        f"    {at} lane[{COLUMN_BLOCK}];",
        f"    for (int c = 0; c < {COLUMN_BLOCK}; ++c) lane[c] = {init};",
        "    int64_t filled = 0;",
        "    // the reduced coordinates of q0; later elements step through them in order",
        "    int64_t rq = q0;",
        *[f"    int64_t off{i} = base{i};" for i in range(n_in)],
    ]
    # An empty reduction (a zero reduced dim) has no coordinates to find: its
    # outputs are the init value, and dividing by the zero dim would trap.
    lines.append("    " + " ".join(f"int64_t i{d} = 0;" for d in reversed(k.reduce_dims)))
    lines.append("    if (q0 < q_end) {")
    for d in reversed(k.reduce_dims):
        lines.append(f"      i{d} = rq % a.dims[{d}]; rq /= a.dims[{d}];")
        lines += [f"      off{i} += i{d} * a.in{i}_strides[{d}];" for i in range(n_in)]
    lines.append("    }")
    lines.append("    for (int64_t q = q0; q < q_end; ++q) {")
    body = [_strided(x, False, n_in) for x in _element(em, "c", "        ")]
    for bound in (str(COLUMN_BLOCK), "width"):
        lines += [
            f"      {'if' if bound != 'width' else '} else'} (width == {COLUMN_BLOCK}) {{"
            if bound != "width" else "      } else {",
            "        #pragma omp simd",
            f"        for (int64_t c = 0; c < {bound}; ++c) {{",
            *["  " + x for x in body],
            f"          lane[c] = comb(lane[c], {value});",
            "        }",
        ]
    lines.append("      }")
    lines.append("      do {  // the next reduced element: innermost coordinate first")
    for d in reversed(k.reduce_dims):
        lines.append(f"        if (++i{d} < a.dims[{d}]) {{ "
                     + " ".join(f"off{i} += a.in{i}_strides[{d}];" for i in range(n_in)) + " break; }")
        lines.append(f"        i{d} = 0; "
                     + " ".join(f"off{i} -= (a.dims[{d}] - 1) * a.in{i}_strides[{d}];"
                                for i in range(n_in)))
    lines.append("      } while (false);")
    lines += [
        "      if (++filled == DISC_REDUCE_BLOCK) {  // full blocks: into the cascades",
        "        for (int64_t c = 0; c < width; ++c) {",
        "          blocks_of[c].push(lane[c], comb);",
        f"          lane[c] = {init};",
        "        }",
        "        filled = 0;",
        "      }",
        "    }",
        "    for (int64_t c = 0; c < width; ++c) {",
        "      blocks_of[c].push(lane[c], comb);",
        f"      {at} acc = blocks_of[c].total({init}, comb);",
        "      const int64_t o = row * cols + c0 + c;",
        "      if (a.parts > 1) {",
        "        a.partials[o * a.parts + part] = acc;",
        "      } else {",
        f"        a.out0[o] = ({store})({result});",
        "      }",
        "    }",
        "  }",
        "}",
    ]
    return "\n".join(lines)


def reduce_source(em: KernelEmitter) -> str:
    """The reduce kernel's functions (arg-reductions, or any fold with producers)."""
    kept = [d for d in range(em.rank) if d not in em.k.reduce_dims]
    if em.k.ops[-1].op == "arg_reduce":
        return arg_reduce(em, kept)
    source = fold_reduce(em, kept)
    return source + "\n\n" + column_reduce(em, kept) if has_columns(em) else source


def struct_fields(em: KernelEmitter) -> list[str]:
    """Extra members of a reduce kernel's args."""
    lines = ["  int64_t reduced;  // elements folded into each output"]
    if em.k.ops[-1].op != "arg_reduce":
        op = em.k.ops[-1]
        at = COMPUTE[accumulator_elem(op.elem, op.attrs["combiner"])]
        lines += ["  int64_t parts;  // tasks each output's elements are cut into",
                  f"  {at}* partials;  // [outputs, parts] when parts > 1"]
    return lines


def reduce_launch(em: KernelEmitter, cost: int) -> list[str]:
    """Host-runner lines launching a reduce kernel on filled args ``k`` (closes the scope)."""
    k, plan = em.k, em.plan
    kept = [s for d, s in enumerate(k.dims) if d not in k.reduce_dims]
    reduced = [s for d, s in enumerate(k.dims) if d in k.reduce_dims]
    lines = [f"    k.reduced = {product(reduced, plan)};",
             f"    const int64_t outputs = {product(kept, plan)};"]
    if k.ops[-1].op == "arg_reduce":
        return lines + [
            "    if (outputs > 0) {",
            f"      ral->parallel_for(ral, outputs, {cost}.0 * k.reduced + 1.0, {em.fn}_reduce, &k);",
            "    }", "  }"]
    at = COMPUTE[accumulator_elem(k.ops[-1].elem, k.ops[-1].attrs["combiner"])]
    r = em.rank
    if has_columns(em):  # blocks of contiguous columns, when every input has them
        contiguous = " && ".join(f"k.in{i}_strides[{r - 1}] == 1" for i in range(len(k.inputs)))
        lines += [
            f"    const bool columns = k.dims[{r - 1}] >= 8 && {contiguous};",
            f"    const int64_t units = columns ? outputs / k.dims[{r - 1}] * "
            f"((k.dims[{r - 1}] + {COLUMN_BLOCK - 1}) / {COLUMN_BLOCK}) : outputs;",
            f"    const disc_range_fn fold = columns ? {em.fn}_columns : {em.fn}_reduce;",
            f"    const double unit_cost = {cost}.0 * (columns ? {COLUMN_BLOCK} : 1);",
        ]
    else:
        lines += ["    const int64_t units = outputs;",
                  f"    const disc_range_fn fold = {em.fn}_reduce;",
                  f"    const double unit_cost = {cost}.0;"]
    return lines + [
        "    k.parts = disc_reduce_parts(units, k.reduced);",
        "    if (outputs > 0 && k.parts > 1) {  // few outputs: each cut into parts",
        f"      const int64_t partial_bytes = outputs * k.parts * (int64_t)sizeof({at});",
        f"      k.partials = static_cast<{at}*>(ral->alloc_temp(ral, partial_bytes));",
        "      if (!k.partials) return 1;",
        "      ral->parallel_for(ral, units * k.parts, unit_cost * (k.reduced / k.parts) + 1.0,"
        " fold, &k);",
        f"      {em.fn}_combine(k, outputs);",
        "      ral->free_temp(ral, k.partials);",
        "    } else if (outputs > 0) {",
        "      ral->parallel_for(ral, units, unit_cost * k.reduced + 1.0, fold, &k);",
        "    }",
        "  }",
    ]
