"""Scores a mask selects away are not computed (``fusion/masked_columns.py``), and exp
of a masked score stays on libmvec's fast path (``disc_expf``) with the same values."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from disc_tf import pipeline
from tests.harness import assert_matches_tf, compiled, random_value
from tests.stage_helpers import cluster_of

F32 = tf.float32
HEADS, DIM = 2, 16


def _heads(x):
    """Q, K and V of x [batch, seq, 3 * heads * dim] as [batch, heads, seq, dim]."""
    b, s = tf.shape(x)[0], tf.shape(x)[1]
    q, k, v = tf.split(tf.reshape(x, [b, s, 3, HEADS, DIM]), 3, axis=2)
    return [tf.transpose(t[:, :, 0], [0, 2, 1, 3]) for t in (q, k, v)]


def causal_attention(x):
    """Keras' masked softmax under a causal mask: select(mask, scores, -1e9), softmax,
    select(mask, p, 0)."""
    q, k, v = _heads(x)
    positions = tf.range(tf.shape(x)[1])
    mask = tf.greater_equal(tf.expand_dims(positions, 1), tf.expand_dims(positions, 0))
    scores = tf.where(mask, tf.matmul(q, k, transpose_b=True) * 0.25, -1e9)
    p = tf.where(mask, tf.nn.softmax(scores, axis=-1), 0.0)
    return tf.matmul(p, v)


def padded_attention(x, lengths):
    """A padding mask (keys at or past each sequence's length), no second select: a
    sequence of length 0 has every score masked, and its softmax is uniform over all of
    them (the depth of P V must not stop at the mask)."""
    q, k, v = _heads(x)
    keys = tf.expand_dims(tf.range(tf.shape(x)[1]), 0)
    mask = tf.reshape(keys < tf.expand_dims(lengths, 1), [tf.shape(x)[0], 1, 1, -1])
    scores = tf.where(mask, tf.matmul(q, k, transpose_b=True) * 0.25, -1e9)
    return tf.matmul(tf.nn.softmax(scores, axis=-1), v)


def _masked(fn, *specs) -> list:
    """The masked GEMMs of the plan that runs when nothing is broadcast (the speculative
    one, where the plan has one)."""
    plan = pipeline.front_end(cluster_of(fn, *specs)).plan
    plan = plan.speculative or plan
    return [k for k in plan.kernels if k.masked_by is not None]


@pytest.mark.cpu_backend  # the CPU plan's scratch C (the CUDA backend has none)
def test_causal_scores_past_each_block_are_not_computed():
    spec = tf.TensorSpec([None, None, 3 * HEADS * DIM], F32)
    (lib,) = _masked(causal_attention, spec)
    assert lib.c_in_scratch and lib.chain, lib
    tf_fn = tf.function(causal_attention, input_signature=[spec])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(3)
    for batch, seq in [(2, 100), (1, 1), (3, 23), (1, 300), (2, 57)]:
        disc_tf.reset_stats()
        assert_matches_tf(tf_fn, jitted, [random_value(rng, (batch, seq, 3 * HEADS * DIM), F32)],
                          1e-4, 1e-4)
        masked = disc_tf.stats()["masked_elements"]
        # each block of 24 rows computes at least its rows' triangle (rounded up to
        # whole packed panels of K: 64 columns with AVX-512, 16 with AVX2), so never
        # more than the upper triangle is skipped, and past 64 columns some always is
        assert masked <= batch * HEADS * seq * (seq - 1) // 2, (batch, seq, masked)
        assert masked > 0 if seq > 64 else seq > 24 or masked == 0, (batch, seq, masked)
    assert disc_tf.stats()["fallbacks"] == 0


@pytest.mark.cpu_backend
def test_padding_mask_and_fully_masked_rows():
    specs = [tf.TensorSpec([None, None, 3 * HEADS * DIM], F32), tf.TensorSpec([None], tf.int32)]
    assert len(_masked(padded_attention, *specs)) == 1
    tf_fn = tf.function(padded_attention, input_signature=specs)
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(5)
    for seq, lengths in [(90, [90, 40, 0]), (30, [1, 30]), (200, [0]), (64, [64, 64])]:
        disc_tf.reset_stats()
        x = random_value(rng, (len(lengths), seq, 3 * HEADS * DIM), F32)
        assert_matches_tf(tf_fn, jitted, [x, np.array(lengths, np.int32)], 1e-4, 1e-4)
        expected = sum(HEADS * seq * (seq - n) for n in lengths)
        # a packed B's panels round the computed columns up: at most a panel per row
        assert expected - len(lengths) * HEADS * seq * 64 <= (
            disc_tf.stats()["masked_elements"]) <= expected, (seq, lengths, disc_tf.stats())
    assert disc_tf.stats()["fallbacks"] == 0


EXTREMES = [-np.inf, -1e9, -1e4, -104.0, -103.5, -100.0, -88.0, -87.4, -87.3, -87.0, -50.0, 0.0,
            1.5, 50.0, 87.0, 87.3, 87.5, 88.0, 88.7, 88.8, 100.0, 1e9, np.inf, np.nan]


def exp_and_sigmoid(x):
    # x * sigmoid(x) (SiLU; GELU's tanh form is one): 0 for any huge negative x, NaN at -inf
    return tf.exp(x) * 0.5 + tf.sigmoid(x), tf.exp(-x), x * tf.sigmoid(x)


def test_exp_at_the_edges_of_float_range():
    """disc_expf: below about -87.33 a zero (e^x is at most a denormal there), above
    87 e^(x - 64 ln 2) * 2^64 up to infinity, NaN as NaN; sigmoid too (disc_sigmoidf),
    and x * sigmoid(x), which a sigmoid floored at 1.2e-38 made -12e-30 at x = -1e9."""
    spec = tf.TensorSpec([None, len(EXTREMES)], F32)
    tf_fn = tf.function(exp_and_sigmoid, input_signature=[spec])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(11)
    for rows in [1, 5, 33]:
        x = np.tile(np.array(EXTREMES, np.float32), (rows, 1))
        x[:, EXTREMES.index(1.5)] = rng.standard_normal(rows)
        for want, got in zip(tf_fn(x), jitted(x)):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-30)
