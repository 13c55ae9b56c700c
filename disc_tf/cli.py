"""The ``disc-tf`` command line.

``disc-tf optimize IN OUT`` compiles every cluster of a SavedModel ahead of time;
``disc-tf inspect MODEL`` shows, without compiling, what would be clustered, why
every other op stays out, and (with ``--until``) each compiler stage of every
cluster: DHLO, shape classes and fusion plan, generated source.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import logging
import pathlib
import sys
import textwrap
from collections.abc import Iterator
from typing import TextIO

from tensorflow.core.protobuf import saved_model_pb2

from disc_tf import pipeline
from disc_tf.cluster import clustering, rewrite
from disc_tf.cluster.graph_view import (
    GraphView,
    TensorInfo,
    view_of_function_def,
    view_of_graph_def,
)
from disc_tf.optimizer import FALLBACK_PREFIX, NON_COMPUTE_OPS, OptimizeReport, carve_clusters
from disc_tf.saved_model import optimize_saved_model, referenced_nodes

log = logging.getLogger("disc_tf")

STAGES = ("cluster", "dhlo", "fusion", "codegen")
MIN_CLUSTER_SIZE = 2  # what optimize uses
MAX_NAMES = 20  # names listed per unclustered reason


class UsageError(Exception):
    """A command line that cannot be served (exit code 2)."""


# --------------------------------------------------------------------------
# Bodies of a SavedModel
# --------------------------------------------------------------------------


@dataclasses.dataclass
class Body:
    """One clusterable body: a library function or a MetaGraph's main graph."""

    name: str
    kind: str  # "function" | "graph"
    view: GraphView | None
    fetched: frozenset[str] = frozenset()  # flat tensor names read from outside
    protected: frozenset[str] = frozenset()  # node names that must survive
    error: str | None = None  # why the body could not be analysed


def _load_saved_model(path: str) -> saved_model_pb2.SavedModel:
    model_dir = pathlib.Path(path)
    if not model_dir.is_dir() or not (model_dir / "saved_model.pb").is_file():
        raise UsageError(f"{path} is not a SavedModel directory (no saved_model.pb inside)")
    sm = saved_model_pb2.SavedModel()
    sm.ParseFromString((model_dir / "saved_model.pb").read_bytes())
    return sm


def iter_bodies(sm: saved_model_pb2.SavedModel) -> Iterator[Body]:
    """Every body the optimizer would cluster, in the optimizer's order."""
    for meta_graph in sm.meta_graphs:
        library = meta_graph.graph_def.library
        for fdef in library.function:
            name = fdef.signature.name
            if name.startswith(FALLBACK_PREFIX):
                continue
            try:
                view, nested_to_flat = view_of_function_def(fdef, library)
            except Exception as e:  # noqa: BLE001 - reported, not fatal
                yield Body(name, "function", None, error=f"{type(e).__name__}: {e}")
                continue
            fetched = frozenset(nested_to_flat.get(r, r) for r in fdef.ret.values())
            yield Body(name, "function", view, fetched)
        tags = ",".join(meta_graph.meta_info_def.tags) or "untagged"
        name = f"main_graph[{tags}]"
        try:
            view = view_of_graph_def(meta_graph.graph_def, library)
        except Exception as e:  # noqa: BLE001
            yield Body(name, "graph", None, error=f"{type(e).__name__}: {e}")
            continue
        protected = referenced_nodes(meta_graph)
        fetched = frozenset(t.name for n in protected if n in view.nodes
                            for t in view.nodes[n].outputs)
        yield Body(name, "graph", view, fetched, protected)


def _called_functions(nodes, library_names: set[str]) -> set[str]:
    """Library functions named by the func attrs (f, body, branches...) of ``nodes``."""
    out = set()
    for node in nodes:
        for value in node.attr.values():
            names = [value.func.name] + [f.name for f in value.list.func]
            out.update(n for n in names if n in library_names)
    return out


def serving_scope(meta_graph) -> tuple[set[str], set[str]]:
    """What serving runs: (main-graph nodes the signatures depend on, library
    functions they call, transitively). Checkpoint and init code is outside."""
    graph = meta_graph.graph_def
    by_name = {n.name: n for n in graph.node}
    stack = [t.name.split(":")[0].lstrip("^") for sig in meta_graph.signature_def.values()
             for t in sig.outputs.values()]
    nodes: set[str] = set()
    while stack:
        name = stack.pop()
        if name in nodes or name not in by_name:
            continue
        nodes.add(name)
        stack.extend(i.split(":")[0].lstrip("^") for i in by_name[name].input)
    fdefs = {f.signature.name: f for f in graph.library.function}
    functions: set[str] = set()
    pending = _called_functions([by_name[n] for n in nodes], set(fdefs))
    while pending:
        name = pending.pop()
        if name not in functions:
            functions.add(name)
            pending |= _called_functions(fdefs[name].node_def, set(fdefs))
    return nodes, functions


def cluster_body(body: Body) -> tuple[clustering.ClusteringResult, list[rewrite.ClusterSpec]]:
    """Clusters ``body`` as the optimizer does and extracts each cluster."""
    assert body.view is not None
    return carve_clusters(body.view, body.fetched, body.protected, set(body.view.nodes),
                          MIN_CLUSTER_SIZE)


# --------------------------------------------------------------------------
# inspect
# --------------------------------------------------------------------------


def _tensor(t: TensorInfo) -> str:
    dims = "<unknown rank>" if t.dims is None else ",".join(
        "?" if d is None else str(d) for d in t.dims)
    return f"{t.name} {t.dtype.name}[{dims}]"


def _ratio(done: int, total: int) -> str:
    pct = f"{100.0 * done / total:.1f}%" if total else "n/a"
    return f"clustered compute ops: {done}/{total} ({pct})"


def _stage_text(title: str, text: str) -> list[str]:
    return [f"    -- {title} --", textwrap.indent(text.rstrip("\n"), "      ")]


def describe_cluster(spec: rewrite.ClusterSpec, until: str, target: str = "cpu") -> list[str]:
    """The lines ``inspect`` prints for one cluster, up to stage ``until``, with the
    source generated for ``target``."""
    ops = spec.op_summary()
    lines = [f"  cluster {spec.name}: {len(ops)} ops"]
    lines.extend(f"    op {name} ({op})" for name, op in ops)
    lines.extend(f"    input data {_tensor(t)}" for t in spec.inputs)
    lines.extend(f"    input control ^{c}" for c in spec.control_inputs)
    lines.extend(f"    output {_tensor(t)}" for t in spec.outputs)
    level = STAGES.index(until)
    if level == 0:
        return lines
    try:
        fe = pipeline.front_end(spec, target)
    except Exception as e:  # noqa: BLE001 - shown instead of the stages
        return lines + [f"    stages failed: {type(e).__name__}: {e}"]
    lines += _stage_text("dhlo", fe.dhlo.text)
    if level >= 2:
        lines += _stage_text("shape classes", fe.shapes)
        lines += _stage_text("fusion plan", fe.plan.describe())
    if level >= 3:
        lines += _stage_text("generated source", fe.source)
    return lines


def describe_unclustered(view: GraphView, reasons: dict[str, str]) -> list[str]:
    """Compute ops grouped by reason (count, then names); other ops by type."""
    by_reason: dict[str, list[str]] = collections.defaultdict(list)
    noise: collections.Counter[str] = collections.Counter()
    for name in view.order:
        if name not in reasons:
            continue
        if view.nodes[name].op in NON_COMPUTE_OPS:
            noise[view.nodes[name].op] += 1
        else:
            by_reason[reasons[name]].append(name)
    lines = []
    for why, names in sorted(by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        shown = ", ".join(names[:MAX_NAMES])
        more = f", ... (+{len(names) - MAX_NAMES} more)" if len(names) > MAX_NAMES else ""
        lines.append(f"    {why} ({len(names)}): {shown}{more}")
    if noise:
        kinds = ", ".join(f"{op} x{n}" for op, n in sorted(noise.items()))
        lines.append(f"    non-compute ops ({sum(noise.values())}): {kinds}")
    return lines


def inspect_model(path: str, until: str = "cluster", out: TextIO | None = None,
                  target: str = "cpu") -> int:
    """Prints the clusters and unclustered ops of every body of a SavedModel."""
    out = out or sys.stdout
    sm = _load_saved_model(path)
    total_done = total = model_done = model_total = 0
    scope_nodes, scope_functions = set(), set()
    for meta_graph in sm.meta_graphs:
        n, f = serving_scope(meta_graph)
        scope_nodes |= n
        scope_functions |= f
    for body in iter_bodies(sm):
        if body.view is None:
            print(f"body {body.name} ({body.kind}): not analysed: {body.error}", file=out)
            continue
        compute = [n for n, nd in body.view.nodes.items() if nd.op not in NON_COMPUTE_OPS]
        if not compute:
            print(f"body {body.name} ({body.kind}): no compute ops", file=out)
            continue
        result, specs = cluster_body(body)
        clustered = {n for c in result.clusters for n in c}
        done = sum(n in clustered for n in compute)
        total_done, total = total_done + done, total + len(compute)
        served = [n for n in compute if (body.name in scope_functions if body.kind == "function"
                                         else n in scope_nodes)]
        model_done += sum(n in clustered for n in served)
        model_total += len(served)
        print(f"body {body.name} ({body.kind}): {len(body.view.nodes)} nodes, "
              f"{len(specs)} cluster(s)", file=out)
        for spec in specs:
            print("\n".join(describe_cluster(spec, until, target)), file=out)
        unclustered = describe_unclustered(body.view, result.reasons)
        if unclustered:
            print("  unclustered:", file=out)
            print("\n".join(unclustered), file=out)
        print(f"  {_ratio(done, len(compute))}", file=out)
    print(f"serving signatures: {_ratio(model_done, model_total)}", file=out)
    print(_ratio(total_done, total), file=out)
    return 0


# --------------------------------------------------------------------------
# optimize
# --------------------------------------------------------------------------


def _progress(total: int, err: TextIO):
    """A callback reporting each cluster on ``err`` as the optimizer starts compiling it."""
    count = 0

    def reporting(spec: rewrite.ClusterSpec) -> None:
        nonlocal count
        count += 1
        print(f"[{count}/{max(total, count)}] compiling {spec.name} "
              f"({len(spec.op_summary())} ops)", file=err, flush=True)

    return reporting


def summary_lines(report: OptimizeReport) -> list[str]:
    """One line per cluster: body, name, #ops, #kernels, compile time or error."""
    lines = []
    for c in report.clusters:
        head = f"{c.body}  {c.name}  {len(c.ops)} ops"
        if c.error is not None:
            lines.append(f"{head}  FAILED: {c.error}")
        else:
            when = "cache" if c.from_cache else f"{c.compile_seconds:.2f}s"
            lines.append(f"{head}  {c.kernels} kernel(s)  {when}")
    return lines


def optimize_model(src: str, dst: str, target: str, signatures: list[str] | None,
                   out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Optimizes a SavedModel and prints what happened to every cluster."""
    out, err = out or sys.stdout, err or sys.stderr
    sm = _load_saved_model(src)
    total = sum(len(cluster_body(b)[1]) for b in iter_bodies(sm) if b.view is not None)
    print(f"{total} cluster(s) to compile", file=err, flush=True)
    report = optimize_saved_model(src, dst, target=target, signatures=signatures,
                                  progress=_progress(total, err))
    for line in summary_lines(report):
        print(line, file=out)
    failed = len(report.clusters) - len(report.compiled)
    print(f"optimized {src} -> {dst}: {len(report.compiled)} cluster(s) compiled, "
          f"{failed} failed", file=out)
    return 0


# --------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="disc-tf", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True)
    opt = sub.add_parser("optimize", help="compile every cluster of a SavedModel")
    opt.add_argument("input", metavar="IN", help="SavedModel directory")
    opt.add_argument("output", metavar="OUT", help="where the optimized SavedModel goes")
    opt.add_argument("--target", choices=("auto", "cpu", "cuda"), default="auto",
                     help="cuda needs nvcc, not a GPU; auto picks cuda only where it can run")
    opt.add_argument("--signatures", default=None,
                     help="comma-separated signature names (default: all)")
    ins = sub.add_parser("inspect", help="show clusters and why other ops stay out")
    ins.add_argument("model", metavar="MODEL", help="SavedModel directory")
    ins.add_argument("--until", choices=STAGES, default="cluster",
                     help="last compiler stage to show for each cluster")
    ins.add_argument("--target", choices=("cpu", "cuda"), default="cpu",
                     help="backend whose generated source --until codegen shows")
    ins.add_argument("--show-kernels", action="store_true",
                     help="show the generated source (same as --until codegen)")
    sub.add_parser("bench", add_help=False,
                   help="run the benchmark suite in bench/ (options: disc-tf bench --help)")
    return parser


def _run_bench(argv: list[str]) -> int:
    """``disc-tf bench ...``: the runner in ``bench/`` of a source checkout, with its own options."""
    root = str(pathlib.Path(__file__).resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    try:
        from bench import run
    except ImportError as e:
        print(f"disc-tf: error: bench needs a source checkout with bench/: {e}", file=sys.stderr)
        return 2
    try:
        return run.main(argv)
    except SystemExit as e:  # --help, or a usage error already printed
        return e.code if isinstance(e.code, int) else 2


def main(argv: list[str] | None = None) -> int:
    """Runs ``disc-tf``; returns the exit code (2 for usage errors)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:
        return _run_bench(argv[1:])
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, or a usage error already printed
        return e.code if isinstance(e.code, int) else 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "inspect":
            until = "codegen" if args.show_kernels else args.until
            return inspect_model(args.model, until, target=args.target)
        signatures = [s for s in args.signatures.split(",") if s] if args.signatures else None
        return optimize_model(args.input, args.output, args.target, signatures)
    except UsageError as e:
        print(f"disc-tf: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - one line, not a traceback
        log.debug("disc-tf failed", exc_info=True)
        print(f"disc-tf: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
