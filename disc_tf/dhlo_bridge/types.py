"""Element types as TF, DHLO (MLIR) and generated C++ spell them."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

#: TF dtype -> MLIR element type.
MLIR_TYPE = {
    tf.float32: "f32",
    tf.float16: "f16",
    tf.bfloat16: "bf16",
    tf.int32: "i32",
    tf.int64: "i64",
    tf.bool: "i1",
}
#: MLIR element type -> TF dtype.
TF_TYPE = {v: k for k, v in MLIR_TYPE.items()}


def tensor_type(elem: str, dims: list[int | None] | tuple) -> str:
    """'tensor<?x3xf32>' from an element type and dims (None = dynamic)."""
    parts = ["?" if d is None else str(d) for d in dims]
    return "tensor<" + "".join(p + "x" for p in parts) + elem + ">"


def dense_literal(value: np.ndarray, elem: str) -> str:
    """A DenseElementsAttr literal holding ``value`` exactly (hex for numbers)."""
    if elem == "i1":
        flat = ", ".join("true" if v else "false" for v in value.reshape(-1))
        return f"dense<[{flat}]>" if value.ndim else f"dense<{flat}>"
    np_type = TF_TYPE[elem].as_numpy_dtype
    raw = np.ascontiguousarray(value.astype(np_type)).astype(np.dtype(np_type).newbyteorder("<"))
    return f'dense<"0x{raw.tobytes().hex().upper()}">'


class LoweringError(ValueError):
    """A TF node that has no (valid) DHLO lowering. ``node``: the TF node that
    refused, when one did (the optimizer then clusters again without it)."""

    def __init__(self, message: str, node: str | None = None) -> None:
        super().__init__(message)
        self.node = node
