"""Gathers read in place by the GEMM that reads them (fusion/gathered_a.py, RAL
``sgemm_gathered_a``): an embedding lookup feeding a MatMul or a Dense einsum is one
library kernel whose tasks copy their rows of the table, with no gathered tensor in
memory. Against TF at random shapes (1-D and 2-D ids, int32 and int64, no ids), TF's
InvalidArgument for an index outside the table, and the plans that keep the gather (a
second reader, B transposed, a gather along another axis)."""

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
ROWS, DEPTH, UNITS = 1000, 64, 48
RNG = np.random.default_rng(41)
TABLE = tf.Variable(RNG.normal(size=(ROWS, DEPTH)).astype(np.float32))
W = tf.Variable((RNG.normal(size=(DEPTH, UNITS)) / 8).astype(np.float32))
B = tf.Variable(RNG.normal(size=(UNITS,)).astype(np.float32))


def dense_of_rows(ids):
    return tf.nn.relu(tf.matmul(tf.gather(TABLE, ids), W) + B)


def dense_of_sequence(ids):
    return tf.tanh(tf.einsum("bsd,du->bsu", tf.gather(TABLE, ids), W))


def _plan(fn, spec):
    return pipeline.front_end(cluster_of(fn, spec)).plan


def _gathered(plan) -> list:
    return [k for k in plan.kernels if k.kind == "library"
            and "gathered_a" in k.ops[0].attrs]


@pytest.mark.parametrize("fn,rank", [(dense_of_rows, 1), (dense_of_sequence, 2)],
                         ids=["matmul", "einsum"])
@pytest.mark.parametrize("id_dtype", [tf.int32, tf.int64], ids=["i32", "i64"])
def test_a_gather_feeding_a_gemm_is_read_in_place(fn, rank, id_dtype):
    """One library kernel reads the table and the ids (no index kernel, no gathered
    temporary: the call's temporaries are the GEMM's C alone), and matches TF."""
    spec = tf.TensorSpec([None] * rank, id_dtype)
    plan = _plan(fn, spec)
    (gemm,) = _gathered(plan)
    assert not any(k.kind == "index" for k in plan.kernels), plan.describe()
    assert len(plan.kernels) == 2 and gemm.epilogue, plan.describe()
    tf_fn = tf.function(fn, input_signature=[spec])
    jitted = compiled(tf_fn)
    assert_ops_compiled(jitted, {"ResourceGather"})
    shapes = [(7,), (300,), (0,), (1,)] if rank == 1 else [(2, 5), (3, 130), (1, 1), (4, 0)]
    for shape in shapes:
        ids = RNG.integers(0, ROWS, shape).astype(id_dtype.as_numpy_dtype)
        disc_tf.reset_stats()
        assert_matches_tf(tf_fn, jitted, [ids], 1e-4, 1e-4)
        rows = int(np.prod(shape))
        assert disc_tf.stats()["peak_temp_bytes"] == rows * UNITS * 4, (shape, disc_tf.stats())
    assert disc_tf.stats()["fallbacks"] == 0


@pytest.mark.parametrize("bad", [ROWS, -1, 2**40], ids=["past_end", "negative", "huge"])
def test_an_index_outside_the_table_is_invalid_argument(bad):
    tf_fn = tf.function(dense_of_rows, input_signature=[tf.TensorSpec([None], tf.int64)])
    jitted = compiled(tf_fn)
    ids = np.array([3, bad, 5], np.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"{bad} is not in \[0, {ROWS}\)"):
        jitted(ids)
    # still fine afterwards
    ok = np.array([3, 4], np.int64)
    assert_matches_tf(tf_fn, jitted, [ok], 1e-4, 1e-4)


def _returned_too(ids):
    g = tf.gather(TABLE, ids)
    return tf.matmul(g, W), g * 2.0


def _b_transposed(ids):
    return tf.matmul(tf.gather(TABLE, ids), tf.transpose(W) * 1.0, transpose_b=True)


def _columns(ids):
    return tf.matmul(W, tf.gather(tf.transpose(TABLE) * 1.0, ids, axis=1), transpose_a=True)


@pytest.mark.parametrize("fn", [_returned_too, _b_transposed, _columns],
                         ids=["second_reader", "b_transposed", "gather_along_axis_1"])
def test_other_gathers_keep_their_kernel(fn):
    """A gathered tensor something else reads, a GEMM reading B transposed (the RAL
    service reads B row-major), a gather along another axis: the gather stays an
    index kernel, and the answers still match TF."""
    spec = tf.TensorSpec([None], tf.int32)
    plan = _plan(fn, spec)
    assert not _gathered(plan), plan.describe()
    assert any(k.kind == "index" for k in plan.kernels), plan.describe()
    tf_fn = tf.function(fn, input_signature=[spec])
    jitted = compiled(tf_fn)
    ids = RNG.integers(0, ROWS, (37,)).astype(np.int32)
    assert_matches_tf(tf_fn, jitted, [ids], 1e-4, 1e-4)


_COPY_ON_READ_SCRIPT = """
import numpy as np, tensorflow as tf, disc_tf
rng = np.random.default_rng(5)
table = tf.Variable(rng.normal(size=(20000, 256)).astype(np.float32))  # 20 MB
w = tf.Variable((rng.normal(size=(256, 32)) / 16).astype(np.float32))
fn = tf.function(lambda ids: tf.matmul(tf.gather(table, ids), w),
                 input_signature=[tf.TensorSpec([None], tf.int32)])
jitted = disc_tf.jit(fn, min_cluster_size=1, strict=True)
ids = rng.integers(0, 20000, 64).astype(np.int32)
np.testing.assert_allclose(jitted(ids).numpy(), fn(ids).numpy(), rtol=1e-4, atol=1e-4)
# TF's own ResourceGather (fn above) put the variable in copy-on-read mode; a sparse
# write now updates its buffer in place, and the next call reads the new rows
table.scatter_update(tf.IndexedSlices(tf.ones([2, 256]), tf.constant([int(ids[0]), int(ids[5])])))
np.testing.assert_allclose(jitted(ids).numpy(), fn(ids).numpy(), rtol=1e-4, atol=1e-4)
mem = tf.config.experimental
mem.reset_memory_stats("CPU:0")
before = mem.get_memory_info("CPU:0")["current"]
jitted(ids)
print("PEAK", mem.get_memory_info("CPU:0")["peak"] - before, 20000 * 256 * 4)
print("OK")
"""


def test_a_variable_in_copy_on_read_mode_is_read_in_place():
    """Once a sparse op has touched a variable (TF's ResourceGather, a scatter
    update), TF copies it on every dense read; the compiled call reads it under its
    shared lock instead, as ResourceGather does: an embedding table of 20 MB adds
    nothing to the call's activation memory, and a scatter update before the call is
    seen by it."""
    import os
    import pathlib

    from tests import fresh_python

    repo = pathlib.Path(__file__).resolve().parents[2]
    env = dict(os.environ, TF_CPU_ALLOCATOR_USE_BFC="true", PYTHONPATH=str(repo))
    proc = fresh_python.run(["-c", _COPY_ON_READ_SCRIPT], env=env, timeout=300)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
    (peak, table_bytes), = [tuple(int(v) for v in line.split()[1:])
                            for line in proc.stdout.splitlines() if line.startswith("PEAK")]
    assert peak < table_bytes / 20, (peak, table_bytes)  # the output: 64 x 32 floats


_TIED_SCRIPT = """
import numpy as np, tensorflow as tf, disc_tf
rng = np.random.default_rng(6)
table = tf.Variable(rng.normal(size=(300, 64)).astype(np.float32))
# tied embeddings: the table gathered by the ids and read whole as the GEMM's B
fn = tf.function(lambda ids, h: tf.matmul(h + tf.gather(table, ids), table, transpose_b=True),
                 input_signature=[tf.TensorSpec([None], tf.int32),
                                  tf.TensorSpec([None, 64], tf.float32)])
jitted = disc_tf.jit(fn, min_cluster_size=1, strict=True)
for step in range(4):
    ids = rng.integers(0, 300, 70).astype(np.int32)
    h = rng.normal(size=(70, 64)).astype(np.float32)
    np.testing.assert_allclose(jitted(ids, h).numpy(), fn(ids, h).numpy(), rtol=1e-4, atol=1e-4)
    # a sparse write in place (copy-on-read mode): the next call multiplies by the new rows
    rows = rng.integers(0, 300, 40)
    table.scatter_add(tf.IndexedSlices(tf.ones([40, 64]) * float(step + 1), tf.constant(rows)))
print("OK")
"""


def test_tied_embeddings_written_in_place_stay_current():
    """Tied embeddings updated by scatter ops between calls (in place: the variable is
    in copy-on-read mode): the gather reads the table under its lock at the call, and
    the GEMM's B (the same variable through a ReadVariableOp, which TF copies in that
    mode) is the new value, not a packed copy of an old one."""
    import os
    import pathlib

    from tests import fresh_python

    repo = pathlib.Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(repo))
    proc = fresh_python.run(["-c", _TIED_SCRIPT], env=env, timeout=300)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


def test_a_gathered_gemm_is_not_chained_on_the_softmax_it_reads():
    """The table a GEMM gathers its A from may be a row-wise epilogue's result (a
    softmax over another GEMM's rows): the gathered GEMM has other rows than that
    GEMM's C, so it is not chained on its blocks."""
    w1 = tf.constant(RNG.normal(size=(DEPTH, DEPTH)).astype(np.float32) / 8)

    def fn(x, ids):
        t = tf.nn.softmax(tf.matmul(x, w1))
        return tf.matmul(tf.gather(t, ids), W)

    specs = [tf.TensorSpec([None, DEPTH], F32), tf.TensorSpec([None], tf.int32)]
    plan = pipeline.front_end(cluster_of(fn, *specs)).plan
    (gemm,) = _gathered(plan)
    assert not any(k.chain for k in plan.kernels), plan.describe()
    tf_fn = tf.function(fn, input_signature=specs)
    jitted = compiled(tf_fn)
    for rows, picks in [(40, 7), (3, 90), (130, 130)]:
        x = RNG.normal(size=(rows, DEPTH)).astype(np.float32)
        ids = RNG.integers(0, rows, picks).astype(np.int32)
        assert_matches_tf(tf_fn, jitted, [x, ids], 1e-4, 1e-4)


@pytest.mark.parametrize("table_shape,units", [((50, 16), 0), ((50, 0), 8)],
                         ids=["no_columns", "empty_rows"])
def test_bad_ids_of_an_empty_product_fare_as_in_tf(table_shape, units):
    """With no column of C the ids are still checked (TF's gather checks them); rows
    of no floats are never looked up (neither TF's nor the gather kernel checks them)."""
    table = tf.constant(RNG.normal(size=table_shape).astype(np.float32))
    w = tf.constant(np.ones((table_shape[1], units), np.float32))
    tf_fn = tf.function(lambda ids: tf.matmul(tf.gather(table, ids), w),
                        input_signature=[tf.TensorSpec([None], tf.int32)])
    assert _gathered(_plan(tf_fn.python_function, tf.TensorSpec([None], tf.int32)))
    jitted = compiled(tf_fn)
    ids = np.array([1, 50 + 7], np.int32)
    assert_same_outcome(tf_fn, jitted, [ids])
