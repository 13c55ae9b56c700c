"""Index kernels that run a row at a time (every dim of the output but the last per
task, the last a plain loop that vectorizes): pooling windows over the outer dims of an
f32 tensor, pads without interior padding, reverses and gathers along an outer dim. The
generic index kernel (``cpu_index.IndexKernelEmitter``) places each element by per-dim
arithmetic; these are what its ``source`` picks where they apply."""

from __future__ import annotations

from typing import TYPE_CHECKING

from disc_tf.codegen.cpu_ops import expression, literal
from disc_tf.codegen.cpu_text import comment

if TYPE_CHECKING:
    from disc_tf.codegen.cpu_index import IndexKernelEmitter


def channel_windows(em: IndexKernelEmitter) -> bool:
    """True for a pooling window over the outer dims only of an f32 tensor (NHWC
    pools: the channels are neither windowed nor strided), which
    ``channel_window_source`` runs a row of channels at a time."""
    attrs = em.op.attrs
    return (em.op.op == "reduce_window" and em.rank >= 2 and em.op.elem == "f32"
            and attrs["window"][-1] == 1 and attrs["strides"][-1] == 1
            and em.buf(em.k.inputs[0]).elem == "f32")


def channel_window_source(em: IndexKernelEmitter) -> str:
    """One task per output pixel (every dim but the last): its channels start at the
    fold's start value in the output row, and each window tap inside the operand
    folds a contiguous row of the operand's channels into them (a vector loop; taps
    outside, of a pad read in place, are skipped)."""
    attrs, r = em.op.attrs, em.rank
    lines = [*em._row_head(), f"    for (int64_t col = 0; col < inner; ++col) w[col] = "
                              f"{literal(attrs['init'], 'f32')};"]
    indent = "    "
    loops = [d for d, size in enumerate(attrs["window"][:-1]) if size > 1]
    for d in loops:
        lines.append(f"{indent}for (int64_t w{d} = 0; w{d} < {attrs['window'][d]}; ++w{d}) {{")
        indent += "  "
    for d in range(r - 1):
        lines.append(f"{indent}const int64_t t{d} = {em._window_coord(d)};")
    if "low" in attrs:
        lines.append(f"{indent}if (!({em._taps_inside(r - 1)})) continue;")
    base = " + ".join(f"t{d} * a.in0_strides[{d}]" for d in range(r - 1))
    lines.append(f"{indent}const float* __restrict src = a.in0 + {base};")
    comb = expression(attrs["combiner"], ["w[col]", "src[col]"], "f32", ["f32"] * 2, {})
    lines += [f"{indent}#pragma omp simd", f"{indent}for (int64_t col = 0; col < inner; ++col) "
              f"w[col] = {comb};  // {comment(em.op.tf_node)}: reduce_window"]
    for _ in loops:
        indent = indent[:-2]
        lines.append(f"{indent}}}")
    lines += ["  }", "}"]
    return em._unit(f"pooling window over [{em._dims_text()}] a row of channels at a time",
                    lines)


def pad_rows(em: IndexKernelEmitter) -> bool:
    """True for a ``dynamic_pad`` with no interior padding of an operand stored as its
    result is (``pad_rows_source`` copies it a row at a time)."""
    if em.op.op != "dynamic_pad" or em.rank < 1:
        return False
    interior = em.op.attrs["interior"]
    consts = [em.plan.symbols[s] for s in interior]
    return (all(d.kind == "const" and d.value == 0 for d in consts)
            and em.buf(em.k.inputs[0]).elem == em.op.elem)


def pad_rows_source(em: IndexKernelEmitter) -> str:
    """One task per output row (every dim but the last): a row outside the operand
    along an outer dim is the pad value; one inside is the value, the operand's row
    (a plain copy) and the value again, three loops that vectorize. The generic
    index kernel found each element's place by per-dim arithmetic: 4 x 112 x 112 x
    64 padded by 2 on H and W took 5.3 ms there against TF's 1.6 (Zen 4)."""
    r = em.rank
    st = em._output_storage()
    lines = [
        *em._row_head((
            f"  const int64_t lo = {em._p('low', r - 1)}, n = a.in0_dims[{r - 1}];",
            "  // the operand's columns land at [c0, c1) of each row inside it",
            "  const int64_t c0 = lo < 0 ? 0 : lo > inner ? inner : lo;",
            "  const int64_t c1 = lo + n < c0 ? c0 : lo + n > inner ? inner : lo + n;",
            f"  const {st} fill = ({st})({em._operand(1)});")),
        "    bool inside = true;",
        "    int64_t off = 0;",
    ]
    for d in range(r - 1):
        lines += [f"    {{ const int64_t t = c[{d}] - {em._p('low', d)};",
                  f"      inside = inside && t >= 0 && t < a.in0_dims[{d}];",
                  f"      off += t * a.in0_strides[{d}]; }}"]
    lines += [
        "    if (!inside) {",
        "      for (int64_t col = 0; col < inner; ++col) w[col] = fill;",
        "      continue;",
        "    }",
        "    for (int64_t col = 0; col < c0; ++col) w[col] = fill;",
        f"    for (int64_t col = c0; col < c1; ++col) w[col] = a.in0[off + col - lo];  "
        f"// {comment(em.op.tf_node)}: dynamic_pad",
        "    for (int64_t col = c1; col < inner; ++col) w[col] = fill;",
        "  }",
        "}",
    ]
    return em._unit(f"pad over [{em._dims_text()}] a row at a time", lines)


def row_copies(em: IndexKernelEmitter) -> bool:
    """True for a reverse, or a gather of rows along any dim but the operand's
    innermost, of an operand stored as the result is: each output row is a row of
    the operand (``row_copy_source``)."""
    op = em.op
    if op.op not in ("reverse", "torch_index_select") or em.rank < 1:
        return False
    if em.buf(em.k.inputs[0]).elem != op.elem:
        return False
    return op.op == "reverse" or op.attrs["dim"] < em._rank(0) - 1


def row_copy_source(em: IndexKernelEmitter) -> str:
    """One task per output row (every dim but the last), which is a row of the
    operand: a reversed one (the innermost dim reversed) or one found once per row
    (outer dims reversed; the row a gather's id names, its id checked once), copied
    by a plain loop. The generic index kernel placed each element by per-dim
    arithmetic (and read and checked a gather's id per element): a [16, 512, 256]
    reverse along the sequence ran 0.59x TF's speed there, a gather of 4096 rows of
    256 returned as it is 0.57x (Zen 4)."""
    op = em.op
    st = em._output_storage()
    lines = em._row_head()
    tag = f"// {comment(op.tf_node)}: {op.op}"
    if op.op == "reverse":
        coord = em._reversed_coord()
        lines.append(f"    const {st}* __restrict src = a.in0 + {em._offset(0, coord[:-1] + ['0'])};")
        read = "src[inner - 1 - col]" if em.rank - 1 in op.attrs["dims"] else "src[col]"
        lines.append(f"    for (int64_t col = 0; col < inner; ++col) w[col] = {read};  {tag}")
    else:
        icoord, pcoord = em._gather_coords()
        lines += [f"    const int64_t idx = (int64_t)a.in1[{em._offset(1, icoord)}];",
                  f"    if (idx < 0 || idx >= a.in0_dims[{op.attrs['dim']}]) {{",
                  f"      {em.record_bad_index('idx')}",
                  f"      for (int64_t col = 0; col < inner; ++col) w[col] = ({st})0;",
                  "      continue;",
                  "    }",
                  f"    const {st}* __restrict src = a.in0 + {em._offset(0, pcoord[:-1] + ['0'])};",
                  f"    for (int64_t col = 0; col < inner; ++col) w[col] = src[col];  {tag}"]
    lines += ["  }", "}"]
    return em._unit(f"{op.op} over [{em._dims_text()}] a row at a time", lines)
