"""Asynchronous compilation for ``TF_DISC_ENABLE=1``.

In the default (``async``) mode the graph pass must not wait for g++. The
graph is clustered at once and each cluster becomes a DiscCluster node with
an empty ``artifact`` and a ``pending_key``; its compilation is queued on one
background thread. Until the key is published, calls run the node's fallback
function (the original ops); every call after it runs the compiled artifact.
See ``cc/kernels/pending_artifacts.h`` for the table the op consults.

A publisher receives each result: in-process it is :func:`publish_in_process`
(ctypes into the loaded op library); the ``compile-graph`` subprocess used by
hosts without Python writes files instead (``disc_tf.graph_service``).
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import logging
import os
import threading
from collections.abc import Callable

from tensorflow.core.framework import graph_pb2

from disc_tf import pipeline
from disc_tf.cluster import rewrite
from disc_tf.cluster.graph_view import GraphView
from disc_tf.optimizer import BodyOptimizer, ClusterReport, carve_clusters
from disc_tf.runtime import isa, native
from disc_tf.runtime.compiler import Artifact

log = logging.getLogger("disc_tf")

#: publish(key, artifact, error): exactly one of artifact / error is set.
Publisher = Callable[[str, "Artifact | None", "str | None"], None]

PENDING_ATTR = "pending_key"
_NO_ARTIFACT = rewrite.CompiledClusterAttrs(b"", "", 0)


def cluster_key(fallback_bytes: bytes, target: str) -> str:
    """The pending key of a cluster: a hash of its original ops and target."""
    return hashlib.sha256(target.encode() + b"\0" + fallback_bytes).hexdigest()[:32]


class DeferredBodyOptimizer(BodyOptimizer):
    """A BodyOptimizer that queues compilations instead of running them.

    ``pending`` maps each new DiscCluster node name to its key; call
    :meth:`mark_pending` on the rewritten graph to store the keys in the nodes.
    """

    def __init__(self, *args, compiler: CompileQueue, publish: Publisher, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.compiler = compiler
        self.publish = publish
        self.pending: dict[str, str] = {}

    def _compile(self, body: str, view: GraphView, fetched: frozenset[str],
                 protected: frozenset[str], taken: set[str],
                 outside: frozenset[str] = frozenset()):
        """Extracts the clusters and queues them; the nodes get no artifact yet
        (graphs given to the graph pass have no ``outside`` nodes)."""
        result, specs = carve_clusters(view, fetched, protected, taken,
                                       self.options.min_cluster_size)
        self.report.unclustered[body] = result.reasons
        replaced = []
        for spec in specs:
            rep = ClusterReport(body, spec.name, spec.op_summary(), len(spec.inputs),
                                len(spec.outputs))
            self.report.clusters.append(rep)
            try:
                fallback = rewrite.fallback_function(spec)
            except Exception as e:  # noqa: BLE001 - the cluster stays as TF ops
                rep.error = f"{type(e).__name__}: {e}"
                for n in spec.node_names:
                    result.reasons[n] = f"cluster {spec.name} has no fallback function"
                continue
            key = cluster_key(fallback.SerializeToString(deterministic=True),
                              self.options.target)
            self.pending[spec.name] = key
            self.compiler.submit(key, spec, self.options.target, self.publish,
                                 self.options.isa_levels)
            self.new_functions[fallback.signature.name] = fallback
            replaced.append((spec, fallback.signature.name, _NO_ARTIFACT))
        return replaced

    def mark_pending(self, graph_def: graph_pb2.GraphDef) -> None:
        """Sets ``pending_key`` on the DiscCluster nodes this optimizer made."""
        for nd in graph_def.node:
            if nd.op == rewrite.DISC_OP and nd.name in self.pending:
                nd.attr[PENDING_ATTR].s = self.pending[nd.name].encode()


class CompileQueue:
    """One daemon thread compiling queued clusters, each key once: the waiting
    cluster whose fallback ran most often first (``priority(key)``: calls so far),
    else in the order they came.

    At interpreter exit the queue is dropped and the compilation in progress
    is awaited (a daemon thread stopped inside native code can abort the
    process); a dropped cluster simply was never switched over. A compilation
    that fails once the queue is closed (the exit took its thread pool or its
    temporary directory) is dropped too: logged at INFO, not published.
    """

    def __init__(self, on_thread_start: Callable[[], None] | None = None,
                 on_submit: Callable[[str], None] | None = None,
                 priority: Callable[[str], int] | None = None) -> None:
        self._waiting: list[tuple[int, tuple]] = []  # (arrival, item)
        self._arrivals = 0
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # nothing outstanding
        self._more = threading.Condition(self._lock)  # something waiting, or closed
        self._outstanding = 0
        self._thread: threading.Thread | None = None
        self._on_thread_start = on_thread_start
        self._on_submit = on_submit
        self._priority = priority
        self._closed = False

    def submit(self, key: str, spec: rewrite.ClusterSpec, target: str,
               publish: Publisher, levels: tuple[str, ...] = isa.PORTABLE) -> None:
        """Queues ``spec`` (CPU kernels for the x86-64 ``levels``) unless ``key`` was
        queued before."""
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
            self._outstanding += 1
            if self._closed:
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="disc_tf-compile",
                                                daemon=True)
                self._thread.start()
                atexit.register(self.close)
        if self._on_submit is not None:
            self._on_submit(key)
        with self._lock:
            self._waiting.append((self._arrivals, (key, spec, target, publish, levels)))
            self._arrivals += 1
            self._more.notify()

    def submitted(self) -> list[str]:
        """The keys queued so far."""
        with self._lock:
            return sorted(self._seen)

    def wait(self, timeout: float | None = None) -> bool:
        """Waits until every queued cluster is published; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._outstanding == 0, timeout)

    def close(self, timeout: float = 600.0) -> None:
        """Drops what is queued and waits for the compilation in progress."""
        with self._lock:
            self._closed = True
            thread = self._thread
            self._more.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _calls(self, key: str) -> int:
        if self._priority is None:
            return 0
        try:
            return int(self._priority(key))
        except Exception:  # noqa: BLE001 - no count: its place in the order decides
            return 0

    def _next(self) -> tuple | None:
        """The hottest waiting item (the first to come among equals); None once closed."""
        with self._more:
            self._more.wait_for(lambda: self._waiting or self._closed)
            if self._closed:
                return None
            best = max(self._waiting, key=lambda w: (self._calls(w[1][0]), -w[0]))
            self._waiting.remove(best)
            return best[1]

    def _work(self) -> None:
        if self._on_thread_start is not None:
            self._on_thread_start()
        while True:
            item = self._next()
            if item is None:
                return
            try:
                self._build(*item, closing=lambda: self._closed)
            finally:
                with self._idle:
                    self._outstanding -= 1
                    self._idle.notify_all()

    @staticmethod
    def _build(key: str, spec: rewrite.ClusterSpec, target: str, publish: Publisher,
               levels: tuple[str, ...], closing: Callable[[], bool] = lambda: False) -> None:
        name = getattr(spec, "name", key)
        try:
            artifact, error = pipeline.compile_cluster(spec, target, levels).artifact, None
        except Exception as e:  # noqa: BLE001 - reported to the publisher
            if closing():  # the process is exiting: nothing will run the cluster
                log.info("disc_tf: cluster %s not compiled: the process exited first (%s: %s)",
                         name, type(e).__name__, e)
                return
            artifact, error = None, f"{type(e).__name__}: {e}"
            log.warning("disc_tf: cluster %s left as TF ops: %s", name, error)
        try:
            publish(key, artifact, error)
        except Exception:  # noqa: BLE001 - the cluster keeps its original ops
            log.warning("disc_tf: publishing cluster %s failed", name, exc_info=True)


_lib_lock = threading.Lock()
_lib: ctypes.CDLL | None = None


def _ops_lib() -> ctypes.CDLL:
    global _lib
    with _lib_lock:
        if _lib is None:
            # RTLD_NOLOAD: the copy TensorFlow loaded, whose table the op reads.
            lib = ctypes.CDLL(str(native.load().ops_lib_path),
                              mode=os.RTLD_NOLOAD | os.RTLD_LOCAL)
            lib.disc_pending_publish.argtypes = [ctypes.c_char_p, ctypes.c_char_p,
                                                 ctypes.c_int64, ctypes.c_char_p,
                                                 ctypes.c_int64]
            lib.disc_pending_publish.restype = ctypes.c_int32
            lib.disc_pending_fail.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
            lib.disc_pending_fail.restype = None
            lib.disc_pending_state.argtypes = [ctypes.c_char_p]
            lib.disc_pending_state.restype = ctypes.c_int32
            lib.disc_pending_calls.argtypes = [ctypes.c_char_p]
            lib.disc_pending_calls.restype = ctypes.c_int64
            _lib = lib
        return _lib


def publish_in_process(key: str, artifact: Artifact | None, error: str | None) -> None:
    """Hands a finished compilation to the DiscCluster nodes waiting for ``key``."""
    if artifact is None:
        _ops_lib().disc_pending_fail(key.encode(), (error or "unknown error").encode())
        return
    publish_bytes(key, artifact.data, artifact.sha256, artifact.num_kernels)


def publish_bytes(key: str, data: bytes, sha256: str, num_kernels: int) -> bool:
    """Loads an artifact's bytes and makes it the artifact of ``key``; False (and the
    key failed, so its ops run their fallback) when it does not load."""
    return bool(_ops_lib().disc_pending_publish(key.encode(), data, len(data), sha256.encode(),
                                                num_kernels))


def pending_state(key: str) -> str:
    """'unknown', 'ready' or 'failed': what the op library knows of ``key``."""
    return ("unknown", "ready", "failed")[_ops_lib().disc_pending_state(key.encode())]


def pending_calls(key: str) -> int:
    """Calls that ran ``key``'s original ops while it was compiling."""
    return int(_ops_lib().disc_pending_calls(key.encode()))
