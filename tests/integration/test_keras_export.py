"""A Keras ``model.export()`` SavedModel, optimized, served in fresh processes.

The model is exported by Keras (variables, the ``serve`` and
``serving_default`` signatures), optimized with ``disc_tf.optimize``, then
loaded by a new interpreter twice: through ``tf.saved_model.load`` and
through ``tf.compat.v1.saved_model.load`` into a Session (the loader TF
Serving uses). Both must return what the Keras model returns, run compiled
clusters and never fall back to the original ops.
"""

from __future__ import annotations

import json
import os
import pathlib
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf  # noqa: F401 - Keras needs it loaded first
from tensorflow.core.protobuf import saved_model_pb2

import disc_tf
from disc_tf.cluster.rewrite import DISC_OP
from tests import fresh_python

REPO = pathlib.Path(__file__).resolve().parents[2]
SHAPES = [(2, 5), (1, 1), (3, 17), (0, 4), (4, 33)]  # (batch, time); features fixed at 8

_EAGER = """
import json, sys
import numpy as np
import tensorflow as tf
import disc_tf
data = np.load(sys.argv[2])
model = tf.saved_model.load(sys.argv[1])
for sig_name in ("serve", "serving_default"):
    sig = model.signatures[sig_name]
    for i in range(int(data["n"])):
        out = sig(tf.constant(data[f"x{i}"]))
        (got,) = out.values()
        np.testing.assert_allclose(got.numpy(), data[f"y{i}"], rtol=1e-5, atol=1e-6)
for i in range(int(data["n"])):
    np.testing.assert_allclose(model.serve(data[f"x{i}"]).numpy(), data[f"y{i}"],
                               rtol=1e-5, atol=1e-6)
print("STATS", json.dumps(disc_tf.stats()))
"""

_SESSION = """
import json, sys
import numpy as np
import tensorflow as tf
import disc_tf
data = np.load(sys.argv[2])
with tf.compat.v1.Session(graph=tf.Graph()) as sess:
    meta = tf.compat.v1.saved_model.load(sess, ["serve"], sys.argv[1])
    ops = {n.op for f in sess.graph.as_graph_def().library.function for n in f.node_def}
    assert "DiscCluster" in ops, sorted(ops)
    for sig_name in ("serve", "serving_default"):
        sig = meta.signature_def[sig_name]
        (inp,) = sig.inputs.values()
        (out,) = sig.outputs.values()
        for i in range(int(data["n"])):
            got = sess.run(out.name, {inp.name: data[f"x{i}"]})
            np.testing.assert_allclose(got, data[f"y{i}"], rtol=1e-5, atol=1e-6)
print("STATS", json.dumps(disc_tf.stats()))
"""


def _build_model() -> keras.Model:
    keras.utils.set_random_seed(3)
    inp = keras.Input((None, 8))
    h = keras.layers.Dense(16, activation="gelu")(inp)
    h = keras.layers.LayerNormalization()(h)
    h = keras.layers.Dense(4)(h)
    out = keras.layers.Softmax()(h * 2.0 + 1.0)
    return keras.Model(inp, out)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("keras_export")
    model = _build_model()
    model.export(str(root / "orig"), verbose=False)
    disc_tf.optimize(str(root / "orig"), str(root / "opt"))
    rng = np.random.default_rng(11)
    arrays: dict[str, np.ndarray] = {"n": np.array(len(SHAPES))}
    for i, (b, t) in enumerate(SHAPES):
        x = rng.standard_normal((b, t, 8)).astype(np.float32)
        arrays[f"x{i}"] = x
        arrays[f"y{i}"] = np.asarray(model(x))
    np.savez(root / "data.npz", **arrays)
    return root


def _serve(script: str, model_dir: pathlib.Path, data: pathlib.Path,
           cache: pathlib.Path) -> dict:
    env = dict(os.environ, DISC_TF_CACHE_DIR=str(cache), PYTHONPATH=str(REPO),
               TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_DISC_ENABLE", None)
    proc = fresh_python.run(["-c", textwrap.dedent(script), str(model_dir),
                            str(data)], env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("STATS ")][-1]
    return json.loads(line[len("STATS "):])


def test_optimized_export_keeps_signatures_variables_and_manifest(exported):
    opt = exported / "opt"
    assert (opt / "variables" / "variables.index").is_file()
    manifest = json.loads((opt / "assets.extra" / "disc" / "clusters.json").read_text())
    assert any(c["error"] is None for c in manifest), manifest
    sm = saved_model_pb2.SavedModel.FromString((opt / "saved_model.pb").read_bytes())
    meta = sm.meta_graphs[0]
    assert {"serve", "serving_default"} <= set(meta.signature_def)
    disc_nodes = [n for f in meta.graph_def.library.function for n in f.node_def
                  if n.op == DISC_OP]
    assert disc_nodes and all(n.attr["artifact"].s for n in disc_nodes)


def test_export_serves_through_saved_model_load_in_a_fresh_process(exported, tmp_path):
    stats = _serve(_EAGER, exported / "opt", exported / "data.npz", tmp_path / "cache")
    assert stats["clusters"] >= 1 and stats["kernels"] >= 1, stats
    assert stats["compilations"] == 0 and stats["fallbacks"] == 0, stats


def test_export_serves_through_the_tf1_session_loader_in_a_fresh_process(exported, tmp_path):
    stats = _serve(_SESSION, exported / "opt", exported / "data.npz", tmp_path / "cache")
    assert stats["clusters"] >= 1 and stats["kernels"] >= 1, stats
    assert stats["compilations"] == 0 and stats["fallbacks"] == 0, stats


def test_unoptimized_export_runs_no_cluster(exported, tmp_path):
    """The check above can fail: the original export has no DiscCluster."""
    stats = _serve(_EAGER, exported / "orig", exported / "data.npz", tmp_path / "cache")
    assert stats["clusters"] == 0, stats
