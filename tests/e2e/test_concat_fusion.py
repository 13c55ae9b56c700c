"""Concatenations read in place by loop kernels (an index map, no concatenated copy),
against TF at random shapes, with kernel counts."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from tests.harness import assert_same, compiled, random_value

F32, I32 = tf.float32, tf.int32


def _spec(rank: int, dtype=F32, last: int | None = None) -> tf.TensorSpec:
    return tf.TensorSpec([None] * (rank - 1) + [last], dtype)


def _inner_mixed(x, y):
    """Computed, transposed and sliced parts along the innermost dim."""
    return tf.concat([tf.exp(x), tf.transpose(y), x[:, :1]], axis=1) * 2.0 + 1.0


def _outer_rank3(x, b):
    """Along dim 1 of [n, t, h]: each row lies in one part."""
    return tf.nn.relu(tf.concat([x, x * 2.0 + b, x[:, :1]], axis=1)) - 0.5


def _rank1(x, y):
    return tf.concat([x, tf.exp(y), x], axis=0) + 1.0


def _broadcast_part(x, b):
    """A part that is a broadcast of a vector (stride 0 along the rows)."""
    return tf.concat([x, tf.broadcast_to(b, tf.shape(x))], axis=0) * 3.0


def _two_concats(x, y):
    """Two innermost concatenations feeding one add: one per kernel."""
    return tf.concat([x, y], 1) + tf.concat([y, x * 2.0], 1)


def _concat_then_row_reduce(x, y):
    """A softmax over a concatenation: the stitch kernel reads the copy one loop
    kernel writes (stitch kernels do not read concatenations in place)."""
    return tf.nn.softmax(tf.concat([x, y * 2.0], axis=-1))


def _result_and_consumer(x, y):
    c = tf.concat([x, y], axis=0)
    return c, c * 2.0 + 1.0


#: name -> (function, input specs, shape sets (one tuple of shapes per call), kernels)
CASES = {
    "inner_mixed": (_inner_mixed, [_spec(2), _spec(2)],
                    lambda a, b, c: [(a, b), (c, a)], 2),
    "outer_rank3": (_outer_rank3, [_spec(3, last=8), _spec(1, last=8)],
                    lambda a, b, c: [(a, b, 8), (8,)], 2),
    "rank1": (_rank1, [_spec(1), _spec(1)], lambda a, b, c: [(a,), (b,)], 2),
    "broadcast_part": (_broadcast_part, [_spec(2), _spec(1)], lambda a, b, c: [(a, b), (b,)], 1),
    "two_concats": (_two_concats, [_spec(2), _spec(2)], lambda a, b, c: [(a, b), (a, b)], None),
    "softmax_of_concat": (_concat_then_row_reduce, [_spec(2), _spec(2)],
                          lambda a, b, c: [(a, b), (a, c)], 3),
    "result_and_consumer": (_result_and_consumer, [_spec(2), _spec(2)],
                            lambda a, b, c: [(a, b), (c, b)], 1),
}

_DIMS = [(2, 3, 4), (1, 1, 1), (5, 7, 2), (3, 0, 2), (4, 9, 1), (0, 2, 3)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_concat_read_in_place_matches_tf(name):
    fn, specs, shapes, kernels = CASES[name]
    tf_fn = tf.function(fn, input_signature=specs)
    disc_tf.reset_stats()
    jitted = compiled(tf_fn)
    (cluster,) = jitted.report.compiled
    if kernels is not None:
        assert cluster.kernels == kernels, jitted.report
    rng = np.random.default_rng(3)
    for dims in _DIMS:
        args = [random_value(rng, s, F32) for s in shapes(*dims)]
        assert_same(tf_fn(*args), jitted(*args), F32)
    assert disc_tf.stats()["fallbacks"] == 0


def test_concat_feeding_matmul_is_materialized_once():
    """A GEMM needs the concatenation in memory: one loop kernel writes it."""
    tf_fn = tf.function(lambda x, y, w: tf.matmul(tf.concat([x, tf.exp(y)], 1), w),
                        input_signature=[_spec(2, last=3), _spec(2, last=5), _spec(2, last=None)])
    jitted = compiled(tf_fn)
    (cluster,) = jitted.report.compiled
    assert cluster.kernels == 3, jitted.report  # exp, the concat copy, the GEMM
    rng = np.random.default_rng(4)
    for m, n in [(2, 4), (1, 1), (7, 3), (0, 2), (5, 0)]:
        args = [random_value(rng, (m, 3), F32), random_value(rng, (m, 5), F32),
                random_value(rng, (8, n), F32)]
        np.testing.assert_allclose(jitted(*args), tf_fn(*args), rtol=1e-4, atol=1e-5)


def test_outer_and_inner_concat_in_one_kernel():
    """One concatenation along rows and one along columns read by the same kernel."""
    def fn(x, y, u, v):
        return tf.concat([x, y], axis=0) * tf.concat([u, tf.exp(v)], axis=1)

    tf_fn = tf.function(fn, input_signature=[_spec(2, last=4), _spec(2, last=4),
                                             _spec(2, last=1), _spec(2, last=3)])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(5)
    for a, b in [(2, 3), (1, 1), (4, 0), (0, 3), (3, 5)]:
        args = [random_value(rng, s, F32) for s in [(a, 4), (b, 4), (a + b, 1), (a + b, 3)]]
        assert_same(tf_fn(*args), jitted(*args), F32)


def test_int_concat_along_middle_dim():
    tf_fn = tf.function(lambda x: tf.concat([x * 2, x[:, ::-1], x + 1], axis=1) - 3,
                        input_signature=[_spec(3, I32)])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(6)
    for shape in [(2, 3, 4), (1, 1, 1), (3, 0, 2), (2, 5, 1), (4, 2, 3)]:
        x = random_value(rng, shape, I32)
        assert_same(tf_fn(x), jitted(x), I32)
