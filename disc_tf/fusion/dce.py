"""Dead-code elimination on a DHLO function, before shape analysis.

TF prunes ops whose results nobody reads; so must a cluster. Otherwise a dead
op would still be computed and, worse, its shape checks could reject inputs
TF accepts. Constraint ops (``shape.cstr_*``) have no users: they stay exactly
when the TF op they check stays.
"""

from __future__ import annotations

import dataclasses

from disc_tf.fusion.dhlo_reader import DFunc


def eliminate_dead_code(func: DFunc) -> DFunc:
    """``func`` without the ops that no result (or live TF op's check) needs."""
    live_values = set(func.returns)
    live_nodes: set[str] = set()
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
            )
            if needed:
                kept.add(i)
                live_values.update(op.operands)
                if not op.name.startswith(("shape.", "tensor.", "arith.")):
                    live_nodes.add(op.tf_node)
                changed = True
    ops = [op for i, op in enumerate(func.ops) if i in kept]
    return dataclasses.replace(func, ops=ops)
