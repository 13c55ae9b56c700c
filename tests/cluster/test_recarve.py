"""One op whose lowering fails costs that op, not its cluster: the optimizer
refuses the node (the report says why) and clusters the body again without it.
In strict mode the failing cluster is an error instead."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import disc_tf

SPECS = [tf.TensorSpec([None, None], tf.float32)]


def _fn():
    # A float Range over a cast dim with step 0.1 passes the clustering checks, but its
    # lowering needs steps that are multiples of 2^-8: it refuses the node.
    def fn(x):
        y = tf.exp(x) * 2.0
        ramp = tf.range(0.0, tf.cast(tf.shape(y)[1], tf.float32), 0.1)
        return y * 3.0, tf.tanh(ramp) + 1.0

    return tf.function(fn, input_signature=SPECS)


def test_a_refused_op_is_left_out_and_the_rest_compiles():
    jitted = disc_tf.jit(_fn(), min_cluster_size=1, strict=False)
    clusters = jitted.report.clusters
    assert len(clusters) == 2 and all(c.error is None for c in clusters), clusters
    assert not any(op == "Range" for c in clusters for _, op in c.ops)
    (body,) = jitted.report.unclustered.values()
    assert body["range"].startswith("lowering refused: Range range: constant bounds"), body
    disc_tf.reset_stats()
    rng = np.random.default_rng(0)
    for shape in [(3, 5), (1, 1), (4, 2)]:
        x = rng.standard_normal(shape).astype(np.float32)
        for got, want in zip(jitted(x), _fn()(x)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert disc_tf.stats()["fallbacks"] == 0


def test_strict_mode_raises_on_the_refusal():
    with pytest.raises(disc_tf.StrictModeError, match="multiples of 2"):
        disc_tf.jit(_fn(), min_cluster_size=1, strict=True)
