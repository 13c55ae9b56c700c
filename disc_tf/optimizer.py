"""Graph-level driver: cluster every body, compile each cluster, rewrite.

A body is a GraphDef (TF1 graphs, a tf.function's graph) or a FunctionDef of a
library. A cluster that fails any stage is left as original ops and reported;
optimisation never breaks a graph.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from tensorflow.core.framework import function_pb2, graph_pb2

from disc_tf import pipeline, strict, trust
from disc_tf.cluster import clustering, const_fold, loops, rewrite
from disc_tf.cluster.graph_view import GraphView, producer, view_of_function_def, view_of_graph_def
from disc_tf.dhlo_bridge.rules import LoweringError
from disc_tf.report import (
    LOWERING_REFUSED,
    NON_COMPUTE_OPS,
    OUTSIDE_SCOPE,
    ClusterReport,
    OptimizeReport,
)
from disc_tf.runtime import isa, native

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric import ed25519

log = logging.getLogger("disc_tf")

__all__ = ["NON_COMPUTE_OPS", "ClusterReport", "OptimizeReport", "Options", "BodyOptimizer",
           "carve_clusters"]

FALLBACK_PREFIX = "disc_fallback_"


#: Most nodes of one body a failing lowering may push out of its cluster before the
#: cluster is given up (each costs a new clustering and front end).
MAX_RECARVES = 8


@dataclasses.dataclass
class Options:
    """Knobs of the optimizer."""

    target: str = "cpu"
    min_cluster_size: int = 2
    #: raise StrictModeError instead of leaving a cluster or body as TF ops
    #: (None: ``$DISC_TF_STRICT``)
    strict: bool | None = None
    #: called with each cluster's spec as it starts compiling (the CLI's progress lines)
    progress: Callable[[rewrite.ClusterSpec], None] | None = None
    #: x86-64 levels the CPU kernels are compiled for (``runtime/isa.py``): every level
    #: for an artifact that travels, the host's alone for a JIT compile
    isa_levels: tuple[str, ...] = isa.PORTABLE
    #: signs each artifact besides this user's own signature (``disc_tf/trust.py``)
    signing_key: ed25519.Ed25519PrivateKey | None = None


def carve_clusters(view: GraphView, fetched: frozenset[str], protected: frozenset[str],
                   taken: set[str], min_cluster_size: int, refused: dict[str, str] | None = None
                   ) -> tuple[clustering.ClusteringResult, list[rewrite.ClusterSpec]]:
    """Clusters ``view`` and extracts each cluster under a fresh node name.

    ``taken`` holds the names in use in the body (new names are added to it);
    ``refused`` nodes (a failed lowering, with why) stay out of every cluster.
    """
    result = clustering.find_clusters(view, min_cluster_size=min_cluster_size,
                                      protected=protected, refused=refused)
    names = []
    for k in range(len(result.clusters)):
        name = f"disc_cluster_{k}"
        while name in taken:
            name += "_"
        taken.add(name)
        names.append(name)
    outs = {t.name for nodes in result.clusters for n in nodes if n in protected
            for t in view.nodes[n].outputs}

    def extract(wanted: frozenset[str]) -> list[rewrite.ClusterSpec]:
        return [rewrite.extract_cluster(view, nodes, name, wanted)
                for name, nodes in zip(names, result.clusters)]

    specs = extract(fetched | outs)
    # A shape computation copied into a cluster (Shape(x) -> Reshape) reads x, which
    # may be computed inside another cluster although nothing outside it read x
    # before: that cluster must return x too.
    read = frozenset(t.name for s in specs for t in s.inputs)
    produced = {t.name for s in specs for t in s.outputs}
    members = {n for s in specs for n in s.node_names}
    if any(t not in produced and producer(t) in members for t in read):
        specs = extract(fetched | outs | read)
    return result, specs


class BodyOptimizer:
    """Optimizes bodies against one function library; collects new functions."""

    def __init__(self, library: function_pb2.FunctionDefLibrary, options: Options | None = None,
                 report: OptimizeReport | None = None) -> None:
        self.library = library
        self.options = options or Options()
        self.report = report or OptimizeReport()
        self.new_functions: dict[str, function_pb2.FunctionDef] = {}
        #: body and condition functions of loops compiled whole -> the loop cluster
        self.loop_functions: dict[str, str] = {}
        #: per function, its arguments bound to constants (``saved_model.constant_args``)
        self.constant_args: dict[str, frozenset[str]] = {}

    def loop_front_ends(self, body: str, view: GraphView, fetched: frozenset[str],
                        taken: set[str], refused: dict[str, str],
                        outside: frozenset[str] = frozenset()) -> list:
        """The While loops of ``body`` that compile whole, each with its front end;
        a loop that does not is noted in ``refused`` (node -> why) and stays a TF op."""
        notes = dict.fromkeys(outside, OUTSIDE_SCOPE)
        found = loops.find_loops(view, self.library, fetched, taken, notes)
        refused.update({n: why for n, why in notes.items() if n not in outside})
        done = []
        for loop in found:
            try:
                done.append(pipeline.loop_front_end(loop, self.options.target))
            except Exception as e:  # noqa: BLE001 - the loop stays a TF op, reported
                refused[loop.plan.while_node] = f"loop not compiled whole: {type(e).__name__}: {e}"
                log.info("loop %s of %s stays a TF op: %s", loop.plan.while_node, body, e)
        return done

    def front_ends(self, body: str, view: GraphView, fetched: frozenset[str],
                   protected: frozenset[str], taken: set[str],
                   outside: frozenset[str] = frozenset(),
                   taken_by_loops: dict[str, str] | None = None):
        """Clusters ``body`` and runs every cluster's front end (lowering, planning,
        codegen). A node whose lowering fails is refused and the body clustered
        again without it, so one op costs that op, not its whole cluster. Nodes
        ``outside`` the serving scope stay out of every cluster, and so do the
        nodes ``taken_by_loops`` (node -> why: a loop cluster or a refused loop).

        Returns (clustering result, cluster specs, front end or exception per spec).
        """
        refused: dict[str, str] = {}
        excluded = {**dict.fromkeys(outside, OUTSIDE_SCOPE), **(taken_by_loops or {})}
        for _ in range(MAX_RECARVES + 1):
            names = set(taken)
            result, specs = carve_clusters(view, fetched, protected, names,
                                           self.options.min_cluster_size,
                                           {**excluded, **refused})
            front: list = []
            again = False
            for spec in specs:
                try:
                    front.append(pipeline.front_end(spec, self.options.target))
                except LoweringError as e:
                    # strict mode: a refused op would run as TF, so the cluster fails
                    if not strict.resolve(self.options.strict) and e.node in spec.node_names \
                            and e.node not in refused and len(refused) < MAX_RECARVES:
                        refused[e.node] = f"{LOWERING_REFUSED}: {e}"
                        log.info("%s of %s: node %s refused (%s); clustering again without it",
                                 spec.name, body, e.node, e)
                        again = True
                        break
                    front.append(e)
                except Exception as e:  # noqa: BLE001 - reported per cluster below
                    front.append(e)
            if not again:
                taken |= names
                return result, specs, front
        raise AssertionError("unreachable: the loop returns once nothing more is refused")

    def _compile(self, body: str, view: GraphView, fetched: frozenset[str],
                 protected: frozenset[str], taken: set[str],
                 outside: frozenset[str] = frozenset()):
        loop_refused: dict[str, str] = {}
        loop_fes = self.loop_front_ends(body, view, fetched, taken, loop_refused, outside)
        in_loops = {n: f"in loop cluster {fe.loop.spec.name}" for fe in loop_fes
                    for n in fe.loop.spec.node_names}
        result, specs, front = self.front_ends(body, view, fetched, protected, taken, outside,
                                               {**loop_refused, **in_loops})
        self.report.note_unclustered(
            body, {n: loop_refused.get(n, why) for n, why in result.reasons.items()
                   if n not in outside and n not in in_loops},
            lambda n: view.nodes[n].op)
        replaced = []
        for spec, fe in [(fe.loop.spec, fe) for fe in loop_fes] + list(zip(specs, front)):
            name, nodes = spec.name, spec.node_names
            loop = fe.loop if isinstance(fe, pipeline.LoopFrontEnd) else None
            ops = loop.op_summary() if loop else spec.op_summary()
            rep = ClusterReport(body, name, ops, len(spec.inputs), len(spec.outputs))
            self.report.clusters.append(rep)
            try:
                if isinstance(fe, Exception):
                    raise fe
                if self.options.progress is not None:
                    self.options.progress(spec)
                compiled = pipeline.build_cluster(spec, fe, self.options.target,
                                                  self.options.isa_levels)
                fallback = rewrite.fallback_function(spec)
            except Exception as e:  # noqa: BLE001 - any failure keeps the original ops
                rep.error = f"{type(e).__name__}: {e}"
                if strict.resolve(self.options.strict):
                    raise strict.StrictModeError(
                        f"cluster {name} of {body} ({len(nodes)} ops) failed to compile: "
                        f"{rep.error}") from e
                log.warning("cluster %s of %s left as TF ops: %s", name, body, rep.error)
                for n in nodes:
                    self.report.unclustered[body][n] = f"cluster {name} failed to compile"
                continue
            art = compiled.artifact
            rep.kernels, rep.from_cache = art.num_kernels, art.from_cache
            rep.target = self.options.target
            if compiled.plan.speculative is not None:
                rep.speculative_kernels = len(compiled.plan.speculative.kernels)
            rep.compile_seconds = art.compile_seconds
            rep.front_end_seconds = fe.seconds
            rep.source_bytes = fe.sources.size_bytes
            rep.distinct_kernels = fe.sources.distinct_kernels
            rep.units_compiled, rep.units_cached = art.units_compiled, art.units_cached
            rep.unit_seconds = dict(art.unit_seconds)
            self.new_functions[fallback.signature.name] = fallback
            if loop is not None:
                for f in loop.functions:  # the value-taking body and condition it calls
                    self.new_functions[f.signature.name] = f
                self.loop_functions.update(dict.fromkeys(loop.step_functions, name))
            native.load().py.note_cluster(art.sha256, art.num_kernels)
            attrs = rewrite.CompiledClusterAttrs(
                art.data, art.sha256, art.num_kernels,
                trust.signatures(art.sha256, self.options.signing_key))
            replaced.append((spec, fallback.signature.name, attrs))
        return replaced

    def _not_analysed(self, body: str, error: Exception, nodes) -> None:
        """A body that cannot be analysed stays as it is (StrictModeError if strict);
        the report counts its ``nodes`` (NodeDefs) as not compiled."""
        if strict.resolve(self.options.strict):
            raise strict.StrictModeError(f"body {body} could not be analysed: "
                                         f"{type(error).__name__}: {error}") from error
        log.warning("body %s not analysed (%s); left unchanged", body, error)
        self.report.note_not_analysed(body, f"{type(error).__name__}: {error}", nodes)

    def optimize_graph_def(self, graph_def: graph_pb2.GraphDef, protected: frozenset[str],
                           body: str = "graph", graph=None,
                           outside: frozenset[str] = frozenset(),
                           prune: bool = False) -> graph_pb2.GraphDef:
        """Clusters a flat GraphDef; ``protected`` node names survive; nodes ``outside``
        the serving scope are left as they are. With ``prune`` (the caller fetches
        ``protected`` nodes only), stateless nodes nothing reads are dropped.

        ``graph`` is the live tf.Graph of ``graph_def`` when the caller has it.
        """
        try:
            view = view_of_graph_def(graph_def, self.library, graph)
        except Exception as e:  # noqa: BLE001
            self._not_analysed(body, e, graph_def.node)
            return graph_def
        original = graph_def  # returned as it is if nothing compiles
        graph_def, view = const_fold.fold_graph_def(graph_def, view, protected, body, outside)
        if prune:
            graph_def, view = const_fold.prune_graph_def(graph_def, view, protected | outside)
        view.constant_args = self.constant_args.get(body, frozenset())
        fetched = frozenset(t.name for n in protected if n in view.nodes
                            for t in view.nodes[n].outputs)
        taken = {n.name for n in graph_def.node}
        replaced = self._compile(body, view, fetched, protected, taken, outside)
        if not replaced:
            return original
        nodes = [
            (spec, rewrite.disc_node(spec, [t.name for t in spec.inputs], spec.control_inputs,
                                     fb, attrs))
            for spec, fb, attrs in replaced
        ]
        return rewrite.rewrite_graph_def(graph_def, nodes, protected)

    def optimize_function_def(self, fdef: function_pb2.FunctionDef,
                              protected: frozenset[str] = frozenset()) -> function_pb2.FunctionDef:
        """Clusters the body of a FunctionDef (its signature is unchanged); nodes
        named in ``protected`` keep their names (and every output)."""
        body = fdef.signature.name
        try:
            view, nested_to_flat = view_of_function_def(fdef, self.library)
        except Exception as e:  # noqa: BLE001
            self._not_analysed(body, e, fdef.node_def)
            return fdef
        original = fdef  # returned as it is if nothing compiles
        fdef, view, nested_to_flat = const_fold.fold_function_def(fdef, view, nested_to_flat,
                                                                  protected)
        fdef, view = const_fold.prune_function_def(fdef, view, nested_to_flat, protected)
        view.constant_args = self.constant_args.get(body, frozenset())
        fetched = frozenset(nested_to_flat.get(r, r) for r in fdef.ret.values())
        protected = frozenset(n for n in protected if n in view.nodes)
        taken = {n.name for n in fdef.node_def} | {a.name for a in fdef.signature.input_arg}
        replaced = self._compile(body, view, fetched, protected, taken)
        if not replaced:
            return original
        flat_to_nested: dict[str, str] = {}
        for nd in fdef.node_def:
            for ref in nd.input:
                if not ref.startswith("^"):
                    flat_to_nested.setdefault(nested_to_flat.get(ref, ref), ref)
        nodes = [
            (spec, rewrite.disc_node(spec, [flat_to_nested[t.name] for t in spec.inputs],
                                     spec.control_inputs, fb, attrs))
            for spec, fb, attrs in replaced
        ]
        return rewrite.rewrite_function_def(fdef, nested_to_flat, nodes, protected)

    def optimize_library(self, protected: dict[str, frozenset[str]] | None = None,
                         in_scope: Callable[[str], bool] | None = None
                         ) -> function_pb2.FunctionDefLibrary:
        """A new library: every function ``in_scope`` (default: all) optimized, the
        others copied as they are, fallback functions added.
        ``protected[f]``: nodes of function ``f`` whose names must survive."""
        protected = protected or {}
        result = function_pb2.FunctionDefLibrary()
        result.CopyFrom(self.library)
        del result.function[:]
        done: dict[str, function_pb2.FunctionDef] = {}
        for fdef in loops.loops_first(self.library):  # a loop decides on its body first
            name = fdef.signature.name
            if name.startswith(FALLBACK_PREFIX):
                done[name] = fdef
            elif name in self.loop_functions:  # compiled into its loop's cluster
                self.report.loop_functions[name] = self.loop_functions[name]
                done[name] = fdef
            elif in_scope is not None and not in_scope(name):
                self.report.skipped_functions.append(name)
                done[name] = fdef
            else:
                keep = protected.get(fdef.signature.name, frozenset())
                done[name] = self.optimize_function_def(fdef, keep)
        for fdef in self.library.function:  # in the library's own order
            result.function.add().CopyFrom(done[fdef.signature.name])
        self.add_new_functions(result)
        return result

    def add_new_functions(self, library: function_pb2.FunctionDefLibrary) -> None:
        """Adds the fallback functions made so far to ``library`` (once each)."""
        present = {f.signature.name for f in library.function}
        for name, fdef in self.new_functions.items():
            if name not in present:
                library.function.add().CopyFrom(fdef)
