"""Strict mode: no silent fallback to TF ops.

``DISC_TF_STRICT=1`` (or ``strict=True`` to ``optimize``/``jit``) turns every
place where disc_tf would quietly run TensorFlow's own ops into an error that
names the cluster and the cause: a cluster that fails any compile stage (a
lowering that refuses an op included), a function body that cannot be analysed,
and, at run time (in the ``DiscCluster`` op), an artifact that does not load or
any call that would run the original ops. Nodes that were never clustered (an
unsupported op) are not errors: the report lists them with their reasons.
"""

from __future__ import annotations

import os

ENV = "DISC_TF_STRICT"
#: What the DiscCluster op's error says when strict mode refuses a call's fallback
#: (cc/kernels/disc_cluster_op.cc).
RUNTIME_REFUSAL = "strict mode (DISC_TF_STRICT)"


class StrictModeError(RuntimeError):
    """disc_tf would have run TF ops instead of compiled code, in strict mode."""


def strict_from_env() -> bool:
    """True when ``DISC_TF_STRICT`` is set to 1/true/yes/on."""
    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on")


def resolve(strict: bool | None) -> bool:
    """An explicit ``strict`` argument, else the environment's setting."""
    return strict_from_env() if strict is None else strict


def is_runtime_refusal(error: BaseException) -> bool:
    """Whether ``error`` is the DiscCluster op refusing, in strict mode, to run a call's
    original TF ops."""
    return RUNTIME_REFUSAL in str(error)
