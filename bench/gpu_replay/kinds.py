"""Small functions, one or two per kind of CUDA kernel the bench models do not reach:
index kernels (gather, concatenation and slices read in place, pads, scans, reverse,
iota), reductions across rows and columns, ArgMax, rows longer than a warp's reach,
half types, pooling and Conv2D. Each is ``(tf.function, make_args(rng, call))``: call 0
is small with odd sizes, later calls larger."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

F32 = tf.float32


def _spec(*shape):
    return tf.TensorSpec(list(shape), F32)


def _dims(rng: np.random.Generator, call: int, small: tuple, large: tuple) -> list[int]:
    """Random sizes: near ``small`` on call 0, up to ``large`` later."""
    lo = small if call == 0 else tuple(max(s, big // 4) for s, big in zip(small, large))
    hi = small if call == 0 else large
    return [int(rng.integers(a, b + 1)) for a, b in zip(lo, hi)]


def _normal(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@tf.function(input_signature=[_spec(None, 64), tf.TensorSpec([None], tf.int32)])
def gather_rows(table, ids):
    """Embedding lookup, scaled and normalised (gather + stitch)."""
    rows = tf.gather(table, ids) * 2.0
    return rows * tf.math.rsqrt(tf.reduce_mean(tf.square(rows), axis=-1, keepdims=True) + 1e-6)


def _gather_args(rng, call):
    vocab, n = _dims(rng, call, (7, 5), (5000, 20000))
    return _normal(rng, vocab, 64), rng.integers(0, vocab, n).astype(np.int32)


@tf.function(input_signature=[_spec(None, None), _spec(None, None)])
def concat_slice(a, b):
    """Concatenation, slices read in place, a pad and a mirrored pad."""
    c = tf.concat([a, tf.tanh(b)], axis=1)
    left = c[:, 1:-1] * 3.0
    padded = tf.pad(left, [[1, 2], [0, 3]])
    return padded, tf.pad(tf.sigmoid(a), [[1, 1], [2, 2]], mode="REFLECT")


def _concat_args(rng, call):
    m, n, k = _dims(rng, call, (3, 5, 4), (3000, 700, 300))
    return _normal(rng, m, n), _normal(rng, m, k)


@tf.function(input_signature=[_spec(None, None, None)])
def reductions(x):
    """Row, column and middle-axis reductions; ArgMax; a long row (block per row)."""
    return (tf.reduce_sum(x, axis=-1), tf.reduce_max(x, axis=0), tf.reduce_mean(x * x, axis=1),
            tf.argmax(x, axis=-1, output_type=tf.int32), tf.reduce_sum(tf.exp(x)))


def _reduce_args(rng, call):
    return (_normal(rng, *_dims(rng, call, (3, 5, 33), (64, 300, 5000))),)


@tf.function(input_signature=[_spec(None, None)])
def long_softmax(x):
    """Softmax and layer-norm-like stitch over rows of up to 20000 elements."""
    s = tf.nn.softmax(x * 0.5)
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)
    var = tf.reduce_mean(tf.square(x - mean), axis=-1, keepdims=True)
    return s, (x - mean) * tf.math.rsqrt(var + 1e-5)


def _softmax_args(rng, call):
    return (_normal(rng, *_dims(rng, call, (3, 1100), (300, 20000))),)


@tf.function(input_signature=[_spec(None, None, None)])
def scan_reverse_iota(x):
    """Cumsum (a scan), Reverse, Transpose, and a Range used as data."""
    c = tf.cumsum(x, axis=1)
    r = tf.reverse(x, axis=[2])
    pos = tf.cast(tf.range(tf.shape(x)[2]), F32)
    return c, tf.transpose(r, [0, 2, 1]) + 1.0, x * pos


def _scan_args(rng, call):
    return (_normal(rng, *_dims(rng, call, (2, 3, 5), (16, 500, 300))),)


@tf.function(input_signature=[_spec(None, None, None)])
def half_types(x):
    """f16 and bf16 elementwise, softmax and a GEMM (computed in f32, rounded per op)."""
    h = tf.cast(x, tf.float16)
    b = tf.cast(x, tf.bfloat16)
    hs = tf.nn.softmax(h * tf.constant(0.5, tf.float16))
    hb = tf.nn.gelu(b) + b
    prod = tf.matmul(h, h, transpose_b=True)
    return tf.cast(hs, F32), tf.cast(hb, F32), tf.cast(prod, F32)


def _half_args(rng, call):
    return (_normal(rng, *_dims(rng, call, (2, 3, 7), (8, 256, 512))),)


@tf.function(input_signature=[_spec(None, None, None, 8), _spec(3, 3, 8, 16), _spec(3, 3, 16, 1)])
def conv2d_pool(x, w, dw):
    """Conv2D (SAME, stride 1), bias-free ReLU, depthwise Conv2D, max and average pooling."""
    y = tf.nn.relu(tf.nn.conv2d(x, w, strides=1, padding="SAME"))
    z = tf.nn.depthwise_conv2d(y, dw, strides=[1, 2, 2, 1], padding="VALID")
    return tf.nn.max_pool2d(z, 2, 2, "SAME"), tf.nn.avg_pool2d(y, 3, 1, "VALID")


def _conv_args(rng, call):
    n, h, w = _dims(rng, call, (1, 9, 11), (4, 96, 128))
    return (_normal(rng, n, h, w, 8), _normal(rng, 3, 3, 8, 16) * 0.3,
            _normal(rng, 3, 3, 16, 1) * 0.3)


@tf.function(input_signature=[_spec(None, None), _spec(None, None), _spec(None)])
def gemm_epilogue(x, w, bias):
    """A GEMM with bias, erf-GELU and a residual; then a batched GEMM through a transpose."""
    y = tf.nn.gelu(tf.matmul(x, w) + bias, approximate=False)
    z = y + tf.matmul(x, w)
    t = tf.reshape(z, [tf.shape(z)[0], -1, 4])
    return z, tf.matmul(t, t, transpose_a=True)


def _gemm_args(rng, call):
    m, k, n4 = _dims(rng, call, (3, 5, 2), (4000, 1024, 256))
    return _normal(rng, m, k), _normal(rng, k, 4 * n4) * 0.05, _normal(rng, 4 * n4)


@tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None, None], tf.int32)])
def integer_ops(a, b):
    """Integer arithmetic, comparisons, select and a cast (exact on every backend)."""
    q = tf.math.floordiv(a, tf.maximum(tf.abs(b), 1))
    return tf.where(a > b, q * 3 - b, tf.math.floormod(a, 7)), tf.cast(a, F32) * 0.5


def _int_args(rng, call):
    m, n = _dims(rng, call, (3, 5), (500, 400))
    return (rng.integers(-1000, 1000, (m, n)).astype(np.int32),
            rng.integers(-50, 50, (m, n)).astype(np.int32))


KINDS: dict[str, tuple[tf.types.experimental.PolymorphicFunction, Callable]] = {
    "gather_rows": (gather_rows, _gather_args),
    "concat_slice": (concat_slice, _concat_args),
    "reductions": (reductions, _reduce_args),
    "long_softmax": (long_softmax, _softmax_args),
    "scan_reverse_iota": (scan_reverse_iota, _scan_args),
    "half_types": (half_types, _half_args),
    "conv2d_pool": (conv2d_pool, _conv_args),
    "gemm_epilogue": (gemm_epilogue, _gemm_args),
    "integer_ops": (integer_ops, _int_args),
}

#: Kinds whose float32 outputs come from narrower math (compared with its tolerance).
COMPUTE_DTYPES = {"half_types": "bfloat16"}
