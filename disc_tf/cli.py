"""The ``disc-tf`` command line.

``disc-tf optimize IN OUT`` compiles the clusters serving runs ahead of time and
prints the report; ``disc-tf inspect MODEL`` shows, without building C++, what
would be clustered and whether each cluster lowers, why every other op stays
out, the compiled clusters of an optimized model, and (with ``--until``) each
compiler stage of every cluster: DHLO, shape classes and fusion plan, generated
source.
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

from tensorflow.core.framework import function_pb2
from tensorflow.core.protobuf import saved_model_pb2

from disc_tf import pipeline, scope
from disc_tf.cluster import clustering, const_fold, loops, rewrite
from disc_tf.cluster.graph_view import (
    GraphView,
    TensorInfo,
    view_of_function_def,
    view_of_graph_def,
)
from disc_tf.optimizer import FALLBACK_PREFIX, BodyOptimizer, Options, carve_clusters
from disc_tf.report import NON_COMPUTE_OPS, OUTSIDE_SCOPE, ClusterReport, OptimizeReport
from disc_tf.runtime import isa
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
    library: function_pb2.FunctionDefLibrary
    fetched: frozenset[str] = frozenset()  # flat tensor names read from outside
    protected: frozenset[str] = frozenset()  # node names that must survive
    outside: frozenset[str] = frozenset()  # nodes serving never runs (main graph)
    error: str | None = None  # why the body could not be analysed
    report_name: str = ""  # the body's name in an OptimizeReport
    node_defs: tuple = ()  # the NodeDefs of a body that could not be analysed


def _load_saved_model(path: str) -> saved_model_pb2.SavedModel:
    model_dir = pathlib.Path(path)
    if not model_dir.is_dir() or not (model_dir / "saved_model.pb").is_file():
        raise UsageError(f"{path} is not a SavedModel directory (no saved_model.pb inside)")
    sm = saved_model_pb2.SavedModel()
    sm.ParseFromString((model_dir / "saved_model.pb").read_bytes())
    return sm


def iter_bodies(sm: saved_model_pb2.SavedModel, signatures: list[str] | None = None,
                all_functions: bool = False, skip: set[str] | None = None) -> Iterator[Body]:
    """Every body the optimizer would cluster, in the optimizer's order: the
    functions serving runs (all with ``all_functions``; a function with a While
    before the loop's body and condition), then each main graph. Functions named in
    ``skip`` when their turn comes (compiled into a loop cluster) are left out."""
    for meta_graph in sm.meta_graphs:
        library = meta_graph.graph_def.library
        served = scope.serving_scope(meta_graph, signatures, all_functions)
        for fdef in loops.loops_first(library):
            name = fdef.signature.name
            if name.startswith(FALLBACK_PREFIX) or not served.has_function(name) \
                    or name in (skip or ()):
                continue
            try:
                view, nested_to_flat = view_of_function_def(fdef, library)
            except Exception as e:  # noqa: BLE001 - reported, not fatal
                yield Body(name, "function", None, library, error=f"{type(e).__name__}: {e}",
                           report_name=name, node_defs=tuple(fdef.node_def))
                continue
            folded, view, nested_to_flat = const_fold.fold_function_def(fdef, view,
                                                                        nested_to_flat)
            _, view = const_fold.prune_function_def(folded, view, nested_to_flat)
            fetched = frozenset(nested_to_flat.get(r, r) for r in fdef.ret.values())
            yield Body(name, "function", view, library, fetched, report_name=name)
        tags = ",".join(meta_graph.meta_info_def.tags) or "untagged"
        name = f"main_graph[{tags}]"
        try:
            view = view_of_graph_def(meta_graph.graph_def, library)
        except Exception as e:  # noqa: BLE001
            yield Body(name, "graph", None, library, error=f"{type(e).__name__}: {e}",
                       report_name="main_graph", node_defs=tuple(meta_graph.graph_def.node))
            continue
        protected = referenced_nodes(meta_graph)
        outside = served.outside(view.nodes)
        _, view = const_fold.fold_graph_def(meta_graph.graph_def, view, protected, name, outside)
        fetched = frozenset(t.name for n in protected if n in view.nodes
                            for t in view.nodes[n].outputs)
        yield Body(name, "graph", view, library, fetched, protected, outside, None, "main_graph")


def cluster_body(body: Body) -> tuple[clustering.ClusteringResult, list[rewrite.ClusterSpec]]:
    """Clusters ``body`` as the optimizer does and extracts each cluster."""
    assert body.view is not None
    refused = dict.fromkeys(body.outside, OUTSIDE_SCOPE)
    return carve_clusters(body.view, body.fetched, body.protected, set(body.view.nodes),
                          MIN_CLUSTER_SIZE, refused)


# --------------------------------------------------------------------------
# inspect
# --------------------------------------------------------------------------


def _tensor(t: TensorInfo) -> str:
    dims = "<unknown rank>" if t.dims is None else ",".join(
        "?" if d is None else str(d) for d in t.dims)
    return f"{t.name} {t.dtype.name}[{dims}]"


def _ratio(done: int, total: int, label: str) -> str:
    pct = f"{100.0 * done / total:.1f}%" if total else "n/a"
    return f"{label}: {done}/{total} ({pct})"


def _stage_text(title: str, text: str) -> list[str]:
    return [f"    -- {title} --", textwrap.indent(text.rstrip("\n"), "      ")]


def describe_cluster(spec: rewrite.ClusterSpec, until: str, target: str = "cpu",
                     fe: pipeline.FrontEnd | Exception | None = None) -> list[str]:
    """The lines ``inspect`` prints for one cluster, up to stage ``until``, with the
    source generated for ``target``; ``fe``: its front end if already run."""
    ops = spec.op_summary()
    lines = [f"  cluster {spec.name}: {len(ops)} ops"]
    lines.extend(f"    op {name} ({op})" for name, op in ops)
    lines.extend(f"    input data {_tensor(t)}" for t in spec.inputs)
    lines.extend(f"    input control ^{c}" for c in spec.control_inputs)
    lines.extend(f"    output {_tensor(t)}" for t in spec.outputs)
    level = STAGES.index(until)
    if fe is None and level > 0:
        try:
            fe = pipeline.front_end(spec, target)
        except Exception as e:  # noqa: BLE001 - shown instead of the stages
            fe = e
    if isinstance(fe, Exception):
        return lines + [f"    front end refused: {type(fe).__name__}: {fe}"]
    if fe is None:
        return lines
    lines.append(f"    front end: ok ({fe.plan.num_kernels} kernels, "
                 f"{fe.sources.distinct_kernels} distinct, {fe.sources.size_bytes} bytes)")
    if level >= 1:
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


def compiled_clusters(body: Body) -> list[ClusterReport]:
    """The body's DiscCluster nodes (an optimized model), with their original ops."""
    assert body.view is not None
    fdefs = {f.signature.name: f for f in body.library.function}
    found = []
    for name in body.view.order:
        node = body.view.nodes[name].node_def
        if node.op != rewrite.DISC_OP:
            continue
        # Its original ops: the fallback's, and those of the functions they call (a
        # loop cluster's body and condition, compiled into it).
        ops, todo, seen = [], [node.attr["fallback"].func.name], set()
        while todo:
            fdef = fdefs.get(todo.pop())
            if fdef is None or fdef.signature.name in seen:
                continue
            seen.add(fdef.signature.name)
            ops += [(n.name, n.op) for n in fdef.node_def]
            todo += sorted(scope.called_functions(fdef.node_def, set(fdefs)))
        found.append(ClusterReport(body.report_name, name, ops, len(node.input),
                                   len(node.attr["Tout"].list.type),
                                   kernels=node.attr["num_kernels"].i, from_cache=True))
    return found


def inspect_body(body: Body, until: str, target: str, lower: bool,
                 report: OptimizeReport, in_loops: set[str] | None = None) -> list[str]:
    """The lines of one body; its clusters and unclustered ops go into ``report``; the
    body and condition functions of its loops that compile whole go into ``in_loops``."""
    if body.view is None:
        report.note_not_analysed(body.report_name, body.error or "", body.node_defs)
        return [f"body {body.name} ({body.kind}): not analysed: {body.error}"]
    view = body.view
    if all(nd.op in NON_COMPUTE_OPS for n, nd in view.nodes.items() if n not in body.outside):
        return [f"body {body.name} ({body.kind}): no compute ops"]
    loop_refused: dict[str, str] = {}
    loop_fes: list[pipeline.LoopFrontEnd] = []
    if lower:
        optimizer = BodyOptimizer(body.library, Options(target=target, strict=False))
        taken = set(view.nodes)
        loop_fes = optimizer.loop_front_ends(body.report_name, view, body.fetched, taken,
                                             loop_refused, body.outside)
        looped = {n: fe.loop.spec.name for fe in loop_fes for n in fe.loop.spec.node_names}
        result, specs, front = optimizer.front_ends(
            body.report_name, view, body.fetched, body.protected, taken, body.outside,
            {**loop_refused, **looped})
    else:
        looped = {}
        result, specs = cluster_body(body)
        front = [None] * len(specs)
    existing = compiled_clusters(body)
    report.clusters.extend(existing)
    done_before = {c.name for c in existing}
    reasons = {n: loop_refused.get(n, why) for n, why in result.reasons.items()
               if n not in body.outside and n not in done_before and n not in looped}
    report.note_unclustered(body.report_name, reasons, lambda n: view.nodes[n].op)
    lines = [f"body {body.name} ({body.kind}): {len(view.nodes)} nodes, "
             f"{len(existing)} compiled cluster(s), {len(specs)} new cluster(s)"]
    lines += [f"  compiled cluster {c.name}: {c.compute_ops} compute ops, {c.kernels} kernels"
              for c in existing]
    for fe in loop_fes:
        loop = fe.loop
        rep = ClusterReport(body.report_name, loop.spec.name, loop.op_summary(),
                            len(loop.spec.inputs), len(loop.spec.outputs),
                            kernels=fe.num_kernels)
        report.clusters.append(rep)
        lines.append(f"  loop cluster {rep.name}: While {loop.plan.while_node}, body and "
                     f"condition compiled, {rep.compute_ops} compute ops, {rep.kernels} kernels")
        if in_loops is not None:
            in_loops.update(loop.step_functions)
    for spec, fe in zip(specs, front):
        rep = ClusterReport(body.report_name, spec.name, spec.op_summary(), len(spec.inputs),
                            len(spec.outputs))
        if isinstance(fe, Exception):
            rep.error = f"{type(fe).__name__}: {fe}"
        elif fe is not None:
            rep.kernels = fe.plan.num_kernels
        report.clusters.append(rep)
        lines += describe_cluster(spec, until, target, fe)
    unclustered = describe_unclustered(view, reasons)
    if unclustered:
        lines += ["  unclustered:"] + unclustered
    done, total = report.compiled_share({body.report_name})
    label = "compiled compute ops" if lower else "clustered compute ops (not yet lowered)"
    lines.append(f"  {_ratio(done, total, label)}")
    return lines


def inspect_model(path: str, until: str = "cluster", out: TextIO | None = None,
                  target: str = "cpu", lower: bool = True, all_functions: bool = False,
                  signatures: list[str] | None = None) -> int:
    """Prints the clusters and unclustered ops of every body serving runs (every
    body with ``all_functions``), then the total line ``optimize`` would print.

    With ``lower``, each new cluster runs the compiler's front end (lowering,
    fusion plan, codegen; no C++ build), so a cluster counts as compiled only
    where it would compile; DiscCluster nodes of an optimized model count as
    compiled."""
    out = out or sys.stdout
    sm = _load_saved_model(path)
    report = OptimizeReport(serving_bodies=None if all_functions else set())
    try:
        for meta_graph in sm.meta_graphs:  # a signature the model lacks: a usage error
            scope.serving_scope(meta_graph, signatures, all_functions)
    except ValueError as e:
        raise UsageError(str(e)) from e
    in_loops: set[str] = set()
    for body in iter_bodies(sm, signatures, all_functions, skip=in_loops):
        if report.serving_bodies is not None:
            report.serving_bodies.add(body.report_name)
        print("\n".join(inspect_body(body, until, target, lower, report, in_loops)), file=out)
    which = "all functions" if all_functions else "serving path"
    if not lower:  # clusters count as compiled: nothing was lowered
        done, total = report.serving_share()
        print(_ratio(done, total, f"{which}: clustered compute ops (not yet lowered)"), file=out)
        return 0
    for line in report.summary().splitlines():
        print(f"{which}: {line}", file=out)
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
            lines.append(f"{head}  {c.profile()}")
    return lines


def optimize_model(src: str, dst: str, target: str, signatures: list[str] | None,
                   out: TextIO | None = None, err: TextIO | None = None,
                   all_functions: bool = False, strict: bool | None = None,
                   isa_levels: str | list[str] | None = None,
                   signing_key: str | None = None, serving_warmup: bool = False) -> int:
    """Optimizes a SavedModel and prints what happened to every cluster, then the
    report's summary (refused clusters and nodes, the total line)."""
    out, err = out or sys.stdout, err or sys.stderr
    sm = _load_saved_model(src)
    try:
        bodies = [b for b in iter_bodies(sm, signatures, all_functions) if b.view is not None]
    except ValueError as e:  # a signature the model lacks
        raise UsageError(str(e)) from e
    try:
        levels = isa.resolve(isa_levels, "portable")
    except ValueError as e:
        raise UsageError(str(e)) from e
    total = sum(len(cluster_body(b)[1]) for b in bodies)
    print(f"{total} cluster(s) to compile", file=err, flush=True)
    report = optimize_saved_model(src, dst, target=target, signatures=signatures,
                                  all_functions=all_functions, strict=strict,
                                  progress=_progress(total, err), isa_levels=levels,
                                  signing_key=signing_key, serving_warmup=serving_warmup)
    for line in summary_lines(report):
        print(line, file=out)
    print(report.summary(), file=out)
    print(report.profile_line(), file=out)
    print(f"optimized {src} -> {dst}", file=out)
    return 0


# --------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="disc-tf", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True)
    opt = sub.add_parser("optimize", help="compile the clusters serving runs")
    opt.add_argument("input", metavar="IN", help="SavedModel directory")
    opt.add_argument("output", metavar="OUT", help="where the optimized SavedModel goes")
    opt.add_argument("--target", choices=("auto", "cpu", "cuda", "cuda-emu"), default="auto",
                     help="cuda needs nvcc, not a GPU; auto picks cuda only where it can run")
    opt.add_argument("--signatures", default=None,
                     help="comma-separated signature names (default: every serving "
                          "signature and the root object's functions)")
    opt.add_argument("--all-functions", action="store_true",
                     help="compile every function, not only what serving runs")
    opt.add_argument("--strict", action="store_true",
                     help="fail on any cluster that does not compile")
    opt.add_argument("--isa", default=None,
                     help="x86-64 levels of the CPU kernels: portable (default: AVX-512, AVX2 "
                          "and baseline clones), host, or comma-separated levels among "
                          "x86-64-v4, x86-64-v3, x86-64"),
    opt.add_argument("--signing-key", default=None, metavar="PEM",
                     help="Ed25519 private key that signs every artifact (disc-tf keygen), "
                          "for hosts that trust its public key")
    opt.add_argument("--serving-warmup", action="store_true",
                     help="also write TF Serving's warm-up requests "
                          "(assets.extra/tf_serving_warmup_requests)")
    key = sub.add_parser("keygen", help="write a new Ed25519 key pair for signing artifacts")
    key.add_argument("private", metavar="PRIVATE.pem", help="the signing key (written 0600)")
    key.add_argument("public", metavar="PUBLIC.pem",
                     help="the public key hosts list in DISC_TF_TRUSTED_KEYS")
    ins = sub.add_parser("inspect", help="show clusters and why other ops stay out")
    ins.add_argument("model", metavar="MODEL", help="SavedModel directory")
    ins.add_argument("--until", choices=STAGES, default="cluster",
                     help="last compiler stage to show for each cluster")
    ins.add_argument("--target", choices=("cpu", "cuda", "cuda-emu"), default="cpu",
                     help="backend whose generated source --until codegen shows")
    ins.add_argument("--show-kernels", action="store_true",
                     help="show the generated source (same as --until codegen)")
    ins.add_argument("--no-lower", action="store_true",
                     help="stop at clustering (fast): clusters are not checked to compile")
    ins.add_argument("--all-functions", action="store_true",
                     help="every function, not only what serving runs (checkpoint "
                          "save/restore included)")
    ins.add_argument("--signatures", default=None,
                     help="comma-separated signature names (default: every serving "
                          "signature and the root object's functions)")
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
        if args.command == "keygen":
            from disc_tf import trust

            print(f"key {trust.generate_key(args.private, args.public)}: private {args.private}, "
                  f"public {args.public}")
            return 0
        signatures = [s for s in args.signatures.split(",") if s] if args.signatures else None
        if args.command == "inspect":
            until = "codegen" if args.show_kernels else args.until
            if args.no_lower and until != "cluster":
                raise UsageError("--no-lower shows no stage after clustering")
            return inspect_model(args.model, until, target=args.target,
                                 lower=not args.no_lower, all_functions=args.all_functions,
                                 signatures=signatures)
        return optimize_model(args.input, args.output, args.target, signatures,
                              all_functions=args.all_functions, strict=args.strict or None,
                              isa_levels=args.isa.split(",") if args.isa and "," in args.isa
                              else args.isa, signing_key=args.signing_key,
                              serving_warmup=args.serving_warmup)
    except UsageError as e:
        print(f"disc-tf: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - one line, not a traceback
        log.debug("disc-tf failed", exc_info=True)
        print(f"disc-tf: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
