"""Ahead-of-time optimisation of SavedModels (``disc_tf.optimize``).

The SavedModel proto is rewritten in place: every FunctionDef that serving
runs (see :mod:`disc_tf.scope`; all of them on request) and the serving part of
the TF1 main graph are clustered, each cluster
becomes a DiscCluster node carrying its compiled artifact, and the original
ops stay in the library as each cluster's fallback function. Variables,
assets and the object graph are copied unchanged, so the result loads with
``tf.saved_model.load`` and ``tf.compat.v1.saved_model.load`` alike.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import shutil

from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2

from disc_tf import scope, trust
from disc_tf.optimizer import BodyOptimizer, OptimizeReport, Options
from disc_tf.runtime import isa, native
from disc_tf.runtime.target import resolve_target as _resolve_target
from disc_tf.serving_warmup import write_serving_warmup

log = logging.getLogger("disc_tf")


def referenced_nodes(meta_graph: meta_graph_pb2.MetaGraphDef) -> frozenset[str]:
    """Node names that the MetaGraph refers to by name (signatures, saver, ...)."""
    names: set[str] = set()

    def add(tensor_name: str) -> None:
        if tensor_name:
            names.add(tensor_name.lstrip("^").split(":")[0])

    for sig in meta_graph.signature_def.values():
        for info in list(sig.inputs.values()) + list(sig.outputs.values()):
            add(info.name)
    saver = meta_graph.saver_def
    for t in (saver.filename_tensor_name, saver.save_tensor_name, saver.restore_op_name):
        add(t)
    for node in meta_graph.object_graph_def.nodes:
        if node.WhichOneof("kind") == "constant":  # a Const of the main graph, by name
            add(node.constant.operation)
    for col in meta_graph.collection_def.values():
        for n in col.node_list.value:
            add(n)
        for b in col.bytes_list.value:
            try:
                add(b.decode())
            except UnicodeDecodeError:
                pass
    return frozenset(names)


def object_graph_references(meta_graph: meta_graph_pb2.MetaGraphDef
                            ) -> dict[str, frozenset[str]]:
    """Per library function, the nodes whose tensors the object graph names: a
    ``captured_tensor`` (e.g. Keras' swish captures a Dense layer's BiasAdd) is
    looked up by name in its function's graph when the model loads."""
    found: dict[str, set[str]] = {}
    for node in meta_graph.object_graph_def.nodes:
        if node.WhichOneof("kind") == "captured_tensor":
            tensor = node.captured_tensor
            found.setdefault(tensor.concrete_function, set()).add(tensor.name.split(":")[0])
    return {fn: frozenset(names) for fn, names in found.items()}


def constant_args(meta_graph: meta_graph_pb2.MetaGraphDef) -> dict[str, frozenset[str]]:
    """Per library function, its arguments bound to constants: a concrete function's
    captures are its last arguments, bound in order to the object graph's nodes, and a
    ``tf.constant`` a ``tf.Module`` holds is saved as a ``constant`` node."""
    graph = meta_graph.object_graph_def
    args = {f.signature.name: [a.name for a in f.signature.input_arg]
            for f in meta_graph.graph_def.library.function}
    found: dict[str, frozenset[str]] = {}
    for name, fn in graph.concrete_functions.items():
        names = args.get(name)
        bound = list(fn.bound_inputs)
        if names is None or not bound or len(bound) > len(names):
            continue
        tail = names[len(names) - len(bound):]
        consts = frozenset(arg for arg, node in zip(tail, bound)
                           if 0 <= node < len(graph.nodes)
                           and graph.nodes[node].WhichOneof("kind") == "constant")
        if consts:
            found[name] = consts
    return found


def resolve_target(target: str) -> str:
    """'cpu', 'cuda', or what 'auto' picks on this machine; checks the name."""
    return _resolve_target(target)


_last_report: OptimizeReport | None = None


def last_report() -> OptimizeReport | None:
    """The report of this process's latest ``optimize`` (None before the first)."""
    return _last_report


def optimize_saved_model(saved_model_dir: str, output_dir: str, *, target: str = "auto",
                         signatures=None, all_functions: bool = False,
                         min_cluster_size: int = 2, strict: bool | None = None,
                         progress=None, isa_levels=None, signing_key=None,
                         serving_warmup: bool = False) -> OptimizeReport:
    """Writes an optimized copy of a SavedModel to ``output_dir``; returns the report.

    Compiles what serving runs: the functions and main-graph nodes reachable from
    ``signatures`` (default: every serving signature and the root object's
    ``tf.function``s), or every function with ``all_functions``.
    ``strict`` (default ``$DISC_TF_STRICT``): any cluster that fails to compile
    raises StrictModeError (and nothing is written). ``progress(spec)`` is called as
    each cluster starts compiling. ``isa_levels``: the x86-64 levels CPU kernels are
    compiled for ("portable", the default: every level; "host"; or a list:
    ``runtime/isa.py``). ``signing_key`` (an Ed25519 private key or its PEM file)
    signs every artifact, so hosts that trust its public key load them as they are
    (``disc_tf/trust.py``). ``serving_warmup``: write TF Serving's warm-up requests
    (``disc_tf/serving_warmup.py``) unless the model has its own."""
    global _last_report
    native.load()
    src = pathlib.Path(saved_model_dir)
    dst = pathlib.Path(output_dir)
    if not (src / "saved_model.pb").exists():
        raise FileNotFoundError(f"{src} has no saved_model.pb")
    if isinstance(signatures, str):
        signatures = [signatures]
    options = Options(target=resolve_target(target), min_cluster_size=min_cluster_size,
                      strict=strict, progress=progress,
                      isa_levels=isa.resolve(isa_levels, "portable"),
                      signing_key=None if signing_key is None else trust.load_signing_key(
                          signing_key))
    sm = saved_model_pb2.SavedModel()
    sm.ParseFromString((src / "saved_model.pb").read_bytes())
    report = OptimizeReport(serving_bodies={"main_graph"})
    for meta_graph in sm.meta_graphs:
        served = scope.serving_scope(meta_graph, signatures, all_functions)
        report.serving_bodies |= served.functions
        report.entries += [e for e in served.entries if e not in report.entries]
        opt = BodyOptimizer(meta_graph.graph_def.library, options, report)
        opt.constant_args = constant_args(meta_graph)
        library = opt.optimize_library(object_graph_references(meta_graph),
                                       served.has_function)
        outside = served.outside(n.name for n in meta_graph.graph_def.node)
        graph = opt.optimize_graph_def(
            meta_graph.graph_def, referenced_nodes(meta_graph), body="main_graph",
            outside=outside)
        opt.add_new_functions(library)
        graph.library.CopyFrom(library)
        meta_graph.graph_def.CopyFrom(graph)
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for entry in os.listdir(src):
        if entry in ("saved_model.pb", "fingerprint.pb"):
            continue
        s = src / entry
        (shutil.copytree if s.is_dir() else shutil.copy2)(s, dst / entry)
    (dst / "saved_model.pb").write_bytes(sm.SerializeToString(deterministic=True))
    manifest = dst / "assets.extra" / "disc"
    manifest.mkdir(parents=True, exist_ok=True)
    (manifest / "clusters.json").write_text(json.dumps(
        [c.__dict__ for c in report.clusters], indent=1, default=str))
    if serving_warmup and report.compiled:
        try:
            report.serving_warmup = write_serving_warmup(dst, src)
        except Exception as e:  # noqa: BLE001 - the model is written; only the requests are not
            log.warning("no TF Serving warm-up requests written for %s: %s: %s", dst,
                        type(e).__name__, e)
    (manifest / "report.json").write_text(json.dumps(report.to_json(), indent=1, default=str))
    log.info("optimized %s -> %s: %s", src, dst, report.total_line())
    _last_report = report
    return report
