"""Long reductions are as accurate as TF's at every length.

A float accumulator folded left to right stops growing once the partial sum is
large (2^24 ones sum to 2^24); disc_tf folds in blocks combined pairwise (sums),
in double (products of floats) or with a compensated running sum (cumsum). Each
case compares with a float64 reference: disc_tf's error must be within ``RTOL``
of it (even where TF's is not: TF's softmax over a 2^24 row, its column sums,
products and cumsum are further off), and where TF is within ``RTOL`` disc_tf
must also match TF to ``RTOL``. Each case asserts that the reduction ran inside
a compiled cluster, with no fallback.

The lengths up to 2^28 elements and whole-tensor reductions of 10^8 elements run
in the slow suite (``-m slow``).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from tests.harness import assert_ops_compiled, compiled

RTOL = 1e-5


def _rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """Largest elementwise error relative to the reference's magnitude there."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    return float(np.max(np.abs(got - ref) / np.maximum(np.abs(ref), 1e-30)))


def _check(fn, specs: list[tf.TensorSpec], args: list[np.ndarray], ref64: np.ndarray, ops: set[str],
           rtol: float = RTOL) -> None:
    """disc_tf's ``fn(*args)`` against float64 ``ref64`` and against TF (see module doc)."""
    tf_fn = tf.function(fn, input_signature=specs)
    jitted = compiled(tf_fn)
    assert_ops_compiled(jitted, ops)
    disc_tf.reset_stats()
    got = np.asarray(jitted(*args))
    assert disc_tf.stats()["fallbacks"] == 0
    want = np.asarray(tf_fn(*args))
    assert got.dtype == want.dtype and got.shape == want.shape
    err_disc, err_tf = _rel_err(got, ref64), _rel_err(want, ref64)
    assert err_disc <= rtol, f"disc_tf error {err_disc:.3g} (TF's {err_tf:.3g})"
    if err_tf <= rtol:
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol)


def _uniform(rng: np.random.Generator, shape: tuple, dtype=np.float32) -> np.ndarray:
    return rng.random(shape, dtype=np.float32).astype(dtype)


# ---- the cases: a mean over a whole tensor


@pytest.mark.parametrize("shape", [(4, 64, 768), (32, 512, 768), (64, 512, 768)])
def test_mean_of_whole_tensor(shape):
    spec = [tf.TensorSpec([None, None, 768], tf.float32)]
    x = np.ones(shape, np.float32)
    _check(lambda x: tf.reduce_mean(x * 1.0 + 0.5), spec, [x], np.float64(1.5), {"Mean"})
    y = _uniform(np.random.default_rng(len(shape) + shape[0]), shape)
    ref = np.mean(y.astype(np.float64) * 1.0 + 0.5)
    _check(lambda x: tf.reduce_mean(x * 1.0 + 0.5), spec, [y], ref, {"Mean"})


# ---- rows (stitch kernels), columns and whole tensors (reduce kernels), default suite


def test_sum_and_mean_of_long_rows():
    x = _uniform(np.random.default_rng(1), (2, 2**24))
    spec = [tf.TensorSpec([None, None], tf.float32)]
    ref = x.astype(np.float64).sum(-1)
    _check(lambda x: tf.reduce_sum(x, -1), spec, [x], ref, {"Sum"})
    _check(lambda x: tf.reduce_mean(x, -1, keepdims=True), spec, [x], ref[:, None] / 2**24,
           {"Mean"})
    # 1 + 2^-10: a float running sum loses the 2^-10 of every element once it
    # passes 2^15 (relative error 1e-3); pairwise, every partial sum is exact.
    y = np.full((1, 2**24), 1 + 2**-10, np.float32)
    _check(lambda x: tf.reduce_sum(x, -1), spec, [y], np.array([2**24 + 2**14], np.float64), {"Sum"})


def test_softmax_and_layer_norm_over_a_long_row():
    rng = np.random.default_rng(2)
    x = (_uniform(rng, (1, 2**22)) * 4.0).astype(np.float32)
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    spec = [tf.TensorSpec([None, None], tf.float32)]
    _check(lambda x: tf.nn.softmax(x), spec, [x], e / e.sum(-1, keepdims=True), {"Softmax"})
    mean = x64.mean(-1, keepdims=True)
    var = ((x64 - mean) ** 2).mean(-1, keepdims=True)
    ref = (x64 - mean) / np.sqrt(var + 1e-5)

    def layer_norm(x):
        m = tf.reduce_mean(x, -1, keepdims=True)
        v = tf.reduce_mean(tf.math.squared_difference(x, m), -1, keepdims=True)
        return (x - m) * tf.math.rsqrt(v + 1e-5)

    # elementwise relative error of values near zero is noise: compare where |ref| > 0.1
    tf_fn = tf.function(layer_norm, input_signature=spec)
    jitted = compiled(tf_fn)
    assert_ops_compiled(jitted, {"Mean", "SquaredDifference", "Rsqrt"})
    got, want = np.asarray(jitted(x)), np.asarray(tf_fn(x))
    big = np.abs(ref) > 0.1
    assert _rel_err(got[big], ref[big]) <= max(RTOL, _rel_err(want[big], ref[big]))


def test_sums_over_long_columns_and_whole_tensors():
    rng = np.random.default_rng(3)
    x = _uniform(rng, (2**24, 2))
    spec = [tf.TensorSpec([None, None], tf.float32)]
    _check(lambda x: tf.reduce_sum(x, 0), spec, [x], x.astype(np.float64).sum(0), {"Sum"})
    _check(lambda x: tf.reduce_sum(x), spec, [x], x.astype(np.float64).sum(), {"Sum"})
    _check(lambda x: tf.reduce_sum(x * 2.0, 0), spec, [np.full((2**20, 3), 1 + 2**-10, np.float32)],
           np.full(3, 2 * (2**20 + 2**10), np.float64), {"Sum"})
    y = _uniform(rng, (3, 2**22, 2))
    spec3 = [tf.TensorSpec([None, None, None], tf.float32)]
    _check(lambda x: tf.reduce_sum(x * 2.0, [0, 1]), spec3, [y],
           (y.astype(np.float64) * 2.0).sum((0, 1)), {"Sum"})


@pytest.mark.parametrize("axes,shape", [([0], (50000, 37)), ([0, 1], (40, 3000, 9)),
                                        ([1], (7, 30000, 64)), ([0, 2], (50, 9, 700, 33))],
                         ids=str)
@pytest.mark.parametrize("op", ["Sum", "Mean", "Max", "Prod"])
def test_column_reductions(op, axes, shape):
    """The innermost dim kept: blocks of contiguous columns a task (and the strided
    version for a transposed read)."""
    rng = np.random.default_rng(len(shape) * 7 + len(op))
    x = _uniform(rng, shape)
    if op == "Prod":  # factors x * 1.5 + 0.25 within 1e-3 of 1: a finite product
        x = ((1.0 + (x - 0.5) * 2e-3 - 0.25) / 1.5).astype(np.float32)
    fn = {"Sum": tf.reduce_sum, "Mean": tf.reduce_mean, "Max": tf.reduce_max,
          "Prod": tf.reduce_prod}[op]
    v = (x * np.float32(1.5) + np.float32(0.25)).astype(np.float64)  # as float32 computes it
    ref = {"Sum": np.sum, "Mean": np.mean, "Max": np.max, "Prod": np.prod}[op](v, axis=tuple(axes))
    spec = [tf.TensorSpec([None] * len(shape), tf.float32)]
    _check(lambda x: fn(x * 1.5 + 0.25, axis=axes), spec, [x], ref, {op})
    if len(shape) == 2:  # a transposed read: not contiguous along the kept dim
        _check(lambda x: fn(tf.transpose(x) * 1.5 + 0.25, axis=axes), spec, [x.T.copy()], ref, {op})


def test_long_products():
    rng = np.random.default_rng(4)
    x = (1.0 + (_uniform(rng, (2, 2**22)) - 0.5) * 1e-5).astype(np.float32)
    spec = [tf.TensorSpec([None, None], tf.float32)]
    _check(lambda x: tf.reduce_prod(x, -1), spec, [x], np.prod(x.astype(np.float64), -1), {"Prod"})
    _check(lambda x: tf.reduce_prod(x, 0), spec, [x.T.copy()], np.prod(x.astype(np.float64), -1),
           {"Prod"})
    c = np.full((1, 2**22), np.float32(1.0000001))
    _check(lambda x: tf.reduce_prod(x), spec, [c], np.prod(c.astype(np.float64)), {"Prod"})


@pytest.mark.parametrize("exclusive,reverse", [(False, False), (True, True)])
def test_long_cumsum(exclusive, reverse):
    x = _uniform(np.random.default_rng(5), (2, 2**24))
    x64 = x.astype(np.float64)
    ref = np.cumsum(x64[:, ::-1] if reverse else x64, -1)
    if reverse:
        ref = ref[:, ::-1]
    if exclusive:
        ref = ref - x64
    spec = [tf.TensorSpec([None, None], tf.float32)]
    keep = slice(None, -1) if (exclusive and reverse) else slice(None)  # drop the exact 0

    def fn(x):
        return tf.cumsum(x, -1, exclusive=exclusive, reverse=reverse)[:, keep]

    _check(fn, spec, [x], ref[:, keep], {"Cumsum"})


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16], ids=lambda d: d.name)
def test_half_types_accumulate_in_float(dtype):
    rng = np.random.default_rng(6)
    x = _uniform(rng, (2, 2**20), dtype.as_numpy_dtype)
    x64 = x.astype(np.float64)
    spec = [tf.TensorSpec([None, None], dtype)]
    rtol = 2.0 ** -(11 if dtype == tf.float16 else 8)  # one rounding of the result
    # f16 cannot hold a sum of 2^20 values near 0.5: the mean, and a short cumsum
    _check(lambda x: tf.reduce_mean(x, -1), spec, [x], x64.mean(-1), {"Mean"}, rtol)
    _check(lambda x: tf.reduce_mean(x, 0), spec, [x.T.copy()], x64.mean(-1), {"Mean"}, rtol)
    y = x[:, :4000]
    ref = np.cumsum(y.astype(np.float64), -1)
    _check(lambda x: tf.cumsum(x, -1), spec, [y], ref, {"Cumsum"}, rtol)


def test_integer_sums_are_exact():
    x = np.random.default_rng(7).integers(-1000, 1000, (3, 2**22)).astype(np.int64)
    tf_fn = tf.function(lambda x: tf.reduce_sum(x, -1) + tf.reduce_sum(x, 0)[:3],
                        input_signature=[tf.TensorSpec([None, None], tf.int64)])
    jitted = compiled(tf_fn)
    assert_ops_compiled(jitted, {"Sum"})
    np.testing.assert_array_equal(jitted(x), x.sum(-1) + x.sum(0)[:3])


# ---- the long ones


@pytest.mark.slow
def test_row_of_2_28_elements():
    x = _uniform(np.random.default_rng(8), (1, 2**28))
    ref = sum(x[:, i:i + 2**24].astype(np.float64).sum(-1) for i in range(0, 2**28, 2**24))
    spec = [tf.TensorSpec([None, None], tf.float32)]
    _check(lambda x: tf.reduce_sum(x, -1), spec, [x], ref, {"Sum"})
    cols = x.reshape(2**26, 4)
    ref_cols = sum(cols[i:i + 2**22].astype(np.float64).sum(0) for i in range(0, 2**26, 2**22))
    _check(lambda x: tf.reduce_sum(x * 1.0 + 0.5, 0), spec, [cols], ref_cols + 0.5 * 2**26, {"Sum"})
    ones = np.ones((1, 2**28), np.float32)
    _check(lambda x: tf.reduce_mean(x, -1), spec, [ones], np.ones(1), {"Mean"})


@pytest.mark.slow
def test_whole_tensor_of_10_8_elements():
    x = _uniform(np.random.default_rng(9), (10**4, 10**4))
    ref = x.astype(np.float64).sum()
    spec = [tf.TensorSpec([None, None], tf.float32)]
    _check(lambda x: tf.reduce_sum(x), spec, [x], ref, {"Sum"})
    _check(lambda x: tf.reduce_mean(x * 2.0 + 1.0), spec, [x], 2.0 * ref / 1e8 + 1.0, {"Mean"})


@pytest.mark.slow
def test_long_cumsum_of_ones():
    x = np.ones((1, 2**25), np.float32)
    spec = [tf.TensorSpec([None, None], tf.float32)]
    _check(lambda x: tf.cumsum(x, -1), spec, [x], np.arange(1, 2**25 + 1, dtype=np.float64)[None],
           {"Cumsum"})
