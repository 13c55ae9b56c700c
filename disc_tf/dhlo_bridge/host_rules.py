"""Host shape computation: TF ops on small integer tensors evaluated by the host runner.

Models compute shape operands in-graph (``tf.shape(x)[0] * 8``, Tensordot's
``Shape -> GatherV2 -> Prod -> Pack -> Reshape``). When every operand of such an
op is known to the host (a constant, a dim, or another host value), the op is
lowered to ``index`` arithmetic on host scalars instead of a kernel: the result
keeps its scalars (``TValue.host``) for shape consumers (Reshape, Fill, Slice...)
and is also materialised as a tensor for any other consumer.

``try_host`` is consulted before the ordinary rule of every node.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf
from tensorflow.core.framework import node_def_pb2

from disc_tf.dhlo_bridge.builder import DhloBuilder, TValue
from disc_tf.dhlo_bridge.types import MLIR_TYPE
from disc_tf.ops.table import ALL_TYPES, tf_op

HostRule = Callable[[DhloBuilder, node_def_pb2.NodeDef, list[TValue]], list[TValue] | None]
_HOST_RULES: dict[str, HostRule] = {}

_INT = ("i32", "i64")
_FLOAT = ("f16", "bf16", "f32", "f64")

#: TF binary ops on host integers -> ``arith`` op on ``index`` scalars.
_ARITH = {"Mul": "muli", "Add": "addi", "AddV2": "addi", "Sub": "subi",
          "Maximum": "maxsi", "Minimum": "minsi", "FloorDiv": "floordivsi"}


def host_rule(*op_types: str) -> Callable[[HostRule], HostRule]:
    """Registers a host evaluation for each TF op type given."""

    def wrap(rule: HostRule) -> HostRule:
        for op in op_types:
            _HOST_RULES[op] = rule
        return rule

    return wrap


def host_ops() -> list[str]:
    """TF op types that can be evaluated on the host."""
    return sorted(_HOST_RULES)


def try_host(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue] | None:
    """The node evaluated on the host, or None if its operands are not all host values
    (then the ordinary lowering rule applies)."""
    rule = _HOST_RULES.get(node.op)
    return None if rule is None else rule(b, node, xs)


def _elements(b: DhloBuilder, x: TValue) -> list[str] | None:
    if x.elem not in _INT or x.rank > 1:
        return None
    return b.host_elements(x)


def _out_elem(node: node_def_pb2.NodeDef, attr: str = "T") -> str:
    return MLIR_TYPE[tf.as_dtype(node.attr[attr].type)]


# Shape queries read dims, never data: free on the host, always evaluated there.
@tf_op("Shape", "ShapeN", dtypes=ALL_TYPES, trivial=True)
@host_rule("Shape", "ShapeN")
def _shape(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    elem = _out_elem(node, "out_type")
    return [b.host_tensor([b.dim(x, d) for d in range(x.rank)], elem, 1) for x in xs]


@tf_op("Size", dtypes=ALL_TYPES, trivial=True)
@host_rule("Size")
def _size(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    return [b.host_tensor([b.element_count(xs[0])], _out_elem(node, "out_type"), 0)]


@tf_op("Rank", dtypes=ALL_TYPES, trivial=True)
@host_rule("Rank")
def _rank(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    return [b.host_tensor([b.index_const(xs[0].rank)], "i32", 0)]


@host_rule(*_ARITH)
def _binary(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue] | None:
    lhs, rhs = (_elements(b, x) for x in xs)
    if lhs is None or rhs is None:
        return None
    if len(lhs) != len(rhs) and 1 not in (len(lhs), len(rhs)):
        return None
    n = max(len(lhs), len(rhs))
    if n > 1 or xs[0].rank == 1 or xs[1].rank == 1:
        lhs = lhs * n if len(lhs) == 1 else lhs
        rhs = rhs * n if len(rhs) == 1 else rhs
    op = _ARITH[node.op]
    if op == "floordivsi" and any(b.index_values.get(r) in (None, 0) for r in rhs):
        return None  # a divisor that may be zero: TF's error, not ours
    out = [b.index_arith(op, x, y) for x, y in zip(lhs, rhs)]
    return [b.host_tensor(out, xs[0].elem, max(xs[0].rank, xs[1].rank))]


@host_rule("Neg")
def _neg(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue] | None:
    elems = _elements(b, xs[0])
    if elems is None:
        return None
    zero = b.index_const(0)
    return [b.host_tensor([b.index_arith("subi", zero, e) for e in elems], xs[0].elem,
                          xs[0].rank)]


@host_rule("Identity", "StopGradient", "Snapshot", "Cast")
def _identity(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue] | None:
    elem = _out_elem(node, "DstT") if node.op == "Cast" else xs[0].elem
    elems = _elements(b, xs[0])
    if elems is None:
        return None
    if elem not in _INT:
        return _int_to_float(b, elems, elem) if xs[0].rank == 0 and elem in _FLOAT else None
    return [b.host_tensor(elems, elem, xs[0].rank)]


def _int_to_float(b: DhloBuilder, elems: list[str], elem: str) -> list[TValue]:
    """A host integer scalar cast to float: converted from its i64 tensor, and kept
    as ``b.exact_ints`` for a float Range's bounds."""
    result = b.op("convert", [b.host_tensor(elems, "i64", 0)], elem, ())
    b.exact_ints[result.ssa] = elems[0]
    return [result]


@host_rule("Reshape", "ExpandDims", "Squeeze")
def _reshape(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue] | None:
    x = xs[0]
    elems = _elements(b, x)
    if elems is None:
        return None
    if node.op == "Reshape":
        shape = b.known_ints(xs[1])
        if shape is None or len(shape) > 1 or (shape and shape[0] not in (-1, len(elems))):
            return None
        rank = len(shape)
    elif node.op == "ExpandDims":
        if x.rank != 0:
            return None
        rank = 1
    else:
        rank = 0
    if rank == 0 and len(elems) != 1:
        return None
    return [b.host_tensor(elems, x.elem, rank)]


@host_rule("Pack")
def _pack(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue] | None:
    if any(x.rank != 0 for x in xs) or node.attr["axis"].i not in (0, -1):
        return None
    elems = [_elements(b, x) for x in xs]
    if any(e is None for e in elems):
        return None
    return [b.host_tensor([e[0] for e in elems], xs[0].elem, 1)]


@host_rule("ConcatV2")
def _concat(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue] | None:
    *parts, axis = xs
    if b.known_ints(axis) not in ([0], [-1]) or any(p.rank != 1 for p in parts):
        return None
    elems = [_elements(b, p) for p in parts]
    if any(e is None for e in elems):
        return None
    return [b.host_tensor([s for e in elems for s in e], parts[0].elem, 1)]


@host_rule("GatherV2")
def _gather(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue] | None:
    params, indices, axis = xs
    elems = _elements(b, params)
    picks = b.known_ints(indices)
    if (elems is None or picks is None or indices.rank > 1
            or b.known_ints(axis) not in ([0], [-1]) or node.attr["batch_dims"].i != 0):
        return None
    if any(not -len(elems) <= i < len(elems) for i in picks) or any(i < 0 for i in picks):
        return None  # out of range: TF's error
    return [b.host_tensor([elems[i] for i in picks], params.elem, indices.rank)]


def _strided_slice_1d(node: node_def_pb2.NodeDef, n: int, begin: int, end: int,
                      stride: int) -> tuple[list[int], bool] | None:
    """Element positions a rank-1 StridedSlice picks, and whether it shrinks to rank 0."""
    attr = node.attr
    if attr["ellipsis_mask"].i or attr["new_axis_mask"].i or stride == 0:
        return None
    if attr["shrink_axis_mask"].i & 1:
        i = begin + n if begin < 0 else begin
        return ([i], True) if 0 <= i < n else None
    start = None if attr["begin_mask"].i & 1 else begin
    stop = None if attr["end_mask"].i & 1 else end
    return list(range(n))[slice(start, stop, stride)], False


@host_rule("StridedSlice")
def _strided_slice(b: DhloBuilder, node: node_def_pb2.NodeDef,
                   xs: list[TValue]) -> list[TValue] | None:
    x, *bounds = xs
    elems = _elements(b, x)
    known = [b.known_ints(v) for v in bounds]
    if elems is None or x.rank != 1 or any(k is None or len(k) != 1 for k in known):
        return None
    picked = _strided_slice_1d(node, len(elems), known[0][0], known[1][0], known[2][0])
    if picked is None:
        return None
    positions, shrink = picked
    return [b.host_tensor([elems[i] for i in positions], x.elem, 0 if shrink else 1)]


@host_rule("Prod", "Sum", "Max", "Min")
def _reduce(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue] | None:
    x, axes = xs
    elems = _elements(b, x)
    axes_known = b.known_ints(axes)
    if elems is None or axes_known is None:
        return None
    keep = node.attr["keep_dims"].b
    if x.rank == 0 or not axes_known:
        return [b.host_tensor(elems, x.elem, x.rank)]
    if any(a not in (0, -1) for a in axes_known):
        return None
    op = {"Prod": "muli", "Sum": "addi", "Max": "maxsi", "Min": "minsi"}[node.op]
    if not elems:
        if node.op in ("Max", "Min"):
            return None
        total = b.index_const(1 if node.op == "Prod" else 0)
    else:
        total = elems[0]
        for e in elems[1:]:
            total = b.index_arith(op, total, e)
    return [b.host_tensor([total], x.elem, 1 if keep else 0)]
