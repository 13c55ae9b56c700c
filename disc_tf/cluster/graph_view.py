"""A read-only, analysed view of one graph body (a GraphDef or a FunctionDef).

Both containers are brought to GraphDef naming ("node:index") and imported into
a scratch ``tf.Graph`` so that TensorFlow's own shape inference supplies every
tensor's dtype and rank. Clustering and rewriting only read this view.
"""

from __future__ import annotations

import dataclasses
import logging

import tensorflow as tf
from tensorflow.core.framework import function_pb2, graph_pb2
from tensorflow.python.framework import function_def_to_graph

log = logging.getLogger("disc_tf.cluster")


@dataclasses.dataclass
class TensorInfo:
    """One tensor of the view: flat name, dtype and TF-inferred dims.

    ``dims`` is None when even the rank is unknown; a dim is None when dynamic.
    """

    name: str
    dtype: tf.DType
    dims: tuple | None

    @property
    def rank(self) -> int | None:
        """Number of dims, or None if unknown."""
        return None if self.dims is None else len(self.dims)


@dataclasses.dataclass
class NodeInfo:
    """One node of the view, with its data/control inputs in flat naming."""

    name: str
    op: str
    device: str
    node_def: tf.compat.v1.NodeDef
    inputs: list[TensorInfo]
    control_inputs: list[str]
    outputs: list[TensorInfo]
    stateful: bool


def canonical_tensor_name(name: str) -> str:
    """'node' -> 'node:0'; control and already indexed names are returned as is."""
    if name.startswith("^") or ":" in name:
        return name
    return name + ":0"


def producer(tensor_name: str) -> str:
    """The node name of a flat tensor name ('node:1' -> 'node')."""
    return tensor_name.lstrip("^").split(":")[0]


@dataclasses.dataclass
class GraphView:
    """Nodes of one body in flat naming, with TF-inferred dtypes and ranks."""

    nodes: dict[str, NodeInfo]
    order: list[str]  # topological order of node names
    flat_graph_def: graph_pb2.GraphDef
    #: arguments of a function body bound to constants (a SavedModel's captured
    #: ``tf.constant``s): constant like a Const node, for the GEMM weight cache
    constant_args: frozenset[str] = frozenset()

    def consumers(self) -> dict[str, list[tuple[str, int]]]:
        """Flat tensor name -> [(consumer node, input index)]."""
        result: dict[str, list[tuple[str, int]]] = {}
        for node in self.nodes.values():
            for i, t in enumerate(node.inputs):
                result.setdefault(t.name, []).append((node.name, i))
        return result

    def only_source_controls(self, name: str) -> bool:
        """Whether every control input of ``name`` is a NoOp that reads only nodes
        with no inputs (as the ``input_control_node`` TF gives each Const of an
        inlined function, after the variable handles): nothing in a cluster can be
        upstream of it, so the node may be copied or moved into a cluster, which
        inherits the edge."""
        def is_source(n: str) -> bool:
            node = self.nodes.get(n)
            return node is not None and not node.inputs and not node.control_inputs

        for c in self.nodes[name].control_inputs:
            src = self.nodes.get(c)
            if src is None or src.op != "NoOp" or not all(
                    is_source(producer(t.name)) for t in src.inputs) or not all(
                    is_source(d) for d in src.control_inputs):
                return False
        return True

    def control_consumers(self) -> dict[str, list[str]]:
        """Node name -> nodes that have a control edge from it."""
        result: dict[str, list[str]] = {}
        for node in self.nodes.values():
            for c in node.control_inputs:
                result.setdefault(c, []).append(node.name)
        return result


def _dims(shape: tf.TensorShape) -> tuple | None:
    return None if shape.rank is None else tuple(shape.as_list())


def _topological_order(graph_def: graph_pb2.GraphDef) -> list[str]:
    """Kahn's algorithm over data+control edges; TF1 loop back edges are cut."""
    op_of = {n.name: n.op for n in graph_def.node}
    back_edge_ops = ("NextIteration", "RefNextIteration")
    succs: dict[str, list[str]] = {name: [] for name in op_of}
    indegree = dict.fromkeys(op_of, 0)
    for n in graph_def.node:
        for src in {producer(i) for i in n.input}:
            if src in op_of and op_of[src] not in back_edge_ops:
                succs[src].append(n.name)
                indegree[n.name] += 1
    ready = [name for name, d in indegree.items() if d == 0]
    order = []
    while ready:
        name = ready.pop()
        order.append(name)
        for s in succs[name]:
            indegree[s] -= 1
            if indegree[s] == 0:
                ready.append(s)
    if len(order) != len(op_of):
        raise ValueError("graph has a cycle that is not a TF1 while loop")
    return order


def with_default_attrs(nd: tf.compat.v1.NodeDef, op_def) -> tf.compat.v1.NodeDef:
    """``nd`` with the attrs its op def defaults filled in (SavedModels strip them)."""
    if op_def is None or all(a.name in nd.attr or not a.HasField("default_value")
                             for a in op_def.attr):
        return nd
    full = tf.compat.v1.NodeDef()
    full.CopyFrom(nd)
    for a in op_def.attr:
        if a.name not in full.attr and a.HasField("default_value"):
            full.attr[a.name].CopyFrom(a.default_value)
    return full


COLOCATION_PREFIX = "loc:@"


def colocation_targets(nd: tf.compat.v1.NodeDef) -> list[str]:
    """The node names ``nd`` must be colocated with (its ``_class`` attr)."""
    if "_class" not in nd.attr:
        return []
    return [c.decode()[len(COLOCATION_PREFIX):] for c in nd.attr["_class"].list.s
            if c.decode().startswith(COLOCATION_PREFIX)]


def _drop_dangling_colocation(graph_def: graph_pb2.GraphDef) -> None:
    """Removes colocation with nodes the graph lacks, which TF's importer rejects. A
    function body traced with a captured variable names the capture's placeholder
    (``embedding_lookup/12``) where the FunctionDef has an argument instead."""
    names = {n.name for n in graph_def.node}
    for nd in graph_def.node:
        targets = colocation_targets(nd)
        if targets and any(t not in names for t in targets):
            kept = [f"{COLOCATION_PREFIX}{t}".encode() for t in targets if t in names]
            if kept:
                del nd.attr["_class"].list.s[:]
                nd.attr["_class"].list.s.extend(kept)
            else:
                del nd.attr["_class"]


def view_of_graph_def(
    graph_def: graph_pb2.GraphDef,
    library: function_pb2.FunctionDefLibrary | None = None,
    graph: tf.Graph | None = None,
) -> GraphView:
    """Analyses a flat GraphDef (inputs named 'node:index').

    ``library`` supplies the functions that call nodes refer to, so that TF can
    infer their output shapes. ``graph``, if given, is the live graph the
    GraphDef came from; its shapes (which know resource handle data) are used
    instead of re-importing.
    """
    if graph is None:
        full = graph_pb2.GraphDef()
        full.CopyFrom(graph_def)
        if library is not None:
            full.library.CopyFrom(library)
        _drop_dangling_colocation(full)
        graph = tf.Graph()
        with graph.as_default():
            tf.graph_util.import_graph_def(full, name="")
    tensors: dict[str, TensorInfo] = {}
    for nd in graph_def.node:
        op = graph.get_operation_by_name(nd.name)
        recorded = nd.attr["_output_shapes"].list.shape if "_output_shapes" in nd.attr else []
        for k, t in enumerate(op.outputs):
            dims = _dims(t.shape)
            if dims is None and k < len(recorded) and not recorded[k].unknown_rank:
                dims = _dims(tf.TensorShape(recorded[k]))  # shape recorded when the graph was built
            tensors[f"{nd.name}:{k}"] = TensorInfo(f"{nd.name}:{k}", t.dtype, dims)
    nodes: dict[str, NodeInfo] = {}
    for nd in graph_def.node:
        op = graph.get_operation_by_name(nd.name)
        data_inputs = [canonical_tensor_name(x) for x in nd.input if not x.startswith("^")]
        nodes[nd.name] = NodeInfo(
            name=nd.name,
            op=nd.op,
            device=nd.device,
            node_def=with_default_attrs(nd, op.op_def),
            inputs=[
                tensors.get(name) or TensorInfo(name, t.dtype, _dims(t.shape))
                for name, t in zip(data_inputs, op.inputs)
            ],
            control_inputs=[producer(i) for i in nd.input if i.startswith("^")],
            outputs=[tensors[f"{nd.name}:{k}"] for k in range(len(op.outputs))],
            stateful=op.op_def.is_stateful if op.op_def is not None else True,
        )
    return GraphView(nodes=nodes, order=_topological_order(graph_def), flat_graph_def=graph_def)


def view_of_function_def(
    fdef: function_pb2.FunctionDef, library: function_pb2.FunctionDefLibrary | None = None
) -> tuple[GraphView, dict[str, str]]:
    """Analyses a FunctionDef body.

    Returns the view and the map from FunctionDef tensor names
    ('node:out_arg:index', 'arg') to flat names ('node:flat_index', 'arg:0').
    Argument shapes come from the FunctionDef's ``_output_shapes`` arg attrs.
    """
    scratch = tf.Graph()
    with scratch.as_default():
        if library is not None and library.function:
            # TF resolves call nodes against the default graph's functions; outside
            # the process that traced them, only ``library`` knows them.
            tf.graph_util.import_graph_def(graph_pb2.GraphDef(library=library), name="")
        graph_def, nested_to_flat = function_def_to_graph.function_def_to_graph_def(fdef)
    return view_of_graph_def(graph_def, library), nested_to_flat
