"""Model-sized benchmark workloads, built from plain TF ops (and one Keras model).

Every module's ``__call__`` is a ``tf.function`` whose input signature leaves the
serving dims unknown. Reshapes use constant shapes with ``-1`` for the one dynamic
dim, the way a graph exported for dynamic serving looks without in-graph shape math.
Weights are seeded and scaled so that activations stay O(1) through every layer.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf


def _weight(rng: np.random.Generator, shape: list[int], fan_in: int, name: str) -> tf.Variable:
    return tf.Variable((rng.standard_normal(shape) / math.sqrt(fan_in)).astype(np.float32), name=name)


def _vector(rng: np.random.Generator, n: int, scale: float, name: str, center: float = 0.0) -> tf.Variable:
    return tf.Variable((center + scale * rng.standard_normal(n)).astype(np.float32), name=name)


def layer_norm(x: tf.Tensor, gamma: tf.Variable, beta: tf.Variable, eps: float = 1e-6) -> tf.Tensor:
    """Layer norm over the last axis as mean / variance / rsqrt ops."""
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)
    var = tf.reduce_mean(tf.math.squared_difference(x, mean), axis=-1, keepdims=True)
    return (x - mean) * tf.math.rsqrt(var + eps) * gamma + beta


def gelu_erf(x: tf.Tensor) -> tf.Tensor:
    """The exact GELU, 0.5 x (1 + erf(x / sqrt 2))."""
    return 0.5 * x * (1.0 + tf.math.erf(x * 0.70710678))


def gelu_tanh(x: tf.Tensor) -> tf.Tensor:
    """The tanh approximation of GELU."""
    return 0.5 * x * (1.0 + tf.tanh(0.79788456 * (x + 0.044715 * x * x * x)))


class BertEncoder(tf.Module):
    """A stack of post-LN BERT encoder layers on hidden states ``[batch, seq, hidden]``.

    Projections into and out of the heads are Einsums (``bsh,hnd->bsnd``), attention
    is Transpose + BatchMatMulV2 + Softmax, the feed-forward is a 3-D x 2-D MatMul.
    """

    def __init__(self, hidden: int, layers: int, heads: int, seed: int = 0,
                 exact_gelu: bool = True) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        self.hidden, self.heads, self.head_dim = hidden, heads, hidden // heads
        self.exact_gelu = exact_gelu
        h, n, d, f = hidden, heads, hidden // heads, 4 * hidden
        self.params = []
        for i in range(layers):
            self.params.append({
                "wq": _weight(rng, [h, n, d], h, f"l{i}_wq"), "bq": _vector(rng, h, 0.02, f"l{i}_bq"),
                "wk": _weight(rng, [h, n, d], h, f"l{i}_wk"), "bk": _vector(rng, h, 0.02, f"l{i}_bk"),
                "wv": _weight(rng, [h, n, d], h, f"l{i}_wv"), "bv": _vector(rng, h, 0.02, f"l{i}_bv"),
                "wo": _weight(rng, [n, d, h], h, f"l{i}_wo"), "bo": _vector(rng, h, 0.02, f"l{i}_bo"),
                "g1": _vector(rng, h, 0.05, f"l{i}_g1", 1.0), "b1": _vector(rng, h, 0.02, f"l{i}_b1"),
                "wi": _weight(rng, [h, f], h, f"l{i}_wi"), "bi": _vector(rng, f, 0.02, f"l{i}_bi"),
                "wf": _weight(rng, [f, h], f, f"l{i}_wf"), "bf": _vector(rng, h, 0.02, f"l{i}_bf"),
                "g2": _vector(rng, h, 0.05, f"l{i}_g2", 1.0), "b2": _vector(rng, h, 0.02, f"l{i}_b2"),
            })

    def _heads(self, x: tf.Tensor, w: tf.Variable, b: tf.Variable) -> tf.Tensor:
        bias = tf.reshape(b, [self.heads, self.head_dim])
        return tf.einsum("bsh,hnd->bsnd", x, w) + bias

    def layer(self, x: tf.Tensor, p: dict[str, tf.Variable]) -> tf.Tensor:
        """One encoder layer: self-attention, residual + LN, GELU FFN, residual + LN."""
        q = tf.transpose(self._heads(x, p["wq"], p["bq"]), [0, 2, 1, 3])  # b n s d
        k = tf.transpose(self._heads(x, p["wk"], p["bk"]), [0, 2, 3, 1])  # b n d s
        v = tf.transpose(self._heads(x, p["wv"], p["bv"]), [0, 2, 1, 3])  # b n s d
        scores = tf.matmul(q, k) * (1.0 / math.sqrt(self.head_dim))
        context = tf.transpose(tf.matmul(tf.nn.softmax(scores, axis=-1), v), [0, 2, 1, 3])
        attn = tf.einsum("bsnd,ndh->bsh", context, p["wo"]) + p["bo"]
        x = layer_norm(x + attn, p["g1"], p["b1"])
        inner = tf.matmul(x, p["wi"]) + p["bi"]
        inner = gelu_erf(inner) if self.exact_gelu else gelu_tanh(inner)
        return layer_norm(x + tf.matmul(inner, p["wf"]) + p["bf"], p["g2"], p["b2"])

    def encode(self, x: tf.Tensor) -> tf.Tensor:
        """Runs every layer."""
        for p in self.params:
            x = self.layer(x, p)
        return x


class BertBase(BertEncoder):
    """BERT-base-sized layers (768 hidden, 12 heads, 3072 FFN), 2 of them."""

    HIDDEN = 768

    def __init__(self, seed: int = 0, layers: int = 2) -> None:
        super().__init__(self.HIDDEN, layers, 12, seed, exact_gelu=True)

    @tf.function(input_signature=[tf.TensorSpec([None, None, HIDDEN], tf.float32, name="x")])
    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        """Encoded hidden states, same shape as ``x``."""
        return self.encode(x)


class BertSmall(BertEncoder):
    """A small BERT: 256 hidden, 4 heads, 1024 FFN, 4 layers, tanh GELU."""

    HIDDEN = 256

    def __init__(self, seed: int = 0) -> None:
        super().__init__(self.HIDDEN, 4, 4, seed, exact_gelu=False)

    @tf.function(input_signature=[tf.TensorSpec([None, None, HIDDEN], tf.float32, name="x")])
    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        """Encoded hidden states, same shape as ``x``."""
        return self.encode(x)


class FastSpeechConvStack(tf.Module):
    """FastSpeech2-like conv stack on ``[1, T, 256]``.

    Two feed-forward conv blocks (Conv1D k=9 to 1024, ReLU, Conv1D k=1 back to 256,
    residual, layer norm), then a variance predictor (2 x Conv1D k=3 + ReLU + layer
    norm, and a linear projection to one value per frame), output ``[1, T]``.
    """

    HIDDEN = 256
    FILTER = 1024

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        h, f = self.HIDDEN, self.FILTER
        self.blocks = [{
            "w1": _weight(rng, [9, h, f], 9 * h, f"c{i}_w1"), "b1": _vector(rng, f, 0.02, f"c{i}_b1"),
            "w2": _weight(rng, [1, f, h], f, f"c{i}_w2"), "b2": _vector(rng, h, 0.02, f"c{i}_b2"),
            "g": _vector(rng, h, 0.05, f"c{i}_g", 1.0), "b": _vector(rng, h, 0.02, f"c{i}_b"),
        } for i in range(2)]
        self.predictor = [{
            "w": _weight(rng, [3, h, h], 3 * h, f"p{i}_w"), "bias": _vector(rng, h, 0.02, f"p{i}_bias"),
            "g": _vector(rng, h, 0.05, f"p{i}_g", 1.0), "b": _vector(rng, h, 0.02, f"p{i}_b"),
        } for i in range(2)]
        self.proj = _weight(rng, [h, 1], h, "proj")
        self.proj_b = _vector(rng, 1, 0.02, "proj_b")

    @tf.function(input_signature=[tf.TensorSpec([1, None, HIDDEN], tf.float32, name="x")])
    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        """Per-frame predictions ``[1, T]``."""
        for p in self.blocks:
            y = tf.nn.relu(tf.nn.conv1d(x, p["w1"], 1, "SAME") + p["b1"])
            y = tf.nn.conv1d(y, p["w2"], 1, "SAME") + p["b2"]
            x = layer_norm(x + y, p["g"], p["b"])
        for p in self.predictor:
            x = layer_norm(tf.nn.relu(tf.nn.conv1d(x, p["w"], 1, "SAME") + p["bias"]), p["g"], p["b"])
        flat = tf.reshape(x, [-1, self.HIDDEN])
        return tf.reshape(tf.matmul(flat, self.proj) + self.proj_b, [1, -1])


class RecommenderTower(tf.Module):
    """A user/item tower on ``[batch, 64]`` numeric features.

    log(|x| + 1) + clamp + standardize with a missing-value fill, a 64-512-256-64 ReLU MLP,
    and an L2-normalised embedding out.
    """

    FEATURES = 64
    WIDTHS = (512, 256, 64)

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        f = self.FEATURES
        self.mean = tf.Variable(rng.uniform(1.0, 4.0, [f]).astype(np.float32), name="mean")
        self.std = tf.Variable(rng.uniform(0.5, 2.0, [f]).astype(np.float32), name="std")
        self.fill = _vector(rng, f, 0.1, "fill")
        dims = (f, *self.WIDTHS)
        self.kernels = [_weight(rng, [a, b], a, f"k{i}") for i, (a, b) in enumerate(zip(dims, dims[1:]))]
        self.biases = [_vector(rng, b, 0.02, f"b{i}") for i, b in enumerate(dims[1:])]

    @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32, name="x")])
    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        """Unit-norm embeddings ``[batch, 64]``."""
        present = tf.greater_equal(x, 0.0)
        logx = tf.minimum(tf.maximum(tf.math.log(tf.abs(x) + 1.0), 0.0), 12.0)
        z = (logx - self.mean) * tf.math.rsqrt(tf.square(self.std) + 1e-6)
        h = tf.where(present, z, self.fill)
        last = len(self.kernels) - 1
        for i, (k, b) in enumerate(zip(self.kernels, self.biases)):
            h = tf.matmul(h, k) + b
            if i < last:
                h = tf.nn.relu(h)
        return h * tf.math.rsqrt(tf.reduce_sum(tf.square(h), axis=-1, keepdims=True) + 1e-12)


class KerasEncoderBlock(tf.Module):
    """A Keras functional model: MultiHeadAttention + LayerNormalization + Dense FFN.

    ``[batch, seq, 128]`` in and out; 4 heads of 32, FFN 512 with tanh GELU.
    """

    HIDDEN = 128

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        import keras

        keras.utils.set_random_seed(seed)
        h = self.HIDDEN
        x = keras.Input(shape=(None, h), name="x")
        attn = keras.layers.MultiHeadAttention(num_heads=4, key_dim=h // 4, name="mha")(x, x)
        y = keras.layers.LayerNormalization(epsilon=1e-6, name="ln1")(x + attn)
        # tanh GELU: Keras's exact GELU lowers to Erfc, which tf2onnx cannot convert.
        ffn = keras.layers.Dense(4 * h, name="ffn_in")(y)
        ffn = keras.layers.Activation(lambda t: keras.activations.gelu(t, approximate=True),
                                      name="gelu")(ffn)
        ffn = keras.layers.Dense(h, name="ffn_out")(ffn)
        out = keras.layers.LayerNormalization(epsilon=1e-6, name="ln2")(y + ffn)
        self.model = keras.Model(x, out, name="encoder_block")

    @tf.function(input_signature=[tf.TensorSpec([None, None, HIDDEN], tf.float32, name="x")])
    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        """The block's output, same shape as ``x``."""
        return self.model(x, training=False)


class GptDecoder(tf.Module):
    """A keras-hub GPT-2 backbone built from config (random weights): 4 layers,
    hidden 256, 4 heads, FFN 1024, vocabulary 1000. Token ids ``[batch, seq]`` in
    (no padding: the mask is all ones), hidden states ``[batch, seq, 256]`` out."""

    HIDDEN = 256
    VOCABULARY = 1000

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        import keras
        import keras_hub

        keras.utils.set_random_seed(seed)
        self.model = keras_hub.models.GPT2Backbone(
            vocabulary_size=self.VOCABULARY, num_layers=4, num_heads=4, hidden_dim=self.HIDDEN,
            intermediate_dim=4 * self.HIDDEN, max_sequence_length=512)

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="x")])
    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        """The last hidden states of the tokens ``x``."""
        return self.model({"token_ids": x, "padding_mask": tf.ones_like(x)}, training=False)


class MobileNetFeatures(tf.Module):
    """Keras ``MobileNetV2(weights=None, include_top=False)`` with dynamic height and
    width: images ``[batch, h, w, 3]`` in, feature maps ``[batch, h/32, w/32, 1280]`` out."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        import keras

        keras.utils.set_random_seed(seed)
        self.model = keras.applications.MobileNetV2(weights=None, include_top=False,
                                                    input_shape=(None, None, 3))

    @tf.function(input_signature=[tf.TensorSpec([None, None, None, 3], tf.float32, name="x")])
    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        """The feature maps of the images ``x``."""
        return self.model(x, training=False)
