"""Real models as users export them: Keras applications (MobileNetV2,
EfficientNetB0 with dynamic HxW), a bidirectional GRU text model, and Hugging Face
TF BERT and GPT-2 built from small configs. Each is optimized, must compile every
serving cluster (the report says so), match TF at several shapes, and be called
directly by ``disc_tf.load``.

Slow (minutes of C++ compile per model): ``make test-models`` installs the extra
packages (``tests/models/requirements.txt``) and runs this suite.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable

import numpy as np
import pytest
import tensorflow as tf

import disc_tf

pytestmark = pytest.mark.slow


@dataclasses.dataclass
class Zoo:
    """A model: how to export it, inputs at a size, and what it must reach."""

    export: Callable[[pathlib.Path], None]
    #: the serving signature's inputs (a dict by name, or a list in name order)
    inputs: Callable[[np.random.Generator, int], dict[str, np.ndarray] | list[np.ndarray]]
    min_share: float = 99.0  # % of serving compute ops inside compiled clusters
    direct: bool = True  # every serving function called directly
    rtol: float = 1e-4
    atol: float = 1e-5
    #: what ``optimize`` compiles (None: every serving signature and root function)
    signatures: list[str] | None = None
    #: functions ``disc_tf.load`` must call directly (None: every serving one but
    #: ``__call__``)
    direct_functions: list[str] | None = None


def _keras_export(build: Callable) -> Callable[[pathlib.Path], None]:
    def export(path: pathlib.Path) -> None:
        import keras

        keras.utils.set_random_seed(0)
        build(keras).export(str(path))

    return export


def _image(rng: np.random.Generator, n: int) -> list[np.ndarray]:
    return [rng.standard_normal((n, 32 + 8 * n, 40 + 4 * n, 3)).astype(np.float32)]


def _bigru(keras):
    inp = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(100, 16)(inp)
    x = keras.layers.Bidirectional(keras.layers.GRU(16))(x)
    return keras.Model(inp, keras.layers.Dense(2)(x))


def _tokens(rng: np.random.Generator, n: int) -> list[np.ndarray]:
    return [rng.integers(0, 100, (n, 3 + 4 * n)).astype(np.int32)]


def _hf_export(kind: str) -> Callable[[pathlib.Path], None]:
    def export(path: pathlib.Path) -> None:
        transformers = pytest.importorskip("transformers", reason="make test-models installs it")
        tf.keras.utils.set_random_seed(0)
        if kind == "bert":
            config = transformers.BertConfig(vocab_size=200, hidden_size=64, num_hidden_layers=2,
                                             num_attention_heads=4, intermediate_size=128)
            model = transformers.TFBertModel(config)
        else:
            config = transformers.GPT2Config(vocab_size=200, n_embd=64, n_layer=2, n_head=4,
                                             n_positions=128)
            model = transformers.TFGPT2Model(config)
        spec = {"input_ids": tf.TensorSpec([None, None], tf.int32, name="input_ids"),
                "attention_mask": tf.TensorSpec([None, None], tf.int32, name="attention_mask")}

        @tf.function(input_signature=[spec])
        def serving(inputs):
            return {"last_hidden_state": model(inputs).last_hidden_state}

        model({k: tf.ones([1, 4], tf.int32) for k in spec})  # builds the weights
        tf.saved_model.save(model, str(path), signatures={"serving_default": serving})

    return export


def _hf_inputs(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    t = 3 + 5 * n
    mask = np.ones((n, t), np.int32)
    mask[0, t - 2:] = 0  # padding in the first row
    return {"input_ids": rng.integers(0, 200, (n, t)).astype(np.int32), "attention_mask": mask}


ZOO = {
    "mobilenet_v2": Zoo(_keras_export(lambda k: k.applications.MobileNetV2(
        weights=None, include_top=False, input_shape=(None, None, 3))), _image),
    "efficientnet_b0": Zoo(_keras_export(lambda k: k.applications.EfficientNetB0(
        weights=None, include_top=False, input_shape=(None, None, 3))), _image),
    # The GRU loops (While with TensorList ops) stay TF: clusters around them.
    "bidirectional_gru": Zoo(_keras_export(_bigru), _tokens, min_share=80.0, direct=False),
    # The default scope: the signature and the root object's inference-mode calls (a
    # tf-keras model also saves its training-mode calls; those are left out). The
    # Keras call functions take a dict and Python flags: they run through TF's function
    # runtime, the signature directly.
    "hf_bert": Zoo(_hf_export("bert"), _hf_inputs, direct_functions=["serving_default"]),
    "hf_gpt2": Zoo(_hf_export("gpt2"), _hf_inputs, direct_functions=["serving_default"]),
    "hf_bert_signature": Zoo(_hf_export("bert"), _hf_inputs, signatures=["serving_default"]),
}


def _by_name(signature, inputs) -> dict[str, np.ndarray]:
    if isinstance(inputs, dict):
        return inputs
    return dict(zip(sorted(signature.structured_input_signature[1]), inputs))


@pytest.mark.parametrize("name", sorted(ZOO))
def test_model_compiles_its_serving_path_and_matches_tf(name, tmp_path):
    zoo = ZOO[name]
    src, dst = tmp_path / "model", tmp_path / "optimized"
    zoo.export(src)
    disc_tf.optimize(str(src), str(dst), strict=False, signatures=zoo.signatures)
    report = disc_tf.last_report()
    assert report.clusters and not report.refused, report.summary()
    assert not report.not_analysed, report.not_analysed
    done, total = report.serving_share()
    assert 100.0 * done / total >= zoo.min_share, report.summary()

    original = tf.saved_model.load(str(src))
    model = disc_tf.load(str(dst))
    serving = zoo.direct_functions or zoo.signatures or [
        n for n in model.direct_functions() if n != "__call__"]
    if zoo.direct:
        assert all(model.direct_functions()[n] is None for n in serving), \
            model.direct_functions()
    rng = np.random.default_rng(0)
    disc_tf.reset_stats()
    for n in (1, 2, 3):
        signature = original.signatures["serving_default"]
        inputs = _by_name(signature, zoo.inputs(rng, n))
        want = signature(**inputs)
        got = model.signatures["serving_default"](**inputs)
        for key in want:
            np.testing.assert_allclose(got[key].numpy(), want[key].numpy(), rtol=zoo.rtol,
                                       atol=zoo.atol)
    assert disc_tf.stats()["fallbacks"] == 0
    if zoo.direct:
        assert model.signatures["serving_default"].direct_calls == 3
