"""TF1 control flow (while frames, cond branches) and colocation in clustering:
clusters never span frames or branches, loop bodies and branches are clustered,
outputs equal TF's in a Session."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from disc_tf.cluster import clustering
from disc_tf.cluster.graph_view import view_of_graph_def
from disc_tf.optimizer import BodyOptimizer
from tests.harness import run_in_session


def _v1_graph() -> tf.compat.v1.GraphDef:
    from tensorflow.python.ops import control_flow_v2_toggles

    enabled = control_flow_v2_toggles.control_flow_v2_enabled()
    control_flow_v2_toggles.disable_control_flow_v2()
    try:
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [None, None], name="x")
            n = tf.compat.v1.placeholder(tf.int32, [], name="n")

            def body(i, acc):
                return i + 1, tf.tanh(acc * 0.5 + 1.0) * 2.0 - 0.1

            _, r = tf.while_loop(lambda i, acc: i < n, body, [tf.constant(0), x])
            c = tf.cond(n > 2, lambda: tf.exp(r) * 2.0 + 1.0, lambda: tf.sqrt(tf.abs(r)) - 1.0)
            tf.identity(tf.reduce_sum(c * 3.0 + 1.0, axis=1), name="out")
        return g.as_graph_def(add_shapes=True)
    finally:
        if enabled:
            control_flow_v2_toggles.enable_control_flow_v2()


def test_clusters_stay_inside_one_frame_or_branch():
    gd = _v1_graph()
    view = view_of_graph_def(gd)
    contexts = clustering.control_flow_contexts(view)
    result = clustering.find_clusters(view, min_cluster_size=2)
    assert len(result.clusters) == 4  # loop body, both branches, the tail
    for cluster in result.clusters:
        assert len({contexts[n] for n in cluster if view.nodes[n].op != "Const"}) == 1
    in_loop = [c for c in result.clusters if any(n.startswith("while/") for n in c)]
    assert in_loop and contexts[in_loop[0][-1]].startswith("|frame:")
    assert result.reasons["while/Merge_1"] == "unsupported op Merge"


def test_rewritten_v1_control_flow_graph_runs_like_tf_in_a_session():
    gd = _v1_graph()
    body = BodyOptimizer(gd.library)
    optimized = body.optimize_graph_def(gd, frozenset({"x", "n", "out"}))
    body.add_new_functions(optimized.library)
    assert sum(n.op == "DiscCluster" for n in optimized.node) == 4
    rng = np.random.default_rng(0)
    for rows, cols, steps in [(2, 3, 1), (1, 5, 4), (3, 1, 0), (4, 4, 3), (2, 2, 6)]:
        value = rng.normal(size=(rows, cols)).astype(np.float32)
        feeds = {"x:0": value, "n:0": steps}
        np.testing.assert_allclose(run_in_session(optimized, "out:0", feeds),
                                   run_in_session(gd, "out:0", feeds), rtol=1e-4, atol=1e-4)


def test_colocated_nodes_keep_their_placement():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None], name="x")
        a = tf.exp(x, name="a")
        with g.colocate_with(x.op):
            b = tf.multiply(a, 2.0, name="b")
        tf.identity(b + 1.0, name="c")
    view = view_of_graph_def(g.as_graph_def())
    result = clustering.find_clusters(view, min_cluster_size=1)
    assert result.reasons["b"] == "colocated with x"
