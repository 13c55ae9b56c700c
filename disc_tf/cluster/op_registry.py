"""What the clustering pass asks of the op table (``disc_tf.ops``): may a node of
this op type join a cluster, and the clustering policy around it (host-evaluated
shape ops, ops refused on purpose, rank and constant-size limits).

Every TF op's support and lowering are defined once, in the op table; this module
only reads it.
"""

from __future__ import annotations

from disc_tf.ops.table import (  # noqa: F401 - the type sets are part of this API
    ALL_TYPES,
    FLOAT_TYPES,
    INT_TYPES,
    LAYOUT_TYPES,
    MOVE_TYPES,
    NUMERIC_TYPES,
    REDUCE_TYPES,
    SIGNED_TYPES,
    OpSupport,
    lookup,
    supported_ops,
)

#: Highest tensor rank a cluster value may have.
MAX_RANK = 6

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
