"""``disc_tf.enable()``: cluster every graph TensorFlow runs, with no code change.

With ``TF_DISC_ENABLE=1`` the graph pass of the op library
(``cc/kernels/graph_pass.cc``) hands each graph TF builds for execution (a
tf.function's graph, a TF1 Session's graph) to ``_optimize_serialized`` before
it runs. Clusters become DiscCluster nodes; everything else is unchanged.
A graph that cannot be optimized runs as it is.

``DISC_TF_COMPILE_MODE`` picks when clusters are compiled: ``async`` (the
default) rewrites the graph at once and compiles on a background thread, the
original ops serving every call until a cluster's artifact is ready (see
``disc_tf.background``); ``sync`` compiles before the graph first runs.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from typing import TYPE_CHECKING

from tensorflow.core.framework import graph_pb2

from disc_tf import strict
from disc_tf.cluster import op_registry
from disc_tf.runtime import isa, native

if TYPE_CHECKING:
    from disc_tf.background import CompileQueue, Publisher

log = logging.getLogger("disc_tf")

ENV_VAR = "TF_DISC_ENABLE"
MODE_VAR = "DISC_TF_COMPILE_MODE"
MODES = ("async", "sync")

_MIN_CLUSTER_SIZE = 2
_state = threading.local()
_config = {"target": "auto"}
_queue_lock = threading.Lock()
_queue: CompileQueue | None = None  # made on first use


def enable(target: str = "auto") -> None:
    """Turns on clustering of every graph TensorFlow executes in this process.

    Sets ``TF_DISC_ENABLE=1`` and loads the op library, which registers the
    graph pass. Graphs already instantiated are not re-optimized.
    """
    from disc_tf.saved_model import resolve_target

    resolve_target(target)  # checks the name
    _config["target"] = target
    os.environ[ENV_VAR] = "1"
    native.load()


def disable() -> None:
    """Stops optimizing graphs built from now on."""
    os.environ.pop(ENV_VAR, None)


def is_enabled() -> bool:
    """True if graphs built from now on are optimized."""
    return os.environ.get(ENV_VAR) == "1"


def compile_mode() -> str:
    """``$DISC_TF_COMPILE_MODE``: 'async' (default) or 'sync' (the default in strict
    mode, where a call that runs the original ops while compiling is an error)."""
    mode = os.environ.get(MODE_VAR, "").strip().lower() or (
        "sync" if strict.strict_from_env() else "async")
    if mode not in MODES:
        log.warning("disc_tf: %s=%r is not one of %s; using async", MODE_VAR, mode, MODES)
        return "async"
    return mode


def _mark_busy() -> None:
    _state.busy = True  # graphs the compiler itself runs are left alone


def compile_queue() -> CompileQueue:
    """The process's background CompileQueue."""
    global _queue
    from disc_tf.background import CompileQueue, pending_calls

    with _queue_lock:
        if _queue is None:
            _queue = CompileQueue(on_thread_start=_mark_busy, priority=pending_calls)
        return _queue


def wait_for_compilations(timeout: float | None = None) -> bool:
    """Waits until every background compilation so far is published.

    Returns False if ``timeout`` seconds passed first.
    """
    with _queue_lock:
        q = _queue
    return True if q is None else q.wait(timeout)


def _clusterable_ops(graph_def: graph_pb2.GraphDef) -> int:
    return sum(
        1 for n in graph_def.node
        if (s := op_registry.lookup(n.op)) is not None and not s.trivial
    )


# What tf.Graph accepts as a node name; runtime graphs also hold names such as
# '_arg_x_0_0' that it refuses.
_VALID_NAME = re.compile(r"^[A-Za-z0-9.][A-Za-z0-9_.\\/>-]*$")


def _rename_refs(graph_def: graph_pb2.GraphDef, names: dict[str, str]) -> None:
    """Renames nodes and every reference to them (inputs, colocation) in place."""

    def ref(r: str) -> str:
        ctrl = r.startswith("^")
        base, sep, idx = r[1:].partition(":") if ctrl else r.partition(":")
        return ("^" if ctrl else "") + names.get(base, base) + sep + idx

    for nd in graph_def.node:
        nd.name = names.get(nd.name, nd.name)
        for i, r in enumerate(nd.input):
            nd.input[i] = ref(r)
        if "_class" in nd.attr:
            vals = nd.attr["_class"].list.s
            for i, v in enumerate(vals):
                loc = v.decode(errors="replace")
                if loc.startswith("loc:@") and loc[5:] in names:
                    vals[i] = ("loc:@" + names[loc[5:]]).encode()


def _legal_names(graph_def: graph_pb2.GraphDef) -> dict[str, str]:
    """Importable stand-ins for the node names tf.Graph refuses."""
    taken = {n.name for n in graph_def.node}
    renames: dict[str, str] = {}
    for nd in graph_def.node:
        if _VALID_NAME.match(nd.name):
            continue
        base = "disc_rn/" + re.sub(r"[^A-Za-z0-9_.\\/>-]", "_", nd.name)
        new, k = base, 0
        while new in taken:
            k += 1
            new = f"{base}_{k}"
        taken.add(new)
        renames[nd.name] = new
    return renames


def optimize_graph(data: bytes, protected_names: list[str], mode: str,
                   publish: Publisher | None = None, compiler: CompileQueue | None = None,
                   target: str | None = None) -> bytes | None:
    """The rewritten GraphDef, or None if it has nothing to compile.

    ``mode`` 'sync' compiles here; 'async' queues each cluster on ``compiler``
    (a ``CompileQueue``) and hands results to ``publish``. ``target`` defaults
    to the one given to :func:`enable`.
    """
    graph_def = graph_pb2.GraphDef.FromString(data)
    if any(n.op == "DiscCluster" for n in graph_def.node):
        return None
    if _clusterable_ops(graph_def) < _MIN_CLUSTER_SIZE:
        return None
    # Imported here: the optimizer pulls in the whole compiler.
    from disc_tf.optimizer import BodyOptimizer, OptimizeReport, Options
    from disc_tf.saved_model import resolve_target

    start = time.monotonic()
    renames = _legal_names(graph_def)
    if renames:
        _rename_refs(graph_def, renames)
        protected_names = [renames.get(n, n) for n in protected_names]
    options = Options(target=resolve_target(target or _config["target"]),
                      min_cluster_size=_MIN_CLUSTER_SIZE, isa_levels=isa.resolve(None, "host"))
    report = OptimizeReport()
    if mode == "sync":
        opt = BodyOptimizer(graph_def.library, options, report)
    else:
        from disc_tf.background import DeferredBodyOptimizer

        opt = DeferredBodyOptimizer(graph_def.library, options, report,
                                    compiler=compiler, publish=publish)
    new_graph = opt.optimize_graph_def(graph_def, frozenset(protected_names))
    if new_graph is graph_def or not report.compiled:
        return None
    if mode != "sync":
        opt.mark_pending(new_graph)
    if renames:
        _rename_refs(new_graph, {v: k for k, v in renames.items()})
    opt.add_new_functions(new_graph.library)
    log.info("disc_tf: %d cluster(s) in a graph of %d nodes (%s, %.2fs)",
             len(report.compiled), len(graph_def.node), mode, time.monotonic() - start)
    return new_graph.SerializeToString()


def _optimize_serialized(graph_def_bytes: bytes, fetch_node_names: list[str]) -> bytes | None:
    """Called by the graph pass: the rewritten GraphDef, or None to keep the graph.

    ``fetch_node_names`` are nodes that must keep their names (arguments,
    return values and the nodes they read). Never raises.
    """
    if getattr(_state, "busy", False):
        return None  # a graph run while optimizing another: leave it alone
    _state.busy = True
    try:
        mode = compile_mode()
        if mode == "sync":
            return optimize_graph(graph_def_bytes, fetch_node_names, mode)
        from disc_tf.background import publish_in_process

        return optimize_graph(graph_def_bytes, fetch_node_names, mode,
                              publish=publish_in_process, compiler=compile_queue())
    except Exception:  # noqa: BLE001 - never fail the user's graph
        log.warning("disc_tf: graph left unoptimized", exc_info=True)
        return None
    finally:
        _state.busy = False
