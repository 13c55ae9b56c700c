"""An allocation too large for the machine is a ResourceExhausted error, not a crash."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import disc_tf


def test_huge_broadcast_output_is_resource_exhausted_then_next_call_works():
    f = tf.function(lambda x, y: tf.tanh(x + y) * 2.0,
                    input_signature=[tf.TensorSpec([None, None], tf.float32)] * 2)
    jitted = disc_tf.jit(f)
    assert jitted.report.compiled
    x = np.ones((1_000_000, 1), np.float32)
    y = np.ones((1, 1_000_000), np.float32)  # the output would need 4 TB
    with pytest.raises(tf.errors.ResourceExhaustedError, match="DiscCluster"):
        jitted(x, y)
    got = jitted(x[:3], y[:, :4])
    np.testing.assert_allclose(got.numpy(), f(x[:3], y[:, :4]).numpy(), rtol=1e-6)
