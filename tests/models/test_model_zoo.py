"""Real models as users export them: keras-hub backbones (BERT, DistilBERT,
RoBERTa, GPT-2, Llama, Gemma, T5, BART), Keras applications (ResNet50, MobileNetV2,
EfficientNetB0 with dynamic HxW), LSTM and bidirectional GRU text models, and
Hugging Face TF BERT and GPT-2, all built from small configs with random weights.
Each is optimized and must compile every serving cluster (the report says so);
then, in a fresh process, the optimized model must load with both
``tf.saved_model.load`` and ``disc_tf.load``, match the original at 8 shapes
through both, with no fallback, and be called directly by ``disc_tf.load``.

Slow (minutes of C++ compile per model): ``make test-models`` installs the extra
packages (``tests/models/requirements.txt``) and runs this suite.
"""

from __future__ import annotations

import dataclasses
import pathlib
import pickle
import subprocess
import sys
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
    #: functions ``disc_tf.load`` must call directly (None: every one it plans)
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


def _lstm(keras):
    inp = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(100, 16)(inp)
    x = keras.layers.LSTM(16, return_sequences=True)(x)
    return keras.Model(inp, keras.layers.Dense(2)(keras.layers.GlobalAveragePooling1D()(x)))


#: keras-hub backbones, small: two layers, 4 heads of 16, vocabulary 200.
_SMALL = dict(num_layers=2, num_heads=4, hidden_dim=64, intermediate_dim=128)
_DECODER = dict(vocabulary_size=200, num_layers=2, num_query_heads=4, hidden_dim=64,
                intermediate_dim=128)
KERAS_HUB = {
    "bert": lambda m: m.BertBackbone(vocabulary_size=200, max_sequence_length=128, **_SMALL),
    "distilbert": lambda m: m.DistilBertBackbone(vocabulary_size=200, max_sequence_length=128,
                                                 **_SMALL),
    "roberta": lambda m: m.RobertaBackbone(vocabulary_size=200, max_sequence_length=128,
                                           **_SMALL),
    "gpt2": lambda m: m.GPT2Backbone(vocabulary_size=200, max_sequence_length=128, **_SMALL),
    "llama": lambda m: m.LlamaBackbone(num_key_value_heads=2, **_DECODER),
    "gemma": lambda m: m.GemmaBackbone(num_key_value_heads=1, head_dim=16, **_DECODER),
    "t5": lambda m: m.T5Backbone(vocabulary_size=200, **_SMALL),
    "bart": lambda m: m.BartBackbone(vocabulary_size=200, max_sequence_length=128, **_SMALL),
}


def _keras_hub_export(kind: str) -> Callable[[pathlib.Path], None]:
    def export(path: pathlib.Path) -> None:
        keras_hub = pytest.importorskip("keras_hub", reason="make test-models installs it")
        import keras

        keras.utils.set_random_seed(0)
        KERAS_HUB[kind](keras_hub.models).export(str(path))

    return export


def _hub_inputs(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """A keras-hub backbone's inputs (each model takes the ones its signature
    names): token ids, padding masks with padding in the first row, segments."""
    batch, length = 1 + n % 3, 1 + (7 * n * n) % 41
    mask = np.ones((batch, length), np.int32)
    mask[0, length // 2 + 1:] = 0
    out = {"segment_ids": rng.integers(0, 2, (batch, length)).astype(np.int32)}
    for prefix in ("", "encoder_", "decoder_"):
        out[prefix + "token_ids"] = rng.integers(0, 200, (batch, length)).astype(np.int32)
        out[prefix + "padding_mask"] = mask
    return out


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
    **{f"hub_{kind}": Zoo(_keras_hub_export(kind), _hub_inputs) for kind in KERAS_HUB},
    "resnet50": Zoo(_keras_export(lambda k: k.applications.ResNet50(
        weights=None, include_top=False, input_shape=(None, None, 3))), _image),
    "mobilenet_v2": Zoo(_keras_export(lambda k: k.applications.MobileNetV2(
        weights=None, include_top=False, input_shape=(None, None, 3))), _image),
    "efficientnet_b0": Zoo(_keras_export(lambda k: k.applications.EfficientNetB0(
        weights=None, include_top=False, input_shape=(None, None, 3))), _image),
    # Each RNN loop (While with its TensorList ops) is one loop cluster.
    "bidirectional_gru": Zoo(_keras_export(_bigru), _tokens),
    "lstm": Zoo(_keras_export(_lstm), _tokens),
    # The default scope: the signature and the root object's inference-mode calls (a
    # tf-keras model also saves its training-mode calls; those are left out).
    "hf_bert": Zoo(_hf_export("bert"), _hf_inputs),
    "hf_gpt2": Zoo(_hf_export("gpt2"), _hf_inputs),
    "hf_bert_signature": Zoo(_hf_export("bert"), _hf_inputs, signatures=["serving_default"]),
}


def _by_name(signature, inputs) -> dict[str, np.ndarray]:
    names = sorted(signature.structured_input_signature[1])
    if isinstance(inputs, dict):
        return {k: inputs[k] for k in names}
    return dict(zip(names, inputs))


#: Shapes per model: each loader's outputs are compared with the original's.
SHAPES = 8


def _fresh_process(dst: pathlib.Path, inputs: list[dict[str, np.ndarray]],
                   tmp_path: pathlib.Path) -> dict:
    """Loads the optimized model in a new Python process with both loaders and runs
    ``inputs`` through each one's serving signature. Returns the outputs, the stats
    and which functions ``disc_tf.load`` calls directly."""
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, **{f"{i}/{k}": v for i, x in enumerate(inputs) for k, v in x.items()})
    result = tmp_path / "result.pkl"
    run = subprocess.run([sys.executable, str(pathlib.Path(__file__).with_name("fresh_load.py")),
                          str(dst), str(feeds), str(result)], capture_output=True, text=True,
                         timeout=1800)
    assert run.returncode == 0, run.stderr[-4000:]
    with open(result, "rb") as f:
        return pickle.load(f)


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

    signature = tf.saved_model.load(str(src)).signatures["serving_default"]
    rng = np.random.default_rng(0)
    inputs = [_by_name(signature, zoo.inputs(rng, n)) for n in range(1, SHAPES + 1)]
    wants = [{k: v.numpy() for k, v in signature(**x).items()} for x in inputs]
    fresh = _fresh_process(dst, inputs, tmp_path)
    for loader in ("tf.saved_model.load", "disc_tf.load"):
        for want, got in zip(wants, fresh[loader]):
            assert sorted(got) == sorted(want), loader
            for key in want:
                np.testing.assert_allclose(got[key], want[key], rtol=zoo.rtol, atol=zoo.atol,
                                           err_msg=f"{loader}: {key}")
    assert fresh["stats"]["fallbacks"] == 0, fresh["stats"]
    direct = fresh["direct_functions"]
    if zoo.direct:
        serving = zoo.direct_functions or zoo.signatures or list(direct)
        assert all(direct[n] is None for n in serving), direct
        assert fresh["direct_calls"] == SHAPES
