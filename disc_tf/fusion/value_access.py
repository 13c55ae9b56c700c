"""How a kernel reads a value: through broadcasts, transposes, slices read in
place and size-1 reshapes, down to the value whose memory holds it (its base),
with the dims map, the expansion per dim and the slice window of the read.

This is the planner's alias analysis. It depends on the shape analysis only,
never on where kernels are placed, and prints as text (``describe``).
"""

from __future__ import annotations

from disc_tf.fusion.dhlo_reader import DFunc, DOp
from disc_tf.fusion.shape_analysis import ShapeAnalysis


def _combine(a: str, b: str) -> str:
    if "yes" in (a, b):
        return "yes"
    if "maybe" in (a, b):
        return "maybe"
    return "no"


class ValueAccess:
    """Resolves reads of the values of ``func``."""

    def __init__(self, func: DFunc, analysis: ShapeAnalysis) -> None:
        self.func = func
        self.a = analysis
        self.producer: dict[str, DOp] = {r: op for op in func.ops for r in op.results}

    def window_slice(self, op: DOp | None) -> bool:
        """True if ``op`` is a slice read in place (a window on its dense operand)."""
        if op is None or op.name != "stablehlo.real_dynamic_slice":
            return False
        base, dims, _ = self.resolve(op.operands[0])
        producer = self.producer.get(base)
        return dims is None and base not in self.a.host_values and not (
            producer is not None and producer.name == "stablehlo.constant"
            and producer.const_value.ndim == 0)

    def unit_reshape_map(self, op: DOp | None) -> list[int] | None:
        """For a reshape of a window slice that only drops or inserts size-1 dims (a
        StridedSlice's shrink/new axes): the result dim each operand dim runs along
        (size-1 operand dims: -1, read with stride 0). None otherwise."""
        if op is None or op.name != "stablehlo.dynamic_reshape":
            return None
        if not self.window_slice(self.producer.get(op.operands[0])):
            return None
        src, dst = self.a.shape_class(op.operands[0]), self.a.shape_class(op.results[0])
        one = self.a.symbols.constant_value
        src_big = [i for i, d in enumerate(src) if one(d) != 1]
        dst_big = [j for j, d in enumerate(dst) if one(d) != 1]
        if [src[i] for i in src_big] != [dst[j] for j in dst_big]:
            return None
        mapping = [-1] * len(src)  # -1: a size-1 dim that runs along no result dim
        for i, j in zip(src_big, dst_big):
            mapping[i] = j
        return mapping

    def window_of(self, value: str) -> tuple | None:
        """The slice window a read of ``value`` goes through (see ``resolve``), if any."""
        op = self.producer.get(value)
        if op is not None and op.name in ("stablehlo.transpose", "stablehlo.dynamic_broadcast_in_dim"):
            return self.window_of(op.operands[0])
        if self.unit_reshape_map(op) is not None:
            return self.window_of(op.operands[0])
        if self.window_slice(op):
            steps = [self.a.symbols.constant_value(s) for s in self.a.extents[op.operands[3]]]
            return (self.a.extents[op.operands[1]], steps, self.a.value_dims[value])
        return None

    def resolve(self, value: str) -> tuple[str, list[int] | None, list[str] | None]:
        """Follows broadcasts, transposes and slices read in place: (base value, dims
        map, expansion) of a read. A slice gives a dims map even when it is the
        identity, so that readers needing dense memory copy it."""
        op = self.producer.get(value)
        if self.window_slice(op):
            base, _, _ = self.resolve(op.operands[0])
            rank = len(self.a.value_dims[value])
            return base, list(range(rank)), ["no"] * rank
        mapping = self.unit_reshape_map(op)
        if mapping is not None:
            base, _, _ = self.resolve(op.operands[0])
            one = self.a.symbols.constant_value
            src = self.a.value_dims[op.operands[0]]
            return base, mapping, ["yes" if one(d) == 1 else "no" for d in src]
        if op is not None and op.name == "stablehlo.transpose":
            perm = op.permutation
            inverse = [perm.index(i) for i in range(len(perm))]
            base, dims, expand = self.resolve(op.operands[0])
            if perm == sorted(perm):
                return base, dims, expand
            if dims is None:
                return base, inverse, ["no"] * len(inverse)
            return base, [inverse[d] if d >= 0 else -1 for d in dims], list(expand)
        info = self.a.broadcasts.get(value)
        if info is None:
            return value, None, None
        base, dims, expand = self.resolve(self.producer[value].operands[0])
        if info.is_identity:
            return base, dims, expand
        if dims is None:
            return base, list(info.dims), list(info.expand)
        return (
            base,
            [info.dims[d] if d >= 0 else -1 for d in dims],
            [_combine(e, info.expand[d]) if d >= 0 else e for e, d in zip(expand, dims)],
        )

    def transpose_perm(self, value: str) -> list[int] | None:
        """For a read of a dense buffer through a pure transpose: the buffer dim holding
        each of the value's dims. None for any other read."""
        base, dims, expand = self.resolve(value)
        if dims is None or self.window_of(value) is not None or any(e != "no" for e in expand):
            return None
        if sorted(dims) != list(range(len(self.a.value_dims[value]))):
            return None
        if base in self.a.host_values or base in self.a.host_arrays:
            return None
        return [dims.index(i) for i in range(len(dims))]

    def elem(self, value: str) -> str:
        """The element type of ``value``."""
        if value.startswith("%arg"):
            return self.func.args[int(value[4:])][0]
        return self.producer[value].elem_of(value)

    def describe(self) -> str:
        """One line per value read through something other than its own memory."""
        lines = []
        for op in self.func.ops:
            for value in op.results:
                base, dims, expand = self.resolve(value)
                if base == value and dims is None:
                    continue
                window = self.window_of(value)
                extra = f" window {window}" if window is not None else ""
                lines.append(f"{value} reads {base} dims {dims} expand {expand}{extra}")
        return "\n".join(lines)
