"""Constant folding before clustering: input-independent subgraphs become Consts.

A node is *evaluable* when it is a Const without control inputs, or a stateless,
deterministic op (no random, control-flow, function-valued or side-effect ops) with
no control inputs, whose data inputs all come from evaluable nodes, and whose
outputs have foldable dtypes and fully known, modest shapes. The evaluable nodes
read by the rest of the body (or fetched) are evaluated once, on the CPU, in a
scratch ``tf.Session``, and each is replaced by a Const of the same name holding
its value when that value is small enough to embed in a cluster
(``op_registry.MAX_CONST_ELEMENTS``); a larger one stays computed and its own
evaluable inputs are folded instead. Evaluable nodes nothing reads any more are
dropped. References keep working: a folded node has one output, so ``node:0``
(GraphDef) is unchanged and ``node:<arg>:0`` (FunctionDef) becomes ``node:output:0``.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import function_pb2, graph_pb2, node_def_pb2

from disc_tf.cluster import op_registry
from disc_tf.cluster.graph_view import GraphView, NodeInfo, producer

log = logging.getLogger("disc_tf.cluster.const_fold")

#: Most elements any tensor computed while folding may have (intermediates included).
MAX_EVAL_ELEMENTS = 1 << 22

#: Element types a Const may hold and folding may produce.
FOLDABLE_TYPES = frozenset({
    tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.complex64, tf.complex128,
    tf.int8, tf.int16, tf.int32, tf.int64, tf.uint8, tf.uint16, tf.uint32, tf.uint64, tf.bool,
})

#: Stateless ops that must not be evaluated at optimize time (feeds, TF1 control flow).
NEVER_FOLDED = frozenset({
    "Placeholder", "PlaceholderWithDefault", "PlaceholderV2", "_Arg", "_Retval",
    "Switch", "RefSwitch", "Merge", "RefMerge", "Enter", "RefEnter", "Exit", "RefExit",
    "NextIteration", "RefNextIteration", "LoopCond", "ControlTrigger", "NoOp", "DiscCluster",
})


@dataclasses.dataclass
class Folding:
    """What folding a view decided: the Const replacing each folded node, and the
    evaluable nodes nothing reads any more."""

    consts: dict[str, node_def_pb2.NodeDef]
    pruned: set[str]


def _has_func_attr(nd: node_def_pb2.NodeDef) -> bool:
    return any(v.HasField("func") or len(v.list.func) for v in nd.attr.values())


def _foldable_op(node: NodeInfo) -> bool:
    """True if evaluating ``node`` once is the same as running it at every call."""
    op = node.op
    return not (node.stateful or op in NEVER_FOLDED or "Random" in op or op.startswith(
        ("Stateless", "Debug")) or not node.inputs or _has_func_attr(node.node_def))


def _small(node: NodeInfo, limit: int) -> bool:
    return all(t.dims is not None and None not in t.dims and int(np.prod(t.dims)) <= limit
               for t in node.outputs)


def evaluable_nodes(view: GraphView, outside: frozenset[str] = frozenset()) -> set[str]:
    """The nodes of ``view`` whose values do not depend on the body's inputs."""
    found: set[str] = set()
    for name in view.order:
        node = view.nodes[name]
        if name in outside or node.control_inputs or not node.outputs \
                or any(t.dtype not in FOLDABLE_TYPES for t in node.outputs):
            continue
        if node.op == "Const":
            found.add(name)
        elif _foldable_op(node) and _small(node, MAX_EVAL_ELEMENTS) \
                and all(producer(t.name) in found for t in node.inputs):
            found.add(name)
    return found


def _targets(view: GraphView, evaluable: set[str], kept: set[str]) -> list[str]:
    """Evaluable non-Const nodes to fold: those the rest of the body reads, or the
    nearest foldable producers of those that are too large or multi-output."""
    read = {producer(t.name) for node in view.nodes.values() if node.name not in evaluable
            for t in node.inputs}  # by nodes that stay computed
    pending = [n for n in view.order if n in evaluable and (n in read or n in kept)]
    seen = set(pending)
    targets = []
    while pending:
        node = view.nodes[pending.pop()]
        if node.op == "Const":
            continue
        if len(node.outputs) == 1 and _small(node, op_registry.MAX_CONST_ELEMENTS):
            targets.append(node.name)
            continue
        for t in node.inputs:  # stays computed: fold what it reads instead
            if producer(t.name) not in seen:
                seen.add(producer(t.name))
                pending.append(producer(t.name))
    order = {n: i for i, n in enumerate(view.order)}
    return sorted(targets, key=order.__getitem__)


def _ancestors(view: GraphView, names: list[str]) -> list[str]:
    """``names`` and every node they read, in topological order."""
    found: set[str] = set()
    stack = list(names)
    while stack:
        name = stack.pop()
        if name not in found:
            found.add(name)
            stack.extend(producer(t.name) for t in view.nodes[name].inputs)
    return [n for n in view.order if n in found]


def _evaluate(view: GraphView, targets: list[str]) -> dict[str, np.ndarray]:
    """Runs ``targets`` (evaluable nodes) on the CPU; raises if TF refuses."""
    gd = graph_pb2.GraphDef()
    for name in _ancestors(view, targets):
        node = view.nodes[name]
        nd = gd.node.add(name=name, op=node.op)
        nd.input.extend(t.name for t in node.inputs)
        for key, value in node.node_def.attr.items():
            if not key.startswith("_"):
                nd.attr[key].CopyFrom(value)
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(gd, name="")
    config = tf.compat.v1.ConfigProto(device_count={"GPU": 0})
    with tf.compat.v1.Session(graph=graph, config=config) as sess:
        values = sess.run([f"{n}:0" for n in targets])
    return dict(zip(targets, values))


def _evaluate_each(view: GraphView, targets: list[str]) -> dict[str, np.ndarray]:
    """Values of ``targets``; one that TF cannot evaluate is left out."""
    try:
        return _evaluate(view, targets)
    except Exception:  # noqa: BLE001 - find the culprits one by one
        values = {}
        for name in targets:
            try:
                values.update(_evaluate(view, [name]))
            except Exception as e:  # noqa: BLE001 - that node stays computed
                log.info("constant %s not folded: %s", name, e)
        return values


def const_node(node: NodeInfo, value: np.ndarray) -> node_def_pb2.NodeDef:
    """A Const named like ``node`` (on its device) holding ``value``."""
    out = node.outputs[0]
    nd = node_def_pb2.NodeDef(name=node.name, op="Const", device=node.device)
    nd.attr["dtype"].type = out.dtype.as_datatype_enum
    nd.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value, dtype=out.dtype,
                                                          shape=list(out.dims)))
    return nd


def _readers(view: GraphView) -> dict[str, set[str]]:
    """Node -> the nodes reading one of its outputs or waiting for it."""
    readers: dict[str, set[str]] = {}
    for node in view.nodes.values():
        for t in node.inputs:
            readers.setdefault(producer(t.name), set()).add(node.name)
        for c in node.control_inputs:
            readers.setdefault(c, set()).add(node.name)
    return readers


def _dead(view: GraphView, evaluable: set[str], folded: set[str], keep: set[str]) -> set[str]:
    """Evaluable nodes nothing reads once ``folded`` nodes are Consts: what those read,
    and computations nothing read before (the Consts of the body stay)."""
    readers = _readers(view)
    candidates = (set(_ancestors(view, sorted(folded))) | {
        n for n in evaluable if view.nodes[n].op != "Const"}) - folded - keep
    dead: set[str] = set()
    for name in reversed(view.order):
        if name in candidates and name in evaluable \
                and all(r in dead or r in folded for r in readers.get(name, ())):
            dead.add(name)
    return dead


def fold_view(view: GraphView, kept: set[str], outside: frozenset[str] = frozenset()
              ) -> Folding | None:
    """Decides and evaluates the folding of ``view``; ``kept`` nodes are fetched or
    must keep their names (never dropped). None when nothing folds; folding that
    fails leaves the body as it is (a warning), since it only ever saves work."""
    try:
        return _fold(view, kept, outside)
    except Exception:  # noqa: BLE001 - the body is clustered unfolded
        log.warning("constant folding failed; body left unfolded", exc_info=True)
        return None


def _fold(view: GraphView, kept: set[str], outside: frozenset[str]) -> Folding | None:
    evaluable = evaluable_nodes(view, outside)
    targets = _targets(view, evaluable, kept)
    if not targets:
        return None
    values = _evaluate_each(view, targets)
    consts = {}
    for name, value in values.items():
        out = view.nodes[name].outputs[0]
        value = np.asarray(value)
        if value.shape != tuple(out.dims) or value.size > op_registry.MAX_CONST_ELEMENTS:
            continue
        consts[name] = const_node(view.nodes[name], value)
    if not consts:
        return None
    return Folding(consts, _dead(view, evaluable, set(consts), kept))


def _patched(graph_def: graph_pb2.GraphDef, folding: Folding) -> graph_pb2.GraphDef:
    """``graph_def`` (GraphDef naming) with folded nodes replaced and dead ones dropped."""
    result = graph_pb2.GraphDef()
    result.CopyFrom(graph_def)
    del result.node[:]
    for nd in graph_def.node:
        if nd.name not in folding.pruned:
            result.node.add().CopyFrom(folding.consts.get(nd.name, nd))
    return result


def _patched_view(view: GraphView, folding: Folding) -> GraphView:
    """``view`` after folding: each folded node a Const with its old output tensor."""
    nodes = {}
    for name, node in view.nodes.items():
        if name in folding.pruned:
            continue
        if name in folding.consts:
            node = NodeInfo(name, "Const", node.device, folding.consts[name], [], [],
                            node.outputs, False)
        nodes[name] = node
    return GraphView(nodes, [n for n in view.order if n in nodes],
                     _patched(view.flat_graph_def, folding))


def _log(body: str, folding: Folding) -> None:
    log.info("%s: folded %d constant subgraph(s) (%s), dropped %d dead node(s)", body,
             len(folding.consts), ", ".join(sorted(folding.consts)[:5]), len(folding.pruned))


def fold_graph_def(graph_def: graph_pb2.GraphDef, view: GraphView,
                   protected: frozenset[str] = frozenset(), body: str = "graph",
                   outside: frozenset[str] = frozenset()
                   ) -> tuple[graph_pb2.GraphDef, GraphView]:
    """Folds the constant subgraphs of a flat GraphDef and its view; ``protected``
    nodes keep their names, nodes ``outside`` are left alone. Returns the inputs
    themselves when nothing folds."""
    folding = fold_view(view, set(protected), outside)
    if folding is None:
        return graph_def, view
    _log(body, folding)
    return _patched(graph_def, folding), _patched_view(view, folding)


def fold_function_def(fdef: function_pb2.FunctionDef, view: GraphView,
                      nested_to_flat: dict[str, str], protected: frozenset[str] = frozenset()
                      ) -> tuple[function_pb2.FunctionDef, GraphView, dict[str, str]]:
    """Folds the constant subgraphs of a FunctionDef body (``view`` and
    ``nested_to_flat`` from ``view_of_function_def``). Every reference to a folded
    node, the ``ret`` map's included, is renamed ``node:output:0``. Returns the
    inputs themselves when nothing folds."""
    rets = {producer(nested_to_flat.get(r, r)) for r in fdef.ret.values()}
    kept = set(protected) | rets | set(fdef.control_ret.values())
    folding = fold_view(view, kept)
    if folding is None:
        return fdef, view, nested_to_flat

    def ref(r: str) -> str:
        if r.startswith("^"):
            return r
        name = producer(nested_to_flat.get(r, r))
        return f"{name}:output:0" if name in folding.consts else r

    result = function_pb2.FunctionDef()
    result.CopyFrom(fdef)
    del result.node_def[:]
    for nd in fdef.node_def:
        if nd.name in folding.pruned:
            continue
        new = result.node_def.add()
        new.CopyFrom(folding.consts.get(nd.name, nd))
        refs = [ref(r) for r in new.input]
        del new.input[:]
        new.input.extend(refs)
    for key, r in fdef.ret.items():
        result.ret[key] = ref(r)
    mapping = dict(nested_to_flat)
    mapping.update({f"{n}:output:0": f"{n}:0" for n in folding.consts})
    _log(fdef.signature.name, folding)
    return result, _patched_view(view, folding), mapping


def unread_nodes(view: GraphView, kept: set[str]) -> set[str]:
    """Stateless nodes nothing reads, directly or through other such nodes (a
    Keras RNN's TensorList reserved and never used): TF's function runtime never
    runs them, so they are dropped rather than counted as ops left to TF."""
    readers = _readers(view)
    dead: set[str] = set()
    for name in reversed(view.order):
        node = view.nodes[name]
        if (name not in kept and not node.stateful and node.op not in NEVER_FOLDED
                and all(r in dead for r in readers.get(name, ()))):
            dead.add(name)
    return dead


def prune_function_def(fdef: function_pb2.FunctionDef, view: GraphView,
                       nested_to_flat: dict[str, str], protected: frozenset[str] = frozenset()
                       ) -> tuple[function_pb2.FunctionDef, GraphView]:
    """Drops the stateless nodes of a FunctionDef body nothing reads (not returned,
    not a control output, not ``protected``). Returns the inputs themselves when
    there are none."""
    rets = {producer(nested_to_flat.get(r, r)) for r in fdef.ret.values()}
    kept = set(protected) | rets | set(fdef.control_ret.values())
    dead = unread_nodes(view, kept) & {nd.name for nd in fdef.node_def}
    if not dead:
        return fdef, view
    result = function_pb2.FunctionDef()
    result.CopyFrom(fdef)
    del result.node_def[:]
    result.node_def.extend(nd for nd in fdef.node_def if nd.name not in dead)
    log.info("%s: dropped %d node(s) nothing reads", fdef.signature.name, len(dead))
    return result, _patched_view(view, Folding({}, dead))


def prune_graph_def(graph_def: graph_pb2.GraphDef, view: GraphView,
                    protected: frozenset[str]) -> tuple[graph_pb2.GraphDef, GraphView]:
    """Drops the stateless nodes of a GraphDef nothing reads, for a caller whose
    fetches are all ``protected`` (a traced function: its outputs). Returns the
    inputs themselves when there are none."""
    dead = unread_nodes(view, set(protected))
    if not dead:
        return graph_def, view
    folding = Folding({}, dead)
    return _patched(graph_def, folding), _patched_view(view, folding)
