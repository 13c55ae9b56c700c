"""A while loop whose step runs one op, for scripts run in a fresh process that prove
the step's RAL forwards a service of the call's (a loop step has a RAL of its own)."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

import disc_tf
from disc_tf.jit import JitFunction


def jit_looped(step: Callable[[tf.Tensor, tf.Tensor], tf.Tensor], weight: tf.Variable,
               input_shape: list[int | None]) -> tuple[Callable, JitFunction]:
    """``h = tanh(step(h, w) + h)`` three times in a ``tf.while_loop`` (w read once,
    outside the step), as a tf.function and compiled with its loop cluster."""
    @tf.function(input_signature=[tf.TensorSpec(input_shape, tf.float32)])
    def looped(x):
        w = tf.convert_to_tensor(weight)

        def body(i, h):
            return i + 1, tf.tanh(step(h, w) + h)
        return tf.while_loop(lambda i, h: i < 3, body, [tf.constant(0), x])[1]

    jitted = disc_tf.jit(looped, min_cluster_size=1)
    assert any(c.name.startswith("disc_loop_") for c in jitted.report.compiled), jitted.report
    return looped, jitted
