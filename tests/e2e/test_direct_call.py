"""disc_tf.load: optimized SavedModels whose DiscCluster ops are called directly
(disc_tf/direct_call.py), against TF at random shapes, and the calls that must
go through TF's function runtime instead."""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager import context, execute

import disc_tf
from disc_tf.direct_plan import Source
from tests import fresh_python
from tests.harness import gpu_code_path

REPO = pathlib.Path(__file__).resolve().parents[2]
RTOL = ATOL = 1e-4


class _Mlp(tf.Module):
    """Two dense layers (GELU between), a scale vector and a second output."""

    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.w1 = tf.Variable(rng.standard_normal((32, 48)).astype(np.float32) / 6)
        self.b1 = tf.Variable(rng.standard_normal(48).astype(np.float32))
        self.w2 = tf.Variable(rng.standard_normal((48, 16)).astype(np.float32) / 7)
        self.scale = tf.Variable(np.float32(0.5))

    @tf.function(input_signature=[tf.TensorSpec([None, 32], tf.float32, name="x")])
    def __call__(self, x):
        h = tf.nn.gelu(tf.matmul(x, self.w1) + self.b1)
        y = tf.matmul(h, self.w2) * self.scale
        return {"y": y, "norm": tf.reduce_sum(y * y, axis=-1)}

    @tf.function(input_signature=[tf.TensorSpec([], tf.float32)])
    def rescale(self, factor):
        self.w1.assign(self.w1 * factor)
        self.scale.assign_add(factor)
        return self.scale


class _Sorted(tf.Module):
    """A cluster, then an op no cluster takes (Sort), then another cluster."""

    def __init__(self) -> None:
        self.b = tf.Variable(np.linspace(-1, 1, 8).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32)])
    def __call__(self, x):
        h = tf.tanh(x + self.b) * 2.0
        return tf.exp(tf.sort(h, axis=-1)) - 1.0


def _rows(rng: np.random.Generator, m: int, k: int = 32) -> np.ndarray:
    return rng.standard_normal((m, k)).astype(np.float32)


@pytest.fixture(scope="module")
def mlp_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("direct")
    model = _Mlp()
    tf.saved_model.save(model, str(root / "orig"),
                        signatures={"serving_default": model.__call__.get_concrete_function()})
    disc_tf.optimize(str(root / "orig"), str(root / "opt"))
    return root


def _check(expected: dict, actual: dict) -> None:
    assert set(expected) == set(actual)
    for key in expected:
        np.testing.assert_allclose(actual[key].numpy(), expected[key].numpy(), RTOL, ATOL)


def test_direct_calls_match_tf_at_random_shapes(mlp_dirs):
    reference = tf.saved_model.load(str(mlp_dirs / "orig"))
    model = disc_tf.load(str(mlp_dirs / "opt"))
    reasons = model.direct_functions()
    assert reasons == {"serving_default": None, "__call__": None, "rescale": reasons["rescale"]}
    assert "AssignVariableOp" in reasons["rescale"]  # state: rescale goes through TF
    plan = model._call.plan
    assert len(plan.steps) == 1
    assert sum(s.kind == "variable" for s in plan.steps[0].inputs) >= 3, plan.describe()
    assert Source("arg", 0) in plan.steps[0].inputs
    disc_tf.reset_stats()
    rng = np.random.default_rng(3)
    sizes = [1, 0, 7, 64, 129] + [int(m) for m in rng.integers(1, 300, 4)]
    for m in sizes:
        x = _rows(rng, m)
        _check(reference(tf.constant(x)), model(tf.constant(x)))
        _check(reference(x), model(x))  # a numpy array of the signature's dtype
        sig = model.signatures["serving_default"](x=tf.constant(x))
        ref_sig = reference.signatures["serving_default"](x=tf.constant(x))
        _check(ref_sig, sig)
    assert model._call.direct_calls == 2 * len(sizes)
    assert model._call.tf_calls == 0
    assert model.signatures["serving_default"].direct_calls == len(sizes)
    stats = disc_tf.stats()
    assert stats["fallbacks"] == 0
    assert stats["compilations"] == 0  # the stored artifacts, nothing compiled again
    assert stats["packed_weights"] == 0  # packed by load's warm-up call, before the reset


def test_load_warms_up_each_direct_function(mlp_dirs):
    disc_tf.reset_stats()
    model = disc_tf.load(str(mlp_dirs / "opt"))
    assert model.warmed_up == {"serving_default": True, "__call__": True, "rescale": False}
    # w1 and w2, packed once: __call__ and the signature run one eager kernel (same attrs).
    # (The CPU backend's packed GEMM operands; cuBLAS reads weights as they are.)
    assert disc_tf.stats()["packed_weights"] == (0 if gpu_code_path() else 2)
    assert model._call.direct_calls == 0  # the warm-up is not a call
    cold = disc_tf.load(str(mlp_dirs / "opt"), warmup=False)
    assert cold.warmed_up == {}
    disc_tf.reset_stats()
    x = tf.constant(_rows(np.random.default_rng(10), 5))
    model(x)
    assert disc_tf.stats()["packed_weights"] == 0  # packed already
    _check(model(x), cold(x))
    # The cold model restored variables of its own: packed on its first call.
    assert disc_tf.stats()["packed_weights"] == (0 if gpu_code_path() else 2)


def test_a_variable_assigned_after_load_is_read_by_the_next_call(mlp_dirs):
    reference = tf.saved_model.load(str(mlp_dirs / "orig"))
    model = disc_tf.load(str(mlp_dirs / "opt"))
    rng = np.random.default_rng(4)
    x = tf.constant(_rows(rng, 33))
    _check(reference(x), model(x))
    for factor in (0.5, -2.0, 1.25):
        reference.rescale(tf.constant(factor))
        model.rescale(tf.constant(factor))  # a restored function, through TF
        np.testing.assert_allclose(model.scale.numpy(), reference.scale.numpy())
        _check(reference(x), model(x))
        _check(reference(x), model.signatures["serving_default"](x=x))
    assert model._call.tf_calls == 0


def test_calls_the_direct_path_cannot_take_go_through_tf(mlp_dirs):
    model = disc_tf.load(str(mlp_dirs / "opt"))
    plain = tf.saved_model.load(str(mlp_dirs / "opt"))
    rng = np.random.default_rng(5)
    x = _rows(rng, 6)
    # float64 numpy input: converted by TF's function, as tf.saved_model.load's object does
    _check(plain(x.astype(np.float64)), model(x.astype(np.float64)))
    # Under a tape the call is TF's, which records it (and finds no DiscCluster gradient).
    for loaded in (plain, model):
        with tf.GradientTape(), pytest.raises(LookupError, match="DiscCluster"):
            loaded(x)
    traced = tf.function(lambda v: model(v)["y"])
    np.testing.assert_allclose(traced(x).numpy(), plain(x)["y"].numpy(), RTOL, ATOL)
    calls_before = model._call.tf_calls
    assert calls_before >= 3
    # Wrong static dim and wrong rank: TF's own errors.
    for bad in (_rows(rng, 4, 31), np.zeros((2, 3, 32), np.float32)):
        with pytest.raises((ValueError, TypeError)):
            plain(bad)
        with pytest.raises((ValueError, TypeError)):
            model(bad)
    with pytest.raises(TypeError):
        model.signatures["serving_default"](y=tf.constant(x))
    assert model._call.direct_calls == 0


def _save_and_optimize(module: tf.Module, root: pathlib.Path) -> None:
    tf.saved_model.save(module, str(root / "orig"))
    disc_tf.optimize(str(root / "orig"), str(root / "opt"))


def test_a_stateless_op_outside_the_clusters_is_an_eager_step(tmp_path):
    module = _Sorted()
    _save_and_optimize(module, tmp_path)
    model = disc_tf.load(str(tmp_path / "opt"))
    assert model.direct_functions()["__call__"] is None
    plan = model._call.plan
    eager = [s.op for s in plan.steps if not s.is_cluster]
    assert "TopKV2" in eager and sum(s.is_cluster for s in plan.steps) == 2, plan.describe()
    assert "eager TopKV2" in plan.describe()
    rng = np.random.default_rng(6)
    for m in (1, 5, 40):
        x = _rows(rng, m, 8)
        np.testing.assert_allclose(model(x).numpy(), module(x).numpy(), RTOL, ATOL)
    assert model._call.tf_calls == 0 and model._call.direct_calls == 3


class _Counting(tf.Module):
    """A cluster, and a variable assignment no direct call may run."""

    def __init__(self) -> None:
        self.calls = tf.Variable(0.0)

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32)])
    def serve(self, x):
        self.calls.assign_add(1.0)
        return tf.tanh(x * 2.0) + 1.0


def test_root_functions_are_planned_and_state_goes_through_tf(tmp_path, caplog):
    module = _Counting()
    _save_and_optimize(module, tmp_path)
    with caplog.at_level("WARNING", logger="disc_tf.direct"):
        model = disc_tf.load(str(tmp_path / "opt"))
    reason = model.direct_functions()["serve"]
    assert reason is not None and "AssignAddVariableOp" in reason and "has state" in reason
    assert any("serve runs through TF's function runtime" in r.message for r in caplog.records)
    x = _rows(np.random.default_rng(7), 3, 8)
    np.testing.assert_allclose(model.serve(x).numpy(), module.serve(x).numpy(), RTOL, ATOL)
    assert model.serve.tf_calls == 1 and float(model.calls.numpy()) == 1.0


class _Served(tf.Module):
    """A Keras-export-like root function ``serve`` (no __call__, no signature of it)."""

    def __init__(self) -> None:
        self.w = tf.Variable(np.linspace(-1, 1, 8 * 4).reshape(8, 4).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32)])
    def serve(self, x):
        return tf.nn.relu(tf.matmul(x, self.w)) * 2.0


def test_a_root_serve_function_is_called_directly(tmp_path):
    module = _Served()
    _save_and_optimize(module, tmp_path)
    model = disc_tf.load(str(tmp_path / "opt"))
    assert model.direct_functions()["serve"] is None
    assert model.warmed_up["serve"]
    rng = np.random.default_rng(8)
    disc_tf.reset_stats()
    for m in (1, 6, 33):
        x = _rows(rng, m, 8)
        np.testing.assert_allclose(model.serve(x).numpy(), module.serve(x).numpy(), RTOL, ATOL)
    assert model.serve.direct_calls == 3 and model.serve.tf_calls == 0
    assert disc_tf.stats()["fallbacks"] == 0
    # The rest of the restored function is there as it was.
    (concrete,) = model.serve.concrete_functions
    assert concrete.structured_input_signature[0][0].shape.as_list() == [None, 8]
    x = _rows(rng, 2, 8)
    np.testing.assert_allclose(model.serve.get_concrete_function()(tf.constant(x)).numpy(),
                               module.serve(x).numpy(), RTOL, ATOL)


def test_concurrent_direct_calls(mlp_dirs):
    reference = tf.saved_model.load(str(mlp_dirs / "orig"))
    model = disc_tf.load(str(mlp_dirs / "opt"))
    rng = np.random.default_rng(7)
    inputs = [tf.constant(_rows(rng, int(m))) for m in rng.integers(1, 200, 24)]
    expected = [reference(x) for x in inputs]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(model, inputs))
    for e, r in zip(expected, results):
        _check(e, r)
    assert model._call.direct_calls == len(inputs)


def test_a_cluster_s_variables_are_fed_as_one_bundle(mlp_dirs):
    """A direct call feeds the step's variable handles as one DiscVariableBundle: TF's
    eager runtime costs about 1.7 us per resource input per call."""
    model = disc_tf.load(str(mlp_dirs / "opt"))
    planned = model._call.plan.steps[0].inputs
    op, _, sources, attrs = model._call._full_steps[0]
    named = dict(zip(attrs[::2], attrs[1::2]))
    assert op == "DiscCluster"
    assert _positions(named["bundled_input_ranges"]) == [
        i for i, s in enumerate(planned) if s.kind == "variable"]
    assert list(sources) == [s for s in planned if s.kind != "variable"] + [Source("bundle", 0)]
    assert named["Tin"][-1] == tf.resource.as_datatype_enum
    assert len(named["Tin"]) == len(sources)
    # Both position lists go as runs, not one int per input (TF converts attrs per call).
    plan_attrs = dict(model._call.plan.steps[0].attrs)
    assert "bundled_inputs" not in named and "constant_inputs" not in named
    assert _positions(named["constant_input_ranges"]) == list(plan_attrs["constant_inputs"])
    assert len(named["bundled_input_ranges"]) < len(_positions(named["bundled_input_ranges"]))


def _positions(ranges):
    """The positions of flat [begin, end) pairs."""
    return [i for b, e in zip(ranges[::2], ranges[1::2]) for i in range(b, e)]


def _step_inputs(fn, sources, x, bundle):
    return [bundle if s.kind == "bundle" else fn._value(s, [x], []) for s in sources]


def test_a_bad_variable_bundle_is_an_error_not_a_crash(mlp_dirs):
    model = disc_tf.load(str(mlp_dirs / "opt"))
    fn = model._call
    op, num_outputs, sources, attrs = fn._full_steps[0]
    ctx = context.context()
    x = tf.constant(_rows(np.random.default_rng(8), 3))
    variables = [fn._captured[s.index] for s in fn.plan.steps[0].inputs if s.kind == "variable"]
    missing = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=None,
                                     shared_name="disc_tf_test_never_created")
    with pytest.raises(tf.errors.NotFoundError, match="does not exist"):
        execute.quick_execute("DiscVariableBundle", 1, [variables[0], missing], ("N", 2), ctx)
    short = execute.quick_execute("DiscVariableBundle", 1, variables[:-1],
                                  ("N", len(variables) - 1), ctx)[0]
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="DiscCluster 'disc_cluster_0': the variable bundle holds"):
        execute.quick_execute(op, num_outputs, _step_inputs(fn, sources, x, short), attrs, ctx)
    with pytest.raises(tf.errors.InvalidArgumentError, match="VariableBundle"):
        execute.quick_execute(op, num_outputs, _step_inputs(fn, sources, x, variables[0]),
                              attrs, ctx)
    named = dict(zip(attrs[::2], attrs[1::2]))
    positions = _positions(named.pop("bundled_input_ranges"))
    bad_layouts = [  # (attrs changed, the error)
        ({"bundled_inputs": list(reversed(positions))}, "ascending positions"),
        ({"bundled_input_ranges": [3, 1]}, "bundled_input_ranges must be ascending"),
        ({"bundled_input_ranges": [0, 1, 0, 2]}, "bundled_input_ranges must be ascending"),
        ({"bundled_input_ranges": [0]}, "bundled_input_ranges must hold pairs"),
        ({"bundled_input_ranges": [0, 2**30]}, "bundled_input_ranges must be ascending"),
        ({"bundled_inputs": positions, "constant_input_ranges": [0, 10**6]},
         "constant_input_ranges must be ascending"),
    ]
    for change, error in bad_layouts:
        bad = {**named, **change}
        with pytest.raises(tf.errors.InvalidArgumentError, match=error):
            execute.quick_execute(op, num_outputs, _step_inputs(fn, sources, x, fn._bundles[0]),
                                  tuple(v for item in bad.items() for v in item), ctx)
    # The positions as a list, the constant inputs as runs: the same step.
    listed = {**named, "bundled_inputs": positions}
    outs = execute.quick_execute(op, num_outputs, _step_inputs(fn, sources, x, fn._bundles[0]),
                                 tuple(v for item in listed.items() for v in item), ctx)
    _check(model(x), fn._pack(fn._out_recipe.values((x,), [outs])))
    # The model is still fine.
    assert model(x)["y"].shape == (3, 16)


def test_a_missing_variable_is_an_error_not_a_crash(mlp_dirs):
    model = disc_tf.load(str(mlp_dirs / "opt"))
    fn = model._call
    op, num_outputs, _, bundled_attrs = fn._full_steps[0]
    assert op == "DiscCluster"
    # The plan's step as it is, each variable fed by its handle (no bundle).
    sources = fn.plan.steps[0].inputs
    attrs = tuple(v for item in fn.plan.steps[0].attrs for v in item) + (
        "artifact", b"", "pending_key", dict(zip(bundled_attrs[::2], bundled_attrs[1::2]))[
            "pending_key"])
    x = tf.constant(_rows(np.random.default_rng(8), 3))
    inputs = [x if s.kind == "arg" else fn._captured[s.index] for s in sources]
    # Unbundled, the cluster still runs.
    outs = execute.quick_execute(op, num_outputs, inputs, attrs, context.context())
    _check(model(x), fn._pack(fn._out_recipe.values((x,), [outs])))
    # The plan's first variable replaced by a handle to a variable that does not exist.
    first_var = next(i for i, s in enumerate(sources) if s.kind == "variable")
    inputs[first_var] = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=None,
                                               shared_name="disc_tf_test_never_assigned")
    with pytest.raises(tf.errors.NotFoundError,
                       match="DiscCluster 'disc_cluster_0': Resource .*does not exist"):
        execute.quick_execute("DiscCluster", num_outputs, inputs, attrs, context.context())
    # The model is still fine.
    assert model(x)["y"].shape == (3, 16)


_SUBPROCESS = textwrap.dedent("""
    import sys
    import numpy as np
    import tensorflow as tf
    import disc_tf
    orig, opt = sys.argv[1], sys.argv[2]
    reference = tf.saved_model.load(orig)
    model = disc_tf.load(opt)
    assert model.warmed_up == {"serving_default": True, "__call__": True, "rescale": False}, \
        model.warmed_up
    disc_tf.reset_stats()
    rng = np.random.default_rng(9)
    for m in (3, 17, 0, 120):
        x = tf.constant(rng.standard_normal((m, 32)).astype(np.float32))
        got = model(x)
        for key, want in reference(x).items():
            np.testing.assert_allclose(got[key].numpy(), want.numpy(), 1e-4, 1e-4)
    print("direct", model._call.direct_calls, "fallbacks", disc_tf.stats()["fallbacks"])
""")


@pytest.mark.fallback
@pytest.mark.parametrize("env, fallbacks", [({}, 0), ({"DISC_TF_FORCE_FALLBACK": "1"}, 4)])
def test_direct_calls_in_a_fresh_process(mlp_dirs, env, fallbacks):
    """A fresh process (artifacts loaded from the model only); with the fallback
    forced, the same direct calls run the cluster's TF ops."""
    run_env = dict(os.environ, PYTHONPATH=str(REPO), **env)
    out = fresh_python.run(["-c", _SUBPROCESS, str(mlp_dirs / "orig"),
                           str(mlp_dirs / "opt")], env=run_env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"direct 4 fallbacks {fallbacks}" in out.stdout, out.stdout + out.stderr[-2000:]


class _Triples(tf.Module):
    """Reshapes [n] to [n / 3, 3]: neither warm-up length (8, 1) is valid."""

    def __init__(self) -> None:
        self.w = tf.Variable(np.linspace(0.5, 1.5, 3).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def __call__(self, x):
        return tf.tanh(tf.reshape(x, [-1, 3]) * self.w)


def test_a_failing_warm_up_is_skipped(tmp_path):
    module = _Triples()
    tf.saved_model.save(module, str(tmp_path / "orig"))
    disc_tf.optimize(str(tmp_path / "orig"), str(tmp_path / "opt"))
    model = disc_tf.load(str(tmp_path / "opt"))
    assert model.direct_functions()["__call__"] is None
    assert model.warmed_up["__call__"] is False
    rng = np.random.default_rng(11)
    for n in (3, 0, 30, 999):
        x = rng.standard_normal(n).astype(np.float32)
        np.testing.assert_allclose(model(x).numpy(), module(x).numpy(), RTOL, ATOL)
    assert model._call.direct_calls == 4
    with pytest.raises(tf.errors.InvalidArgumentError):
        model(np.ones(4, np.float32))


class _TwoInputs(tf.Module):
    """Two inputs whose names sort the other way round, three outputs of two dtypes."""

    def __init__(self) -> None:
        self.w = tf.Variable(np.linspace(-1.0, 1.0, 16).astype(np.float32))
        self.b = tf.Variable(0.25)

    @tf.function(input_signature=[tf.TensorSpec([None, None, 16], tf.float32, name="zeta"),
                                  tf.TensorSpec([None], tf.float32, name="alpha")])
    def __call__(self, x, bias):
        h = x * self.w + self.b + bias
        return {"y": tf.tanh(h) * 2.0, "mask": tf.cast(h > 0.0, tf.int32),
                "s": tf.reduce_sum(h, -1)}


def test_a_keyword_signature_with_several_inputs_and_outputs(tmp_path):
    module = _TwoInputs()
    tf.saved_model.save(module, str(tmp_path / "orig"),
                        signatures=module.__call__.get_concrete_function())
    disc_tf.optimize(str(tmp_path / "orig"), str(tmp_path / "opt"))
    model = disc_tf.load(str(tmp_path / "opt"))
    # Unknown dims of 8 do not broadcast (bias [8] against [..., 16]); 1 does.
    assert model.warmed_up == {"serving_default": True, "__call__": True}
    sig = model.signatures["serving_default"]
    assert sig.plan is not None and sig.plan.num_args == 2, sig.reason
    rng = np.random.default_rng(12)
    for shape, bias_len in (((2, 3, 16), 16), ((1, 7, 16), 1), ((4, 0, 16), 1), ((3, 5, 16), 16)):
        x = rng.standard_normal(shape).astype(np.float32)
        b = rng.standard_normal(bias_len).astype(np.float32)
        want = module(x, b)
        for got in (model(x, b), sig(zeta=tf.constant(x), alpha=tf.constant(b))):
            assert set(got) == set(want)
            for key in want:
                assert got[key].dtype == want[key].dtype
                np.testing.assert_allclose(got[key].numpy(), want[key].numpy(), RTOL, ATOL)
    assert sig.direct_calls == 4 and model._call.direct_calls == 4


def test_a_refused_model_runs_every_call_through_tf(mlp_dirs):
    """What ``load`` builds when a GPU is visible: nothing planned or warmed up."""
    reference = tf.saved_model.load(str(mlp_dirs / "orig"))
    model = disc_tf.DiscModel(tf.saved_model.load(str(mlp_dirs / "opt")),
                              refuse="a GPU is visible")
    assert model.direct_functions() == {"serving_default": "a GPU is visible",
                                        "__call__": "a GPU is visible"}
    assert model.warmed_up == {}
    x = tf.constant(_rows(np.random.default_rng(13), 9))
    _check(reference(x), model(x))
    _check(reference.signatures["serving_default"](x=x),
           model.signatures["serving_default"](x=x))
    assert model._call.tf_calls == 1 and model._call.direct_calls == 0
    assert model.signatures["serving_default"].tf_calls == 1


class _Checked(tf.Module):
    """An input check (Assert, as Hugging Face models have) before a cluster."""

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32)])
    def serve(self, x):
        tf.raw_ops.Assert(condition=tf.reduce_all(x < 10.0), data=["x must stay below 10"])
        return tf.tanh(x * 2.0) + 1.0


def test_an_assert_runs_inside_the_direct_call(tmp_path):
    module = _Checked()
    _save_and_optimize(module, tmp_path)
    model = disc_tf.load(str(tmp_path / "opt"))
    assert model.direct_functions()["serve"] is None
    assert [s.op for s in model.serve.plan.steps if not s.is_cluster] == ["Assert"]
    x = _rows(np.random.default_rng(11), 4, 8)
    np.testing.assert_allclose(model.serve(x).numpy(), module.serve(x).numpy(), RTOL, ATOL)
    with pytest.raises(tf.errors.InvalidArgumentError, match="x must stay below 10"):
        model.serve(x + 20.0)
    assert model.serve.direct_calls == 1 and model.serve.tf_calls == 0


def test_a_cluster_step_runs_as_a_disc_call_of_four_attributes(mlp_dirs):
    """Each call executes DiscCall with the step's types, its fallback function and the
    number its node's attributes were recorded under (TF's eager runtime converts every attribute on each
    execution): the DiscCluster kernel of that node runs, compiled."""
    model = disc_tf.load(str(mlp_dirs / "opt"))
    fn = model._call
    op, num_outputs, sources, attrs = fn._steps[0]
    full_op, _, full_sources, full_attrs = fn._full_steps[0]
    named, full = dict(zip(attrs[::2], attrs[1::2])), dict(zip(full_attrs[::2], full_attrs[1::2]))
    assert (op, full_op) == ("DiscCall", "DiscCluster")
    assert sorted(named) == ["Tin", "Tout", "fallback", "id"] and sources == full_sources
    assert [named[k] for k in ("Tin", "Tout", "fallback")] == [
        full[k] for k in ("Tin", "Tout", "fallback")]
    reference = tf.saved_model.load(str(mlp_dirs / "orig"))
    rng = np.random.default_rng(21)
    disc_tf.reset_stats()
    for m in [1, 9, 130]:
        x = tf.constant(_rows(rng, m))
        # The step's inputs as its recipe makes them for a call: the argument, then the
        # variable bundle, each the very object the step's sources name.
        inputs = fn._calls[0][3].values((x,), [])
        expected = _step_inputs(fn, sources, x, fn._bundles[0])
        assert len(inputs) == len(expected) and all(a is b for a, b in zip(inputs, expected))
        outs = execute.quick_execute(op, num_outputs, inputs, attrs, context.context())
        _check(reference(x), fn._pack(fn._out_recipe.values((x,), [outs])))
    assert disc_tf.stats()["fallbacks"] == 0
    # The same attributes, the same number (one kernel, as one DiscCluster kernel before):
    # the signature's step. Another load's fallback function has another name.
    step = model.signatures["serving_default"]._steps[0]
    assert dict(zip(step[3][::2], step[3][1::2]))["id"] == named["id"]


def test_a_disc_call_that_names_no_node_or_other_types_is_an_error(mlp_dirs):
    model = disc_tf.load(str(mlp_dirs / "opt"))
    fn = model._call
    op, num_outputs, sources, attrs = fn._steps[0]
    named = dict(zip(attrs[::2], attrs[1::2]))
    x = tf.constant(_rows(np.random.default_rng(22), 3))
    inputs = _step_inputs(fn, sources, x, fn._bundles[0])
    ctx = context.context()
    def changed(**values):
        return tuple(v for item in {**named, **values}.items() for v in item)

    with pytest.raises(tf.errors.NotFoundError, match="no DiscCluster node is recorded under"):
        execute.quick_execute(op, num_outputs, inputs, changed(id=-5), ctx)
    doubles = [tf.float64.as_datatype_enum] * len(named["Tout"])
    with pytest.raises(tf.errors.InvalidArgumentError, match="output types or the fallback"):
        execute.quick_execute(op, num_outputs, inputs, changed(Tout=doubles), ctx)
    another = next(f for f in ctx.list_function_names() if f != named["fallback"])
    with pytest.raises(tf.errors.InvalidArgumentError, match="output types or the fallback"):
        execute.quick_execute(op, num_outputs, inputs, changed(fallback=another), ctx)
    # Other attributes under a number in use: refused; the same ones again: fine.
    full = fn._full_steps[0][3]
    renamed = tuple(b"other" if a == b"disc_cluster_0" else a for a in full)
    with pytest.raises(tf.errors.AlreadyExistsError, match="already names another node"):
        execute.quick_execute("DiscClusterRegister", 0, [], renamed + ("id", named["id"]), ctx)
    execute.quick_execute("DiscClusterRegister", 0, [], full + ("id", named["id"]), ctx)
    # The DiscCluster kernel's own errors come through, with its name.
    variables = [fn._captured[s.index] for s in fn.plan.steps[0].inputs if s.kind == "variable"]
    short = execute.quick_execute("DiscVariableBundle", 1, variables[:-1],
                                  ("N", len(variables) - 1), ctx)[0]
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="DiscCluster 'disc_cluster_0': the variable bundle holds"):
        execute.quick_execute(op, num_outputs, _step_inputs(fn, sources, x, short), attrs, ctx)
    assert model(x)["y"].shape == (3, 16)


def test_attributes_that_cannot_be_recorded_keep_the_disc_cluster_op(mlp_dirs):
    from disc_tf import cluster_call

    full = disc_tf.load(str(mlp_dirs / "opt"), warmup=False)._call._full_steps[0][3]
    named = dict(zip(full[::2], full[1::2]))
    del named["fallback"]  # a DiscCluster node must name its fallback function
    attrs = tuple(v for item in named.items() for v in item)
    assert cluster_call.as_call(attrs) == ("DiscCluster", attrs)
