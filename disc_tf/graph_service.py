"""``python -m disc_tf compile-graph``: the compiler for hosts without Python.

A C++-only host (a model server linking the op library) has no interpreter
for the graph pass to call, so the pass runs this command instead
(``cc/kernels/subprocess_compiler.cc``) and talks to it over stdout, one
line per event::

    PENDING <key>                               (async) a cluster being compiled
    GRAPH <path>                                the rewritten GraphDef is in <path>
    NONE                                        nothing to compile; keep the graph
    ARTIFACT <key> <sha256> <num_kernels> <path> (async) a compiled cluster
    FAILED <key> <reason>                        (async) a cluster that did not compile

In ``sync`` mode every cluster is compiled into the graph before ``GRAPH``;
in ``async`` mode ``GRAPH`` comes first (DiscCluster nodes with pending keys)
and artifacts follow as they are built. The exit status is 0 unless the
command line or its files are unusable.
"""

from __future__ import annotations

import argparse
import logging
import pathlib
import shutil
import sys
import threading
from typing import TextIO

from disc_tf.runtime.compiler import Artifact

log = logging.getLogger("disc_tf")


class _LinePublisher:
    """Writes each finished cluster to ``out_dir`` and announces it on ``out``.

    ``host_gone`` is set once ``out`` is closed (the host exited or killed the
    request); nothing more is written then.
    """

    def __init__(self, out_dir: pathlib.Path, out: TextIO) -> None:
        self.out_dir = out_dir
        self.out = out
        self.lock = threading.Lock()
        self.host_gone = threading.Event()

    def say(self, line: str) -> None:
        with self.lock:
            if self.host_gone.is_set():
                return
            try:
                self.out.write(line.replace("\n", " ") + "\n")
                self.out.flush()
            except (BrokenPipeError, ValueError):
                self.host_gone.set()

    def __call__(self, key: str, artifact: Artifact | None, error: str | None) -> None:
        if self.host_gone.is_set():
            return
        if artifact is None:
            self.say(f"FAILED {key} {error or 'unknown error'}")
            return
        path = self.out_dir / f"{key}.so"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(artifact.data)
        tmp.replace(path)
        self.say(f"ARTIFACT {key} {artifact.sha256} {artifact.num_kernels} {path}")


def compile_graph(graph_path: pathlib.Path, protected_path: pathlib.Path,
                  out_dir: pathlib.Path, mode: str, out: TextIO, target: str = "auto") -> int:
    """Runs one compile-graph request; see the module docstring."""
    from disc_tf.background import CompileQueue
    from disc_tf.enable import optimize_graph

    data = graph_path.read_bytes()
    protected = [n for n in protected_path.read_text().splitlines() if n]
    publisher = _LinePublisher(out_dir, out)
    queue = None
    if mode == "async":
        queue = CompileQueue(on_submit=lambda key: publisher.say(f"PENDING {key}"))
    try:
        result = optimize_graph(data, protected, mode, publish=publisher, compiler=queue,
                                target=target)
    except Exception:  # noqa: BLE001 - the host keeps its graph
        log.warning("disc_tf: graph left unoptimized", exc_info=True)
        result = None
    if result is None:
        publisher.say("NONE")
    else:
        graph_out = out_dir / "optimized_graph.pb"
        graph_out.write_bytes(result)
        publisher.say(f"GRAPH {graph_out}")
    if queue is not None:
        while not queue.wait(1.0):
            if publisher.host_gone.is_set():
                queue.close()  # nobody to hand the rest to
                break
    if publisher.host_gone.is_set():
        # The host made out_dir for this request and can no longer remove it.
        shutil.rmtree(out_dir, ignore_errors=True)
    return 0


def main(argv: list[str]) -> int:
    """``compile-graph --graph G --protected P --out-dir D [--mode M] [--target T]``."""
    parser = argparse.ArgumentParser(prog="disc-tf compile-graph",
                                     description="compile the clusters of one GraphDef")
    parser.add_argument("--graph", required=True, type=pathlib.Path)
    parser.add_argument("--protected", required=True, type=pathlib.Path,
                        help="file of node names (one a line) that must keep their names")
    parser.add_argument("--out-dir", required=True, type=pathlib.Path)
    parser.add_argument("--mode", choices=("sync", "async"), default="sync")
    parser.add_argument("--target", default="auto")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="disc_tf compile-graph: %(message)s")
    return compile_graph(args.graph, args.protected, args.out_dir, args.mode, sys.stdout,
                         args.target)
