"""Constant folding before clustering (``disc_tf/cluster/const_fold.py``).

Input-independent subgraphs (a ``tf.linspace``, a filter scaled by a constant)
become Consts of the same name, so they cost no cluster or kernel; values too large
to embed stay computed. Each end-to-end case is checked against TF at several shapes.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import function_def_to_graph

from disc_tf import cli
from disc_tf.cluster import const_fold, graph_view, op_registry
from disc_tf.optimizer import BodyOptimizer, Options
from disc_tf.saved_model import optimize_saved_model
from tests.harness import compiled

tf1 = tf.compat.v1
RTOL, ATOL = 1e-4, 1e-5
W = np.random.default_rng(7).standard_normal((3, 3, 4, 8)).astype(np.float32)


def _check(tf_fn, jitted, shapes, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for shape in shapes:
        x = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(jitted(x), tf_fn(x), rtol=RTOL, atol=ATOL)


def _ops(cluster) -> dict[str, str]:
    return dict(cluster.ops)


def test_gelu_of_x_plus_linspace_is_one_cluster_and_one_kernel():
    """The issue's case: 4 clusters and 9 kernels (8 and 13 with single-op clusters)
    and TF ops left over before folding."""
    tf_fn = tf.function(lambda x: tf.nn.gelu(x + tf.linspace(0.0, 1.0, 64)),
                        input_signature=[tf.TensorSpec([None, 64], tf.float32)])
    jitted = compiled(tf_fn)
    (cluster,) = jitted.report.compiled
    assert cluster.kernels == 1, jitted.report
    assert _ops(cluster)["linspace/Slice"] == "Const"
    assert not any(n.name.startswith("linspace/") for n in jitted.graph_def.node)
    _check(tf_fn, jitted, [(1, 64), (0, 64), (5, 64), (33, 64), (2, 64)])


def test_a_constant_the_function_returns_is_folded_in_place():
    """The Identity returning ``range * 2`` becomes a Const of its name: the jitted
    graph still returns it, and the rest is one cluster."""
    tf_fn = tf.function(lambda x: (tf.nn.relu(x) * 3.0, tf.cast(tf.range(5), tf.float32) * 2.0),
                        input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    jitted = compiled(tf_fn)
    assert len(jitted.report.compiled) == 1, jitted.report
    returned = tf_fn.get_concrete_function().outputs[1].op.name
    assert {n.name: n.op for n in jitted.graph_def.node}[returned] == "Const"
    rng = np.random.default_rng(4)
    for rows in (2, 0, 9):
        x = rng.standard_normal((rows, 3)).astype(np.float32)
        for got, want in zip(jitted(x), tf_fn(x)):
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def _conv(filter_fn):
    return tf.function(lambda x: tf.nn.relu(tf.nn.conv2d(x, filter_fn(), 1, "SAME") + 1.0),
                       input_signature=[tf.TensorSpec([None, None, None, 4], tf.float32)])


@pytest.mark.parametrize("filter_fn", [
    pytest.param(lambda: tf.constant(W) * 0.5, id="scaled"),
    pytest.param(lambda: tf.reshape(tf.linspace(-1.0, 1.0, 288), [3, 3, 4, 8]), id="linspace"),
])
def test_a_computed_conv_filter_becomes_a_constant(filter_fn):
    tf_fn = _conv(filter_fn)
    jitted = compiled(tf_fn)
    (cluster,) = jitted.report.compiled
    conv = next(n for n in tf_fn.get_concrete_function().graph.as_graph_def().node
                if n.op == "Conv2D")
    assert _ops(cluster)[conv.input[1]] == "Const", cluster.ops
    # as many kernels as a convolution with the filter written as a constant
    value = filter_fn().numpy()
    reference = compiled(_conv(lambda: tf.constant(value)))
    assert cluster.kernels == reference.report.compiled[0].kernels
    # no empty batch: TF's CPU Conv2D returns the input's shape for one
    _check(tf_fn, jitted, [(1, 5, 7, 4), (2, 1, 1, 4), (3, 9, 4, 4), (1, 2, 6, 4)])


def test_a_value_too_large_to_embed_stays_computed():
    """``tile(linspace * 2)`` has 8192 elements: the Tile stays in the cluster, the
    small product it reads is folded."""
    assert 64 * 128 > op_registry.MAX_CONST_ELEMENTS
    tf_fn = tf.function(lambda x: x * tf.tile(tf.linspace(0.0, 1.0, 64) * 2.0, [128]),
                        input_signature=[tf.TensorSpec([None, 64 * 128], tf.float32)])
    jitted = compiled(tf_fn)
    (cluster,) = jitted.report.compiled
    ops = _ops(cluster)
    assert ops["Tile"] == "Tile" and ops["mul"] == "Const", cluster.ops
    assert cluster.kernels == 2, jitted.report
    _check(tf_fn, jitted, [(1, 8192), (3, 8192), (0, 8192)])


class _Model(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None, None, None, 4], tf.float32)])
    def __call__(self, x):
        h = tf.nn.conv2d(x, tf.constant(W) * 0.5, 1, "SAME")
        return {"y": tf.nn.gelu(h + tf.linspace(0.0, 1.0, 8)),
                "table": tf.cast(tf.range(5), tf.float32) * 2.0}


def _inspect_total(model: str, capsys) -> str:
    assert cli.main(["inspect", model]) == 0
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_saved_model_function_bodies_are_folded(tmp_path, capsys):
    """FunctionDef bodies: ``mul:z:0`` read by the Conv2D becomes ``mul:output:0``,
    and a constant the function returns is a Const of the Identity's name;
    ``disc-tf inspect`` folds as ``optimize`` does."""
    model = _Model()
    tf.saved_model.save(model, str(tmp_path / "orig"))
    before = _inspect_total(str(tmp_path / "orig"), capsys)
    report = optimize_saved_model(str(tmp_path / "orig"), str(tmp_path / "opt"))
    assert before == f"serving path: {report.total_line()}"
    assert _inspect_total(str(tmp_path / "opt"), capsys) == before
    (cluster,) = report.compiled
    assert _ops(cluster)["mul"] == "Const" and _ops(cluster)["linspace/Slice"] == "Const"
    loaded = tf.saved_model.load(str(tmp_path / "opt"))
    rng = np.random.default_rng(3)
    for shape in [(1, 5, 7, 4), (2, 3, 3, 4), (1, 1, 2, 4), (3, 8, 1, 4)]:
        x = rng.standard_normal(shape).astype(np.float32)
        want, got = model(x), loaded(x)
        np.testing.assert_allclose(got["y"], want["y"], rtol=RTOL, atol=ATOL)
        np.testing.assert_array_equal(got["table"], want["table"])


# --------------------------------------------------------------------------
# The rewrite itself
# --------------------------------------------------------------------------


def _function_def(fn, *sig):
    concrete = tf.function(fn, input_signature=list(sig)).get_concrete_function()
    return concrete.function_def, concrete.graph.as_graph_def().library


def _run_function(fdef, x: np.ndarray) -> list[np.ndarray]:
    graph = function_def_to_graph.function_def_to_graph(fdef)
    with tf1.Session(graph=graph) as sess:
        return sess.run([t.name for t in graph.outputs], {graph.inputs[0].name: x})


def test_function_def_references_and_ret_are_renamed():
    """A folded node returned directly (``ret`` names ``mul:z:0``, no Identity) and
    read by another node is referenced as ``mul:output:0`` afterwards."""
    fdef, library = _function_def(lambda x: (x + tf.cast(tf.range(4), tf.float32) * 2.0,
                                             tf.cast(tf.range(4), tf.float32) * 2.0),
                                  tf.TensorSpec([None, 4], tf.float32))
    mul = next(n for n in fdef.node_def if n.op == "Mul")
    key = sorted(fdef.ret)[1]
    fdef.ret[key] = f"{mul.name}:z:0"  # return the product itself
    view, nested_to_flat = graph_view.view_of_function_def(fdef, library)
    folded, new_view, mapping = const_fold.fold_function_def(fdef, view, nested_to_flat)
    ops = {n.name: n for n in folded.node_def}
    assert ops[mul.name].op == "Const" and new_view.nodes[mul.name].op == "Const"
    assert folded.ret[key] == f"{mul.name}:output:0"
    assert mapping[f"{mul.name}:output:0"] == f"{mul.name}:0"
    readers = [r for n in folded.node_def for r in n.input if r.split(":")[0] == mul.name]
    assert readers and all(r == f"{mul.name}:output:0" for r in readers)
    assert not any(n.op in ("Range", "Cast") for n in folded.node_def)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    for got, want in zip(_run_function(folded, x), _run_function(fdef, x)):
        np.testing.assert_array_equal(got, want)


def _fold(fn, *sig, protected=frozenset()):
    concrete = tf.function(fn, input_signature=list(sig)).get_concrete_function()
    gd = concrete.graph.as_graph_def()
    view = graph_view.view_of_graph_def(gd, gd.library, concrete.graph)
    return gd, const_fold.fold_graph_def(gd, view, protected)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.int32, tf.int64, tf.bool],
                         ids=lambda d: d.name)
def test_folded_values_keep_dtype_and_value(dtype):
    def ramp():
        return tf.cast(tf.range(-3, 5) * 3, dtype)

    _, (gd, view) = _fold(lambda x: tf.concat([x, ramp()], 0), tf.TensorSpec([None], dtype))
    (concat,) = [n for n in gd.node if n.op == "ConcatV2"]
    (node,) = [n for n in gd.node if n.name == concat.input[1]]
    assert node.op == "Const" and view.nodes[node.name].op == "Const"
    value = tf.make_ndarray(node.attr["value"].tensor)
    np.testing.assert_array_equal(value, ramp().numpy())
    assert value.dtype == dtype.as_numpy_dtype


@pytest.mark.parametrize("fn", [
    pytest.param(lambda x: x * (tf.cast(tf.shape(x)[1], tf.float32) * 2.0), id="shape"),
    pytest.param(lambda x: x / (tf.cast(tf.size(x), tf.float32) * 2.0), id="size"),
    pytest.param(lambda x: x + tf.random.uniform([4]) * 2.0, id="random"),
    pytest.param(lambda x: x + tf.random.stateless_uniform([4], seed=[1, 2]) * 2.0,
                 id="stateless_random"),
    pytest.param(lambda x: x + tf.strings.to_number(tf.constant(["1.5", "2", "0", "-1"])) * 2.0,
                 id="string"),
])
def test_input_dependent_or_impure_subgraphs_are_not_folded(fn):
    """Each case ends in ``<value> * 2.0`` (node ``mul``), which must stay computed;
    constant pieces beside it (a random op's ``max - min``) may fold."""
    gd, (folded, _) = _fold(fn, tf.TensorSpec([None, 4], tf.float32))
    before = {n.name: n.op for n in gd.node}
    now = {n.name: n.op for n in folded.node}
    assert now["mul"] == "Mul"
    impure = ("Shape", "Size", "RandomUniform", "StringToNumber")
    assert all(now.get(n, op) == op for n, op in before.items() if op.startswith(impure))


def test_control_inputs_block_folding_and_graph_defs_still_run():
    """A TF1 GraphDef (no live graph): the product behind a control dependency stays,
    the other constant subgraph is folded; the rewritten graph runs like TF."""
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [None, 16], name="x")
        ramp = tf.cast(tf.range(16), tf.float32) * 0.25
        with tf.control_dependencies([ramp.op]):
            gated = tf.constant(3.0) * tf.constant(2.0, name="two")
        out = tf.identity(tf.tanh(x * ramp) + gated, name="out")
    gd = g.as_graph_def()
    view = graph_view.view_of_graph_def(gd)
    folded, _ = const_fold.fold_graph_def(gd, view, frozenset({"x", "out"}))
    ops = {n.name: n.op for n in folded.node}
    assert ops[ramp.op.name] == "Const" and ops[gated.op.name] == "Mul"
    opt = BodyOptimizer(gd.library, Options(min_cluster_size=1))
    new = opt.optimize_graph_def(gd, frozenset({"x", "out"}))
    opt.add_new_functions(new.library)
    assert opt.report.compiled, opt.report
    rng = np.random.default_rng(5)
    for rows in (1, 0, 7):
        feed = rng.standard_normal((rows, 16)).astype(np.float32)
        got = _session_run(new, feed)
        with tf1.Session(graph=g) as sess:
            want = sess.run(out, {x: feed})
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def _session_run(graph_def, feed: np.ndarray) -> np.ndarray:
    with tf.Graph().as_default() as fresh:
        tf.graph_util.import_graph_def(graph_def, name="")
        with tf1.Session(graph=fresh) as sess:
            return sess.run("out:0", {"x:0": feed})


def test_nothing_to_fold_returns_the_body_unchanged():
    gd, (folded, view) = _fold(lambda x: tf.nn.relu(x) * 2.0, tf.TensorSpec([None], tf.float32))
    assert folded is gd and set(view.nodes) == {n.name for n in gd.node}
