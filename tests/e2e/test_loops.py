"""While loops compiled whole: tf.while_loop with TensorArrays (unstack, read, write,
stack), a variable read in the body, a trip count that depends on the data, a list
written at a constant index, no iteration at all, and the errors TF raises (an index
out of range) -- each against TF at several shapes, with the While, its TensorList
ops and its body inside one compiled loop cluster."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import tensorflow as tf

from tests.harness import assert_ops_compiled, compiled

RTOL, ATOL = 1e-4, 1e-5
LOOP_OPS = {"TensorListFromTensor", "TensorListReserve", "TensorListStack"}


def _assert_loop_compiled(jitted, ops: set[str]) -> None:
    """The While (stateful or not) and ``ops`` are inside one compiled loop cluster."""
    inside = {op for _, op in _loop_cluster(jitted).ops}
    assert inside & {"While", "StatelessWhile"} and ops <= inside, sorted(inside)
    assert_ops_compiled(jitted, ops)


def _loop_cluster(jitted):
    (loop,) = [c for c in jitted.report.compiled if c.name.startswith("disc_loop_")]
    return loop


def _scan(w):
    @tf.function(input_signature=[tf.TensorSpec([None, None, 8], tf.float32)])
    def scan(x):
        n = tf.shape(x)[0]
        xs = tf.TensorArray(tf.float32, size=n).unstack(x)
        out = tf.TensorArray(tf.float32, size=n)

        def body(t, h, out):
            h = tf.tanh(xs.read(t) * w + h * 0.5)
            return t + 1, h, out.write(t, h * 2.0)

        _, h, out = tf.while_loop(lambda t, h, out: t < n, body,
                                  [tf.constant(0), tf.zeros_like(x[0]), out])
        return tf.sigmoid(out.stack()) + 1.0, h - 1.0

    return scan


def test_a_tensor_array_scan_compiles_whole_and_matches_tf():
    # (Variables read in a loop body: tests/e2e/test_direct_call_loops.py, Keras RNNs.)
    scan = _scan(tf.constant(np.linspace(-1.0, 1.0, 8).astype(np.float32)))
    jitted = compiled(scan)
    _assert_loop_compiled(jitted, LOOP_OPS | {"Tanh", "TensorListGetItem", "TensorListSetItem"})
    loop = _loop_cluster(jitted)
    assert loop.kernels >= 2  # the body's and the condition's
    rng = np.random.default_rng(0)
    for t, b in [(1, 1), (5, 3), (17, 2), (2, 7)]:
        x = tf.constant(rng.standard_normal((t, b, 8)).astype(np.float32))
        for want, got in zip(scan(x), jitted(x)):
            np.testing.assert_allclose(got.numpy(), want.numpy(), RTOL, ATOL)


def test_a_trip_count_that_depends_on_the_data():
    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def halve(x):
        def cond(i, h):
            return tf.logical_and(tf.reduce_max(tf.abs(h)) > 0.1, i < 50)

        i, h = tf.while_loop(cond, lambda i, h: (i + 1, h * 0.5 + 0.01), [0, x * 3.0])
        return tf.cast(i, tf.float32) + tf.reduce_sum(h, axis=1)

    jitted = compiled(halve)
    _assert_loop_compiled(jitted, {"Max", "Abs", "LogicalAnd"})
    rng = np.random.default_rng(1)
    for shape, scale in [((2, 3), 1.0), ((5, 7), 40.0), ((1, 1), 0.001), ((3, 64), 1e4)]:
        x = tf.constant((rng.standard_normal(shape) * scale).astype(np.float32))
        np.testing.assert_allclose(jitted(x).numpy(), halve(x).numpy(), RTOL, ATOL)


def test_a_list_written_at_a_constant_index_and_a_loop_that_never_runs():
    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32),
                                  tf.TensorSpec([], tf.int32)])
    def last(x, steps):
        # Keras' RNN without return_sequences: one element, overwritten each step.
        out = tf.TensorArray(tf.float32, size=1, element_shape=[None, 4])
        zeros = tf.TensorArray(tf.float32, size=steps, element_shape=[3, 4])

        def body(t, h, out, zeros):
            h = tf.nn.relu(h * 1.5 - 0.25)
            return t + 1, h, out.write(0, h), zeros

        _, h, out, zeros = tf.while_loop(lambda t, *_: t < steps, body,
                                         [tf.constant(0), x + 1.0, out, zeros])
        return out.stack() + 0.5, zeros.stack() * 2.0

    jitted = compiled(last)
    _assert_loop_compiled(jitted, {"TensorListReserve", "TensorListStack", "TensorListSetItem"})
    rng = np.random.default_rng(2)
    for m, steps in [(2, 3), (5, 1), (3, 6)]:
        x = tf.constant(rng.standard_normal((m, 4)).astype(np.float32))
        for want, got in zip(last(x, steps), jitted(x, steps)):
            np.testing.assert_allclose(got.numpy(), want.numpy(), RTOL, ATOL)
    # No step: the written list was never written (its declared shape is partial:
    # TF and the loop both refuse to stack it); the fully declared one is [0, 3, 4].
    x = tf.constant(np.ones((2, 4), np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError):
        last(x, 0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="element shape is not fully"):
        jitted(x, 0)


def test_zero_iterations_stack_a_fully_declared_element_shape():
    @tf.function(input_signature=[tf.TensorSpec([None, 2, 3], tf.float32)])
    def stacked(x):
        n = tf.shape(x)[0]
        xs = tf.TensorArray(tf.float32, size=n, element_shape=[2, 3]).unstack(x)
        out = tf.TensorArray(tf.float32, size=n, element_shape=[2, 3])

        def body(t, out):
            return t + 1, out.write(t, tf.exp(xs.read(t)) - 1.0)

        _, out = tf.while_loop(lambda t, out: t < n, body, [tf.constant(0), out])
        return out.stack() * 3.0

    jitted = compiled(stacked)
    _assert_loop_compiled(jitted, LOOP_OPS)
    for n in (0, 1, 6):
        x = tf.constant(np.random.default_rng(n).standard_normal((n, 2, 3)).astype(np.float32))
        want, got = stacked(x).numpy(), jitted(x).numpy()
        assert got.shape == want.shape == (n, 2, 3)
        np.testing.assert_allclose(got, want, RTOL, ATOL)


def test_a_read_out_of_range_raises_as_tf_does():
    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    def overrun(x):
        n = tf.shape(x)[0]
        xs = tf.TensorArray(tf.float32, size=n).unstack(x)

        def body(t, acc):
            return t + 1, acc + tf.tanh(xs.read(t))

        # One step too many: the last read is out of the list's range.
        _, acc = tf.while_loop(lambda t, acc: t < n + 1, body, [tf.constant(0), x[0] * 0.0])
        return acc * 2.0

    jitted = compiled(overrun)
    _assert_loop_compiled(jitted, {"TensorListFromTensor", "TensorListGetItem"})
    x = tf.constant(np.ones((3, 4), np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError):
        overrun(x)
    with pytest.raises(tf.errors.InvalidArgumentError, match="TensorListGetItem"):
        jitted(x)


def test_a_loop_reading_at_a_computed_index_stays_tf_and_says_why():
    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    def backwards(x):
        n = tf.shape(x)[0]
        xs = tf.TensorArray(tf.float32, size=n).unstack(x)

        def body(t, acc):
            return t + 1, acc * 0.5 + tf.tanh(xs.read(n - 1 - t))

        _, acc = tf.while_loop(lambda t, acc: t < n, body, [tf.constant(0), x[0] * 0.0])
        return acc * 2.0

    jitted = compiled(backwards, allow_tf=("While", "StatelessWhile", "TensorListFromTensor"))
    reasons = [why for r in jitted.report.unclustered.values() for why in r.values()]
    assert any("list index is computed in the body" in why for why in reasons), reasons
    x = tf.constant(np.random.default_rng(5).standard_normal((6, 4)).astype(np.float32))
    np.testing.assert_allclose(jitted(x).numpy(), backwards(x).numpy(), RTOL, ATOL)


def test_the_dump_holds_the_loop_plan_and_its_steps(tmp_path: pathlib.Path, monkeypatch):
    monkeypatch.setenv("DISC_TF_DUMP_DIR", str(tmp_path))
    compiled(_scan(tf.constant(np.ones(8, np.float32))))
    (loop_dir,) = tmp_path.glob("disc_loop_0-*")
    plan = (loop_dir / "loop_plan.txt").read_text()
    assert "read_list" in plan and "write_list" in plan and "next v" in plan
    runner = (loop_dir / "host_runner.cc").read_text()
    assert "run_step(ral, disc_loop_0_body" in runner and "list_set(" in runner
    for step in ("body", "cond"):
        assert (loop_dir / step / "fusion_plan.txt").exists()
        assert (loop_dir / step / "host_runner.cc").exists()
