"""Every elementwise op of the foundation slice, against TF, at random shapes
(size-1 broadcast dims and zero-size dims included), ranks 0-6, several dtypes.
Each op is compiled once and must never recompile or fall back."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from tests.harness import assert_same, broadcast_shapes, compiled, gpu_code_path, random_value

raw = tf.raw_ops

BINARY = {
    "Add": lambda x, y: raw.Add(x=x, y=y),
    "AddV2": lambda x, y: raw.AddV2(x=x, y=y),
    "Sub": lambda x, y: raw.Sub(x=x, y=y),
    "Mul": lambda x, y: raw.Mul(x=x, y=y),
    "RealDiv": lambda x, y: raw.RealDiv(x=x, y=y),
    "Maximum": lambda x, y: raw.Maximum(x=x, y=y),
    "Minimum": lambda x, y: raw.Minimum(x=x, y=y),
    "Pow": lambda x, y: raw.Pow(x=x, y=y),
}
COMPARE = {
    "Equal": lambda x, y: raw.Equal(x=x, y=y),
    "NotEqual": lambda x, y: raw.NotEqual(x=x, y=y),
    "Less": lambda x, y: raw.Less(x=x, y=y),
    "LessEqual": lambda x, y: raw.LessEqual(x=x, y=y),
    "Greater": lambda x, y: raw.Greater(x=x, y=y),
    "GreaterEqual": lambda x, y: raw.GreaterEqual(x=x, y=y),
}
UNARY = {
    "Exp": lambda x: raw.Exp(x=x), "Log": lambda x: raw.Log(x=x),
    "Tanh": lambda x: raw.Tanh(x=x), "Sigmoid": lambda x: raw.Sigmoid(x=x),
    "Relu": lambda x: raw.Relu(features=x), "Rsqrt": lambda x: raw.Rsqrt(x=x),
    "Sqrt": lambda x: raw.Sqrt(x=x), "Neg": lambda x: raw.Neg(x=x),
    "Abs": lambda x: raw.Abs(x=x), "Square": lambda x: raw.Square(x=x),
}
FLOAT_ONLY = {"RealDiv", "Pow", "Exp", "Log", "Tanh", "Sigmoid", "Rsqrt", "Sqrt"}
POSITIVE = {"Log", "Rsqrt", "Sqrt", "Pow"}

DTYPES = [tf.float32, tf.float16, tf.int32]


def _check(fn, dtypes, ranks, seed, count=6, positive=False, **shape_kw):
    sig = [tf.TensorSpec([None] * r, d) for r, d in zip(ranks, dtypes)]
    tf_fn = tf.function(fn, input_signature=sig)
    disc_tf.reset_stats()
    jitted = compiled(tf_fn)
    built = disc_tf.stats()
    assert built["compilations"] + built["cache_hits"] == len(jitted.report.compiled)
    rng = np.random.default_rng(seed)
    for shapes in broadcast_shapes(rng, list(ranks), count, **shape_kw):
        args = [random_value(rng, s, d, positive) for s, d in zip(shapes, dtypes)]
        assert_same(tf_fn(*args), jitted(*args), dtypes[-1])
    after = disc_tf.stats()
    assert after["compilations"] == built["compilations"], "recompiled for a new shape"
    assert after["fallbacks"] == 0
    return jitted


def _op_dtypes(ops):
    """(op, dtype) pairs for which TF itself has a CPU kernel."""
    return [
        pytest.param(op, d, id=f"{op}-{d.name}")
        for op in sorted(ops) for d in DTYPES
        if not (op in FLOAT_ONLY and d.is_integer)
    ]


@pytest.mark.parametrize("op,dtype", _op_dtypes(BINARY))
def test_binary(op, dtype):
    _check(lambda x, y: BINARY[op](x, y), [dtype, dtype], (2, 1), seed=len(op),
           positive=op in POSITIVE)


@pytest.mark.parametrize("op,dtype", _op_dtypes(UNARY))
def test_unary(op, dtype):
    _check(lambda x: UNARY[op](x), [dtype], (3,), seed=7, positive=op in POSITIVE)


@pytest.mark.parametrize("op", sorted(COMPARE))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_compare(op, dtype):
    _check(lambda x, y: COMPARE[op](x, y), [dtype, dtype], (2, 2), seed=3)


@pytest.mark.parametrize("rank", range(7))
def test_ranks_0_to_6(rank):
    """A fused chain with a broadcast operand at every rank."""
    def fn(x, y):
        return tf.tanh(x * y + 1.0) - tf.maximum(x, y)

    _check(fn, [tf.float32, tf.float32], (rank, max(rank - 1, 0)), seed=rank, count=5)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_select_v2_broadcasts_all_operands(dtype):
    def fn(c, x, y):
        return tf.where(c, x, y)

    _check(fn, [tf.bool, dtype, dtype], (1, 2, 2), seed=11)


def test_select_v1_with_vector_condition_picks_rows():
    def fn(c, x, y):
        return raw.Select(condition=c, x=x * 2.0, y=y)

    sig = [tf.TensorSpec([None], tf.bool), tf.TensorSpec([None, None], tf.float32),
           tf.TensorSpec([None, None], tf.float32)]
    tf_fn = tf.function(fn, input_signature=sig)
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(5)
    for rows, cols in [(3, 4), (1, 5), (0, 2), (6, 1), (4, 4)]:
        args = [rng.random(rows) < 0.5, rng.standard_normal((rows, cols)).astype(np.float32),
                rng.standard_normal((rows, cols)).astype(np.float32)]
        assert_same(tf_fn(*args), jitted(*args), tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="must be equal"):
        jitted(args[0], args[1], args[2][:, :1])


CASTS = [(tf.float32, tf.int32), (tf.int32, tf.float32), (tf.float32, tf.float16),
         (tf.float16, tf.float32), (tf.float32, tf.bool), (tf.bool, tf.float32),
         (tf.int32, tf.bool), (tf.float16, tf.int32)]


@pytest.mark.parametrize("src,dst", CASTS, ids=lambda d: d.name)
def test_cast(src, dst):
    def fn(x):
        return tf.cast(x, dst)

    _check(fn, [src], (2,), seed=13)


#: Floats whose conversion to an integer C++ leaves undefined (NaN, out of range), next
#: to ordinary ones; as float32, float16 (3e9 and 1e20 are infinities there) and bfloat16.
_UNDEFINED_IN_CXX = [np.nan, np.inf, -np.inf, 3e9, -3e9, 1e20, -1e20, 2147483520.0,
                     -2147483648.0, 2.5, -2.5, 0.75, -0.0, 65504.0]


def _gpu_cast(values: np.ndarray, dst: tf.DType) -> np.ndarray:
    """What a GPU's conversion (and TF's GPU Cast) gives: saturated, NaN to 0."""
    info = np.iinfo(dst.as_numpy_dtype)
    wide = values.astype(np.float64)
    out = np.zeros(wide.shape, dst.as_numpy_dtype)  # NaN: 0
    limit = -float(info.min)  # 2^31 or 2^63: the first value out of range above
    inside = (wide >= info.min) & (wide < limit)
    out[inside] = np.trunc(wide[inside]).astype(dst.as_numpy_dtype)
    out[wide >= limit] = info.max
    out[wide < info.min] = info.min
    return out


@pytest.mark.parametrize("dst", [tf.int32, tf.int64], ids=lambda d: d.name)
@pytest.mark.parametrize("src", [tf.float32, tf.float16, tf.bfloat16], ids=lambda d: d.name)
def test_float_to_int_cast_of_nan_and_out_of_range_values_matches_tf(src, dst):
    """TF's CPU Cast gives the integer type's most negative value for NaN and for values
    out of its range (x86's truncating conversion); cast back to float, GCC had folded the
    pair into truncf, which kept NaN and the out-of-range value."""
    def fn(x):
        narrow = tf.cast(x * 1.0, src)
        as_int = tf.cast(narrow, dst)
        return as_int + 1, tf.cast(as_int, tf.float32), tf.cast(tf.cast(narrow, dst), src)

    tf_fn = tf.function(fn, input_signature=[tf.TensorSpec([None], tf.float32)])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(3)
    special = np.array(_UNDEFINED_IN_CXX, np.float32)
    for x in (special, rng.permutation(np.concatenate([special, rng.standard_normal(50) * 1e3]))
              .astype(np.float32)):
        got = [np.asarray(v) for v in jitted(x)]
        if gpu_code_path():
            narrow = np.asarray(tf.cast(x, src), np.float32)
            as_int = _gpu_cast(narrow, dst)
            want = [as_int + 1, as_int.astype(np.float32),
                    np.asarray(tf.cast(as_int, src))]
        else:
            want = [np.asarray(v) for v in tf_fn(x)]
        for w, g in zip(want, got):
            assert w.dtype == g.dtype
            np.testing.assert_array_equal(g.astype(np.float64), w.astype(np.float64))
    assert disc_tf.stats()["fallbacks"] == 0

def test_logical_ops():
    def fn(a, b):
        return tf.logical_or(tf.logical_and(a, b), tf.logical_not(b))

    _check(fn, [tf.bool, tf.bool], (2, 1), seed=17)


def test_speculative_and_general_paths_agree_with_tf():
    """Same shapes take the 1-kernel speculative path, broadcasts the general one."""
    def fn(x, residual):
        return residual + tf.sigmoid(x) * tf.tanh(x)

    sig = [tf.TensorSpec([None, None, None], tf.float32)] * 2
    tf_fn = tf.function(fn, input_signature=sig)
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(21)
    pairs = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (1, 3, 4)), ((1, 1, 4), (5, 2, 4)),
             ((3, 1, 2), (3, 4, 2)), ((0, 3, 4), (0, 3, 4)), ((6, 7, 8), (6, 7, 8))]
    for xs, rs in pairs:
        args = [random_value(rng, xs, tf.float32), random_value(rng, rs, tf.float32)]
        assert_same(tf_fn(*args), jitted(*args), tf.float32)


@pytest.mark.parametrize("dtype", [tf.int64, tf.bool], ids=lambda d: d.name)
def test_int64_and_bool_equality_chain(dtype):
    def fn(x, y):
        return tf.logical_or(tf.equal(x, y), tf.not_equal(y, x))

    _check(fn, [dtype, dtype], (3, 1), seed=23)


def test_int64_arithmetic():
    def fn(x, y):
        return tf.maximum(x * y - x, -y) + tf.abs(x)

    _check(fn, [tf.int64, tf.int64], (2, 2), seed=29)


def _same_bits(expected, actual) -> None:
    """Equal bit for bit (zeros' signs included), any NaN equal to any NaN."""
    for e, a in zip(tf.nest.flatten(expected), tf.nest.flatten(actual)):
        e, a = np.asarray(e), np.asarray(a)
        assert e.dtype == a.dtype and e.shape == a.shape
        both_nan = np.isnan(e) & np.isnan(a)
        bits = e.view(np.uint16 if e.itemsize == 2 else np.uint32)
        assert np.array_equal(np.where(both_nan, 0, bits),
                              np.where(both_nan, 0, a.view(bits.dtype))), (e, a)


@pytest.mark.parametrize("dtype", [tf.float32, tf.float16], ids=lambda d: d.name)
def test_max_and_min_against_constants_match_tf_bit_for_bit(dtype):
    """Maximum and minimum against constants, either operand first: NaN, infinities,
    ties and the signs of zeros come out as TF's (an epilogue's ReLU6 is these)."""
    constants = [0.0, -0.0, 6.0, -np.inf, np.inf, np.nan]

    def extrema(x):
        outs = []
        for c in constants:
            k = tf.constant(c, dtype)
            outs += [tf.maximum(x, k), tf.maximum(k, x), tf.minimum(x, k), tf.minimum(k, x)]
        return outs + [tf.nn.relu6(x * 2.0), tf.nn.relu(x - 1.0)]

    jitted = _check(extrema, [dtype], (2,), seed=43)
    special = np.array([[0.0, -0.0, 6.0, -6.0, np.inf, -np.inf, np.nan, 3.0, -2.5, 0.5]],
                       dtype.as_numpy_dtype)
    expected, actual = tf.function(extrema)(special), jitted(special)
    if dtype == tf.float32:
        _same_bits(expected, actual)
    else:  # TF's half kernel gives max(-0, +0) = -0, its float one +0 (as disc does)
        assert_same(expected, actual, dtype)


@pytest.mark.parametrize("dtype", [tf.float32, tf.float16], ids=lambda d: d.name)
def test_constant_exponent_pow_matches_tf(dtype):
    """Exponents -1..4 become multiplies; special values must come out as TF's."""
    def integer_powers(x):
        return (tf.pow(x, 3.0) - tf.pow(x, 2.0), tf.pow(x, 4.0) + tf.pow(x, 1.0),
                tf.pow(x, -1.0))

    jitted = _check(integer_powers, [dtype], (2,), seed=31)
    with np.errstate(over="ignore"):  # 1e30 is inf in float16, as intended
        special = np.array([[0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -1e-30, 3.5, -2.5]],
                           dtype.as_numpy_dtype)
    assert_same(tf.function(integer_powers)(special), jitted(special), dtype)
    _check(lambda x: tf.pow(x, 0.5) * tf.pow(x, 2.0), [dtype], (2,), seed=37, positive=True)
