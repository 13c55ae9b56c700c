"""Every elementwise op of the table on special values -- NaN, both infinities, both
zeros, denormals, the largest floats, halves of rounding ties, the edges of the fast
exp ranges -- against TF, in one compiled cluster: the same NaNs, the same infinities
and signs of zero, the same values (rtol 1e-5). The random-value tests never draw these;
a probe of them found the float-to-int Cast (5a1125c) and the MaxPool rules.

Left out, by design: a logarithm or power of a denormal (TF runs its kernels with
denormals read as zero, so log(1e-45) is -inf there; glibc's logf takes the denormal),
and softmax (see test_reductions' NaN rows and docs/architecture.md)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from tests.harness import compiled, gpu_code_path

SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1e-38, 3e38, -3e38, 88.7, 89.0,
           -87.5, -103.0, -104.0, 0.5, 1.5, 2.5, -0.5, -2.5, 1.0, -1.0, 0.999999, 20.0, -20.0,
           9.5, -9.5, 1e-7, 4.0, 1e6, -1e6, 16777217.0]
DENORMAL_FREE = [v for v in SPECIAL if v == 0 or not 0 < abs(v) < 1.1754944e-38]

UNARY = {
    "Abs": tf.math.abs, "Neg": tf.math.negative, "Exp": tf.math.exp, "Expm1": tf.math.expm1,
    "Sqrt": tf.math.sqrt, "Rsqrt": tf.math.rsqrt, "Tanh": tf.math.tanh, "Sigmoid": tf.math.sigmoid,
    "Erf": tf.math.erf, "Erfc": tf.math.erfc, "Sin": tf.math.sin, "Cos": tf.math.cos,
    "Tan": tf.math.tan, "Floor": tf.math.floor, "Ceil": tf.math.ceil, "Round": tf.math.round,
    "Sign": tf.math.sign, "Reciprocal": tf.math.reciprocal, "Square": tf.math.square,
    "Relu": tf.nn.relu, "Relu6": tf.nn.relu6, "Elu": tf.nn.elu, "Selu": tf.nn.selu,
    "Softplus": tf.math.softplus, "Softsign": tf.nn.softsign, "LeakyRelu": tf.nn.leaky_relu,
    "LeakyRelu2": lambda x: tf.nn.leaky_relu(x, alpha=2.0),
    "IsFinite": lambda x: tf.cast(tf.math.is_finite(x), tf.float32),
    "IsNan": lambda x: tf.cast(tf.math.is_nan(x), tf.float32),
    "ClipByValue": lambda x: tf.clip_by_value(x, -1.0, 1.0),
    "GeluErf": lambda x: tf.nn.gelu(x, approximate=False),
    "GeluTanh": lambda x: tf.nn.gelu(x, approximate=True),
    "Silu": tf.nn.silu, "Square2": lambda x: tf.pow(x, 2.0),
    "CastInt32": lambda x: tf.cast(tf.cast(x, tf.int32), tf.float32),
    "CastInt64": lambda x: tf.cast(tf.cast(x, tf.int64), tf.float32),
}
#: Ops of a logarithm or power: on values without denormals (see the module docstring).
LOG_LIKE = {"Log": tf.math.log, "Log1p": tf.math.log1p, "Pow": lambda x: tf.pow(x, x),
            "PowHalf": lambda x: tf.pow(x, 0.5)}
BINARY = {"Maximum": tf.maximum, "Minimum": tf.minimum, "Div": tf.math.truediv,
          "FloorMod": tf.math.floormod, "FloorDiv": tf.math.floordiv,
          "SquaredDifference": tf.math.squared_difference, "Add": tf.add, "Mul": tf.multiply}


def _check(name: str, want: np.ndarray, got: np.ndarray, x: np.ndarray) -> None:
    assert want.dtype == got.dtype and want.shape == got.shape, name
    # atol 1e-30: TF's kernels flush denormal results (disc's selects keep them), and
    # TF's tanh GELU cancels to -0 where disc's x * sigmoid(2u) gives -6.7e-33 (x = -9.5)
    bad = ~((np.isnan(want) & np.isnan(got))
            | ((want == got) & (np.signbit(want) == np.signbit(got)))
            | np.isclose(got, want, rtol=1e-5, atol=1e-30))
    assert not bad.any(), f"{name}: at {x[bad]} TF {want[bad]}, disc {got[bad]}"


#: Ops whose special cases TF's GPU kernels (and so the GPU path) compute otherwise than
#: TF's CPU ones: a GPU's float-to-int conversion saturates (NaN gives 0; checked in
#: test_elementwise_ops against that rule), and CUDA's powf(-inf, 0.5) is +inf, as C's.
#: A GPU keeps denormals too (TF's CPU kernels read them as zero: ceil(1e-45) is 0 there),
#: so the GPU path takes the values without them.
GPU_OWN = frozenset({"CastInt32", "CastInt64", "PowHalf"})


def _for_target(table: dict) -> list[str]:
    """The names of ``table`` whose ops this code path must compute as TF's CPU does."""
    return sorted(n for n in table if not (gpu_code_path() and n in GPU_OWN))


def _compare_on(fn, names: list[str], values: list[float], seed: int) -> None:
    """Compiles ``fn`` (one output per name) and compares it with TF on ``values``, in
    order and shuffled."""
    tf_fn = tf.function(fn, input_signature=[tf.TensorSpec([None], tf.float32)])
    disc_tf.reset_stats()
    jitted = compiled(tf_fn)
    x = np.array(values, np.float32)
    for sample in (x, np.random.default_rng(seed).permutation(x)):
        for name, want, got in zip(names, tf_fn(sample), jitted(sample)):
            _check(name, np.asarray(want), np.asarray(got), sample)
    assert disc_tf.stats()["fallbacks"] == 0


@pytest.mark.parametrize("table,values", [(UNARY, SPECIAL), (LOG_LIKE, DENORMAL_FREE)],
                         ids=["unary", "log_like"])
def test_unary_ops_on_special_values_match_tf(table, values):
    names = _for_target(table)
    values = DENORMAL_FREE if gpu_code_path() else values
    _compare_on(lambda x: [table[n](x * 1.0) for n in names], names, values, 1)


def test_binary_ops_on_special_values_match_tf():
    """Each op of x and x reversed, x in order and shuffled: pairs of special values."""
    names = _for_target(BINARY)
    _compare_on(lambda x: [BINARY[n](x * 1.0, tf.reverse(x * 1.0, [0])) for n in names],
                names, DENORMAL_FREE, 2)
