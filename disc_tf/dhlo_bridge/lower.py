"""TF cluster subgraph -> DHLO module, verified by the MLIR bindings."""

from __future__ import annotations

import dataclasses
import threading

from disc_tf.cluster.rewrite import ClusterSpec, arg_name
from disc_tf.dhlo_bridge import data_rules, host_rules, identities, rules
from disc_tf.dhlo_bridge.builder import DhloBuilder, TValue
from disc_tf.dhlo_bridge.types import MLIR_TYPE

del data_rules  # imported for its registrations
_MLIR_LOCK = threading.Lock()
_CONTEXT = None


@dataclasses.dataclass
class DhloModule:
    """A lowered cluster: the module text and how its signature maps to TF."""

    cluster_name: str
    text: str
    input_names: list[str]  # TF tensor feeding each function argument
    output_names: list[str]  # TF tensor produced by each function result

    def __str__(self) -> str:
        return self.text


def mlir_context():
    """The process-wide MLIR context (StableHLO, shape, func registered)."""
    global _CONTEXT
    if _CONTEXT is None:
        from iree.compiler import ir

        _CONTEXT = ir.Context()
    return _CONTEXT


def parse_and_verify(text: str):
    """Parses ``text`` into an ``ir.Module`` and runs the MLIR verifier.

    Raises ``rules.LoweringError`` with MLIR's diagnostics on failure. Callers
    must hold ``mlir_lock()`` while using the returned module.
    """
    from iree.compiler import ir

    try:
        module = ir.Module.parse(text, mlir_context())
    except ir.MLIRError as e:
        raise rules.LoweringError(f"DHLO does not parse: {e}") from e
    if not module.operation.verify():
        raise rules.LoweringError("DHLO does not verify")
    return module


def mlir_lock() -> threading.Lock:
    """The lock serialising use of the shared MLIR context."""
    return _MLIR_LOCK


def lower_cluster(spec: ClusterSpec) -> DhloModule:
    """Lowers ``spec``'s subgraph to DHLO and verifies it."""
    b = DhloBuilder()
    values: dict[str, TValue] = {}
    args = []
    for i, t in enumerate(spec.inputs):
        # Static dims known to TF shape inference are kept: they are facts of
        # the graph (checked again by the host runner), not of one call.
        arg = TValue(f"%arg{i}", MLIR_TYPE[t.dtype], tuple(t.dims))
        args.append(arg)
        values[f"{arg_name(i)}:0"] = arg
    one_plus_tanh = identities.one_plus_tanh(spec.subgraph, {t.name for t in spec.outputs})
    for node in spec.subgraph.node:
        if node.op == "Placeholder":
            continue
        b.loc = node.name
        if node.name in one_plus_tanh:  # its tanh is then dead code
            values[f"{node.name}:0"] = identities.lower_one_plus_tanh(
                b, values[one_plus_tanh[node.name]])
            continue
        operands = [values[i] for i in node.input]
        try:
            outs = host_rules.try_host(b, node, operands)
            if outs is None:
                outs = rules.rule_for(node.op)(b, node, operands)
        except rules.LoweringError as e:
            if e.node is None:
                e.node = node.name
            raise
        for k, v in enumerate(outs):
            values[f"{node.name}:{k}"] = v
    results = [values[t.name] for t in spec.outputs]
    for t, r in zip(spec.outputs, results):
        if r.elem != MLIR_TYPE[t.dtype] or r.rank != t.rank:
            raise rules.LoweringError(
                f"lowering of {t.name} gives {r.type}, TF says {t.dtype.name} rank {t.rank}"
            )
    text = b.module(args, results)
    with _MLIR_LOCK:
        parse_and_verify(text)
    return DhloModule(
        cluster_name=spec.name,
        text=text,
        input_names=[t.name for t in spec.inputs],
        output_names=[t.name for t in spec.outputs],
    )
