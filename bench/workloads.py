"""Benchmark workloads: small TF models with dynamic dims and their shape streams.

Each workload is a ``tf.Module`` whose ``__call__`` is a ``tf.function`` with an
``input_signature`` of unknown dims, saved as a SavedModel, plus a seeded
stream of mostly-distinct input shapes (the traffic a serving process sees).
The model-sized workloads (BERT encoders, a FastSpeech2-like conv stack, a
recommender tower, a Keras encoder block) live in ``bench.models`` and run by
default; two real models (a keras-hub GPT-2 decoder and Keras MobileNetV2, also
in ``bench.models``; ``make bench-deps`` installs keras-hub) and the three
elementwise micro-workloads here run when named.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable, Iterator

import numpy as np
import tensorflow as tf

from bench import models

#: Number of shapes in the full and the ``--quick`` streams.
FULL_STREAM = 48
QUICK_STREAM = 12


class GeluBias(tf.Module):
    """Bias add, tanh-GELU, residual add, scale and a sigmoid gate on [b, s, 768]."""

    HIDDEN = 768

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        h = self.HIDDEN
        self.bias = tf.Variable(rng.normal(0.0, 0.1, [h]).astype(np.float32), name="bias")
        self.scale = tf.Variable(rng.uniform(0.5, 1.5, [h]).astype(np.float32), name="scale")
        self.gate = tf.Variable(rng.normal(0.0, 0.5, [h]).astype(np.float32), name="gate")

    @tf.function(input_signature=[tf.TensorSpec([None, None, HIDDEN], tf.float32, name="x")])
    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        """Returns the gated GELU block output, same shape as ``x``."""
        h = tf.add(x, self.bias)
        inner = tf.multiply(0.79788456, tf.add(h, tf.multiply(0.044715, h * h * h)))
        gelu = tf.multiply(tf.multiply(0.5, h), tf.add(1.0, tf.tanh(inner)))
        y = tf.multiply(tf.add(gelu, x), self.scale)
        return y * tf.sigmoid(tf.add(y, self.gate))


class SwishLayerStack(tf.Module):
    """Rounds of affine + swish + clip with a MatMul between rounds, on [b, 512]."""

    WIDTH = 512
    ROUNDS = 3

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        w = self.WIDTH
        self.scales = [tf.Variable(rng.uniform(0.5, 1.5, [w]).astype(np.float32), name=f"s{i}")
                       for i in range(self.ROUNDS)]
        self.biases = [tf.Variable(rng.normal(0.0, 0.1, [w]).astype(np.float32), name=f"b{i}")
                       for i in range(self.ROUNDS)]
        self.kernels = [
            tf.Variable((rng.standard_normal([w, w]) / np.sqrt(w)).astype(np.float32),
                        name=f"k{i}")
            for i in range(self.ROUNDS - 1)
        ]

    @tf.function(input_signature=[tf.TensorSpec([None, WIDTH], tf.float32, name="x")])
    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        """Returns the stack's output, shape [batch, 512]."""
        for i in range(self.ROUNDS):
            if i:
                x = tf.matmul(x, self.kernels[i - 1])
            x = tf.add(tf.multiply(x, self.scales[i]), self.biases[i])
            x = x * tf.sigmoid(x)
            x = tf.maximum(tf.minimum(x, 6.0), -6.0)
        return x


class FeatureNormalizer(tf.Module):
    """Recommender-style numeric features on [b, 64]: log1p, clamp, standardize, fill.

    Missing features are encoded as negative values; they are replaced by a
    per-feature default after normalisation.
    """

    FEATURES = 64

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        f = self.FEATURES
        self.mean = tf.Variable(rng.uniform(1.0, 4.0, [f]).astype(np.float32), name="mean")
        self.std = tf.Variable(rng.uniform(0.5, 2.0, [f]).astype(np.float32), name="std")
        self.fill = tf.Variable(rng.normal(0.0, 0.1, [f]).astype(np.float32), name="fill")

    @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32, name="x")])
    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        """Returns normalised features, shape [batch, 64]."""
        present = tf.greater_equal(x, 0.0)
        logx = tf.math.log(tf.add(tf.abs(x), 1.0))
        clamped = tf.minimum(tf.maximum(logx, 0.0), 12.0)
        inv_std = tf.math.rsqrt(tf.add(tf.square(self.std), 1e-6))
        z = tf.multiply(tf.subtract(clamped, self.mean), inv_std)
        return tf.where(present, z, self.fill)


@dataclasses.dataclass(frozen=True)
class Workload:
    """A benchmark model and its input stream."""

    name: str
    description: str
    make_module: Callable[[], tf.Module]
    shape_sampler: Callable[[np.random.Generator], tuple[int, ...]]
    value_sampler: Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]
    default: bool = True  # part of a plain ``bench.run``

    def save(self, directory: str | pathlib.Path) -> pathlib.Path:
        """Saves the module (with its serving signature) as a SavedModel."""
        module = self.make_module()
        path = pathlib.Path(directory)
        tf.saved_model.save(module, str(path), signatures={"serving_default": module.__call__})
        return path

    def shapes(self, seed: int, count: int) -> list[tuple[int, ...]]:
        """``count`` input shapes drawn from the workload's range (seeded)."""
        rng = np.random.default_rng(seed)
        return [self.shape_sampler(rng) for _ in range(count)]

    def stream(self, seed: int, count: int) -> Iterator[np.ndarray]:
        """The seeded stream of ``count`` inputs; identical in every process."""
        rng = np.random.default_rng(seed + 1)
        for shape in self.shapes(seed, count):
            yield self.value_sampler(rng, shape)


def _normal(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32)


def _features(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Heavy-tailed non-negative counts with ~10% missing (-1) entries."""
    values = rng.lognormal(1.0, 1.5, shape).astype(np.float32)
    values[rng.random(shape) < 0.1] = -1.0
    return values


def _tokens(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Token ids of the decoder's vocabulary."""
    return rng.integers(0, models.GptDecoder.VOCABULARY, shape).astype(np.int32)


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            "gelu_bias_stream",
            "x[batch 1-4, seq 8-256, 768]: bias, tanh-GELU, residual, scale, sigmoid gate",
            GeluBias,
            lambda rng: (int(rng.integers(1, 5)), int(rng.integers(8, 257)), GeluBias.HIDDEN),
            _normal,
            default=False,
        ),
        Workload(
            "swish_layer_stack",
            "x[batch 1-2048, 512]: 3 x (affine, swish, clip) with MatMul in between",
            SwishLayerStack,
            lambda rng: (int(rng.integers(1, 2049)), SwishLayerStack.WIDTH),
            _normal,
            default=False,
        ),
        Workload(
            "feature_normalizer",
            "x[batch 1-4096, 64]: log(|x|+1), clamp, standardize (rsqrt), select on mask",
            FeatureNormalizer,
            lambda rng: (int(rng.integers(1, 4097)), FeatureNormalizer.FEATURES),
            _features,
            default=False,
        ),
        Workload(
            "bert_base",
            "x[batch 1-4, seq 8-256, 768]: 2 BERT-base encoder layers (12 heads, FFN 3072, erf GELU)",
            models.BertBase,
            lambda rng: (int(rng.integers(1, 5)), int(rng.integers(8, 257)), models.BertBase.HIDDEN),
            _normal,
        ),
        Workload(
            "bert_small",
            "x[batch 1-8, seq 8-128, 256]: 4 small BERT encoder layers (4 heads, FFN 1024, tanh GELU)",
            models.BertSmall,
            lambda rng: (int(rng.integers(1, 9)), int(rng.integers(8, 129)), models.BertSmall.HIDDEN),
            _normal,
        ),
        Workload(
            "fastspeech_conv",
            "x[1, T 16-800, 256]: FastSpeech2-like 2 x (Conv1D k9 to 1024, ReLU, Conv1D k1, "
            "residual, LayerNorm) + variance predictor (2 x Conv1D k3, ReLU, LayerNorm; linear)",
            models.FastSpeechConvStack,
            lambda rng: (1, int(rng.integers(16, 801)), models.FastSpeechConvStack.HIDDEN),
            _normal,
        ),
        Workload(
            "recommender_tower",
            "x[batch 1-2048, 64]: feature normalisation (log(|x|+1), clamp, standardize, fill), "
            "MLP 64-512-256-64 (ReLU), L2 normalise",
            models.RecommenderTower,
            lambda rng: (int(rng.integers(1, 2049)), models.RecommenderTower.FEATURES),
            _features,
        ),
        Workload(
            "keras_encoder",
            "x[batch 1-8, seq 8-128, 128]: Keras functional model, MultiHeadAttention (4 x 32) + "
            "LayerNormalization + Dense FFN 512 (tanh GELU)",
            models.KerasEncoderBlock,
            lambda rng: (int(rng.integers(1, 9)), int(rng.integers(8, 129)), models.KerasEncoderBlock.HIDDEN),
            _normal,
        ),
        Workload(
            "gpt2_decoder",
            "tokens[batch 1-4, seq 8-256]: keras-hub GPT-2 backbone from config (4 layers, "
            "hidden 256, 4 heads, FFN 1024; causal mask, learned positions)",
            models.GptDecoder,
            lambda rng: (int(rng.integers(1, 5)), int(rng.integers(8, 257))),
            _tokens,
            default=False,
        ),
        Workload(
            "mobilenet_v2",
            "x[batch 1-4, H 96-224, W 96-224, 3]: Keras MobileNetV2 features (weights=None, "
            "include_top=False, dynamic height and width)",
            models.MobileNetFeatures,
            lambda rng: (int(rng.integers(1, 5)), int(rng.integers(96, 225)),
                         int(rng.integers(96, 225)), 3),
            _normal,
            default=False,
        ),
    )
}

#: The workloads a plain ``bench.run`` measures.
DEFAULT_WORKLOADS = [name for name, w in WORKLOADS.items() if w.default]
