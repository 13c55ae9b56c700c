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

from tensorflow.core.framework import graph_pb2

from disc_tf.cluster.rewrite import ClusterSpec
from disc_tf.codegen.cpu import emit_cpu
from disc_tf.codegen.cuda import HOST_MARKER, emit_cuda, split_source
from disc_tf.dhlo_bridge.lower import DhloModule, lower_cluster
from disc_tf.fusion.dhlo_reader import read_module
from disc_tf.fusion.plan import FusionPlan
from disc_tf.fusion.planner import PlanOptions, plan_fusion
from disc_tf.runtime import compiler, cuda_compiler

log = logging.getLogger("disc_tf")


@dataclasses.dataclass
class CompiledCluster:
    """All stages of one compiled cluster."""

    spec: ClusterSpec
    dhlo: DhloModule
    shapes: str
    plan: FusionPlan
    source: str
    artifact: compiler.Artifact


@dataclasses.dataclass
class FrontEnd:
    """The target-independent stages of one cluster (no compiler run)."""

    dhlo: DhloModule
    shapes: str
    plan: FusionPlan
    source: str


def front_end(spec: ClusterSpec, target: str = "cpu") -> FrontEnd:
    """Lowers, analyses, plans and emits ``spec`` (raises on any failure)."""
    if target not in ("cpu", "cuda"):
        raise ValueError(f"target {target!r} has no code generator; use 'cpu' or 'cuda'")
    dhlo = lower_cluster(spec)
    plan, analysis = plan_fusion(read_module(dhlo.text), spec.name,
                                 PlanOptions.for_target(target))
    emit = emit_cuda if target == "cuda" else emit_cpu
    source = emit(plan, dhlo.input_names, dhlo.output_names)
    return FrontEnd(dhlo, analysis.describe(), plan, source)


def _dump(spec: ClusterSpec, fe: FrontEnd) -> None:
    root = os.environ.get("DISC_TF_DUMP_DIR")
    if not root:
        return
    digest = hashlib.sha256(fe.source.encode()).hexdigest()[:12]
    d = pathlib.Path(root) / f"{spec.name}-{digest}"
    d.mkdir(parents=True, exist_ok=True)
    sub = graph_pb2.GraphDef()
    sub.CopyFrom(spec.subgraph)
    (d / "cluster.pbtxt").write_text(str(sub))
    (d / "dhlo.mlir").write_text(fe.dhlo.text)
    (d / "shapes.txt").write_text(fe.shapes)
    (d / "fusion_plan.txt").write_text(fe.plan.describe())
    if HOST_MARKER in fe.source:  # CUDA: device code for nvcc, host runner for the C++ compiler
        device, host = split_source(fe.source)
        (d / "kernels.cu").write_text(device)
        (d / "host_runner.cc").write_text(host)
    else:
        (d / "kernels.cc").write_text(fe.source)
    log.info("dumped cluster %s to %s", spec.name, d)


def compile_cluster(spec: ClusterSpec, target: str = "cpu") -> CompiledCluster:
    """Runs every stage on ``spec``; the artifact comes from the cache if present."""
    fe = front_end(spec, target)
    _dump(spec, fe)  # before compiling, so a failing compile can be inspected
    if target == "cuda":
        artifact = cuda_compiler.build(fe.source, spec.name, fe.plan.num_kernels)
    else:
        artifact = compiler.build(fe.source, spec.name, fe.plan.num_kernels, target)
    return CompiledCluster(spec, fe.dhlo, fe.shapes, fe.plan, fe.source, artifact)
