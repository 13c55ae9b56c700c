"""Cluster extraction and graph rewrite: a cluster becomes one DiscCluster node.

Works on both bodies disc_tf meets: a GraphDef (inputs 'node:index') and a
FunctionDef (inputs 'node:out_arg:index'); the analysis is done in flat names
and every reference is translated back into the body's own naming.
"""

from __future__ import annotations

import dataclasses
import hashlib

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, function_pb2, graph_pb2, node_def_pb2
from tensorflow.python.framework import graph_to_function_def

from disc_tf.cluster import op_registry
from disc_tf.cluster.clustering import HostValues, why_not_compilable
from disc_tf.cluster.graph_view import GraphView, TensorInfo, canonical_tensor_name, producer

DISC_OP = "DiscCluster"


@dataclasses.dataclass
class ClusterSpec:
    """One cluster, self-contained: the subgraph and how it meets the body.

    ``subgraph`` holds a Placeholder ``disc_arg_<i>`` per input followed by the
    clustered nodes (inputs remapped, internal attrs and devices dropped);
    ``outputs`` name tensors of that subgraph. ``constant_inputs`` are the
    inputs a Const or a ReadVariableOp produces: values that stay the same
    while the runtime holds a reference to them (weights), whose GEMM
    packing the runtime keeps across calls. ``resource_inputs`` are inputs
    that are variable handles in the body (ResourceGather's table): the
    DiscCluster op reads the variable, so ``inputs`` and the subgraph's
    placeholder give the value's type.
    """

    name: str
    node_names: list[str]
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    control_inputs: list[str]
    subgraph: graph_pb2.GraphDef
    constant_inputs: list[int] = dataclasses.field(default_factory=list)
    resource_inputs: list[int] = dataclasses.field(default_factory=list)

    def op_summary(self) -> list[tuple[str, str]]:
        """(node name, op type) of every clustered node."""
        return [(n.name, n.op) for n in self.subgraph.node if n.op != "Placeholder"]


#: Producers of values TensorFlow never changes in place while they are
#: referenced: a Const's tensor, and a resource variable's value as read
#: (assignments copy on write when the value is shared). A TF1 reference
#: variable's Identity is not one of them: its assignments write in place.
_WEIGHT_OPS = frozenset({"Const", "ReadVariableOp"})


def arg_name(i: int) -> str:
    """Name of the subgraph placeholder standing for cluster input ``i``."""
    return f"disc_arg_{i}"


def extract_cluster(
    view: GraphView, node_names: list[str], name: str, fetched: frozenset[str],
    resource_values: dict[str, TensorInfo] | None = None,
) -> ClusterSpec:
    """Builds the ClusterSpec of ``node_names`` (topologically ordered).

    ``fetched`` holds flat tensor names read from outside the body (function
    returns, fetches); such tensors always become cluster outputs.
    ``resource_values`` gives the value a resource input stands for where no member
    reads it directly (a loop's body does): handle tensor -> value.
    """
    members = set(node_names)
    # Shape computations a member needs on the host (Shape -> StridedSlice ->
    # Pack feeding a Reshape) are copied in when they run elsewhere: the host
    # runner recomputes them from dims, which costs nothing.
    host = HostValues(view)
    chain: list[str] = []
    for n in node_names:
        support = op_registry.lookup(view.nodes[n].op)
        wanted = (support.const_inputs + support.shape_inputs) if support else ()
        for i in wanted:
            if i < len(view.nodes[n].inputs) and host.known(view.nodes[n].inputs[i].name):
                chain += [c for c in host.chain(view.nodes[n].inputs[i].name)
                          if c not in members and c not in chain]
    # Small constants outside the cluster are copied in rather than passed in:
    # their values are then known to the compiler (e.g. reduction axes).
    copied = []
    for n in chain + list(node_names):
        for t in view.nodes[n].inputs:
            src = view.nodes.get(producer(t.name))
            if (src is not None and src.op == "Const" and src.name not in members
                    and src.name not in copied and view.only_source_controls(src.name)
                    and why_not_compilable(src) is None):
                copied.append(src.name)
    copied += chain
    members |= set(copied)
    order = {name: i for i, name in enumerate(view.order)}
    node_names = sorted(copied + list(node_names), key=order.__getitem__)
    inputs: list[TensorInfo] = []
    input_index: dict[str, int] = {}
    control_inputs: list[str] = []
    for n in node_names:
        node = view.nodes[n]
        for t in node.inputs:
            if producer(t.name) not in members and t.name not in input_index:
                input_index[t.name] = len(inputs)
                inputs.append(t)
        for c in node.control_inputs:
            if c not in members and c not in control_inputs:
                control_inputs.append(c)
    resource_inputs = [i for i, t in enumerate(inputs) if t.dtype == tf.resource]
    for i in resource_inputs:
        inputs[i] = (resource_values or {}).get(inputs[i].name) or \
            _variable_value(view, inputs[i], node_names)
    consumers = view.consumers()
    outputs = [
        t
        for n in node_names
        if n not in copied
        for t in view.nodes[n].outputs
        if t.name in fetched or any(c not in members for c, _ in consumers.get(t.name, []))
    ]

    sub = graph_pb2.GraphDef()
    for i, t in enumerate(inputs):
        ph = sub.node.add(name=arg_name(i), op="Placeholder")
        ph.attr["dtype"].type = t.dtype.as_datatype_enum
        ph.attr["shape"].shape.CopyFrom(tf.TensorShape(t.dims).as_proto())
    for n in node_names:
        src = view.nodes[n].node_def
        nd = sub.node.add(name=src.name, op=src.op)
        for key, value in src.attr.items():
            if not key.startswith("_"):
                nd.attr[key].CopyFrom(value)
        for i in src.input:
            if i.startswith("^"):
                continue
            flat = canonical_tensor_name(i)
            nd.input.append(f"{arg_name(input_index[flat])}:0" if flat in input_index else flat)
    constant_inputs = [i for i, t in enumerate(inputs)
                       if getattr(view.nodes.get(producer(t.name)), "op", None) in _WEIGHT_OPS
                       or producer(t.name) in view.constant_args or i in resource_inputs]
    return ClusterSpec(name, [n for n in node_names if n not in copied], inputs, outputs,
                       control_inputs, sub, constant_inputs, resource_inputs)


def _variable_value(view: GraphView, handle: TensorInfo, members: list[str]) -> TensorInfo:
    """The value a cluster reads through variable ``handle``: typed by its reader
    (ResourceGather's ``dtype``), dims from the reader's output (dim ``batch_dims``,
    the gathered one, unknown)."""
    reader = next(view.nodes[n] for n in members
                  if view.nodes[n].inputs and view.nodes[n].inputs[0].name == handle.name)
    batch = reader.node_def.attr["batch_dims"].i
    out, ids = reader.outputs[0].dims, reader.inputs[1].dims
    dims = tuple(out[:batch]) + (None,) + tuple(out[len(ids):])
    return TensorInfo(handle.name, tf.as_dtype(reader.node_def.attr["dtype"].type), dims)


def _gathers_of_values(sub: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
    """``sub`` with each ResourceGather (reading a value placeholder) as the
    GatherV2 TF runs on that value, so that it imports as a TF graph."""
    out = graph_pb2.GraphDef()
    out.CopyFrom(sub)
    for nd in out.node:
        if nd.op != "ResourceGather":
            continue
        axis = out.node.add(name=f"{nd.name}/disc_axis", op="Const")
        axis.attr["dtype"].type = tf.int32.as_datatype_enum
        axis.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(nd.attr["batch_dims"].i, tf.int32))
        dtype, batch = nd.attr["dtype"], nd.attr["batch_dims"].i
        indices = nd.attr["Tindices"]
        nd.op = "GatherV2"
        nd.attr.clear()
        nd.attr["Tparams"].CopyFrom(dtype)
        nd.attr["Tindices"].CopyFrom(indices)
        nd.attr["Taxis"].type = tf.int32.as_datatype_enum
        nd.attr["batch_dims"].i = batch
        nd.input.append(f"{axis.name}:0")
    return out


def fallback_function(spec: ClusterSpec) -> function_pb2.FunctionDef:
    """The cluster's original ops as a FunctionDef with the cluster's signature."""
    sub = _gathers_of_values(spec.subgraph)
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(sub, name="")
    ops = [graph.get_operation_by_name(n.name) for n in sub.node]
    ins = [graph.get_tensor_by_name(f"{arg_name(i)}:0") for i in range(len(spec.inputs))]
    outs = [graph.get_tensor_by_name(t.name) for t in spec.outputs]
    fdef = graph_to_function_def.graph_to_function_def(
        graph, ops, ins, outs, out_names=[f"out_{k}" for k in range(len(outs))]
    )
    digest = hashlib.sha256(spec.subgraph.SerializeToString(deterministic=True)).hexdigest()[:12]
    fdef.signature.name = f"disc_fallback_{spec.name}_{digest}"
    return fdef


@dataclasses.dataclass
class CompiledClusterAttrs:
    """What the compiler produced for a cluster, to store in its DiscCluster node."""

    artifact: bytes
    artifact_sha256: str
    num_kernels: int
    #: who vouches for ``artifact`` (``disc_tf/trust.py``); empty: no one
    signatures: tuple[str, ...] = ()


def disc_node(
    spec: ClusterSpec,
    input_refs: list[str],
    control_refs: list[str],
    fallback_name: str,
    compiled: CompiledClusterAttrs,
) -> node_def_pb2.NodeDef:
    """The DiscCluster NodeDef replacing ``spec`` (inputs in the body's naming)."""
    nd = node_def_pb2.NodeDef(name=spec.name, op=DISC_OP)
    nd.input.extend(input_refs)
    nd.input.extend("^" + c for c in control_refs)
    nd.attr["Tin"].list.type.extend(
        tf.resource.as_datatype_enum if i in spec.resource_inputs else t.dtype.as_datatype_enum
        for i, t in enumerate(spec.inputs))
    nd.attr["Tout"].list.type.extend(t.dtype.as_datatype_enum for t in spec.outputs)
    nd.attr["output_shapes"].list.shape.extend(
        tf.TensorShape(t.dims).as_proto() for t in spec.outputs
    )
    nd.attr["artifact"].s = compiled.artifact
    nd.attr["artifact_sha256"].s = compiled.artifact_sha256.encode()
    if compiled.signatures:
        nd.attr["artifact_signatures"].list.s.extend(sig.encode() for sig in compiled.signatures)
    nd.attr["fallback"].func.name = fallback_name
    nd.attr["cluster_name"].s = spec.name.encode()
    nd.attr["num_kernels"].i = compiled.num_kernels
    nd.attr["constant_inputs"].list.i.extend(spec.constant_inputs)
    return nd


def _replace_refs(
    refs, to_flat, out_ref: dict[str, str], ctrl: dict[str, str]
) -> list[str]:
    """Maps each input reference onto cluster outputs where it reads one."""
    result = []
    for r in refs:
        if r.startswith("^"):
            new = "^" + ctrl.get(r[1:], r[1:])
            if new not in result:
                result.append(new)
        else:
            result.append(out_ref.get(to_flat(r), r))
    return result


def _name_keepers(spec: ClusterSpec, protected: frozenset[str],
                  output_ref: str) -> list[node_def_pb2.NodeDef]:
    """An IdentityN named like each protected node of ``spec``, re-exposing that
    node's outputs (all of them cluster outputs, in order) from the DiscCluster
    node; ``output_ref`` formats the reference of cluster output k."""
    by_node: dict[str, list[tuple[int, TensorInfo]]] = {}
    for k, t in enumerate(spec.outputs):
        by_node.setdefault(producer(t.name), []).append((k, t))
    keepers = []
    for n in spec.node_names:
        if n in protected:
            outs = by_node.get(n, [])
            ident = node_def_pb2.NodeDef(name=n, op="IdentityN")
            ident.input.extend(output_ref.format(name=spec.name, k=k) for k, _ in outs)
            ident.attr["T"].list.type.extend(t.dtype.as_datatype_enum for _, t in outs)
            keepers.append(ident)
    return keepers


def rewrite_graph_def(
    graph_def: graph_pb2.GraphDef,
    replaced: list[tuple[ClusterSpec, node_def_pb2.NodeDef]],
    protected: frozenset[str],
) -> graph_pb2.GraphDef:
    """Returns ``graph_def`` with each cluster replaced by its DiscCluster node.

    Nodes named in ``protected`` keep their names: an IdentityN of that name
    re-exposes their outputs from the cluster.
    """
    out_ref: dict[str, str] = {}
    ctrl: dict[str, str] = {}
    removed: set[str] = set()
    extra: list[node_def_pb2.NodeDef] = []
    for spec, _ in replaced:
        removed.update(spec.node_names)
        for k, t in enumerate(spec.outputs):
            out_ref[t.name] = f"{spec.name}:{k}"
        for n in spec.node_names:
            ctrl[n] = spec.name
        extra += _name_keepers(spec, protected, "{name}:{k}")
    result = graph_pb2.GraphDef()
    result.versions.CopyFrom(graph_def.versions)
    result.library.CopyFrom(graph_def.library)
    for nd in graph_def.node:
        if nd.name in removed:
            continue
        new = result.node.add()
        new.CopyFrom(nd)
        del new.input[:]
        new.input.extend(_replace_refs(nd.input, canonical_tensor_name, out_ref, ctrl))
    for _, node in replaced:
        # A cluster may read from, or wait for, a node merged into another cluster.
        new = result.node.add()
        new.CopyFrom(node)
        del new.input[:]
        new.input.extend(_replace_refs(node.input, canonical_tensor_name, out_ref, ctrl))
    result.node.extend(extra)
    return result


def rewrite_function_def(
    fdef: function_pb2.FunctionDef,
    nested_to_flat: dict[str, str],
    replaced: list[tuple[ClusterSpec, node_def_pb2.NodeDef]],
    protected: frozenset[str] = frozenset(),
) -> function_pb2.FunctionDef:
    """Returns ``fdef`` with each cluster replaced by its DiscCluster node.

    Nodes named in ``protected`` (tensors the SavedModel's object graph names)
    keep their names: an IdentityN of that name re-exposes their outputs, so the
    function's graph still has tensors ``<name>:<i>``.
    """
    out_ref: dict[str, str] = {}
    ctrl: dict[str, str] = {}
    removed: set[str] = set()
    extra: list[node_def_pb2.NodeDef] = []
    for spec, _ in replaced:
        removed.update(spec.node_names)
        for k, t in enumerate(spec.outputs):
            out_ref[t.name] = f"{spec.name}:outputs:{k}"
        for n in spec.node_names:
            ctrl[n] = spec.name
        extra += _name_keepers(spec, protected, "{name}:outputs:{k}")

    def to_flat(ref: str) -> str:
        return nested_to_flat.get(ref, ref)

    result = function_pb2.FunctionDef()
    result.CopyFrom(fdef)
    del result.node_def[:]
    for nd in fdef.node_def:
        if nd.name in removed:
            continue
        new = result.node_def.add()
        new.CopyFrom(nd)
        del new.input[:]
        new.input.extend(_replace_refs(nd.input, to_flat, out_ref, ctrl))
    for _, node in replaced:
        new = result.node_def.add()
        new.CopyFrom(node)
        del new.input[:]
        new.input.extend(_replace_refs(node.input, to_flat, out_ref, ctrl))
    result.node_def.extend(extra)
    for key, ref in fdef.ret.items():
        result.ret[key] = out_ref.get(to_flat(ref), ref)
    # A control output is named by its node, so each must name another one: when
    # several stateful nodes (two embedding lookups) moved into one cluster, all
    # but the first wait for it through a NoOp of their own.
    taken = {nd.name for nd in result.node_def}
    named: set[str] = set()
    for key, node_name in sorted(fdef.control_ret.items()):
        target = ctrl.get(node_name, node_name)
        if target in named:
            alias = f"{node_name}_disc_control"
            while alias in taken:
                alias += "_"
            taken.add(alias)
            result.node_def.add(name=alias, op="NoOp", input=[f"^{target}"])
            target = alias
        named.add(target)
        result.control_ret[key] = target
    return result


def make_func_attr(name: str) -> attr_value_pb2.AttrValue:
    """An AttrValue naming function ``name``."""
    value = attr_value_pb2.AttrValue()
    value.func.name = name
    return value
