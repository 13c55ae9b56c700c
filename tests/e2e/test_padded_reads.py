"""Pads read in place by loop kernels (fusion/padded_reads.py): a constant pad whose
result elementwise kernels read is no kernel and no tensor; the readers take the
unpadded tensor's elements inside it and the constant outside. Against TF at random
shapes (empty ones too), for pads of the columns, of outer dims (a sequence shifted by
a step), of every dim, read through a broadcast, a transpose and a slice, next to a
concatenation, in a GEMM's epilogue, of ints; and the plans that keep the pad kernel
(a softmax over padded rows among them)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from disc_tf import pipeline
from tests.harness import assert_matches_tf, assert_ops_compiled, compiled
from tests.stage_helpers import cluster_of

#: The CPU backend's planner option (the CUDA backend keeps the pad kernel).
pytestmark = pytest.mark.cpu_backend

F32 = tf.float32
RNG = np.random.default_rng(47)
DEPTH = 24
W = tf.constant((RNG.normal(size=(DEPTH, DEPTH)) / 4).astype(np.float32))


def columns(x):
    return tf.pad(x * 3.0, [[0, 0], [2, 1]], constant_values=-1.0) * 2.0 + 1.0


def shifted(x):
    """A decoder's inputs shifted right by one step."""
    return tf.pad(tf.tanh(x), [[0, 0], [1, 0], [0, 0]]) + x[:, :1] * 0.0 + 1.0


def shift_right(x):
    """The usual spelling: pad one step before, drop the last (a slice of the pad)."""
    return tf.nn.relu(tf.pad(x, [[0, 0], [1, 0], [0, 0]])[:, :-1] * 2.0 + x)


def window_of_pad(x):
    """A slice cutting into the padding on both sides of the columns."""
    return tf.pad(x * 2.0, [[0, 0], [3, 3]], constant_values=1.0)[:, 1:-2] - 0.5


def every_dim(x):
    return tf.sigmoid(tf.pad(x - 0.5, [[1, 2], [0, 3], [2, 0]], constant_values=0.25))


def broadcast_row(x):
    """A padded vector broadcast over the rows of a matrix one wider."""
    v = tf.reduce_sum(x, 0) * 0.1
    return tf.pad(v, [[1, 0]]) + tf.pad(x, [[0, 0], [0, 1]], constant_values=2.0)


def seq_major(x):
    return tf.transpose(tf.pad(x * 1.5, [[1, 0], [0, 0], [0, 0]]), [1, 0, 2]) - 1.0


def beside_a_concatenation(x):
    """Columns cut into one segment per part of a concatenation: the pad's columns
    are picked per element there."""
    return tf.concat([x, tf.tanh(x[:, :3])], 1) + tf.pad(x, [[0, 0], [1, 2]], constant_values=3.0)


def int_rows(x):
    return tf.pad(tf.cast(x * 10.0, tf.int32), [[0, 1], [3, 0]], constant_values=7) * 3


def _plan(fn, spec):
    return pipeline.front_end(cluster_of(fn, spec)).plan


def _pads(plan) -> list:
    plans = [plan] + ([plan.speculative] if plan.speculative else [])
    return [k for p in plans for k in p.kernels if k.kind == "index" and k.ops[0].op == "dynamic_pad"]


def _pad_reads(plan) -> list:
    return [a for k in plan.kernels for a in k.inputs if a.pad is not None]


CASES = [
    (columns, [None, None], 1, "PadV2", [(3, 5), (1, 1), (0, 4), (200, 37), (5, 0)]),
    (shifted, [None, None, 8], 1, "Pad", [(2, 5, 8), (1, 1, 8), (3, 70, 8)]),
    (shift_right, [None, None, 8], 1, "Pad", [(2, 5, 8), (1, 1, 8), (3, 70, 8), (2, 0, 8)]),
    (window_of_pad, [None, None], 1, "PadV2", [(3, 5), (1, 1), (40, 0), (7, 33)]),
    (every_dim, [None, None, None], 1, "PadV2", [(2, 3, 4), (1, 1, 1), (0, 2, 5), (3, 9, 40)]),
    (broadcast_row, [None, None], 2, "Pad", [(4, 6), (1, 1), (33, 70)]),
    (seq_major, [None, None, None], 1, "Pad", [(2, 5, 3), (4, 1, 17), (0, 2, 2)]),
    (beside_a_concatenation, [None, 4], 1, "PadV2", [(3, 4), (70, 4), (0, 4)]),
    (int_rows, [None, None], 1, "PadV2", [(3, 5), (2, 0), (40, 9)]),
]


@pytest.mark.parametrize("fn,shape,reads,tf_op,shapes", CASES, ids=[c[0].__name__ for c in CASES])
def test_a_pad_feeding_a_kernel_is_read_in_place(fn, shape, reads, tf_op, shapes):
    """No pad kernel: the readers read the unpadded tensor (no padded temporary), and
    the results match TF."""
    spec = tf.TensorSpec(shape, F32)
    plan = _plan(fn, spec)
    assert not _pads(plan), plan.describe()
    assert len(_pad_reads(plan)) == reads, plan.describe()
    tf_fn = tf.function(fn, input_signature=[spec])
    jitted = compiled(tf_fn)
    assert_ops_compiled(jitted, {tf_op})
    for s in shapes:
        x = RNG.normal(size=s).astype(np.float32)
        assert_matches_tf(tf_fn, jitted, [x], 1e-5, 1e-5)
    assert disc_tf.stats()["fallbacks"] == 0


def test_a_pad_added_to_a_gemm_result_runs_in_its_epilogue():
    """``x @ W + pad(y)``, y's rows x's: the kernel reading the pad is the GEMM's
    epilogue (blocks of C, columns cut), and matches TF."""
    def fn(x):
        return tf.nn.relu(tf.matmul(x, W) + tf.pad(x[:, 4:] * 2.0, [[0, 0], [1, 3]]))

    spec = tf.TensorSpec([None, DEPTH], F32)
    plan = _plan(fn, spec)
    assert not _pads(plan) and len(_pad_reads(plan)) == 1, plan.describe()
    (gemm,) = [k for k in plan.kernels if k.kind == "library"]
    assert gemm.epilogue, plan.describe()
    tf_fn = tf.function(fn, input_signature=[spec])
    jitted = compiled(tf_fn)
    for rows in (1, 37, 400, 0):
        x = RNG.normal(size=(rows, DEPTH)).astype(np.float32)
        assert_matches_tf(tf_fn, jitted, [x], 1e-4, 1e-4)


def _returned_too(x):
    p = tf.pad(x * 2.0, [[0, 0], [1, 1]])
    return p + 1.0, p


def _column_sums(x):
    return tf.reduce_sum(tf.pad(x * 2.0, [[1, 1], [0, 0]]), axis=0)


def _masked_softmax(x):
    """Padded scores under a softmax (a stitch kernel: see padded_reads.py)."""
    return tf.nn.softmax(tf.pad(x * 2.0, [[0, 0], [0, 3]], constant_values=-1e4))


def _pad_of_a_tensor_value(x):
    return tf.pad(x * 2.0, [[0, 0], [1, 1]], constant_values=tf.reduce_max(x)) + 1.0


@pytest.mark.parametrize("fn", [_returned_too, _column_sums, _masked_softmax,
                                _pad_of_a_tensor_value],
                         ids=["returned", "column_reduction", "row_softmax", "value_computed"])
def test_other_pads_keep_their_kernel(fn):
    """A padded tensor the cluster returns, one a reduce or stitch kernel reads, a pad
    whose value is computed: the pad stays an index kernel, and the answers match TF."""
    spec = tf.TensorSpec([None, None], F32)
    plan = _plan(fn, spec)
    assert _pads(plan) and not _pad_reads(plan), plan.describe()
    tf_fn = tf.function(fn, input_signature=[spec])
    jitted = compiled(tf_fn)
    for s in ((3, 4), (40, 9)):
        x = RNG.normal(size=s).astype(np.float32)
        assert_matches_tf(tf_fn, jitted, [x], 1e-5, 1e-5)


def test_a_padded_scalar_read_through_a_broadcast_still_compiles():
    """A rank-0 pad (no paddings) broadcast over a vector has no row to read in place:
    the pad kernel stays, and the cluster compiles."""
    def fn(s, x):
        return tf.pad(s * 2.0, tf.zeros([0, 2], tf.int32)) + x

    specs = [tf.TensorSpec([], F32), tf.TensorSpec([None], F32)]
    tf_fn = tf.function(fn, input_signature=specs)
    jitted = compiled(tf_fn)
    assert_matches_tf(tf_fn, jitted, [np.float32(3.5), np.ones(4, np.float32)], 0, 0)


def _pool_windows(plan) -> list:
    return [k.ops[0] for k in plan.kernels if k.kind == "index" and k.ops[0].op == "reduce_window"]


POOLS = {
    "max_same_3s2": lambda x: tf.nn.max_pool2d(tf.nn.relu(x * 2.0 - 0.5), 3, 2, "SAME"),
    "max_same_2s1": lambda x: tf.nn.max_pool2d(x * 2.0, 2, 1, "SAME") + 1.0,
    "max_same_5s3": lambda x: tf.nn.max_pool2d(x - 1.0, [5, 2], [3, 1], "SAME"),
    "avg_same_3s2": lambda x: tf.nn.avg_pool2d(x * 2.0, 3, 2, "SAME"),
    "avg_same_4s1": lambda x: tf.nn.avg_pool2d(tf.tanh(x), [1, 4], 1, "SAME") * 3.0,
}


@pytest.mark.parametrize("dtype", [F32, tf.float16], ids=lambda d: d.name)
@pytest.mark.parametrize("name", sorted(POOLS))
def test_same_pools_read_their_padding_in_place(name, dtype):
    """A SAME MaxPool's or AvgPool's padding is no kernel and no padded copy: each window
    skips the taps outside the image (the padding holds the fold's start value, which
    changes nothing); windows larger than the image, all-padding taps and empty images
    included, against TF. f32 runs a row of channels at a time, f16 element by element.
    An AvgPool's divisors (the taps inside the image) come from each window's position."""
    fn = POOLS[name]
    spec = tf.TensorSpec([None, None, None, 3], dtype)
    plan = _plan(fn, spec)
    assert not _pads(plan), plan.describe()
    windows = _pool_windows(plan)
    # one window: an AvgPool's divisors are computed from the positions, not pooled ones
    assert len(windows) == 1 and "low" in windows[0].attrs, plan.describe()
    tf_fn = tf.function(fn, input_signature=[spec])
    jitted = compiled(tf_fn)
    assert_ops_compiled(jitted, {"MaxPool" if name.startswith("max") else "AvgPool"})
    tol = 1e-5 if dtype == F32 else 2e-3
    for s in [(1, 7, 9, 3), (2, 1, 1, 3), (1, 2, 13, 3), (3, 11, 4, 3), (0, 5, 5, 3), (1, 0, 4, 3)]:
        x = RNG.normal(size=s).astype(dtype.as_numpy_dtype)
        assert_matches_tf(tf_fn, jitted, [x], tol, tol)
    assert disc_tf.stats()["fallbacks"] == 0


def test_a_pad_of_another_value_before_a_pool_is_not_skipped():
    """A zero pad before a MaxPool (whose windows start at the lowest float) is not the
    window's start value: the window reads the zeros (here from the kernel that reads
    the pad in place), and they count."""
    def fn(x):
        return tf.nn.max_pool2d(tf.pad(x - 3.0, [[0, 0], [1, 1], [2, 0], [0, 0]]), 3, 2, "VALID")

    spec = tf.TensorSpec([None, None, None, 2], F32)
    plan = _plan(fn, spec)
    windows = _pool_windows(plan)
    assert windows and not any("low" in w.attrs for w in windows), plan.describe()
    tf_fn = tf.function(fn, input_signature=[spec])
    jitted = compiled(tf_fn)
    for s in [(1, 6, 5, 2), (2, 3, 3, 2)]:
        x = RNG.normal(size=s).astype(np.float32)
        assert_matches_tf(tf_fn, jitted, [x], 1e-5, 1e-5)


def test_a_pad_of_the_channels_before_a_pool_is_not_read_in_place():
    """Zeros padding H, W and the channels before a VALID AvgPool: the constant is the
    window's start (a sum from 0), but a window over H and W runs a row of channels at
    a time, so a pad of the channels is not read in place; the results match TF. A
    pad of H and W alone is."""
    def fn(x, channels):
        padded = tf.pad(x * 2.0, [[0, 0], [1, 1], [0, 1], channels])
        return tf.nn.avg_pool2d(padded, 2, 1, "VALID")

    spec = tf.TensorSpec([None, None, None, 3], F32)
    for channels, in_place in (([2, 1], False), ([0, 0], True)):
        plan = _plan(lambda x, c=channels: fn(x, c), spec)
        assert [("low" in w.attrs) for w in _pool_windows(plan)] == [in_place], plan.describe()
        tf_fn = tf.function(lambda x, c=channels: fn(x, c), input_signature=[spec])
        jitted = compiled(tf_fn)
        for s in [(1, 4, 5, 3), (2, 1, 1, 3)]:
            x = RNG.normal(size=s).astype(np.float32)
            assert_matches_tf(tf_fn, jitted, [x], 1e-5, 1e-5)


@pytest.mark.parametrize("dtype", [F32, tf.float16, tf.bfloat16, tf.int32, tf.bool],
                         ids=lambda d: d.name)
def test_a_pad_kernel_copies_rows_as_tf_pads(dtype):
    """A pad the cluster returns stays a kernel, which copies a row at a time (the
    value, the operand's row, the value; rows outside the operand all value): pads
    before and after every dim, including ones wider than the row, empty operands and
    rows of one element, against TF exactly."""
    value = {tf.bool: True, tf.int32: 7}.get(dtype, -2.5)

    def fn(x):
        y = tf.identity(x) if dtype == tf.bool else x * 1
        return tf.pad(y, [[1, 0], [0, 2], [3, 5]], constant_values=value)

    spec = tf.TensorSpec([None, None, None], dtype)
    assert _pads(_plan(fn, spec))
    tf_fn = tf.function(fn, input_signature=[spec])
    jitted = compiled(tf_fn, allow_tf=("Identity",))
    for s in [(2, 3, 4), (1, 1, 1), (0, 2, 3), (2, 0, 5), (3, 2, 0), (4, 5, 70)]:
        x = RNG.normal(size=s)
        x = (x > 0) if dtype == tf.bool else x.astype(dtype.as_numpy_dtype)
        want, got = np.asarray(tf_fn(x)), np.asarray(jitted(x))
        assert want.dtype == got.dtype and want.shape == got.shape, s
        np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32), str(s))
