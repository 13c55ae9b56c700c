"""Algebraic identities applied while lowering (disc_tf/dhlo_bridge/identities.py):
``1 + tanh(u)`` becomes ``2 * sigmoid(2u)``. The generated code is checked for
which function it calls, and outputs against TF at random shapes, over a range
where tanh saturates."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from disc_tf import pipeline
from tests.harness import assert_matches_tf, compiled
from tests.stage_helpers import cluster_of, dyn

F32 = tf.float32


def gelu_tanh(x):
    """GELU's tanh form, as BERT and GPT-2 write it."""
    return 0.5 * x * (1.0 + tf.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))


def tanh_plus_one(x):
    return tf.tanh(x * 1.5) + 1.0


def tanh_read_twice(x):
    t = tf.tanh(x)
    return (1.0 + t) * x, t * 3.0


def _kernel_ops(fn) -> set[str]:
    """The DHLO ops the cluster's kernels compute."""
    plan = pipeline.front_end(cluster_of(fn, dyn(2))).plan
    return {op.op for k in plan.kernels for op in k.ops}


def _check(fn, seed: int) -> None:
    tf_fn = tf.function(fn, input_signature=[tf.TensorSpec([None, None], F32)])
    disc_tf.reset_stats()
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(seed)
    for rows, cols in [(1, 1), (3, 17), (64, 100), (257, 33)]:
        x = rng.uniform(-12.0, 12.0, (rows, cols)).astype(np.float32)
        assert_matches_tf(tf_fn, jitted, [x], rtol=1e-4, atol=1e-5)
    assert disc_tf.stats()["fallbacks"] == 0


@pytest.mark.parametrize("fn", [gelu_tanh, tanh_plus_one], ids=["gelu", "tanh_first"])
def test_one_plus_tanh_runs_as_a_logistic(fn):
    """The sum runs as 2 * sigmoid(2u): the kernel computes a logistic, no tanh, and
    gives TF's answers, the saturated tails included."""
    ops = _kernel_ops(fn)
    assert "logistic" in ops and "tanh" not in ops, ops
    _check(fn, seed=3)


def test_a_tanh_read_elsewhere_stays_a_tanh():
    """With another reader of the tanh, the sum is left as it is."""
    ops = _kernel_ops(tanh_read_twice)
    assert "tanh" in ops and "logistic" not in ops, ops
    _check(tanh_read_twice, seed=4)
