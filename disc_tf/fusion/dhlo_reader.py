"""Reads a verified DHLO module into plain, printable op records."""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from disc_tf.dhlo_bridge.lower import mlir_lock, parse_and_verify

_TENSOR_RE = re.compile(r"tensor<((?:[0-9?]+x)*)([a-z0-9]+)>")
_DOT_FIELD_RE = re.compile(r"(lhs|rhs)_(batching|contracting)_dimensions = \[([0-9, ]*)\]")
_LOC_RE = re.compile(r'^loc\("((?:[^"\\]|\\.)*)"')


@dataclasses.dataclass
class DOp:
    """One DHLO op: names of operands/results, result types, attrs, TF node."""

    name: str
    operands: list[str]
    results: list[str]
    result_types: list[tuple[str, tuple]]  # (elem, dims) of tensor results; ("index", (n,)) shapes
    attrs: dict[str, str]
    tf_node: str
    const_value: np.ndarray | None = None
    broadcast_dims: list[int] | None = None
    reduce_dims: list[int] | None = None
    reduce_kind: str | None = None  # the combiner of a reduce, e.g. "add"
    index_value: int | None = None  # value of an index/integer arith.constant
    #: dot_general dimension numbers: lhs_batch, rhs_batch, lhs_contract, rhs_contract
    dot_dims: dict[str, list[int]] | None = None
    #: transpose: result dim i is operand dim ``permutation[i]``
    permutation: list[int] | None = None

    def elem_of(self, value: str) -> str:
        """Element type of ``value``, one of this op's results (an ArgMax's reduce has
        two: the extreme values and their positions)."""
        return self.result_types[self.results.index(value)][0]

    def ints_attr(self, name: str) -> list[int]:
        """An integer array attribute such as ``array<i64: 1, 2>``."""
        text = self.attrs[name]
        body = text.split(":", 1)[1].rstrip(">") if ":" in text else ""
        return [int(v) for v in body.replace(" ", "").split(",") if v]

    def int_attr(self, name: str) -> int:
        """An integer attribute such as ``dimension = 1 : i64``."""
        return int(self.attrs[name].split(":")[0].strip())


@dataclasses.dataclass
class DFunc:
    """The ``@main`` function of a DHLO module."""

    args: list[tuple[str, tuple]]  # (elem, dims) per argument
    ops: list[DOp]
    returns: list[str]


def parse_type(text: str) -> tuple[str, tuple]:
    """'tensor<?x3xf32>' -> ('f32', (None, 3)); scalars 'index'/'f32' -> ('scalar:index', ());
    '!shape.witness' -> ('witness', ())."""
    m = _TENSOR_RE.fullmatch(text)
    if not m:
        return ("witness", ()) if text.startswith("!") else (f"scalar:{text}", ())
    dims = tuple(None if d == "?" else int(d) for d in m.group(1).split("x") if d)
    return (m.group(2), dims)


def parse_dot_dims(text: str) -> dict[str, list[int]]:
    """'#stablehlo.dot<lhs_batching_dimensions = [0], ...>' -> {'lhs_batch': [0], ...}."""
    out = {"lhs_batch": [], "rhs_batch": [], "lhs_contract": [], "rhs_contract": []}
    for side, kind, dims in _DOT_FIELD_RE.findall(text):
        key = f"{side}_{'batch' if kind == 'batching' else 'contract'}"
        out[key] = [int(d) for d in dims.replace(" ", "").split(",") if d]
    return out


def _bf16_values(text: str) -> np.ndarray:
    """float32 values of a bf16 dense attribute, hex (``dense<"0x803F">``) or decimal."""
    body = text[text.index("<") + 1:text.index(">")].strip()
    if body.startswith('"0x'):
        raw = np.frombuffer(bytes.fromhex(body[3:-1]), dtype="<u2")
        return (raw.astype(np.uint32) << 16).view(np.float32)
    if body.startswith("0x"):  # a splat written as its bits
        return (np.array([int(body, 16)], np.uint32) << 16).view(np.float32).reshape(())
    numbers = body.replace("[", " ").replace("]", " ").replace(",", " ").split()
    return np.array([float(v) for v in numbers], dtype=np.float32).reshape(-1 if len(numbers) > 1
                                                                          else ())


def read_module(text: str) -> DFunc:
    """Parses and verifies ``text`` and returns its ``@main`` as a DFunc."""
    from iree.compiler import ir

    with mlir_lock():
        module = parse_and_verify(text)
        func = module.body.operations[0]
        block = func.regions[0].blocks[0]
        state = ir.AsmState(func)
        args = [parse_type(str(a.type)) for a in block.arguments]
        ops: list[DOp] = []
        returns: list[str] = []
        for op in block.operations:
            o = op.operation
            operands = [v.get_name(state) for v in o.operands]
            if o.name == "func.return":
                returns = operands
                continue
            attrs = {o.attributes[i].name: str(o.attributes[i].attr) for i in range(len(o.attributes))}
            m = _LOC_RE.match(str(o.location))
            rec = DOp(
                name=o.name,
                operands=operands,
                results=[r.get_name(state) for r in o.results],
                result_types=[parse_type(str(r.type)) for r in o.results],
                attrs=attrs,
                tf_node=m.group(1) if m else "",
            )
            if o.name == "stablehlo.constant":
                elem, dims = rec.result_types[0]
                if elem == "bf16":  # numpy has no bfloat16: read the attribute's text
                    values = _bf16_values(attrs["value"])
                    if values.size == int(np.prod(dims)) and values.size > 1:
                        values = values.reshape(dims)
                    rec.const_value = np.broadcast_to(values, dims).copy()
                else:
                    dense = ir.DenseElementsAttr(o.attributes["value"])
                    rec.const_value = np.broadcast_to(np.array(dense), dims).copy()
            if o.name == "stablehlo.reduce_window":
                body = o.regions[0].blocks[0].operations[0].operation.name
                rec.reduce_kind = body.split(".", 1)[1]
            if o.name == "stablehlo.reduce":
                rec.reduce_dims = list(ir.DenseI64ArrayAttr(o.attributes["dimensions"]))
                body = o.regions[0].blocks[0].operations[0].operation.name
                rec.reduce_kind = body.split(".", 1)[1]
                if "disc.arg_direction" in attrs:  # ArgMax/ArgMin: (value, index) pairs
                    rec.reduce_kind = "arg" + attrs["disc.arg_direction"].strip('"')
            if o.name == "arith.constant":
                rec.index_value = ir.IntegerAttr(o.attributes["value"]).value
            if o.name == "stablehlo.dynamic_broadcast_in_dim":
                rec.broadcast_dims = list(ir.DenseI64ArrayAttr(o.attributes["broadcast_dimensions"]))
            if o.name == "stablehlo.transpose":
                rec.permutation = list(ir.DenseI64ArrayAttr(o.attributes["permutation"]))
            if o.name == "stablehlo.dot_general":
                rec.dot_dims = parse_dot_dims(attrs["dot_dimension_numbers"])
            ops.append(rec)
    return DFunc(args=args, ops=ops, returns=returns)
