"""Minimised mismatches found by the differential fuzzer (tests/fuzz).

Each reproduces a bug the fuzzer found (now fixed); they guard against its return.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import disc_tf


def _jit(fn, ranks):
    tf_fn = tf.function(fn, input_signature=[tf.TensorSpec([None] * r, tf.float32) for r in ranks],
                        autograph=False)
    return tf_fn, disc_tf.jit(tf_fn, min_cluster_size=1)


def test_dead_reduction_in_cluster_compiles():
    # Found failing (IndexError: list index out of range, cluster
    # left as TF ops); passes with the dead-code elimination in disc_tf/fusion.
    def fn(x):
        v0 = tf.math.abs(x)
        tf.math.reduce_sum(v0, axis=0)  # dead
        return (tf.math.abs(v0),)

    tf_fn, jitted = _jit(fn, [2])
    errors = [c.error for c in jitted.report.clusters if c.error is not None]
    assert not errors, errors
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 3
    np.testing.assert_array_equal(jitted(x)[0], tf_fn(x)[0])


def test_dead_op_in_cluster_does_not_raise():
    # Found failing (disc ran the dead Add and raised
    # InvalidArgumentError); passes with the dead-code elimination in disc_tf/fusion.
    def fn(x, y):
        v0 = tf.math.abs(x)
        tf.math.add(v0, y)  # dead; its operands do not broadcast at the shapes below
        return (tf.math.tanh(v0),)

    tf_fn, jitted = _jit(fn, [2, 2])
    x = np.full((2, 3), 0.5, np.float32)
    y = np.ones((4, 5), np.float32)
    expected = tf_fn(x, y)[0]  # TF: fine
    np.testing.assert_allclose(jitted(x, y)[0], expected, rtol=1e-6)


# Found failing: a broadcast symbol defined by an earlier host check was defined
# again by a later one (C++ redeclaration), so the cluster stayed as TF ops.
def test_chained_broadcast_adds_compile():
    def fn(x0, x1, x2):
        return (tf.math.add(x1, tf.math.add(x0, x2)),)

    tf_fn, jitted = _jit(fn, [2, 1, 2])
    errors = [c.error for c in jitted.report.clusters if c.error is not None]
    assert not errors, errors
    args = [np.ones((3, 3), np.float32), np.arange(3, dtype=np.float32), np.ones((1, 3), np.float32)]
    np.testing.assert_allclose(jitted(*args)[0], tf_fn(*args)[0], rtol=1e-6)


def test_identity_of_a_transpose_result_is_a_copy():
    # Found failing (ShapeError: result 0 is not computed by the cluster) when
    # Identity was forwarded onto an identity transpose, which is no kernel's value.
    def fn(x, y):
        return (tf.transpose(x, perm=[0, 1]), tf.identity(tf.transpose(y, [1, 0])),
                tf.identity(tf.reshape(x * 2.0, [-1])))

    tf_fn, jitted = _jit(fn, [2, 2])
    errors = [c.error for c in jitted.report.clusters if c.error is not None]
    assert not errors, errors
    rng = np.random.default_rng(0)
    for shape in [(2, 3), (1, 1), (0, 4), (5, 2), (3, 3)]:
        x, y = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
        for got, want in zip(jitted(x, y), tf_fn(x, y)):
            np.testing.assert_array_equal(got, want)
