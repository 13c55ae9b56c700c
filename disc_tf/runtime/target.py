"""Target selection: which backend compiles clusters ("cpu", "cuda" or "cuda-emu").

"auto" is ``$DISC_TF_TARGET`` where that is set (to a target other than
"auto"); else it picks "cuda" only when TensorFlow sees a GPU *and* the loaded op
library registers a GPU kernel for DiscCluster (a CUDA artifact handed to the
CPU kernel is refused and the cluster falls back to its original ops);
otherwise "cpu", with one log line saying why. "cuda" is honoured on any
machine: emitting and compiling CUDA artifacts needs nvcc, not a GPU (AOT
compilation for a GPU fleet). "cuda-emu" compiles the CUDA backend's code for
the CPU emulation of a GPU (``runtime/cuda_emu_build.py``): the GPU code path,
run and tested where there is no GPU.
"""

from __future__ import annotations

import functools
import logging
import os

TARGETS = ("cpu", "cuda", "cuda-emu")
#: Environment variable naming the target "auto" stands for (all entry points).
ENV_VAR = "DISC_TF_TARGET"

log = logging.getLogger("disc_tf")


def _gpu_kernel_registered() -> bool:
    from tensorflow.python.framework import kernels

    try:
        registered = kernels.get_registered_kernels_for_op("DiscCluster").kernel
    except Exception:  # noqa: BLE001 - an op library without the op: no GPU kernel
        return False
    return any(k.device_type == "GPU" for k in registered)


@functools.cache
def _auto() -> str:
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        log.info("target 'auto': TensorFlow sees no GPU; compiling for the CPU")
        return "cpu"
    if not _gpu_kernel_registered():
        log.info("target 'auto': %d GPU(s) visible but this disc_tf op library has no GPU "
                 "DiscCluster kernel; compiling for the CPU", len(gpus))
        return "cpu"
    return "cuda"


def resolve_target(target: str) -> str:
    """The backend for ``target`` (one of TARGETS or "auto"); raises ValueError on
    any other name, or on an unknown ``$DISC_TF_TARGET``."""
    names = ", ".join(repr(t) for t in (*TARGETS, "auto"))
    if target == "auto":
        configured = os.environ.get(ENV_VAR, "").strip()
        if configured in ("", "auto"):
            return _auto()
        if configured not in TARGETS:
            raise ValueError(f"${ENV_VAR}={configured!r} is not a target; available: {names}")
        return configured
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; available: {names}")
    return target
