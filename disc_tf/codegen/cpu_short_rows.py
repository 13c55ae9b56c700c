"""The short-row version of a CPU stitch kernel: eight rows at once, one per lane.

A stitch kernel normally runs one row per call and vectorizes along the row. A
row shorter than a vector (a softmax over a few classes or over a short
sequence, a norm over a small feature dim) fills one masked vector per pass and
ends each reduction in a shuffle tree. When the host sees such rows, the
kernel's row range runs ``{k}_rows8`` instead: lane ``l`` holds row ``row0 + l``,
every reduction is a plain per-lane accumulator and nothing is masked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from disc_tf.codegen.cpu_ops import COMPUTE, STORAGE, expression, literal
from disc_tf.codegen.cpu_text import accumulator_elem, comment, rounds_once

if TYPE_CHECKING:
    from disc_tf.codegen.cpu_kernels import KernelEmitter
    from disc_tf.fusion.plan import KernelOp

#: Rows shorter than this (one vector of f32 lanes) take the eight-row version.
SHORT_ROW = 8


def short_rows(em: KernelEmitter, ready: dict[str, int],
               closure: Callable[[list[str]], list[KernelOp]]) -> str:
    """C++ of ``{k}_rows8(a, row0)``: rows [row0, row0 + 8) of stitch kernel
    ``em.k``. ``ready``/``closure``: its schedule (``stitch_levels``).

    One function (with its ISA clones), not an instance per broadcast flag and not
    inlined into each: only the tile loads depend on how inputs are read, so every
    read that is not contiguous goes through its run-time stride (compile time)."""
    k, r = em.k, em.rank
    row_index, bcast, strided, _ = em.inner_index()
    index = {i: (f"c * st{i}" if i in bcast or i in strided else row_index[i])
             for i in range(len(k.inputs))}
    # Row values are one per lane (arrays); per-element values are lane scalars.
    var = {op.value: f"v{n}" for n, op in enumerate(k.ops)}
    names = {v: (f"{name}[l]" if v in ready else name) for v, name in var.items()}
    lines = [
        "// Eight rows shorter than a vector: lane l holds row row0 + l.",
        f"DISC_CLONES static void {em.fn}_rows8(const {em.args}& a, int64_t row0) {{",
        f"  const int64_t cols = a.dims[{r - 1}];",
    ]
    read = [i for i, acc in enumerate(k.inputs) if acc.ids_for is None]  # ids: row starts
    lines += [f"  int64_t lane_off{i}[8];" for i in read]
    lines.append("  for (int l = 0; l < 8; ++l) {")
    lines.append("    const int64_t row = row0 + l;")
    em._row_offsets(lines, "    ")
    lines += [f"    lane_off{i}[l] = {em._row_start(i)};" for i in read]
    lines.append("  }")
    # Each input's 8 x cols values, read once into a tile: column c of lane l.
    for i in read:
        acc = k.inputs[i]
        ct = COMPUTE[em.buf(acc).elem]
        if "st" in index[i]:
            lines.append(f"  const int64_t st{i} = a.in{i}_strides[{r - 1}];")
        lines.append(f"  {ct} t{i}[{SHORT_ROW}][8];  // {acc}")
        lines.append("  for (int l = 0; l < 8; ++l)")
        lines.append(f"    for (int64_t c = 0; c < cols; ++c) "
                     f"t{i}[c][l] = ({ct})a.in{i}[lane_off{i}[l] + ({index[i]})];")

    def element(ops: list[KernelOp], indent: str, readers: tuple = ()) -> list[str]:
        """Loads and per-element ops of one (lane, column)."""
        out = []
        used = sorted({ref for op in list(ops) + list(readers)
                       for kind, ref in op.operands if kind == "in"})
        for i in used:
            ct = COMPUTE[em.buf(k.inputs[i]).elem]
            out.append(f"{indent}const {ct} x{i} = t{i}[c][l];")
        for op in ops:
            args = [em.ref(kind, ref, elem, names, "x")
                    for (kind, ref), elem in zip(op.operands, op.operand_elems)]
            out.append(f"{indent}const {COMPUTE[op.elem]} {names[op.value]} = "
                       f"{expression(op.op, args, op.elem, op.operand_elems, op.attrs)};"
                       f"  // {comment(op.tf_node)}: {op.op}")
        return out

    passes = max([ready[op.value] for op in k.ops if op.op == "reduce"] or [0])
    for n, op in enumerate(k.ops):
        if op.value in ready:
            lines.append(f"  {COMPUTE[op.elem]} v{n}[8];  // {comment(op.tf_node)}: per row")
    for p in range(1, passes + 1):
        reduces = [op for op in k.ops if op.op == "reduce" and ready[op.value] == p]
        full = closure([ref for op in reduces for kind, ref in op.operands if kind == "val"])
        lines.append(f"  // pass {p}: {', '.join(comment(op.tf_node) for op in reduces)}")
        for op in reduces:
            acc = accumulator_elem(op.elem, op.attrs["combiner"])
            lines.append(f"  {COMPUTE[acc]} acc_{var[op.value]}[8];")
            lines.append(f"  for (int l = 0; l < 8; ++l) acc_{var[op.value]}[l] = "
                         f"{literal(op.attrs['init'], op.elem)};")
        lines.append("  for (int64_t c = 0; c < cols; ++c) {")
        lines.append("    #pragma omp simd")
        lines.append("    for (int l = 0; l < 8; ++l) {")
        lines += element(full, "      ", tuple(reduces))
        for op in reduces:
            kind, ref = op.operands[0]
            val = em.ref(kind, ref, op.elem, names, "x")
            acc = f"acc_{var[op.value]}[l]"
            elem = accumulator_elem(op.elem, op.attrs["combiner"])
            comb = expression(op.attrs["combiner"], [acc, val], elem, [elem] * 2, {})
            lines.append(f"      {acc} = {comb};")
        lines += ["    }", "  }"]
        lines.append("  for (int l = 0; l < 8; ++l) {")
        for op in reduces:
            v = names[op.value]
            value = f"acc_{var[op.value]}[l]"
            if rounds_once(op.elem):  # accumulated in float, rounded once
                value = f"disc_round_{op.elem}((float){value})"
            lines.append(f"    {v} = {value};  // {comment(op.tf_node)}")
        for op in k.ops:
            if op.row and op.op != "reduce" and ready[op.value] == p:
                args = [em.ref(kind, ref, elem, names, "x")
                        for (kind, ref), elem in zip(op.operands, op.operand_elems)]
                lines.append(f"    {names[op.value]} = "
                             f"{expression(op.op, args, op.elem, op.operand_elems, op.attrs)};"
                             f"  // {comment(op.tf_node)}: {op.op} (per row)")
        lines.append("  }")
    full_outs = [(j, v) for j, (v, _) in enumerate(k.outputs) if v not in ready]
    if full_outs:
        lines.append("  // final pass: full-shape outputs, through a tile")
        for j, _ in full_outs:
            lines.append(f"  {STORAGE[em.plan.buffers[k.outputs[j][1]].elem]} "
                         f"o{j}[{SHORT_ROW}][8];")
        lines.append("  for (int64_t c = 0; c < cols; ++c) {")
        lines.append("    #pragma omp simd")
        lines.append("    for (int l = 0; l < 8; ++l) {")
        lines += element(closure([v for _, v in full_outs]), "      ")
        for j, v in full_outs:
            elem = em.plan.buffers[k.outputs[j][1]].elem
            lines.append(f"      o{j}[c][l] = ({STORAGE[elem]}){names[v]};")
        lines += ["    }", "  }"]
        lines.append("  for (int l = 0; l < 8; ++l)")
        lines.append("    for (int64_t c = 0; c < cols; ++c) {")
        lines += [f"      a.out{j}[(row0 + l) * cols + c] = o{j}[c][l];" for j, _ in full_outs]
        lines.append("    }")
    for j, (v, b) in enumerate(k.outputs):
        if v in ready:
            elem = STORAGE[em.plan.buffers[b].elem]
            lines.append(f"  for (int l = 0; l < 8; ++l) a.out{j}[row0 + l] = ({elem}){names[v]};")
    lines.append("}")
    return "\n".join(lines)
