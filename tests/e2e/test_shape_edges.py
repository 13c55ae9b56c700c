"""Shape arithmetic at the edges, as TF does it: int32 shape values that do not fit
in 32 bits raise InvalidArgument (TF's Shape refuses them; an int32 product
would have wrapped), and a zero-sized dim makes any buffer empty however large
the other dims are (TF returns an empty [2^62, 0] tensor)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from tests.harness import assert_ops_compiled, compiled


def _jit(fn, *specs):
    tf_fn = tf.function(fn, input_signature=list(specs))
    return tf_fn, compiled(tf_fn)


def test_int32_shape_of_a_dim_past_2_31_is_invalid_argument():
    tf_fn, jitted = _jit(lambda x: tf.shape(x) * 2, tf.TensorSpec([None, None], tf.float32))
    assert_ops_compiled(jitted, {"Shape", "Mul"})
    big = np.zeros((2**31 + 5, 0), np.float32)  # no elements: nothing is allocated
    with pytest.raises(tf.errors.InvalidArgumentError, match="32-bit"):
        tf_fn(big)
    with pytest.raises(tf.errors.InvalidArgumentError, match="int32 result out of range.*2147483653"):
        jitted(big)
    np.testing.assert_array_equal(jitted(np.zeros((3, 5), np.float32)), [6, 10])  # still serves
    i64 = compiled(tf.function(lambda x: tf.shape(x, out_type=tf.int64) * 2,
                               input_signature=[tf.TensorSpec([None, None], tf.float32)]))
    np.testing.assert_array_equal(i64(big), [2 * (2**31 + 5), 0])


def test_an_int32_product_that_wraps_is_invalid_argument():
    def fn(x):
        n = tf.shape(x)[0] * tf.shape(x)[1]  # int32: 2^32 wraps to 0 in TF
        return tf.fill(tf.stack([n, 0]), 1.0) * 2.0

    tf_fn, jitted = _jit(fn, tf.TensorSpec([None, None, None], tf.float32))
    assert_ops_compiled(jitted, {"Fill", "Mul"})
    x = np.zeros((2**16, 2**16, 0), np.float32)
    assert tf_fn(x).shape == (0, 0)  # TF's wrapped answer
    with pytest.raises(tf.errors.InvalidArgumentError, match="'mul': int32 result out of range"):
        jitted(x)
    small = np.zeros((3, 7, 0), np.float32)
    assert jitted(small).shape == tf_fn(small).shape == (21, 0)


def test_a_zero_dim_makes_a_huge_buffer_empty():
    def fill(x):
        n = tf.shape(x, out_type=tf.int64)[0] * 2**62
        return tf.fill(tf.stack([n, tf.constant(0, tf.int64)]), 1.0) * 2.0

    tf_fn, jitted = _jit(fill, tf.TensorSpec([None], tf.float32))
    assert_ops_compiled(jitted, {"Fill", "Mul"})
    disc_tf.reset_stats()
    x = np.zeros((1,), np.float32)
    assert jitted(x).shape == tf_fn(x).shape == (2**62, 0)
    add = compiled(tf.function(lambda x, y: x + y * 3.0,
                               input_signature=[tf.TensorSpec([None, None], tf.float32)] * 2))
    got = add(np.zeros((2**40, 0), np.float32), np.zeros((1, 0), np.float32))
    assert got.shape == (2**40, 0)
    assert disc_tf.stats()["fallbacks"] == 0


def test_a_value_read_only_for_its_shape_needs_no_kernel():
    """``tf.shape(tf.pad(x))``: the pad's result is never read, so no kernel computes
    it (the plan had a kernel without outputs, and the cluster failed to compile);
    a gather read only for its shape still checks its indices, as TF's kernel does."""
    from tests.harness import compiled, gpu_code_path

    spec = tf.TensorSpec([None, None], tf.float32)
    fn = tf.function(lambda x: tf.cast(tf.shape(tf.pad(x * 2.0, [[1, 1], [0, 2]])),
                                       tf.float32) + tf.reduce_sum(x), input_signature=[spec])
    jitted = compiled(fn)
    for shape in [(2, 3), (0, 4), (5, 1)]:
        x = np.ones(shape, np.float32)
        np.testing.assert_allclose(jitted(x), fn(x))
    gather = tf.function(
        lambda x, i: tf.cast(tf.shape(tf.gather(x * 2.0, i)), tf.float32) + 1.0,
        input_signature=[spec, tf.TensorSpec([None], tf.int32)])
    jitted = compiled(gather)
    np.testing.assert_allclose(jitted(np.ones((3, 2), np.float32), np.array([0, 2], np.int32)),
                               [3.0, 3.0])
    if gpu_code_path():  # TF's GPU kernel checks no index: neither does the GPU code
        np.testing.assert_allclose(
            jitted(np.ones((3, 2), np.float32), np.array([0, 5], np.int32)), [3.0, 3.0])
    else:
        with pytest.raises(tf.errors.InvalidArgumentError):
            jitted(np.ones((3, 2), np.float32), np.array([0, 5], np.int32))
