"""Stitch kernels on rows shorter than a vector (the eight-rows-across-lanes version
chosen per call) and on long rows, against TF: row counts that are and are not
multiples of eight, broadcast operands, half types and a GEMM epilogue."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from tests.harness import assert_same, compiled, random_value

F32, F16 = tf.float32, tf.float16

#: (rows, cols): short rows (cols < 8) in blocks of eight plus a remainder, long rows
_SHAPES = [(16, 3), (21, 5), (8, 1), (13, 7), (5, 2), (9, 8), (11, 40), (0, 3)]


def _layer_norm(x, g, b):
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)
    var = tf.reduce_mean(tf.math.squared_difference(x, mean), axis=-1, keepdims=True)
    return (x - mean) * tf.math.rsqrt(var + 1e-6) * g + b


CASES = {
    "softmax": (lambda x, g, b: tf.nn.softmax(x * 2.0 + b), F32),
    "log_softmax": (lambda x, g, b: tf.nn.log_softmax(x - b), F32),
    "layer_norm": (_layer_norm, F32),
    "sum_and_max": (lambda x, g, b: (tf.reduce_sum(x * g, -1), tf.reduce_max(x, -1) + 1.0), F32),
    "rms_norm": (lambda x, g, b: x * tf.math.rsqrt(tf.reduce_mean(x * x, -1, keepdims=True)
                                                    + 1e-5) * g, F32),
    "softmax_f16": (lambda x, g, b: tf.nn.softmax(x * tf.cast(g, F16)), F16),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_stitch_short_and_long_rows_match_tf(name):
    fn, dtype = CASES[name]
    sig = [tf.TensorSpec([None, None], dtype), tf.TensorSpec([None], F32),
           tf.TensorSpec([None], dtype)]
    tf_fn = tf.function(fn, input_signature=sig)
    disc_tf.reset_stats()
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(7)
    for rows, cols in _SHAPES:
        args = [random_value(rng, (rows, cols), dtype), random_value(rng, (cols,), F32),
                random_value(rng, (cols,), dtype)]
        assert_same(tf_fn(*args), jitted(*args), dtype)
    assert disc_tf.stats()["fallbacks"] == 0


def test_short_row_softmax_as_gemm_epilogue():
    """A softmax over 5 logits runs inside the GEMM, on blocks of whole rows."""
    tf_fn = tf.function(lambda x, w: tf.nn.softmax(tf.matmul(x, w)),
                        input_signature=[tf.TensorSpec([None, 32], F32),
                                         tf.TensorSpec([32, None], F32)])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(8)
    for m, n in [(64, 5), (19, 3), (8, 7), (40, 12), (3, 2)]:
        args = [random_value(rng, (m, 32), F32), random_value(rng, (32, n), F32)]
        np.testing.assert_allclose(jitted(*args), tf_fn(*args), rtol=1e-4, atol=1e-6)


def test_short_rows_of_a_broadcast_read():
    """Rows of a transposed, broadcast operand: each lane walks its own row."""
    tf_fn = tf.function(lambda x, y: tf.nn.softmax(tf.transpose(x, [1, 0, 2]) + y),
                        input_signature=[tf.TensorSpec([None, None, None], F32),
                                         tf.TensorSpec([None, 1, None], F32)])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(9)
    for a, b, c in [(3, 5, 4), (2, 8, 3), (4, 3, 9), (1, 9, 1), (5, 2, 6)]:
        args = [random_value(rng, (a, b, c), F32), random_value(rng, (b, 1, c), F32)]
        assert_same(tf_fn(*args), jitted(*args), F32)
