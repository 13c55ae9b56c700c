"""disc_tf.load: functions with loops and conditionals. Keras RNNs, whose While
loops compile whole (one loop cluster each), are called directly with each loop one
DiscCluster step that reads its variables when it runs; a loop that stays a TF op
(an op the compiler does not know in its body) is one eager step of the direct call;
a loop that assigns a variable goes through TF's function runtime; tf.cond and
tf.switch_case are eager steps. All against TF at random shapes."""

from __future__ import annotations

import pathlib

import keras
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import text_format
from tensorflow.core.framework import function_pb2
from tensorflow.python.eager import context

import disc_tf
from disc_tf.direct_call import _lookup_function
from disc_tf.direct_plan import NotDirect, plan_function

RTOL, ATOL = 1e-4, 1e-5
VOCAB = 100
#: (batch, length) per call: lengths 1..40, batches 1..4
SHAPES = [(1, 1), (2, 7), (3, 40), (4, 13), (1, 25), (4, 2), (2, 33), (3, 1)]


def _bigru() -> keras.Model:
    inp = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(VOCAB, 16)(inp)
    x = keras.layers.Bidirectional(keras.layers.GRU(16))(x)
    return keras.Model(inp, keras.layers.Dense(2)(x))


def _lstm() -> keras.Model:
    inp = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(VOCAB, 16)(inp)
    x = keras.layers.LSTM(16, return_sequences=True)(x)
    return keras.Model(inp, keras.layers.Dense(2)(x))


RNNS = {"bigru": (_bigru, 2), "lstm": (_lstm, 1)}  # builder, While loops


@pytest.fixture(scope="module", params=sorted(RNNS))
def rnn_dirs(request, tmp_path_factory) -> tuple[str, pathlib.Path]:
    root = tmp_path_factory.mktemp(f"loops_{request.param}")
    keras.utils.set_random_seed(0)
    RNNS[request.param][0]().export(str(root / "orig"), verbose=False)
    disc_tf.optimize(str(root / "orig"), str(root / "opt"), strict=False)
    report = disc_tf.last_report()
    assert [c.name for c in report.compiled].count("disc_loop_0") == 1, report.summary()
    assert report.serving_share()[0] == report.serving_share()[1], report.summary()
    return request.param, root


def _tokens(rng: np.random.Generator, batch: int, length: int) -> np.ndarray:
    return rng.integers(0, VOCAB, (batch, length)).astype(np.int32)


def _loops(plan) -> list:
    """The loop clusters of a direct plan."""
    return [s for s in plan.steps if s.op == "DiscCluster" and s.cluster_name.startswith("disc_loop_")]


def test_a_keras_rnn_is_called_directly_with_its_loops_compiled(rnn_dirs):
    kind, root = rnn_dirs
    reference = tf.saved_model.load(str(root / "orig"))
    model = disc_tf.load(str(root / "opt"))
    assert model.direct_functions() == {"serve": None, "serving_default": None}
    assert model.warmed_up == {"serve": True, "serving_default": True}
    plan = model.serve.plan
    assert len(_loops(plan)) == RNNS[kind][1], plan.describe()
    assert not [s for s in plan.steps if s.op.endswith("While")], plan.describe()
    for step in _loops(plan):
        # The loop cluster takes the variables' handles (it reads them when it runs).
        assert any(s.kind == "capture" for s in step.inputs)
    signature = model.signatures["serving_default"]
    (key,) = signature.structured_input_signature[1]
    disc_tf.reset_stats()
    rng = np.random.default_rng(0)
    for batch, length in SHAPES:
        x = _tokens(rng, batch, length)
        want = reference.serve(tf.constant(x)).numpy()
        np.testing.assert_allclose(model.serve(x).numpy(), want, RTOL, ATOL)
        (got,) = signature(**{key: tf.constant(x)}).values()
        np.testing.assert_allclose(got.numpy(), want, RTOL, ATOL)
    assert model.serve.direct_calls == len(SHAPES) and model.serve.tf_calls == 0
    assert signature.direct_calls == len(SHAPES) and signature.tf_calls == 0
    assert disc_tf.stats()["fallbacks"] == 0


def test_a_loop_reads_a_variable_assigned_after_load(rnn_dirs):
    _, root = rnn_dirs
    model = disc_tf.load(str(root / "opt"))
    fn = model.serve
    # A variable the loop cluster takes as a handle, assigned through that handle.
    loop = _loops(fn.plan)[0]
    handle = fn._captured[next(s.index for s in loop.inputs if s.kind == "capture")]
    value = tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.float32)
    x = _tokens(np.random.default_rng(1), 3, 9)
    before = fn(x).numpy()
    tf.raw_ops.AssignVariableOp(resource=handle, value=value * 1.5 + 0.1)
    after = fn(x).numpy()
    assert not np.allclose(before, after)
    # TF's function runtime on the same restored model and variables.
    np.testing.assert_allclose(after, model.module.serve(tf.constant(x)).numpy(), RTOL, ATOL)
    assert fn.direct_calls == 2


class _UnknownOpLoop(tf.Module):
    """A loop whose body has an op the compiler does not know (Atan2): it stays a TF
    op, an eager step of the direct call, with its body's other ops clustered."""

    def __init__(self) -> None:
        self.w = tf.Variable(np.linspace(-1, 1, 8).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32)])
    def __call__(self, x):
        def body(i, h):
            return i + 1, tf.math.atan2(tf.tanh(h * self.w + 0.5), h * h + 1.0)

        _, h = tf.while_loop(lambda i, h: i < 3, body, [tf.constant(0), tf.tanh(x * 2.0 + 1.0)])
        return tf.sigmoid(h + 1.0) * 2.0


@pytest.fixture(scope="module")
def unknown_op_dirs(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("unknown_op_loop")
    module = _UnknownOpLoop()
    tf.saved_model.save(module, str(root / "orig"))
    disc_tf.optimize(str(root / "orig"), str(root / "opt"), strict=False)
    report = disc_tf.last_report()
    why = [w for r in report.unclustered.values() for w in r.values()
           if w.startswith("loop not compiled whole")]
    assert why and "Atan2" in why[0], report.unclustered
    return root


def test_a_loop_left_to_tf_is_an_eager_step(unknown_op_dirs):
    model = disc_tf.load(str(unknown_op_dirs / "opt"))
    reference = tf.saved_model.load(str(unknown_op_dirs / "orig"))
    assert model.direct_functions() == {"__call__": None, "serving_default": None}
    plan = model._call.plan
    (step,) = [s for s in plan.steps if s.op == "While"]
    attrs = dict(step.attrs)
    # The loop's functions are called by the names the restored model registered,
    # and its variables are passed as the captured handles.
    assert all(context.context().has_function(attrs[a]) for a in ("body", "cond"))
    assert any(s.kind == "capture" for s in step.inputs)
    assert not any(s.kind == "variable" for s in step.inputs)
    assert step.num_outputs == len(attrs["T"])
    assert "eager While" in plan.describe()
    rng = np.random.default_rng(4)
    for m in (1, 3, 9):
        x = rng.standard_normal((m, 8)).astype(np.float32)
        np.testing.assert_allclose(model(x).numpy(), reference(x).numpy(), RTOL, ATOL)
    assert model._call.direct_calls == 3 and model._call.tf_calls == 0


def test_an_unregistered_loop_function_is_refused(unknown_op_dirs):
    model = disc_tf.load(str(unknown_op_dirs / "opt"), warmup=False)
    (concrete,) = model._call.concrete_functions
    (step,) = [s for s in model._call.plan.steps if s.op == "While"]
    body = dict(step.attrs)["body"]
    is_resource = [t.dtype == tf.resource for t in concrete.graph.inputs]

    def lookup(name: str):
        return None if name == body else _lookup_function(name)

    with pytest.raises(NotDirect, match=f"function {body} \\(body of While .*\\) is not "
                                        "registered"):
        plan_function(concrete.function_def, 1, is_resource, lookup)


class _CountingLoop(tf.Module):
    """A tf.while_loop whose body assigns a variable: no direct call may run it."""

    def __init__(self) -> None:
        self.steps = tf.Variable(0.0)
        self.w = tf.Variable(np.linspace(-1, 1, 8).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32)])
    def __call__(self, x):
        def body(i, h):
            self.steps.assign_add(1.0)
            return i + 1, tf.tanh(h * self.w + 0.5)

        _, h = tf.while_loop(lambda i, h: i < 3, body, [tf.constant(0), x * 2.0])
        return h + self.steps


def test_a_loop_that_assigns_a_variable_goes_through_tf(tmp_path):
    module = _CountingLoop()
    tf.saved_model.save(module, str(tmp_path / "orig"))
    disc_tf.optimize(str(tmp_path / "orig"), str(tmp_path / "opt"), strict=False)
    model = disc_tf.load(str(tmp_path / "opt"))
    reason = model.direct_functions()["__call__"]
    assert reason is not None and "AssignAddVariableOp" in reason and "has state" in reason
    assert "body of While" in reason
    assert model.warmed_up["__call__"] is False  # no warm-up call: it would count steps
    rng = np.random.default_rng(2)
    for m in (1, 5, 17):  # each call adds 3 steps, on each side
        x = rng.standard_normal((m, 8)).astype(np.float32)
        np.testing.assert_allclose(model(x).numpy(), module(x).numpy(), RTOL, ATOL)
    assert model._call.tf_calls == 3 and model._call.direct_calls == 0
    assert float(model.steps.numpy()) == float(module.steps.numpy()) == 9.0


class _Branches(tf.Module):
    """tf.cond with a branch that reads a variable (If), with stateless branches
    (StatelessIf), and tf.switch_case (Case: a list of branch functions)."""

    def __init__(self) -> None:
        self.w = tf.Variable(np.linspace(-1, 1, 8).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32)])
    def __call__(self, x):
        h = x * 2.0 + 1.0
        y = tf.cond(tf.reduce_sum(h) > 0.0, lambda: tf.tanh(h * self.w), lambda: tf.exp(-h * h))
        return y - 1.0

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32)])
    def pure(self, x):
        h = x * 2.0 + 1.0
        return tf.cond(tf.reduce_sum(h) > 0.0, lambda: tf.tanh(h), lambda: tf.exp(-h * h)) - 1.0

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32)])
    def switch(self, x):
        index = tf.cast(tf.reduce_sum(x) > 0.0, tf.int32) + tf.cast(tf.shape(x)[0] > 4, tf.int32)
        h = x * 3.0
        return tf.switch_case(index, [lambda: tf.tanh(h), lambda: tf.sigmoid(h) * self.w,
                                      lambda: tf.nn.relu(h) + 1.0])


def test_conditionals_are_called_directly(tmp_path):
    module = _Branches()
    tf.saved_model.save(module, str(tmp_path / "orig"))
    disc_tf.optimize(str(tmp_path / "orig"), str(tmp_path / "opt"), strict=False)
    model = disc_tf.load(str(tmp_path / "opt"))
    assert model.direct_functions() == {"__call__": None, "pure": None, "switch": None}
    fns = {"__call__": model._call, "pure": model.pure, "switch": model.switch}
    ops = {name: [s.op for s in fn.plan.steps if s.op.endswith(("If", "Case"))]
           for name, fn in fns.items()}
    assert ops["__call__"] == ["If"] and ops["pure"] == ["StatelessIf"], ops
    assert len(ops["switch"]) == 1 and ops["switch"][0].endswith("Case"), ops
    rng = np.random.default_rng(3)
    disc_tf.reset_stats()
    for m in (1, 3, 6):
        for sign in (1.0, -1.0):  # both branches (and three cases)
            x = (np.abs(rng.standard_normal((m, 8))) * sign).astype(np.float32)
            for name, fn in fns.items():
                want = getattr(module, name)(x).numpy()
                np.testing.assert_allclose(fn(x).numpy(), want, RTOL, ATOL, err_msg=name)
    assert all(fn.direct_calls == 6 and fn.tf_calls == 0 for fn in fns.values())
    assert disc_tf.stats()["fallbacks"] == 0
    # The If takes the variable's handle: an assignment after load is read.
    x = np.ones((2, 8), np.float32)
    model.w.assign(model.w * 2.0)
    module.w.assign(module.w * 2.0)
    np.testing.assert_allclose(model(x).numpy(), module(x).numpy(), RTOL, ATOL)


def _fdef(text: str) -> function_pb2.FunctionDef:
    return text_format.Parse(text, function_pb2.FunctionDef())


_FLOAT_FN = 'signature {{ name: "{}" input_arg {{ name: "x" type: DT_FLOAT }} ' \
            'output_arg {{ name: "y" type: DT_FLOAT }} }}'
_T = 'attr { key: "T" value { type: DT_FLOAT } }'


def _nested_loop(leaf_op: str) -> dict[str, function_pb2.FunctionDef]:
    """``top``: a DiscCluster, then a While whose body calls ``inner`` (through a
    PartitionedCall), whose If's branch runs ``leaf_op``."""
    cluster = """node_def { name: "c0" op: "DiscCluster" input: "x"
      attr { key: "Tin" value { list { type: DT_FLOAT } } }
      attr { key: "Tout" value { list { type: DT_FLOAT } } }
      attr { key: "output_shapes" value { list { shape { unknown_rank: true } } } }
      attr { key: "artifact" value { s: "" } } attr { key: "artifact_sha256" value { s: "" } }
      attr { key: "fallback" value { func { name: "fallback" } } } }"""
    types = 'attr { key: "T" value { list { type: DT_FLOAT } } }'
    leaf = (f'node_def {{ name: "leaf" op: "{leaf_op}" input: "x" {_T} '
            'attr { key: "dtype" value { type: DT_FLOAT } } }')
    fns = {
        "top": f"""{_FLOAT_FN.format("top")} {cluster}
            node_def {{ name: "loop" op: "While" input: "c0:outputs:0" {types}
              attr {{ key: "body" value {{ func {{ name: "body" }} }} }}
              attr {{ key: "cond" value {{ func {{ name: "cond" }} }} }} }}
            ret {{ key: "y" value: "loop:output:0" }}""",
        "cond": 'signature { name: "cond" input_arg { name: "x" type: DT_FLOAT } '
                'output_arg { name: "y" type: DT_BOOL } }',
        "body": f"""{_FLOAT_FN.format("body")}
            node_def {{ name: "call" op: "PartitionedCall" input: "x"
              attr {{ key: "f" value {{ func {{ name: "inner" }} }} }} }}
            ret {{ key: "y" value: "call:output:0" }}""",
        "inner": f"""{_FLOAT_FN.format("inner")}
            node_def {{ name: "pred" op: "Const" }}
            node_def {{ name: "branch" op: "If" input: "pred:output:0" input: "x"
              attr {{ key: "then_branch" value {{ func {{ name: "leaf" }} }} }}
              attr {{ key: "else_branch" value {{ func {{ name: "fallback" }} }} }} }}
            ret {{ key: "y" value: "branch:output:0" }}""",
        "leaf": f'{_FLOAT_FN.format("leaf")} {leaf} ret {{ key: "y" value: "leaf:y:0" }}',
        "fallback": _FLOAT_FN.format("fallback"),
    }
    return {name: _fdef(text) for name, text in fns.items()}


def test_a_loop_whose_functions_only_compute_is_one_eager_step():
    fns = _nested_loop("Tanh")
    plan = plan_function(fns["top"], 1, [False], fns.get)
    assert [s.op for s in plan.steps] == ["DiscCluster", "While"], plan.describe()
    attrs = dict(plan.steps[1].attrs)
    assert (attrs["body"], attrs["cond"], attrs["T"]) == ("body", "cond", [1])


def test_functions_a_loop_calls_are_checked_transitively():
    fns = _nested_loop("RandomStandardNormal")
    with pytest.raises(NotDirect, match="leaf \\(then_branch of If branch\\): op "
                                        "RandomStandardNormal \\(leaf\\) has state"):
        plan_function(fns["top"], 1, [False], fns.get)


def test_inspect_agrees_with_optimize_on_a_keras_rnn(rnn_dirs):
    import io

    from disc_tf.cli import inspect_model

    _, root = rnn_dirs
    disc_tf.optimize(str(root / "orig"), str(root / "again"), strict=False)
    total = disc_tf.last_report().total_line()
    assert "100.0% of serving compute ops" in total, total
    for model in ("orig", "again"):  # what would compile, and what did
        out = io.StringIO()
        inspect_model(str(root / model), out=out)
        assert f"serving path: {total}" in out.getvalue(), (model, out.getvalue()[-2000:])
