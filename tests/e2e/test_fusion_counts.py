"""Kernel counts of common fusion patterns, with outputs checked against TF."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests.harness import assert_same, compiled, random_value

HIDDEN = 64


def _gelu_tanh(x, b):
    h = x + b
    return 0.5 * h * (1.0 + tf.tanh(0.7978845608 * (h + 0.044715 * tf.pow(h, 3.0))))


def _gelu_erf(x, b):
    return tf.nn.gelu(tf.nn.bias_add(x, b), approximate=False)


def _gelu_keras_tanh(x, b):
    return tf.nn.gelu(x + b, approximate=True)


@pytest.mark.parametrize("fn", [_gelu_tanh, _gelu_erf, _gelu_keras_tanh], ids=lambda f: f.__name__)
def test_bias_plus_gelu_is_one_kernel(fn):
    sig = [tf.TensorSpec([None, None, HIDDEN], tf.float32), tf.TensorSpec([HIDDEN], tf.float32)]
    tf_fn = tf.function(fn, input_signature=sig)
    jitted = compiled(tf_fn)
    (cluster,) = jitted.report.compiled
    assert cluster.kernels == 1, jitted.report
    rng = np.random.default_rng(1)
    for b, t in [(2, 7), (1, 1), (0, 4), (3, 33), (5, 2)]:
        args = [random_value(rng, (b, t, HIDDEN), tf.float32), random_value(rng, (HIDDEN,), tf.float32)]
        assert_same(tf_fn(*args), jitted(*args), tf.float32)


def _layer_norm(x, g, b):
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)
    var = tf.reduce_mean(tf.math.squared_difference(x, mean), axis=-1, keepdims=True)
    return (x - mean) * tf.math.rsqrt(var + 1e-6) * g + b


def _bert_layer(x, wq, wk, wv, wo, wi, wf, bq, bk, bv, bo, g1, b1, bi, bf, g2, b2):
    """A post-LN BERT encoder layer (4 heads of 16) from plain TF ops."""
    q = tf.transpose(tf.einsum("bsh,hnd->bsnd", x, wq) + bq, [0, 2, 1, 3])
    k = tf.transpose(tf.einsum("bsh,hnd->bsnd", x, wk) + bk, [0, 2, 3, 1])
    v = tf.transpose(tf.einsum("bsh,hnd->bsnd", x, wv) + bv, [0, 2, 1, 3])
    probs = tf.nn.softmax(tf.matmul(q, k) * 0.25, axis=-1)
    context = tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3])
    h = _layer_norm(x + tf.einsum("bsnd,ndh->bsh", context, wo) + bo, g1, b1)
    inner = tf.nn.gelu(tf.matmul(h, wi) + bi, approximate=False)
    return _layer_norm(h + tf.matmul(inner, wf) + bf, g2, b2)


_BERT_SHAPES = [(HIDDEN, 4, 16)] * 3 + [(4, 16, HIDDEN), (HIDDEN, 4 * HIDDEN), (4 * HIDDEN, HIDDEN)] \
    + [(4, 16)] * 3 + [(HIDDEN,)] * 3 + [(4 * HIDDEN,)] + [(HIDDEN,)] * 3


def test_bert_encoder_layer_has_at_most_12_non_gemm_kernels():
    from disc_tf import pipeline
    from tests.stage_helpers import cluster_of

    sig = [tf.TensorSpec([None, None, HIDDEN], tf.float32)] + [
        tf.TensorSpec(s, tf.float32) for s in _BERT_SHAPES]
    spec = cluster_of(_bert_layer, *sig)
    plan = pipeline.front_end(spec).plan
    kinds = [k.kind for k in plan.kernels]
    gemms = kinds.count("library")
    assert gemms == 8  # q, k, v, scores, context, output, FFN in, FFN out
    assert len(kinds) - gemms <= 12, plan.describe()
    assert kinds.count("stitch") == 3  # softmax and two layer norms, one kernel each
    # the context GEMM writes [b, s, h, d] itself: no transposing copy after it
    assert sum("c_layout" in k.ops[0].attrs for k in plan.kernels if k.kind == "library") == 1

    tf_fn = tf.function(_bert_layer, input_signature=sig)
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(2)
    weights = [rng.normal(scale=0.2, size=s.shape).astype(np.float32) for s in sig[1:]]
    for b, t in [(2, 7), (1, 1), (3, 16), (1, 33), (4, 5)]:
        x = rng.normal(size=(b, t, HIDDEN)).astype(np.float32)
        np.testing.assert_allclose(jitted(x, *weights).numpy(), tf_fn(x, *weights).numpy(),
                                   rtol=1e-4, atol=1e-4)


def test_buffer_planner_reuses_dead_temps_and_reports_peak_bytes():
    import disc_tf
    from disc_tf import pipeline
    from tests.stage_helpers import cluster_of

    sig = [tf.TensorSpec([None, None, HIDDEN], tf.float32)] + [
        tf.TensorSpec(s, tf.float32) for s in _BERT_SHAPES]
    plan = pipeline.front_end(cluster_of(_bert_layer, *sig)).plan
    temps = {b.name: b for b in plan.buffers.values() if b.role == "temp"}
    shared = [b for b in temps.values() if b.reuses]
    assert shared and all(temps[b.reuses].elem == b.elem for b in shared), plan.describe()

    tf_fn = tf.function(_bert_layer, input_signature=sig)
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(3)
    weights = [rng.normal(scale=0.2, size=s.shape).astype(np.float32) for s in sig[1:]]
    x = rng.normal(size=(2, 7, HIDDEN)).astype(np.float32)
    disc_tf.reset_stats()
    np.testing.assert_allclose(jitted(x, *weights).numpy(), tf_fn(x, *weights).numpy(),
                               rtol=1e-4, atol=1e-4)
    peak = disc_tf.stats()["peak_temp_bytes"]
    # Every float intermediate of the layer at this shape, held at once, is an upper bound.
    static = tf.function(_bert_layer).get_concrete_function(
        tf.TensorSpec(x.shape, tf.float32), *[tf.TensorSpec(w.shape, tf.float32) for w in weights])
    all_intermediates = sum(
        4 * t.shape.num_elements() for op in static.graph.get_operations()
        if op.type not in ("Placeholder", "Const", "Identity") for t in op.outputs
        if t.dtype == tf.float32)
    assert 0 < peak < all_intermediates


PERM_CASES = {  # (perm of x giving A, perm of x giving B, transpose_b): A @ op(B) is valid
    "scores": ([0, 2, 1, 3], [0, 2, 3, 1], False),
    "scores_transpose_b": ([0, 2, 1, 3], [0, 2, 1, 3], True),
    "heads_outer": ([2, 0, 1, 3], [2, 0, 3, 1], False),
    "contract_strided": ([0, 2, 3, 1], [0, 2, 1, 3], False),
}


@pytest.mark.parametrize("name", sorted(PERM_CASES))
def test_transposed_gemm_operands_are_read_in_place(name):
    """Attention-style products of transposed operands ([b, s, h, d] activations): the
    GEMM reads them where they are, so the cluster is the GEMM and its epilogue."""
    from disc_tf import pipeline
    from tests.stage_helpers import cluster_of, dyn

    pa, pb, tb = PERM_CASES[name]

    def fn(x):
        return tf.matmul(tf.transpose(x, pa), tf.transpose(x * 0.5, pb), transpose_b=tb) + 1.0

    plan = pipeline.front_end(cluster_of(fn, dyn(4))).plan
    gemms = [k for k in plan.kernels if k.kind == "library"]
    assert len(gemms) == 1 and "strided" in gemms[0].ops[0].attrs, plan.describe()
    assert len(plan.kernels) == 3, plan.describe()  # x * 0.5, the GEMM, its epilogue
    tf_fn = tf.function(fn, input_signature=[dyn(4)])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(5)
    for shape in [(2, 5, 3, 4), (1, 1, 1, 1), (0, 3, 2, 4), (3, 7, 2, 1), (2, 4, 4, 4)]:
        x = rng.normal(size=shape).astype(np.float32)
        np.testing.assert_allclose(jitted(x).numpy(), tf_fn(x).numpy(), rtol=1e-4, atol=1e-4)


def _sum_and_return_producer(x):
    t = tf.tanh(x)
    return tf.reduce_sum(t, axis=0), t * 2.0


INPUT_FUSION = {
    # name: (fn, rank, producers fused into the reduction)
    "global_average_pool": (lambda x: tf.reduce_mean(tf.nn.relu(x * 2.0 + 1.0), axis=[1, 2]), 4,
                            True),
    "column_sum": (lambda x: tf.reduce_sum(tf.exp(x) * 0.5, axis=0), 2, True),
    "middle_max": (lambda x: tf.reduce_max(tf.abs(x - 1.0), axis=1), 3, True),
    "producer_also_used": (_sum_and_return_producer, 2, False),
}


@pytest.mark.parametrize("name", sorted(INPUT_FUSION))
def test_column_reductions_absorb_their_producers(name):
    from disc_tf import pipeline
    from tests.stage_helpers import cluster_of, dyn

    fn, rank, fused = INPUT_FUSION[name]
    plan = pipeline.front_end(cluster_of(fn, dyn(rank))).plan
    (reduce_kernel,) = [k for k in plan.kernels if k.kind == "reduce"]
    assert (len(reduce_kernel.ops) > 1) == fused, plan.describe()
    if fused:  # its producers' full-shape values never reach memory
        assert all(plan.buffers[a.buffer].role == "input" for a in reduce_kernel.inputs)
    tf_fn = tf.function(fn, input_signature=[dyn(rank)])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(6)
    for shape in [(2, 3, 4, 5)[:rank], (1,) * rank, (0,) + (3,) * (rank - 1), (5, 1, 3, 2)[:rank],
                  (3, 4, 1, 6)[:rank]]:
        x = rng.normal(size=shape).astype(np.float32)
        for e, a in zip(tf.nest.flatten(tf_fn(x)), tf.nest.flatten(jitted(x))):
            np.testing.assert_allclose(a.numpy(), e.numpy(), rtol=1e-5, atol=1e-5)
