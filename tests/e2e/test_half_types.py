"""bfloat16 inside clusters: computed in float, rounded to bf16 after every op (to
nearest even, as TF's CPU kernels do): results equal TF's within one bf16 ulp (TF's
own transcendental kernels differ from float-then-round by at most that)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from tests.harness import compiled

BF16 = tf.bfloat16
OPS = {
    "gelu": lambda x: tf.nn.gelu(x * 1.5 + 0.25),
    "exp_div_tanh": lambda x: tf.exp(x) / (1.0 + tf.abs(x)) - tf.tanh(x),
    "cast_round_trip": lambda x: tf.cast(tf.cast(x, tf.float32) * 3.0, BF16) + x,
    "relu_max_sigmoid": lambda x: tf.maximum(tf.nn.relu(x), tf.sigmoid(x) * 0.1),
    "slice_concat": lambda x: tf.concat([x[:, 1:], x[:, :1]], axis=1) * 2.0,
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_bf16_matches_tf_within_one_ulp(name):
    tf_fn = tf.function(OPS[name], input_signature=[tf.TensorSpec([None, None], BF16)])
    disc_tf.reset_stats()
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(7)
    for shape in [(3, 5), (1, 1), (0, 4), (7, 33), (2, 2)]:
        x = tf.constant(rng.normal(size=shape).astype(np.float32), BF16)
        expected = tf_fn(x).numpy().astype(np.float32)
        actual = jitted(x).numpy().astype(np.float32)
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        np.testing.assert_allclose(actual, expected, rtol=2.0**-7, atol=1e-3)
    assert disc_tf.stats()["fallbacks"] == 0


F16_REDUCTIONS = {
    "sum_rows": lambda x: tf.reduce_sum(x * 1.5, axis=-1),
    "mean_cols": lambda x: tf.reduce_mean(x + 1.0, axis=0),
    "max_keepdims": lambda x: tf.reduce_max(x * 2.0, axis=1, keepdims=True) + x,
    "layer_norm": lambda x: (x - tf.reduce_mean(x, -1, keepdims=True)) * tf.math.rsqrt(
        tf.reduce_mean(tf.square(x - tf.reduce_mean(x, -1, keepdims=True)), -1, keepdims=True)
        + 1e-3),
}


@pytest.mark.parametrize("name", sorted(F16_REDUCTIONS))
def test_f16_reductions_match_tf(name):
    """f16 reductions accumulate in float; TF's agree within f16 rounding (rtol 1e-2)."""
    tf_fn = tf.function(F16_REDUCTIONS[name], input_signature=[tf.TensorSpec([None, None],
                                                                              tf.float16)])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(3)
    for shape in [(3, 5), (1, 1), (4, 300), (0, 3), (7, 33)]:
        x = rng.normal(size=shape).astype(np.float16)
        np.testing.assert_allclose(jitted(x).numpy().astype(np.float32),
                                   tf_fn(x).numpy().astype(np.float32), rtol=1e-2, atol=1e-2)


def test_bf16_argmax_matches_tf():
    tf_fn = tf.function(lambda x: tf.argmax(x * 2.0, axis=1), input_signature=[
        tf.TensorSpec([None, None], BF16)])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(4)
    for shape in [(3, 5), (1, 1), (4, 30)]:
        x = tf.constant(rng.integers(-3, 3, size=shape).astype(np.float32), BF16)
        np.testing.assert_array_equal(jitted(x).numpy(), tf_fn(x).numpy())


F16_PRODUCTS = {
    "matmul_bias_relu": (lambda x, w: tf.nn.relu(tf.matmul(x, w) + 0.5), (None, 8), (8, 6)),
    "batch_matmul": (lambda x, w: tf.matmul(x, w, transpose_b=True) * 0.5, (None, None, 8),
                     (None, 5, 8)),
    "softmax": (lambda x, w: tf.nn.softmax(x * w[0, 0], axis=-1), (None, None), (1, 1)),
}


@pytest.mark.parametrize("name", sorted(F16_PRODUCTS))
def test_f16_products_and_softmax_match_tf(name):
    fn, xs, ws = F16_PRODUCTS[name]
    tf_fn = tf.function(fn, input_signature=[tf.TensorSpec(xs, tf.float16),
                                             tf.TensorSpec(ws, tf.float16)])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(9)
    for n in [1, 3, 7, 0]:
        x_shape = tuple(n if d is None else d for d in xs)
        if name == "batch_matmul":
            x_shape = (2, n, 8)
        w_shape = tuple(2 if d is None else d for d in ws)
        x = rng.normal(size=x_shape).astype(np.float16)
        w = rng.normal(size=w_shape).astype(np.float16)
        np.testing.assert_allclose(jitted(x, w).numpy().astype(np.float32),
                                   tf_fn(x, w).numpy().astype(np.float32), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("op", ["conv", "maxpool", "avgpool"])
def test_f16_conv_and_pooling_match_tf(op):
    w = np.random.default_rng(0).normal(scale=0.3, size=(3, 3, 3, 4)).astype(np.float16)
    fn = {"conv": lambda x: tf.nn.relu(tf.nn.conv2d(x, w, 1, "SAME") + 0.5),
          "maxpool": lambda x: tf.nn.max_pool2d(x * 2.0, 3, 2, "SAME") + 1.0,
          "avgpool": lambda x: tf.nn.avg_pool2d(x * 2.0, 3, 2, "SAME") + 1.0}[op]
    tf_fn = tf.function(fn, input_signature=[tf.TensorSpec([None, None, None, 3], tf.float16)])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(1)
    for shape in [(1, 5, 7, 3), (2, 8, 8, 3), (1, 1, 1, 3)]:
        x = rng.normal(size=shape).astype(np.float16)
        np.testing.assert_allclose(jitted(x).numpy().astype(np.float32),
                                   tf_fn(x).numpy().astype(np.float32), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("op", ["matmul", "conv"])
def test_bf16_matmul_and_conv_match_tf(op):
    rng = np.random.default_rng(2)
    if op == "matmul":
        w = tf.constant(rng.normal(scale=0.3, size=(8, 6)).astype(np.float32), BF16)
        fn, spec = (lambda x: tf.nn.relu(tf.matmul(x, w) + 0.5)), [None, 8]
    else:
        w = tf.constant(rng.normal(scale=0.3, size=(3, 3, 3, 4)).astype(np.float32), BF16)
        fn, spec = (lambda x: tf.nn.conv2d(x, w, 1, "SAME") + 0.5), [None, None, None, 3]
    tf_fn = tf.function(fn, input_signature=[tf.TensorSpec(spec, BF16)])
    jitted = compiled(tf_fn)
    for n in [1, 3, 6]:
        shape = (n, 8) if op == "matmul" else (1, n + 2, n + 4, 3)
        x = tf.constant(rng.normal(size=shape).astype(np.float32), BF16)
        np.testing.assert_allclose(jitted(x).numpy().astype(np.float32),
                                   tf_fn(x).numpy().astype(np.float32), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("name", ["sum_rows", "mean_cols", "max_keepdims"])
def test_bf16_reductions_accumulate_like_tf(name):
    """Float accumulation, one rounding at the end: TF's result up to one bf16 ulp,
    even over long rows (a per-step bf16 accumulator would drift far from it)."""
    tf_fn = tf.function(F16_REDUCTIONS[name], input_signature=[tf.TensorSpec([None, None], BF16)])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(11)
    for shape in [(3, 5), (1, 1), (4, 300), (2, 2000), (0, 3)]:
        x = tf.constant(rng.normal(size=shape).astype(np.float32), BF16)
        np.testing.assert_allclose(jitted(x).numpy().astype(np.float32),
                                   tf_fn(x).numpy().astype(np.float32), rtol=2.0**-7, atol=1e-6)


@pytest.mark.parametrize("op", ["softmax", "maxpool", "avgpool"])
def test_bf16_softmax_and_pooling_match_tf(op):
    fn = {"softmax": lambda x: tf.nn.softmax(x * 2.0, axis=-1),
          "maxpool": lambda x: tf.nn.max_pool2d(x * 2.0, 3, 2, "SAME") + 1.0,
          "avgpool": lambda x: tf.nn.avg_pool2d(x * 2.0, 3, 2, "SAME") + 1.0}[op]
    spec = [None, None] if op == "softmax" else [None, None, None, 3]
    tf_fn = tf.function(fn, input_signature=[tf.TensorSpec(spec, BF16)])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(13)
    shapes = [(3, 5), (1, 1), (4, 300)] if op == "softmax" else [(1, 5, 7, 3), (2, 8, 8, 3)]
    for shape in shapes:
        x = tf.constant(rng.normal(size=shape).astype(np.float32), BF16)
        np.testing.assert_allclose(jitted(x).numpy().astype(np.float32),
                                   tf_fn(x).numpy().astype(np.float32), rtol=2.0**-6,
                                   atol=2.0**-6)  # one ulp of the ~1-sized intermediates
