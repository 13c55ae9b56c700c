"""GEMM epilogues run on C's registers (RAL ABI 11, ``column_epilogue``;
``codegen/cpu_column_epilogue.py``): a bias, a batch norm's scale and offset, ReLU,
ReLU6, clips and residual adds after dense layers and convolutions, strict, against TF at several
shapes (columns that fill no whole vector, a depth past one pass of the block, NaN and
infinity into a clip and a maximum, the sign of each zero a maximum or minimum against
+0 or -0 gives, bit for bit), on each ISA path of the RAL. The counter register_epilogues
proves the launches ran on registers; DISC_TF_REGISTER_EPILOGUE=0 runs the same steps
as a pass over C, which must give the same bits."""

from __future__ import annotations

import pytest

from tests import fresh_python

#: The CPU backend's GEMM blocks run column epilogues (the CUDA runner does not).
pytestmark = pytest.mark.cpu_backend

_SCRIPT = """
import hashlib, json
import numpy as np, tensorflow as tf
import disc_tf

rng = np.random.default_rng(11)
def v(shape, lo=-1.0, hi=1.0):
    return tf.Variable(rng.uniform(lo, hi, size=shape).astype(np.float32))

# dense + bias + ReLU, 37 columns (no whole vector at the end)
w1, b1 = v([19, 37]), v([37])
def relu_dense(x):
    return tf.nn.relu(tf.matmul(x, w1) + b1)
# a depth past one pass of the block (1024), batch norm's scale and offset, ReLU6
w2, s2, o2 = v([1500, 70], -0.05, 0.05), v([70], 0.5, 1.5), v([70])
def relu6_deep(x):
    return tf.nn.relu6(tf.matmul(x, w2) * s2 + o2)
# a subtracted column, then a clip (a minimum, then a maximum)
w3, b3 = v([24, 48]), v([48])
def clipped(x):
    return tf.clip_by_value(tf.matmul(x, w3) - b3, -0.5, 0.5)
# constants: a scale, then a maximum with the constant first
w4 = v([16, 40])
def constant_first(x):
    return tf.maximum(0.25, tf.matmul(x, w4) * 2.0)
# a residual: a step reading a tensor at C's own index
w5, b5 = v([32, 32]), v([32])
def residual(x):
    return tf.nn.relu(tf.matmul(x, w5) + b5 + x)
# not a chain of steps (C subtracted from a column): runs as the generated epilogue
def reversed_sub(x):
    return tf.nn.relu(b5 - tf.matmul(x, w5))
# signed zeros: rows of zeros give C = +0, a negative scale -0, which a maximum or minimum
# against +0 or -0 keeps or turns by TF's rule (compared bit for bit below)
w6 = v([8, 16])
s6 = tf.Variable(np.where(np.arange(16) % 2, -1.5, 2.0).astype(np.float32))
def max_zero(x):
    return tf.maximum(tf.matmul(x, w6) * s6, 0.0)
def min_zero(x):
    return tf.minimum(tf.matmul(x, w6) * s6, 0.0)
def max_minus_zero(x):
    return tf.maximum(tf.matmul(x, w6) * s6, -0.0)
def zero_first_min(x):
    return tf.minimum(0.0, tf.matmul(x, w6) * s6)
# MobileNetV2's layers: a 3x3 stride-2 stem, a 1x1 expansion, a depthwise conv with the
# 1x1 projection reading it, each with a batch norm (scale and offset) and ReLU6, and
# the projection's shortcut (24 columns: narrower than AVX-512 tiles of 2 vectors)
ws, ss, os_ = v([3, 3, 3, 24]), v([24], 0.5, 1.5), v([24])
we, se, oe = v([1, 1, 24, 40]), v([40], 0.5, 1.5), v([40])
wd, sd, od = v([3, 3, 40, 1]), v([40], 0.5, 1.5), v([40])
wp, sp, op_ = v([1, 1, 40, 24]), v([24], 0.5, 1.5), v([24])
def mobile_block(x):
    stem = tf.nn.relu6(tf.nn.conv2d(x, ws, 2, "SAME") * ss + os_)
    y = tf.nn.relu6(tf.nn.conv2d(stem, we, 1, "SAME") * se + oe)
    y = tf.nn.relu6(tf.nn.depthwise_conv2d(y, wd, [1, 1, 1, 1], "SAME") * sd + od)
    return tf.nn.conv2d(y, wp, 1, "SAME") * sp + op_ + stem

cases = {
    "relu_dense": (relu_dense, [None, 19], [(1, 19), (6, 19), (77, 19), (300, 19)]),
    "relu6_deep": (relu6_deep, [None, 1500], [(5, 1500), (40, 1500)]),
    "clipped": (clipped, [None, 24], [(7, 24), (130, 24)]),
    "constant_first": (constant_first, [None, 16], [(3, 16), (61, 16)]),
    "residual": (residual, [None, 32], [(9, 32), (50, 32)]),
    "reversed_sub": (reversed_sub, [None, 32], [(9, 32), (50, 32)]),
    "max_zero": (max_zero, [None, 8], [(9, 8), (20, 8)]),
    "min_zero": (min_zero, [None, 8], [(9, 8), (20, 8)]),
    "max_minus_zero": (max_minus_zero, [None, 8], [(9, 8), (20, 8)]),
    "zero_first_min": (zero_first_min, [None, 8], [(9, 8), (20, 8)]),
    "mobile_block": (mobile_block, [None, None, None, 3],
                     [(1, 17, 23, 3), (2, 40, 32, 3)]),
}
stats, digests = {}, {}
for name, (fn, spec, shapes) in cases.items():
    f = tf.function(fn, input_signature=[tf.TensorSpec(spec, tf.float32)])
    jitted = disc_tf.jit(f, strict=True)
    before = disc_tf.stats()["register_epilogues"]
    h = hashlib.sha256()
    for shape in shapes:
        x = rng.normal(size=shape).astype(np.float32)
        if name in ("clipped", "constant_first"):  # (TF fuses a ReLU after a MatMul
            flat = x.reshape(-1)                    # into oneDNN's, which maps NaN to 0)
            flat[7] = np.nan
            flat[-3] = np.inf
        zeros = "zero" in name
        if zeros:
            x[::3] = 0.0
            x[1, 0] = np.nan
        got, want = jitted(x).numpy(), f(x).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, equal_nan=True,
                                   err_msg=f"{name} at {shape}")
        if zeros:  # the sign of every zero (and every NaN where TF's is)
            assert np.array_equal(np.isnan(got), np.isnan(want)), name
            exact = (want == 0) | np.isnan(want)
            assert np.array_equal(np.signbit(got[want == 0]), np.signbit(want[want == 0])), name
            assert exact.any(), name
        h.update(got.tobytes())
    stats[name] = disc_tf.stats()["register_epilogues"] - before
    digests[name] = h.hexdigest()
stats["fallbacks"] = disc_tf.stats()["fallbacks"]
print("STATS", json.dumps({"launches": stats, "digests": digests}))
"""

#: Cases whose epilogue is a chain of column steps: launches per call on registers.
_CHAINS = {"relu_dense": 1, "relu6_deep": 1, "clipped": 1, "constant_first": 1,
           "residual": 1, "max_zero": 1, "min_zero": 1, "max_minus_zero": 1,
           "zero_first_min": 1, "mobile_block": 3}
_CALLS = {"relu_dense": 4, "relu6_deep": 2, "clipped": 2, "constant_first": 2, "residual": 2,
          "max_zero": 2, "min_zero": 2, "max_minus_zero": 2, "zero_first_min": 2,
          "mobile_block": 2}


def _run(**env_vars: str) -> dict:
    return fresh_python.stats_of(_SCRIPT, drop=("DISC_TF_ISA", "DISC_TF_GEMM_ISA",
                                                "DISC_TF_REGISTER_EPILOGUE"), **env_vars)


@pytest.mark.parametrize("isa", ["", "x86-64-v3"])
def test_column_epilogues_run_on_registers_and_match_tf(isa: str) -> None:
    """Each chain's launches ran on registers (at least the stem, the expansion and the
    projection with its shortcut per MobileNetV2 call); C subtracted from a column did
    not; results match TF and are the bits of the same steps run as a pass over C."""
    env = {"DISC_TF_ISA": isa} if isa else {}
    on = _run(**env)
    launches = on["launches"]
    assert launches.pop("fallbacks") == 0
    for name, per_call in _CHAINS.items():
        assert launches[name] >= per_call * _CALLS[name], (name, launches)
    assert launches["reversed_sub"] == 0, launches
    off = _run(DISC_TF_REGISTER_EPILOGUE="0", **env)
    assert sum(v for k, v in off["launches"].items() if k != "fallbacks") == 0, off
    assert off["digests"] == on["digests"]


def test_baseline_isa_runs_the_steps_as_a_pass() -> None:
    """Without a GEMM block (x86-64), the RAL runs the steps element by element after
    each product: the same results as TF, nothing on registers."""
    stats = _run(DISC_TF_ISA="x86-64")
    launches = stats["launches"]
    assert launches.pop("fallbacks") == 0
    assert sum(launches.values()) == 0, launches
