"""The op-support registry: which TF ops disc_tf can compile, for which dtypes.

One entry per TF op type. The clustering pass asks this registry whether a node
may join a cluster; the DHLO bridge has one lowering rule per entry (same name).
Adding an op is one entry here plus its lowering in ``disc_tf.dhlo_bridge``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import tensorflow as tf

FLOAT_TYPES = frozenset({tf.float32, tf.float16, tf.bfloat16})
NUMERIC_TYPES = frozenset({tf.float32, tf.float16, tf.bfloat16, tf.int32, tf.int64})
SIGNED_TYPES = NUMERIC_TYPES
ALL_TYPES = NUMERIC_TYPES | {tf.bool}

#: Highest tensor rank a cluster value may have.
MAX_RANK = 6


@dataclasses.dataclass(frozen=True)
class OpSupport:
    """What disc_tf supports of one TF op type."""

    op: str
    #: dtypes accepted for the op's type attribute (``dtype_attr``).
    dtypes: frozenset
    #: attribute naming the dtype checked against ``dtypes``.
    dtype_attr: str = "T"
    #: ops that do no arithmetic (constants, identities); they do not count
    #: towards the minimum cluster size.
    trivial: bool = False
    #: inputs that must be compile-time constants (e.g. reduction axes)
    const_inputs: tuple = ()
    #: op-specific attribute check: NodeDef -> None, or why it is not supported
    check: Callable | None = None
    #: host shape operands (Reshape's shape, Fill's dims): computed by the host
    #: runner from constants and dims, in the same cluster
    shape_inputs: tuple = ()
    #: dtypes accepted only where the host evaluates the op (a small integer
    #: result computed from constants and dims, see ``HOST_OPS``)
    host_dtypes: frozenset = frozenset()
    #: check of the node's inferred shapes: NodeInfo -> None, or why it is not supported
    shape_check: Callable | None = None


_REGISTRY: dict[str, OpSupport] = {}


def _register(op: str, dtypes: frozenset, dtype_attr: str = "T", trivial: bool = False,
              const_inputs: tuple = (), check: Callable | None = None,
              shape_inputs: tuple = (), host_dtypes: frozenset = frozenset(),
              shape_check: Callable | None = None) -> None:
    _REGISTRY[op] = OpSupport(op, frozenset(dtypes), dtype_attr, trivial, const_inputs, check,
                              shape_inputs, frozenset(host_dtypes), shape_check)


#: Ops the host runner can evaluate on small integer tensors (shapes, sizes):
#: op -> inputs whose values must be known at compile time for that.
HOST_OPS: dict[str, tuple] = {
    "Shape": (), "ShapeN": (), "Size": (), "Rank": (),
    "Mul": (), "Add": (), "AddV2": (), "Sub": (), "Maximum": (), "Minimum": (), "Neg": (),
    "FloorDiv": (1,), "Identity": (), "StopGradient": (), "Snapshot": (), "Cast": (),
    "Reshape": (1,), "ExpandDims": (1,), "Squeeze": (), "Pack": (), "ConcatV2": (-1,),
    "GatherV2": (1, 2), "StridedSlice": (1, 2, 3), "Prod": (1,), "Sum": (1,), "Max": (1,),
    "Min": (1,),
}
#: Most elements a host-evaluated integer tensor may have.
MAX_HOST_ELEMENTS = 16


def einsum_parts(equation: str) -> tuple[str, str, str] | None:
    """(lhs, rhs, out) letters of a two-operand einsum disc_tf lowers, else None.

    Supported: no ellipsis, no letter twice in one operand, every output letter
    in an input, every dropped letter in both inputs (a contraction), and at
    least one contraction.
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
    if not dropped or not dropped <= set(lhs) & set(rhs):
        return None
    return lhs, rhs, out


def _einsum_check(node) -> str | None:
    eq = node.attr["equation"].s.decode()
    return None if einsum_parts(eq) else f"einsum equation {eq!r} not supported"


for _op in ("Add", "AddV2", "Sub", "Mul", "Maximum", "Minimum", "Neg", "Abs", "Square", "Relu"):
    _register(_op, NUMERIC_TYPES)
for _op in ("RealDiv", "Pow", "Exp", "Log", "Tanh", "Sigmoid", "Rsqrt", "Sqrt"):
    _register(_op, FLOAT_TYPES)
for _op in ("Equal", "NotEqual"):
    _register(_op, ALL_TYPES)
for _op in ("Less", "LessEqual", "Greater", "GreaterEqual"):
    _register(_op, NUMERIC_TYPES)
for _op in ("LogicalAnd", "LogicalOr", "LogicalNot"):
    _register(_op, frozenset({tf.bool}), dtype_attr="")
for _op in ("Erf", "Erfc", "Log1p", "Expm1", "Sin", "Cos", "Floor", "Ceil", "Round", "Reciprocal", "Inv",
            "Softplus", "Softsign", "Elu", "Selu", "IsNan", "IsFinite", "FloorMod",
            "LeakyRelu"):
    _register(_op, FLOAT_TYPES)
for _op in ("Sign", "SquaredDifference", "Relu6", "BiasAdd", "AddN", "ClipByValue"):
    _register(_op, NUMERIC_TYPES)
for _op in ("Identity", "StopGradient", "Snapshot"):
    _register(_op, ALL_TYPES, trivial=True)  # free inside a cluster, no reason to make one
for _op in ("ZerosLike", "OnesLike"):
    _register(_op, ALL_TYPES)
# Reductions accumulate in float and round once (f16/bf16 included), as TF's do.
REDUCE_TYPES = frozenset({tf.float32, tf.float16, tf.bfloat16, tf.int32, tf.int64})
for _op in ("Sum", "Mean", "Max", "Min"):
    _register(_op, REDUCE_TYPES, const_inputs=(1,))
_register("Prod", REDUCE_TYPES - {tf.bfloat16}, const_inputs=(1,))
for _op in ("All", "Any"):
    _register(_op, frozenset({tf.bool}), dtype_attr="", const_inputs=(1,))
for _op in ("Softmax", "LogSoftmax"):
    _register(_op, FLOAT_TYPES)
# Matrix products: one library (GEMM) call per product (f16/bf16 multiplied in f32).
for _op in ("MatMul", "BatchMatMulV2"):
    _register(_op, FLOAT_TYPES)
# Layout ops: shape/permutation operands must be constants. Reshape-like ops
# move no data (a view of a dense buffer), so they do not count as work.
LAYOUT_TYPES = frozenset({tf.float32, tf.int32, tf.bool})
_register("Transpose", LAYOUT_TYPES, const_inputs=(1,))
_register("Reshape", LAYOUT_TYPES, trivial=True, shape_inputs=(1,))
_register("ExpandDims", LAYOUT_TYPES, trivial=True, const_inputs=(1,))
_register("Squeeze", LAYOUT_TYPES, trivial=True)
_register("Einsum", FLOAT_TYPES, check=_einsum_check)
_register("Select", ALL_TYPES)
_register("SelectV2", ALL_TYPES)
_register("Cast", ALL_TYPES, dtype_attr="SrcT")
_register("Const", ALL_TYPES, dtype_attr="dtype", trivial=True)
# Shape queries: free on the host (they read dims, never data).
for _op in ("Shape", "ShapeN", "Size", "Rank"):
    _register(_op, ALL_TYPES, trivial=True)
_register("Fill", ALL_TYPES, shape_inputs=(0,))
INT_TYPES = frozenset({tf.int32, tf.int64})
_register("FloorDiv", FLOAT_TYPES, host_dtypes=INT_TYPES)
# Data movement: "index" kernels; bounds/sizes/paddings computed on the host.
MOVE_TYPES = NUMERIC_TYPES | {tf.bool}
_register("Slice", MOVE_TYPES, shape_inputs=(1, 2))
_register("StridedSlice", MOVE_TYPES, shape_inputs=(1, 2), const_inputs=(3,),
          check=lambda n: None if not n.attr["ellipsis_mask"].i & n.attr["new_axis_mask"].i
          else "StridedSlice with ellipsis and new_axis on one index")
_register("ConcatV2", MOVE_TYPES, const_inputs=(-1,))
_register("Pack", MOVE_TYPES)
_register("Unpack", MOVE_TYPES)
_register("Split", MOVE_TYPES, const_inputs=(0,))
_register("SplitV", MOVE_TYPES, const_inputs=(1, 2))
_register("Pad", MOVE_TYPES, shape_inputs=(1,))
_register("PadV2", MOVE_TYPES, shape_inputs=(1,))
_register("Tile", MOVE_TYPES, shape_inputs=(1,))
_register("BroadcastTo", MOVE_TYPES, shape_inputs=(1,))
_register("Range", INT_TYPES | {tf.float32}, dtype_attr="Tidx", shape_inputs=(0, 1),
          const_inputs=(2,))
_register("OneHot", MOVE_TYPES, shape_inputs=(1,), check=lambda n: None if n.attr["TI"].type in (
    tf.int32.as_datatype_enum, tf.int64.as_datatype_enum) else "OneHot indices must be integers")
_register("GatherV2", MOVE_TYPES, dtype_attr="Tparams", const_inputs=(2,))
for _op in ("ArgMax", "ArgMin"):
    _register(_op, NUMERIC_TYPES, const_inputs=(1,))


def _nhwc_check(node) -> str | None:
    fmt = node.attr["data_format"].s.decode() if "data_format" in node.attr else "NHWC"
    if fmt != "NHWC":
        return f"data_format {fmt} (only NHWC)"
    if node.attr["padding"].s.decode() not in ("SAME", "VALID", "EXPLICIT"):
        return "unsupported padding"
    return None


# Convolutions: im2col + GEMM (grouped/depthwise: a direct kernel); pooling: a
# window kernel over the padded input. f32; the window (filter kh, kw) must be static.
def _static_window(node) -> str | None:
    """The filter window (and a depthwise conv's channel count) must be static."""
    dims = node.inputs[1].dims if len(node.inputs) > 1 else None
    if dims is None or len(dims) != 4 or None in dims[:2]:
        return "filter window must be static"
    x = node.inputs[0].dims
    if node.op == "DepthwiseConv2dNative" and (x is None or len(x) != 4 or x[3] is None):
        return "depthwise input channels must be static"
    return None


for _op in ("Conv2D", "DepthwiseConv2dNative"):  # f16/bf16 multiplied in f32
    _register(_op, FLOAT_TYPES, check=_nhwc_check,
              shape_check=_static_window)
for _op in ("MaxPool", "AvgPool"):
    _register(_op, FLOAT_TYPES, check=_nhwc_check)
_register("MirrorPad", MOVE_TYPES, shape_inputs=(1,))
_register("GatherNd", MOVE_TYPES, dtype_attr="Tparams", shape_check=lambda n: None if (
    n.inputs[1].dims and n.inputs[1].dims[-1] is not None) else "index depth must be static")
for _op in ("Cumsum", "Cumprod"):
    _register(_op, FLOAT_TYPES | {tf.int32, tf.int64}, const_inputs=(1,))

#: Ops refused on purpose, with the reason ``inspect`` prints.
EXCLUDED = {
    "Where": "data-dependent output shape (Where)",
    "Unique": "data-dependent output shape (Unique)",
    "NonMaxSuppressionV3": "data-dependent output shape (NonMaxSuppression)",
    "NonMaxSuppressionV4": "data-dependent output shape (NonMaxSuppression)",
    "NonMaxSuppressionV5": "data-dependent output shape (NonMaxSuppression)",
    "RaggedTensorToTensor": "ragged tensors",
    "BooleanMask": "data-dependent output shape (boolean mask)",
}

#: Const nodes larger than this many elements stay outside clusters.
MAX_CONST_ELEMENTS = 4096


def lookup(op_type: str) -> OpSupport | None:
    """Returns the support entry of ``op_type``, or None if it is not supported."""
    return _REGISTRY.get(op_type)


def supported_ops() -> list[str]:
    """All supported TF op types, sorted."""
    return sorted(_REGISTRY)
