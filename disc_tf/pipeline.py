"""One cluster through every stage: DHLO -> shapes -> fusion plan -> C++ (or CUDA) -> .so.

Each stage's output is plain printable data; with ``DISC_TF_DUMP_DIR`` set,
every stage is written to ``<dir>/<cluster>-<hash of the source>/``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import pathlib
import time

from tensorflow.core.framework import graph_pb2

from disc_tf.backends import backend
from disc_tf.cluster.loops import LoopCluster, LoopRefused
from disc_tf.cluster.rewrite import ClusterSpec
from disc_tf.dhlo_bridge.lower import DhloModule, lower_cluster
from disc_tf.fusion.dhlo_reader import read_module
from disc_tf.fusion.plan import FusionPlan
from disc_tf.fusion.planner import plan_fusion
from disc_tf.runtime import compiler, isa
from disc_tf.sources import Sources

log = logging.getLogger("disc_tf")


@dataclasses.dataclass
class CompiledCluster:
    """All stages of one compiled cluster."""

    spec: ClusterSpec
    dhlo: DhloModule
    shapes: str
    plan: FusionPlan
    sources: Sources
    artifact: compiler.Artifact

    @property
    def source(self) -> str:
        """The generated sources as one text."""
        return self.sources.text


@dataclasses.dataclass
class FrontEnd:
    """The target-independent stages of one cluster (no compiler run)."""

    dhlo: DhloModule
    shapes: str
    plan: FusionPlan
    sources: Sources
    #: how long the stages took (the compile profile's front end)
    seconds: float = 0.0

    @property
    def source(self) -> str:
        """The generated sources as one text (device, then host runner for CUDA)."""
        return self.sources.text

    @property
    def num_kernels(self) -> int:
        """Kernels the artifact launches (its plan's)."""
        return self.plan.num_kernels


@dataclasses.dataclass
class LoopFrontEnd:
    """The front ends of a loop cluster's body and condition, and the loop's sources."""

    loop: LoopCluster
    body: FrontEnd
    cond: FrontEnd | None
    sources: Sources
    seconds: float = 0.0

    @property
    def dhlo(self) -> DhloModule:
        """The body's DHLO (the condition's is in the dump)."""
        return self.body.dhlo

    @property
    def plan(self) -> FusionPlan:
        """The body's fusion plan."""
        return self.body.plan

    @property
    def shapes(self) -> str:
        """The shape analyses of body and condition."""
        return self.body.shapes + ("\n" + self.cond.shapes if self.cond else "")

    @property
    def source(self) -> str:
        """The generated sources as one text."""
        return self.sources.text

    @property
    def num_kernels(self) -> int:
        """Kernels of the body and the condition."""
        return self.body.num_kernels + (self.cond.num_kernels if self.cond else 0)


def front_end(spec: ClusterSpec, target: str = "cpu", entry: str | None = None) -> FrontEnd:
    """Lowers, analyses, plans and emits ``spec`` (raises on any failure); a runner
    named ``entry`` is a step of a loop cluster."""
    start = time.perf_counter()
    target_backend = backend(target)
    dhlo = lower_cluster(spec)
    plan, analysis = plan_fusion(read_module(dhlo.text), spec.name, target_backend.plan_options)
    plan.constant_args = frozenset(spec.constant_inputs)
    if plan.speculative is not None:
        plan.speculative.constant_args = plan.constant_args
    named = {"entry": entry} if entry is not None else {}
    sources = target_backend.emit(plan, dhlo.input_names, dhlo.output_names, **named)
    return FrontEnd(dhlo, analysis.describe(), plan, sources, time.perf_counter() - start)


def loop_front_end(loop: LoopCluster, target: str = "cpu") -> LoopFrontEnd:
    """The front ends of ``loop``'s body and condition (raises on any failure), and
    the sources of the loop runner over them."""
    start = time.perf_counter()
    emit_loop = backend(target).emit_loop
    if emit_loop is None:  # the loop stays a TF op, with this reason in the report
        raise LoopRefused(f"the {target} backend has no loop runner")
    body_entry = f"{loop.plan.name}_body"
    body = front_end(loop.body_spec, target, body_entry)
    cond_entry = f"{loop.plan.name}_cond" if loop.cond_spec is not None else None
    cond = front_end(loop.cond_spec, target, cond_entry) if loop.cond_spec is not None else None
    kernels = body.num_kernels + (cond.num_kernels if cond else 0)
    sources = emit_loop(loop.plan, body.sources, body_entry,
                        cond.sources if cond else None, cond_entry, kernels)
    return LoopFrontEnd(loop, body, cond, sources, time.perf_counter() - start)


def _dump(spec: ClusterSpec, fe: FrontEnd | LoopFrontEnd) -> None:
    root = os.environ.get("DISC_TF_DUMP_DIR")
    if not root:
        return
    digest = hashlib.sha256(fe.source.encode()).hexdigest()[:12]
    d = pathlib.Path(root) / f"{spec.name}-{digest}"
    d.mkdir(parents=True, exist_ok=True)
    sub = graph_pb2.GraphDef()
    sub.CopyFrom(spec.subgraph)
    (d / "cluster.pbtxt").write_text(str(sub))
    if isinstance(fe, LoopFrontEnd):  # the loop, then its body and condition as clusters
        (d / "loop_plan.txt").write_text(fe.loop.plan.describe() + "\n")
        (d / "host_runner.cc").write_text(fe.sources.host)
        for step, step_spec in (("body", fe.loop.body_spec), ("cond", fe.loop.cond_spec)):
            step_fe = getattr(fe, step)
            if step_fe is not None:
                _dump_stages(d / step, step_spec, step_fe)
        log.info("dumped loop cluster %s to %s", spec.name, d)
        return
    _dump_stages(d, spec, fe)
    log.info("dumped cluster %s to %s", spec.name, d)


def _dump_stages(d: pathlib.Path, spec: ClusterSpec, fe: FrontEnd) -> None:
    d.mkdir(parents=True, exist_ok=True)
    sub = graph_pb2.GraphDef()
    sub.CopyFrom(spec.subgraph)
    (d / "cluster.pbtxt").write_text(str(sub))
    (d / "dhlo.mlir").write_text(fe.dhlo.text)
    (d / "shapes.txt").write_text(fe.shapes)
    (d / "fusion_plan.txt").write_text(fe.plan.describe())
    if fe.sources.units:  # CPU: each kernel unit as compiled, all of them to read, host runner
        (d / "kernels").mkdir(exist_ok=True)
        for unit in fe.sources.units:
            (d / "kernels" / f"{unit.name}.cc").write_text(unit.text)
        (d / "kernels.cc").write_text(fe.sources.device)
        (d / "host_runner.cc").write_text(fe.sources.host)
    elif fe.sources.host:  # device code for nvcc, host runner for the C++ compiler
        (d / "kernels.cu").write_text(fe.sources.device)
        (d / "host_runner.cc").write_text(fe.sources.host)
    else:
        (d / "kernels.cc").write_text(fe.sources.device)


def compile_cluster(spec: ClusterSpec, target: str = "cpu",
                    levels: tuple[str, ...] = isa.PORTABLE) -> CompiledCluster:
    """Runs every stage on ``spec``; the artifact comes from the cache if present."""
    return build_cluster(spec, front_end(spec, target), target, levels)


def build_cluster(spec: ClusterSpec, fe: FrontEnd | LoopFrontEnd, target: str = "cpu",
                  levels: tuple[str, ...] = isa.PORTABLE) -> CompiledCluster:
    """Builds the artifact of a front end (from the cache if present) with CPU kernels
    for the x86-64 ``levels``, dumping the stages first so that a failing compile can
    be inspected."""
    _dump(spec, fe)
    artifact = backend(target).build(fe.sources, spec.name, fe.num_kernels, levels)
    return CompiledCluster(spec, fe.dhlo, fe.shapes, fe.plan, fe.sources, artifact)
