"""Symbolic-dim analysis: every dim is a symbol; collect what is provably equal.

Symbols are integers. Constants are symbols too (one per value). A union-find
records proven equalities: operands of an elementwise op, shapes checked equal
on the host, a broadcast result that one operand already absorbs. Every symbol
is *defined* once for the host runner (an input dim, a constant, or a checked
broadcast of other symbols); equalities never replace definitions, they only
let the fusion planner reason.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import math

from disc_tf.fusion.dhlo_reader import DFunc
from disc_tf.fusion.symbols import AffineForms, HostScalar, ShapeCheck, ShapeError, SymbolTable, SymDef
from disc_tf.ops import elementwise


@dataclasses.dataclass
class BroadcastInfo:
    """A dynamic_broadcast_in_dim seen by the analysis.

    ``expand[i]`` for operand dim i: "no" (proven equal to the result dim),
    "yes" (operand dim is 1, result dim not known to be 1) or "maybe".
    """

    dims: list[int]
    expand: list[str]
    result_rank: int
    operand_syms: list[int]
    result_syms: list[int]

    @property
    def is_identity(self) -> bool:
        """True if the broadcast provably copies its operand."""
        return all(e == "no" for e in self.expand) and self.dims == list(range(self.result_rank))


@dataclasses.dataclass
class ConvInfo:
    """A 2-D NHWC convolution: padding symbols (h low, h high, w low, w high),
    strides, dilations, feature groups, and the symbol kh * kw * in_channels."""

    pads: list[int]
    strides: list[int]
    dilations: list[int]
    groups: int
    patch: int


@dataclasses.dataclass
class ShapeAnalysis:
    """The result: dims of every tensor value, symbol table, checks, broadcasts."""

    symbols: SymbolTable
    value_dims: dict[str, list[int]]
    checks: list[ShapeCheck]
    broadcasts: dict[str, BroadcastInfo]  # keyed by the broadcast's result value
    #: rank-0 tensors whose value the host computes from dims (e.g. a Mean's count)
    host_values: dict[str, HostScalar] = dataclasses.field(default_factory=dict)
    #: rank-1 tensors whose elements the host computes (e.g. a tf.shape result)
    host_arrays: dict[str, list[HostScalar]] = dataclasses.field(default_factory=dict)
    #: shape operands (``tensor<Nxindex>`` values) as symbols, e.g. slice starts
    extents: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    #: each convolution's padding and geometry, keyed by its result
    convs: dict[str, ConvInfo] = dataclasses.field(default_factory=dict)
    #: (operand dims, result dims) of each reshape: equal element counts
    numel_facts: list[tuple[list[int], list[int]]] = dataclasses.field(default_factory=list)

    def shape_class(self, value: str) -> tuple[int, ...]:
        """The dims of ``value`` as class representatives."""
        return tuple(self.symbols.find(s) for s in self.value_dims[value])

    def describe(self) -> str:
        """Printable summary: classes, value shapes, checks."""
        lines = ["# symbol classes", self.symbols.describe(), "# value shapes"]
        for v, dims in self.value_dims.items():
            lines.append(f"{v}: [" + ", ".join(f"s{self.symbols.find(d)}" for d in dims) + "]")
        lines.append("# equal element counts")
        for a, b in self.numel_facts:
            lines.append(" * ".join(f"s{s}" for s in a) + " == " + " * ".join(f"s{s}" for s in b))
        lines.append("# host checks")
        lines.extend(str(c) for c in self.checks)
        return "\n".join(lines)


#: DHLO ops whose result has their operands' shape (the op table's elementwise ops)
_ELEMENTWISE_SAME_SHAPE = elementwise.names()


def analyze(func: DFunc) -> ShapeAnalysis:
    """Runs the analysis over ``func`` in program order."""
    syms = SymbolTable()
    dims: dict[str, list[int]] = {}
    extents: dict[str, list[int]] = {}  # shape values (tensor<Nxindex>)
    checks: list[ShapeCheck] = []
    broadcasts: dict[str, BroadcastInfo] = {}

    for i, (_, shape) in enumerate(func.args):
        dims[f"%arg{i}"] = [
            syms.new(SymDef("arg", arg=(i, d))) if n is None else syms.const(n)
            for d, n in enumerate(shape)
        ]

    scalars: dict[str, HostScalar] = {}
    host_values: dict[str, HostScalar] = {}
    numel_facts: list[tuple[list[int], list[int]]] = []
    quotients: dict[str, int] = {}  # index scalar -> divisor it was computed with
    multiple_of: dict[str, int] = {}  # shape value -> divisor of one of its extents
    expr_syms: dict[tuple, int] = {}

    def folded(h: HostScalar) -> HostScalar:
        """``h`` with its constant symbols moved into the factor."""
        consts = [syms.constant_value(s) for s in h.symbols]
        factor = h.factor * math.prod(c for c in consts if c is not None)
        return HostScalar(tuple(s for s, c in zip(h.symbols, consts) if c is None), factor,
                          h.divisor)

    def as_symbol(value: str) -> int:
        return scalar_symbol(scalars[value])

    def scalar_symbol(h: HostScalar) -> int:
        h = folded(h)
        if not h.symbols:
            return syms.const(h.factor // h.divisor)
        if h.divisor == 1 and h.factor == 1 and len(h.symbols) == 1:
            return h.symbols[0]
        key = (tuple(sorted(syms.find(s) for s in h.symbols)), h.factor, h.divisor)
        if key not in expr_syms:
            expr_syms[key] = syms.new(SymDef("expr", scalar=h))
        return expr_syms[key]

    arith_syms: dict[tuple, int] = {}
    affine = AffineForms(syms)
    convs: dict[str, ConvInfo] = {}
    predicates: dict[str, tuple[str, str, str]] = {}  # i1 value -> (predicate, a, b)
    required: set[tuple] = set()  # (predicate, a, b) classes of "require" checks made
    host_arrays: dict[str, list[HostScalar]] = {}

    def arith(op_name: str, operands: list[str]) -> HostScalar:
        """The host scalar of an ``arith`` op on index scalars, as a new symbol."""
        parts = [as_symbol(v) for v in operands]
        return HostScalar((arith_symbol(op_name, parts),))

    def arith_symbol(op_name: str, parts: list[int]) -> int:
        """The symbol of ``op_name(parts)``: folded, simplified or interned."""
        values = [syms.constant_value(p) for p in parts]
        if None not in values:
            folded_value = _fold(op_name, values)
            if folded_value is not None:
                return syms.const(folded_value)
        form = affine.of(op_name, parts)
        if form is not None and (same := affine.existing(form)) is not None:
            return same
        simpler = _simplify(syms, op_name, parts, values)
        if simpler is not None:
            return simpler
        key = (op_name, tuple(syms.find(p) for p in parts))
        if key not in arith_syms:
            arith_syms[key] = syms.new(SymDef("arith", components=parts, op=op_name))
            if form is not None:
                affine.record(arith_syms[key], form)
        return arith_syms[key]

    def nonnegative(out: list[int], tf_node: str) -> None:
        """A host check that dims computed by arithmetic are not negative."""
        if any(syms.defs[d].kind == "arith" for d in out):
            checks.append(ShapeCheck("nonnegative", [], list(out), tf_node))

    for op in func.ops:
        kind = op.name
        if kind == "arith.constant":
            scalars[op.results[0]] = HostScalar((), op.index_value)
        elif kind == "tensor.extract":
            scalars[op.results[0]] = HostScalar((extents[op.operands[0]][scalars[op.operands[1]].factor],))
        elif kind == "arith.muli" and all(scalars[v].divisor == 1 for v in op.operands):
            scalars[op.results[0]] = scalars[op.operands[0]].times(scalars[op.operands[1]])
        elif kind in ("arith.addi", "arith.subi", "arith.muli", "arith.floordivsi",
                      "arith.ceildivsi", "arith.maxsi", "arith.minsi", "arith.remsi"):
            scalars[op.results[0]] = arith(kind.split(".")[1], op.operands)
        elif kind == "arith.cmpi":
            pred = _PREDICATES[int(op.attrs["predicate"].split(":")[0].strip())]
            predicates[op.results[0]] = (pred, op.operands[0], op.operands[1])
        elif kind == "shape.cstr_require":
            pred, a, b = predicates[op.operands[0]]
            pair = [as_symbol(a), as_symbol(b)]
            key = (pred, *(syms.find(s) for s in pair))
            values = [syms.constant_value(s) for s in pair]
            if key not in required and (None in values or not _compare(pred, *values)):
                required.add(key)
                checks.append(ShapeCheck("require", [], pair, op.tf_node, predicate=pred,
                                         message=op.attrs["msg"].strip('"')))
        elif kind == "arith.select":
            pred, a, b = predicates[op.operands[0]]
            scalars[op.results[0]] = arith(f"select_{pred}", [a, b, op.operands[1], op.operands[2]])
        elif kind == "arith.divui":
            divisor = scalars[op.operands[1]]
            scalars[op.results[0]] = folded(scalars[op.operands[0]]).divided(divisor)
            quotients[op.results[0]] = divisor.factor
        elif kind in ("arith.index_cast", "arith.sitofp", "arith.trunci"):
            scalars[op.results[0]] = scalars[op.operands[0]]
        elif kind == "tensor.from_elements":
            if op.result_types[0][0] == "index":
                extents[op.results[0]] = [as_symbol(v) for v in op.operands]
                for v in op.operands:
                    if v in quotients:
                        multiple_of[op.results[0]] = quotients[v]
            elif op.result_types[0][1] == ():
                host_values[op.results[0]] = scalars[op.operands[0]]
                dims[op.results[0]] = []
            else:
                host_arrays[op.results[0]] = [scalars[v] for v in op.operands]
                dims[op.results[0]] = [syms.const(n) for n in op.result_types[0][1]]
        elif kind == "stablehlo.reduce":
            reduced = set(op.reduce_dims)
            for r in op.results:
                dims[r] = [d for i, d in enumerate(dims[op.operands[0]]) if i not in reduced]
        elif kind == "stablehlo.constant":
            dims[op.results[0]] = [syms.const(n) for n in op.result_types[0][1]]
        elif kind == "shape.shape_of":
            extents[op.results[0]] = list(dims[op.operands[0]])
        elif kind == "shape.broadcast":
            shapes = [extents[o] for o in op.operands]
            result, needs_check = _broadcast_extents(syms, shapes)
            extents[op.results[0]] = result
            if needs_check:
                checks.append(ShapeCheck("broadcast", shapes, result, op.tf_node))
        elif kind == "shape.cstr_eq":
            shapes = [extents[o] for o in op.operands]
            if any(not syms.same(a, b) for s in shapes[1:] for a, b in zip(shapes[0], s)):
                checks.append(ShapeCheck("equal", shapes, shapes[0], op.tf_node))
            for s in shapes[1:]:
                for a, b in zip(shapes[0], s):
                    syms.union(a, b)
        elif kind == "stablehlo.dynamic_broadcast_in_dim":
            operand = dims[op.operands[0]]
            out = list(extents[op.operands[1]])
            dims[op.results[0]] = out
            nonnegative(out, op.tf_node)
            info = _broadcast_info(syms, operand, out, list(op.broadcast_dims))
            broadcasts[op.results[0]] = info
            # StableHLO requires each operand dim to be 1 or the result dim;
            # unless a broadcast symbol already implies it, the host checks.
            unproven = [i for i, (d, e) in enumerate(zip(info.dims, info.expand))
                        if e == "maybe" and not syms.absorbed(out[d], operand[i])]
            if unproven:
                checks.append(ShapeCheck("expand", [operand], out, op.tf_node,
                                         dims=[(i, info.dims[i]) for i in unproven]))
        elif kind == "stablehlo.transpose":
            operand = dims[op.operands[0]]
            dims[op.results[0]] = [operand[p] for p in op.permutation]
        elif kind == "stablehlo.dynamic_reshape":
            operand = list(dims[op.operands[0]])
            out = list(extents[op.operands[1]])
            dims[op.results[0]] = out
            nonnegative(out, op.tf_node)
            numel_facts.append((operand, out))
            if not _same_count(syms, operand, out):
                checks.append(ShapeCheck("reshape", [operand], out, op.tf_node,
                                         multiple_of=multiple_of.get(op.operands[1])))
        elif kind == "stablehlo.real_dynamic_slice":
            operand = dims[op.operands[0]]
            start, limit, stride = (extents[v] for v in op.operands[1:])
            out = [arith_symbol("ceildivsi", [arith_symbol("subi", [hi, lo]), st])
                   for lo, hi, st in zip(start, limit, stride)]
            dims[op.results[0]] = out
            if not all(_slice_proven(syms, lo, hi, d) for lo, hi, d in zip(start, limit, operand)):
                checks.append(ShapeCheck("slice", [start, limit, operand], out, op.tf_node))
        elif kind == "stablehlo.concatenate":
            axis = op.int_attr("dimension")
            parts = [dims[v] for v in op.operands]
            first = list(parts[0])
            others = [[d for i, d in enumerate(p) if i != axis] for p in parts]
            if any(not syms.same(a, b) for o in others[1:] for a, b in zip(others[0], o)):
                checks.append(ShapeCheck("equal", others, others[0], op.tf_node))
            for o in others[1:]:
                for a, b in zip(others[0], o):
                    syms.union(a, b)
            total = parts[0][axis]
            for p in parts[1:]:
                total = arith_symbol("addi", [total, p[axis]])
            first[axis] = total
            dims[op.results[0]] = first
        elif kind == "stablehlo.dynamic_pad":
            operand = dims[op.operands[0]]
            low, high, interior = (extents[v] for v in op.operands[2:])
            out = []
            for d, lo, hi, inner in zip(operand, low, high, interior):
                size = d
                if syms.constant_value(inner) != 0:
                    gaps = arith_symbol("muli", [arith_symbol(
                        "maxsi", [arith_symbol("subi", [d, syms.const(1)]), syms.const(0)]), inner])
                    size = arith_symbol("addi", [size, gaps])
                out.append(arith_symbol("addi", [arith_symbol("addi", [lo, size]), hi]))
            dims[op.results[0]] = out
            nonnegative(out, op.tf_node)
        elif kind == "stablehlo.dynamic_iota":
            dims[op.results[0]] = list(extents[op.operands[0]])
            nonnegative(dims[op.results[0]], op.tf_node)
        elif kind == "stablehlo.torch_index_select":
            params, indices = dims[op.operands[0]], dims[op.operands[1]]
            axis, batch = op.int_attr("dim"), op.int_attr("batch_dims")
            for i in range(batch):
                if not syms.same(params[i], indices[i]):
                    checks.append(ShapeCheck("equal", [params[:batch], indices[:batch]],
                                             params[:batch], op.tf_node))
                    break
            for i in range(batch):
                syms.union(params[i], indices[i])
            dims[op.results[0]] = params[:axis] + indices[batch:] + params[axis + 1:]
        elif kind == "stablehlo.dynamic_conv":
            x, w = dims[op.operands[0]], dims[op.operands[1]]
            pads = [scalar_symbol(h) for h in host_arrays[op.operands[2]]]
            strides, dilations = op.ints_attr("window_strides"), op.ints_attr("rhs_dilation")
            groups = op.int_attr("feature_group_count")
            out = [x[0]]
            for i in range(2):
                span = syms.const((syms.constant_value(w[i]) - 1) * dilations[i] + 1)
                padded = arith_symbol("addi", [arith_symbol("addi", [x[1 + i], pads[2 * i]]),
                                               pads[2 * i + 1]])
                out.append(arith_symbol("addi", [arith_symbol("floordivsi", [
                    arith_symbol("subi", [padded, span]), syms.const(strides[i])]), syms.const(1)]))
            out.append(w[3])
            if groups == 1:
                syms.union(x[3], w[2])
            dims[op.results[0]] = out
            nonnegative(out, op.tf_node)
            convs[op.results[0]] = ConvInfo(
                pads=pads, strides=strides, dilations=dilations, groups=groups,
                patch=arith_symbol("muli", [arith_symbol("muli", [w[0], w[1]]), w[2]]))
        elif kind == "stablehlo.reduce_window":
            x = dims[op.operands[0]]
            window, strides = op.ints_attr("window_dimensions"), op.ints_attr("window_strides")
            dims[op.results[0]] = [
                d if (k, s) == (1, 1) else arith_symbol("addi", [arith_symbol("floordivsi", [
                    arith_symbol("subi", [d, syms.const(k)]), syms.const(s)]), syms.const(1)])
                for d, k, s in zip(x, window, strides)]
            nonnegative(dims[op.results[0]], op.tf_node)
        elif kind == "stablehlo.dot_general":
            dims[op.results[0]] = _dot_general(syms, checks, op, dims[op.operands[0]],
                                               dims[op.operands[1]])
        elif kind == "stablehlo.convert" and op.operands[0] in host_values:
            # A host scalar converted: still a host scalar, read by kernels as a value.
            host_values[op.results[0]] = host_values[op.operands[0]]
            dims[op.results[0]] = []
        elif kind.split(".", 1)[-1] in _ELEMENTWISE_SAME_SHAPE:
            first = dims[op.operands[0]]
            for other in op.operands[1:]:
                for a, b in zip(first, dims[other]):
                    syms.union(a, b)
            dims[op.results[0]] = list(first)
        elif kind == "stablehlo.reverse":
            dims[op.results[0]] = list(dims[op.operands[0]])
        elif kind == "stablehlo.custom_call" and "mirror_pad" in op.attrs["call_target_name"]:
            low, high = ([scalar_symbol(h) for h in host_arrays[v]] for v in op.operands[1:])
            extents[op.operands[1]], extents[op.operands[2]] = low, high
            dims[op.results[0]] = [arith_symbol("addi", [arith_symbol("addi", [lo, d]), hi])
                                   for lo, d, hi in zip(low, dims[op.operands[0]], high)]
        elif kind == "stablehlo.custom_call":  # disc.scan: same shape as its operand
            dims[op.results[0]] = list(dims[op.operands[0]])
        elif kind == "stablehlo.dynamic_gather":
            params, indices = dims[op.operands[0]], dims[op.operands[1]]
            depth = syms.constant_value(indices[-1])
            dims[op.results[0]] = indices[:-1] + params[depth:]
        elif kind == "shape.cstr_broadcastable":
            continue
        else:
            raise ShapeError(f"shape analysis does not know {kind}")
    return ShapeAnalysis(syms, dims, checks, broadcasts, host_values=host_values,
                         numel_facts=numel_facts, host_arrays=host_arrays, extents=extents,
                         convs=convs)


_PREDICATES = {0: "eq", 1: "ne", 2: "slt", 3: "sle", 4: "sgt", 5: "sge"}


def _simplify(syms: SymbolTable, op: str, parts: list[int], values: list) -> int | None:
    """An existing symbol equal to ``op(parts)`` by algebra, if one is evident."""
    if len(parts) != 2:
        return None
    a, b = parts
    va, vb = values
    if op in ("addi", "subi") and vb == 0 or op in ("muli", "floordivsi", "ceildivsi") and vb == 1:
        return a
    if op in ("addi", "muli") and va == (0 if op == "addi" else 1):
        return b
    if op in ("maxsi", "minsi") and syms.same(a, b):
        return a
    # A dim is never negative: max(d, 0) = d, min(d, 0) = 0 (TF's slice clamping).
    for x, vy in ((a, vb), (b, va)):
        if vy == 0 and _is_dim(syms, x):
            return x if op == "maxsi" else syms.const(0) if op == "minsi" else None
    if op == "subi":
        if syms.same(a, b):
            return syms.const(0)
        d = syms.defs[syms.find(a)]
        if d.kind == "arith" and d.op == "addi":
            x, y = d.components
            if syms.same(x, b):
                return y
            if syms.same(y, b):
                return x
    return None


def _is_dim(syms: SymbolTable, s: int) -> bool:
    """True if ``s`` is a tensor dim (of an input, or a broadcast of dims): >= 0."""
    return any(syms.defs[x].kind in ("arg", "broadcast") for x in (s, syms.find(s)))


def _slice_proven(syms: SymbolTable, lo: int, hi: int, dim: int) -> bool:
    """True if ``0 <= lo <= hi <= dim`` is evident from constants and symbols."""
    vl, vh, vd = (syms.constant_value(x) for x in (lo, hi, dim))
    if vl is not None and vh is not None and vd is not None:
        return 0 <= vl <= vh <= vd
    return vl == 0 and syms.same(hi, dim)


def _compare(predicate: str, a: int, b: int) -> bool:
    """``a <predicate> b`` for an ``arith.cmpi`` predicate name (slt, sge, ...)."""
    return {"eq": a == b, "ne": a != b, "slt": a < b, "sle": a <= b, "sgt": a > b,
            "sge": a >= b}[predicate]


def _fold(op: str, values: list[int]) -> int | None:
    """Compile-time value of an arith symbol over constants (None if undefined)."""
    if op.startswith("select_"):
        a, b, c, d = values
        return c if _compare(op[len("select_"):], a, b) else d
    x, y = values
    if op in ("floordivsi", "ceildivsi", "remsi") and y == 0:
        return None
    return {"addi": x + y, "subi": x - y, "muli": x * y,
            "floordivsi": x // y if y else 0, "ceildivsi": -(-x // y) if y else 0,
            "maxsi": max(x, y), "minsi": min(x, y),
            "remsi": int(math.fmod(x, y)) if y else 0}[op]


def _count(syms: SymbolTable, dims: list[int]) -> tuple[int, collections.Counter]:
    """An element count as (constant factor, multiset of unknown symbol classes);
    exact quotient-free expressions are expanded into their factors."""
    factor, unknown = 1, collections.Counter()
    stack = list(dims)
    while stack:
        s = stack.pop()
        value = syms.constant_value(s)
        if value is not None:
            factor *= value
        elif syms.defs[s].kind == "expr" and syms.defs[s].scalar.divisor == 1:
            factor *= syms.defs[s].scalar.factor
            stack.extend(syms.defs[s].scalar.symbols)
        else:
            unknown[syms.find(s)] += 1
    return factor, unknown


def _same_count(syms: SymbolTable, a: list[int], b: list[int]) -> bool:
    """True if the element counts of shapes a and b are proven equal."""
    fa, ua = _count(syms, a)
    fb, ub = _count(syms, b)
    return (fa == 0 and fb == 0) or (fa, ua) == (fb, ub)


def _dot_general(syms: SymbolTable, checks: list[ShapeCheck], op, lhs: list[int],
                 rhs: list[int]) -> list[int]:
    """Result dims (batch, lhs free, rhs free); batch and contracting dims pairwise equal.

    TF checks those equalities only when the op runs, so unless they are proven
    the host runner checks them (as TF's "Matrix size-incompatible" error).
    """
    dd = op.dot_dims
    pairs = list(zip(dd["lhs_batch"], dd["rhs_batch"])) + list(
        zip(dd["lhs_contract"], dd["rhs_contract"]))
    unproven = [(i, j) for i, j in pairs if not syms.same(lhs[i], rhs[j])]
    if unproven:
        checks.append(ShapeCheck("matmul", [list(lhs), list(rhs)], [], op.tf_node,
                                 dims=unproven))
    for i, j in pairs:
        syms.union(lhs[i], rhs[j])
    used_l = set(dd["lhs_batch"]) | set(dd["lhs_contract"])
    used_r = set(dd["rhs_batch"]) | set(dd["rhs_contract"])
    return ([lhs[i] for i in dd["lhs_batch"]]
            + [d for i, d in enumerate(lhs) if i not in used_l]
            + [d for i, d in enumerate(rhs) if i not in used_r])


def _broadcast_info(syms: SymbolTable, operand: list[int], out: list[int],
                    dims: list[int]) -> BroadcastInfo:
    expand = []
    for i, d in enumerate(dims):
        if syms.same(operand[i], out[d]):
            expand.append("no")
        elif syms.constant_value(operand[i]) == 1:
            expand.append("yes")
        else:
            expand.append("maybe")
    return BroadcastInfo(dims, expand, len(out), list(operand), list(out))


def speculate_no_broadcast(analysis: ShapeAnalysis) -> tuple[ShapeAnalysis, list[int]] | None:
    """The analysis under the assumption that no unknown dim is broadcast.

    Every ``broadcast(a, b, ...)`` symbol is assumed equal to all its
    components (the common case in serving: operands have the same shape).
    Returns the speculative analysis and the broadcast symbols whose
    components the host runner must find equal before using it; None if
    there is nothing to speculate on.
    """
    table = analysis.symbols
    speculated = [s for s, d in enumerate(table.defs) if d.kind == "broadcast"]
    if not speculated:
        return None
    spec = copy.deepcopy(table)
    for s in speculated:
        for c in table.defs[s].components:
            spec.union(s, c)
    broadcasts = {
        v: _broadcast_info(spec, b.operand_syms, b.result_syms, b.dims)
        for v, b in analysis.broadcasts.items()
    }
    return (dataclasses.replace(analysis, symbols=spec, broadcasts=broadcasts),
            speculated)


def _broadcast_extents(syms: SymbolTable, shapes: list[list[int]]) -> tuple[list[int], bool]:
    """Numpy broadcast of symbolic shapes; new symbols where not provable."""
    rank = max(len(s) for s in shapes)
    result = []
    needs_check = False
    for pos in range(rank):
        comps = []
        for s in shapes:
            k = pos - (rank - len(s))
            if k >= 0:
                comps.append(s[k])
        # Drop size-1 constants, then components another component absorbs.
        nontrivial = [c for c in comps if syms.constant_value(c) != 1] or comps[:1]
        kept: list[int] = []
        for c in nontrivial:
            if any(syms.absorbed(k, c) for k in kept):
                continue
            kept = [k for k in kept if not syms.absorbed(c, k)] + [c]
        consts = {syms.constant_value(c) for c in kept} - {None}
        if len(consts) > 1:
            raise ShapeError(f"incompatible static dims {sorted(consts)}")
        if len(kept) == 1:
            result.append(kept[0])
        else:
            result.append(syms.new(SymDef("broadcast", components=kept)))
            needs_check = True
    return result, needs_check
