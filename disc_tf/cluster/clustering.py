"""Marking and clustering: which nodes are compilable, and how they group.

Clusters grow along data edges; two clusters merge only when the contracted
graph (data and control edges) stays acyclic. Every node that stays outside a
cluster gets a reason, which ``disc-tf inspect`` prints.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from disc_tf.cluster import op_registry
from disc_tf.cluster.graph_view import GraphView, NodeInfo, producer

#: TF1 control-flow ops; a body holding any of them is left unclustered for now.
_V1_CONTROL_FLOW = frozenset(
    {"Enter", "RefEnter", "Exit", "RefExit", "NextIteration", "RefNextIteration",
     "Switch", "RefSwitch", "Merge", "RefMerge", "LoopCond"}
)


@dataclasses.dataclass
class ClusteringResult:
    """Clusters (node names in topological order) and why other nodes stay out."""

    clusters: list[list[str]]
    reasons: dict[str, str]


def _device_ok(device: str) -> bool:
    if not device:
        return True
    spec = tf.DeviceSpec.from_string(device)
    return spec.device_type in (None, "CPU")


def _const_too_big(node: NodeInfo) -> bool:
    tensor = node.node_def.attr["value"].tensor
    dims = [d.size for d in tensor.tensor_shape.dim]
    return int(np.prod(dims)) > op_registry.MAX_CONST_ELEMENTS if dims else False


def why_not_compilable(node: NodeInfo) -> str | None:
    """None if ``node`` may join a cluster, else the reason it may not."""
    support = op_registry.lookup(node.op)
    if support is None:
        return f"unsupported op {node.op}"
    if node.stateful:
        return "stateful op"
    if not _device_ok(node.device):
        return f"device {node.device}"
    if support.dtype_attr:
        attr = node.node_def.attr[support.dtype_attr]
        dtype = tf.as_dtype(attr.type) if attr.type else None
        if dtype not in support.dtypes:
            return f"dtype {dtype.name if dtype else '?'} not supported by {node.op}"
    for t in node.inputs + node.outputs:
        if t.dtype not in op_registry.ALL_TYPES:
            return f"dtype {t.dtype.name} of {t.name}"
        if t.rank is None:
            return f"unknown rank of {t.name}"
        if t.rank > op_registry.MAX_RANK:
            return f"rank {t.rank} of {t.name} exceeds {op_registry.MAX_RANK}"
    if node.op == "Const" and _const_too_big(node):
        return "constant too large to embed"
    if support.check is not None:
        return support.check(node.node_def)
    return None


def _why_not_constant(view: GraphView, node: NodeInfo) -> str | None:
    """A reason if an input the op needs at compile time is not a Const node."""
    for i in op_registry.lookup(node.op).const_inputs:
        src = view.nodes.get(producer(node.inputs[i].name)) if i < len(node.inputs) else None
        if src is None or src.op != "Const":
            return f"input {i} of {node.op} must be a constant"
    return None


class _ClusterGraph:
    """Union-find over nodes plus the contracted edge sets, kept acyclic."""

    def __init__(self, view: GraphView) -> None:
        self.parent = {name: name for name in view.nodes}
        self.succs: dict[str, set[str]] = {name: set() for name in view.nodes}
        self.preds: dict[str, set[str]] = {name: set() for name in view.nodes}
        for node in view.nodes.values():
            srcs = {producer(t.name) for t in node.inputs} | set(node.control_inputs)
            for src in srcs:
                if src in self.parent and src != node.name:
                    self.succs[src].add(node.name)
                    self.preds[node.name].add(src)

    def find(self, name: str) -> str:
        root = name
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[name] != root:
            self.parent[name], name = root, self.parent[name]
        return root

    def _reachable_avoiding_direct(self, a: str, b: str) -> bool:
        """True if b is reachable from a through at least one other cluster."""
        stack = [s for s in self.succs[a] if s != b]
        seen = set(stack)
        while stack:
            cur = stack.pop()
            if cur == b:
                return True
            for s in self.succs[cur]:
                if s not in seen:
                    seen.add(s)
                    stack.append(s)
        return False

    def try_merge(self, x: str, y: str) -> bool:
        """Merges the clusters of x and y unless that would create a cycle."""
        a, b = self.find(x), self.find(y)
        if a == b:
            return True
        if self._reachable_avoiding_direct(a, b) or self._reachable_avoiding_direct(b, a):
            return False
        self.parent[b] = a
        for s in self.succs.pop(b):
            self.preds[s].discard(b)
            if s != a:
                self.succs[a].add(s)
                self.preds[s].add(a)
        for p in self.preds.pop(b):
            self.succs[p].discard(b)
            if p != a:
                self.preds[a].add(p)
                self.succs[p].add(a)
        self.succs[a].discard(a)
        self.preds[a].discard(a)
        return True


def find_clusters(
    view: GraphView, *, min_cluster_size: int = 2, protected: frozenset[str] = frozenset()
) -> ClusteringResult:
    """Groups compilable nodes of ``view`` into clusters.

    ``protected`` names nodes whose names must survive the rewrite (fetches);
    they may be clustered (the rewrite re-creates their names).
    """
    reasons: dict[str, str] = {}
    if any(n.op in _V1_CONTROL_FLOW for n in view.nodes.values()):
        for name in view.order:
            reasons[name] = "body has TF1 control flow (not clustered yet)"
        return ClusteringResult([], reasons)

    compilable: set[str] = set()
    for name in view.order:
        why = why_not_compilable(view.nodes[name]) or _why_not_constant(view, view.nodes[name])
        if why is None:
            compilable.add(name)
        else:
            reasons[name] = why
    consts = {n for n in compilable if view.nodes[n].op == "Const"}
    graph = _ClusterGraph(view)
    for name in view.order:
        if name not in compilable or name in consts:
            continue
        for t in view.nodes[name].inputs:
            src = producer(t.name)
            if src in compilable and src not in consts and not graph.try_merge(src, name):
                reasons.setdefault(src, "merging would create a cycle")

    members: dict[str, list[str]] = {}
    for name in view.order:
        if name in compilable and name not in consts:
            members.setdefault(graph.find(name), []).append(name)

    # Constants join the cluster that consumes them, if exactly one does.
    consumers = view.consumers()
    control_consumers = view.control_consumers()
    for name in consts:
        node = view.nodes[name]
        users = {c for t in node.outputs for c, _ in consumers.get(t.name, [])}
        roots = {graph.find(u) if u in compilable and u not in consts else None for u in users}
        if (
            len(roots) == 1
            and None not in roots
            and not node.control_inputs
            and name not in control_consumers
            and name not in protected
        ):
            members[roots.pop()].append(name)
        else:
            reasons[name] = "constant not used by exactly one cluster"

    clusters = []
    for nodes in members.values():
        nontrivial = [n for n in nodes if not op_registry.lookup(view.nodes[n].op).trivial]
        if len(nontrivial) >= min_cluster_size:
            order = {n: i for i, n in enumerate(view.order)}
            clusters.append(sorted(nodes, key=order.__getitem__))
        else:
            for n in nodes:
                reasons[n] = f"cluster too small ({len(nontrivial)} < {min_cluster_size} ops)"
    clustered = {n for c in clusters for n in c}
    reasons = {n: why for n, why in reasons.items() if n not in clustered}
    return ClusteringResult(clusters, reasons)
