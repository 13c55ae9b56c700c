"""GEMM epilogues: the kernel consuming a GEMM's result runs on each block of C
inside the GEMM (RAL ``sgemm_epilogue``). Plans are checked for which kernels
fuse and which must not; outputs against TF at random shapes, including ones
big enough that the GEMM is cut into blocks for the thread pool."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from disc_tf import pipeline
from tests.harness import assert_matches_tf, compiled, random_value
from tests.stage_helpers import cluster_of, dyn

F32 = tf.float32
ROWS = [1, 3, 8, 37, 130, 515]  # 515 x 256 outputs: several blocks per GEMM


def _plan(fn, *specs):
    return pipeline.front_end(cluster_of(fn, *specs)).plan


def _epilogues(plan) -> dict[str, str]:
    kinds = {k.name: k.kind for k in plan.kernels}
    return {k.name: kinds[k.epilogue] for k in plan.kernels if k.epilogue}


def _check(fn, specs, shapes_of, seed, rtol=1e-4, atol=1e-4):
    tf_fn = tf.function(fn, input_signature=specs)
    disc_tf.reset_stats()
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(seed)
    for rows in ROWS:
        args = [random_value(rng, s, F32) for s in shapes_of(rows)]
        assert_matches_tf(tf_fn, jitted, args, rtol, atol)
    assert disc_tf.stats()["fallbacks"] == 0


W = np.random.default_rng(0).standard_normal((96, 256)).astype(np.float32) / 10
B = np.random.default_rng(1).standard_normal(256).astype(np.float32)


def dense_gelu(x):
    y = tf.matmul(x, W) + B
    return 0.5 * y * (1.0 + tf.tanh(0.79788456 * (y + 0.044715 * y * y * y)))


def test_bias_activation_runs_inside_the_gemm():
    plan = _plan(dense_gelu, dyn(2))
    assert _epilogues(plan) == {"kernel0": "loop"}, plan.describe()
    assert "sgemm_epilogue" in pipeline.front_end(cluster_of(dense_gelu, dyn(2))).source
    _check(dense_gelu, [tf.TensorSpec([None, 96], F32)], lambda r: [(r, 96)], seed=1)


def dense_layer_norm(x):
    y = tf.matmul(x, W) + x[:, :1]
    mean = tf.reduce_mean(y, axis=-1, keepdims=True)
    var = tf.reduce_mean(tf.square(y - mean), axis=-1, keepdims=True)
    return (y - mean) * tf.math.rsqrt(var + 1e-6)


def test_row_reduction_runs_on_whole_rows_of_the_gemm():
    plan = _plan(dense_layer_norm, tf.TensorSpec([None, 96], F32))
    assert "stitch" in _epilogues(plan).values(), plan.describe()
    _check(dense_layer_norm, [tf.TensorSpec([None, 96], F32)], lambda r: [(r, 96)], seed=2)


def scores_softmax(q, k):
    return tf.nn.softmax(tf.matmul(q, k, transpose_b=True) * 0.125, axis=-1)


def test_batched_scores_and_softmax():
    specs = [dyn(4), dyn(4)]
    assert "stitch" in _epilogues(_plan(scores_softmax, *specs)).values()
    _check(scores_softmax, specs, lambda r: [(2, 3, r % 97 + 1, 16), (2, 3, r % 89 + 2, 16)],
           seed=3)


V = np.random.default_rng(2).standard_normal((96, 96)).astype(np.float32) / 10


def residual_on_the_gemm_input(x):
    t = tf.tanh(x)  # a temp that is the GEMM's A and dies in the epilogue's kernel
    return tf.nn.relu(tf.matmul(t, V)) + t


def test_consumer_writing_over_the_gemm_input_is_not_an_epilogue():
    plan = _plan(residual_on_the_gemm_input, tf.TensorSpec([None, 96], F32))
    (lib,) = [k for k in plan.kernels if k.kind == "library"]
    consumer = next(k for k in plan.kernels if k.kind == "loop" and any(
        a.buffer == lib.outputs[0][1] for a in k.inputs))
    writes_over_a = any(plan.buffers[b].reuses == lib.inputs[0].buffer for _, b in consumer.outputs)
    # Running it inside the GEMM would overwrite A while other blocks still read it.
    assert not (writes_over_a and lib.epilogue), plan.describe()
    _check(residual_on_the_gemm_input, [tf.TensorSpec([None, 96], F32)], lambda r: [(r, 96)],
           seed=4)


@pytest.mark.parametrize("transpose_b", [False, True])
def test_epilogue_reading_a_second_input_and_broadcasts(transpose_b):
    def fn(x, w, r):
        return tf.sigmoid(tf.matmul(x, w, transpose_b=transpose_b)) * r

    specs = [dyn(2), dyn(2), dyn(2)]
    assert _epilogues(_plan(fn, *specs)) == {"kernel0": "loop"}

    def shapes(rows):
        w = (40, 24) if transpose_b else (24, 40)
        return [(rows, 24), w, (rows if rows % 2 else 1, 40)]  # r broadcast on odd calls

    _check(fn, specs, shapes, seed=5)


WQ = np.random.default_rng(3).standard_normal((64, 4, 16)).astype(np.float32) / 8
BQ = np.random.default_rng(4).standard_normal((4, 16)).astype(np.float32)


def head_projection(x):
    """Einsum into heads, [b, s, 64] @ [64, 4 * 16] seen as [b, s, 4, 16], plus a bias:
    the consumer reads a view of C whose rows (16) split C's rows (64) evenly."""
    return tf.nn.relu(tf.einsum("bsh,hnd->bsnd", x, WQ) + BQ)


def test_consumer_of_a_view_of_the_gemm_result():
    plan = _plan(head_projection, dyn(3))
    (lib,) = [k for k in plan.kernels if k.kind == "library"]
    assert lib.epilogue and lib.epilogue_full_rows, plan.describe()
    _check(head_projection, [tf.TensorSpec([None, None, 64], F32)],
           lambda r: [(r % 3 + 1, r, 64)], seed=6)
