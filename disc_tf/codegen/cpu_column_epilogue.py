"""GEMM epilogues the RAL's GEMM block runs on C's registers (RAL ABI 11,
``column_epilogue``): a loop kernel that reads C at its own index and, element by
element, applies a chain of steps each between the value and a per-column vector (a
bias, a batch norm's scale and offset), a constant (a ReLU's or ReLU6's bounds) or a
tensor read at C's index (a residual).

Run as an epilogue pass, such a kernel reads back every block of C the GEMM wrote
and writes its result: on MobileNetV2's high-resolution layers (12800 x 96 at 2 x 160
x 160) that pass took as long as the GEMM itself. Described to the RAL instead
(``disc_column_epilogue``), its steps run on each tile of C as the GEMM block stores
it, and C's block is never read back. The host runner keeps the generated epilogue
for a host without ABI 11 and for a call where C's row is not the kernel's row (a view);
the RAL runs the steps as a pass wherever its block cannot (no prepacked B, no GEMM
block for the CPU, a GEMM that adds to C), with the same results.
"""

from __future__ import annotations

import dataclasses
import math

from disc_tf.fusion.plan import FusionPlan, Kernel
from disc_tf.ops.elementwise import literal

#: disc_ral.h's DISC_COLUMN_STEPS: the most steps a chain may have.
MAX_STEPS = 6
#: disc_ral.h's DISC_MATRIX_STEPS: the most steps reading a tensor laid out as C (a
#: residual) a chain may have (the GEMM block copies their rows for a narrow tile).
MAX_MATRIX_STEPS = 2

#: DHLO op -> (step with a per-column operand, with a constant, with a tensor laid out
#: as C).
_STEP_OPS = {
    "multiply": ("DISC_COLUMN_MUL", "DISC_CONSTANT_MUL", "DISC_MATRIX_MUL"),
    "add": ("DISC_COLUMN_ADD", "DISC_CONSTANT_ADD", "DISC_MATRIX_ADD"),
    "subtract": ("DISC_COLUMN_SUB", "DISC_CONSTANT_ADD", None),  # x - c as x + (-c): exact
    "maximum": (None, "DISC_CONSTANT_MAX", None),
    "minimum": (None, "DISC_CONSTANT_MIN", None),
}


@dataclasses.dataclass(frozen=True)
class ColumnStep:
    """One step: ``op`` (a disc_ral.h DISC_COLUMN_*, DISC_CONSTANT_* or DISC_MATRIX_*
    name) between the value and input ``operand`` of the epilogue kernel (read at the
    column's index, or at C's own) or ``constant``; ``value_first``: the value is the TF
    op's first operand."""

    op: str
    value_first: bool
    operand: int | None = None
    constant: float = 0.0


@dataclasses.dataclass(frozen=True)
class ColumnChain:
    """What an epilogue kernel computes from C: its input ``c_input`` (C, read at the
    kernel's own index) through ``steps``, into its one output."""

    c_input: int
    steps: list[ColumnStep]


def column_chain(plan: FusionPlan, gemm: Kernel, epilogue: Kernel) -> ColumnChain | None:
    """The chain ``epilogue`` (the loop kernel fused into library kernel ``gemm``)
    computes from C, or None if it is not one over f32."""
    if epilogue.kind != "loop" or gemm.epilogue_full_rows or len(epilogue.outputs) != 1:
        return None
    c_buffer = gemm.outputs[0][1]
    rank = len(epilogue.dims)
    c_inputs = [i for i, a in enumerate(epilogue.inputs) if a.buffer == c_buffer]
    if len(c_inputs) != 1 or not epilogue.inputs[c_inputs[0]].is_identity:
        return None
    if plan.buffers[epilogue.outputs[0][1]].elem != "f32" or plan.buffers[c_buffer].elem != "f32":
        return None

    def plain(i: int) -> bool:  # an f32 buffer read as stored
        a = epilogue.inputs[i]
        return (plan.buffers[a.buffer].elem == "f32" and a.window is None
                and a.part_of is None and a.gather is None and a.pad is None
                and a.ids_for is None)

    def is_column(i: int) -> bool:  # a vector of C's columns, one float each
        a = epilogue.inputs[i]
        return (plain(i) and len(plan.buffers[a.buffer].dims) == 1 and a.dims == [rank - 1]
                and a.expand == ["no"])

    def is_matrix(i: int) -> bool:  # a tensor read at C's own index (a residual)
        a = epilogue.inputs[i]
        return plain(i) and a.is_identity and a.buffer != c_buffer

    value: tuple[str, object] = ("in", c_inputs[0])
    steps: list[ColumnStep] = []
    for op in epilogue.ops:
        ops = _STEP_OPS.get(op.op)
        if (ops is None or op.row or op.elem != "f32" or len(op.operands) != 2
                or value not in op.operands or op.operands[0] == op.operands[1]):
            return None
        value_first = op.operands[0] == value
        kind, other = op.operands[1] if value_first else op.operands[0]
        if not value_first and op.op == "subtract":
            return None  # c - x is no step
        if kind == "in" and is_column(other) and ops[0] is not None:
            steps.append(ColumnStep(ops[0], value_first, operand=other))
        elif kind == "in" and is_matrix(other) and ops[2] is not None:
            steps.append(ColumnStep(ops[2], value_first, operand=other))
        elif kind == "const" and isinstance(other, (int, float)) and not math.isnan(other):
            constant = -float(other) if op.op == "subtract" else float(other)
            steps.append(ColumnStep(ops[1], value_first, constant=constant))
        else:
            return None
        value = ("val", op.value)
    if not steps or len(steps) > MAX_STEPS or value != ("val", epilogue.outputs[0][0]):
        return None
    if sum(s.op.startswith("DISC_MATRIX") for s in steps) > MAX_MATRIX_STEPS:
        return None
    return ColumnChain(c_inputs[0], steps)


def closure_lines(chain: ColumnChain, rows: str, cols: str, suffix: str = "") -> list[str]:
    """Host lines filling ``col`` (a disc_column_epilogue over the epilogue's args ``k``:
    ``rows`` rows of C per product, ``cols`` columns) and ``on_registers``; with
    ``suffix``, ``col<suffix>`` over ``args<suffix>``, ``inner_rows<suffix>`` its row
    length, and ``on_registers<suffix>``."""
    col, k, inner = f"col{suffix}", f"args{suffix}" if suffix else "k", f"inner_rows{suffix}"
    lines = ["    // the same steps on C's registers where the host can (RAL ABI 11)",
             f"    disc_column_epilogue {col}{{}};",
             f"    {col}.c = {k}.in{chain.c_input}; {col}.out = {k}.out0;",
             f"    {col}.rows = {rows}; {col}.cols = {inner}; {col}.steps = {len(chain.steps)};"]
    for i, s in enumerate(chain.steps):
        operand = f"{k}.in{s.operand}" if s.operand is not None else "nullptr"
        lines.append(f"    {col}.step[{i}] = disc_column_step{{{s.op}, {int(s.value_first)}, "
                     f"{operand}, {literal(s.constant, 'f32')}}};")
    lines.append(f"    const bool on_registers{suffix} = ral->abi_version >= 11 && "
                 f"ral->column_epilogue != nullptr && {inner} == {cols};")
    return lines
