"""Temporaries a kernel keeps (cc/ral/temp_cache.h): a freed temporary of at most 64 KiB
goes to the kernel's cache and a later alloc_temp of about its size takes it, in the
same call or a later one. Each case runs in its own process (the bound is read once):
a MobileNetV2 block and an attention-like chain (GEMMs, softmax, a row reduction, a
layer norm) against TF at shapes that shrink and grow, so that buffers come back with
another call's contents; with DISC_TF_TEMP_POISON=1 every kept buffer is filled with NaN
first, so a kernel reading a temporary before writing it would show in its results."""

from __future__ import annotations

import pytest

from tests import fresh_python

#: The CPU backend's RAL keeps temporaries (the GPU kernel leaves them to TF's allocator).
pytestmark = pytest.mark.cpu_backend

_SCRIPT = """
import json, os
import numpy as np, tensorflow as tf
import disc_tf
from tests.e2e.test_produced_a import Block, _spec

rng = np.random.default_rng(11)
block = Block(8, 6, 16, stride=2)
w1 = tf.constant(rng.normal(size=(32, 48)).astype(np.float32) * 0.2)
w2 = tf.constant(rng.normal(size=(48, 32)).astype(np.float32) * 0.2)

def chain(x):
    h = tf.nn.softmax(tf.matmul(x, w1), axis=-1)
    y = tf.matmul(h, w2) + x
    mean, var = tf.nn.moments(y, axes=[-1], keepdims=True)
    return (y - mean) * tf.math.rsqrt(var + 1e-5) + tf.reduce_max(h, -1, keepdims=True)

cases = [
    (tf.function(block, input_signature=[_spec(8)]),
     [(2, 24, 22, 8), (2, 23, 21, 8), (1, 9, 11, 8), (2, 24, 22, 8), (2, 22, 21, 8)]),
    (tf.function(chain, input_signature=[tf.TensorSpec([None, 32], tf.float32)]),
     [(300, 32), (280, 32), (7, 32), (300, 32), (250, 32)]),
]
disc_tf.reset_stats()
for tf_fn, shapes in cases:
    jitted = disc_tf.jit(tf_fn, strict=True)
    for shape in shapes:
        x = rng.normal(size=shape).astype(np.float32)
        np.testing.assert_allclose(jitted(x).numpy(), tf_fn(x).numpy(), rtol=1e-4, atol=1e-4)
stats = disc_tf.stats()
# one call whose activations are large: 2 x 48 x 44 pixels of 48 channels (811 KiB)
jitted = disc_tf.jit(cases[0][0], strict=True)
x = rng.normal(size=(2, 48, 44, 8)).astype(np.float32)
np.testing.assert_allclose(jitted(x).numpy(), cases[0][0](x).numpy(), rtol=1e-4, atol=1e-4)
stats["kept_after_large_call"] = disc_tf.stats()["temp_kept_bytes"]
stats["peak_temp_bytes"] = disc_tf.stats()["peak_temp_bytes"]
print("STATS", json.dumps(stats))
"""


def _run(**env_vars: str) -> dict:
    return fresh_python.stats_of(_SCRIPT, drop=("DISC_TF_TEMP_",), **env_vars)


def test_kept_temporaries_are_reused_and_results_match_tf() -> None:
    """Calls take kept buffers (temp_reuses), stale and NaN-poisoned ones included, and
    still match TF; what stays kept is counted."""
    stats = _run(DISC_TF_TEMP_POISON="1")
    assert stats["fallbacks"] == 0
    assert stats["temp_reuses"] > 0, stats
    assert stats["temp_kept_bytes"] > 0, stats
    # only buffers of at most 64 KiB are kept: the large call's activations (its peak
    # is over 512 KiB) went back to the allocator
    assert stats["peak_temp_bytes"] > 2**19, stats
    assert 0 < stats["kept_after_large_call"] < 2**18, stats


def test_a_zero_bound_keeps_nothing() -> None:
    """DISC_TF_TEMP_KEEP_MB=0: every temporary comes from TF's allocator, as before."""
    stats = _run(DISC_TF_TEMP_KEEP_MB="0")
    assert stats["fallbacks"] == 0
    assert stats["temp_reuses"] == 0 and stats["temp_kept_bytes"] == 0, stats
