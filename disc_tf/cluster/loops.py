"""Functional While loops compiled whole (Keras RNNs): the analysis.

A ``While`` node whose loop variables are tensors, variables (read only) and
TensorLists used the way ``tf.TensorArray`` uses them -- one list unstacked from a
tensor and read at a loop variable's index (``TensorListFromTensor`` ->
``TensorListGetItem``), one list reserved and written once per step
(``TensorListReserve`` -> ``TensorListSetItem`` -> ``TensorListStack``) -- becomes
one cluster: the While, the list ops around it and, compiled on their own, its
body and condition. The host runner of that cluster runs the loop: it calls the
condition's runner, then the body's, on its loop variables; a list is a buffer,
an element read is a view of one row of the unstacked tensor, an element written
is copied into one row of the stacked result. No element is copied twice and no
step costs more than the body.

This module finds such loops and describes each as a :class:`LoopPlan` (plain,
printable data) with the :class:`ClusterSpec` of its body and condition; a loop
that does not fit is refused with the reason, and stays a TF op as before.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import function_pb2, graph_pb2

from disc_tf.cluster import rewrite
from disc_tf.cluster.clustering import HostValues, why_not_compilable
from disc_tf.cluster.graph_view import GraphView, TensorInfo, producer, view_of_function_def

WHILE_OPS = frozenset({"While", "StatelessWhile"})
#: TensorList ops the loop cluster takes in, around the While
LIST_OPS = frozenset({"TensorListReserve", "TensorListFromTensor", "TensorListStack"})
#: Element types of loop variables and lists the runner moves (TF DataType names)
LOOP_DTYPES = frozenset({tf.float32, tf.int32, tf.int64, tf.bool, tf.float16, tf.bfloat16})


class LoopRefused(Exception):
    """A While that is not compiled whole (the message says why)."""


@dataclasses.dataclass(frozen=True)
class Index:
    """A list index: the value of loop variable ``slot`` (an integer scalar), or ``const``."""

    slot: int | None = None
    const: int = 0

    def __str__(self) -> str:
        return f"v{self.slot}" if self.slot is not None else str(self.const)


@dataclasses.dataclass(frozen=True)
class Ref:
    """Where a value of one step comes from: loop variable ``index`` (``slot``),
    output ``index`` of the body or condition runner (``out``), or the element at
    ``at`` of the list in loop variable ``index`` (``item``)."""

    kind: str
    index: int
    at: Index | None = None

    def __str__(self) -> str:
        if self.kind == "item":
            return f"v{self.index}[{self.at}]"
        return f"v{self.index}" if self.kind == "slot" else f"out{self.index}"


@dataclasses.dataclass(frozen=True)
class Slot:
    """One loop variable and its value before the first step.

    ``kind``: ``tensor`` (cluster input ``input``, or the constant ``const``),
    ``variable`` (a variable's value, read once when the cluster runs: cluster
    input ``input``), ``read_list`` (the rows of cluster input ``input``),
    ``write_list`` (``count`` rows -- cluster input ``input`` or the constant
    ``const`` -- written by the body; cluster output ``output`` if stacked).
    ``element_shape``: what the list ops declare of an element (-1: any; None:
    any rank).
    """

    kind: str
    dtype: tf.DType
    input: int | None = None
    const: tuple | None = None  # (dims, flat values) of a constant
    element_shape: tuple[int, ...] | None = None
    output: int | None = None
    #: TensorListStack's ``num_elements`` (-1: any) of a stacked list
    stack_elements: int = -1

    def describe(self) -> str:
        """One line: ``write_list f32 count=in2 element=[-1, 16] -> result0``."""
        where = (f"in{self.input}" if self.input is not None
                 else f"const{list(self.const[1]) if self.const else ''}")
        text = f"{self.kind} {self.dtype.name} {'count=' if self.kind == 'write_list' else ''}{where}"
        if self.element_shape is not None or self.kind.endswith("list"):
            text += f" element={list(self.element_shape) if self.element_shape else '?'}"
        if self.output is not None:
            text += f" -> result{self.output}"
        return text


@dataclasses.dataclass
class LoopPlan:
    """How the host runner of a loop cluster runs the loop."""

    name: str
    while_node: str
    slots: list[Slot]
    #: the condition runner's inputs (None: the condition is ``cond_result`` alone)
    cond_inputs: list[Ref]
    cond_result: Ref
    cond_output_dtypes: list[tf.DType]
    body_inputs: list[Ref]
    body_output_dtypes: list[tf.DType]
    #: loop variable -> its value for the next step (tensor slots)
    next_values: dict[int, Ref]
    #: (list slot, index, value) written each step
    writes: list[tuple[int, Index, Ref]]
    #: cluster output -> loop variable whose final value it is (lists: their Stack)
    outputs: list[int]
    output_dtypes: list[tf.DType]
    #: the cluster's inputs' dtypes (variables: their values')
    input_dtypes: list[tf.DType]

    def describe(self) -> str:
        """The plan as text (``DISC_TF_DUMP_DIR``'s ``loop_plan.txt``)."""
        lines = [f"loop {self.name}: While {self.while_node}",
                 "inputs: " + ", ".join(f"in{i}:{d.name}" for i, d in enumerate(self.input_dtypes))]
        lines += [f"  v{j}: {s.describe()}" for j, s in enumerate(self.slots)]
        lines.append("cond(" + ", ".join(map(str, self.cond_inputs)) + f") -> {self.cond_result}")
        lines.append("body(" + ", ".join(map(str, self.body_inputs)) + ") -> "
                     + ", ".join(f"out{k}:{d.name}" for k, d in enumerate(self.body_output_dtypes)))
        lines += [f"  next v{j} = {r}" for j, r in sorted(self.next_values.items())]
        lines += [f"  v{j}[{at}] = {r}" for j, at, r in self.writes]
        lines += [f"result{k} = {'stack of ' if self.slots[j].kind == 'write_list' else ''}v{j}"
                  for k, j in enumerate(self.outputs)]
        return "\n".join(lines)


@dataclasses.dataclass
class LoopCluster:
    """A loop found in a body: the nodes it takes, its plan, and the clusters of its
    body and condition (``cond_spec`` None when the condition is a loop variable)."""

    spec: rewrite.ClusterSpec
    plan: LoopPlan
    body_spec: rewrite.ClusterSpec
    cond_spec: rewrite.ClusterSpec | None
    #: the value-taking copies of the body and condition functions the fallback calls
    functions: list[function_pb2.FunctionDef]
    #: (node, op) of the body's nodes the loop runner itself does (list reads and
    #: writes, variable reads)
    runner_ops: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    #: the body and condition functions the While names (compiled into this loop)
    step_functions: tuple[str, ...] = ()

    def op_summary(self) -> list[tuple[str, str]]:
        """(node, op) of the loop's nodes, then of its body's and condition's."""
        ops = self.spec.op_summary()
        ops += [(f"{self.plan.while_node}/body/{n}", op) for n, op in self.runner_ops]
        for prefix, sub in (("body", self.body_spec), ("cond", self.cond_spec)):
            if sub is not None:
                ops += [(f"{self.plan.while_node}/{prefix}/{n}", op) for n, op in sub.op_summary()]
        return ops


def _const_value(node) -> np.ndarray:
    return tf.make_ndarray(node.node_def.attr["value"].tensor)


def _function(library: function_pb2.FunctionDefLibrary, name: str) -> function_pb2.FunctionDef:
    for f in library.function:
        if f.signature.name == name:
            return f
    raise LoopRefused(f"function {name} is not in the library")


class _Body:
    """A body or condition function, analysed: its view and its arguments and results
    in flat names, looking through Identity nodes."""

    def __init__(self, fdef: function_pb2.FunctionDef,
                 library: function_pb2.FunctionDefLibrary,
                 original: function_pb2.FunctionDef | None = None) -> None:
        self.fdef = original or fdef  # the function the fallback calls
        self.view, nested_to_flat = view_of_function_def(fdef, library)
        self.args = [f"{a.name}:0" for a in fdef.signature.input_arg]
        self.rets = [self.resolve(nested_to_flat.get(fdef.ret[a.name], fdef.ret[a.name]))
                     for a in fdef.signature.output_arg]
        self.consumers = self.view.consumers()

    def node(self, tensor: str):
        return self.view.nodes[producer(tensor)]

    def resolve(self, tensor: str) -> str:
        """The tensor ``tensor`` is an Identity (chain) of."""
        while (n := self.view.nodes.get(producer(tensor))) is not None and n.op == "Identity":
            tensor = n.inputs[0].name
        return tensor

    def arg_slot(self, tensor: str) -> int | None:
        """The loop variable ``tensor`` is (through Identities), if any."""
        t = self.resolve(tensor)
        return self.args.index(t) if t in self.args else None

    def uses(self, tensor: str) -> list[tuple[str, int]]:
        """(node, input index) of every non-Identity reader of ``tensor``, through Identities."""
        out, todo = [], [tensor]
        while todo:
            t = todo.pop()
            for n, i in self.consumers.get(t, []):
                node = self.view.nodes[n]
                if node.op == "Identity":
                    todo.append(node.outputs[0].name)
                else:
                    out.append((n, i))
        return out


def _with_element_shapes(fdef: function_pb2.FunctionDef, view: GraphView,
                         loop) -> function_pb2.FunctionDef:
    """A copy of a loop body for analysis in which each TensorListGetItem of an
    unstacked list declares the element shape the unstacked tensor gives its rows
    (``tf.TensorArray`` declares none), so that shape inference knows the rank."""
    out = function_pb2.FunctionDef()
    out.CopyFrom(fdef)
    shapes = {}
    for j, t in enumerate(loop.inputs):
        src = view.nodes[producer(t.name)]
        if src.op == "TensorListFromTensor" and src.inputs[0].dims:
            shapes[fdef.signature.input_arg[j].name] = [
                -1 if d is None else int(d) for d in src.inputs[0].dims[1:]]
    for nd in list(out.node_def):
        if nd.op == "TensorListGetItem" and nd.input[0] in shapes:
            const = out.node_def.add(name=f"{nd.name}/disc_element_shape", op="Const")
            const.attr["dtype"].type = tf.int32.as_datatype_enum
            const.attr["value"].tensor.CopyFrom(
                tf.make_tensor_proto(shapes[nd.input[0]], tf.int32))
            nd.input[2] = f"{const.name}:output:0"
    return out


def _index(body: _Body, tensor: str, slots_dtypes: list[tf.DType], kinds: list[str]) -> Index:
    t = body.resolve(tensor)
    slot = body.arg_slot(t)
    if slot is not None:
        if kinds[slot] != "tensor" or slots_dtypes[slot] not in (tf.int32, tf.int64):
            raise LoopRefused(f"a list index is loop variable {slot}, not an integer tensor")
        return Index(slot=slot)
    node = body.node(t)
    if node.op == "Const" and _const_value(node).size == 1:
        return Index(const=int(_const_value(node).reshape(())))
    raise LoopRefused(f"a list index is computed in the body ({node.name}); only a loop "
                      "variable or a constant is")


def _ancestors(body: _Body, wanted: list[str], stops: set[str]) -> list[str]:
    """Nodes of ``body`` the tensors ``wanted`` are computed from, stopping at the
    producers in ``stops`` and at arguments; in the view's order. Refuses a node
    that cannot join a cluster."""
    host = HostValues(body.view)
    seen: set[str] = set()
    todo = [producer(t) for t in wanted]
    while todo:
        n = todo.pop()
        if n in seen or n in stops or f"{n}:0" in body.args:
            continue
        seen.add(n)
        node = body.view.nodes[n]
        why = why_not_compilable(node, host)
        if why is not None:
            raise LoopRefused(f"node {n} ({node.op}) of {body.fdef.signature.name}: {why}")
        todo += [producer(t.name) for t in node.inputs]
    return [n for n in body.view.order if n in seen]


def value_function(fdef: function_pb2.FunctionDef, values: dict[int, TensorInfo],
                   is_body: bool) -> function_pb2.FunctionDef:
    """A copy of a loop's body or condition whose variable arguments ``values``
    (index -> the value) take the variables' values: each ReadVariableOp of one is
    an Identity. (The fallback of a loop cluster receives values, not handles.)"""
    out = function_pb2.FunctionDef()
    out.CopyFrom(fdef)
    names = {fdef.signature.input_arg[i].name: v.dtype for i, v in values.items()}
    shapes = out.attr["_input_shapes"].list.shape if "_input_shapes" in out.attr else None
    for i, value in values.items():
        dtype = value.dtype
        out.signature.input_arg[i].type = dtype.as_datatype_enum
        out.signature.input_arg[i].ClearField("handle_data")
        out.arg_attr[i].Clear()
        if shapes is not None and i < len(shapes):
            shapes[i].CopyFrom(tf.TensorShape(value.dims).as_proto())
        if is_body:
            out.signature.output_arg[i].type = dtype.as_datatype_enum
            out.signature.output_arg[i].ClearField("handle_data")
    renamed = {}  # "<read>:value:" -> "<read>:output:" (an Identity's output is named so)
    for nd in out.node_def:
        if nd.op == "ReadVariableOp" and nd.input and nd.input[0] in names:
            nd.op = "Identity"
            nd.attr.clear()
            nd.attr["T"].type = names[nd.input[0]].as_datatype_enum
            renamed[f"{nd.name}:value:"] = f"{nd.name}:output:"

    def rename(ref: str) -> str:
        for old, new in renamed.items():
            if ref.startswith(old):
                return new + ref[len(old):]
        return ref

    for nd in out.node_def:
        nd.input[:] = [rename(i) for i in nd.input]
    for key in list(out.ret):
        out.ret[key] = rename(out.ret[key])
    digest = hashlib.sha256(out.SerializeToString(deterministic=True)).hexdigest()[:10]
    out.signature.name = f"{fdef.signature.name}_disc_values_{digest}"
    return out


def _callees(library: function_pb2.FunctionDefLibrary,
             roots: list[function_pb2.FunctionDef]) -> list[function_pb2.FunctionDef]:
    """Library functions ``roots`` call, transitively (for importing a fallback)."""
    by_name = {f.signature.name: f for f in library.function}
    out: dict[str, function_pb2.FunctionDef] = {}
    todo = list(roots)
    while todo:
        f = todo.pop()
        for nd in f.node_def:
            for value in nd.attr.values():
                names = [value.func.name] if value.HasField("func") else \
                    [g.name for g in value.list.func]
                for name in names:
                    if name in by_name and name not in out:
                        out[name] = by_name[name]
                        todo.append(by_name[name])
    return list(out.values())


def find_loops(view: GraphView, library: function_pb2.FunctionDefLibrary,
               fetched: frozenset[str], taken: set[str],
               refused: dict[str, str]) -> list[LoopCluster]:
    """The While loops of ``view`` that compile whole (their nodes are not in
    ``refused``). A loop that does not fit is noted in ``refused`` (node -> why) and
    left out; new cluster names are added to ``taken``."""
    loops = []
    for n in view.order:
        node = view.nodes[n]
        if node.op not in WHILE_OPS or n in refused:
            continue
        name = f"disc_loop_{len(loops)}"
        while name in taken:
            name += "_"
        try:
            loop = _loop_cluster(view, n, library, fetched, name)
        except LoopRefused as e:
            refused[n] = f"loop not compiled whole: {e}"
            continue
        taken.add(name)
        loops.append(loop)
    return loops


def _loop_cluster(view: GraphView, while_name: str, library: function_pb2.FunctionDefLibrary,
                  fetched: frozenset[str], name: str) -> LoopCluster:
    node = view.nodes[while_name]
    attrs = node.node_def.attr
    body_fdef = _function(library, attrs["body"].func.name)
    body = _Body(_with_element_shapes(body_fdef, view, node), library, body_fdef)
    cond = _Body(_function(library, attrs["cond"].func.name), library)
    n_slots = len(node.inputs)
    if len(body.args) != n_slots or len(body.rets) != n_slots or len(cond.args) != n_slots:
        raise LoopRefused("body or condition signature does not match the loop variables")
    consumers = view.consumers()

    # ---- what each loop variable is, from the nodes around the While
    kinds, dtypes, members = [], [], [while_name]
    inits: list[str] = []  # the tensor each slot starts from (a list: its source tensor)
    element_shapes: list[tuple[int, ...] | None] = []
    for j, t in enumerate(node.inputs):
        src = view.nodes[producer(t.name)]
        outside = [c for c, _ in consumers.get(f"{while_name}:{j}", [])]
        if t.dtype == tf.variant:
            if src.op not in ("TensorListFromTensor", "TensorListReserve"):
                raise LoopRefused(f"loop variable {j} is a {src.op}, not a new TensorList")
            if [c for c, _ in consumers[t.name]] != [while_name] or src.control_inputs:
                raise LoopRefused(f"the TensorList of loop variable {j} is read elsewhere")
            dtype = tf.as_dtype(src.node_def.attr["element_dtype"].type)
            shape_node = view.nodes[producer(src.inputs[0 if src.op == "TensorListReserve"
                                                      else 1].name)]
            shape = None
            if shape_node.op == "Const":
                value = _const_value(shape_node).reshape(-1)
                shape = None if value.size == 1 and value[0] == -1 and \
                    _const_value(shape_node).ndim == 0 else tuple(int(v) for v in value)
            kinds.append("read_list" if src.op == "TensorListFromTensor" else "write_list")
            members.append(src.name)
            inits.append(src.inputs[0 if src.op == "TensorListFromTensor" else 1].name)
            element_shapes.append(shape)
            if kinds[-1] == "read_list" and outside:
                raise LoopRefused(f"the unstacked list of loop variable {j} is read after the loop")
        elif t.dtype == tf.resource:
            kinds.append("variable")
            dtype = None
            inits.append(t.name)
            element_shapes.append(None)
            if outside:
                raise LoopRefused(f"variable handle {j} is read after the loop")
        else:
            kinds.append("tensor")
            dtype = t.dtype
            inits.append(t.name)
            element_shapes.append(None)
        if dtype is not None and dtype not in LOOP_DTYPES:
            raise LoopRefused(f"loop variable {j} has dtype {dtype.name}")
        dtypes.append(dtype)

    # ---- the body: reads and writes of the lists, reads of the variables
    stops: set[str] = set()
    variable_values: dict[int, TensorInfo] = {}
    item_refs: dict[str, Ref] = {}  # GetItem output -> the element it reads
    writes: list[tuple[int, Index, str]] = []
    for j, kind in enumerate(kinds):
        uses = body.uses(body.args[j])
        if kind != "tensor" and cond.uses(cond.args[j]):
            raise LoopRefused(f"the condition reads loop variable {j} ({kind})")
        if kind == "read_list":
            if body.arg_slot(body.rets[j]) != j:
                raise LoopRefused(f"the body replaces the unstacked list {j}")
            for r, i in uses:
                reader = body.view.nodes[r]
                if reader.op != "TensorListGetItem" or i != 0:
                    raise LoopRefused(f"list {j} is read by {reader.op} in the body")
                item_refs[reader.outputs[0].name] = Ref(
                    "item", j, _index(body, reader.inputs[1].name, dtypes, kinds))
                stops.add(r)
        elif kind == "write_list" and body.arg_slot(body.rets[j]) == j and not uses:
            pass  # reserved and never written: stacked, it is zeros (or an error)
        elif kind == "write_list":
            setter = body.node(body.rets[j])
            if (setter.op != "TensorListSetItem" or body.arg_slot(setter.inputs[0].name) != j
                    or [u for u, _ in uses] != [setter.name]):
                raise LoopRefused(f"list {j} is not written exactly once per step "
                                  "(one TensorListSetItem)")
            writes.append((j, _index(body, setter.inputs[1].name, dtypes, kinds),
                           setter.inputs[2].name))
            stops.add(setter.name)
        elif kind == "variable":
            if body.arg_slot(body.rets[j]) != j:
                raise LoopRefused(f"the body replaces variable handle {j}")
            for r, _ in uses:
                reader = body.view.nodes[r]
                if reader.op != "ReadVariableOp":
                    raise LoopRefused(f"variable {j} is used by {reader.op} in the body")
                value = reader.outputs[0]
                if j in variable_values and variable_values[j].dtype != value.dtype:
                    raise LoopRefused(f"variable {j} is read as two dtypes")
                variable_values.setdefault(j, TensorInfo(node.inputs[j].name, value.dtype,
                                                         value.dims))
                stops.add(r)
            if j not in variable_values:
                raise LoopRefused(f"variable {j} is not read in the body")
            dtypes[j] = variable_values[j].dtype

    # ---- the body's cluster: everything computing the next tensors and the writes
    tensor_slots = [j for j, k in enumerate(kinds) if k == "tensor"]
    wanted = [body.resolve(body.rets[j]) for j in tensor_slots] + \
        [body.resolve(v) for _, _, v in writes]
    wanted_computed = [t for t in wanted if body.arg_slot(t) is None and t not in item_refs
                       and producer(t) not in stops]
    body_nodes = _ancestors(body, wanted_computed, stops)
    if not body_nodes:
        raise LoopRefused("the body computes nothing")
    body_spec = rewrite.extract_cluster(body.view, body_nodes, f"{name}_body",
                                        frozenset(wanted_computed))

    def source(view_body: _Body, t: str, spec: rewrite.ClusterSpec | None) -> Ref:
        t = view_body.resolve(t)
        if (slot := view_body.arg_slot(t)) is not None:
            if kinds[slot] not in ("tensor", "variable"):
                raise LoopRefused(f"loop variable {slot} ({kinds[slot]}) is read as a tensor")
            return Ref("slot", slot)
        if t in item_refs:
            return item_refs[t]
        src = view_body.node(t)
        if src.op == "ReadVariableOp" and (slot := view_body.arg_slot(src.inputs[0].name)) \
                is not None:
            return Ref("slot", slot)
        outs = [o.name for o in spec.outputs] if spec is not None else []
        if t in outs:
            return Ref("out", outs.index(t))
        raise LoopRefused(f"{t} of {view_body.fdef.signature.name} is not computed where "
                          "the loop runner can read it")

    body_inputs = [source(body, t.name, None) for t in body_spec.inputs]
    next_values = {j: source(body, body.rets[j], body_spec) for j in tensor_slots}
    write_refs = [(j, at, source(body, v, body_spec)) for j, at, v in writes]

    # ---- the condition
    result = cond.resolve(cond.rets[0])
    if cond.arg_slot(result) is not None:
        cond_spec, cond_inputs, cond_result = None, [], source(cond, result, None)
    else:
        cond_nodes = _ancestors(cond, [result], set())
        cond_spec = rewrite.extract_cluster(cond.view, cond_nodes, f"{name}_cond",
                                            frozenset([result]))
        cond_inputs = [source(cond, t.name, None) for t in cond_spec.inputs]
        cond_result = source(cond, result, cond_spec)
    if cond_result.kind == "item" or (cond_result.kind == "slot" and
                                      dtypes[cond_result.index] != tf.bool):
        raise LoopRefused("the condition is not a boolean tensor")
    if any(r.kind == "item" for r in cond_inputs):
        raise LoopRefused("the condition reads a list")

    # ---- the nodes after the loop: a Stack of each written list
    stacks: dict[int, str] = {}
    for j, kind in enumerate(kinds):
        readers = [c for c, _ in consumers.get(f"{while_name}:{j}", [])]
        if kind != "write_list":
            continue
        for r in readers:
            reader = view.nodes[r]
            if reader.op != "TensorListStack" or j in stacks or reader.control_inputs:
                raise LoopRefused(f"the written list {j} is read by {reader.op} after the loop")
            stacks[j] = r
            members.append(r)
    spec = rewrite.extract_cluster(view, [m for m in view.order if m in members], name,
                                   fetched, resource_values={
                                       t.name: t for t in variable_values.values()})
    if any(t.dtype in (tf.variant, tf.resource) for t in spec.outputs):
        raise LoopRefused("a TensorList or handle of the loop is read after it")
    in_names = [t.name for t in spec.inputs]

    def init_of(j: int) -> Slot:
        kind, dtype, t = kinds[j], dtypes[j], inits[j]
        if t in in_names:
            where = {"input": in_names.index(t)}
        else:
            src = view.nodes[producer(t)]
            if src.op != "Const" or kind in ("read_list", "variable"):
                raise LoopRefused(f"the start of loop variable {j} is not an input of the loop")
            value = _const_value(src)
            if value.dtype not in (np.int32, np.int64, np.float32, np.bool_) or value.size > 64:
                raise LoopRefused(f"loop variable {j} starts from a {value.dtype} constant")
            where = {"const": (tuple(value.shape), tuple(value.reshape(-1).tolist()))}
        return Slot(kind, dtype, element_shape=element_shapes[j], **where)

    slots = [init_of(j) for j in range(n_slots)]
    outputs: list[int] = []
    for k, t in enumerate(spec.outputs):
        p = producer(t.name)
        if p == while_name:
            j = int(t.name.split(":")[1])
        elif p in stacks.values():
            j = next(j for j, s in stacks.items() if s == p)
            stack = view.nodes[p]
            shape = slots[j].element_shape
            shape_node = view.nodes[producer(stack.inputs[1].name)]
            if shape_node.op == "Const" and _const_value(shape_node).ndim == 1:
                declared = tuple(int(v) for v in _const_value(shape_node))
                shape = declared if shape is None else _merge_shapes(shape, declared)
            slots[j] = dataclasses.replace(
                slots[j], output=k, element_shape=shape,
                stack_elements=int(stack.node_def.attr["num_elements"].i))
        else:
            raise LoopRefused(f"{t.name} is read after the loop")
        if slots[j].kind not in ("tensor", "write_list"):
            raise LoopRefused(f"loop variable {j} ({slots[j].kind}) is read after the loop")
        outputs.append(j)
    if len(set(outputs)) != len(outputs):
        raise LoopRefused("a loop variable is read twice after the loop")

    plan = LoopPlan(
        name=name, while_node=while_name, slots=slots,
        cond_inputs=cond_inputs, cond_result=cond_result,
        cond_output_dtypes=[t.dtype for t in cond_spec.outputs] if cond_spec else [],
        body_inputs=body_inputs, body_output_dtypes=[t.dtype for t in body_spec.outputs],
        next_values=next_values, writes=write_refs, outputs=outputs,
        output_dtypes=[t.dtype for t in spec.outputs],
        input_dtypes=[t.dtype for t in spec.inputs])
    functions = _value_loop(spec, while_name, body.fdef, cond.fdef, variable_values, library)
    runner_ops = [(n, body.view.nodes[n].op) for n in body.view.order if n in stops]
    return LoopCluster(spec, plan, body_spec, cond_spec, functions, runner_ops,
                       (attrs["body"].func.name, attrs["cond"].func.name))


def _merge_shapes(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    if len(a) != len(b):
        raise LoopRefused(f"element shapes {list(a)} and {list(b)} differ in rank")
    return tuple(x if x != -1 else y for x, y in zip(a, b))


def _value_loop(spec: rewrite.ClusterSpec, while_name: str, body: function_pb2.FunctionDef,
                cond: function_pb2.FunctionDef, values: dict[int, TensorInfo],
                library: function_pb2.FunctionDefLibrary) -> list[function_pb2.FunctionDef]:
    """Makes the While of ``spec.subgraph`` take the variables' values (as the
    fallback receives them) through value-taking copies of its body and condition,
    carried in the subgraph's library; returns those copies."""
    if not values:
        functions = [body, cond]
    else:
        functions = [value_function(body, values, True), value_function(cond, values, False)]
        nd = next(n for n in spec.subgraph.node if n.name == while_name)
        for i, value in values.items():
            nd.attr["T"].list.type[i] = value.dtype.as_datatype_enum
            if len(nd.attr["output_shapes"].list.shape) > i:
                nd.attr["output_shapes"].list.shape[i].CopyFrom(
                    tf.TensorShape(value.dims).as_proto())
        nd.attr["body"].func.name = functions[0].signature.name
        nd.attr["cond"].func.name = functions[1].signature.name
    lib = graph_pb2.GraphDef().library
    lib.function.extend(functions + _callees(library, functions))
    spec.subgraph.library.CopyFrom(lib)
    return functions if values else []


def loops_first(library: function_pb2.FunctionDefLibrary) -> list[function_pb2.FunctionDef]:
    """The library's functions, each function with a While before that While's body
    and condition (so that whether a loop compiles whole is known before its body
    is optimized on its own)."""
    by_name = {f.signature.name: f for f in library.function}
    inner: dict[str, list[str]] = {}
    for f in library.function:
        for nd in f.node_def:
            if nd.op in WHILE_OPS:
                inner.setdefault(f.signature.name, []).extend(
                    nd.attr[k].func.name for k in ("body", "cond"))
    has_loop_parent = {n for names in inner.values() for n in names}
    order: list[str] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen or name not in by_name:
            return
        seen.add(name)
        order.append(name)
        for child in inner.get(name, []):
            visit(child)

    for f in library.function:
        if f.signature.name not in has_loop_parent:
            visit(f.signature.name)
    for f in library.function:  # loops of loops only (a cycle of bodies: any order)
        visit(f.signature.name)
    return [by_name[n] for n in order]
