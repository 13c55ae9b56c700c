"""The TF op table: one ``OpSupport`` entry per TF op type, holding what the
clustering pass asks (may a node join a cluster?) and the rule that lowers it to
DHLO. Entries are made by ``tf_op`` next to their lowering rule (in
``disc_tf.dhlo_bridge.rules``/``data_rules``) or by ``elementwise.elementwise_op``;
``lookup`` and ``supported_ops`` load every module that defines entries first.
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
from collections.abc import Callable

import tensorflow as tf

FLOAT_TYPES = frozenset({tf.float32, tf.float16, tf.bfloat16})
NUMERIC_TYPES = frozenset({tf.float32, tf.float16, tf.bfloat16, tf.int32, tf.int64})
SIGNED_TYPES = NUMERIC_TYPES
ALL_TYPES = NUMERIC_TYPES | {tf.bool}
INT_TYPES = frozenset({tf.int32, tf.int64})
BOOL_TYPES = frozenset({tf.bool})
#: Reductions accumulate in float and round once (f16/bf16 included), as TF's do.
REDUCE_TYPES = frozenset({tf.float32, tf.float16, tf.bfloat16, tf.int32, tf.int64})
#: Layout ops (views and permutations of dense buffers).
LAYOUT_TYPES = frozenset({tf.float32, tf.int32, tf.bool})
#: Data movement: "index" kernels.
MOVE_TYPES = NUMERIC_TYPES | {tf.bool}

#: (builder, NodeDef, operand values) -> the node's output values, in DHLO
Rule = Callable[..., list]


@dataclasses.dataclass(frozen=True)
class OpSupport:
    """One TF op type: what disc_tf supports of it, and how it lowers."""

    op: str
    #: dtypes accepted for the op's type attribute (``dtype_attr``).
    dtypes: frozenset
    #: attribute naming the dtype checked against ``dtypes`` ("" for none).
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
    #: result computed from constants and dims)
    host_dtypes: frozenset = frozenset()
    #: check of the node's inferred shapes: NodeInfo -> None, or why it is not supported
    shape_check: Callable | None = None
    #: the lowering rule: (DhloBuilder, NodeDef, operands) -> outputs
    lower: Rule | None = None
    #: inputs that are resource variables (ResourceGather's table): the cluster takes
    #: the handle, the DiscCluster op reads the variable's value when it runs (as
    #: ReadVariableOp does), and the op lowers on that value. Such an op reads
    #: state, so it is stateful in TF; reading is all it does.
    resource_inputs: tuple = ()


_TABLE: dict[str, OpSupport] = {}

#: Modules whose import fills the table (each defines entries beside its rules).
_DEFINING_MODULES = ("disc_tf.ops.elementwise", "disc_tf.dhlo_bridge.rules",
                     "disc_tf.dhlo_bridge.data_rules", "disc_tf.dhlo_bridge.host_rules")
_loaded = False
_load_lock = threading.Lock()


def tf_op(*op_types: str, dtypes, dtype_attr: str = "T", trivial: bool = False,
          const_inputs: tuple = (), check: Callable | None = None, shape_inputs: tuple = (),
          host_dtypes: frozenset = frozenset(), shape_check: Callable | None = None,
          resource_inputs: tuple = ()):
    """Decorator: the decorated lowering rule, with this support, defines each TF op
    type given (stack it for op types with different support)."""

    def wrap(rule: Rule) -> Rule:
        for op in op_types:
            if op in _TABLE:
                raise ValueError(f"TF op {op} is defined twice in the op table")
            _TABLE[op] = OpSupport(op, frozenset(dtypes), dtype_attr, trivial, const_inputs,
                                   check, shape_inputs, frozenset(host_dtypes), shape_check,
                                   rule, tuple(resource_inputs))
        return rule

    return wrap


def _load() -> None:
    global _loaded
    if _loaded:
        return
    with _load_lock:
        if not _loaded:
            for module in _DEFINING_MODULES:
                importlib.import_module(module)
            _loaded = True


def lookup(op_type: str) -> OpSupport | None:
    """The entry of ``op_type``, or None if disc_tf does not compile it."""
    _load()
    return _TABLE.get(op_type)


def supported_ops() -> list[str]:
    """Every TF op type in the table, sorted."""
    _load()
    return sorted(_TABLE)
