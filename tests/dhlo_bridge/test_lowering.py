"""DHLO bridge: every registered op lowers to verified DHLO; others are refused."""

from __future__ import annotations

import pytest
import tensorflow as tf

from disc_tf.cluster import op_registry
from disc_tf.cluster.clustering import why_not_compilable
from disc_tf.cluster.graph_view import view_of_graph_def
from disc_tf.dhlo_bridge import host_rules, rules
from disc_tf.dhlo_bridge.lower import lower_cluster, parse_and_verify
from tests.stage_helpers import cluster_of, dyn

raw = tf.raw_ops


def test_every_registered_op_has_a_lowering():
    lowered = set(rules.lowered_ops()) | set(host_rules.host_ops())
    assert set(op_registry.supported_ops()) <= lowered
    # Ops supported only as shape computations are evaluated on the host.
    host_only = {op for op in op_registry.supported_ops()
                 if op_registry.lookup(op).host_dtypes and not op_registry.lookup(op).dtypes}
    assert host_only <= set(host_rules.host_ops())


def test_unknown_op_is_refused_by_name():
    with pytest.raises(rules.LoweringError, match="Atan.*supported"):
        rules.rule_for("Atan")


def test_registry_names_unsupported_and_wrong_dtype():
    @tf.function(input_signature=[dyn(2), dyn(2, tf.int32)])
    def fn(x, i):
        return tf.atan(x), tf.exp(tf.cast(i, tf.float64))

    graph_def = fn.get_concrete_function().graph.as_graph_def()
    view = view_of_graph_def(graph_def)
    reasons = {n.op: why_not_compilable(n) for n in view.nodes.values()}
    assert reasons["Atan"] == "unsupported op Atan"
    assert "float64" in reasons["Exp"]


CASES = {
    "add": (lambda x, y: x + y, [dyn(2), dyn(1)], "stablehlo.add"),
    "relu": (lambda x: tf.nn.relu(x) * 2.0, [dyn(3)], "stablehlo.maximum"),
    "sigmoid": (lambda x: tf.sigmoid(x), [dyn(0)], "stablehlo.logistic"),
    "compare": (lambda x, y: x < y, [dyn(2), dyn(2)], "comparison_direction LT"),
    "select_v1": (lambda c, x: raw.Select(condition=c, x=x, y=-x),
                  [dyn(1, tf.bool), dyn(2)], "shape.cstr_eq"),
    "cast_f16": (lambda x: tf.cast(x, tf.float16), [dyn(6)], "stablehlo.convert"),
    "const": (lambda x: x * tf.constant([1.0, 2.0, 3.0]), [dyn(2)], "stablehlo.constant"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_lowering_verifies_and_keeps_tf_names(name):
    fn, specs, expected = CASES[name]
    spec = cluster_of(fn, *specs)
    module = lower_cluster(spec)
    assert expected in module.text
    for node in spec.node_names:
        assert f'loc("{node}")' in module.text
    parse_and_verify(module.text)  # round-trips through the MLIR parser again
    assert "func.func @main" in module.text


def test_broadcasts_are_explicit_dynamic_ops():
    spec = cluster_of(lambda x, y: x * y, dyn(3), dyn(1))
    text = lower_cluster(spec).text
    assert text.count("stablehlo.dynamic_broadcast_in_dim") == 2
    assert "shape.broadcast" in text


def test_a_host_check_known_to_fail_refuses_the_node():
    """A check whose operands are both known when lowering and that fails would fail
    every call: the node is refused (TF then runs it and gives its own answer or
    error) instead of the check being dropped."""
    from disc_tf.dhlo_bridge.builder import DhloBuilder
    from disc_tf.dhlo_bridge.rules import LoweringError

    b = DhloBuilder()
    b.require("sle", b.index_const(2), b.index_const(3), "fine")  # holds: no check emitted
    assert not any("cstr_require" in line for line in b.lines)
    with pytest.raises(LoweringError, match="too large"):
        b.require("sle", b.index_const(70000), b.index_const(65536), "too large")
