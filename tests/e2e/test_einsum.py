"""Einsum (the forms Keras EinsumDense and MultiHeadAttention emit) and a Keras
attention block, against TF at random shapes."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from disc_tf.dhlo_bridge.rules import einsum_parts
from tests.harness import compiled

CASES = [
    ("abc,cd->abd", [(None, None, 8), (8, 6)]),           # EinsumDense projection
    ("abc,cde->abde", [(None, None, 8), (8, 2, 4)]),       # query/key/value heads
    ("aecd,abcd->acbe", [(None, None, 2, 4), (None, None, 2, 4)]),  # attention scores
    ("acbe,aecd->abcd", [(None, 2, None, None), (None, None, 2, 4)]),  # weighted values
    ("abcd,cde->abe", [(None, None, 2, 4), (2, 4, 5)]),    # output projection
    ("ij,jk->ki", [(None, 3), (3, None)]),
    ("ab,c->abc", [(None, None), (None,)]),                # rotary embeddings' outer product
    ("ab,bc->abc", [(None, 4), (4, None)]),
    ("abc,ca->abc", [(None, None, 3), (3, None)]),         # elementwise, transposed side
    ("a,b->ba", [(None,), (None,)]),
    ("ab,b->a", [(None, 4), (4,)]),                       # matrix-vector: no rhs free dim
    ("b,ba->a", [(4,), (4, None)]),                       # vector-matrix: no lhs free dim
    ("zab,zb->za", [(None, None, 4), (None, 4)]),          # batched matrix-vector
    ("zb,zb->z", [(None, 4), (None, 4)]),                  # batched dot
    ("ab,ab->", [(None, 4), (None, 4)]),                   # full contraction to a scalar
]


@pytest.mark.parametrize("equation,shapes", CASES, ids=[c[0] for c in CASES])
def test_einsum_matches_tf(equation, shapes):
    sig = [tf.TensorSpec(s, tf.float32) for s in shapes]
    tf_fn = tf.function(lambda x, y: tf.einsum(equation, x, y) * 2.0, input_signature=sig)
    jitted = compiled(tf_fn)  # the Einsum itself, inside a compiled cluster
    lhs, rest = equation.split(",")
    rhs = rest.split("->")[0]
    rng = np.random.default_rng(len(equation))
    for trial in range(5):
        size = {c: int(rng.integers(0 if trial == 1 else 1, 6)) for c in set(lhs + rhs)}
        for letters, s in zip((lhs, rhs), shapes):
            size.update({c: d for c, d in zip(letters, s) if d is not None})
        args = [rng.standard_normal([size[c] for c in letters]).astype(np.float32)
                for letters in (lhs, rhs)]
        np.testing.assert_allclose(jitted(*args).numpy(), tf_fn(*args).numpy(),
                                   rtol=1e-4, atol=1e-4)


def test_unsupported_equations_are_refused_by_the_registry():
    assert einsum_parts("abc,cd->abd") is not None
    for eq in ("...c,cd->...d", "aa,ab->b", "abc->acb", "ab,cd->ac", "ab,b->"):
        assert einsum_parts(eq) is None, eq
    for eq in ("ab,bc->abc", "ab,cd->abcd", "ab,c->abc"):  # products: nothing contracted
        assert einsum_parts(eq) is not None, eq


def test_keras_attention_block_is_one_cluster():
    mha = keras.layers.MultiHeadAttention(num_heads=4, key_dim=16)
    norm = keras.layers.LayerNormalization()
    warm = np.random.default_rng(0).random((2, 5, 64)).astype(np.float32)
    norm(warm + mha(warm, warm))

    @tf.function(input_signature=[tf.TensorSpec([None, None, 64], tf.float32)])
    def block(x):
        return norm(x + mha(x, x))

    disc_tf.reset_stats()
    jitted = disc_tf.jit(block)
    assert len(jitted.report.compiled) == 1
    (cluster,) = jitted.report.compiled
    einsums = [name for name, op in cluster.ops if op == "Einsum"]
    assert len(einsums) == 6  # q, k, v projections, scores, weighted values, output
    rng = np.random.default_rng(1)
    for b, t in [(2, 5), (1, 1), (3, 17), (1, 40), (4, 3)]:
        x = rng.standard_normal((b, t, 64)).astype(np.float32)
        np.testing.assert_allclose(jitted(x).numpy(), block(x).numpy(), rtol=1e-4, atol=1e-4)
    assert disc_tf.stats()["fallbacks"] == 0
