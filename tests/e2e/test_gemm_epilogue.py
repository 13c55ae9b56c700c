"""GEMM epilogues: the kernel consuming a GEMM's result runs on each block of C
inside the GEMM (RAL ``sgemm_epilogue``). Plans are checked for which kernels
fuse and which must not; outputs against TF at random shapes, including ones
big enough that the GEMM is cut into blocks for the thread pool."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from disc_tf import pipeline
from tests.harness import assert_matches_tf, compiled, random_value
from tests.stage_helpers import cluster_of, dyn

F32 = tf.float32
ROWS = [1, 3, 8, 37, 130, 515]  # 515 x 256 outputs: several blocks per GEMM


def _plan(fn, *specs):
    return pipeline.front_end(cluster_of(fn, *specs)).plan


def _epilogues(plan) -> dict[str, str]:
    kinds = {k.name: k.kind for k in plan.kernels}
    return {k.name: kinds[k.epilogue] for k in plan.kernels if k.epilogue}


def _check(fn, specs, shapes_of, seed, rtol=1e-4, atol=1e-4):
    tf_fn = tf.function(fn, input_signature=specs)
    disc_tf.reset_stats()
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(seed)
    for rows in ROWS:
        args = [random_value(rng, s, F32) for s in shapes_of(rows)]
        assert_matches_tf(tf_fn, jitted, args, rtol, atol)
    assert disc_tf.stats()["fallbacks"] == 0


def _dense(seed: int, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Weights [k, n] and a bias [n], seeded."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((k, n)).astype(np.float32) / 10,
            rng.standard_normal(n).astype(np.float32))


def _gelu(y):
    return 0.5 * y * (1.0 + tf.tanh(0.79788456 * (y + 0.044715 * y * y * y)))


W, B = _dense(0, 96, 256)
W_WIDE, B_WIDE = _dense(2, 96, 700)


def dense_gelu(x):
    return _gelu(tf.matmul(x, W) + B)


def wide_dense_gelu(x):
    return _gelu(tf.matmul(x, W_WIDE) + B_WIDE)


def test_bias_activation_runs_inside_the_gemm():
    plan = _plan(dense_gelu, dyn(2))
    assert _epilogues(plan) == {"kernel0": "loop"}, plan.describe()
    assert "sgemm_epilogue" in pipeline.front_end(cluster_of(dense_gelu, dyn(2))).source
    _check(dense_gelu, [tf.TensorSpec([None, 96], F32)], lambda r: [(r, 96)], seed=1)


def test_elementwise_epilogue_follows_the_gemm_by_chunks_of_columns():
    """A block of whole rows of a packed B wider than the RAL's epilogue chunk (256
    columns): the GEMM and the epilogue alternate chunk by chunk, the last one partial
    (700 = 256 + 256 + 188)."""
    assert _epilogues(_plan(wide_dense_gelu, dyn(2))) == {"kernel0": "loop"}
    _check(wide_dense_gelu, [tf.TensorSpec([None, 96], F32)], lambda r: [(r, 96)], seed=5)


def dense_layer_norm(x):
    y = tf.matmul(x, W) + x[:, :1]
    mean = tf.reduce_mean(y, axis=-1, keepdims=True)
    var = tf.reduce_mean(tf.square(y - mean), axis=-1, keepdims=True)
    return (y - mean) * tf.math.rsqrt(var + 1e-6)


def test_row_reduction_runs_on_whole_rows_of_the_gemm():
    plan = _plan(dense_layer_norm, tf.TensorSpec([None, 96], F32))
    assert "stitch" in _epilogues(plan).values(), plan.describe()
    _check(dense_layer_norm, [tf.TensorSpec([None, 96], F32)], lambda r: [(r, 96)], seed=2)


def scores_softmax(q, k):
    return tf.nn.softmax(tf.matmul(q, k, transpose_b=True) * 0.125, axis=-1)


def test_batched_scores_and_softmax():
    specs = [dyn(4), dyn(4)]
    assert "stitch" in _epilogues(_plan(scores_softmax, *specs)).values()
    _check(scores_softmax, specs, lambda r: [(2, 3, r % 97 + 1, 16), (2, 3, r % 89 + 2, 16)],
           seed=3)


V = np.random.default_rng(2).standard_normal((96, 96)).astype(np.float32) / 10


def residual_on_the_gemm_input(x):
    t = tf.tanh(x)  # a temp that is the GEMM's A and dies in the epilogue's kernel
    return tf.nn.relu(tf.matmul(t, V)) + t


def test_consumer_writing_over_the_gemm_input_is_not_an_epilogue():
    plan = _plan(residual_on_the_gemm_input, tf.TensorSpec([None, 96], F32))
    (lib,) = [k for k in plan.kernels if k.kind == "library"]
    consumer = next(k for k in plan.kernels if k.kind == "loop" and any(
        a.buffer == lib.outputs[0][1] for a in k.inputs))
    writes_over_a = any(plan.buffers[b].reuses == lib.inputs[0].buffer for _, b in consumer.outputs)
    # Running it inside the GEMM would overwrite A while other blocks still read it.
    assert not (writes_over_a and lib.epilogue), plan.describe()
    _check(residual_on_the_gemm_input, [tf.TensorSpec([None, 96], F32)], lambda r: [(r, 96)],
           seed=4)


@pytest.mark.parametrize("transpose_b", [False, True])
def test_epilogue_reading_a_second_input_and_broadcasts(transpose_b):
    def fn(x, w, r):
        return tf.sigmoid(tf.matmul(x, w, transpose_b=transpose_b)) * r

    specs = [dyn(2), dyn(2), dyn(2)]
    assert _epilogues(_plan(fn, *specs)) == {"kernel0": "loop"}

    def shapes(rows):
        w = (40, 24) if transpose_b else (24, 40)
        return [(rows, 24), w, (rows if rows % 2 else 1, 40)]  # r broadcast on odd calls

    _check(fn, specs, shapes, seed=5)


WQ = np.random.default_rng(3).standard_normal((64, 4, 16)).astype(np.float32) / 8
BQ = np.random.default_rng(4).standard_normal((4, 16)).astype(np.float32)


def head_projection(x):
    """Einsum into heads, [b, s, 64] @ [64, 4 * 16] seen as [b, s, 4, 16], plus a bias:
    the consumer reads a view of C whose rows (16) split C's rows (64) evenly."""
    return tf.nn.relu(tf.einsum("bsh,hnd->bsnd", x, WQ) + BQ)


def test_consumer_of_a_view_of_the_gemm_result():
    plan = _plan(head_projection, dyn(3))
    (lib,) = [k for k in plan.kernels if k.kind == "library"]
    assert lib.epilogue and lib.epilogue_full_rows, plan.describe()
    _check(head_projection, [tf.TensorSpec([None, None, 64], F32)],
           lambda r: [(r % 3 + 1, r, 64)], seed=6)


def _chains(plan) -> dict[str, str]:
    return {k.name: k.chain for k in plan.kernels if k.chain}


def _qkv(x):
    """Queries, keys and values of one input (equal batch dims, as in a model)."""
    return x, x * 0.7 - 0.2, tf.tanh(x)


def attention(x):
    q, k, v = _qkv(x)
    p = tf.nn.softmax(tf.matmul(q, k, transpose_b=True) * 0.125, axis=-1)
    return tf.matmul(p, v)


def test_attention_runs_p_times_v_on_each_block_of_softmax_rows():
    spec = dyn(4)
    plan = _plan(attention, spec)
    assert len(_chains(plan)) == 1, plan.describe()
    assert "sgemm_rows" in pipeline.front_end(cluster_of(attention, spec)).source
    # One product of 130 or 515 query rows is cut into row blocks for the pool (a
    # block's P * V starts at its first row); more products are one block each.
    _check(attention, [spec], lambda r: [(1, 1, r, 16) if r > 100 else (2, 3, r, 16)], seed=7)


def bert_attention(x):
    """Heads read through transposes of [batch, seq, heads, dim], the context written
    back as [batch, seq, heads, dim]: the GEMMs read their operands in place."""
    q, k, v = (tf.transpose(t, [0, 2, 1, 3]) for t in _qkv(x))
    p = tf.nn.softmax(tf.matmul(q, k, transpose_b=True) * 0.125, axis=-1)
    return tf.transpose(tf.matmul(p, v), [0, 2, 1, 3])


def _layouts(plan) -> dict[str, dict]:
    return {k.name: k.ops[0].attrs["c_layout"] for k in plan.kernels
            if k.kind == "library" and "c_layout" in k.ops[0].attrs}


def test_attention_on_heads_read_in_place():
    """... and P · V (chained) writes the context as [batch, seq, heads, dim] itself: no
    transposing copy after it."""
    spec = tf.TensorSpec([None, None, 4, 16], F32)
    plan = _plan(bert_attention, spec)
    assert len(_chains(plan)) == 1, plan.describe()
    assert list(_layouts(plan).values()) == [
        {"batch": [0, 2], "m": 1, "tf_node": "Identity"}], plan.describe()
    assert [k.kind for k in plan.kernels] == ["loop", "library", "stitch", "library"]
    _check(bert_attention, [spec], lambda r: [(2, r, 4, 16)], seed=8)


WO = np.random.default_rng(15).standard_normal((64, 24)).astype(np.float32) / 8


def bert_attention_output(x):
    """The context transposed to [batch, seq, heads, dim], viewed as [batch, seq,
    heads * dim] and projected: the projection reads the layout P · V wrote."""
    ctx = bert_attention(x)
    shape = tf.shape(x)
    return tf.matmul(tf.reshape(ctx, [shape[0], shape[1], 64]), WO) + 0.5


def test_attention_output_projection_reads_the_context_where_it_was_written():
    spec = tf.TensorSpec([None, None, 4, 16], F32)
    plan = _plan(bert_attention_output, spec)
    assert len(_layouts(plan)) == 1, plan.describe()
    _check(bert_attention_output, [spec], lambda r: [(r % 3 + 1, r, 4, 16)], seed=16)


def _transposed_and_scaled(c):
    return tf.transpose(c, [1, 0, 2]), c * 2.0


LAYOUTS = {  # (function, specs, shapes of rows, expected layout or None)
    "batch_to_middle": (lambda a, b: tf.transpose(tf.matmul(a, b), [1, 0, 2]),
                        [dyn(3), dyn(3)], lambda r: [(3, r, 8), (3, 8, 5)],
                        {"batch": [1], "m": 0}),
    "heads_plain": (lambda a, b: tf.transpose(tf.matmul(a, b), [0, 2, 1, 3]),
                    [dyn(4), dyn(4)], lambda r: [(2, 3, r, 8), (2, 3, 8, 6)],
                    {"batch": [0, 2], "m": 1}),
    "columns_moved": (lambda a, b: tf.transpose(tf.matmul(a, b), [0, 2, 1]),
                      [dyn(3), dyn(3)], lambda r: [(3, r, 8), (3, 8, 5)], None),
    "result_read_twice": (lambda a, b: _transposed_and_scaled(tf.matmul(a, b)),
                          [dyn(3), dyn(3)], lambda r: [(3, r, 8), (3, 8, 5)], None),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_a_gemm_writes_the_layout_of_its_transposing_reader(name):
    """A GEMM whose result only a transposing copy reads writes that copy's layout,
    when its rows stay rows there; otherwise the copy stays (n moved, C read twice)."""
    fn, specs, shapes, expected = LAYOUTS[name]
    plan = _plan(fn, *specs)
    got = [{k: v for k, v in lay.items() if k != "tf_node"} for lay in _layouts(plan).values()]
    assert got == ([expected] if expected else []), plan.describe()
    _check(fn, specs, shapes, seed=len(name))


def attention_and_probs(x):
    q, k, v = _qkv(x)
    p = tf.nn.softmax(tf.matmul(q, k, transpose_b=True), axis=-1)
    return tf.matmul(p, v), p * 2.0


def test_chained_probabilities_still_reach_their_other_reader():
    """... so P stays in memory: its GEMM's C is not kept in per-block scratch."""
    spec = dyn(3)
    plan = _plan(attention_and_probs, spec)
    assert len(_chains(plan)) == 1
    assert not any(k.c_in_scratch for k in plan.kernels), plan.describe()
    _check(attention_and_probs, [spec], lambda r: [(3, r % 300 + 1, 8)], seed=9)


@pytest.mark.cpu_backend  # the CPU RAL's sgemm_scratch_c (the CUDA backend allocates C)
def test_attention_scores_exist_only_a_block_at_a_time():
    """A chained C that nothing else reads (the scores, then P in their place) is never
    allocated: each block is computed in the thread's scratch and the softmax and P . V
    run on it there (``sgemm_scratch_c``). The call's temporaries are the copies of
    Q, K and V, not the [batch, heads, S, S] matrix."""
    spec = tf.TensorSpec([None, None, 4, 16], F32)
    plan = _plan(bert_attention, spec)
    (lib,) = [k for k in plan.kernels if k.chain]
    assert lib.c_in_scratch, plan.describe()
    assert "sgemm_scratch_c" in pipeline.front_end(cluster_of(bert_attention, spec)).source
    tf_fn = tf.function(bert_attention, input_signature=[spec])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(17)
    for batch, seq in [(2, 300), (1, 1), (3, 70), (1, 600)]:
        disc_tf.reset_stats()
        assert_matches_tf(tf_fn, jitted, [random_value(rng, (batch, seq, 4, 16), F32)],
                          1e-4, 1e-4)
        scores = batch * 4 * seq * seq * 4
        copies = 2 * batch * seq * 4 * 16 * 4  # K and V as the GEMMs read them
        assert disc_tf.stats()["peak_temp_bytes"] <= copies < scores or seq == 1, (
            batch, seq, disc_tf.stats())
    assert disc_tf.stats()["fallbacks"] == 0


def keras_attention(q, k, v):
    """Keras MultiHeadAttention's einsums: the scores come out of the dot_general as
    K Qᵀ per head, and the softmax (over the last dim) reads them transposed."""
    p = tf.nn.softmax(tf.einsum("aecd,abcd->acbe", k, q) * 0.25, axis=-1)
    return tf.einsum("acbe,aecd->abcd", p, v)


@pytest.mark.cpu_backend  # the CPU plan's chain and scratch (the CUDA backend's has none)
def test_scores_read_transposed_are_computed_transposed():
    """The scores GEMM swaps its operands (B^T A^T, heads still read in place) so that
    the softmax reads its result at its own index: then it is the GEMM's epilogue, P . V
    is chained, and the scores live in per-block scratch (no temporaries at all)."""
    specs = [tf.TensorSpec([None, None, 4, 16], F32)] * 3
    plan = _plan(keras_attention, *specs)
    plans = [plan] + ([plan.speculative] if plan.speculative else [])
    scores = [k for p in plans for k in p.kernels if k.chain]
    assert scores and all(k.c_in_scratch for k in scores), plan.describe()
    tf_fn = tf.function(keras_attention, input_signature=specs)
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(19)
    for batch, s, t in [(2, 130, 130), (1, 7, 13), (3, 1, 1), (1, 300, 40), (2, 5, 300)]:
        disc_tf.reset_stats()
        q = random_value(rng, (batch, s, 4, 16), F32)
        k, v = (random_value(rng, (batch, t, 4, 16), F32) for _ in range(2))
        assert_matches_tf(tf_fn, jitted, [q, k, v], 1e-4, 1e-4)
        assert disc_tf.stats()["peak_temp_bytes"] == 0, (batch, s, t, disc_tf.stats())
    assert disc_tf.stats()["fallbacks"] == 0


def probs_transposed_times_v(x):
    q, k, v = _qkv(x)
    p = tf.nn.softmax(tf.matmul(q, k, transpose_b=True), axis=-1)
    return tf.matmul(p, v, transpose_a=True)  # reads P's columns: no row block is enough


def test_a_gemm_reading_the_probabilities_transposed_is_not_chained():
    spec = dyn(3)
    plan = _plan(probs_transposed_times_v, spec)
    assert not _chains(plan), plan.describe()
    _check(probs_transposed_times_v, [spec], lambda r: [(3, r % 300 + 1, 8)], seed=10)


def _shares(plan) -> dict[str, list[str]]:
    return {k.name: k.shares_a for k in plan.kernels if k.shares_a}


PROJ_Q, PROJ_K, PROJ_V = (np.random.default_rng(s).standard_normal((96, 64)).astype(np.float32) / 10
              for s in (11, 12, 13))


def qkv_projections(x):
    """Three projections of one input, then their biases and a product of them: the
    bias adds run as the last GEMM's epilogue and read the other two at its index."""
    q, k, v = (tf.matmul(x, w) for w in (PROJ_Q, PROJ_K, PROJ_V))
    return (q + 0.1) * (k - 0.2) + v


def test_projections_of_one_input_run_as_one_launch():
    spec = tf.TensorSpec([None, 96], F32)
    plan = _plan(qkv_projections, spec)
    assert [len(v) for v in _shares(plan).values()] == [2], plan.describe()
    assert "sgemm_shared_a" in pipeline.front_end(cluster_of(qkv_projections, spec)).source
    _check(qkv_projections, [spec], lambda r: [(r, 96)], seed=11)


def projections_of_a_3d_input(x):
    """BERT's head projections: [batch, seq, hidden] x [hidden, heads, dim]."""
    q, k, v = (tf.einsum("bsh,hnd->bsnd", x, tf.constant(w.reshape(96, 4, 16)))
               for w in (PROJ_Q, PROJ_K, PROJ_V))
    return v + q * k


def test_projections_of_a_3d_input_share_one_launch():
    spec = tf.TensorSpec([None, None, 96], F32)
    plan = _plan(projections_of_a_3d_input, spec)
    assert [len(v) for v in _shares(plan).values()] == [2], plan.describe()
    _check(projections_of_a_3d_input, [spec], lambda r: [(2, r, 96)], seed=12)


def chained_projection(x):
    """The second GEMM reads the first's result: not the same A, not one launch."""
    return tf.matmul(tf.matmul(x, PROJ_Q), PROJ_Q.T) + tf.matmul(x, PROJ_K[:, :1])


def test_gemms_reading_each_others_results_are_not_grouped():
    spec = tf.TensorSpec([None, 96], F32)
    plan = _plan(chained_projection, spec)
    for last, members in _shares(plan).items():
        names = {k.name: k for k in plan.kernels}
        outs = {names[m].outputs[0][1] for m in members}
        assert not any(a.buffer in outs for a in names[last].inputs), plan.describe()
    _check(chained_projection, [spec], lambda r: [(r, 96)], seed=13)


def keys_and_values(q, k, v):
    return tf.matmul(tf.nn.softmax(tf.matmul(q, k, transpose_b=True), axis=-1), v)


def test_chained_product_of_zero_depth_is_zeros():
    """No keys: the scores GEMM has no columns and is skipped, and P · V (depth 0) must
    still write its zeros, into memory a previous call may have filled."""
    specs = [tf.TensorSpec([2, 3, None, 8], F32), tf.TensorSpec([2, 3, None, 8], F32),
             tf.TensorSpec([2, 3, None, 5], F32)]
    assert _chains(_plan(keys_and_values, *specs)), _plan(keys_and_values, *specs).describe()
    tf_fn = tf.function(keys_and_values, input_signature=specs)
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(14)
    for _ in range(4):
        big = [1e3 * random_value(rng, (2, 3, 7, d), F32) for d in (8, 8, 5)]
        assert_matches_tf(tf_fn, jitted, big, 1e-4, 1e-2)
        empty = [random_value(rng, (2, 3, 7, 8), F32), np.zeros((2, 3, 0, 8), np.float32),
                 np.zeros((2, 3, 0, 5), np.float32)]
        assert_matches_tf(tf_fn, jitted, empty, 1e-4, 1e-4)


def projections_of_computed_weights(x, wq, wk, wv):
    """Gemma's projections: weights computed in the cluster (temps), one of them
    the size of a result, so memory freed too early is handed to a result."""
    q, k, v = (tf.matmul(x, w * 0.5) for w in (wq, wk, wv))
    return (q + 0.1) * k + v


def _read_after_free(source: str) -> list[str]:
    """Temps the host runner mentions after freeing them."""
    import re

    freed: set[str] = set()
    late = []
    for line in source.splitlines():
        if (m := re.search(r"free_temp\(ral, (\w+)\)", line)):
            freed.add(m.group(1))
            continue
        late += [name for name in freed if re.search(rf"\b{name}\b", line)]
    return late


def test_weights_of_a_shared_launch_live_until_that_launch():
    """A GEMM that runs inside a later GEMM's launch reads its operands there: they
    must not be freed at its own place in the order (they were, and the result
    allocated next took their memory: wrong answers in keras-hub's Gemma)."""
    specs = [tf.TensorSpec([None, 16], F32)] + [tf.TensorSpec([16, 16], F32)] * 3
    plan = _plan(projections_of_computed_weights, *specs)
    assert [len(v) for v in _shares(plan).values()] == [2], plan.describe()
    source = str(pipeline.front_end(cluster_of(projections_of_computed_weights, *specs)).source)
    assert "sgemm_shared_a" in source and not _read_after_free(source), _read_after_free(source)
    _check(projections_of_computed_weights, specs,
           lambda r: [(16 if r % 2 else r % 40 + 1, 16)] + [(16, 16)] * 3, seed=15)
