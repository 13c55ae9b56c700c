"""A model that loaded before ``optimize`` loads after it: every name the SavedModel
refers to outside the rewritten function bodies stays valid.

* the object graph's ``captured_tensor`` entries name tensors inside a function
  (Keras' swish captures its Dense layer's BiasAdd): the rewrite re-creates them;
* a shape computation copied into a cluster (``Shape(x) -> Reshape``) reads ``x``,
  which another cluster must then return even when nothing else outside it reads
  ``x`` (T5's and Llama's layer norms).

Each model is optimized, then loaded in a fresh process with ``tf.saved_model.load``
and with ``disc_tf.load``; outputs match TF at several shapes with no fallback.
"""

from __future__ import annotations

import json
import os
import pathlib
import textwrap

import keras
import numpy as np
import tensorflow as tf

import disc_tf
from disc_tf.saved_model import object_graph_references, optimize_saved_model
from tests import fresh_python

REPO = pathlib.Path(__file__).resolve().parents[2]

_SERVE = """
import json, sys
import numpy as np
import tensorflow as tf
import disc_tf
data = np.load(sys.argv[2])
n = len([k for k in data.files if k.startswith("out")])
inputs = [[data[f"in{i}_{j}"] for j in range(int(data["arity"]))] for i in range(n)]
for loader in (tf.saved_model.load, disc_tf.load):
    model = loader(sys.argv[1])
    fn = getattr(model, sys.argv[3])
    for i in range(n):
        args = inputs[i] if sys.argv[4] == "args" else [inputs[i]]
        np.testing.assert_allclose(np.asarray(fn(*args)), data[f"out{i}"], rtol=2e-5, atol=2e-5)
print("STATS", json.dumps(disc_tf.stats()))
"""


def _serve_in_fresh_process(model_dir: pathlib.Path, fn: str, cases: list, expected: list,
                            tmp_path: pathlib.Path, packed: bool = False) -> dict:
    """Loads ``model_dir`` both ways in a new process; ``fn(*case)`` must give ``expected``."""
    arrays = {"arity": np.array(len(cases[0]))}
    for i, (case, out) in enumerate(zip(cases, expected)):
        arrays[f"out{i}"] = out
        for j, a in enumerate(case):
            arrays[f"in{i}_{j}"] = a
    np.savez(tmp_path / "data.npz", **arrays)
    env = dict(os.environ, PYTHONPATH=str(REPO), DISC_TF_CACHE_DIR=str(tmp_path / "cache"))
    proc = fresh_python.run(["-c", textwrap.dedent(_SERVE), str(model_dir),
                            str(tmp_path / "data.npz"), fn, "list" if packed else "args"],
                            env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.split("STATS ", 1)[1])


class _CopiedShapeChain(tf.Module):
    """``m`` is read only inside its cluster, but the Reshape's cluster (past a Sort,
    which disc_tf does not compile) computes its shape from ``tf.shape(m)``."""

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def __call__(self, x):
        m = tf.tanh(x) * 2.0
        u = tf.sort(m + 1.0, axis=-1)
        s = tf.shape(m)
        return tf.reshape(u * 3.0 - 1.0, [s[0] * s[1]])


def test_a_copied_shape_computation_reads_a_tensor_of_another_cluster(tmp_path):
    model = _CopiedShapeChain()
    tf.saved_model.save(model, str(tmp_path / "orig"))
    report = optimize_saved_model(str(tmp_path / "orig"), str(tmp_path / "opt"))
    assert len(report.compiled) == 2 and not [c for c in report.clusters if c.error]
    rng = np.random.default_rng(0)
    cases = [[rng.standard_normal(s).astype(np.float32)] for s in [(3, 4), (1, 9), (6, 1), (0, 2)]]
    expected = [model(*c).numpy() for c in cases]
    stats = _serve_in_fresh_process(tmp_path / "opt", "__call__", cases, expected, tmp_path)
    assert stats["fallbacks"] == 0 and stats["clusters"] == 2 and stats["compilations"] == 0


def _recommender() -> keras.Model:
    user = keras.Input((None,), dtype="int32", name="user")
    items = keras.Input((None,), dtype="int32", name="items")
    h = keras.layers.Concatenate(axis=-1)([keras.layers.Embedding(50, 8)(user),
                                           keras.layers.Embedding(80, 8)(items)])
    h = keras.layers.Dense(24, activation="swish")(h)
    h = keras.layers.LayerNormalization()(h)
    return keras.Model([user, items], keras.layers.Dense(4)(h))


def test_a_keras_model_whose_object_graph_captures_inner_tensors(tmp_path):
    keras.utils.set_random_seed(1)
    model = _recommender()
    model.export(str(tmp_path / "orig"), verbose=False)
    orig = tf.saved_model.load(str(tmp_path / "orig"))
    from tensorflow.core.protobuf import saved_model_pb2

    sm = saved_model_pb2.SavedModel()
    sm.ParseFromString((tmp_path / "orig" / "saved_model.pb").read_bytes())
    refs = object_graph_references(sm.meta_graphs[0])
    assert any("BiasAdd" in n for names in refs.values() for n in names), refs  # the case
    disc_tf.reset_stats()
    report = optimize_saved_model(str(tmp_path / "orig"), str(tmp_path / "opt"))
    assert report.compiled and not [c for c in report.clusters if c.error]
    compiled_ops = {op for c in report.compiled for _, op in c.ops}
    assert {"BiasAdd", "MatMul"} <= compiled_ops  # the captured BiasAdd is compiled too
    rng = np.random.default_rng(2)
    cases = [[rng.integers(0, 50, (b, t)).astype(np.int32), rng.integers(0, 80, (b, t)).astype(
        np.int32)] for b, t in [(2, 3), (1, 7), (5, 1), (3, 12)]]
    expected = [orig.serve(c).numpy() for c in cases]
    stats = _serve_in_fresh_process(tmp_path / "opt", "serve", cases, expected, tmp_path,
                                    packed=True)
    assert stats["fallbacks"] == 0 and stats["clusters"] >= 1
