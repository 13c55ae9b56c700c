"""Kernel counts of common fusion patterns, with outputs checked against TF."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests.harness import assert_same, compiled, random_value

HIDDEN = 64


def _gelu_tanh(x, b):
    h = x + b
    return 0.5 * h * (1.0 + tf.tanh(0.7978845608 * (h + 0.044715 * tf.pow(h, 3.0))))


def _gelu_erf(x, b):
    return tf.nn.gelu(tf.nn.bias_add(x, b), approximate=False)


def _gelu_keras_tanh(x, b):
    return tf.nn.gelu(x + b, approximate=True)


@pytest.mark.parametrize("fn", [_gelu_tanh, _gelu_erf, _gelu_keras_tanh], ids=lambda f: f.__name__)
def test_bias_plus_gelu_is_one_kernel(fn):
    sig = [tf.TensorSpec([None, None, HIDDEN], tf.float32), tf.TensorSpec([HIDDEN], tf.float32)]
    tf_fn = tf.function(fn, input_signature=sig)
    jitted = compiled(tf_fn)
    (cluster,) = jitted.report.compiled
    assert cluster.kernels == 1, jitted.report
    rng = np.random.default_rng(1)
    for b, t in [(2, 7), (1, 1), (0, 4), (3, 33), (5, 2)]:
        args = [random_value(rng, (b, t, HIDDEN), tf.float32), random_value(rng, (HIDDEN,), tf.float32)]
        assert_same(tf_fn(*args), jitted(*args), tf.float32)
