"""Plans for calling a function's DiscCluster ops directly, without TF's function runtime.

A function that ``optimize`` clustered whole has a body of DiscCluster ops fed
by its arguments and by ReadVariableOps of captured variables (optionally
behind a StatefulPartitionedCall and Identity ops). Such a body is planned
as a list of ``ClusterStep``s: one DiscCluster execution each, whose inputs are
the function's arguments, captured values, variable handles (the op reads the
variable when it runs, as the ReadVariableOp would have) or earlier steps'
outputs. A stateless TF op left outside the clusters (one op stranded between
two clusters, a sort) is an eager step of its own, and a Const a value the plan
holds. A functional control-flow op (``While``, ``If``, ``Case`` and their
stateless forms: a Keras RNN's loop) is one eager step too, when every function
it calls, transitively, is registered and holds no state other than variable
reads (its variables come in as resource inputs, which the step passes as the
handles), DiscCluster ops, checks and such control flow again. Any other op
with state (an assignment, a random op) or other call of a function-valued attr
makes the function unplannable, and the caller uses TF's runtime.

The plan is built from FunctionDef protos only, and prints as text
(``DirectPlan.describe``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, function_pb2, types_pb2
from tensorflow.python.framework import op_def_registry

from disc_tf.cluster.graph_view import with_default_attrs

#: Ops a directly-called body may hold besides function calls. Identity and
#: NoOp only pass values or order; ReadVariableOp becomes the op's own read.
_DIRECT_OPS = frozenset({"DiscCluster", "ReadVariableOp", "Identity", "NoOp"})
_CALL_OPS = frozenset({"StatefulPartitionedCall", "PartitionedCall"})
#: Ops with state that a direct call runs anyway: checks, whose only effect is the
#: error they raise (TF's Assert; Hugging Face models check input ids with one). A
#: plan runs each once per call, as an eager op with no outputs.
_CHECK_OPS = frozenset({"Assert"})
#: Functional control flow run as one eager op when its functions pass
#: ``_Planner.check_callees``; the stateful forms also run when only a control
#: edge uses them, as TF runs every stateful op.
_CONTROL_FLOW_OPS = frozenset({"While", "StatelessWhile", "If", "StatelessIf", "Case",
                               "StatelessCase"})
_STATEFUL_CONTROL_FLOW = frozenset({"While", "If", "Case"})
#: Ops with state that only read a variable, allowed in the functions those call.
_READ_OPS = frozenset({"ReadVariableOp", "ResourceGather", "ResourceGatherNd", "VariableShape"})
#: Stateless ops that still cannot run as one eager op of a direct call.
_NOT_EAGER = frozenset({"Placeholder", "_Arg", "_Retval", "Switch", "Merge", "Enter", "Exit",
                        "NextIteration", "LoopCond", "ControlTrigger"})

#: Attribute value as ``TFE_Py_Execute`` takes it.
ExecAttr = bytes | int | float | bool | list | None


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a value comes from at call time.

    ``kind`` is ``arg`` (the call's ``index``-th argument), ``capture`` (the
    function's ``index``-th captured input, passed as it is), ``variable`` (the
    ``index``-th captured input, a variable handle whose value is read),
    ``step`` (output ``output`` of plan step ``index``), ``const`` (the plan's
    ``index``-th constant) or ``bundle`` (``disc_tf.load``'s ``index``-th variable
    bundle: a step's variables behind one handle).
    """

    kind: str
    index: int
    output: int = 0

    def describe(self) -> str:
        """Short text form, e.g. ``arg0``, ``var3``, ``step0:1``."""
        names = {"arg": "arg", "capture": "cap", "variable": "var", "const": "const",
                 "bundle": "bundle"}
        if self.kind == "step":
            return f"step{self.index}:{self.output}"
        return f"{names[self.kind]}{self.index}"


@dataclasses.dataclass(frozen=True)
class ClusterStep:
    """One op execution: a DiscCluster (its node, inputs and attributes), or with
    another ``op`` a TF op left outside the clusters, run eagerly.

    ``attrs`` are the node's attributes converted for ``TFE_Py_Execute``, with
    ``Tin`` naming a resource for each ``variable`` input and the ``artifact``
    bytes left out (``artifact`` holds them; the caller publishes them under a
    key and passes that as ``pending_key``).
    """

    node: str
    cluster_name: str
    inputs: tuple[Source, ...]
    num_outputs: int
    artifact: bytes
    artifact_sha256: str
    num_kernels: int
    pending_key: str
    attrs: tuple[tuple[str, ExecAttr], ...]
    op: str = "DiscCluster"
    #: the signatures on its artifact (``disc_tf/trust.py``)
    signatures: tuple[str, ...] = ()

    @property
    def is_cluster(self) -> bool:
        """Whether the step runs a DiscCluster (else a TF op outside the clusters)."""
        return self.op == "DiscCluster"

    def describe(self) -> str:
        """One line: the cluster (or eager TF op), its inputs and outputs."""
        ins = ", ".join(s.describe() for s in self.inputs)
        what = self.cluster_name if self.is_cluster else f"eager {self.op}"
        return f"{what} ({self.node}): ({ins}) -> {self.num_outputs} outputs"


@dataclasses.dataclass(frozen=True)
class DirectPlan:
    """The DiscCluster executions of a function, in order, and its outputs."""

    function: str
    num_args: int
    steps: tuple[ClusterStep, ...]
    outputs: tuple[Source, ...]
    #: values of the ``const`` sources (Consts outside the clusters)
    constants: tuple[np.ndarray, ...] = ()

    def describe(self) -> str:
        """Multi-line text form."""
        lines = [f"direct plan of {self.function}: {self.num_args} args"]
        lines += [f"  const{i}: {c.dtype}{list(c.shape)}" for i, c in enumerate(self.constants)]
        lines += [f"  step{i}: {s.describe()}" for i, s in enumerate(self.steps)]
        lines.append("  outputs: " + ", ".join(s.describe() for s in self.outputs))
        return "\n".join(lines)


class NotDirect(Exception):
    """The function's body holds something a direct call cannot run."""


FunctionLookup = Callable[[str], function_pb2.FunctionDef | None]


def _exec_attr(name: str, value: attr_value_pb2.AttrValue) -> ExecAttr:
    """Converts one AttrValue to the form ``TFE_Py_Execute`` takes."""
    field = value.WhichOneof("value")
    if field in ("s", "i", "f", "b"):
        return getattr(value, field)
    if field == "type":
        return int(value.type)
    if field == "func":
        return _function_name(name, value.func)
    if field == "shape":
        return _shape(value.shape)
    if field == "list":
        lst = value.list
        if lst.type:
            return [int(t) for t in lst.type]
        if lst.shape:
            return [_shape(s) for s in lst.shape]
        if lst.i:
            return [int(i) for i in lst.i]
        if lst.s:
            return list(lst.s)
        if lst.func:
            return [_function_name(name, f) for f in lst.func]
        if lst.f or lst.b or lst.tensor:
            raise NotDirect(f"attr {name}: list kind not supported")
        return []
    raise NotDirect(f"attr {name}: {field} values are not supported")


def _function_name(name: str, func: attr_value_pb2.NameAttrList) -> str:
    """A function-valued attr's function name (``TFE_Py_Execute`` takes no attrs of it)."""
    if func.attr:
        raise NotDirect(f"attr {name}: function {func.name} has attrs of its own")
    return func.name


def _function_attrs(node) -> list[tuple[str, str]]:
    """``(attr, function name)`` for each function a node's attrs name."""
    out = []
    for key in sorted(node.attr):
        value = node.attr[key]
        if value.WhichOneof("value") == "func":
            out.append((key, value.func.name))
        out += [(key, f.name) for f in value.list.func]
    return out


def _shape(proto) -> list[int | None] | None:
    if proto.unknown_rank:
        return None
    return [None if d.size < 0 else int(d.size) for d in proto.dim]


def _split_ref(ref: str) -> tuple[str, str, int]:
    """``node:output_arg:index`` (or a bare input arg name) as its parts."""
    parts = ref.split(":")
    if len(parts) == 1:
        return parts[0], "", 0
    if len(parts) == 3:
        return parts[0], parts[1], int(parts[2])
    raise NotDirect(f"unexpected tensor reference {ref!r}")


class _Planner:
    """Resolves tensors of (possibly nested) FunctionDefs to plan sources."""

    def __init__(self, lookup: FunctionLookup, num_args: int, is_resource: list[bool]) -> None:
        self._lookup = lookup
        self._num_args = num_args
        self._is_resource = is_resource  # per top-level input: user args, then captures
        self.steps: list[ClusterStep] = []
        self.constants: list[np.ndarray] = []
        self._step_of: dict[tuple[int, str], int] = {}  # (frame id, node) -> step
        self._frames = 0
        self._callees_checked: set[str] = set()  # functions check_callees accepted

    def top_source(self, i: int) -> Source:
        """Source of top-level input ``i`` (arguments first, then captures)."""
        if i < self._num_args:
            return Source("arg", i)
        return Source("capture", i - self._num_args)

    def function_outputs(self, fdef: function_pb2.FunctionDef,
                         arg_sources: list[Source]) -> list[Source]:
        """Sources of ``fdef``'s outputs, given the sources of its inputs (its calls
        are no deeper than ``check_body`` allowed)."""
        if len(arg_sources) != len(fdef.signature.input_arg):
            raise NotDirect(f"{fdef.signature.name}: {len(arg_sources)} inputs for "
                            f"{len(fdef.signature.input_arg)} arguments")
        frame = _Frame(self, fdef, arg_sources)
        outputs = [frame.resolve(fdef.ret[a.name]) for a in fdef.signature.output_arg]
        frame.add_checks()
        return outputs

    def check_body(self, fdef: function_pb2.FunctionDef, depth: int = 0) -> None:
        """Raises ``NotDirect`` unless every node of ``fdef`` and of the functions it
        calls is one a direct call runs or skips (values only flow through them)."""
        if depth > 8:
            raise NotDirect("function calls nested too deeply")
        for node in fdef.node_def:
            if node.op in _CALL_OPS:
                self.check_body(self.lookup(node.attr["f"].func.name), depth + 1)
            elif node.op in _CONTROL_FLOW_OPS:
                self.check_callees(node, depth + 1)
            elif node.op not in _DIRECT_OPS and node.op != "Const" and (
                    why := _why_not_eager(node)):
                raise NotDirect(f"{fdef.signature.name}: op {node.op} ({node.name}) outside "
                                f"any cluster {why}")

    def check_callees(self, node, depth: int) -> None:
        """Raises ``NotDirect`` unless every function control-flow op ``node`` calls,
        and every function those call (through attrs: calls, nested control flow), is
        registered and holds no op with state but variable reads (``_READ_OPS``) and
        checks: the op then reads state and changes none, as a plan's steps may."""
        for attr, name in _function_attrs(node):
            if name in self._callees_checked:
                continue
            if depth > 8:
                raise NotDirect("function calls nested too deeply")
            fdef = self._lookup(name)
            if fdef is None:
                raise NotDirect(f"function {name} ({attr} of {node.op} {node.name}) is not "
                                f"registered")
            self._callees_checked.add(name)
            for inner in fdef.node_def:
                if inner.op == "DiscCluster":  # its fallback: the cluster's stateless ops
                    self.lookup(inner.attr["fallback"].func.name)
                elif inner.op in _CONTROL_FLOW_OPS or inner.op in _CALL_OPS:
                    self.check_callees(inner, depth + 1)
                elif inner.op not in _READ_OPS and (why := _why_not_in_callee(inner)):
                    raise NotDirect(f"{name} ({attr} of {node.op} {node.name}): op {inner.op} "
                                    f"({inner.name}) {why}")

    def next_frame_id(self) -> int:
        self._frames += 1
        return self._frames

    def add_step(self, frame_id: int, node, inputs: list[Source]) -> int:
        key = (frame_id, node.name)
        if key in self._step_of:
            return self._step_of[key]
        attrs: list[tuple[str, ExecAttr]] = []
        tin = [int(types_pb2.DT_RESOURCE) if s.kind == "variable" else None for s in inputs]
        declared = list(node.attr["Tin"].list.type)
        if len(declared) != len(inputs):
            raise NotDirect(f"{node.name}: Tin has {len(declared)} types for {len(inputs)} inputs")
        for name in sorted(node.attr):
            if name.startswith("_") or name in ("artifact", "pending_key"):
                continue
            if name == "Tin":
                attrs.append((name, [t if t is not None else int(d) for t, d in zip(tin, declared)]))
                continue
            attrs.append((name, _exec_attr(name, node.attr[name])))
        a = node.attr
        step = ClusterStep(
            node=node.name,
            cluster_name=(a["cluster_name"].s.decode() if "cluster_name" in a else "") or node.name,
            inputs=tuple(inputs),
            num_outputs=len(a["Tout"].list.type),
            artifact=a["artifact"].s if "artifact" in a else b"",
            artifact_sha256=a["artifact_sha256"].s.decode() if "artifact_sha256" in a else "",
            num_kernels=int(a["num_kernels"].i) if "num_kernels" in a else 0,
            pending_key=a["pending_key"].s.decode() if "pending_key" in a else "",
            attrs=tuple(attrs),
            signatures=tuple(sig.decode() for sig in a["artifact_signatures"].list.s)
            if "artifact_signatures" in a else ())
        self.steps.append(step)
        self._step_of[key] = len(self.steps) - 1
        return len(self.steps) - 1

    def add_constant(self, node) -> Source:
        """A Const node's value, held by the plan."""
        self.constants.append(tf.make_ndarray(node.attr["value"].tensor))
        return Source("const", len(self.constants) - 1)

    def add_eager_step(self, frame_id: int, node, inputs: list[Source]) -> int:
        """A TF op outside the clusters, run as one eager op; returns its step."""
        key = (frame_id, node.name)
        if key in self._step_of:
            return self._step_of[key]
        if any(s.kind == "variable" for s in inputs):
            raise NotDirect(f"{node.name}: op {node.op} outside the clusters reads a variable")
        op_def = op_def_registry.get(node.op)
        attrs = _with_defaults(node, op_def)
        step = ClusterStep(
            node=node.name, cluster_name=node.name, inputs=tuple(inputs),
            num_outputs=sum(_output_sizes(op_def, attrs)), artifact=b"", artifact_sha256="",
            num_kernels=0, pending_key="",
            attrs=tuple((name, _exec_attr(name, attrs[name])) for name in sorted(attrs)),
            op=node.op)
        self.steps.append(step)
        self._step_of[key] = len(self.steps) - 1
        return len(self.steps) - 1

    def capture_is_resource(self, index: int) -> bool:
        """Whether captured input ``index`` is a resource handle."""
        return self._is_resource[self._num_args + index]

    def lookup(self, name: str) -> function_pb2.FunctionDef:
        fdef = self._lookup(name)
        if fdef is None:
            raise NotDirect(f"function {name} is not registered")
        return fdef


class _Frame:
    """One function body being resolved."""

    def __init__(self, planner: _Planner, fdef: function_pb2.FunctionDef,
                 arg_sources: list[Source]) -> None:
        self.id = planner.next_frame_id()
        self.planner = planner
        self.fdef = fdef
        self.args = {a.name: s for a, s in zip(fdef.signature.input_arg, arg_sources)}
        self.nodes = {n.name: n for n in fdef.node_def}
        self._memo: dict[str, Source | list[Source]] = {}

    def add_checks(self) -> None:
        """Adds a step for every check op of the body (see ``_CHECK_OPS``), and for
        every stateful control-flow op not yet run (its functions may hold checks)."""
        for node in self.fdef.node_def:
            if node.op in _CHECK_OPS or node.op in _STATEFUL_CONTROL_FLOW:
                inputs = [self.resolve(i) for i in node.input if not i.startswith("^")]
                self.planner.add_eager_step(self.id, node, inputs)

    def resolve(self, ref: str) -> Source:
        if ref.startswith("^"):
            raise NotDirect(f"control input {ref} used as a value")
        name, out_arg, index = _split_ref(ref)
        if not out_arg and name in self.args:
            return self.args[name]
        node = self.nodes.get(name)
        if node is None:
            raise NotDirect(f"{self.fdef.signature.name}: no node {name}")
        data_inputs = [i for i in node.input if not i.startswith("^")]
        if node.op == "Identity":
            return self.resolve(data_inputs[0])
        if node.op == "ReadVariableOp":
            handle = self.resolve(data_inputs[0])
            if handle.kind != "capture" or not self.planner.capture_is_resource(handle.index):
                raise NotDirect(f"{name}: reads a variable that is not a captured handle")
            return Source("variable", handle.index)
        if node.op == "DiscCluster":
            if out_arg != "outputs":
                raise NotDirect(f"{name}: unexpected output {out_arg}")
            inputs = [self.resolve(i) for i in data_inputs]
            step = self.planner.add_step(self.id, node, inputs)
            return Source("step", step, index)
        if node.op in _CALL_OPS:
            if out_arg != "output":
                raise NotDirect(f"{name}: unexpected output {out_arg}")
            outs = self._memo.get(name)
            if outs is None:
                callee = self.planner.lookup(node.attr["f"].func.name)
                outs = self.planner.function_outputs(
                    callee, [self.resolve(i) for i in data_inputs])
                self._memo[name] = outs
            return outs[index]
        if node.op == "Const":
            if name not in self._memo:
                self._memo[name] = self.planner.add_constant(node)
            return self._memo[name]
        if why := _why_not_eager(node):
            raise NotDirect(f"{name}: op {node.op} {why}")
        op_def = op_def_registry.get(node.op)
        names = [a.name for a in op_def.output_arg]
        if out_arg not in names:
            raise NotDirect(f"{name}: op {node.op} has no output {out_arg}")
        sizes = _output_sizes(op_def, _with_defaults(node, op_def))
        position = names.index(out_arg)
        step = self.planner.add_eager_step(self.id, node, [self.resolve(i) for i in data_inputs])
        return Source("step", step, sum(sizes[:position]) + index)


def _why_not_eager(node) -> str | None:
    """None if ``node`` can run as one eager op of a direct call, else why not (a
    control-flow op's functions are ``_Planner.check_callees``'s to check)."""
    if node.op in _CONTROL_FLOW_OPS:
        return None
    if node.op in _NOT_EAGER:
        return "is control flow or an argument"
    return _why_not_in_callee(node)


def _why_not_in_callee(node) -> str | None:
    """None if ``node`` is stateless (or a check) and calls no function, else why not."""
    op_def = op_def_registry.get(node.op)
    if op_def is None:
        return "is not a registered op"
    if op_def.is_stateful and node.op not in _CHECK_OPS:
        return "has state"
    if _function_attrs(node):
        return "calls a function"
    return None


def _with_defaults(node, op_def) -> dict[str, attr_value_pb2.AttrValue]:
    """The node's attributes (internal ``_`` ones left out), with the op's defaults
    for those a SavedModel stripped."""
    full = with_default_attrs(node, op_def)
    return {k: v for k, v in full.attr.items() if not k.startswith("_")}


def _output_sizes(op_def, attrs: dict[str, attr_value_pb2.AttrValue]) -> list[int]:
    """How many tensors each output arg of an op with ``attrs`` has."""
    sizes = []
    for arg in op_def.output_arg:
        if arg.number_attr:
            sizes.append(int(attrs[arg.number_attr].i))
        elif arg.type_list_attr:
            sizes.append(len(attrs[arg.type_list_attr].list.type))
        else:
            sizes.append(1)
    return sizes


def plan_function(fdef: function_pb2.FunctionDef, num_args: int, is_resource: list[bool],
                  lookup: FunctionLookup) -> DirectPlan:
    """Plans a direct call of ``fdef``; raises ``NotDirect`` when its body does not allow one.

    ``fdef``'s inputs are ``num_args`` call arguments followed by its captured
    inputs; ``is_resource[i]`` says whether input ``i`` is a resource handle.
    ``lookup`` returns the FunctionDef of a called function (None if unknown).
    """
    if len(is_resource) != len(fdef.signature.input_arg):
        raise NotDirect(f"{fdef.signature.name}: {len(is_resource)} input kinds for "
                        f"{len(fdef.signature.input_arg)} inputs")
    planner = _Planner(lookup, num_args, is_resource)
    planner.check_body(fdef)
    tops = [planner.top_source(i) for i in range(len(is_resource))]
    outputs = planner.function_outputs(fdef, tops)
    if not any(step.is_cluster for step in planner.steps):
        raise NotDirect(f"{fdef.signature.name}: no DiscCluster op")
    for s in outputs:
        if s.kind == "variable":
            raise NotDirect(f"{fdef.signature.name}: returns a variable's value")
    return DirectPlan(function=fdef.signature.name, num_args=num_args,
                      steps=tuple(planner.steps), outputs=tuple(outputs),
                      constants=tuple(planner.constants))
