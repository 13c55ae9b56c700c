"""What an optimization did, cluster by cluster: the report users read.

``optimize`` fills an :class:`OptimizeReport`, prints its :meth:`summary
<OptimizeReport.summary>`, stores it in the model (``assets.extra/disc/report.json``)
and keeps it for ``disc_tf.last_report()``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

#: Ops that move, name or hold data rather than compute: left out of coverage ratios.
NON_COMPUTE_OPS = frozenset(
    {"Placeholder", "Const", "Identity", "NoOp", "_Arg", "_Retval", "ReadVariableOp",
     "VarHandleOp", "StatefulPartitionedCall", "PartitionedCall"}
)

#: Reason given to main-graph nodes outside the serving scope.
OUTSIDE_SCOPE = "not on the serving path"
#: How the reason of a node a lowering pushed out of its cluster starts.
LOWERING_REFUSED = "lowering refused"

#: Longest error text a summary line shows.
MAX_REASON_CHARS = 200


@dataclasses.dataclass
class ClusterReport:
    """What happened to one cluster."""

    body: str
    name: str
    ops: list[tuple[str, str]]
    num_inputs: int
    num_outputs: int
    kernels: int = 0
    #: kernels of the speculative (nothing-broadcast) plan, if it has one
    speculative_kernels: int | None = None
    from_cache: bool = False
    compile_seconds: float = 0.0
    error: str | None = None
    #: the backend its artifact was built for ("cpu", "cuda", "cuda-emu"); empty if none
    target: str = ""
    #: the compile profile: seconds of lowering, planning and codegen; bytes of
    #: generated code; kernels that differ other than in names (see Sources)
    front_end_seconds: float = 0.0
    source_bytes: int = 0
    distinct_kernels: int = 0
    #: kernel units (translation units of distinct kernels) compiled, and reused from
    #: the kernel cache (a kernel another cluster or model compiled)
    units_compiled: int = 0
    units_cached: int = 0
    #: compiler seconds of each translation unit compiled (kernel units, host runner)
    unit_seconds: dict[str, float] = dataclasses.field(default_factory=dict)

    def profile(self) -> str:
        """``front end 0.12s, C++ 3.40s (4 units compiled, 1 cached; slowest stitch_…
        0.80s) (or cache), 41 KiB, 12 kernels (5 distinct)``."""
        cxx = "cache" if self.from_cache else f"C++ {self.compile_seconds:.2f}s"
        if not self.from_cache and self.units_compiled + self.units_cached:
            cxx += f" ({self.units_compiled} units compiled, {self.units_cached} cached"
            if self.unit_seconds:
                slowest = max(self.unit_seconds, key=self.unit_seconds.__getitem__)
                cxx += f"; slowest {slowest} {self.unit_seconds[slowest]:.2f}s"
            cxx += ")"
        return (f"front end {self.front_end_seconds:.2f}s, {cxx}, "
                f"{self.source_bytes / 1024:.0f} KiB, {self.kernels} kernels "
                f"({self.distinct_kernels} distinct)")

    @property
    def compute_ops(self) -> int:
        """Ops of the cluster that compute (see NON_COMPUTE_OPS)."""
        return sum(op not in NON_COMPUTE_OPS for _, op in self.ops)


def _short(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= MAX_REASON_CHARS else line[:MAX_REASON_CHARS - 3] + "..."


@dataclasses.dataclass
class OptimizeReport:
    """Clusters built, the reason each other node stayed out, and the scope compiled."""

    clusters: list[ClusterReport] = dataclasses.field(default_factory=list)
    #: body -> unclustered node -> why
    unclustered: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    #: body -> unclustered node -> its op type
    unclustered_ops: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    #: bodies serving runs (None: every body counts)
    serving_bodies: set[str] | None = None
    #: library functions left as they are because serving never calls them
    skipped_functions: list[str] = dataclasses.field(default_factory=list)
    #: body and condition functions compiled into a loop cluster -> that cluster (their
    #: ops count in its ``ops``; the functions stay, as its fallback calls them)
    loop_functions: dict[str, str] = dataclasses.field(default_factory=dict)
    #: bodies that could not be analysed (left as they are) -> why
    not_analysed: dict[str, str] = dataclasses.field(default_factory=dict)
    #: what defined the serving scope, e.g. "signature serving_default", "function serve"
    entries: list[str] = dataclasses.field(default_factory=list)
    #: signatures given a TF Serving warm-up request (``disc_tf/serving_warmup.py``)
    serving_warmup: list[str] = dataclasses.field(default_factory=list)

    @property
    def compiled(self) -> list[ClusterReport]:
        """Clusters that became DiscCluster nodes."""
        return [c for c in self.clusters if c.error is None]

    @property
    def refused(self) -> list[ClusterReport]:
        """Clusters left as TF ops because a stage failed."""
        return [c for c in self.clusters if c.error is not None]

    def refused_nodes(self) -> list[tuple[str, str, str, str]]:
        """(body, node, op, why) of nodes a lowering pushed out of their cluster."""
        return [(body, node, self.unclustered_ops.get(body, {}).get(node, "?"), why)
                for body, reasons in self.unclustered.items()
                for node, why in reasons.items() if why.startswith(LOWERING_REFUSED)]

    def note_unclustered(self, body: str, reasons: dict[str, str],
                         op_of: Callable[[str], str]) -> None:
        """Records why each node of ``body`` in ``reasons`` stayed out, with its op type."""
        self.unclustered[body] = reasons
        self.unclustered_ops[body] = {n: op_of(n) for n in reasons}

    def note_not_analysed(self, body: str, why: str, nodes: Iterable) -> None:
        """Records a body left as it is; its ``nodes`` (NodeDefs) count as not compiled."""
        nodes = list(nodes)
        self.not_analysed[body] = why
        self.note_unclustered(body, {n.name: "body not analysed" for n in nodes},
                              {n.name: n.op for n in nodes}.__getitem__)

    def compiled_share(self, bodies: set[str] | None = None) -> tuple[int, int]:
        """(compute ops inside compiled clusters, all compute ops) of ``bodies``
        (every body if None); a cluster that failed counts as not compiled."""
        def inside(body: str) -> bool:
            return bodies is None or body in bodies

        done = sum(c.compute_ops for c in self.compiled if inside(c.body))
        left = sum(c.compute_ops for c in self.refused if inside(c.body))
        left += sum(op not in NON_COMPUTE_OPS for body, ops in self.unclustered_ops.items()
                    if inside(body) for op in ops.values())
        return done, done + left

    def serving_share(self) -> tuple[int, int]:
        """:meth:`compiled_share` of the bodies serving runs."""
        return self.compiled_share(self.serving_bodies)

    def total_line(self) -> str:
        """``N of M clusters compiled, P% of serving compute ops``."""
        done, total = self.serving_share()
        pct = f"{100.0 * done / total:.1f}%" if total else "n/a"
        return (f"{len(self.compiled)} of {len(self.clusters)} clusters compiled, "
                f"{pct} of serving compute ops ({done} of {total})")

    def profile_line(self) -> str:
        """The compile profile of the compiled clusters, summed."""
        done = self.compiled
        front = sum(c.front_end_seconds for c in done)
        cxx = sum(c.compile_seconds for c in done if not c.from_cache)
        cached = sum(c.from_cache for c in done)
        built = [c for c in done if not c.from_cache]
        units = (f"; kernel units: {sum(c.units_compiled for c in built)} compiled, "
                 f"{sum(c.units_cached for c in built)} from the kernel cache"
                 if built else "")
        return (f"compile profile: front end {front:.2f}s, C++ {cxx:.2f}s "
                f"({cached} of {len(done)} clusters from the cache{units}), "
                f"{sum(c.source_bytes for c in done) / 1024:.0f} KiB of code, "
                f"{sum(c.kernels for c in done)} kernels "
                f"({sum(c.distinct_kernels for c in done)} distinct within their clusters)")

    def summary(self) -> str:
        """A short text: one line per refused cluster or node, then the total line."""
        lines = [f"refused cluster {c.name} of {c.body} ({c.compute_ops} compute ops): "
                 f"{_short(c.error or '')}" for c in self.refused]
        lines += [f"refused node {node} ({op}) of {body}: {_short(why)}"
                  for body, node, op, why in self.refused_nodes()]
        lines += [f"body {body} not analysed, left as TF ops: {_short(why)}"
                  for body, why in self.not_analysed.items()]
        if self.skipped_functions:
            lines.append(f"{len(self.skipped_functions)} function(s) outside the serving path "
                         "left as they are")
        lines.append(self.total_line())
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data (``assets.extra/disc/report.json``)."""
        done, total = self.serving_share()
        return {
            "summary": self.total_line(),
            "profile": self.profile_line(),
            "clusters_compiled": len(self.compiled),
            "clusters": [dataclasses.asdict(c) for c in self.clusters],
            "serving_compute_ops": {"compiled": done, "total": total},
            "refused_nodes": [dict(zip(("body", "node", "op", "why"), r))
                              for r in self.refused_nodes()],
            "serving_bodies": sorted(self.serving_bodies) if self.serving_bodies is not None
            else None,
            "skipped_functions": self.skipped_functions,
            "loop_functions": self.loop_functions,
            "not_analysed": self.not_analysed,
            "entries": self.entries,
            "serving_warmup": self.serving_warmup,
        }
