"""Reductions and the fusions around them, against TF at random shapes
(zero-size and size-1 dims included), with negative axes and keep_dims."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from tests.harness import assert_matches_tf, compiled, random_value

REDUCE = {
    "Sum": tf.reduce_sum, "Mean": tf.reduce_mean, "Max": tf.reduce_max,
    "Min": tf.reduce_min, "Prod": tf.reduce_prod,
}
AXES = [[-1], [0], [1], [0, 2], [-2, -1], [0, 1, 2]]


def _compare(tf_fn, jitted, args, rtol=1e-4, atol=1e-5):
    assert_matches_tf(tf_fn, jitted, args, rtol, atol)


def _shapes(rng, rank, count=6):
    out = [tuple(int(rng.integers(1, 6)) for _ in range(rank)) for _ in range(count - 2)]
    out.append(tuple([0] + [3] * (rank - 1)))
    out.append(tuple([2] * (rank - 1) + [1]))
    return out


@pytest.mark.parametrize("keep", [False, True], ids=["drop", "keep"])
@pytest.mark.parametrize("axes", AXES, ids=str)
@pytest.mark.parametrize("op", sorted(REDUCE))
def test_reduce_float32(op, axes, keep):
    def fn(x):
        return REDUCE[op](x * 0.5 + 0.25, axis=axes, keepdims=keep)

    tf_fn = tf.function(fn, input_signature=[tf.TensorSpec([None] * 3, tf.float32)])
    disc_tf.reset_stats()
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(len(op) * 10 + len(axes))
    for shape in _shapes(rng, 3):
        x = random_value(rng, shape, tf.float32)
        if op == "Max" or op == "Min":
            x = x[..., :] if shape[0] else x
        _compare(tf_fn, jitted, [x])
    assert disc_tf.stats()["fallbacks"] == 0


@pytest.mark.parametrize("axes", [[0], [1], [0, 1], [1, 2]], ids=str)
@pytest.mark.parametrize("op", sorted(REDUCE))
def test_empty_reduced_extent_with_wide_rows(op, axes):
    """A zero reduced dim under outputs many columns wide (the column kernels, which
    once divided by that zero dim and trapped: an EfficientNet squeeze-excite Mean
    over an image that strides shrank to nothing)."""
    def fn(x):
        return REDUCE[op](x * 0.5 + 0.25, axis=axes)

    tf_fn = tf.function(fn, input_signature=[tf.TensorSpec([None] * 4, tf.float32)])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(4)
    disc_tf.reset_stats()
    for shape in [(2, 0, 3, 200), (3, 4, 0, 64), (0, 2, 3, 40), (1, 0, 0, 33), (2, 3, 4, 96)]:
        x = rng.standard_normal(shape).astype(np.float32)
        _compare(tf_fn, jitted, [x])
    assert disc_tf.stats()["fallbacks"] == 0


@pytest.mark.parametrize("dtype", [tf.int32, tf.int64], ids=lambda d: d.name)
@pytest.mark.parametrize("op", ["Sum", "Max", "Min", "Mean", "Prod"])
def test_reduce_integers(op, dtype):
    """Empty rows included: TF gives each reducer's identity there, an integer Mean 0
    (it once divided 0 by 0 and gave the type's most negative value)."""
    def fn(x):
        return REDUCE[op](x * 2 + 1, axis=-1)

    tf_fn = tf.function(fn, input_signature=[tf.TensorSpec([None, None], dtype)])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(3)
    for shape in [(3, 4), (1, 7), (5, 1), (4, 9), (2, 2), (3, 0), (0, 4)]:
        _compare(tf_fn, jitted, [random_value(rng, shape, dtype)], rtol=0, atol=0)


@pytest.mark.parametrize("op", ["All", "Any"])
def test_reduce_bool(op):
    fn = {"All": tf.reduce_all, "Any": tf.reduce_any}[op]
    tf_fn = tf.function(lambda x, y: fn(tf.logical_and(x, y), axis=[0, -1]),
                        input_signature=[tf.TensorSpec([None, None, None], tf.bool)] * 2)
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(4)
    for shape in _shapes(rng, 3):
        _compare(tf_fn, jitted, [rng.random(shape) < 0.8, rng.random(shape) < 0.9], 0, 0)


def _layer_norm(x, gamma, beta):
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)
    var = tf.reduce_mean(tf.math.squared_difference(x, mean), axis=-1, keepdims=True)
    return (x - mean) * tf.math.rsqrt(var + 1e-5) * gamma + beta


FUSIONS = {
    "softmax": (lambda x: tf.nn.softmax(x), 1),
    "log_softmax": (lambda x: tf.nn.log_softmax(x), 1),
    "manual_softmax": (lambda x: tf.exp(x - tf.reduce_max(x, -1, keepdims=True))
                       / tf.reduce_sum(tf.exp(x - tf.reduce_max(x, -1, keepdims=True)), -1,
                                       keepdims=True), 1),
    "rms_norm": (lambda x: x * tf.math.rsqrt(tf.reduce_mean(tf.square(x), -1, keepdims=True)
                                              + 1e-6), 1),
}


@pytest.mark.parametrize("name", sorted(FUSIONS))
def test_row_reduction_fusions_are_one_kernel(name):
    fn, kernels = FUSIONS[name]
    tf_fn = tf.function(fn, input_signature=[tf.TensorSpec([None, None, None], tf.float32)])
    jitted = compiled(tf_fn)
    (cluster,) = jitted.report.compiled
    assert cluster.kernels == kernels, jitted.report
    rng = np.random.default_rng(5)
    for shape in _shapes(rng, 3) + [(2, 3, 1000)]:
        _compare(tf_fn, jitted, [random_value(rng, shape, tf.float32) * 3])


def test_keras_style_layer_norm_is_one_kernel():
    sig = [tf.TensorSpec([None, None, 32], tf.float32), tf.TensorSpec([32], tf.float32),
           tf.TensorSpec([32], tf.float32)]
    tf_fn = tf.function(_layer_norm, input_signature=sig)
    jitted = compiled(tf_fn)
    (cluster,) = jitted.report.compiled
    assert cluster.kernels == 1
    rng = np.random.default_rng(6)
    for b, t in [(2, 5), (1, 1), (0, 3), (3, 17), (4, 2)]:
        args = [random_value(rng, (b, t, 32), tf.float32), random_value(rng, (32,), tf.float32),
                random_value(rng, (32,), tf.float32)]
        _compare(tf_fn, jitted, args)


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("dtype", [tf.int32, tf.int64], ids=lambda d: d.name)
def test_integer_mean_of_large_values_is_tf_s(dtype, axis):
    """TF sums an int32 mean in int64 (the sum of three values near 2^30 does not wrap)
    and divides an int64 mean's sum by the count as integers. disc summed int32 in
    int32 and divided both through a double (an int64 quotient above 2^53 lost its low
    digits)."""
    tf_fn = tf.function(lambda x: tf.reduce_mean(x * 1, axis=axis),
                        input_signature=[tf.TensorSpec([None, None], dtype)])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(17)
    high = 2**31 - 1 if dtype == tf.int32 else 2**62
    for shape in [(3, 1000), (1000, 3), (2, 70000), (1, 1), (5, 2)]:
        x = rng.integers(-high, high, size=shape, dtype=np.int64).astype(dtype.as_numpy_dtype)
        np.testing.assert_array_equal(jitted(x).numpy(), tf_fn(x).numpy(), err_msg=str(shape))
    x = np.full((1, 3), 2**30, dtype.as_numpy_dtype)
    np.testing.assert_array_equal(jitted(x).numpy(), tf_fn(x).numpy())
    assert disc_tf.stats()["fallbacks"] == 0
