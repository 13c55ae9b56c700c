"""Gathers read in place by loop and stitch kernels (fusion/gathered_rows.py): token
plus position embeddings and their layer norm, a scaled lookup, a softmax of short
rows, a lookup added to a GEMM's result are one kernel reading table rows through
the ids, with no gathered tensor in memory.
Against TF at random shapes (1-D and 2-D ids, int32 and int64, no ids, a table of
one column), reads through a broadcast and a transpose of the outer dims, TF's
InvalidArgument for an id outside the table, and the plans that keep the gather."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from disc_tf import pipeline
from tests.harness import assert_matches_tf, assert_ops_compiled, assert_same_outcome, compiled
from tests.stage_helpers import cluster_of

#: The CPU backend's planner option (the CUDA backend keeps the gather kernel).
pytestmark = pytest.mark.cpu_backend

F32 = tf.float32
ROWS, DEPTH, POSITIONS = 1000, 48, 300
RNG = np.random.default_rng(43)
TABLE = tf.Variable(RNG.normal(size=(ROWS, DEPTH)).astype(np.float32))
NARROW = tf.Variable(RNG.normal(size=(ROWS, 1)).astype(np.float32))
SHORT = tf.Variable(RNG.normal(size=(ROWS, 5)).astype(np.float32))
GAMMA = tf.Variable(RNG.normal(size=(DEPTH,)).astype(np.float32))
POS = tf.Variable(RNG.normal(size=(POSITIONS, DEPTH)).astype(np.float32))
W = tf.Variable((RNG.normal(size=(DEPTH, DEPTH)) / 8).astype(np.float32))


def token_and_position(ids):
    """[batch, seq] ids: scaled token rows plus position rows broadcast over batch."""
    positions = tf.gather(POS, tf.range(tf.shape(ids)[1]))
    return tf.gather(TABLE, ids) * 4.0 + positions


def embeddings_norm(ids):
    """GPT-2's and BERT's embeddings: token plus position rows, then a layer norm
    (one stitch kernel)."""
    x = token_and_position(ids)
    mean = tf.reduce_mean(x, -1, keepdims=True)
    var = tf.reduce_mean(tf.square(x - mean), -1, keepdims=True)
    return (x - mean) * tf.math.rsqrt(var + 1e-5) * GAMMA


def short_softmax(ids):
    """Rows of 5 floats: the stitch kernel's eight-rows-at-once version."""
    return tf.nn.softmax(tf.gather(SHORT, ids) * 2.0)


def scaled_rows(ids):
    """1-D ids: an elementwise function of the rows."""
    return tf.tanh(tf.gather(TABLE, ids)) * 0.5


def one_column(ids):
    return tf.gather(NARROW, ids) + 1.0


def seq_major(ids):
    """[batch, seq] ids read as [seq, batch, depth]: a transpose of the outer dims."""
    return tf.transpose(tf.gather(TABLE, ids), [1, 0, 2]) - 1.0


def _plan(fn, spec):
    return pipeline.front_end(cluster_of(fn, spec)).plan


def _gathers(plan) -> list:
    """Index kernels gathering rows (of the plan and its speculative version)."""
    plans = [plan] + ([plan.speculative] if plan.speculative else [])
    return [k for p in plans for k in p.kernels
            if k.kind == "index" and k.ops[0].op == "torch_index_select"]


def _row_reads(plan) -> list:
    return [a for k in plan.kernels for a in k.inputs if a.gather is not None]


CASES = [
    (token_and_position, 2, 2, [(2, 5), (3, 130), (1, 1), (4, 0), (1, 300)]),
    (embeddings_norm, 2, 2, [(2, 5), (3, 130), (1, 1), (4, 0)]),
    (short_softmax, 1, 1, [(7,), (300,), (0,), (1,)]),
    (scaled_rows, 1, 1, [(7,), (300,), (0,), (1,)]),
    (one_column, 1, 1, [(9,), (64,), (0,)]),
    (seq_major, 2, 1, [(2, 5), (3, 33), (1, 1), (0, 4)]),
]


@pytest.mark.parametrize("fn,rank,reads,shapes", CASES,
                         ids=["token_and_position", "layer_norm", "short_softmax", "scaled",
                              "one_column", "transposed"])
@pytest.mark.parametrize("id_dtype", [tf.int32, tf.int64], ids=["i32", "i64"])
def test_a_gather_feeding_a_loop_kernel_is_read_in_place(fn, rank, reads, shapes, id_dtype):
    """No index kernel gathers: the loop kernel reads the table rows the ids pick (the
    call's temporaries hold no gathered tensor), and the results match TF."""
    spec = tf.TensorSpec([None] * rank, id_dtype)
    plan = _plan(fn, spec)
    assert not _gathers(plan), plan.describe()
    assert len(_row_reads(plan)) == reads, plan.describe()
    tf_fn = tf.function(fn, input_signature=[spec])
    jitted = compiled(tf_fn)
    assert_ops_compiled(jitted, {"ResourceGather"})
    for shape in shapes:
        ids = RNG.integers(0, ROWS if rank == 1 else POSITIONS, shape)
        disc_tf.reset_stats()
        assert_matches_tf(tf_fn, jitted, [ids.astype(id_dtype.as_numpy_dtype)], 1e-4, 1e-4)
        if rank == 1:  # no temporaries (the others': the range's ids alone)
            assert disc_tf.stats()["peak_temp_bytes"] == 0, (shape, disc_tf.stats())
    assert disc_tf.stats()["fallbacks"] == 0


def test_a_gather_added_to_a_gemm_result_runs_in_its_epilogue():
    """``x @ W + table[ids]`` with x's rows proven to be the ids': the loop kernel
    reading the rows is the GEMM's epilogue (run on blocks of C), and matches TF."""
    def fn(ids):
        x = tf.cos(tf.cast(tf.expand_dims(ids, 1) + tf.range(DEPTH), F32))
        return tf.nn.relu(tf.matmul(x, W) + tf.gather(TABLE, ids))

    spec = tf.TensorSpec([None], tf.int32)
    plan = _plan(fn, spec)
    assert not _gathers(plan) and len(_row_reads(plan)) == 1, plan.describe()
    (gemm,) = [k for k in plan.kernels if k.kind == "library"]
    assert gemm.epilogue, plan.describe()
    tf_fn = tf.function(fn, input_signature=[spec])
    jitted = compiled(tf_fn)
    for rows in (1, 37, 400, 0):
        ids = RNG.integers(0, ROWS, rows).astype(np.int32)
        assert_matches_tf(tf_fn, jitted, [ids], 1e-4, 1e-4)


@pytest.mark.parametrize("bad", [ROWS, -1, 2**40], ids=["past_end", "negative", "huge"])
def test_an_id_outside_the_table_is_invalid_argument(bad):
    tf_fn = tf.function(scaled_rows, input_signature=[tf.TensorSpec([None], tf.int64)])
    jitted = compiled(tf_fn)
    ids = np.array([3, bad, 5], np.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"{bad} is not in \[0, {ROWS}\)"):
        jitted(ids)
    assert_matches_tf(tf_fn, jitted, [np.array([3, 4], np.int64)], 1e-4, 1e-4)


def test_ids_of_rows_of_no_floats_fare_as_in_tf():
    """A table of no columns: TF looks nothing up and checks no id; neither does the
    compiled call."""
    table = tf.constant(np.zeros((50, 0), np.float32))
    tf_fn = tf.function(lambda ids: tf.gather(table, ids) * 2.0,
                        input_signature=[tf.TensorSpec([None], tf.int32)])
    jitted = compiled(tf_fn)
    ids = np.array([1, 50 + 7], np.int32)
    assert_same_outcome(tf_fn, jitted, [ids])


def _returned_too(ids):
    g = tf.gather(TABLE, ids)
    return g * 2.0, g


def _column_sums(ids):
    return tf.reduce_sum(tf.gather(TABLE, ids), axis=0)


def _shifted(ids):
    g = tf.gather(TABLE, ids)
    return g[1:] + g[:-1]


@pytest.mark.parametrize("fn", [_returned_too, _column_sums, _shifted],
                         ids=["returned", "column_reduction", "windows"])
def test_other_gathers_keep_their_kernel(fn):
    """A gathered tensor the cluster returns, one a reduce kernel reads, one read
    through slices: the gather stays an index kernel, and the answers match TF."""
    spec = tf.TensorSpec([None], tf.int32)
    plan = _plan(fn, spec)
    assert _gathers(plan) and not _row_reads(plan), plan.describe()
    tf_fn = tf.function(fn, input_signature=[spec])
    jitted = compiled(tf_fn)
    for n in (2, 41):
        ids = RNG.integers(0, ROWS, (n,)).astype(np.int32)
        assert_matches_tf(tf_fn, jitted, [ids], 1e-4, 1e-4)


INT_TABLE = tf.constant(np.arange(50, dtype=np.int32).reshape(50, 1) * 3 + 1)
VALUES = tf.constant(np.arange(1100, dtype=np.float32).reshape(1100, 1))


def _ids_computed_then_read_transposed(x):
    """The kernel reading rows by computed ids (a temp) writes an int tensor of their
    size: it must not write it in place of the ids, which it reads at other rows'
    positions (transposed)."""
    ids = tf.minimum(tf.abs(x), 49)
    picked = tf.transpose(tf.gather(INT_TABLE, ids), [1, 0, 2]) * 1 + 900
    return tf.gather(VALUES, picked)


def test_ids_read_at_other_rows_are_not_overwritten_in_place():
    spec = tf.TensorSpec([None, None], tf.int32)
    plan = _plan(_ids_computed_then_read_transposed, spec)
    assert not any(b.reuses for b in plan.buffers.values() if b.elem == "i32"), plan.describe()
    tf_fn = tf.function(_ids_computed_then_read_transposed, input_signature=[spec])
    jitted = compiled(tf_fn)
    for shape in ((2, 3), (300, 400), (1, 7)):
        x = RNG.integers(-60, 60, shape).astype(np.int32)
        assert_matches_tf(tf_fn, jitted, [x], 0, 0)


def test_a_row_reduction_over_rows_of_no_elements():
    """A table of no columns under a softmax (a stitch kernel runs its empty rows)."""
    table = tf.constant(np.zeros((50, 0), np.float32))
    tf_fn = tf.function(lambda ids: tf.nn.softmax(tf.gather(table, ids) * 2.0),
                        input_signature=[tf.TensorSpec([None], tf.int32)])
    jitted = compiled(tf_fn)
    for n in (3, 20):
        assert_matches_tf(tf_fn, jitted, [np.arange(n, dtype=np.int32)], 0, 0)
