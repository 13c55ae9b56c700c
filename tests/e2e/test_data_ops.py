"""Data movement and host shape computation inside clusters, against TF at random
shapes (zero-size and size-1 dims included): Slice, StridedSlice (masks, negative
bounds, strides), ConcatV2, Pack, Unpack, Split/SplitV, Pad/PadV2, Fill, Range,
Tile, BroadcastTo, OneHot, GatherV2, ReverseV2, IdentityN, and Shape/Size/Rank
arithmetic feeding Reshape."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from disc_tf import pipeline
from disc_tf.dhlo_bridge.lower import lower_cluster, parse_and_verify
from tests.harness import (
    assert_ops_compiled,
    assert_same,
    compiled,
    gpu_code_path,
    random_value,
)
from tests.stage_helpers import cluster_of, dyn

F32, I32, BOOL = tf.float32, tf.int32, tf.bool


def _shapes(rng, rank, count=6, low=1, zero_dim=0):
    out = [tuple(int(rng.integers(low, 6)) for _ in range(rank)) for _ in range(count - 2)]
    zero = [3] * rank
    zero[zero_dim] = 0
    out.append(tuple(zero))
    out.append(tuple([max(low, 1)] * rank))
    return out


def _run(fn, rank, dtype=F32, low=1, zero_dim=0, seed=0, kernels=True):
    tf_fn = tf.function(fn, input_signature=[dyn(rank, dtype)])
    disc_tf.reset_stats()
    jitted = compiled(tf_fn) if kernels else disc_tf.jit(tf_fn)
    rng = np.random.default_rng(seed)
    for shape in _shapes(rng, rank, low=low, zero_dim=zero_dim):
        x = random_value(rng, shape, dtype)
        assert_same(tf_fn(x), jitted(x), dtype)
    stats = disc_tf.stats()
    assert stats["fallbacks"] == 0
    return stats


CASES = {
    "slice_host_size": (lambda x: tf.slice(x, [0, 1], [tf.shape(x)[0], -1]) * 2.0, 2, 2),
    "slice_middle": (lambda x: tf.slice(x, [1, 0, 1], [1, -1, 1]) + 1.0, 3, 2, 1),
    "strided_basic": (lambda x: x[:, 1:-1] * 2.0 + 1.0, 2, 1),
    "strided_step": (lambda x: x[::2, -3::2] + 1.0, 2, 1),
    "strided_shrink": (lambda x: tf.exp(x[:, 0]) + x[:, -1], 2, 1),
    "strided_new_axis": (lambda x: x[:, None, 1:] * 3.0, 2, 1),
    "strided_ellipsis": (lambda x: x[..., 1] + 1.0, 3, 2),
    "strided_past_end": (lambda x: x[:, 2:100] * 2.0, 2, 0),
    "strided_reverse": (lambda x: x[::-1, ::-2] * 2.0 + 1.0, 2, 1),
    "strided_reverse_bounds": (lambda x: x[-1:0:-1, 3:-100:-1] + x[:1, :1], 2, 1),
    "strided_reverse_shrink": (lambda x: x[::-1, -1] * 2.0, 2, 1),
    "concat": (lambda x: tf.concat([x, tf.exp(x), x[:, :1]], axis=1) + 1.0, 2, 1),
    "concat_axis0": (lambda x: tf.concat([x, x * 2.0], axis=0) - 1.0, 3, 0),
    "pack": (lambda x: tf.stack([x, x * 2.0, x + 1.0], axis=1) + 1.0, 2, 0),
    "unpack": (lambda x: tf.unstack(tf.stack([x, x * 3.0], 1), num=2, axis=1)[1] * 2.0, 2, 1),
    "split": (lambda x: tf.split(tf.concat([x, x + 1.0], 1), 2, axis=1)[1] * 2.0, 2, 1),
    "splitv": (lambda x: tf.split(x, [1, -1], axis=1)[1] * 2.0, 2, 1),
    "pad": (lambda x: tf.pad(x * 2.0, [[1, 2], [0, 1]]) + 1.0, 2, 0),
    "padv2": (lambda x: tf.pad(x * 2.0, [[1, 0], [2, 1]], constant_values=5.0) + 1.0, 2, 0),
    "fill": (lambda x: tf.fill(tf.shape(x), 3.0) * x + 1.0, 2, 0),
    "range": (lambda x: tf.cast(tf.range(tf.shape(x)[1]), tf.float32) * x + 1.0, 2, 0),
    "range_step": (lambda x: tf.reduce_sum(
        tf.cast(tf.range(1, tf.shape(x)[0] * 3 + 1, 2), tf.float32)) + x * 2.0, 2, 0),
    "tile": (lambda x: tf.tile(x, [2, 1, 3]) * 2.0 + 1.0, 3, 0),
    "broadcast_to": (lambda x: tf.broadcast_to(x[:1], tf.shape(x)) * 2.0 + x, 2, 1),
    "broadcast_to_rank": (lambda x: tf.broadcast_to(x, tf.concat([[3], tf.shape(x)], 0)) + 1.0,
                          2, 0),
    "one_hot": (lambda x: tf.one_hot(tf.cast(x[:, 0] * 3.0, tf.int32), 4) * 2.0 + 1.0, 2, 1),
    "shape_arith_reshape": (lambda x: tf.reshape(x * 2.0, [tf.shape(x)[0] * tf.shape(x)[1], -1])
                            + 1.0, 3, 0),
    "shape_cast_scale": (lambda x: x * tf.cast(tf.shape(x)[1], tf.float32) + 1.0, 2, 0),
    "size_and_rank": (lambda x: x * tf.cast(tf.size(x) + tf.rank(x), tf.float32), 2, 0),
    "reverse": (lambda x: tf.reverse(x * 2.0, axis=[1]) + 1.0, 2, 0, 1),
    "reverse_axes": (lambda x: tf.reverse(x + 1.0, axis=[-1, 0]) * x, 3, 0, 2),
    "reverse_then_reduce": (lambda x: tf.reduce_sum(tf.reverse(tf.exp(x), [0]), 1), 2, 0),
    "identity_n": (lambda x: tf.identity_n([tf.exp(x), x * 2.0])[0] + 1.0, 2, 0),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_tf(name):
    fn, rank, low, *zero_dim = CASES[name]
    _run(fn, rank, low=max(low, 1), zero_dim=zero_dim[0] if zero_dim else 0)


def test_reverse_of_int_and_bool():
    for dtype in (I32, BOOL):
        _run(lambda x: tf.logical_not(tf.reverse(tf.logical_not(x), [1])) if x.dtype == BOOL
             else tf.reverse(x * 2, [1]) + 1, 2, dtype=dtype, zero_dim=1)


@pytest.mark.parametrize("dtype", [I32, BOOL], ids=lambda d: d.name)
def test_slice_and_concat_other_dtypes(dtype):
    f = tf.logical_not if dtype == BOOL else (lambda v: v * 2 + 1)
    _run(lambda x: f(tf.concat([x[:, 1:], x[:, :1]], axis=1)), 2, dtype=dtype, low=2)


def test_gather_embedding_lookup():
    table = np.random.default_rng(0).normal(size=(50, 8)).astype(np.float32)
    tf_fn = tf.function(lambda i, t: tf.nn.relu(tf.gather(t, i) * 2.0),
                        input_signature=[dyn(2, I32), tf.TensorSpec([None, 8], F32)])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(1)
    for shape in [(2, 3), (1, 1), (0, 4), (4, 7), (3, 1)]:
        ids = rng.integers(0, 50, size=shape).astype(np.int32)
        assert_same(tf_fn(ids, table), jitted(ids, table), F32)
    assert disc_tf.stats()["fallbacks"] == 0


def test_gather_axis_and_batch_dims():
    tf_fn = tf.function(lambda p, i: tf.gather(p * 2.0, i, axis=2, batch_dims=1) + 1.0,
                        input_signature=[dyn(3), dyn(2, I32)])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(2)
    for b, m, n, k in [(2, 3, 4, 5), (1, 1, 1, 1), (3, 2, 6, 2)]:
        params = rng.normal(size=(b, m, n)).astype(np.float32)
        ids = rng.integers(0, n, size=(b, k)).astype(np.int32)
        assert_same(tf_fn(params, ids), jitted(params, ids), F32)


def test_gather_index_out_of_range_is_invalid_argument_then_next_call_works():
    tf_fn = tf.function(lambda i, t: tf.gather(t, i) * 2.0,
                        input_signature=[dyn(1, I32), dyn(2)])
    jitted = compiled(tf_fn)
    table = np.ones((4, 3), np.float32)
    if gpu_code_path():  # TF's GPU kernel: zeros for the bad index, no error
        got = jitted(np.array([1, 9], np.int32), table).numpy()
        np.testing.assert_array_equal(got, [[2.0] * 3, [0.0] * 3])
    else:
        with pytest.raises(tf.errors.InvalidArgumentError, match="GatherV2.*indices = 9"):
            jitted(np.array([1, 9], np.int32), table)
    assert_same(tf_fn(np.array([3, 0], np.int32), table),
                jitted(np.array([3, 0], np.int32), table), F32)



@pytest.mark.parametrize("axis,batch_dims", [(0, 0), (1, 0), (1, 1)])
def test_gathered_rows_returned_as_they_are(axis, batch_dims):
    """A gather along any dim but the innermost, returned as it is (no kernel reads it
    in place), copies one row of the table per output row, its id read and checked once
    per row: against TF, empty ids included, and a bad id in any row is TF's
    InvalidArgument, after which the next call works (CPU)."""
    def fn(p, i):
        return tf.gather(p, i, axis=axis, batch_dims=batch_dims)

    tf_fn = tf.function(fn, input_signature=[dyn(3), dyn(2, I32)])
    jitted = compiled(tf_fn, allow_tf=("Identity",))
    assert_ops_compiled(jitted, {"GatherV2"})
    rng = np.random.default_rng(3 + axis + batch_dims)
    for b, n, k in [(2, 5, 3), (1, 1, 1), (3, 4, 0), (2, 6, 7)]:
        params = rng.normal(size=(b, n, 9) if axis else (n, b, 9)).astype(np.float32)
        ids = rng.integers(0, n, size=(b, k)).astype(np.int32)
        assert_same(tf_fn(params, ids), jitted(params, ids), F32)
    if not gpu_code_path():  # TF's GPU kernel: zeros for the bad index, no error
        ids[-1, -1] = n
        with pytest.raises(tf.errors.InvalidArgumentError, match=f"indices.* = {n} is not"):
            jitted(params, ids)
        ids[-1, -1] = 0
        assert_same(tf_fn(params, ids), jitted(params, ids), F32)


@pytest.mark.parametrize("dtype", [F32, tf.float16, I32, BOOL], ids=lambda d: d.name)
@pytest.mark.parametrize("axes", [[1], [2], [0, 2], [0, 1, 2]], ids=str)
def test_reversed_rows(axes, dtype):
    """A reverse copies each output row from its operand row (outer dims flipped), read
    backwards where the innermost dim is reversed: against TF, empty dims included."""
    tf_fn = tf.function(lambda x: tf.reverse(x, axes), input_signature=[dyn(3, dtype)])
    jitted = compiled(tf_fn, allow_tf=("Identity",))
    rng = np.random.default_rng(len(axes))
    for shape in [(2, 3, 5), (1, 1, 1), (0, 2, 3), (3, 0, 2), (2, 4, 0), (3, 70, 17)]:
        x = random_value(rng, shape, dtype)
        want, got = np.asarray(tf_fn(x)), np.asarray(jitted(x))
        assert want.dtype == got.dtype and want.shape == got.shape
        np.testing.assert_array_equal(got, want, str(shape))


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot_positions_are_a_broadcast_vector(axis):
    """OneHot compares each id with the positions along its axis: a vector of depth read
    through a broadcast, so no kernel writes a whole output's worth of positions (the
    iota was as large as the output). Ids out of range and negative give the off value,
    as in TF; other dtypes and axes against TF."""
    def fn(ids):
        return tf.one_hot(ids * 1, 5, on_value=2.5, off_value=-1.0, axis=axis)

    spec = dyn(2, I32)
    plan = pipeline.front_end(cluster_of(fn, spec)).plan
    iotas = [k for k in plan.kernels if k.ops[0].op == "dynamic_iota"]
    assert len(iotas) == 1 and len(iotas[0].dims) == 1, plan.describe()
    tf_fn = tf.function(fn, input_signature=[spec])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(9)
    for shape in [(3, 4), (1, 1), (0, 2), (6, 9)]:
        ids = rng.integers(-2, 7, size=shape).astype(np.int32)
        assert_same(tf_fn(ids), jitted(ids), F32)

def test_slice_out_of_bounds_is_invalid_argument():
    tf_fn = tf.function(lambda x: tf.slice(x, [2], [3]) * 2.0, input_signature=[dyn(1)])
    jitted = compiled(tf_fn)
    with pytest.raises(tf.errors.InvalidArgumentError, match="out of bounds"):
        jitted(np.ones(4, np.float32))
    assert_same(tf_fn(np.ones(6, np.float32)), jitted(np.ones(6, np.float32)), F32)


def test_broadcast_to_an_incompatible_shape_is_invalid_argument():
    tf_fn = tf.function(lambda x: tf.broadcast_to(x, [4, 2, 3]) + 1.0, input_signature=[dyn(3)])
    jitted = compiled(tf_fn)
    with pytest.raises(tf.errors.InvalidArgumentError, match="BroadcastTo.*Incompatible shapes"):
        jitted(np.ones((1, 3, 2), np.float32))
    x = np.arange(3, dtype=np.float32).reshape(1, 1, 3)
    assert_same(tf_fn(x), jitted(x), F32)


def test_range_with_limit_below_start_is_invalid_argument():
    tf_fn = tf.function(lambda x: tf.cast(tf.range(2, tf.shape(x)[0]), tf.float32) * 2.0,
                        input_signature=[dyn(1)])
    jitted = compiled(tf_fn)
    with pytest.raises(tf.errors.InvalidArgumentError):
        jitted(np.ones(1, np.float32))
    assert_same(tf_fn(np.ones(6, np.float32)), jitted(np.ones(6, np.float32)), F32)


def test_split_uneven_is_invalid_argument():
    tf_fn = tf.function(lambda x: tf.split(x * 2.0, 2, axis=0)[0] + 1.0, input_signature=[dyn(1)])
    jitted = compiled(tf_fn)
    with pytest.raises(tf.errors.InvalidArgumentError):
        jitted(np.ones(5, np.float32))
    assert_same(tf_fn(np.ones(4, np.float32)), jitted(np.ones(4, np.float32)), F32)


def test_tensordot_shape_chain_is_one_cluster_computed_on_the_host():
    """Keras Dense on a 3-D input: Shape -> GatherV2 -> Prod -> Pack -> Reshape."""
    w = np.random.default_rng(3).normal(size=(8, 5)).astype(np.float32)
    fn = lambda x: tf.nn.relu(tf.tensordot(x, w, axes=[[2], [0]]) + 1.0)  # noqa: E731
    spec = cluster_of(fn, dyn(3))
    ops = {op for _, op in spec.op_summary()}
    assert {"Shape", "GatherV2", "Prod", "Reshape", "MatMul"} <= ops
    text = lower_cluster(spec).text
    parse_and_verify(text)
    # The shape chain is host arithmetic, not kernels.
    assert "torch_index_select" not in text
    tf_fn = tf.function(fn, input_signature=[tf.TensorSpec([None, None, 8], F32)])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(4)
    for shape in [(2, 3, 8), (1, 1, 8), (0, 4, 8), (5, 2, 8)]:
        x = rng.normal(size=shape).astype(np.float32)
        assert_same(tf_fn(x), jitted(x), F32)


def test_shape_operand_from_outside_data_is_refused_with_reason():
    """A Reshape whose shape is data (not computable from dims) stays in TF."""
    from disc_tf.cluster import clustering
    from disc_tf.cluster.graph_view import view_of_graph_def

    @tf.function(input_signature=[dyn(2), tf.TensorSpec([2], I32)])
    def fn(x, s):
        return tf.reshape(x * 2.0, s) + 1.0

    gd = fn.get_concrete_function().graph.as_graph_def()
    result = clustering.find_clusters(view_of_graph_def(gd), min_cluster_size=1)
    assert "computable from constants and dims" in result.reasons["Reshape"]


def test_dims_whose_product_overflows_fail_cleanly_then_next_call_works():
    """Tile multiples (host shape operands) so large that the output's byte size
    overflows int64: an error naming the cluster, never a short buffer."""
    big = tf.constant([2**40, 2**40], tf.int64)
    jitted = compiled(tf.function(lambda x: tf.tile(x * 2.0, big) + 1.0, input_signature=[dyn(2)]))
    with pytest.raises(tf.errors.ResourceExhaustedError, match="disc_cluster.*exceed"):
        jitted(np.ones((2, 2), np.float32))
    small = tf.function(lambda x: tf.tile(x * 2.0, [2, 3]) + 1.0, input_signature=[dyn(2)])
    assert_same(small(np.ones((2, 2), np.float32)), compiled(small)(np.ones((2, 2), np.float32)),
                F32)


@pytest.mark.parametrize("dtype", [F32, I32], ids=lambda d: d.name)
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("exclusive,reverse", [(False, False), (True, False), (False, True),
                                               (True, True)])
def test_cumsum_matches_tf(dtype, axis, exclusive, reverse):
    tf_fn = tf.function(lambda x: tf.cumsum(x * 2, axis=axis, exclusive=exclusive,
                                            reverse=reverse) + 1,
                        input_signature=[dyn(3, dtype)])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(axis + 3)
    for shape in [(2, 3, 4), (1, 1, 1), (3, 0, 2), (4, 5, 6)]:
        x = random_value(rng, shape, dtype)
        assert_same(tf_fn(x), jitted(x), dtype)


def test_cumprod_matches_tf():
    tf_fn = tf.function(lambda x: tf.math.cumprod(x, axis=1) * 2.0, input_signature=[dyn(2)])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(5)
    for shape in [(3, 7), (1, 1), (2, 0), (4, 3)]:
        x = rng.normal(size=shape).astype(np.float32)
        assert_same(tf_fn(x), jitted(x), F32)


def test_where_is_refused_by_the_registry_with_a_reason():
    from disc_tf.cluster import clustering
    from disc_tf.cluster.graph_view import view_of_graph_def

    fn = tf.function(lambda x: tf.where(x * 2.0 > 1.0), input_signature=[dyn(2)])
    gd = fn.get_concrete_function().graph.as_graph_def()
    reasons = clustering.find_clusters(view_of_graph_def(gd), min_cluster_size=1).reasons
    assert reasons["Where"] == "data-dependent output shape (Where)"


@pytest.mark.parametrize("mode", ["REFLECT", "SYMMETRIC"])
def test_mirror_pad_matches_tf_and_rejects_too_wide_paddings(mode):
    tf_fn = tf.function(lambda x: tf.pad(x * 2.0, [[1, 2], [2, 0]], mode=mode) + 1.0,
                        input_signature=[dyn(2)])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(6)
    for shape in [(3, 4), (4, 3), (5, 5), (3, 9)]:
        x = rng.normal(size=shape).astype(np.float32)
        assert_same(tf_fn(x), jitted(x), F32)
    too_small = np.ones((2, 1), np.float32)  # width 2 > dim 1 in both modes
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf_fn(too_small)
    with pytest.raises(tf.errors.InvalidArgumentError):
        jitted(too_small)


def test_gather_nd_matches_tf_and_reports_bad_indices():
    tf_fn = tf.function(lambda p, i: tf.gather_nd(p * 2.0, i) + 1.0,
                        input_signature=[dyn(3), tf.TensorSpec([None, 2], I32)])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(8)
    for shape, n in [((3, 4, 5), 6), ((2, 2, 1), 1), ((4, 3, 2), 0), ((1, 5, 3), 4)]:
        params = rng.normal(size=shape).astype(np.float32)
        ids = np.stack([rng.integers(0, shape[0], n), rng.integers(0, shape[1], n)], 1)
        assert_same(tf_fn(params, ids.astype(np.int32)), jitted(params, ids.astype(np.int32)), F32)
    if gpu_code_path():  # TF's GPU kernel: zeros for the bad index, no error
        got = jitted(np.ones((2, 2, 2), np.float32), np.array([[0, 5]], np.int32)).numpy()
        np.testing.assert_array_equal(got, [[1.0, 1.0]])
    else:
        with pytest.raises(tf.errors.InvalidArgumentError, match="GatherNd"):
            jitted(np.ones((2, 2, 2), np.float32), np.array([[0, 5]], np.int32))


def test_float_range_with_constant_bounds_matches_tf():
    tf_fn = tf.function(lambda x: x * tf.range(0.5, 3.0, 0.25)[: tf.shape(x)[1]] + 1.0,
                        input_signature=[dyn(2)])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(12)
    for shape in [(2, 10), (1, 1), (3, 4), (0, 10)]:
        x = rng.normal(size=shape).astype(np.float32)
        assert_same(tf_fn(x), jitted(x), F32)


@pytest.mark.parametrize("bounds", [
    (0.0, None, 1.0),  # keras.ops.arange(seq_len), as keras-hub decoders build masks
    (None, None, 1.0),  # start and limit both computed: range(n/2 .. n) via casts
    (0.5, None, 0.25),  # dyadic constants beside a computed limit
    (None, -3.0, -2.0),  # counting down from a computed start
])
def test_float_range_with_a_cast_dim_bound_compiles_and_matches_tf(bounds):
    def fn(x):
        n = tf.shape(x)[0]
        start, limit, delta = bounds
        start = tf.cast(n // 2, tf.float32) if start is None else start
        limit = tf.cast(n, tf.float32) if limit is None else limit
        ramp = tf.range(start, limit, delta)
        return tf.reduce_sum(ramp) * 2.0 + ramp[:1] + tf.reduce_sum(x)

    tf_fn = tf.function(fn, input_signature=[dyn(1)])
    jitted = compiled(tf_fn)
    assert_ops_compiled(jitted, {"Range", "Cast"})
    rng = np.random.default_rng(3)
    for n in [1, 2, 7, 40, 1000]:
        x = rng.normal(size=(n,)).astype(np.float32)
        assert_same(tf_fn(x), jitted(x), F32)


def test_float_range_of_a_cast_dim_checks_the_bounds_tf_checks():
    tf_fn = tf.function(lambda x: tf.range(2.0, tf.cast(tf.shape(x)[0], tf.float32)) + 1.0,
                        input_signature=[dyn(1)])
    jitted = compiled(tf_fn)
    assert_same(tf_fn(np.ones(5, np.float32)), jitted(np.ones(5, np.float32)), F32)
    with pytest.raises(tf.errors.InvalidArgumentError):
        jitted(np.ones(1, np.float32))  # limit 1 < start 2 with delta 1: TF refuses too
    assert_same(tf_fn(np.ones(3, np.float32)), jitted(np.ones(3, np.float32)), F32)


def test_float_range_of_a_cast_dim_with_an_inexact_step_is_refused_with_a_reason():
    fn = tf.function(lambda x: tf.range(0.0, tf.cast(tf.shape(x)[0], tf.float32), 0.1) + 1.0,
                     input_signature=[dyn(1)])
    jitted = disc_tf.jit(fn, min_cluster_size=1, strict=False)
    reasons = {name: why for body in jitted.report.unclustered.values()
               for name, why in body.items()}
    assert reasons["range"].startswith("lowering refused: Range range: constant bounds"), reasons
    x = np.ones(12, np.float32)
    assert_same(fn(x), jitted(x), F32)


def test_negative_computed_dims_are_invalid_argument_then_next_call_works():
    tf_fn = tf.function(lambda x: tf.fill(tf.stack([tf.shape(x)[0] - 3]), 2.0) + x[0],
                        input_signature=[dyn(1)])
    jitted = compiled(tf_fn)
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf_fn(np.ones(1, np.float32))  # TF refuses the negative dim too
    with pytest.raises(tf.errors.InvalidArgumentError, match="non-negative"):
        jitted(np.ones(1, np.float32))
    assert_same(tf_fn(np.ones(5, np.float32)), jitted(np.ones(5, np.float32)), F32)
