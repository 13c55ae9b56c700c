"""The backends: one small protocol each target implements, so that nothing above
them branches on the target.

A backend gives the fusion planner its options, emits a typed pair of sources
(``disc_tf.sources.Sources``) from a fusion plan, and builds them into an
artifact (through the cache). ``cpu`` compiles a translation unit per distinct
kernel (through the kernel cache) and the host runner, in parallel, and links them; ``cuda``
builds device code with nvcc and the host runner with the C++ compiler into one
shared object; ``cuda-emu`` builds the same pair for the CPU, the device code
against the CUDA emulator (``runtime/cuda_emu_build.py``), into an artifact the
CPU kernel runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from disc_tf.codegen.cpu import emit_cpu
from disc_tf.codegen.cpu_loop import emit_loop
from disc_tf.codegen.cuda import emit_cuda
from disc_tf.codegen.cuda_loop import emit_cuda_loop
from disc_tf.fusion.plan import FusionPlan
from disc_tf.fusion.planner import PlanOptions
from disc_tf.runtime import cpu_build, cuda_compiler, cuda_emu_build
from disc_tf.runtime.compiler import Artifact
from disc_tf.sources import Sources


@dataclasses.dataclass(frozen=True)
class Backend:
    """A code generator and its compiler, for one target."""

    name: str
    plan_options: PlanOptions
    #: (plan, input names, output names) -> sources
    emit: Callable[[FusionPlan, list[str], list[str]], Sources]
    #: (sources, cluster name, kernel count, x86-64 levels of CPU kernels) -> artifact
    build: Callable[[Sources, str, int, tuple[str, ...]], Artifact]
    #: (loop plan, body sources, body entry, condition sources, condition entry,
    #: kernel count) -> the loop cluster's sources; None: no loop runner (a While
    #: stays a TF op). ``emit`` then takes ``entry=``, the name of a step's runner.
    emit_loop: Callable | None = None


#: Fusions the CUDA backend emits beyond plain loop, stitch, reduce, index and library
#: kernels: concatenations read in place by their consumers' loop kernel.
CUDA_PLAN = dataclasses.replace(PlanOptions.none(), concat_maps=True)

BACKENDS = {
    # the CPU backend has an emitter for every fusion
    "cpu": Backend("cpu", PlanOptions(), emit_cpu, cpu_build.build, emit_loop),
    "cuda": Backend("cuda", CUDA_PLAN, emit_cuda, cuda_compiler.build, emit_cuda_loop),
    # the CUDA backend's sources built against the CPU emulation of the GPU (tests)
    "cuda-emu": Backend("cuda-emu", CUDA_PLAN, emit_cuda, cuda_emu_build.build, emit_cuda_loop),
}


def backend(target: str) -> Backend:
    """The backend of ``target``; ValueError naming the targets for any other."""
    if target not in BACKENDS:
        raise ValueError(f"target {target!r} has no code generator; use one of {sorted(BACKENDS)}")
    return BACKENDS[target]
