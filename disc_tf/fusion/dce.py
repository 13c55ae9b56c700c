"""Clean-ups of a DHLO function before shape analysis: copies forwarded, dead code
eliminated.

TF prunes ops whose results nobody reads; so must a cluster. Otherwise a dead
op would still be computed and, worse, its shape checks could reject inputs
TF accepts. Constraint ops (``shape.cstr_*``) have no users: they stay exactly
when the TF op they check stays, or (``shape.cstr_require`` on a host value,
such as an int32 shape value's range) when the value they check is live.
"""

from __future__ import annotations

import dataclasses

from disc_tf.fusion.dhlo_reader import DFunc


def eliminate_dead_code(func: DFunc) -> DFunc:
    """``func`` without the ops that no result (or live TF op's check) needs."""
    live_values = set(func.returns)
    live_nodes: set[str] = set()
    producer = {r: op for op in func.ops for r in op.results}

    def checks_live_value(op) -> bool:
        """A ``shape.cstr_require`` of ``a <predicate> bound`` whose ``a`` is live."""
        cond = producer.get(op.operands[0]) if op.name == "shape.cstr_require" else None
        return cond is not None and cond.operands[0] in live_values
    kept: set[int] = set()
    changed = True
    while changed:
        changed = False
        for i in range(len(func.ops) - 1, -1, -1):
            op = func.ops[i]
            if i in kept:
                continue
            needed = any(r in live_values for r in op.results) or (
                op.name.startswith("shape.cstr") and op.tf_node in live_nodes
            ) or checks_live_value(op)
            if needed:
                kept.add(i)
                live_values.update(op.operands)
                if not op.name.startswith(("shape.", "tensor.", "arith.")):
                    live_nodes.add(op.tf_node)
                changed = True
    ops = [op for i, op in enumerate(func.ops) if i in kept]
    return dataclasses.replace(func, ops=ops)


#: Ops the planner never places as computations: constants, and reads of another
#: value's memory (broadcasts and transposes are index maps, reshapes views).
NOT_COMPUTE = {"stablehlo.constant", "stablehlo.dynamic_broadcast_in_dim",
               "stablehlo.transpose", "stablehlo.dynamic_reshape"}

#: Sources a returned convert stays the copy of: those, and slices (read in place
#: as windows), none of which a kernel writes into memory of its own.
_NOT_WRITTEN = NOT_COMPUTE | {"stablehlo.real_dynamic_slice"}


def forward_copies(func: DFunc) -> DFunc:
    """``func`` with each same-type ``convert`` (TF Identity, Snapshot) of a computed
    value replaced by that value, so that a kernel writes a cluster result directly
    instead of a copy kernel re-writing it. A convert stays where it is the copy that
    gives a result its own memory: of an argument, of a constant, index map, view or
    slice (``_NOT_WRITTEN``), or of a value returned already."""
    producer = {r: op for op in func.ops for r in op.results}

    def elem(v: str) -> str:
        return func.args[int(v[4:])][0] if v.startswith("%arg") else producer[v].elem_of(v)

    forward: dict[str, str] = {}
    for op in func.ops:
        if op.name != "stablehlo.convert" or op.result_types[0][0] != elem(op.operands[0]):
            continue
        x = forward.get(op.operands[0], op.operands[0])
        source = producer.get(x)
        if source is not None and source.name.startswith(("stablehlo.", "chlo.")) \
                and source.name not in _NOT_WRITTEN:
            forward[op.results[0]] = x
    if not forward:
        return func
    returns: list[str] = []
    for v in func.returns:
        new = forward.get(v, v)
        returns.append(new if new not in returns and new not in func.returns else v)
    ops = [dataclasses.replace(op, operands=[forward.get(v, v) for v in op.operands])
           for op in func.ops]
    return dataclasses.replace(func, ops=ops, returns=returns)
