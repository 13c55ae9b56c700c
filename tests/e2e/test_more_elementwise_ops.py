"""The wider elementwise set (activations, rounding, predicates, BiasAdd, AddN,
ClipByValue, FloorDiv/FloorMod) against TF at random shapes."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from tests.harness import assert_same, compiled, random_value

raw = tf.raw_ops

UNARY = {
    "Erf": lambda x: raw.Erf(x=x), "Erfc": lambda x: raw.Erfc(x=x), "Log1p": lambda x: raw.Log1p(x=x),
    "Expm1": lambda x: raw.Expm1(x=x), "Sin": lambda x: raw.Sin(x=x),
    "Cos": lambda x: raw.Cos(x=x), "Floor": lambda x: raw.Floor(x=x),
    "Ceil": lambda x: raw.Ceil(x=x), "Round": lambda x: raw.Round(x=x),
    "Reciprocal": lambda x: raw.Reciprocal(x=x), "Softplus": lambda x: raw.Softplus(features=x),
    "Softsign": lambda x: raw.Softsign(features=x), "Elu": lambda x: raw.Elu(features=x),
    "Selu": lambda x: raw.Selu(features=x), "Sign": lambda x: raw.Sign(x=x),
    "Relu6": lambda x: raw.Relu6(features=x),
    "LeakyRelu": lambda x: raw.LeakyRelu(features=x, alpha=0.3),
    "IsNan": lambda x: raw.IsNan(x=x), "IsFinite": lambda x: raw.IsFinite(x=x),
    "Identity": lambda x: raw.Identity(input=x), "ZerosLike": lambda x: raw.ZerosLike(x=x),
    "OnesLike": lambda x: raw.OnesLike(x=x),
}
BINARY = {
    "SquaredDifference": lambda x, y: raw.SquaredDifference(x=x, y=y),
    "FloorDiv": lambda x, y: raw.FloorDiv(x=x, y=y),
    "FloorMod": lambda x, y: raw.FloorMod(x=x, y=y),
}


def _special_values(rng, shape):
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    flat = x.reshape(-1)
    if flat.size >= 4:
        flat[:4] = [np.nan, np.inf, -np.inf, 0.5]  # NaN/Inf for the predicates, a .5 for Round
    return x


def _run_shapes(fn, sig, make_args, dtype, seed):
    tf_fn = tf.function(fn, input_signature=sig)
    disc_tf.reset_stats()
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(seed)
    for shape in [(3, 4), (1, 7), (0, 5), (6, 1), (2, 9), (5, 5)]:
        args = make_args(rng, shape)
        assert_same(tf_fn(*args), jitted(*args), dtype)
    assert disc_tf.stats()["fallbacks"] == 0


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(op):
    def make(rng, shape):
        if op in ("IsNan", "IsFinite", "Sign", "Round", "Floor", "Ceil", "Relu6"):
            return [_special_values(rng, shape)]
        return [random_value(rng, shape, tf.float32)]

    _run_shapes(lambda x: UNARY[op](x) if op in ("IsNan", "IsFinite") else UNARY[op](x) * 1.0,
                [tf.TensorSpec([None, None], tf.float32)], make, tf.float32, seed=len(op))


@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary(op):
    def make(rng, shape):
        y = random_value(rng, shape[-1:], tf.float32)
        y[np.abs(y) < 0.2] = 0.7  # keep divisors away from 0
        return [random_value(rng, shape, tf.float32) * 3, y]

    sig = [tf.TensorSpec([None, None], tf.float32), tf.TensorSpec([None], tf.float32)]
    _run_shapes(lambda x, y: BINARY[op](x, y), sig, make, tf.float32, seed=len(op))


@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_bias_add(data_format):
    def fn(x, b):
        return tf.nn.relu(raw.BiasAdd(value=x, bias=b, data_format=data_format))

    sig = [tf.TensorSpec([None, None, None, None], tf.float32), tf.TensorSpec([None], tf.float32)]
    tf_fn = tf.function(fn, input_signature=sig)
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(4)
    for shape in [(2, 3, 4, 5), (1, 1, 1, 1), (0, 2, 3, 4), (3, 5, 1, 2), (2, 2, 2, 7)]:
        c = shape[-1] if data_format == "NHWC" else shape[1]
        args = [random_value(rng, shape, tf.float32), random_value(rng, (c,), tf.float32)]
        assert_same(tf_fn(*args), jitted(*args), tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="Incompatible shapes"):
        jitted(np.ones((2, 3, 4, 5), np.float32), np.ones((6,), np.float32))
    assert_same(tf_fn(*args), jitted(*args), tf.float32)


def test_add_n_and_clip_by_value():
    def fn(a, b, c):
        return raw.ClipByValue(t=raw.AddN(inputs=[a, b, c]), clip_value_min=-0.5,
                               clip_value_max=tf.constant(0.75))

    sig = [tf.TensorSpec([None, None], tf.float32)] * 3
    _run_shapes(fn, sig, lambda rng, s: [random_value(rng, s, tf.float32) for _ in range(3)],
                tf.float32, seed=8)
