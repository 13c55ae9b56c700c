"""A small text builder for DHLO modules (StableHLO dynamic ops + shape).

Ops are written in MLIR's generic form, one per line, each with the location
of the TF node it lowers, so later stages can name the fused TF ops.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from disc_tf.dhlo_bridge.types import LoweringError, tensor_type

#: Largest integer constant whose elements the host runner keeps as scalars.
_MAX_HOST_ELEMENTS = 16


def _fold_index(op: str, x: int, y: int) -> int | None:
    """Compile-time value of ``arith.<op>(x, y)``; None if it is undefined."""
    if op in ("floordivsi", "ceildivsi", "remsi") and y == 0:
        return None
    return {
        "addi": lambda: x + y, "subi": lambda: x - y, "muli": lambda: x * y,
        "floordivsi": lambda: x // y, "ceildivsi": lambda: -(-x // y),
        "maxsi": lambda: max(x, y), "minsi": lambda: min(x, y),
        "remsi": lambda: int(np.fmod(x, y)),
    }[op]()


def _compare_index(predicate: str, x: int, y: int) -> bool:
    return {"eq": x == y, "ne": x != y, "slt": x < y, "sle": x <= y, "sgt": x > y,
            "sge": x >= y}[predicate]


@dataclasses.dataclass(frozen=True)
class TValue:
    """A tensor SSA value: name, element type, and dims (None = dynamic)."""

    ssa: str
    elem: str
    dims: tuple
    #: For a small integer tensor (rank 0 or 1) whose values the host runner
    #: computes from dims (a shape, a size): one ``index`` SSA scalar per element.
    host: tuple | None = None

    @property
    def rank(self) -> int:
        """Number of dimensions."""
        return len(self.dims)

    @property
    def type(self) -> str:
        """The MLIR type of the value."""
        return tensor_type(self.elem, self.dims)


def _static_broadcast(values: list[TValue], rank: int) -> tuple:
    """The dims of the numpy broadcast of ``values`` known when lowering: a dim one
    operand has statically (other than 1) is the result's (the host checks the
    others are 1 or equal), 1 where all operands have 1, else unknown. Channel
    counts thus survive a batch norm's broadcasts and reach a convolution."""
    out = []
    for i in range(rank):
        dims = [v.dims[v.rank - rank + i] for v in values if v.rank - rank + i >= 0]
        known = {d for d in dims if d is not None and d != 1}
        if len(known) == 1:
            out.append(known.pop())
        elif dims and all(d == 1 for d in dims):
            out.append(1)
        else:
            out.append(None)
    return tuple(out)


class DhloBuilder:
    """Accumulates the body of one ``func.func @main``."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._counter = 0
        self._shape_of: dict[str, str] = {}
        #: numpy values of constants, for rules that need compile-time operands
        self.const_values: dict = {}
        #: values of ``index`` constants (host scalars known at compile time)
        self.index_values: dict[str, int] = {}
        #: float scalars that are host integers cast to float: ssa -> ``index`` scalar
        self.exact_ints: dict[str, str] = {}
        #: NHWC tensors zero-padded in H and W only: ssa -> (unpadded input, low and
        #: high ``index`` pads of H and W), for a convolution to read in place
        self.zero_padded: dict[str, tuple[TValue, list[str], list[str]]] = {}
        self.loc = "unknown"

    def _fresh(self, prefix: str = "v") -> str:
        self._counter += 1
        return f"%{prefix}{self._counter}"

    def _loc(self) -> str:
        name = self.loc.replace("\\", "\\\\").replace('"', '\\"')
        return f'loc("{name}")'

    def op(
        self,
        name: str,
        operands: list[TValue],
        result_elem: str,
        result_dims: tuple,
        attrs: str = "",
    ) -> TValue:
        """Emits ``stablehlo.<name>`` (or a dotted name as is) with one result."""
        full = name if "." in name else f"stablehlo.{name}"
        result = TValue(self._fresh(), result_elem, tuple(result_dims))
        args = ", ".join(v.ssa for v in operands)
        types = ", ".join(v.type for v in operands)
        attr_text = f" {{{attrs}}}" if attrs else ""
        self.lines.append(
            f'{result.ssa} = "{full}"({args}){attr_text} : ({types}) -> {result.type} {self._loc()}'
        )
        return result

    def op_with_shapes(self, name: str, operands: list, result_elem: str, result_dims: tuple,
                       attrs: str = "") -> TValue:
        """Emits ``stablehlo.<name>`` whose operands mix tensor values and host shape
        tensors (``str`` SSA names of ``tensor<Nxindex>``, given as (ssa, N))."""
        result = TValue(self._fresh(), result_elem, tuple(result_dims))
        names, types = [], []
        for v in operands:
            if isinstance(v, TValue):
                names.append(v.ssa)
                types.append(v.type)
            else:
                names.append(v[0])
                types.append(f"tensor<{v[1]}xindex>")
        attr_text = f" {{{attrs}}}" if attrs else ""
        self.lines.append(
            f'{result.ssa} = "stablehlo.{name}"({", ".join(names)}){attr_text} : '
            f"({', '.join(types)}) -> {result.type} {self._loc()}"
        )
        return result

    def constant(self, literal: str, elem: str, dims: tuple, value=None) -> TValue:
        """Emits a ``stablehlo.constant`` of a static type (``value``: its numpy data)."""
        ty = tensor_type(elem, dims)
        result = self.op("constant", [], elem, dims, attrs=f"value = {literal} : {ty}")
        if value is not None:
            self.const_values[result.ssa] = value
        return result

    def shape_of(self, value: TValue) -> str:
        """The ``tensor<Rxindex>`` extents of ``value`` (emitted once per value)."""
        if value.ssa not in self._shape_of:
            ssa = self._fresh("s")
            self.lines.append(
                f'{ssa} = "shape.shape_of"({value.ssa}) : ({value.type}) -> '
                f"tensor<{value.rank}xindex> {self._loc()}"
            )
            self._shape_of[value.ssa] = ssa
        return self._shape_of[value.ssa]

    def broadcast_shapes(self, values: list[TValue]) -> tuple[str, int]:
        """Emits ``shape.broadcast`` of the values' shapes; returns (ssa, rank)."""
        rank = max(v.rank for v in values)
        shapes = [self.shape_of(v) for v in values]
        ssa = self._fresh("s")
        types = ", ".join(f"tensor<{v.rank}xindex>" for v in values)
        self.lines.append(
            f'{ssa} = "shape.broadcast"({", ".join(shapes)}) : ({types}) -> '
            f"tensor<{rank}xindex> {self._loc()}"
        )
        return ssa, rank

    def broadcast_extents(self, shapes: list[tuple[str, int]]) -> tuple[str, int]:
        """Emits ``shape.broadcast`` of (shape ssa, rank) pairs; returns (ssa, rank)."""
        rank = max(r for _, r in shapes)
        ssa = self._fresh("s")
        types = ", ".join(f"tensor<{r}xindex>" for _, r in shapes)
        self.lines.append(
            f'{ssa} = "shape.broadcast"({", ".join(s for s, _ in shapes)}) : ({types}) -> '
            f"tensor<{rank}xindex> {self._loc()}"
        )
        return ssa, rank

    def extract(self, shape_ssa: str, rank: int, d: int) -> str:
        """Element ``d`` of a ``tensor<rank x index>`` shape as a host ``index`` scalar."""
        ssa = self._fresh("d")
        self.lines.append(
            f'{ssa} = "tensor.extract"({shape_ssa}, {self.index_const(d)}) : '
            f"(tensor<{rank}xindex>, index) -> index {self._loc()}"
        )
        return ssa

    def dot_general(self, lhs: TValue, rhs: TValue, batch: int, lhs_contract: int,
                    rhs_contract: int) -> TValue:
        """``stablehlo.dot_general`` with leading batch dims [0, batch) on both sides and
        one contracting dim each; result dims: batch, lhs free, rhs free. f16/bf16
        operands are multiplied in f32 (converts that fuse into neighbouring kernels)."""
        if lhs.elem in ("f16", "bf16"):
            wide = self.dot_general(self.op("convert", [lhs], "f32", lhs.dims),
                                    self.op("convert", [rhs], "f32", rhs.dims),
                                    batch, lhs_contract, rhs_contract)
            return self.op("convert", [wide], lhs.elem, wide.dims)
        bdims = list(range(batch))
        lhs_free = [d for i, d in enumerate(lhs.dims) if i >= batch and i != lhs_contract]
        rhs_free = [d for i, d in enumerate(rhs.dims) if i >= batch and i != rhs_contract]
        dims = tuple(
            lhs.dims[i] if lhs.dims[i] is not None else rhs.dims[i] for i in bdims
        ) + tuple(lhs_free) + tuple(rhs_free)

        def ints(xs: list[int]) -> str:
            return "[" + ", ".join(map(str, xs)) + "]"

        attr = (
            "dot_dimension_numbers = #stablehlo.dot<"
            f"lhs_batching_dimensions = {ints(bdims)}, rhs_batching_dimensions = {ints(bdims)}, "
            f"lhs_contracting_dimensions = {ints([lhs_contract])}, "
            f"rhs_contracting_dimensions = {ints([rhs_contract])}>"
        )
        return self.op("dot_general", [lhs, rhs], lhs.elem, dims, attr)

    def require_equal_shapes(self, values: list[TValue]) -> None:
        """Emits ``shape.cstr_eq``: the host checks the shapes are identical."""
        shapes = [self.shape_of(v) for v in values]
        types = ", ".join(f"tensor<{v.rank}xindex>" for v in values)
        self.lines.append(
            f'{self._fresh("w")} = "shape.cstr_eq"({", ".join(shapes)}) : ({types}) -> '
            f"!shape.witness {self._loc()}"
        )

    def broadcast_to(self, value: TValue, shape_ssa: str, rank: int, dims: list[int],
                     static_dims: tuple | None = None) -> TValue:
        """Emits ``stablehlo.dynamic_broadcast_in_dim`` of value to a shape (whose dims
        ``static_dims`` gives where they are known when lowering)."""
        result = TValue(self._fresh(), value.elem, tuple(static_dims or (None,) * rank))
        attr = "broadcast_dimensions = array<i64" + (
            ": " + ", ".join(map(str, dims)) if dims else ""
        ) + ">"
        self.lines.append(
            f'{result.ssa} = "stablehlo.dynamic_broadcast_in_dim"({value.ssa}, {shape_ssa}) '
            f"{{{attr}}} : ({value.type}, tensor<{rank}xindex>) -> {result.type} {self._loc()}"
        )
        return result

    def index_const(self, value: int) -> str:
        """An ``index`` constant (host scalar)."""
        ssa = self._fresh("c")
        self.lines.append(
            f'{ssa} = "arith.constant"() {{value = {int(value)} : index}} : () -> index {self._loc()}'
        )
        self.index_values[ssa] = int(value)
        return ssa

    def index_arith(self, op: str, a: str, b: str) -> str:
        """A host ``index`` computation ``arith.<op>(a, b)`` (addi, subi, muli,
        floordivsi, ceildivsi, maxsi, minsi, remsi); folded when both are known."""
        x, y = self.index_values.get(a), self.index_values.get(b)
        if x is not None and y is not None:
            folded = _fold_index(op, x, y)
            if folded is not None:
                return self.index_const(folded)
        if op in ("addi", "subi") and y == 0 or op in ("muli", "floordivsi") and y == 1:
            return a
        if op in ("addi", "muli") and x == (0 if op == "addi" else 1):
            return b
        ssa = self._fresh("h")
        self.lines.append(
            f'{ssa} = "arith.{op}"({a}, {b}) : (index, index) -> index {self._loc()}'
        )
        return ssa

    def index_select(self, predicate: str, a: str, b: str, c: str, d: str) -> str:
        """``c if a <predicate> b else d`` on host ``index`` scalars (predicate: slt, sge...)."""
        x, y = self.index_values.get(a), self.index_values.get(b)
        if x is not None and y is not None:
            return c if _compare_index(predicate, x, y) else d
        cond = self._fresh("p")
        preds = {"eq": 0, "ne": 1, "slt": 2, "sle": 3, "sgt": 4, "sge": 5}
        self.lines.append(
            f'{cond} = "arith.cmpi"({a}, {b}) {{predicate = {preds[predicate]} : i64}} : '
            f"(index, index) -> i1 {self._loc()}"
        )
        ssa = self._fresh("h")
        self.lines.append(
            f'{ssa} = "arith.select"({cond}, {c}, {d}) : (i1, index, index) -> index {self._loc()}'
        )
        return ssa

    def require(self, predicate: str, a: str, b: str, message: str) -> None:
        """``shape.cstr_require`` that ``a <predicate> b`` (host ``index`` scalars):
        the host fails the call with TF op '<node>': ``message`` (and ``a``) if not."""
        x, y = self.index_values.get(a), self.index_values.get(b)
        if x is not None and y is not None:  # known at compile time
            holds = {"eq": x == y, "ne": x != y, "slt": x < y, "sle": x <= y, "sgt": x > y,
                     "sge": x >= y}[predicate]
            if not holds:  # every call would fail: the node is refused, TF gives its error
                raise LoweringError(f"{message} ({x} {predicate} {y} fails for every call)")
            return
        preds = {"eq": 0, "ne": 1, "slt": 2, "sle": 3, "sgt": 4, "sge": 5}
        cond = self._fresh("p")
        self.lines.append(
            f'{cond} = "arith.cmpi"({a}, {b}) {{predicate = {preds[predicate]} : i64}} : '
            f"(index, index) -> i1 {self._loc()}"
        )
        text = message.replace("\\", "\\\\").replace('"', '\\"')
        self.lines.append(
            f'{self._fresh("w")} = "shape.cstr_require"({cond}) {{msg = "{text}"}} : (i1) -> '
            f"!shape.witness {self._loc()}"
        )

    def require_int32(self, value: str) -> None:
        """The host checks that ``value`` (the host scalar of an int32 result) fits
        in int32: TF computes such values in int32, so a larger one would have
        wrapped (or, for Shape and Size, been refused) there."""
        for predicate, bound in (("sle", 2**31 - 1), ("sge", -(2**31))):
            self.require(predicate, value, self.index_const(bound),
                         "int32 result out of range (TF computes it in 32 bits)")

    def host_tensor(self, elements: list[str], elem: str, rank: int,
                    dims: tuple | None = None) -> TValue:
        """A rank-0 or rank-1 integer tensor of host ``index`` scalars (a shape or
        size computed on the host); it keeps the scalars for shape consumers. The
        host checks that an int32 tensor's scalars fit in int32."""
        scalars = []
        for e in elements:
            if elem == "i32":
                self.require_int32(e)
            wide = self._fresh("n")
            self.lines.append(f'{wide} = "arith.index_cast"({e}) : (index) -> i64 {self._loc()}')
            if elem != "i64":
                narrow = self._fresh("n")
                self.lines.append(
                    f'{narrow} = "arith.trunci"({wide}) : (i64) -> {elem} {self._loc()}')
                wide = narrow
            scalars.append(wide)
        if dims is None:
            dims = () if rank == 0 else (len(elements),)
        result = TValue(self._fresh(), elem, dims, tuple(elements) if len(dims) <= 1 else None)
        types = ", ".join(elem for _ in scalars)
        self.lines.append(
            f'{result.ssa} = "tensor.from_elements"({", ".join(scalars)}) : ({types}) -> '
            f"{result.type} {self._loc()}"
        )
        return result

    def host_elements(self, value: TValue) -> list[str] | None:
        """The host ``index`` scalars of a small integer tensor (a host value or a
        constant of rank <= 1), or None if the host does not know its values."""
        if value.host is not None:
            return list(value.host)
        data = self.const_values.get(value.ssa)
        if data is None or value.rank > 2 or not np.issubdtype(np.asarray(data).dtype, np.integer):
            return None
        if np.asarray(data).size > _MAX_HOST_ELEMENTS:
            return None
        return [self.index_const(v) for v in np.asarray(data).reshape(-1).tolist()]

    def known_ints(self, value: TValue) -> list[int] | None:
        """The values of a tensor known at compile time (a constant, or host scalars
        that all folded to constants); None otherwise."""
        data = self.const_values.get(value.ssa)
        if data is not None:
            return [int(v) for v in np.asarray(data).reshape(-1).tolist()]
        if value.host is not None and all(h in self.index_values for h in value.host):
            return [self.index_values[h] for h in value.host]
        return None

    def dim(self, value: TValue, d: int) -> str:
        """Dim ``d`` of ``value`` as a host ``index`` scalar (a constant if static)."""
        if value.dims[d] is not None:
            return self.index_const(value.dims[d])
        ssa = self._fresh("d")
        self.lines.append(
            f'{ssa} = "tensor.extract"({self.shape_of(value)}, {self.index_const(d)}) : '
            f"(tensor<{value.rank}xindex>, index) -> index {self._loc()}"
        )
        return ssa

    def shape_from(self, extents: list[str]) -> str:
        """A ``tensor<Nxindex>`` shape from host ``index`` scalars."""
        ssa = self._fresh("s")
        types = ", ".join("index" for _ in extents)
        self.lines.append(
            f'{ssa} = "tensor.from_elements"({", ".join(extents)}) : ({types}) -> '
            f"tensor<{len(extents)}xindex> {self._loc()}"
        )
        return ssa

    def divide_index(self, total: str, divisor: str) -> str:
        """``arith.divui`` of two host ``index`` scalars."""
        ssa = self._fresh("q")
        self.lines.append(
            f'{ssa} = "arith.divui"({total}, {divisor}) : (index, index) -> index {self._loc()}'
        )
        return ssa

    def dims_product(self, value: TValue, dims) -> str:
        """The product of the given dims of ``value`` as a host ``index`` scalar."""
        total = self.index_const(1)
        for d in dims:
            total = self.multiply_index(total, self.dim(value, d))
        return total

    def element_count(self, value: TValue) -> str:
        """The number of elements of ``value`` as a host ``index`` scalar."""
        return self.dims_product(value, range(value.rank))

    def require_equal_extents(self, shapes: list[str], rank: int) -> None:
        """``shape.cstr_eq`` of shape tensors of the same rank (checked by the host)."""
        types = ", ".join(f"tensor<{rank}xindex>" for _ in shapes)
        self.lines.append(
            f'{self._fresh("w")} = "shape.cstr_eq"({", ".join(shapes)}) : ({types}) -> '
            f"!shape.witness {self._loc()}"
        )

    def multiply_index(self, a: str, b: str) -> str:
        """``arith.muli`` of two host ``index`` scalars."""
        ssa = self._fresh("n")
        self.lines.append(f'{ssa} = "arith.muli"({a}, {b}) : (index, index) -> index {self._loc()}')
        return ssa

    def require_equal_dims(self, x: TValue, i: int, y: TValue, j: int) -> None:
        """The host checks dim ``i`` of ``x`` equals dim ``j`` of ``y``."""
        self.require_equal_extents(
            [self.shape_from([self.dim(x, i)]), self.shape_from([self.dim(y, j)])], 1)

    def transpose(self, value: TValue, perm: list[int]) -> TValue:
        """``stablehlo.transpose``: result dim i is operand dim ``perm[i]``."""
        dims = tuple(value.dims[p] for p in perm)
        attr = "permutation = array<i64" + (": " + ", ".join(map(str, perm)) if perm else "") + ">"
        return self.op("transpose", [value], value.elem, dims, attr)

    def dynamic_reshape(self, value: TValue, extents: list[str], dims: tuple) -> TValue:
        """``stablehlo.dynamic_reshape`` of ``value`` to the host scalars ``extents``
        (``dims``: the result's static dims where known)."""
        shape = self.shape_from(extents)
        result = TValue(self._fresh(), value.elem, tuple(dims))
        self.lines.append(
            f'{result.ssa} = "stablehlo.dynamic_reshape"({value.ssa}, {shape}) : '
            f"({value.type}, tensor<{len(extents)}xindex>) -> {result.type} {self._loc()}"
        )
        return result

    def num_elements(self, value: TValue, dims: list[int], elem: str,
                     at_least: int = 0) -> TValue:
        """Product of the given dims of ``value`` as a rank-0 tensor of ``elem`` (or
        ``at_least``, where the product is smaller)."""
        total = self.dims_product(value, dims)
        if at_least:
            total = self.index_arith("maxsi", total, self.index_const(at_least))
        return self.index_scalar(total, elem)

    def index_scalar(self, index: str, elem: str) -> TValue:
        """The host ``index`` scalar ``index`` as a rank-0 tensor of ``elem``."""
        wide = self._fresh("n")
        self.lines.append(f'{wide} = "arith.index_cast"({index}) : (index) -> i64 {self._loc()}')
        scalar = wide
        if elem.startswith(("f", "bf")):
            scalar = self._fresh("n")
            self.lines.append(f'{scalar} = "arith.sitofp"({wide}) : (i64) -> {elem} {self._loc()}')
        elif elem != "i64":
            scalar = self._fresh("n")
            self.lines.append(f'{scalar} = "arith.trunci"({wide}) : (i64) -> {elem} {self._loc()}')
        result = TValue(self._fresh(), elem, ())
        self.lines.append(
            f'{result.ssa} = "tensor.from_elements"({scalar}) : ({elem}) -> {result.type} {self._loc()}'
        )
        return result

    def reduce(self, value: TValue, init: TValue, combiner: str, dims: list[int]) -> TValue:
        """``stablehlo.reduce`` of ``value`` over ``dims`` with a scalar combiner op."""
        kept = tuple(d for i, d in enumerate(value.dims) if i not in dims)
        result = TValue(self._fresh(), value.elem, kept)
        scalar = f"tensor<{value.elem}>"
        self.lines.append(
            f'{result.ssa} = "stablehlo.reduce"({value.ssa}, {init.ssa}) ({{\n'
            f"    ^bb0(%lhs: {scalar}, %rhs: {scalar}):\n"
            f'      %acc = "stablehlo.{combiner}"(%lhs, %rhs) : ({scalar}, {scalar}) -> {scalar}\n'
            f'      "stablehlo.return"(%acc) : ({scalar}) -> ()\n'
            f"    }}) {{dimensions = array<i64: {', '.join(map(str, dims))}>}} : "
            f"({value.type}, {scalar}) -> {result.type} {self._loc()}"
        )
        return result

    def reduce_window(self, value: TValue, init: TValue, combiner: str, window: str) -> TValue:
        """``stablehlo.reduce_window`` (no padding) with a one-op combiner;
        ``window``: its window_dimensions/window_strides attributes."""
        result = TValue(self._fresh(), value.elem, (value.dims[0],) + (None,) * 2 + value.dims[3:])
        scalar = f"tensor<{value.elem}>"
        self.lines.append(
            f'{result.ssa} = "stablehlo.reduce_window"({value.ssa}, {init.ssa}) ({{\n'
            f"    ^bb0(%lhs: {scalar}, %rhs: {scalar}):\n"
            f'      %acc = "stablehlo.{combiner}"(%lhs, %rhs) : ({scalar}, {scalar}) -> {scalar}\n'
            f'      "stablehlo.return"(%acc) : ({scalar}) -> ()\n'
            f"    }}) {{{window}}} : ({value.type}, {scalar}) -> {result.type} {self._loc()}"
        )
        return result

    def arg_reduce(self, value: TValue, axis: int, direction: str, index_elem: str,
                   init: str) -> TValue:
        """ArgMax/ArgMin: a two-operand ``stablehlo.reduce`` of (value, iota) along
        ``axis`` keeping the first extreme element; returns the index result.
        ``init`` is the literal of the value's identity (-inf for max)."""
        shape = self.shape_of(value)
        iota = TValue(self._fresh(), index_elem, value.dims)
        self.lines.append(
            f'{iota.ssa} = "stablehlo.dynamic_iota"({shape}) {{iota_dimension = {axis} : i64}} : '
            f"(tensor<{value.rank}xindex>) -> {iota.type} {self._loc()}")
        init_v = self.constant(f"dense<{init}>", value.elem, ())
        init_i = self.constant("dense<0>", index_elem, ())
        kept = tuple(d for i, d in enumerate(value.dims) if i != axis)
        out_v, out_i = TValue("", value.elem, kept), TValue("", index_elem, kept)
        sv, si = f"tensor<{value.elem}>", f"tensor<{index_elem}>"
        cmp = "GT" if direction == "max" else "LT"
        name = self._fresh("r")
        self.lines.append(
            f'{name}:2 = "stablehlo.reduce"({value.ssa}, {iota.ssa}, {init_v.ssa}, {init_i.ssa}) ({{\n'
            f"    ^bb0(%a: {sv}, %ai: {si}, %b: {sv}, %bi: {si}):\n"
            f'      %better = "stablehlo.compare"(%a, %b) {{comparison_direction = '
            f"#stablehlo<comparison_direction {cmp}>}} : ({sv}, {sv}) -> tensor<i1>\n"
            f'      %same = "stablehlo.compare"(%a, %b) {{comparison_direction = '
            f"#stablehlo<comparison_direction EQ>}} : ({sv}, {sv}) -> tensor<i1>\n"
            f'      %first = "stablehlo.compare"(%ai, %bi) {{comparison_direction = '
            f"#stablehlo<comparison_direction LT>}} : ({si}, {si}) -> tensor<i1>\n"
            f'      %tie = "stablehlo.and"(%same, %first) : (tensor<i1>, tensor<i1>) -> tensor<i1>\n'
            f'      %take = "stablehlo.or"(%better, %tie) : (tensor<i1>, tensor<i1>) -> tensor<i1>\n'
            f'      %v = "stablehlo.select"(%take, %a, %b) : (tensor<i1>, {sv}, {sv}) -> {sv}\n'
            f'      %i = "stablehlo.select"(%take, %ai, %bi) : (tensor<i1>, {si}, {si}) -> {si}\n'
            f'      "stablehlo.return"(%v, %i) : ({sv}, {si}) -> ()\n'
            f"    }}) {{dimensions = array<i64: {axis}>, disc.arg_direction = \"{direction}\"}} : "
            f"({value.type}, {iota.type}, {sv}, {si}) -> ({out_v.type}, {out_i.type}) {self._loc()}"
        )
        return TValue(f"{name}#1", index_elem, kept)

    def numpy_broadcast(self, values: list[TValue]) -> list[TValue]:
        """Brings operands to their common (numpy-broadcast) shape."""
        if len({v.ssa for v in values}) == 1:
            return values
        shape, rank = self.broadcast_shapes(values)
        static = _static_broadcast(values, rank)
        return [
            self.broadcast_to(v, shape, rank, list(range(rank - v.rank, rank)), static)
            for v in values
        ]

    def module(self, args: list[TValue], results: list[TValue]) -> str:
        """The finished module text."""
        params = ", ".join(f"{a.ssa}: {a.type}" for a in args)
        rtypes = ", ".join(r.type for r in results)
        body = "\n".join("    " + line for line in self.lines)
        ret = ", ".join(r.ssa for r in results)
        return (
            "module {\n"
            f"  func.func @main({params}) -> ({rtypes}) {{\n"
            f"{body}\n"
            f'    "func.return"({ret}) : ({rtypes}) -> ()\n'
            "  }\n"
            "}\n"
        )
