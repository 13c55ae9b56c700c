"""Lowering rules: one function per TF op type, registered by decorator.

A rule receives the builder, the TF NodeDef and its operands (already DHLO
values) and returns the node's outputs as DHLO values. The op names here are
the ones in ``disc_tf.cluster.op_registry``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import node_def_pb2

from disc_tf.dhlo_bridge.builder import DhloBuilder, TValue
from disc_tf.dhlo_bridge.types import MLIR_TYPE, dense_literal

Rule = Callable[[DhloBuilder, node_def_pb2.NodeDef, list[TValue]], list[TValue]]
_RULES: dict[str, Rule] = {}


class LoweringError(ValueError):
    """A TF node that has no (valid) DHLO lowering."""


def register(*op_types: str) -> Callable[[Rule], Rule]:
    """Registers a rule for each TF op type given."""

    def wrap(rule: Rule) -> Rule:
        for op in op_types:
            _RULES[op] = rule
        return rule

    return wrap


def rule_for(op_type: str) -> Rule:
    """The rule for ``op_type``; raises LoweringError naming supported ops."""
    if op_type not in _RULES:
        raise LoweringError(f"no DHLO lowering for TF op {op_type}; supported: {sorted(_RULES)}")
    return _RULES[op_type]


def lowered_ops() -> list[str]:
    """TF op types that have a lowering."""
    return sorted(_RULES)


_BINARY = {
    "Add": "add", "AddV2": "add", "Sub": "subtract", "Mul": "multiply",
    "RealDiv": "divide", "Maximum": "maximum", "Minimum": "minimum", "Pow": "power",
    "LogicalAnd": "and", "LogicalOr": "or",
}
_UNARY = {
    "Neg": "negate", "Abs": "abs", "Exp": "exponential", "Log": "log", "Tanh": "tanh",
    "Sigmoid": "logistic", "Rsqrt": "rsqrt", "Sqrt": "sqrt", "LogicalNot": "not",
}
_COMPARE = {
    "Equal": "EQ", "NotEqual": "NE", "Less": "LT", "LessEqual": "LE",
    "Greater": "GT", "GreaterEqual": "GE",
}


def _elementwise(b: DhloBuilder, name: str, operands: list[TValue], elem: str | None = None,
                 attrs: str = "") -> TValue:
    operands = b.numpy_broadcast(operands)
    first = operands[0]
    return b.op(name, operands, elem or first.elem, first.dims, attrs)


@register(*_BINARY)
def _binary(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    return [_elementwise(b, _BINARY[node.op], xs)]


@register(*_UNARY)
def _unary(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    return [b.op(_UNARY[node.op], xs, xs[0].elem, xs[0].dims)]


@register("Square")
def _square(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    return [b.op("multiply", [xs[0], xs[0]], xs[0].elem, xs[0].dims)]


def _scalar(b: DhloBuilder, value: float, elem: str) -> TValue:
    return b.constant(dense_literal(np.array(value), elem), elem, ())


@register("Relu")
def _relu(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    x = xs[0]
    zero = b.broadcast_to(_scalar(b, 0, x.elem), b.shape_of(x), x.rank, [])
    return [b.op("maximum", [x, zero], x.elem, x.dims)]


@register(*_COMPARE)
def _compare(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    attr = f"comparison_direction = #stablehlo<comparison_direction {_COMPARE[node.op]}>"
    return [_elementwise(b, "compare", xs, elem="i1", attrs=attr)]


@register("SelectV2")
def _select_v2(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    ops = b.numpy_broadcast(xs)
    return [b.op("select", ops, ops[1].elem, ops[1].dims)]


@register("Select")
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


@register("Cast")
def _cast(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    dst = MLIR_TYPE[tf.as_dtype(node.attr["DstT"].type)]
    return [b.op("convert", xs, dst, xs[0].dims)]


@register("Const")
def _const(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    value = tf.make_ndarray(node.attr["value"].tensor)
    elem = MLIR_TYPE[tf.as_dtype(node.attr["dtype"].type)]
    return [b.constant(dense_literal(value, elem), elem, tuple(value.shape))]
