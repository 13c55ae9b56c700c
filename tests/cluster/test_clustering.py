"""Clustering invariants on random graphs, and the rewrite of TF1 graphs and SavedModels.

The property tests build random DAGs of compilable and non-compilable ops with
random data and control edges and check what must hold of any clustering:
clusters are disjoint, every node is accounted for, no cluster holds an op the
compiler cannot take, and contracting clusters never creates a cycle. The
rewrite tests run the rewritten graphs in a Session and compare with TF.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorflow.core.protobuf import saved_model_pb2

import disc_tf
from disc_tf.cluster import clustering, graph_view, op_registry
from disc_tf.optimizer import BodyOptimizer, Options
from disc_tf.saved_model import optimize_saved_model
from tests.harness import assert_same

tf1 = tf.compat.v1

#: Shapes fed to [None, None] placeholders: size-1 and zero-size dims included.
SHAPES = [(1, 1), (0, 3), (4, 0), (3, 5), (1, 7), (6, 1)]

# --------------------------------------------------------------------------
# Random graphs
# --------------------------------------------------------------------------

#: name -> (arity, builder); compilable ops are in op_registry, the others are not.
COMPILABLE = {
    "add": (2, tf.add),
    "mul": (2, tf.multiply),
    "sub": (2, tf.subtract),
    "max": (2, tf.maximum),
    "tanh": (1, tf.tanh),
    "exp": (1, lambda x: tf.exp(tf.minimum(x, 5.0))),  # Minimum + Const + Exp
    "neg": (1, tf.negative),
    "scale": (1, lambda x: x * tf.constant(0.5)),  # a Const that joins the cluster
}
#: Same-shape float32 ops keyed by TF op type; those the registry lacks are the
#: non-compilable ops of these tests (the registry grows, the tests follow).
_CANDIDATES = {
    "Cumsum": lambda x, name=None: tf.math.cumsum(x, axis=1, name=name),
    "Cumprod": lambda x, name=None: tf.math.cumprod(x, axis=1, name=name),
    "Atan": tf.atan,
    "Asinh": tf.asinh,
    "Digamma": tf.math.digamma,
    "Sin": tf.sin,
    "Cos": tf.cos,
    "Softplus": tf.nn.softplus,
}
NOT_COMPILABLE = {op: (1, fn) for op, fn in _CANDIDATES.items() if op_registry.lookup(op) is None}
assert len(NOT_COMPILABLE) >= 2, "every candidate op is compilable now: add others"
OPS = {**COMPILABLE, **NOT_COMPILABLE}
#: The op type standing between clusters in the hand-written graphs.
BARRIER_OP = next(iter(NOT_COMPILABLE))


def barrier(x: tf.Tensor, name: str, k: int = 0) -> tf.Tensor:
    """The ``k``-th non-compilable op applied to ``x``."""
    return list(NOT_COMPILABLE.values())[k][1](x, name=name)


@dataclasses.dataclass
class NodePlan:
    """One generated node: op, data inputs and control inputs (value indices)."""

    op: str
    inputs: list[int]
    controls: list[int]


@dataclasses.dataclass
class GraphPlan:
    """A random DAG over ``num_inputs`` placeholders followed by ``nodes``."""

    num_inputs: int
    nodes: list[NodePlan]
    fetches: list[int]


@st.composite
def graph_plans(draw, max_nodes: int = 12) -> GraphPlan:
    """Random DAGs: each node reads earlier values and may wait on earlier nodes."""
    num_inputs = draw(st.integers(1, 3))
    count = draw(st.integers(1, max_nodes))
    nodes = []
    for k in range(count):
        avail = num_inputs + k
        op = draw(st.sampled_from(sorted(OPS)))
        arity = OPS[op][0]
        # Prefer recent values so that chains (and clusters) form.
        inputs = [
            draw(st.integers(max(0, avail - 4), avail - 1) | st.integers(0, avail - 1))
            for _ in range(arity)
        ]
        controls = []
        if k and draw(st.integers(0, 3)) == 0:
            controls = sorted(set(draw(st.lists(st.integers(num_inputs, avail - 1),
                                                min_size=1, max_size=2))))
        nodes.append(NodePlan(op, inputs, controls))
    total = num_inputs + count
    fetches = sorted(set(draw(st.lists(st.integers(num_inputs, total - 1), min_size=1,
                                       max_size=3)) + [total - 1]))
    return GraphPlan(num_inputs, nodes, fetches)


def build_graph(plan: GraphPlan) -> tuple[tf.Graph, list[str], list[str]]:
    """The TF1 graph of ``plan``; returns it, the placeholder names and fetch names."""
    g = tf.Graph()
    values: list[tf.Tensor] = []
    with g.as_default():
        for i in range(plan.num_inputs):
            values.append(tf1.placeholder(tf.float32, [None, None], name=f"in{i}"))
        for k, node in enumerate(plan.nodes):
            deps = [values[c].op for c in node.controls]
            with g.control_dependencies(deps), g.name_scope(f"n{k}"):
                values.append(OPS[node.op][1](*(values[i] for i in node.inputs)))
    return g, [values[i].op.name for i in range(plan.num_inputs)], [
        values[i].name for i in plan.fetches
    ]


def _contracted_is_acyclic(view: graph_view.GraphView, clusters: list[list[str]]) -> bool:
    """True if the graph with every cluster contracted to one node has no cycle."""
    rep = {n: n for n in view.nodes}
    for k, members in enumerate(clusters):
        for n in members:
            rep[n] = f"#cluster{k}"
    succs: dict[str, set[str]] = {r: set() for r in rep.values()}
    indegree = dict.fromkeys(succs, 0)
    for node in view.nodes.values():
        srcs = {graph_view.producer(t.name) for t in node.inputs} | set(node.control_inputs)
        for src in srcs:
            a, b = rep[src], rep[node.name]
            if a != b and b not in succs[a]:
                succs[a].add(b)
                indegree[b] += 1
    ready = [r for r, d in indegree.items() if d == 0]
    seen = 0
    while ready:
        r = ready.pop()
        seen += 1
        for s in succs[r]:
            indegree[s] -= 1
            if indegree[s] == 0:
                ready.append(s)
    return seen == len(succs)


def check_clustering(view: graph_view.GraphView, result: clustering.ClusteringResult,
                     min_cluster_size: int) -> None:
    """The invariants every clustering must satisfy."""
    where: dict[str, int] = {}
    for k, members in enumerate(result.clusters):
        assert members, "empty cluster"
        for n in members:
            assert n not in where, f"{n} in clusters {where[n]} and {k}"
            where[n] = k
    for n in view.nodes:
        assert (n in where) != (n in result.reasons), f"{n}: clustered xor reason"
    assert set(result.reasons) <= set(view.nodes)
    for k, members in enumerate(result.clusters):
        nontrivial = 0
        for n in members:
            node = view.nodes[n]
            support = op_registry.lookup(node.op)
            assert support is not None, f"cluster {k} holds unsupported {node.op}"
            assert node.op not in NOT_COMPILABLE
            assert clustering.why_not_compilable(node) is None
            nontrivial += not support.trivial
        assert nontrivial >= min_cluster_size
    assert _contracted_is_acyclic(view, result.clusters)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(plan=graph_plans(), min_cluster_size=st.sampled_from([1, 2]))
def test_random_dags_cluster_soundly(plan: GraphPlan, min_cluster_size: int) -> None:
    g, _, _ = build_graph(plan)
    view = graph_view.view_of_graph_def(g.as_graph_def())
    result = clustering.find_clusters(view, min_cluster_size=min_cluster_size)
    check_clustering(view, result, min_cluster_size)


def _random_feed(rng: np.random.Generator, names: list[str], shape: tuple) -> dict:
    return {f"{n}:0": rng.standard_normal(shape).astype(np.float32) for n in names}


def _run(graph_def: tf1.GraphDef, fetches: list[str], feed: dict, init: list[str] = ()):
    g = tf.Graph()
    with g.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    with tf1.Session(graph=g) as sess:
        if init:
            sess.run(list(init))
        return sess.run(fetches, feed)


def optimize_tf1(graph_def, protected: frozenset[str], min_cluster_size: int = 1):
    """Clusters, compiles and rewrites a TF1 GraphDef; returns it and the report."""
    opt = BodyOptimizer(graph_def.library, Options(min_cluster_size=min_cluster_size))
    new = opt.optimize_graph_def(graph_def, protected=protected)
    opt.add_new_functions(new.library)
    return new, opt.report


def assert_runs_like(original, rewritten, inputs: list[str], fetches: list[str],
                     shapes=SHAPES, seed: int = 0, init: list[str] = ()) -> None:
    """Runs both GraphDefs in Sessions at every shape and compares the fetches."""
    rng = np.random.default_rng(seed)
    for shape in shapes:
        feed = _random_feed(rng, inputs, shape)
        expected = _run(original, fetches, feed, init)
        actual = _run(rewritten, fetches, feed, init)
        assert_same(expected, actual, tf.float32)


@settings(max_examples=12, deadline=None, derandomize=True)
@given(plan=graph_plans(max_nodes=8))
def test_random_dags_rewrite_and_run(plan: GraphPlan) -> None:
    g, inputs, fetches = build_graph(plan)
    gd = g.as_graph_def()
    protected = frozenset(inputs) | {graph_view.producer(f) for f in fetches}
    new, report = optimize_tf1(gd, protected)
    assert all(c.error is None for c in report.clusters), report.clusters
    assert_runs_like(gd, new, inputs, fetches, shapes=SHAPES[:3])


# --------------------------------------------------------------------------
# TF1 rewrite, hand-written graphs
# --------------------------------------------------------------------------


def _nodes(graph_def) -> dict:
    return {n.name: n for n in graph_def.node}


def _disc_nodes(graph_def) -> list:
    return [n for n in graph_def.node if n.op == "DiscCluster"]


def test_fetch_inside_cluster_keeps_its_name() -> None:
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [None, None], name="x")
        y = tf1.placeholder(tf.float32, [None, None], name="y")
        a = tf.add(x, y, name="a")
        b = tf.tanh(a, name="b")  # fetched, and consumed inside the cluster
        c = tf.multiply(b, a, name="c")
        tf.exp(c, name="d")
    gd = g.as_graph_def()
    fetches = ["b:0", "d:0"]
    new, report = optimize_tf1(gd, frozenset({"x", "y", "b", "d"}))
    assert len(report.compiled) == 1
    assert {"a", "b", "c", "d"} == {n for n, _ in report.compiled[0].ops}
    nodes = _nodes(new)
    assert nodes["b"].op == "IdentityN" and nodes["d"].op == "IdentityN"
    assert "a" not in nodes and "c" not in nodes
    assert_runs_like(gd, new, ["x", "y"], fetches)


def test_multi_consumer_cluster_output() -> None:
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [None, None], name="x")
        y = tf1.placeholder(tf.float32, [None, None], name="y")
        t = tf.tanh(x * y + x, name="t")  # read by two ops outside and by the cluster
        tf.exp(t, name="u")
        barrier(t, "s")
        barrier(t, "c", 1)
    gd = g.as_graph_def()
    fetches = ["s:0", "c:0", "u:0"]
    new, report = optimize_tf1(gd, frozenset({"x", "y", "s", "c", "u"}), min_cluster_size=2)
    [disc] = _disc_nodes(new)
    assert len(disc.attr["Tout"].list.type) == 2  # t (read outside) and u (fetched)
    nodes = _nodes(new)
    assert nodes["s"].input[0] == nodes["c"].input[0]
    assert nodes["s"].input[0].startswith(disc.name + ":")
    assert_runs_like(gd, new, ["x", "y"], fetches)


def test_control_edges_into_and_out_of_a_cluster() -> None:
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [None, None], name="x")
        y = tf1.placeholder(tf.float32, [None, None], name="y")
        counter = tf1.get_variable("counter", [], tf.int64, tf1.zeros_initializer(),
                                   use_resource=True)
        inc = counter.assign_add(1, read_value=False, name="inc")
        with tf.control_dependencies([inc]):  # into the cluster
            a = tf.tanh(x + y, name="a")
        b = tf.multiply(a, x, name="b")
        with tf.control_dependencies([b.op]):  # out of the cluster
            after = barrier(y, "after")
        tf.add(after, b, name="out")
        tf1.variables_initializer([counter], name="init")
    gd = g.as_graph_def()
    inputs, fetches = ["x", "y"], ["out:0"]
    new, report = optimize_tf1(gd, frozenset({"x", "y", "out", "init"}))
    assert [sorted(n for n, _ in c.ops) for c in report.compiled] == [["a", "add", "b"], ["out"]]
    nodes = _nodes(new)
    disc = next(n for n in _disc_nodes(new) if n.attr["cluster_name"].s
                == report.compiled[0].name.encode())
    assert "^inc" in disc.input
    # TF puts the edge on the first op built under the dependency (a Const, for some ops).
    after_ops = [n for n in new.node if n.name == "after" or n.name.startswith("after/")]
    assert any(f"^{disc.name}" in n.input for n in after_ops)
    assert "b" not in nodes
    assert_runs_like(gd, new, inputs, fetches, init=["init"])

    # The control edge into the cluster still runs the increment once per step.
    feed = _random_feed(np.random.default_rng(1), inputs, (2, 3))
    ng = tf.Graph()
    with ng.as_default():
        tf.graph_util.import_graph_def(new, name="")
    with tf1.Session(graph=ng) as sess:
        sess.run("init")
        for _ in range(3):
            sess.run(fetches, feed)
        assert sess.run("counter/Read/ReadVariableOp:0") == 3


@pytest.mark.parametrize("via_control", [False, True])
def test_merge_that_would_create_a_cycle_makes_two_clusters(via_control: bool) -> None:
    """a -> non-compilable -> b and a -> b: a and b cannot share a cluster."""
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [None, None], name="x")
        a = tf.tanh(x * x, name="a")
        if via_control:
            with tf.control_dependencies([a.op]):
                s = barrier(x, "s")
        else:
            s = barrier(a, "s")
        b = tf.add(a, s, name="b")
        tf.exp(b, name="out")
    gd = g.as_graph_def()
    view = graph_view.view_of_graph_def(gd)
    result = clustering.find_clusters(view, min_cluster_size=1)
    check_clustering(view, result, 1)
    assert len(result.clusters) == 2
    assert sorted(map(sorted, result.clusters)) == [["a", "mul"], ["b", "out"]]

    new, report = optimize_tf1(gd, frozenset({"x", "out"}))
    assert len(report.compiled) == 2
    [first, second] = _disc_nodes(new)
    # The second cluster reads the first one's output directly.
    assert any(i.startswith(first.name + ":") for i in second.input)
    assert_runs_like(gd, new, ["x"], ["out:0"])


# --------------------------------------------------------------------------
# SavedModel functions
# --------------------------------------------------------------------------


class _Model(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        self.count = tf.Variable(0, dtype=tf.int64)
        self.scale = tf.Variable(1.5)

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)] * 2)
    def f(self, x, y):
        inc = self.count.assign_add(1)  # a control_ret of the function
        with tf.control_dependencies([inc]):
            z = tf.tanh(x * y + x)
        w = barrier(z, "w")
        return {"out": tf.exp(w) * z * self.scale, "z": z}


def _functions(path) -> dict:
    sm = saved_model_pb2.SavedModel()
    sm.ParseFromString((path / "saved_model.pb").read_bytes())
    return {f.signature.name: f for f in sm.meta_graphs[0].graph_def.library.function}


def test_saved_model_keeps_control_ret_and_signature(tmp_path) -> None:
    src, dst = tmp_path / "in", tmp_path / "out"
    model = _Model()
    tf.saved_model.save(model, str(src), signatures={"serving_default": model.f})
    report = optimize_saved_model(str(src), str(dst))
    assert report.compiled == report.clusters, report.clusters  # none failed
    assert len([c for c in report.compiled if c.body.startswith("__inference_f_")]) == 2

    before, after = _functions(src), _functions(dst)
    [f_body] = [name for name in before if name.startswith("__inference_f_")]
    assert any(n.op == "DiscCluster" for n in after[f_body].node_def)
    for name, old in before.items():
        new = after[name]
        assert new.signature == old.signature, name
        assert new.control_ret.keys() == old.control_ret.keys(), name
        assert new.ret.keys() == old.ret.keys(), name
        node_names = {n.name for n in new.node_def}
        assert set(new.control_ret.values()) <= node_names, name
        assert {r.split(":")[0] for r in new.ret.values()} <= node_names, name
    # f's side effects are not compiled: its control_ret still names them.
    assert dict(after[f_body].control_ret) == dict(before[f_body].control_ret)

    disc_tf.reset_stats()  # count only this test's fallbacks
    original = tf.saved_model.load(str(src))
    optimized = tf.saved_model.load(str(dst))
    sig_o = original.signatures["serving_default"]
    sig_n = optimized.signatures["serving_default"]
    assert sig_n.structured_input_signature == sig_o.structured_input_signature
    assert sig_n.structured_outputs == sig_o.structured_outputs

    rng = np.random.default_rng(3)
    for shape in SHAPES[:5]:
        x = rng.standard_normal(shape).astype(np.float32)
        y = rng.standard_normal(shape).astype(np.float32)
        assert_same(original.f(x, y), optimized.f(x, y), tf.float32)
        assert_same(sig_o(x=x, y=y), sig_n(x=x, y=y), tf.float32)
    # Ten calls each: the side effect behind control_ret still runs every time.
    assert optimized.count.numpy() == original.count.numpy() == 10
    assert disc_tf.stats()["fallbacks"] == 0


def test_a_lone_op_joins_a_cluster_reading_the_same_input():
    """Hugging Face's input-id check: ``Max(ids)`` only feeds the Assert's message, and
    ``ids < vocab`` its condition; alone, the Max would be a cluster too small to
    compile, so it joins the cluster that reads ``ids`` too (one more output)."""
    from disc_tf.cluster import clustering
    from disc_tf.cluster.graph_view import view_of_graph_def

    def checked(ids):
        tf.debugging.Assert(tf.reduce_all(ids < 200), [tf.reduce_max(ids)])
        return ids * 2

    spec = [tf.TensorSpec([None, None], tf.int32)]
    gd = tf.function(checked, input_signature=spec).get_concrete_function().graph.as_graph_def()
    result = clustering.find_clusters(view_of_graph_def(gd), min_cluster_size=2)
    (cluster,) = [c for c in result.clusters if any("Max" in n for n in c)]
    ops = {n.split("/")[-1] for n in cluster}
    assert {"Max", "Less", "All"} <= ops, cluster
    assert "Max" not in result.reasons, result.reasons
    # ids * 2 feeds the output, which waits for the Assert: joining the check's cluster
    # would make a cycle, so it stays a cluster too small
    assert result.reasons["mul"].startswith("cluster too small"), result.reasons


def test_constants_under_an_inlined_functions_control_node_join_the_cluster() -> None:
    """A Session inlines a function and gives each of its Consts a control input from a
    NoOp that reads only the variable handles: such Consts (here a reduction's axis) still
    join the cluster, which inherits the edge; a Const under any other control does not."""
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [None, None], name="x")
        v = tf.Variable(np.ones(3, np.float32), name="v")
        with tf.control_dependencies([v.handle.op]):
            gate = tf.no_op(name="input_control_node")
        with tf.control_dependencies([gate]):
            axis = tf.constant(1, name="axis")
        y = tf.tanh(x * 2.0, name="y")
        tf.reduce_sum(y * y, axis=axis, name="s")
        with tf.control_dependencies([y.op]):
            tf.constant(2, name="late")
    gd = g.as_graph_def()
    new, report = optimize_tf1(gd, frozenset({"x", "s", "late"}))
    [cluster] = report.compiled
    assert "axis" in {n for n, _ in cluster.ops}
    [disc] = _disc_nodes(new)
    assert "^input_control_node" in disc.input
    view = graph_view.view_of_graph_def(gd, gd.library)
    assert view.only_source_controls("axis") and not view.only_source_controls("late")
