"""Transpose, Reshape, ExpandDims and Squeeze inside clusters, against TF at
random shapes (zero-size and size-1 dims included); fusion of transposed reads;
reshape element-count errors; the attention head split/merge pattern."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from disc_tf.dhlo_bridge.lower import lower_cluster, parse_and_verify
from disc_tf.fusion.dhlo_reader import read_module
from disc_tf.fusion.shape_analysis import analyze
from tests.harness import assert_same, compiled, random_value
from tests.stage_helpers import cluster_of, dyn

F32, I32, BOOL = tf.float32, tf.int32, tf.bool
DTYPES = [F32, I32, BOOL]


def _around(dtype):
    """An elementwise op of ``dtype`` (so a layout op is not alone in its cluster)."""
    if dtype == BOOL:
        return tf.logical_not
    return lambda v: v * 2 + 1


def _shapes(rng, rank, count=6):
    out = [tuple(int(rng.integers(1, 6)) for _ in range(rank)) for _ in range(count - 2)]
    out.append(tuple([0] + [3] * (rank - 1)))
    out.append(tuple([1] * rank))
    return out


def _check(tf_fn, jitted, args, dtype):
    assert_same(tf_fn(*args), jitted(*args), dtype)


PERMS = [[1, 0, 2], [2, 0, 1], [0, 2, 1], [2, 1, 0]]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("perm", PERMS, ids=str)
def test_transpose(perm, dtype):
    f = _around(dtype)
    tf_fn = tf.function(lambda x: f(tf.transpose(f(x), perm)),
                        input_signature=[dyn(3, dtype)])
    disc_tf.reset_stats()
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(sum(perm))
    for shape in _shapes(rng, 3):
        _check(tf_fn, jitted, [random_value(rng, shape, dtype)], dtype)
    assert disc_tf.stats()["fallbacks"] == 0


def test_transpose_then_elementwise_is_one_kernel():
    tf_fn = tf.function(lambda x: tf.transpose(x, [1, 0, 2]) * 2 + 1,
                        input_signature=[dyn(3)])
    jitted = compiled(tf_fn)
    (cluster,) = jitted.report.compiled
    assert cluster.kernels == 1, jitted.report
    rng = np.random.default_rng(1)
    for shape in _shapes(rng, 3) + [(3, 70, 5)]:
        _check(tf_fn, jitted, [random_value(rng, shape, F32)], F32)


def test_transpose_with_broadcast_operands():
    # A transposed read and a broadcast read in one kernel, plus a transposed output.
    tf_fn = tf.function(lambda x, b: (tf.transpose(x, [1, 0]) + b, tf.transpose(x * 3.0)),
                        input_signature=[dyn(2), dyn(1)])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(2)
    for m, n in [(2, 3), (1, 1), (0, 4), (4, 0), (5, 7), (3, 1)]:
        for bn in {m, 1}:
            _check(tf_fn, jitted, [random_value(rng, (m, n), F32),
                                   random_value(rng, (bn,), F32)], F32)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape_arg", [[-1], [-1, 4], [2, -1], [-1, 2, 2], [4, -1, 1]], ids=str)
def test_reshape_with_minus_one(shape_arg, dtype):
    f = _around(dtype)
    tf_fn = tf.function(lambda x: f(tf.reshape(f(x), shape_arg)),
                        input_signature=[dyn(2, dtype)])
    disc_tf.reset_stats()
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(len(shape_arg))
    for shape in [(2, 4), (4, 2), (1, 8), (8, 1), (4, 6), (0, 4)]:
        if -1 not in shape_arg[:1] and shape == (0, 4):
            continue  # a zero dim next to -1 leaves nothing to infer
        _check(tf_fn, jitted, [random_value(rng, shape, dtype)], dtype)
    assert disc_tf.stats()["fallbacks"] == 0


def test_reshape_static_shape_and_outputs_own_their_memory():
    # Results that are reshapes of an input or of another result are copies.
    def fn(x):
        y = x * 2.0
        return tf.reshape(x, [3, 4]), y, tf.reshape(y, [2, 6]), tf.reshape(y, [12]) + 1.0

    tf_fn = tf.function(fn, input_signature=[dyn(2)])
    # reshape(x) reads only the input: a TF view on its own, outside the cluster
    jitted = compiled(tf_fn, allow_tf=("Reshape",))
    rng = np.random.default_rng(3)
    for shape in [(3, 4), (2, 6), (1, 12), (12, 1), (6, 2)]:
        _check(tf_fn, jitted, [random_value(rng, shape, F32)], F32)


def test_reshape_element_count_mismatch_is_invalid_argument():
    tf_fn = tf.function(lambda x: tf.reshape(x * 2.0, [2, 3]) + 1.0, input_signature=[dyn(1)])
    jitted = compiled(tf_fn)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="Reshape.*Input to reshape is a tensor with 5 values, but the "
                             "requested shape has 6"):
        jitted(np.ones(5, np.float32))
    _check(tf_fn, jitted, [np.arange(6, dtype=np.float32)], F32)


def test_reshape_minus_one_must_divide():
    tf_fn = tf.function(lambda x: tf.reshape(x * 2.0, [-1, 4]) + 1.0, input_signature=[dyn(2)])
    jitted = compiled(tf_fn)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="tensor with 9 values, but the requested shape requires a "
                             "multiple of 4"):
        jitted(np.ones((3, 3), np.float32))
    _check(tf_fn, jitted, [np.ones((2, 6), np.float32)], F32)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("axis", [0, 1, -1, -3], ids=str)
def test_expand_dims(axis, dtype):
    f = _around(dtype)
    tf_fn = tf.function(lambda x: f(tf.expand_dims(f(x), axis)), input_signature=[dyn(2, dtype)])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(axis + 5)
    for shape in _shapes(rng, 2):
        _check(tf_fn, jitted, [random_value(rng, shape, dtype)], dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("dims", [[1], [-2], [0, 1]], ids=str)
def test_squeeze_listed_dims(dims, dtype):
    f = _around(dtype)
    tf_fn = tf.function(lambda x: f(tf.squeeze(f(x), dims)),
                        input_signature=[tf.TensorSpec([None, 1, None], dtype)
                                         if 0 not in dims else tf.TensorSpec([1, 1, None], dtype)])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(len(dims))
    lead = [1] if 0 in dims else [0, 1, 3, 2, 5]
    for n, last in zip(lead * 5, [4, 1, 3, 0, 2]):
        _check(tf_fn, jitted, [random_value(rng, (n, 1, last), dtype)], dtype)


def test_squeeze_dynamic_dim_is_checked():
    tf_fn = tf.function(lambda x: tf.squeeze(x * 2.0, [1]) + 1.0, input_signature=[dyn(3)])
    jitted = compiled(tf_fn)
    with pytest.raises(tf.errors.InvalidArgumentError):
        jitted(np.ones((2, 3, 4), np.float32))
    for shape in [(2, 1, 4), (0, 1, 3), (1, 1, 1), (3, 1, 0), (4, 1, 2)]:
        _check(tf_fn, jitted, [np.random.default_rng(0).standard_normal(shape).astype(np.float32)],
               F32)


def test_squeeze_without_dims_uses_static_ones():
    tf_fn = tf.function(lambda x: tf.squeeze(x) * 2.0 + 1.0,
                        input_signature=[tf.TensorSpec([3, 1, 4, 1], F32)])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(7)
    for _ in range(5):
        _check(tf_fn, jitted, [random_value(rng, (3, 1, 4, 1), F32)], F32)


H, D, T = 4, 8, 7


def _attention(x, wq, wk, wv):
    """Multi-head self attention with the head split as Reshape + Transpose."""
    def heads(v):  # [B, T, H*D] -> [B, H, T, D]
        return tf.transpose(tf.reshape(v, [-1, T, H, D]), [0, 2, 1, 3])

    q, k, v = (heads(tf.matmul(x, w)) for w in (wq, wk, wv))
    scores = tf.nn.softmax(tf.matmul(q, k, transpose_b=True) * (1.0 / D ** 0.5))
    out = tf.transpose(tf.matmul(scores, v), [0, 2, 1, 3])  # [B, T, H, D]
    return tf.reshape(out, [-1, T, H * D]) + x


def test_attention_head_split_and_merge():
    sig = [tf.TensorSpec([None, T, H * D], F32)] + [tf.TensorSpec([H * D, H * D], F32)] * 3
    tf_fn = tf.function(_attention, input_signature=sig)
    disc_tf.reset_stats()
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(8)
    ws = [random_value(rng, (H * D, H * D), F32) * 0.2 for _ in range(3)]
    for b in [2, 1, 0, 3, 5]:
        args = [random_value(rng, (b, T, H * D), F32)] + ws
        np.testing.assert_allclose(jitted(*args).numpy(), tf_fn(*args).numpy(),
                                   rtol=1e-4, atol=1e-4)
    assert disc_tf.stats()["fallbacks"] == 0


def test_head_split_with_dynamic_batch_only():
    # [B, T, H*D] -> [B*T, H, D] -> [H, B*T, D]: the -1 dim is B*T.
    tf_fn = tf.function(lambda x: tf.transpose(tf.reshape(x * 0.5, [-1, H, D]), [1, 0, 2]) + 1.0,
                        input_signature=[tf.TensorSpec([None, None, H * D], F32)])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(9)
    for shape in [(2, 3, H * D), (1, 1, H * D), (0, 5, H * D), (3, 0, H * D), (4, 6, H * D)]:
        _check(tf_fn, jitted, [random_value(rng, shape, F32)], F32)


# ---- DHLO stage and shape analysis


STAGE_CASES = {
    "transpose": (lambda x: tf.transpose(x, [2, 0, 1]) * 2.0, [dyn(3)], "stablehlo.transpose"),
    "reshape": (lambda x: tf.reshape(x, [-1, 6]) * 2.0, [dyn(2)], "arith.divui"),
    "reshape_static": (lambda x: tf.reshape(x, [2, 3]) * 2.0, [dyn(1)], "dynamic_reshape"),
    "expand_dims": (lambda x: tf.expand_dims(x, -1) * 2.0, [dyn(2)], "dynamic_reshape"),
    "squeeze": (lambda x: tf.squeeze(x, [1]) * 2.0, [dyn(3)], "shape.cstr_eq"),
    "squeeze_static": (lambda x: tf.squeeze(x) * 2.0, [tf.TensorSpec([2, 1, 3], F32)],
                       "dynamic_reshape"),
}


@pytest.mark.parametrize("name", sorted(STAGE_CASES))
def test_layout_lowering_verifies(name):
    fn, specs, expected = STAGE_CASES[name]
    spec = cluster_of(fn, *specs)
    module = lower_cluster(spec)
    assert expected in module.text
    parse_and_verify(module.text)
    analyze(read_module(module.text))  # the analysis knows every op


def test_reshape_analysis_proves_counts_and_defines_minus_one():
    spec = cluster_of(lambda x: tf.transpose(tf.reshape(x, [-1, 5, 2, 3]), [0, 2, 1, 3]) * 3.0,
                      tf.TensorSpec([None, 5, 6], F32))
    analysis = analyze(read_module(lower_cluster(spec).text))
    assert not analysis.checks  # 5 * 6 / 30: the -1 dim is the input's dim 0
    ((operand, result),) = analysis.numel_facts
    assert analysis.symbols.same(result[0], operand[0])

    spec = cluster_of(lambda x: tf.reshape(x, [-1, 4]) * 2.0, dyn(2))
    analysis = analyze(read_module(lower_cluster(spec).text))
    (check,) = analysis.checks
    assert check.kind == "reshape" and check.multiple_of == 4
