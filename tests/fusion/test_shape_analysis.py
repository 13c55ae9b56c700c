"""Symbolic shapes and loop fusion: what is proven equal, and kernel counts."""

from __future__ import annotations

import pytest
import tensorflow as tf

from disc_tf.dhlo_bridge.lower import lower_cluster
from disc_tf.fusion.dhlo_reader import read_module
from disc_tf.fusion.planner import plan_fusion
from disc_tf.fusion.symbols import ShapeError, SymbolTable, SymDef
from tests.stage_helpers import cluster_of, dyn


def _plan(fn, *specs):
    spec = cluster_of(fn, *specs)
    return plan_fusion(read_module(lower_cluster(spec).text), spec.name)


def test_symbol_table_unions_and_refuses_contradictions():
    t = SymbolTable()
    a = t.new(SymDef("arg", arg=(0, 0)))
    b = t.new(SymDef("arg", arg=(1, 0)))
    t.union(a, t.const(4))
    assert t.constant_value(a) == 4
    t.union(b, t.const(3))
    with pytest.raises(ShapeError):
        t.union(a, b)


def test_absorbed_broadcast_components():
    t = SymbolTable()
    a = t.new(SymDef("arg", arg=(0, 0)))
    b = t.new(SymDef("arg", arg=(1, 0)))
    c = t.new(SymDef("broadcast", components=[a, b]))
    assert t.absorbed(c, a) and t.absorbed(c, b) and t.absorbed(c, t.const(1))
    assert not t.absorbed(a, b)


def test_same_shape_chain_is_one_kernel_without_broadcast_version():
    def fn(x):
        y = tf.tanh(x) * x + 1.0
        return tf.maximum(tf.exp(-y), tf.sqrt(tf.abs(x))) - y * y

    plan, _ = _plan(fn, dyn(3))
    assert len(plan.kernels) == 1
    assert not plan.kernels[0].needs_broadcast_version
    assert not plan.checks  # nothing to check at run time: all shapes proven equal


def test_bias_broadcast_is_fused_with_runtime_choice():
    plan, analysis = _plan(lambda x, b: tf.nn.relu(x + b) * 2.0, dyn(2), dyn(1))
    assert len(plan.kernels) == 1
    kernel = plan.kernels[0]
    assert kernel.needs_broadcast_version
    assert {a.buffer for a in kernel.inputs} == {"arg0", "arg1"}
    assert len(plan.checks) == 1 and plan.checks[0].kind == "broadcast"
    assert "broadcast(" in analysis.describe()


def test_absorption_keeps_reuse_of_operand_in_the_same_kernel():
    # (x + b) * x: x is already a component of the broadcast shape of x + b.
    plan, _ = _plan(lambda x, b: (x + b) * x - b, dyn(2), dyn(1))
    assert len(plan.kernels) == 1
    assert len(plan.checks) == 1


def test_static_dims_from_tf_prove_equal_shapes():
    spec = [tf.TensorSpec([None, 8], tf.float32), tf.TensorSpec([8], tf.float32)]
    plan, _ = _plan(lambda x, b: tf.sigmoid(x * b) + tf.square(x), *spec)
    assert len(plan.kernels) == 1
    assert not plan.checks


def test_unproven_shape_classes_get_separate_kernels():
    def fn(x, y):
        u = tf.exp(x) * 2.0
        v = tf.tanh(y) + 2.0
        return u, v, u + v

    plan, _ = _plan(fn, dyn(2), dyn(1))
    assert len(plan.kernels) == 3
    assert len({tuple(k.dims) for k in plan.kernels}) == 3
    # the function's output Identity nodes join too, as same-type converts
    assert [len([o for o in k.ops if o.op != "convert"]) for k in plan.kernels] == [2, 2, 1]


def test_plan_names_fused_tf_ops():
    plan, _ = _plan(lambda x: tf.nn.relu(x * 3.0), dyn(2))
    text = plan.describe()
    assert "TF ops: mul, Relu" in text


def test_speculative_plan_fuses_when_nothing_is_broadcast():
    # residual + f(x): shapes of x and residual are unknown and unrelated, so
    # the general plan needs two kernels; assuming no broadcast needs one.
    def fn(x, residual):
        return residual + tf.sigmoid(x) * 2.0

    plan, _ = _plan(fn, dyn(3), dyn(3))
    assert len(plan.kernels) == 2
    assert plan.speculative is not None and len(plan.speculative.kernels) == 1
    assert plan.num_kernels == 3
    assert "speculation: when" in plan.describe()


def test_slice_to_the_end_keeps_the_dim_symbol():
    """TF clamps slice bounds with max(d, 0); a dim is never negative, so the
    slice x[:, :1] has x's own dim 0 and fuses with x-shaped work."""
    plan, analysis = _plan(lambda x: tf.exp(x) * x[:, :1], dyn(2))
    syms = analysis.symbols
    result, arg = plan.buffers["result0"], plan.buffers["arg0"]
    assert syms.same(result.dims[0], arg.dims[0]), plan.describe()
