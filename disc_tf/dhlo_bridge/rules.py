"""Lowering rules of the op table: one function per TF op type (or family), each
defining its ops' entries with ``tf_op`` (support and lowering in one place).

A rule receives the builder, the TF NodeDef and its operands (already DHLO
values) and returns the node's outputs as DHLO values. TF ops that are exactly
one DHLO elementwise op are one line each in ``disc_tf.ops.elementwise``.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import node_def_pb2

from disc_tf.dhlo_bridge.builder import DhloBuilder, TValue
from disc_tf.dhlo_bridge.types import MLIR_TYPE, LoweringError, dense_literal  # noqa: F401 - LoweringError is part of this API
from disc_tf.ops import table
from disc_tf.ops.table import (
    ALL_TYPES,
    BOOL_TYPES,
    FLOAT_TYPES,
    INT_TYPES,
    LAYOUT_TYPES,
    NUMERIC_TYPES,
    REDUCE_TYPES,
    tf_op,
)


def rule_for(op_type: str) -> table.Rule:
    """The lowering rule of ``op_type``; raises LoweringError naming supported ops."""
    entry = table.lookup(op_type)
    if entry is None or entry.lower is None:
        raise LoweringError(f"no DHLO lowering for TF op {op_type}; supported: {lowered_ops()}")
    return entry.lower


def lowered_ops() -> list[str]:
    """TF op types that have a lowering."""
    return [op for op in table.supported_ops() if table.lookup(op).lower is not None]


_COMPARE = {
    "Equal": "EQ", "NotEqual": "NE", "Less": "LT", "LessEqual": "LE",
    "Greater": "GT", "GreaterEqual": "GE",
}


def _elementwise(b: DhloBuilder, name: str, operands: list[TValue], elem: str | None = None,
                 attrs: str = "") -> TValue:
    operands = b.numpy_broadcast(operands)
    first = operands[0]
    return b.op(name, operands, elem or first.elem, first.dims, attrs)


@tf_op("Square", dtypes=NUMERIC_TYPES)
def _square(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    return [b.op("multiply", [xs[0], xs[0]], xs[0].elem, xs[0].dims)]


def _scalar(b: DhloBuilder, value: float, elem: str) -> TValue:
    return b.constant(dense_literal(np.array(value), elem), elem, ())


@tf_op("Relu", dtypes=NUMERIC_TYPES)
def _relu(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    x = xs[0]
    zero = b.broadcast_to(_scalar(b, 0, x.elem), b.shape_of(x), x.rank, [])
    return [b.op("maximum", [x, zero], x.elem, x.dims)]


@tf_op("Equal", "NotEqual", dtypes=ALL_TYPES)
@tf_op("Less", "LessEqual", "Greater", "GreaterEqual", dtypes=NUMERIC_TYPES)
def _compare(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    attr = f"comparison_direction = #stablehlo<comparison_direction {_COMPARE[node.op]}>"
    return [_elementwise(b, "compare", xs, elem="i1", attrs=attr)]


@tf_op("SelectV2", dtypes=ALL_TYPES)
def _select_v2(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    ops = b.numpy_broadcast(xs)
    return [b.op("select", ops, ops[1].elem, ops[1].dims)]


@tf_op("Select", dtypes=ALL_TYPES)
def _select(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    cond, then, other = xs
    b.require_equal_shapes([then, other])
    if cond.rank == then.rank:
        b.require_equal_shapes([cond, then])
    elif cond.rank == 1:
        # TF's Select picks whole rows of then/else with a vector condition.
        cond = b.broadcast_to(cond, b.shape_of(then), then.rank, [0])
    else:
        raise LoweringError(
            f"Select {node.name}: condition rank {cond.rank} vs operand rank {then.rank}"
        )
    return [b.op("select", [cond, then, other], then.elem, then.dims)]


@tf_op("Cast", dtypes=ALL_TYPES, dtype_attr="SrcT")
def _cast(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    dst = MLIR_TYPE[tf.as_dtype(node.attr["DstT"].type)]
    return [b.op("convert", xs, dst, xs[0].dims)]


@tf_op("Const", dtypes=ALL_TYPES, dtype_attr="dtype", trivial=True)
def _const(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    value = tf.make_ndarray(node.attr["value"].tensor)
    elem = MLIR_TYPE[tf.as_dtype(node.attr["dtype"].type)]
    return [b.constant(dense_literal(value, elem), elem, tuple(value.shape), value)]


def _like(b: DhloBuilder, x: TValue, value: float, elem: str | None = None) -> TValue:
    """A tensor of x's shape filled with ``value``."""
    elem = elem or x.elem
    return b.broadcast_to(_scalar(b, value, elem), b.shape_of(x), x.rank, [])


@tf_op("Identity", "StopGradient", "Snapshot", dtypes=ALL_TYPES, trivial=True)
def _identity(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    # A same-type convert: free inside a fused kernel, a copy if it is all there is.
    return [b.op("convert", xs, xs[0].elem, xs[0].dims)]


@tf_op("IdentityN", dtypes=(), dtype_attr="", trivial=True)
def _identity_n(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    # Keras' custom-gradient activations wrap (result, inputs) in one IdentityN; the
    # gradient function it names matters only to training. Every output is its input.
    return [b.op("convert", [x], x.elem, x.dims) for x in xs]


@tf_op("ZerosLike", "OnesLike", dtypes=ALL_TYPES)
def _fill_like(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    value = 0 if node.op == "ZerosLike" else 1
    filled = _like(b, xs[0], value)
    return [b.op("convert", [filled], filled.elem, filled.dims)]


@tf_op("IsNan", dtypes=FLOAT_TYPES)
def _is_nan(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    attr = "comparison_direction = #stablehlo<comparison_direction NE>"
    return [b.op("compare", [xs[0], xs[0]], "i1", xs[0].dims, attr)]


@tf_op("IsFinite", dtypes=FLOAT_TYPES)
def _is_finite(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    return [b.op("is_finite", xs, "i1", xs[0].dims)]


@tf_op("Reciprocal", "Inv", dtypes=FLOAT_TYPES)
def _reciprocal(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    return [b.op("divide", [_like(b, xs[0], 1), xs[0]], xs[0].elem, xs[0].dims)]


@tf_op("SquaredDifference", dtypes=NUMERIC_TYPES)
def _squared_difference(b: DhloBuilder, node: node_def_pb2.NodeDef,
                        xs: list[TValue]) -> list[TValue]:
    d = _elementwise(b, "subtract", xs)
    return [b.op("multiply", [d, d], d.elem, d.dims)]


def _select(b: DhloBuilder, pred: TValue, x: TValue, y: TValue) -> TValue:
    return b.op("select", [pred, x, y], x.elem, x.dims)


def _compare(b: DhloBuilder, x: TValue, y: TValue, direction: str) -> TValue:
    attr = f"comparison_direction = #stablehlo<comparison_direction {direction}>"
    return b.op("compare", [x, y], "i1", x.dims, attr)


@tf_op("Relu6", dtypes=NUMERIC_TYPES)
def _relu6(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    x = xs[0]
    low = b.op("maximum", [x, _like(b, x, 0)], x.elem, x.dims)
    return [b.op("minimum", [low, _like(b, x, 6)], x.elem, x.dims)]


@tf_op("LeakyRelu", dtypes=FLOAT_TYPES)
def _leaky_relu(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    x = xs[0]
    alpha = node.attr["alpha"].f if "alpha" in node.attr else 0.2
    scaled = b.op("multiply", [x, _like(b, x, alpha)], x.elem, x.dims)
    return [_select(b, _compare(b, x, _like(b, x, 0), "GT"), x, scaled)]


def _exp_minus_one(b: DhloBuilder, x: TValue) -> TValue:
    # TF's Elu/Selu compute exp(x) - 1 (not expm1); match them.
    e = b.op("exponential", [x], x.elem, x.dims)
    return b.op("subtract", [e, _like(b, x, 1)], x.elem, x.dims)


@tf_op("Elu", dtypes=FLOAT_TYPES)
def _elu(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    x = xs[0]
    return [_select(b, _compare(b, x, _like(b, x, 0), "LT"), _exp_minus_one(b, x), x)]


_SELU_SCALE = 1.0507009873554804934193349852946
_SELU_ALPHA = 1.6732632423543772848170429916717


@tf_op("Selu", dtypes=FLOAT_TYPES)
def _selu(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    x = xs[0]
    neg = b.op("multiply", [_exp_minus_one(b, x), _like(b, x, _SELU_SCALE * _SELU_ALPHA)],
               x.elem, x.dims)
    pos = b.op("multiply", [x, _like(b, x, _SELU_SCALE)], x.elem, x.dims)
    return [_select(b, _compare(b, x, _like(b, x, 0), "LT"), neg, pos)]


@tf_op("Softplus", dtypes=FLOAT_TYPES)
def _softplus(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    # TF: x if x > -t, exp(x) if x < t, else log1p(exp(x)), t = log(eps) + 2.
    x = xs[0]
    eps = float(np.finfo(np.float16 if x.elem == "f16" else np.float32).eps)
    t = float(np.log(eps) + 2.0)
    e = b.op("exponential", [x], x.elem, x.dims)
    soft = b.op("log_plus_one", [e], x.elem, x.dims)
    small = _select(b, _compare(b, x, _like(b, x, t), "LT"), e, soft)
    return [_select(b, _compare(b, x, _like(b, x, -t), "GT"), x, small)]


@tf_op("Softsign", dtypes=FLOAT_TYPES)
def _softsign(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    x = xs[0]
    a = b.op("abs", [x], x.elem, x.dims)
    d = b.op("add", [a, _like(b, x, 1)], x.elem, x.dims)
    return [b.op("divide", [x, d], x.elem, x.dims)]


@tf_op("FloorDiv", dtypes=FLOAT_TYPES, host_dtypes=INT_TYPES)
def _floor_div(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    q = _elementwise(b, "divide", xs)
    return [b.op("floor", [q], q.elem, q.dims)]


@tf_op("FloorMod", dtypes=FLOAT_TYPES)
def _floor_mod(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    # Python-style modulo: the result takes the divisor's sign.
    x, y = b.numpy_broadcast(xs)
    r = b.op("remainder", [x, y], x.elem, x.dims)
    zero = _like(b, r, 0)
    fix = b.op("and", [_compare(b, r, zero, "NE"),
                      b.op("compare", [_compare(b, r, zero, "LT"), _compare(b, y, zero, "LT")],
                           "i1", x.dims,
                           "comparison_direction = #stablehlo<comparison_direction NE>")],
               "i1", x.dims)
    return [_select(b, fix, b.op("add", [r, y], x.elem, x.dims), r)]


@tf_op("BiasAdd", dtypes=NUMERIC_TYPES)
def _bias_add(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    x, bias = xs
    channels_first = node.attr["data_format"].s == b"NCHW" if "data_format" in node.attr else False
    dim = 1 if channels_first and x.rank > 2 else x.rank - 1
    wide = b.broadcast_to(bias, b.shape_of(x), x.rank, [dim])
    return [b.op("add", [x, wide], x.elem, x.dims)]


@tf_op("AddN", dtypes=NUMERIC_TYPES)
def _add_n(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    if len(xs) > 1:
        b.require_equal_shapes(xs)
    total = xs[0]
    for x in xs[1:]:
        total = b.op("add", [total, x], total.elem, total.dims)
    if len(xs) == 1:
        total = b.op("convert", [total], total.elem, total.dims)
    return [total]


@tf_op("ClipByValue", dtypes=NUMERIC_TYPES)
def _clip(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    t, lo, hi = xs
    low = _elementwise(b, "maximum", [t, lo])
    return [_elementwise(b, "minimum", [low, hi])]


def _const_axes(b: DhloBuilder, node: node_def_pb2.NodeDef, axes: TValue, rank: int) -> list[int]:
    known = b.known_ints(axes)
    if known is None:
        raise LoweringError(f"{node.op} {node.name}: reduction axes must be a constant")
    result = []
    for a in known:
        if not -max(rank, 1) <= a < max(rank, 1):
            raise LoweringError(f"{node.op} {node.name}: axis {a} out of range for rank {rank}")
        if rank and a % rank not in result:
            result.append(a % rank)
    return sorted(result)


_REDUCE = {"Sum": "add", "Mean": "add", "Prod": "multiply", "Max": "maximum",
           "Min": "minimum", "All": "and", "Any": "or"}


def _init(op: str, elem: str) -> float:
    if op in ("Sum", "Mean", "Any"):
        return 0
    if op in ("Prod", "All"):
        return 1
    big = {"f32": np.inf, "f16": np.inf, "bf16": np.inf, "i32": 2**31 - 1, "i64": 2**63 - 1}[elem]
    return -big - (0 if elem.startswith(("f", "bf")) else 1) if op == "Max" else big


def _keep_dims(b: DhloBuilder, x: TValue, reduced: TValue, axes: list[int]) -> TValue:
    """Re-inserts the reduced axes as size-1 dims (keep_dims=True)."""
    extents = [b.index_const(1) if d in axes else b.dim(x, d) for d in range(x.rank)]
    kept = [d for d in range(x.rank) if d not in axes]
    return b.broadcast_to(reduced, b.shape_from(extents), x.rank, kept)


def reduce_tf(b: DhloBuilder, op: str, x: TValue, axes: list[int], keep_dims: bool) -> TValue:
    """A TF reduction (Sum/Mean/Prod/Max/Min/All/Any) of ``x`` over ``axes``."""
    if op == "Mean" and axes and x.elem in ("f16", "bf16", "i32"):
        # The sum of a long half-type row overflows (f16 holds up to 65504) although
        # its mean does not: sum and divide in float, round once (TF returns NaN). An
        # int32 mean sums and divides in int64, as TF's does (its sum may not fit).
        wide = b.op("convert", [x], "i64" if x.elem == "i32" else "f32", x.dims)
        r = reduce_tf(b, op, wide, axes, keep_dims)
        return b.op("convert", [r], x.elem, r.dims)
    init = _scalar(b, _init(op, x.elem), x.elem)
    r = b.reduce(x, init, _REDUCE[op], axes) if axes else b.op("convert", [x], x.elem, x.dims)
    if op == "Mean" and axes:
        # An integer mean of no elements is 0 (TF fills an empty reduction with its
        # reducer's identity): 0 / 1, where 0 / 0 is an integer division by zero.
        integer = x.elem in ("i32", "i64")
        count = b.num_elements(x, axes, x.elem, at_least=1 if integer else 0)
        r = b.op("divide", [r, b.broadcast_to(count, b.shape_of(r), r.rank, [])], r.elem, r.dims)
    if keep_dims and axes:
        r = _keep_dims(b, x, r, axes)
    return r


@tf_op("Sum", "Mean", "Max", "Min", dtypes=REDUCE_TYPES, const_inputs=(1,))
@tf_op("Prod", dtypes=REDUCE_TYPES - {tf.bfloat16}, const_inputs=(1,))
@tf_op("All", "Any", dtypes=BOOL_TYPES, dtype_attr="", const_inputs=(1,))
def _reduction(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    x, axes = xs
    keep = node.attr["keep_dims"].b if "keep_dims" in node.attr else False
    return [reduce_tf(b, node.op, x, _const_axes(b, node, axes, x.rank), keep)]


@tf_op("Softmax", "LogSoftmax", dtypes=FLOAT_TYPES)
def _softmax(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    x = xs[0]
    last = [x.rank - 1]
    shifted = _elementwise(b, "subtract", [x, reduce_tf(b, "Max", x, last, True)])
    e = b.op("exponential", [shifted], x.elem, x.dims)
    total = reduce_tf(b, "Sum", e, last, True)
    if node.op == "Softmax":
        # As TF's own kernel: e times the reciprocal of its row sum, so one
        # divide per row rather than per element.
        inverse = b.op("divide", [_like(b, total, 1), total], total.elem, total.dims)
        return [_elementwise(b, "multiply", [e, inverse])]
    return [_elementwise(b, "subtract", [shifted, b.op("log", [total], x.elem, total.dims)])]


def _flag(node: node_def_pb2.NodeDef, name: str) -> bool:
    return node.attr[name].b if name in node.attr else False


@tf_op("MatMul", dtypes=FLOAT_TYPES)  # f16/bf16 multiplied in f32
def _matmul(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    x, y = xs
    # Transposed operands are expressed by which dim contracts, never by a transpose.
    lhs_contract = 0 if _flag(node, "transpose_a") else 1
    rhs_contract = 1 if _flag(node, "transpose_b") else 0
    return [b.dot_general(x, y, 0, lhs_contract, rhs_contract)]


def _batch_to(b: DhloBuilder, x: TValue, batch: tuple[str, int] | None) -> TValue:
    """``x`` ([..., r, c]) broadcast to the batch dims ``batch`` followed by its last two."""
    if batch is None:
        return x
    shape, nb = batch
    extents = [b.extract(shape, nb, i) for i in range(nb)]
    extents += [b.dim(x, x.rank - 2), b.dim(x, x.rank - 1)]
    own = x.rank - 2
    dims = list(range(nb - own, nb + 2))
    return b.broadcast_to(x, b.shape_from(extents), nb + 2, dims)


@tf_op("BatchMatMulV2", dtypes=FLOAT_TYPES)
def _batch_matmul(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    x, y = xs
    if x.rank < 2 or y.rank < 2:
        raise LoweringError(f"BatchMatMulV2 {node.name}: operands must have rank >= 2")
    adj_x, adj_y = _flag(node, "adj_x"), _flag(node, "adj_y")
    rhs_contract_2d = 1 if adj_y else 0
    if y.rank == 2 and not adj_x:
        # [..., m, k] x [k, n]: the batch dims of x are free dims of one product.
        return [b.dot_general(x, y, 0, x.rank - 1, rhs_contract_2d)]
    nbx, nby = x.rank - 2, y.rank - 2
    batch = None
    if nbx or nby:
        parts = []
        for v, nbv in ((x, nbx), (y, nby)):
            if nbv:
                parts.append((b.shape_from([b.dim(v, d) for d in range(nbv)]), nbv))
        batch = parts[0] if len(parts) == 1 else b.broadcast_extents(parts)
    x, y = _batch_to(b, x, batch), _batch_to(b, y, batch)
    nb = x.rank - 2
    lhs_contract = nb if adj_x else nb + 1
    rhs_contract = nb + 1 if adj_y else nb
    return [b.dot_general(x, y, nb, lhs_contract, rhs_contract)]


def _const_ints(b: DhloBuilder, node: node_def_pb2.NodeDef, value: TValue, what: str) -> list[int]:
    known = b.known_ints(value)
    if known is None:
        raise LoweringError(f"{node.op} {node.name}: {what} must be a constant")
    return known


@tf_op("Transpose", dtypes=LAYOUT_TYPES, const_inputs=(1,))
def _transpose(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    x, perm_value = xs
    perm = _const_ints(b, node, perm_value, "the permutation")
    if sorted(perm) != list(range(x.rank)):
        raise LoweringError(f"Transpose {node.name}: {perm} is not a permutation of rank {x.rank}")
    return [b.transpose(x, perm)]


def _static_count(x: TValue) -> int | None:
    return None if None in x.dims else int(np.prod(x.dims, dtype=np.int64))


def host_shape(b: DhloBuilder, node: node_def_pb2.NodeDef, value: TValue, what: str) -> list[str]:
    """The host ``index`` scalars of a shape operand (constant or computed from dims)."""
    elems = b.host_elements(value)
    if elems is None or value.rank > 1:
        raise LoweringError(f"{node.op} {node.name}: {what} must be computable on the host")
    return elems


def _inferred_dim(b: DhloBuilder, x: TValue, others: list[str]) -> str:
    """A Reshape's -1 entry from host-computed other entries, as TF infers it: the
    element count over their product, except that when one of them is 0, zero
    dims are left out of both products (so [0, -1] of a [0, 3, 3] input is 9)."""
    one, zero = b.index_const(1), b.index_const(0)
    product, product_nz, input_nz = one, one, one
    for e in others:
        product = b.index_arith("muli", product, e)
        product_nz = b.index_arith("muli", product_nz, b.index_select("eq", e, zero, one, e))
    for d in range(x.rank):
        n = b.dim(x, d)
        input_nz = b.index_arith("muli", input_nz, b.index_select("eq", n, zero, one, n))
    regular = b.index_arith("floordivsi", b.element_count(x), product)
    with_zero = b.index_arith("floordivsi", input_nz, product_nz)
    return b.index_select("eq", product, zero, with_zero, regular)


# Reshape-like ops move no data (a view of a dense buffer): no work of their own.
@tf_op("Reshape", dtypes=LAYOUT_TYPES, trivial=True, shape_inputs=(1,))
def _reshape(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    x, shape_value = xs
    extents = host_shape(b, node, shape_value, "the shape")
    shape = [b.index_values.get(e) for e in extents]  # None: computed on the host
    if any(s is not None and s < -1 for s in shape) or shape.count(-1) > 1:
        raise LoweringError(f"Reshape {node.name}: invalid shape {shape}")
    dims = [s if s != -1 else None for s in shape]
    if -1 in shape:
        i = shape.index(-1)
        others = [e for k, e in enumerate(extents) if k != i]
        known = [s for k, s in enumerate(shape) if k != i]
        if None not in known:
            total = int(np.prod(known, dtype=np.int64))
            if total == 0:
                # TF refuses to infer a dim next to a zero; leave that to TF.
                raise LoweringError(f"Reshape {node.name}: -1 next to a zero-size dim in {shape}")
            # The -1 entry: element count / product of the other entries. The host
            # runner checks the division is exact (element counts must match).
            extents[i] = b.divide_index(b.element_count(x), b.index_const(total))
            count = _static_count(x)
            if count is not None and count % total == 0:
                dims[i] = count // total
        else:
            extents[i] = _inferred_dim(b, x, others)
    return [b.dynamic_reshape(x, extents, tuple(dims))]


@tf_op("ExpandDims", dtypes=LAYOUT_TYPES, trivial=True, const_inputs=(1,))
def _expand_dims(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    x, axis_value = xs
    axis = _const_ints(b, node, axis_value, "the axis")
    if len(axis) != 1 or not -x.rank - 1 <= axis[0] <= x.rank:
        raise LoweringError(f"ExpandDims {node.name}: axis {axis} invalid for rank {x.rank}")
    a = axis[0] + x.rank + 1 if axis[0] < 0 else axis[0]
    extents = [b.dim(x, d) for d in range(x.rank)]
    extents.insert(a, b.index_const(1))
    dims = list(x.dims)
    dims.insert(a, 1)
    return [b.dynamic_reshape(x, extents, tuple(dims))]


@tf_op("Squeeze", dtypes=LAYOUT_TYPES, trivial=True)
def _squeeze(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    x = xs[0]
    listed = list(node.attr["squeeze_dims"].list.i) if "squeeze_dims" in node.attr else []
    if listed:
        if any(not -x.rank <= d < x.rank for d in listed):
            raise LoweringError(f"Squeeze {node.name}: dims {listed} invalid for rank {x.rank}")
        squeezed = sorted({d % x.rank for d in listed})
    else:
        # Without squeeze_dims only dims known to be 1 can be squeezed.
        if None in x.dims:
            raise LoweringError(f"Squeeze {node.name}: no squeeze_dims and dims {x.dims} "
                                "are not all static")
        squeezed = [d for d in range(x.rank) if x.dims[d] == 1]
    if any(x.dims[d] not in (None, 1) for d in squeezed):
        raise LoweringError(f"Squeeze {node.name}: dims {squeezed} of {x.dims} are not 1")
    dynamic = [d for d in squeezed if x.dims[d] is None]
    if dynamic:
        # The host checks that every squeezed dynamic dim is 1.
        b.require_equal_extents([b.shape_from([b.dim(x, d) for d in dynamic]),
                                 b.shape_from([b.index_const(1) for _ in dynamic])],
                                len(dynamic))
    kept = [d for d in range(x.rank) if d not in squeezed]
    return [b.dynamic_reshape(x, [b.dim(x, d) for d in kept], tuple(x.dims[d] for d in kept))]


def _insert_unit_dim(b: DhloBuilder, x: TValue, at: int) -> TValue:
    """``x`` reshaped with a dim of size 1 inserted before dim ``at``."""
    extents = [b.dim(x, d) for d in range(x.rank)]
    extents.insert(at, b.index_const(1))
    return b.dynamic_reshape(x, extents, x.dims[:at] + (1,) + x.dims[at:])


def _merge_dims(b: DhloBuilder, x: TValue, groups: list[list[int]]) -> TValue:
    """Reshapes ``x`` so that each group of adjacent dims becomes one dim."""
    if all(len(g) == 1 for g in groups):
        return x
    extents, dims = [], []
    for g in groups:
        total = b.dim(x, g[0])
        for d in g[1:]:
            total = b.multiply_index(total, b.dim(x, d))
        extents.append(total)
        sizes = [x.dims[d] for d in g]
        dims.append(None if None in sizes else int(np.prod(sizes, dtype=np.int64)))
    return b.dynamic_reshape(x, extents, tuple(dims))


def einsum_parts(equation: str) -> tuple[str, str, str] | None:
    """(lhs, rhs, out) letters of a two-operand einsum disc_tf lowers, else None.

    Supported: no ellipsis, no letter twice in one operand, every output letter
    in an input, and every dropped letter in both inputs: a contraction (one
    GEMM), or with no dropped letter an outer or elementwise product (rotary
    embeddings' ``ab,c->abc``).
    """
    eq = equation.replace(" ", "")
    if "..." in eq or "->" not in eq:
        return None
    ins, out = eq.split("->")
    parts = ins.split(",")
    if len(parts) != 2:
        return None
    lhs, rhs = parts
    if any(len(set(p)) != len(p) for p in (lhs, rhs, out)):
        return None
    if not set(out) <= set(lhs) | set(rhs):
        return None
    dropped = (set(lhs) | set(rhs)) - set(out)
    if not dropped <= set(lhs) & set(rhs):
        return None
    return lhs, rhs, out


def _einsum_product(b: DhloBuilder, node: node_def_pb2.NodeDef, x: TValue, y: TValue,
                    lhs: str, rhs: str, out: str) -> TValue:
    """An einsum without contraction: each side transposed to the output's letter
    order and broadcast to the output, then multiplied (letters in both sides must
    agree in size: the host checks)."""
    sides = []
    for v, letters in ((x, lhs), (y, rhs)):
        order = [c for c in out if c in letters]
        if list(letters) != order:
            v = b.transpose(v, [letters.index(c) for c in order])
        sides.append((v, order))
    for c in set(lhs) & set(rhs):
        b.require_equal_dims(sides[0][0], sides[0][1].index(c), sides[1][0], sides[1][1].index(c))
    extents, dims = [], []
    for c in out:
        v, order = sides[0] if c in lhs else sides[1]
        extents.append(b.dim(v, order.index(c)))
        dims.append(v.dims[order.index(c)])
    shape = b.shape_from(extents)
    wide = [b.broadcast_to(v, shape, len(out), [out.index(c) for c in order], tuple(dims))
            for v, order in sides]
    return b.op("multiply", wide, x.elem, tuple(dims))


def _einsum_check(node) -> str | None:
    eq = node.attr["equation"].s.decode()
    return None if einsum_parts(eq) else f"einsum equation {eq!r} not supported"


@tf_op("Einsum", dtypes=FLOAT_TYPES, check=_einsum_check)
def _einsum(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    """Two-operand einsum as one batched GEMM: transpose each side to
    [batch, free, contract] / [batch, contract, free], merge the contracted (and
    rhs free) dims, dot_general, split, transpose to the output order."""
    parts = einsum_parts(node.attr["equation"].s.decode())
    if parts is None or len(xs) != 2:
        raise LoweringError(f"Einsum {node.name}: unsupported equation")
    lhs_l, rhs_l, out_l = parts
    x, y = xs
    if set(out_l) == set(lhs_l) | set(rhs_l):  # nothing contracted
        return [_einsum_product(b, node, x, y, lhs_l, rhs_l, out_l)]
    batch = [c for c in out_l if c in lhs_l and c in rhs_l]
    contract = [c for c in lhs_l if c in rhs_l and c not in out_l]
    lfree = [c for c in out_l if c in lhs_l and c not in rhs_l]
    rfree = [c for c in out_l if c in rhs_l and c not in lhs_l]
    x_order = batch + lfree + contract
    y_order = batch + contract + rfree
    xt = x if list(lhs_l) == x_order else b.transpose(x, [lhs_l.index(c) for c in x_order])
    yt = y if list(rhs_l) == y_order else b.transpose(y, [rhs_l.index(c) for c in y_order])
    nb, nc = len(batch), len(contract)
    # Both sides must agree on the contracted (and batch) sizes; TF checks this too.
    for c in contract + batch:
        b.require_equal_dims(xt, x_order.index(c), yt, y_order.index(c))
    # A side without free dims (a matrix-vector or dot product) gets a unit free dim,
    # dropped from the product again.
    if not lfree:
        xt = _insert_unit_dim(b, xt, nb)
    if not rfree:
        yt = _insert_unit_dim(b, yt, yt.rank)
    nl, nr = max(len(lfree), 1), max(len(rfree), 1)
    xg = _merge_dims(b, xt, [[i] for i in range(nb + nl)] + [list(range(nb + nl, nb + nl + nc))])
    yg = _merge_dims(b, yt, [[i] for i in range(nb)] + [list(range(nb, nb + nc)),
                                                        list(range(nb + nc, nb + nc + nr))])
    prod = b.dot_general(xg, yg, nb, nb + nl, nb)
    if len(rfree) > 1 or not lfree or not rfree:
        kept = [i for i in range(nb)] + ([nb + i for i in range(nl)] if lfree else [])
        extents = [b.dim(prod, i) for i in kept] + [b.dim(yt, nb + nc + j)
                                                    for j in range(len(rfree))]
        dims = tuple(prod.dims[i] for i in kept) + tuple(yt.dims[nb + nc:nb + nc + len(rfree)])
        prod = b.dynamic_reshape(prod, extents, dims)
    order = batch + lfree + rfree
    if order == list(out_l):
        return [prod]
    return [b.transpose(prod, [order.index(c) for c in out_l])]
