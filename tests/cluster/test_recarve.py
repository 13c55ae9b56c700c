"""One op whose lowering fails costs that op, not its cluster: the optimizer
refuses the node (the report says why) and clusters the body again without it.
In strict mode the failing cluster is an error instead."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import disc_tf

SPECS = [tf.TensorSpec([None, None], tf.float32), tf.TensorSpec([None], tf.float32)]


def _fn():
    # "ab,b->a" passes the op table's einsum check, but its lowering needs free
    # dims on both sides: it refuses the node.
    return tf.function(lambda x, v: tf.einsum("ab,b->a", tf.exp(x) * 2.0, v) + 1.0,
                       input_signature=SPECS)


def test_a_refused_op_is_left_out_and_the_rest_compiles():
    jitted = disc_tf.jit(_fn(), min_cluster_size=1, strict=False)
    clusters = jitted.report.clusters
    assert len(clusters) == 2 and all(c.error is None for c in clusters), clusters
    assert not any(op == "Einsum" for c in clusters for _, op in c.ops)
    (body,) = jitted.report.unclustered.values()
    assert body["einsum/Einsum"].startswith("lowering refused: Einsum einsum/Einsum: a side "
                                            "without free dims")
    disc_tf.reset_stats()
    rng = np.random.default_rng(0)
    for shape in [(3, 5), (1, 1), (4, 2)]:
        x, v = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(
            shape[1]).astype(np.float32)
        np.testing.assert_allclose(jitted(x, v), _fn()(x, v), rtol=1e-5, atol=1e-6)
    assert disc_tf.stats()["fallbacks"] == 0 and disc_tf.stats()["kernels"] == 2


def test_strict_mode_raises_on_the_refusal():
    with pytest.raises(disc_tf.StrictModeError, match="a side without free dims"):
        disc_tf.jit(_fn(), min_cluster_size=1, strict=True)
