"""disc_tf: a dynamic-shape compiler for TensorFlow.

Clusters of TF ops are compiled once, with every dimension symbolic, into
fused kernels and a generated host runner, and run at any input shape.
"""

from __future__ import annotations

import sys

from disc_tf.direct_call import DiscModel, load
from disc_tf.enable import enable
from disc_tf.jit import JitFunction, jit
from disc_tf.report import OptimizeReport
from disc_tf.runtime import native as _native
from disc_tf.saved_model import last_report
from disc_tf.saved_model import optimize_saved_model as _optimize_saved_model
from disc_tf.strict import StrictModeError

__all__ = ["optimize", "last_report", "OptimizeReport", "load", "DiscModel", "enable", "jit",
           "JitFunction", "stats", "reset_stats", "StrictModeError"]
__version__ = "0.1.0"

# Registers the DiscCluster op, so optimized models load. Never builds: missing
# libraries raise one error naming the build command, except while that command
# (`python -m disc_tf.runtime.native_build`) imports this package to run.
_BUILD_COMMAND = ["-m", "disc_tf.runtime.native_build"]
if not any(sys.orig_argv[i:i + 2] == _BUILD_COMMAND for i in range(len(sys.orig_argv))):
    _native.load()


def optimize(saved_model_dir: str, output_dir: str, *, target: str = "auto",
             signatures=None, all_functions: bool = False, strict: bool | None = None,
             quiet: bool = False, isa=None, signing_key=None,
             serving_warmup: bool = False) -> str:
    """Optimizes a SavedModel ahead of time; returns ``output_dir``.

    Compiles what serving runs: the functions reachable from ``signatures``
    (names; default every serving signature and the root object's tf.functions),
    or every function with ``all_functions``. Every cluster's compiled artifact is
    stored inside the output model, which loads anywhere after ``import disc_tf``.
    With ``strict`` (default ``$DISC_TF_STRICT``), a cluster that fails to compile
    raises StrictModeError. The report (per cluster: ops, kernels, compiled or
    refused and why, compile time) is printed to stderr unless ``quiet``, stored
    in ``assets.extra/disc/report.json`` and returned by :func:`last_report`.
    ``isa``: the x86-64 levels CPU kernels are compiled for: "portable" (default,
    unless ``$DISC_TF_ISA`` says otherwise: AVX-512, AVX2 and baseline clones, the
    best chosen where the model runs), "host" (this machine's alone), or a list of
    "x86-64-v4", "x86-64-v3", "x86-64" (the fleet's).
    ``signing_key``: an Ed25519 private key (or its PEM file, see ``disc-tf keygen``)
    that signs every artifact. A host loads an embedded artifact only if signed by a
    key it trusts (``$DISC_TF_TRUSTED_KEYS``) or by its own user; otherwise it
    compiles the cluster itself (``docs/serving.md``).
    ``serving_warmup``: also write TF Serving's warm-up requests
    (``assets.extra/tf_serving_warmup_requests``: one per stateless signature, on the
    ones ``disc_tf.load``'s warm-up call uses) unless the model has its own, so that the
    server packs the GEMM weights at load, not on the first requests. Off by default:
    checking each request runs the original model once (about 0.6 s of optimize).
    """
    report = _optimize_saved_model(saved_model_dir, output_dir, target=target,
                                   signatures=signatures, all_functions=all_functions,
                                   strict=strict, isa_levels=isa, signing_key=signing_key,
                                   serving_warmup=serving_warmup)
    if not quiet:
        print("\n".join(f"disc_tf.optimize: {line}" for line in report.summary().splitlines()),
              file=sys.stderr)
    return str(output_dir)


def stats() -> dict[str, int]:
    """Counters of this process since the last reset: clusters, compilations,
    cache_hits, fallbacks, kernels, peak_temp_bytes (the most temporary
    memory one cluster call held), packed_weights (GEMM weight operands
    packed once and kept for later calls), untrusted (embedded artifacts not
    loaded for want of a trusted signature), rebuilds (clusters compiled
    again on this host instead; see ``docs/serving.md``), pool_wakes (sleeping
    GEMM worker threads a call woke as it started, so that they were polling by its
    first launch; only calls as large as one that gave them tasks wake them),
    resident_weight_gemms (GEMM launches of calls whose packed
    weights fit in half of a core's L2, so that they read them without prefetching)
    masked_elements (attention scores not computed because the mask's select
    discards them: a causal or padding mask), temp_reuses (temporary buffers of at most
    64 KiB a call took from those its kernel kept, instead of allocating them),
    temp_kept_bytes (the bytes of such buffers all kernels keep now: a level, which
    ``reset_stats`` leaves as it is; bounded by ``DISC_TF_TEMP_KEEP_MB``),
    folded_reuses (launches of kernels that read only weights, such as batch norm's
    scale and offset, skipped because an earlier call computed their results from the
    same weight buffers; ``DISC_TF_FOLD=0`` turns that off), register_epilogues
    (GEMM launches whose epilogue, such as a bias or batch norm and a ReLU or ReLU6, ran
    on each tile of C in registers as the GEMM stored it) and layer_blocks (launches of
    GEMMs each reading the last one's result, such as an MLP's layers, that ran every
    layer on a block of rows before the next block, the results between layers never
    leaving cache)."""
    return dict(_native.load().py.stats())


def reset_stats() -> None:
    """Zeroes the counters of ``stats()``."""
    _native.load().py.reset_stats()
