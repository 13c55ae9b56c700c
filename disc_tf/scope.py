"""What serving runs: the part of a SavedModel that ``optimize`` compiles.

A SavedModel's entry points are its signatures (run through the main graph's
call nodes) and the ``tf.function``s of its root object (``loaded.serve``,
``loaded.__call__``). Everything they call, transitively, is in scope; the
checkpoint save/restore functions, the init op, functions only reachable from
inner objects (a Keras layer's own traced calls) and a Keras model's traces for
``training=True`` (dropout and batch statistics: what ``fit`` runs, never what
serving runs) are not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from tensorflow.core.protobuf import meta_graph_pb2

#: Signature keys TF uses for its own plumbing, never for serving requests.
INTERNAL_SIGNATURE_PREFIX = "__"


@dataclasses.dataclass(frozen=True)
class ServingScope:
    """Library functions and main-graph nodes run by a MetaGraph's entry points."""

    functions: frozenset[str]
    graph_nodes: frozenset[str]
    #: what defines the scope, e.g. ``signature serving_default``, ``function serve``
    entries: tuple[str, ...]
    #: True when every function and node counts (asked for, or no entry point found)
    everything: bool = False

    def has_function(self, name: str) -> bool:
        """Whether serving runs library function ``name``."""
        return self.everything or name in self.functions

    def has_node(self, name: str) -> bool:
        """Whether serving runs main-graph node ``name``."""
        return self.everything or name in self.graph_nodes

    def outside(self, names: Iterable[str]) -> frozenset[str]:
        """The main-graph nodes among ``names`` that serving never runs."""
        return frozenset(n for n in names if not self.has_node(n))


def called_functions(nodes: Iterable, library_names: set[str]) -> set[str]:
    """Library functions named by the func attrs (f, body, branches...) of ``nodes``;
    not a DiscCluster's fallback (it runs only where the compiled code cannot)."""
    out = set()
    for node in nodes:
        for key, value in node.attr.items():
            if key == "fallback" and node.op == "DiscCluster":
                continue
            names = [value.func.name] + [f.name for f in value.list.func]
            out.update(n for n in names if n in library_names)
    return out


def serving_signatures(meta_graph: meta_graph_pb2.MetaGraphDef) -> list[str]:
    """The signature keys that serve requests (TF's own ``__…`` keys left out)."""
    return sorted(k for k in meta_graph.signature_def
                  if not k.startswith(INTERNAL_SIGNATURE_PREFIX))


def root_functions(meta_graph: meta_graph_pb2.MetaGraphDef,
                   serving_only: bool = False) -> dict[str, list[str]]:
    """The root object's ``tf.function`` attributes: name -> concrete functions
    (with ``serving_only``, those traced with ``training=True`` left out)."""
    graph = meta_graph.object_graph_def
    if not graph.nodes:
        return {}
    found: dict[str, list[str]] = {}
    for child in graph.nodes[0].children:
        node = graph.nodes[child.node_id]
        kind = node.WhichOneof("kind")
        if kind == "function":
            spec = node.function.function_spec
            found[child.local_name] = [
                c for c in node.function.concrete_functions
                if not (serving_only and c in graph.concrete_functions
                        and not _trains_by_default(spec)
                        and traced_for_training(spec, graph.concrete_functions[c]))]
        elif kind == "bare_concrete_function":
            found[child.local_name] = [node.bare_concrete_function.concrete_function_name]
    return found


def _argspec_field(function_spec, key: str):
    """One field (``args``, ``defaults``...) of a saved function's FullArgSpec, or None."""
    for field in function_spec.fullargspec.named_tuple_value.values:
        if field.key == key:
            return field.value
    return None


def _arg_names(function_spec) -> list[str]:
    """The positional parameter names of a saved function's spec (``self`` left out)."""
    args = _argspec_field(function_spec, "args")
    names = [v.string_value for v in args.list_value.values] if args is not None else []
    return names[1:] if function_spec.is_method and names else names


def _trains_by_default(function_spec) -> bool:
    """Whether ``training`` defaults to True (then a call that omits it trains)."""
    defaults = _argspec_field(function_spec, "defaults")
    if defaults is None:
        return False
    names = _arg_names(function_spec)  # defaults belong to the last names
    values = list(defaults.tuple_value.values)
    if "training" not in names or names.index("training") < len(names) - len(values):
        return False
    value = values[names.index("training") - (len(names) - len(values))]
    return value.WhichOneof("kind") == "bool_value" and value.bool_value


def traced_for_training(function_spec, concrete) -> bool:
    """Whether a concrete function was traced with ``training=True`` (passed by
    position or by keyword), as Keras saves a model's training-mode calls."""
    signature = concrete.canonicalized_input_signature.tuple_value.values
    if len(signature) != 2:
        return False
    args, kwargs = signature[0].tuple_value.values, signature[1].dict_value.fields
    names = _arg_names(function_spec)
    value = kwargs["training"] if "training" in kwargs else None
    if value is None and "training" in names and names.index("training") < len(args):
        value = args[names.index("training")]
    return value is not None and value.WhichOneof("kind") == "bool_value" and value.bool_value


def _graph_nodes_reached(meta_graph: meta_graph_pb2.MetaGraphDef,
                         signatures: Sequence[str]) -> set[str]:
    """Main-graph nodes the outputs of ``signatures`` depend on."""
    by_name = {n.name: n for n in meta_graph.graph_def.node}
    stack = [t.name.split(":")[0].lstrip("^") for key in signatures
             for t in meta_graph.signature_def[key].outputs.values()]
    nodes: set[str] = set()
    while stack:
        name = stack.pop()
        if name in nodes or name not in by_name:
            continue
        nodes.add(name)
        stack.extend(i.split(":")[0].lstrip("^") for i in by_name[name].input)
    return nodes


def serving_scope(meta_graph: meta_graph_pb2.MetaGraphDef,
                  signatures: Sequence[str] | None = None,
                  everything: bool = False) -> ServingScope:
    """The scope of ``signatures`` (default: every serving signature plus the root
    object's functions). Raises ValueError for a signature the model lacks. A model
    with no entry point at all (a TF1 graph without signatures) is in scope whole."""
    available = serving_signatures(meta_graph)
    if signatures is not None:
        missing = sorted(set(signatures) - set(meta_graph.signature_def))
        if missing:
            raise ValueError(f"signatures {missing} not in the model (it has {available})")
        chosen = list(signatures)
    else:
        chosen = available
    graph = meta_graph.graph_def
    by_name = {n.name: n for n in graph.node}
    nodes = _graph_nodes_reached(meta_graph, chosen)
    fdefs = {f.signature.name: f for f in graph.library.function}
    pending = called_functions([by_name[n] for n in nodes], set(fdefs))
    entries = [f"signature {k}" for k in chosen]
    if signatures is None:
        every_trace = root_functions(meta_graph)
        for name, concrete in sorted(root_functions(meta_graph, serving_only=True).items()):
            if name == "signatures":
                continue
            training = len(every_trace[name]) - len(concrete)
            entries.append(f"function {name}" + (f" ({training} training-mode trace(s) left "
                                                  "out)" if training else ""))
            pending.update(c for c in concrete if c in fdefs)
    functions: set[str] = set()
    while pending:
        name = pending.pop()
        if name not in functions:
            functions.add(name)
            pending |= called_functions(fdefs[name].node_def, set(fdefs))
    if everything or not entries:
        return ServingScope(frozenset(fdefs), frozenset(by_name), tuple(entries), True)
    return ServingScope(frozenset(functions), frozenset(nodes), tuple(entries))
