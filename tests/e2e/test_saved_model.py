"""AOT path: optimize a SavedModel, load it in fresh processes, compare with TF."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from disc_tf.saved_model import optimize_saved_model
from tests import fresh_python
from tests.harness import assert_same

REPO = pathlib.Path(__file__).resolve().parents[2]


class _Model(tf.Module):
    """Elementwise model with variables read outside the cluster, two outputs."""

    def __init__(self) -> None:
        self.w = tf.Variable(np.linspace(-1.0, 1.0, 16).astype(np.float32))
        self.b = tf.Variable(0.25)

    @tf.function(input_signature=[tf.TensorSpec([None, None, None], tf.float32),
                                  tf.TensorSpec([None], tf.float32)])
    def __call__(self, x, bias):
        h = x * self.w[: tf.shape(x)[-1]] + self.b
        h = h + bias
        gelu = 0.5 * h * (1.0 + tf.tanh(0.7978845608 * (h + 0.044715 * h * h * h)))
        return {"y": gelu * tf.sigmoid(x) - tf.square(bias) * 0.1,
                "mask": tf.cast(h > 0.0, tf.int32)}


def _shapes(seed: int) -> list[tuple[tuple, tuple]]:
    rng = np.random.default_rng(seed)
    out = [((2, 3, 16), (16,)), ((1, 7, 16), (1,)), ((0, 4, 16), (16,)), ((3, 0, 16), (1,))]
    for _ in range(4):
        b, t = int(rng.integers(1, 6)), int(rng.integers(1, 40))
        out.append(((b, t, 16), (16,) if rng.random() < 0.5 else (1,)))
    return out


def _inputs(seed: int):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(xs).astype(np.float32), rng.standard_normal(bs).astype(np.float32))
            for xs, bs in _shapes(seed)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("sm")
    model = _Model()
    tf.saved_model.save(model, str(root / "orig"))
    return model, root


def test_optimize_compiles_once_and_matches_tf_at_every_shape(saved):
    model, root = saved
    disc_tf.reset_stats()
    report = optimize_saved_model(str(root / "orig"), str(root / "opt"))
    assert report.compiled, report
    built = disc_tf.stats()
    assert built["compilations"] + built["cache_hits"] == len(report.compiled)
    loaded = tf.saved_model.load(str(root / "opt"))
    for x, b in _inputs(1):
        assert_same(model(x, b)["y"], loaded(x, b)["y"], tf.float32)
        assert_same(model(x, b)["mask"], loaded(x, b)["mask"], tf.int32)
    after = disc_tf.stats()
    assert after["compilations"] == built["compilations"]
    assert after["fallbacks"] == 0
    assert after["clusters"] >= len(report.compiled)


def test_bad_shapes_raise_invalid_argument_then_next_call_works(saved):
    model, root = saved
    if not (root / "opt").exists():
        optimize_saved_model(str(root / "orig"), str(root / "opt"))
    loaded = tf.saved_model.load(str(root / "opt"))
    x = np.ones((2, 3, 16), np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="Incompatible shapes"):
        loaded(x, np.ones((5,), np.float32))
    assert_same(model(x, np.ones((16,), np.float32))["y"],
                loaded(x, np.ones((16,), np.float32))["y"], tf.float32)


_OPTIMIZE = """
import json, sys
import disc_tf
disc_tf.reset_stats()
disc_tf.optimize(sys.argv[1], sys.argv[2])
print("STATS", json.dumps(disc_tf.stats()))
"""

_SERVE = """
import json, sys
import numpy as np
import tensorflow as tf
import disc_tf
data = np.load(sys.argv[2])
model = tf.saved_model.load(sys.argv[1])
n = len([k for k in data.files if k.startswith("x")])
for i in range(n):
    got = model(data[f"x{i}"], data[f"b{i}"])["y"].numpy()
    np.testing.assert_allclose(got, data[f"y{i}"], rtol=1e-5, atol=1e-6)
print("STATS", json.dumps(disc_tf.stats()))
"""


def _run(script: str, *args: str, cache: pathlib.Path) -> dict:
    env = dict(os.environ, DISC_TF_CACHE_DIR=str(cache), PYTHONPATH=str(REPO))
    proc = fresh_python.run(["-c", textwrap.dedent(script), *args], env=env,
                            timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("STATS ")][-1]
    return json.loads(line[len("STATS "):])


def test_second_process_hits_the_cache(saved, tmp_path):
    _, root = saved
    cache = tmp_path / "cache"
    first = _run(_OPTIMIZE, str(root / "orig"), str(tmp_path / "a"), cache=cache)
    second = _run(_OPTIMIZE, str(root / "orig"), str(tmp_path / "b"), cache=cache)
    assert first["compilations"] >= 1 and first["cache_hits"] == 0
    assert second["compilations"] == 0
    assert second["cache_hits"] == first["compilations"]


def test_optimized_model_serves_from_another_directory_in_a_fresh_process(saved, tmp_path):
    model, root = saved
    if not (root / "opt").exists():
        optimize_saved_model(str(root / "orig"), str(root / "opt"))
    moved = tmp_path / "elsewhere" / "model"
    shutil.copytree(root / "opt", moved)
    arrays = {}
    for i, (x, b) in enumerate(_inputs(2)):
        arrays[f"x{i}"], arrays[f"b{i}"] = x, b
        arrays[f"y{i}"] = model(x, b)["y"].numpy()
    np.savez(tmp_path / "data.npz", **arrays)
    stats = _run(_SERVE, str(moved), str(tmp_path / "data.npz"), cache=tmp_path / "empty_cache")
    assert stats["clusters"] >= 1 and stats["kernels"] >= 1
    assert stats["compilations"] == 0 and stats["fallbacks"] == 0


def test_optimized_model_serves_through_the_tf1_session_loader(tmp_path):
    """The loader TF Serving uses: tf.compat.v1.saved_model.load into a Session."""

    class Scorer(tf.Module):
        def __init__(self) -> None:
            self.w = tf.Variable(np.linspace(-1.0, 1.0, 8).astype(np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x")])
        def __call__(self, x):
            return {"y": tf.nn.softmax(tf.tanh(x * self.w) * 2.0)}

    model = Scorer()
    tf.saved_model.save(model, str(tmp_path / "orig"),
                        signatures=model.__call__.get_concrete_function())
    report = optimize_saved_model(str(tmp_path / "orig"), str(tmp_path / "opt"))
    assert report.compiled
    disc_tf.reset_stats()
    rng = np.random.default_rng(9)
    xs = [rng.standard_normal((rows, 8)).astype(np.float32) for rows in (5, 1, 0, 23, 2)]
    expected = [model(x)["y"].numpy() for x in xs]  # eagerly, before a graph is default
    with tf.compat.v1.Session(graph=tf.Graph()) as sess:
        meta = tf.compat.v1.saved_model.load(sess, ["serve"], str(tmp_path / "opt"))
        sig = meta.signature_def["serving_default"]
        ops = {n.op for f in sess.graph.as_graph_def().library.function for n in f.node_def}
        assert "DiscCluster" in ops
        for x, want in zip(xs, expected):
            got = sess.run(sig.outputs["y"].name, {sig.inputs["x"].name: x})
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    stats = disc_tf.stats()
    assert stats["clusters"] >= 1 and stats["fallbacks"] == 0
