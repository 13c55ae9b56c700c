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
from disc_tf.cluster.graph_view import GraphView, NodeInfo, colocation_targets, producer


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


def why_not_compilable(node: NodeInfo, host: HostValues | None = None) -> str | None:
    """None if ``node`` may join a cluster, else the reason it may not.

    ``host`` decides whether the host can evaluate a node (needed for dtypes an
    op supports only as a shape computation, e.g. int StridedSlice of a shape).
    """
    support = op_registry.lookup(node.op)
    if node.op in op_registry.EXCLUDED:
        return op_registry.EXCLUDED[node.op]
    if support is None:
        return f"unsupported op {node.op}"
    if node.stateful and not support.resource_inputs:
        return "stateful op"
    if not _device_ok(node.device):
        return f"device {node.device}"
    if support.dtype_attr:
        attr = node.node_def.attr[support.dtype_attr]
        dtype = tf.as_dtype(attr.type) if attr.type else None
        if dtype not in support.dtypes:
            if dtype in support.host_dtypes and host is not None and host.evaluable(node):
                pass
            elif dtype in support.host_dtypes:
                return f"{node.op} on {dtype.name} only where it computes a shape from dims"
            else:
                return f"dtype {dtype.name if dtype else '?'} not supported by {node.op}"
    resources = [t for i, t in enumerate(node.inputs) if i in support.resource_inputs]
    if any(t.dtype != tf.resource for t in resources):
        return f"{node.op} reads a reference variable (TF1), not a resource"
    for t in node.inputs + node.outputs:
        if t in resources:
            continue
        if t.dtype not in op_registry.ALL_TYPES:
            return f"dtype {t.dtype.name} of {t.name}"
        if t.rank is None:
            return f"unknown rank of {t.name}"
        if t.rank > op_registry.MAX_RANK:
            return f"rank {t.rank} of {t.name} exceeds {op_registry.MAX_RANK}"
    if node.op == "Const" and _const_too_big(node):
        return "constant too large to embed"
    if support.check is not None and (why := support.check(node.node_def)):
        return why
    if support.shape_check is not None:
        return support.shape_check(node)
    return None


class HostValues:
    """Which tensors of a view the host runner can compute: constants, and small
    integer results of ``op_registry.HOST_OPS`` over them and over dims (Shape)."""

    def __init__(self, view: GraphView) -> None:
        self.view = view
        self._memo: dict[tuple[str, bool], bool] = {}

    def known(self, tensor: str, static: bool = False) -> bool:
        """True if the host knows ``tensor``'s value (at compile time if ``static``)."""
        key = (tensor, static)
        if key not in self._memo:
            self._memo[key] = False  # no cycles through a pending query
            node = self.view.nodes.get(producer(tensor))
            self._memo[key] = node is not None and self._node_known(node, static)
        return self._memo[key]

    def exact_float(self, tensor: str) -> bool:
        """True if ``tensor`` is a float scalar the host knows exactly: a constant, or
        an integer host value cast to float (``Cast(tf.shape(x)[1])``, the limit of
        a Keras ``arange`` over a sequence length)."""
        node = self.view.nodes.get(producer(tensor))
        if node is None or node.control_inputs or node.outputs[0].dims != ():
            return False
        if node.op == "Const":
            return node.outputs[0].dtype.is_floating
        if node.op in ("Identity", "StopGradient", "Snapshot"):
            return self.exact_float(node.inputs[0].name)
        return node.op == "Cast" and node.outputs[0].dtype.is_floating \
            and node.inputs[0].dtype in (tf.int32, tf.int64) and self.known(node.inputs[0].name)

    def evaluable(self, node: NodeInfo) -> bool:
        """True if the host can compute every output of ``node`` from dims."""
        return self._node_known(node, False)

    def _node_known(self, node: NodeInfo, static: bool) -> bool:
        if node.control_inputs and node.op != "Const":
            return False
        if static and node.op == "Const" and node.outputs[0].dtype.is_floating \
                and node.outputs[0].dims == ():
            return True  # a float scalar known when compiling (a float Range's bounds)
        max_rank = 2 if node.op == "Const" else 1  # a Const may be a [rank, 2] paddings
        if any(t.dtype not in (tf.int32, tf.int64) or t.dims is None or len(t.dims) > max_rank
               or None in t.dims or int(np.prod(t.dims)) > op_registry.MAX_HOST_ELEMENTS
               for t in node.outputs):
            return False
        if node.op == "Const":
            return True
        if node.op in ("Shape", "ShapeN", "Size", "Rank"):
            return all(t.dims is not None and (not static or None not in t.dims)
                       for t in node.inputs)
        if node.op not in op_registry.HOST_OPS:
            return False
        need_static = {i % len(node.inputs) for i in op_registry.HOST_OPS[node.op]}
        return all(self.known(t.name, static or i in need_static)
                   for i, t in enumerate(node.inputs))

    def chain(self, tensor: str) -> list[str]:
        """The non-Const nodes computing host-known ``tensor``, producers first."""
        out: list[str] = []

        def visit(name: str) -> None:
            node = self.view.nodes[producer(name)]
            if node.op == "Const" or node.name in out:
                return
            if node.op not in ("Shape", "ShapeN", "Size", "Rank"):
                for t in node.inputs:
                    visit(t.name)
            out.append(node.name)

        visit(tensor)
        return out


def _why_not_host_known(host: HostValues, node: NodeInfo) -> str | None:
    """A reason if an input the op needs at compile time (or on the host) is unknown."""
    support = op_registry.lookup(node.op)
    if node.op == "Range" and node.outputs[0].dtype.is_floating:
        # A float Range's bounds: constants, or integer host values cast to float.
        for i, t in enumerate(node.inputs):
            if not host.exact_float(t.name):
                return f"input {i} of {node.op} must be a constant or a cast dim"
        return None
    for i in support.const_inputs:
        if i >= len(node.inputs) or not host.known(node.inputs[i].name, static=True):
            return f"input {i} of {node.op} must be a constant"
    for i in support.shape_inputs:
        if i >= len(node.inputs) or not host.known(node.inputs[i].name):
            return f"input {i} of {node.op} must be computable from constants and dims"
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
                # TF1 loop back edges (NextIteration -> Merge) join iterations, not a cycle.
                if src in view.nodes and view.nodes[src].op in ("NextIteration",
                                                                "RefNextIteration"):
                    continue
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


def _why_colocated(node: NodeInfo, view: GraphView) -> str | None:
    """Nodes colocated with another node of the body (``_class: loc:@x``, e.g. a
    variable's readers in TF1) keep their placement: they are not clustered. A
    target the body lacks (a function's captured variable) places nothing, nor does
    the variable a resource reader (ResourceGather) reads: the cluster reads it too."""
    support = op_registry.lookup(node.op)
    read = {producer(node.inputs[i].name) for i in (support.resource_inputs if support else ())}
    others = [t for t in colocation_targets(node.node_def)
              if t != node.name and t in view.nodes and t not in read]
    return f"colocated with {others[0]}" if others else None


def control_flow_contexts(view: GraphView) -> dict[str, str | None]:
    """Each node's TF1 control-flow context: "" outside any while frame or cond
    branch, "frame:<name>/..." or ".../switch:<node>:<branch>" inside; None where
    data inputs come from different contexts. Clusters never mix contexts."""
    ctx: dict[str, str | None] = {}

    def parent(c: str) -> str:
        return c.rsplit("|", 1)[0] if "|" in c else ""

    for name in view.order:
        node = view.nodes[name]
        ins = []
        for t in node.inputs:
            src = producer(t.name)
            if src not in ctx:
                continue  # a loop's back edge (NextIteration -> Merge), or outside the body
            c = ctx[src]
            if c is not None and view.nodes.get(src) is not None and view.nodes[src].op in (
                    "Switch", "RefSwitch"):
                c = f"{c}|switch:{src}:{t.name.rsplit(':', 1)[-1]}"
            ins.append(c)
        if node.op in ("NextIteration", "RefNextIteration", "Merge", "RefMerge"):
            # Merge joins branches (or a loop's entry and back edge): the enclosing context.
            known = [c for c in ins if c is not None]
            base = min(known, key=len) if known else ""
            ctx[name] = parent(base) if node.op.endswith("Merge") and "switch:" in base.rsplit(
                "|", 1)[-1] else base
            continue
        distinct = {c for c in ins}
        if None in distinct or len(distinct) > 1:
            # A loop's Merge also takes the back edge: contexts nested in one another
            # are the deepest; anything else is a conflict.
            chain = sorted((c for c in distinct if c is not None), key=len)
            ok = None not in distinct and all(chain[-1].startswith(c) for c in chain)
            current = chain[-1] if ok else None
        else:
            current = distinct.pop() if distinct else ""
        if node.op in ("Enter", "RefEnter") and current is not None:
            frame = node.node_def.attr["frame_name"].s.decode()
            current = f"{current}|frame:{frame}"
        elif node.op in ("Exit", "RefExit") and current is not None:
            while current and not current.rsplit("|", 1)[-1].startswith("frame:"):
                current = parent(current)
            current = parent(current)
        ctx[name] = current
    return ctx


def _join_siblings(view: GraphView, graph: _ClusterGraph, nodes: set[str],
                   contexts: dict[str, str | None], min_cluster_size: int) -> None:
    """Merges each cluster too small to compile into a cluster reading one of its
    inputs (the largest that stays acyclic): a lone ``Max(ids)`` beside the cluster
    checking ``ids < vocab`` becomes one more output of it instead of a TF op."""
    groups: dict[str, list[str]] = {}
    for name in view.order:
        if name in nodes:
            groups.setdefault(graph.find(name), []).append(name)

    def size(root: str) -> int:
        return sum(1 for n in groups.get(root, ()) if not op_registry.lookup(view.nodes[n].op).trivial)

    consumers = view.consumers()
    position = {n: i for i, n in enumerate(view.order)}
    for root, members in list(groups.items()):
        if size(root) >= min_cluster_size or not members:
            continue
        siblings = {graph.find(c) for n in members for t in view.nodes[n].inputs
                    if getattr(view.nodes.get(producer(t.name)), "op", "Const") != "Const"
                    for c, _ in consumers.get(t.name, [])
                    if c in nodes and contexts.get(c, "") == contexts.get(n, "")}
        siblings.discard(root)
        # the largest first; among equals the first in the graph (deterministic)
        for other in sorted(siblings, key=lambda r: (-size(r), position[r])):
            if graph.try_merge(other, root):  # ``other`` stays the root
                groups[other] = groups.get(other, []) + groups.pop(root)
                break


def find_clusters(
    view: GraphView, *, min_cluster_size: int = 2, protected: frozenset[str] = frozenset(),
    refused: dict[str, str] | None = None,
) -> ClusteringResult:
    """Groups compilable nodes of ``view`` into clusters.

    ``protected`` names nodes whose names must survive the rewrite (fetches);
    they may be clustered (the rewrite re-creates their names). ``refused``: nodes a
    later stage refused (a lowering that failed), with why; they stay out.
    """
    refused = refused or {}
    reasons: dict[str, str] = {}
    contexts = control_flow_contexts(view)

    compilable: set[str] = set()
    host = HostValues(view)
    for name in view.order:
        node = view.nodes[name]
        why = why_not_compilable(node, host) or _why_not_host_known(host, node)
        if why is None and contexts.get(name, "") is None:
            why = "inputs from different TF1 control-flow contexts"
        if why is None:
            why = _why_colocated(node, view)
        if why is None and name in refused:
            why = refused[name]
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
            if src not in compilable or src in consts:
                continue
            if contexts.get(src, "") != contexts.get(name, ""):
                continue  # a cluster never spans TF1 frames or cond branches
            if not graph.try_merge(src, name):
                reasons.setdefault(src, "merging would create a cycle")

    _join_siblings(view, graph, compilable - consts, contexts, min_cluster_size)
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
            and view.only_source_controls(name)
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
