"""C++ text of plan values shared by the CPU (and CUDA) emitters: symbols,
products, comments, host scalars, accumulator types and GEMM stride forms."""

from __future__ import annotations

from disc_tf.fusion.plan import Access, Buffer, FusionPlan, Kernel, KernelOp


def sym(s: int, plan: FusionPlan) -> str:
    """C++ for symbol ``s``: its literal if constant, else its host variable."""
    d = plan.symbols[s]
    return str(d.value) if d.kind == "const" else f"s{s}"


def product(syms: list[int], plan: FusionPlan) -> str:
    """C++ product of symbols ("1" for none)."""
    return " * ".join(sym(s, plan) for s in syms) if syms else "1"


#: Reduction combiners the stitch kernels fold with ``disc_f32x8`` vectors (the
#: lanes keep the order of the scalar fold: lane l takes columns l, l + 8, ...).
VECTOR_COMBINERS = ("add", "multiply", "maximum", "minimum")

#: Combiners whose long folds round at every step (sums, products): they fold in
#: blocks combined pairwise (``disc_cascade``), so the error grows with log(n).
#: Max, min and the logical ones are exact in any order.
CASCADED_COMBINERS = ("add", "multiply")


#: ``disc_cascade<T>``, the pairwise combination of block partials (C++ for both
#: backends; the prelude defines ``DISC_CASCADE_FN`` as ``inline`` or ``__device__``).
#: Level l of this binary counter holds the combination of 2^l pushed values.
CASCADE = r"""template <typename T>
struct disc_cascade {
  T level[48];
  unsigned long long count = 0;
  template <typename F>
  DISC_CASCADE_FN void push(T v, F comb) {
    int l = 0;
    for (unsigned long long c = count; c & 1ull; c >>= 1, ++l) v = comb(level[l], v);
    level[l] = v;
    ++count;
  }
  // Every value pushed, combined (init if none).
  template <typename F>
  DISC_CASCADE_FN T total(T init, F comb) const {
    T acc = init;
    bool any = false;
    int l = 0;
    for (unsigned long long c = count; c; c >>= 1, ++l) {
      if (c & 1ull) {
        acc = any ? comb(level[l], acc) : level[l];
        any = true;
      }
    }
    return acc;
  }
};
"""


def accumulator_elem(elem: str, combiner: str = "") -> str:
    """Element type a reduction by ``combiner`` accumulates in: f32 for f16/bf16
    (rounded once at the end), f64 for floating-point products (a multiply's
    rounding error is relative to the product, so every multiply of a fold, in any
    order, adds its own to the result's: only a wider accumulator makes a long
    product as accurate as a sum)."""
    if combiner == "multiply" and elem in ("f32", "f16", "bf16"):
        return "f64"
    return "f32" if elem in ("f16", "bf16") else elem


def rounds_once(elem: str) -> bool:
    """True if a reduction to ``elem`` (a half type) rounds its float result once."""
    return elem in ("f16", "bf16")


def format_text(text: str) -> str:
    """``text`` inside a C string literal used as a printf format (a TF node's name
    in an error message): backslashes, quotes and percent signs escaped."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")


def bad_index_lines(tf_node: str, index: str, rows: str, indent: str) -> list[str]:
    """Host lines returning TF's InvalidArgument for gather index ``index`` outside
    ``[0, rows)`` (C++ expressions), worded as the gather kernel words it."""
    return [f'{indent}snprintf(msg, sizeof(msg), "TF op \'{format_text(tf_node)}\': indices = '
            f'%lld is not in [0, %lld)", (long long)({index}), (long long)({rows}));',
            f"{indent}return disc_fail(ral, DISC_INVALID_ARGUMENT, msg);"]


def comment(text: str) -> str:
    """``text`` made safe for a one-line C++ comment."""
    return text.replace("*/", "* /").replace("\n", " ")


def host_expr(h, plan: FusionPlan) -> str:
    """C++ for a host scalar: factor times a product of symbols (over a divisor)."""
    parts = [str(h.factor)] + [sym(s, plan) for s in h.symbols]
    text = " * ".join(parts)
    return f"({text}) / {h.divisor}" if h.divisor != 1 else text



def strided_gemm_exprs(f: dict, lhs: Buffer, rhs: Buffer, plan: FusionPlan) -> dict:
    """C++ expressions of a ``strided_gemm`` form: host lines defining outer, inner, m,
    n and kk, the leading dims and the (outer, inner) batch strides of A and B."""

    def stride(buf: Buffer, d: int) -> str:
        return product(buf.dims[d + 1:], plan)

    batch = f["batch"] + [None] * (2 - len(f["batch"]))
    sizes = [sym(lhs.dims[b[0]], plan) if b else "1" for b in batch]
    return {
        "lines": [f"    const int64_t outer = {sizes[0]}, inner = {sizes[1]};",
                  f"    const int64_t m = {sym(lhs.dims[f['m']], plan)};",
                  f"    const int64_t n = {sym(rhs.dims[f['n']], plan)};",
                  f"    const int64_t kk = {sym(lhs.dims[f['k_lhs']], plan)};"],
        "sa": [stride(lhs, b[0]) if b else "0" for b in batch],
        "sb": [stride(rhs, b[1]) if b else "0" for b in batch],
        "lda": stride(lhs, f["k_lhs"] if f["transpose_a"] else f["m"]),
        "ldb": stride(rhs, f["n"] if f["transpose_b"] else f["k_rhs"]),
    }


def concat_ops(kernel: Kernel) -> list[tuple[int, KernelOp]]:
    """A loop kernel's concatenations read in place: (op position, op)."""
    return [(n, op) for n, op in enumerate(kernel.ops) if op.op == "concatenate"]


def concat_end_lines(kernel: Kernel, plan: FusionPlan) -> list[str]:
    """Host lines setting ``k.cat<n>[p]``: where part p of each concatenation ends."""
    lines = []
    for n, op in concat_ops(kernel):
        end = "0"
        for q, size in enumerate(op.attrs["sizes"]):
            end = f"{end} + {sym(size, plan)}" if end != "0" else sym(size, plan)
            lines.append(f"    k.cat{n}[{q}] = {end};")
    return lines


def window_offset(acc: Access, buf: Buffer, plan: FusionPlan) -> str:
    """Elements of ``buf`` before the first one of the slice ``acc`` reads in place."""
    starts = acc.window[0]
    return " + ".join(f"{sym(st, plan)} * {product(buf.dims[d + 1:], plan)}"
                      for d, st in enumerate(starts)) or "0"


def input_stride_lines(i: int, acc: Access, buf: Buffer, rank: int, plan: FusionPlan) -> list[str]:
    """Host lines setting ``k.in<i>_strides`` per kernel dim: 0 along a broadcast
    (size-1) dim; through a window, the buffer's stride times the slice's step."""
    lines = []
    dims_map = acc.dims if acc.dims is not None else list(range(rank))
    stride = "1"
    for bd in range(len(buf.dims) - 1, -1, -1):
        size = sym(buf.dims[bd], plan)
        if acc.window is None:
            lines.append(f"    k.in{i}_strides[{dims_map[bd]}] = {size} == 1 ? 0 : {stride};")
        elif dims_map[bd] >= 0:  # -1: a size-1 dim along no kernel dim
            _, steps, sliced = acc.window
            lines.append(f"    k.in{i}_strides[{dims_map[bd]}] += {sym(sliced[bd], plan)} == 1"
                         f" ? 0 : {stride} * {steps[bd]};")
        stride = f"{stride} * {size}" if stride != "1" else size
    return lines


def gathered_ids_check(acc: Access, table: Buffer, ids: Buffer, plan: FusionPlan) -> list[str]:
    """Host lines checking the ids of the row gather a loop kernel reads in place
    (``acc``, args ``k`` filled) against its table: TF's InvalidArgument naming the
    first outside it, as the gather kernel gave. Nothing is checked when the gathered
    tensor has no element (the gather kernel then had nothing to run)."""
    g = acc.gather
    rows = sym(table.dims[0], plan)
    return [
        f"    // {comment(g.tf_node)}: every id picks a row of the table",
        f"    for (int64_t t = 0, n = {product(g.dims, plan)} > 0 ? {product(ids.dims, plan)} : 0;"
        " t < n; ++t) {",
        f"      const int64_t idx = (int64_t)k.in{g.ids}[t];",
        f"      if (idx < 0 || idx >= {rows}) {{",
        *bad_index_lines(g.tf_node, "idx", rows, "        "),
        "      }",
        "    }",
    ]


def pad_read_lines(i: int, acc: Access, buf: Buffer, rank: int, plan: FusionPlan) -> list[str]:
    """Host lines setting, per kernel dim, the padding before, the unpadded size and
    the padded size of the pad that input ``i`` reads in place (``buf``: unpadded);
    a kernel dim no padded dim runs along reads coordinate 0 of a size-1 dim."""
    pad = acc.pad
    lines = [f"    for (int d = 0; d < {rank}; ++d) k.in{i}_size[d] = k.in{i}_pdim[d] = 1;"]
    for bd, kd in enumerate(acc.dims):
        low = sym(pad.low[bd], plan)
        if pad.starts is not None:  # read through a slice: the padding before it
            low = f"{low} - {sym(pad.starts[bd], plan)}"
        lines.append(f"    k.in{i}_lo[{kd}] = {low}; "
                     f"k.in{i}_size[{kd}] = {sym(buf.dims[bd], plan)}; "
                     f"k.in{i}_pdim[{kd}] = {sym(pad.dims[bd], plan)};")
    return lines
