"""Issue acceptance: Keras models exported as SavedModels (a MultiHeadAttention
transformer, an LSTM text model, a Conv2D network with dynamic HxW, an Embedding +
Dense recommender) and a TF1 placeholder graph: after `optimize` (strict: every
cluster compiles), outputs equal the original's at >= 5 shapes, and the compile
report's share of the serving signatures' compute ops inside compiled clusters is
>= 80% for the transformer and the recommender."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import layers

import disc_tf
from disc_tf.optimizer import BodyOptimizer
from disc_tf.saved_model import optimize_saved_model
from tests.harness import run_in_session

SHAPES = [(1, 5), (3, 9), (2, 17), (4, 1), (6, 12)]


def _transformer() -> tuple[keras.Model, list[tf.TensorSpec]]:
    inp = keras.Input((None,), dtype="int32")
    x = layers.Embedding(100, 32)(inp)
    a = layers.MultiHeadAttention(4, 8)(x, x)
    x = layers.LayerNormalization()(x + a)
    f = layers.Dense(64, activation="gelu")(x)
    x = layers.LayerNormalization()(x + layers.Dense(32)(f))
    out = layers.Dense(2)(layers.GlobalAveragePooling1D()(x))
    return keras.Model(inp, out), [tf.TensorSpec([None, None], tf.int32)]


def _lstm() -> tuple[keras.Model, list[tf.TensorSpec]]:
    inp = keras.Input((None,), dtype="int32")
    x = layers.Embedding(100, 16)(inp)
    x = layers.LSTM(16)(x)
    out = layers.Dense(1, activation="sigmoid")(x)
    return keras.Model(inp, out), [tf.TensorSpec([None, None], tf.int32)]


def _conv() -> tuple[keras.Model, list[tf.TensorSpec]]:
    model = keras.Sequential([
        keras.Input((None, None, 3)),
        layers.Conv2D(8, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(),
        layers.Conv2D(8, 3, padding="same"),
        layers.BatchNormalization(),
        layers.Activation("relu"),
        layers.GlobalAveragePooling2D(),
        layers.Dense(4),
    ])
    return model, [tf.TensorSpec([None, None, None, 3], tf.float32)]


def _recommender() -> tuple[keras.Model, list[tf.TensorSpec]]:
    user = keras.Input((), dtype="int32")
    item = keras.Input((), dtype="int32")
    dense = keras.Input((8,))
    x = layers.Concatenate()([layers.Embedding(100, 16)(user), layers.Embedding(100, 16)(item),
                              dense])
    x = layers.Dense(32, activation="relu")(x)
    x = layers.Dense(16, activation="relu")(x)
    out = layers.Dense(1, activation="sigmoid")(x)
    specs = [tf.TensorSpec([None], tf.int32), tf.TensorSpec([None], tf.int32),
             tf.TensorSpec([None, 8], tf.float32)]
    return keras.Model([user, item, dense], out), specs


def _inputs(name: str, rng: np.random.Generator, n: int, t: int) -> list[np.ndarray]:
    if name in ("transformer", "lstm"):
        return [rng.integers(0, 100, (n, t)).astype(np.int32)]
    if name == "conv":
        return [rng.normal(size=(n, t + 2, t + 5, 3)).astype(np.float32)]
    return [rng.integers(0, 100, (n * t,)).astype(np.int32),
            rng.integers(0, 100, (n * t,)).astype(np.int32),
            rng.normal(size=(n * t, 8)).astype(np.float32)]


MODELS = {"transformer": (_transformer, 80.0), "lstm": (_lstm, None),
          "conv": (_conv, None), "recommender": (_recommender, 80.0)}


def _export(name: str, root) -> str:
    keras.utils.set_random_seed(0)
    model, specs = MODELS[name][0]()
    if name == "recommender":
        fn = tf.function(lambda u, i, d: model([u, i, d]), input_signature=specs)
    else:
        fn = tf.function(lambda x: model(x), input_signature=specs)
    path = str(root / name)
    tf.saved_model.save(model, path, signatures=fn)
    return path


@pytest.mark.parametrize("name", sorted(MODELS))
def test_keras_model_clustered_and_identical(name, tmp_path):
    src = _export(name, tmp_path)
    dst = str(tmp_path / f"{name}_opt")
    report = optimize_saved_model(src, dst, strict=True)
    assert report.compiled and len(report.compiled) == len(report.clusters)
    done, total = report.serving_share()
    assert total > 0 and done > 0, report
    minimum = MODELS[name][1]
    if minimum is not None:
        assert 100.0 * done / total >= minimum, (done, total, report.unclustered_ops)

    original = tf.saved_model.load(src).signatures["serving_default"]
    optimized = tf.saved_model.load(dst).signatures["serving_default"]
    names = sorted(original.structured_input_signature[1])
    order = {"recommender": ["d", "i", "u"]}.get(name)
    disc_tf.reset_stats()
    rng = np.random.default_rng(0)
    for n, t in SHAPES:
        xs = _inputs(name, rng, n, t)
        if order:  # inputs by keyword: dense, item, user
            xs = [xs[2], xs[1], xs[0]]
        kwargs = {k: tf.constant(v) for k, v in zip(names, xs)}
        expected, actual = original(**kwargs), optimized(**kwargs)
        for key in expected:
            np.testing.assert_allclose(actual[key].numpy(), expected[key].numpy(),
                                       rtol=1e-4, atol=1e-5)
    stats = disc_tf.stats()
    assert stats["fallbacks"] == 0
    assert stats["kernels"] > 0  # compiled clusters really ran


def test_tf1_placeholder_graph_in_a_session():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, None], name="x")
        w = tf.constant(np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32))
        s = tf.shape(x)
        h = tf.reshape(x, [s[0] * s[1] // 6, 6])
        y = tf.nn.softmax(tf.matmul(h, w) + 1.0)
        tf.identity(tf.reduce_sum(y, axis=1) * tf.cast(s[0], tf.float32), name="out")
    gd = graph.as_graph_def()
    body = BodyOptimizer(gd.library)
    optimized = body.optimize_graph_def(gd, frozenset({"x", "out"}))
    body.add_new_functions(optimized.library)  # the clusters' TF fallbacks
    assert sum(n.op == "DiscCluster" for n in optimized.node) == 1
    rng = np.random.default_rng(1)
    for rows, cols in [(2, 3), (1, 6), (4, 9), (3, 2), (6, 1)]:
        value = rng.normal(size=(rows, cols)).astype(np.float32)
        np.testing.assert_allclose(run_in_session(optimized, "out:0", {"x:0": value}),
                                   run_in_session(gd, "out:0", {"x:0": value}),
                                   rtol=1e-4, atol=1e-5)
