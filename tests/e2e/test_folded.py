"""Results of kernels that read only weights, kept across calls (cc/ral/folded_values.h,
RAL ABI 10): batch norm's scale and offset computed from four variables are computed by
one call and read by the next ones, until a variable changes. Each case runs in its own
process (DISC_TF_FOLD is read once). The results are compared with TF at several
shapes, strict (no fallback), and after variable assignments: a kept result computed
from a variable's old value would show there."""

from __future__ import annotations

import pytest

from tests import fresh_python

#: The CPU backend's RAL keeps folded results (the CUDA runner computes them every call).
pytestmark = pytest.mark.cpu_backend

_SCRIPT = """
import json
import numpy as np, tensorflow as tf
import disc_tf

rng = np.random.default_rng(5)
c = 24
def v(shape, lo=-1.0, hi=1.0):
    return tf.Variable(rng.uniform(lo, hi, size=shape).astype(np.float32))
gamma, beta, mean, var = v([c]), v([c]), v([c]), v([c], 0.5, 2.0)
w = v([c, 16])

@tf.function(input_signature=[tf.TensorSpec([None, c], tf.float32)])
def bn_dense(x):
    y = tf.nn.batch_normalization(x, mean, var, beta, gamma, 1e-3)
    return tf.nn.relu(tf.matmul(y, w))

jitted = disc_tf.jit(bn_dense, strict=True)
disc_tf.reset_stats()
stats = {}
def check(tag, shapes):
    for shape in shapes:
        x = rng.normal(size=shape).astype(np.float32)
        np.testing.assert_allclose(jitted(x).numpy(), bn_dense(x).numpy(), rtol=1e-4,
                                   atol=1e-5, err_msg=f"{tag} at {shape}")
    stats[tag] = disc_tf.stats()["folded_reuses"]

check("first", [(5, c), (1, c), (37, c), (5, c)])
gamma.assign(rng.uniform(-2, 2, size=[c]).astype(np.float32))  # a new buffer
check("after assign", [(3, c), (64, c)])
var.assign_add(np.full([c], 0.75, np.float32))  # an update in place where TF may
check("after assign_add", [(3, c), (9, c)])
mean.assign_sub(np.full([c], 0.5, np.float32))
beta.assign(beta * 3.0)
check("after two more", [(1, c), (2, c)])
# a variable a training step updates: after 8 misses the kernel runs on every call
for step in range(6):
    gamma.assign_add(np.full([c], 0.01, np.float32))
    check(f"step {step}", [(4, c), (4, c)])

# a weight norm: a reduction over v, then g * v / norm, both from weights only
g2, vv = v([16]), v([c, 16])
@tf.function(input_signature=[tf.TensorSpec([None, c], tf.float32)])
def wn_dense(x):
    return tf.matmul(x, g2 * vv / tf.norm(vv, axis=0))

jitted = disc_tf.jit(wn_dense, strict=True)
bn_dense = wn_dense
packs = {}
def packed(tag):
    packs[tag] = disc_tf.stats()["packed_weights"]
packed("wn before")
check("wn first", [(6, c)])
packed("wn first")
check("wn again", [(2, c), (7, c)])
packed("wn again")
vv.assign_add(rng.uniform(0, 1, size=[c, 16]).astype(np.float32))
check("wn after assign_add", [(5, c)])
packed("wn after assign_add")
check("wn then", [(5, c)])
packed("wn then")
stats["packs"] = packs
stats["fallbacks"] = disc_tf.stats()["fallbacks"]
print("STATS", json.dumps(stats))
"""


def _run(**env_vars: str) -> dict:
    return fresh_python.stats_of(_SCRIPT, drop=("DISC_TF_FOLD",), **env_vars)


def test_weight_only_kernels_are_kept_until_a_variable_changes() -> None:
    """Calls after the first read batch norm's kept scale and offset (folded_reuses
    grows), and every assignment, in place or not, makes the next call compute them
    again: results match TF throughout."""
    stats = _run()
    assert stats["fallbacks"] == 0
    # 4 calls: the compile's first computes, the other 3 reuse
    assert stats["first"] >= 3, stats
    # after each change the first call computes again and the next one reuses
    assert stats["after assign"] - stats["first"] >= 1, stats
    assert stats["after assign_add"] - stats["after assign"] >= 1, stats
    assert stats["after two more"] - stats["after assign_add"] >= 1, stats
    # the misses of steps 0-3 are the 4th to 7th (each step's second call reuses); step
    # 4's is the 8th: from then on the kernel runs on every call
    assert stats["step 3"] - stats["after two more"] == 4, stats
    assert stats["step 5"] == stats["step 4"] == stats["step 3"], stats


def test_kernels_reading_folded_results_fold_too() -> None:
    """A weight norm's reduction and the quotient reading it are both skipped on later
    calls, and computed again once v changes; the GEMM packs the kept quotient as its
    weights once per value."""
    stats = _run()
    per_call = (stats["wn again"] - stats["wn first"]) / 2
    assert per_call >= 2, stats  # the norm and g * v / norm
    assert stats["wn after assign_add"] == stats["wn again"], stats
    assert stats["wn then"] - stats["wn after assign_add"] == per_call, stats
    # the GEMM's weights are the kept g * v / norm: packed once per value of v
    packs = stats["packs"]
    assert packs["wn first"] - packs["wn before"] >= 1, packs
    assert packs["wn again"] == packs["wn first"], packs
    assert packs["wn after assign_add"] == packs["wn again"] + 1, packs
    assert packs["wn then"] == packs["wn after assign_add"], packs


def test_fold_off_computes_every_call() -> None:
    """DISC_TF_FOLD=0: every kernel runs on every call, as before."""
    stats = _run(DISC_TF_FOLD="0")
    assert stats["fallbacks"] == 0
    assert stats["after two more"] == 0, stats
