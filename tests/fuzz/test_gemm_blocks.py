"""Differential fuzzing of transformer-like GEMM blocks, disc_tf against TF.

The graph fuzzer (``test_differential``) multiplies whatever 2-D values it has;
the GEMM fusions that real models hit need structure: several projections of one
input (one shared-A launch), weights computed in the cluster (temps whose memory
the buffer plan frees and reuses), bias and activation epilogues, attention
(scores, scale, mask, softmax, times V: the chained GEMM) with or without a head
split, and results read by more than one consumer. Each example draws such a
block, jits it strictly and compares with TF at three shapes of a dynamic batch
and sequence (lengths 0 and 1 included).

The slow variant runs ``DISC_TF_FUZZ_BLOCKS`` examples (default 200); ``DISC_TF_FUZZ_SEED``
draws a campaign's own examples (``fuzz_settings``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, note
from hypothesis import strategies as st

import disc_tf
from disc_tf import pipeline
from tests.fuzz.fuzz_settings import fuzzed
from tests.stage_helpers import cluster_of

SLOW_EXAMPLES = int(os.environ.get("DISC_TF_FUZZ_BLOCKS", "200"))

HIDDEN = 16
ACTIVATIONS = {"none": lambda t: t, "relu": tf.nn.relu, "tanh": tf.tanh,
               "gelu": lambda t: tf.nn.gelu(t, approximate=True)}


@dataclasses.dataclass(frozen=True)
class Block:
    """One drawn block: projections of the input, then how they are combined."""

    widths: tuple[int, ...]  # output width of each projection of x
    weights: tuple[str, ...]  # per projection: "const", "scaled" (const * c) or "arg" (* 0.5)
    biases: tuple[bool, ...]
    activations: tuple[str, ...]
    attention: bool  # projections 0, 1, 2 are Q, K, V
    heads: int  # attention: split into heads of width // heads
    mask: bool  # attention: additive mask from an input
    keep_probs: bool  # attention: the probabilities are a result too
    out_proj: bool  # a final projection back to HIDDEN plus a residual

    def weight_args(self) -> list[int]:
        """The projections whose weights are function arguments."""
        return [i for i, w in enumerate(self.weights) if w == "arg"]


@st.composite
def blocks(draw) -> Block:
    attention = draw(st.booleans())
    count = 3 if attention else draw(st.integers(1, 3))
    if attention:
        width = draw(st.sampled_from([8, 16]))
        widths = (width,) * 3
    else:
        widths = tuple(draw(st.sampled_from([8, 16, 24])) for _ in range(count))
    return Block(
        widths=widths,
        weights=tuple(draw(st.sampled_from(["const", "scaled", "arg"])) for _ in range(count)),
        biases=tuple(draw(st.booleans()) for _ in range(count)),
        activations=tuple("none" if attention else draw(st.sampled_from(sorted(ACTIVATIONS)))
                          for _ in range(count)),
        attention=attention,
        heads=draw(st.sampled_from([1, 2])) if attention else 1,
        mask=attention and draw(st.booleans()),
        keep_probs=attention and draw(st.booleans()),
        out_proj=draw(st.booleans()),
    )


def build(block: Block, seed: int):
    """The block as a Python function of (x, mask?, weight args...) and its signature."""
    rng = np.random.default_rng(seed)
    consts = [(rng.standard_normal((HIDDEN, w)) / 4).astype(np.float32) for w in block.widths]
    bias = [(rng.standard_normal(w) / 4).astype(np.float32) for w in block.widths]
    last = max(block.widths) if not block.attention else block.widths[2]
    out_w = (rng.standard_normal((last, HIDDEN)) / 4).astype(np.float32)
    specs = [tf.TensorSpec([None, None, HIDDEN], tf.float32)]
    if block.mask:
        specs.append(tf.TensorSpec([None, None], tf.float32))
    specs += [tf.TensorSpec([HIDDEN, block.widths[i]], tf.float32) for i in block.weight_args()]

    def fn(x, *rest):
        rest = list(rest)
        mask = rest.pop(0) if block.mask else None
        projections = []
        for i in range(len(block.widths)):
            kind = block.weights[i]
            w = rest.pop(0) * 0.5 if kind == "arg" else consts[i]
            if kind == "scaled":
                w = tf.constant(consts[i]) * 1.5
            y = tf.einsum("bsh,hd->bsd", x, w)
            if block.biases[i]:
                y = y + bias[i]
            projections.append(ACTIVATIONS[block.activations[i]](y))
        outs = []
        if block.attention:
            q, k, v = projections
            heads, width = block.heads, block.widths[0]

            def split(t):
                shape = tf.shape(t)
                return tf.transpose(tf.reshape(t, [shape[0], shape[1], heads, width // heads]),
                                    [0, 2, 1, 3])

            scores = tf.matmul(split(q), split(k), transpose_b=True) / float(width // heads) ** 0.5
            if mask is not None:
                scores = scores + (1.0 - mask[:, None, None, :]) * -1e4
            probs = tf.nn.softmax(scores, axis=-1)
            y = tf.matmul(probs, split(v))
            shape = tf.shape(x)
            y = tf.reshape(tf.transpose(y, [0, 2, 1, 3]), [shape[0], shape[1], width])
            if block.keep_probs:
                outs.append(probs)
        else:
            y = projections[-1]
            for p in projections[:-1]:
                y = y + tf.reduce_sum(p, axis=-1, keepdims=True)
            if max(block.widths) != block.widths[-1]:
                y = tf.pad(y, [[0, 0], [0, 0], [0, max(block.widths) - block.widths[-1]]])
        if block.out_proj:
            y = x + tf.einsum("bsd,dh->bsh", y, out_w)
        return tuple([y, *outs])

    return fn, specs


def _inputs(rng: np.random.Generator, block: Block, batch: int, length: int) -> list[np.ndarray]:
    args = [rng.standard_normal((batch, length, HIDDEN)).astype(np.float32)]
    if block.mask:
        mask = (rng.random((batch, length)) < 0.8).astype(np.float32)
        mask[:, :1] = 1.0  # every row attends to something
        args.append(mask)
    args += [rng.standard_normal((HIDDEN, block.widths[i])).astype(np.float32) / 4
             for i in block.weight_args()]
    return args


def check_block(block: Block, seed: int) -> None:
    """jits ``block`` strictly and compares with TF at three shapes."""
    fn, specs = build(block, seed)
    tf_fn = tf.function(fn, input_signature=specs, autograph=False)
    disc_tf.reset_stats()
    jitted = disc_tf.jit(tf_fn, min_cluster_size=1, strict=True)
    assert jitted.report.compiled, f"nothing compiled: {block}"
    matmuls = {op for c in jitted.report.compiled for _, op in c.ops} & {"Einsum", "BatchMatMulV2"}
    assert "Einsum" in matmuls, jitted.report
    rng = np.random.default_rng(seed)
    for batch, length in ((int(rng.integers(1, 4)), int(rng.integers(2, 40))), (2, 1), (1, 0)):
        args = _inputs(rng, block, batch, length)
        note(f"shapes: batch {batch}, length {length}")
        want = tf.nest.flatten(tf_fn(*args))
        got = tf.nest.flatten(jitted(*args))
        for i, (w, g) in enumerate(zip(want, got)):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-5,
                                       err_msg=f"output {i} at batch {batch}, length {length}")
    assert disc_tf.stats()["fallbacks"] == 0, disc_tf.stats()


@fuzzed(12)
@given(blocks(), st.integers(0, 2**16))
def test_gemm_blocks(block, seed):
    check_block(block, seed)


@pytest.mark.slow
@fuzzed(SLOW_EXAMPLES)
@given(blocks(), st.integers(0, 2**16))
def test_gemm_blocks_slow(block, seed):
    check_block(block, seed)


#: Attention blocks called from several threads at once: their scores live in each
#: task's scratch block, their packed operands in per-thread buffers.
CONCURRENT_BLOCKS = (
    Block(widths=(16, 16, 16), weights=("const", "scaled", "const"), biases=(True, False, True),
          activations=("none",) * 3, attention=True, heads=2, mask=True, keep_probs=False,
          out_proj=True),
    Block(widths=(8, 8, 8), weights=("arg", "const", "const"), biases=(False, True, False),
          activations=("none",) * 3, attention=True, heads=1, mask=False, keep_probs=False,
          out_proj=False),
)


@pytest.mark.parametrize("block", CONCURRENT_BLOCKS, ids=["masked_heads", "weights_arg"])
def test_attention_blocks_called_from_threads_at_once(block):
    fn, specs = build(block, 7)
    plan = pipeline.front_end(cluster_of(fn, *specs)).plan
    # The scores in scratch with P V chained (the masked one's in its speculative version,
    # which runs where the mask's dims are the scores' as here).
    versions = [plan, *([plan.speculative] if plan.speculative else [])]
    assert any(k.c_in_scratch and k.chain for v in versions for k in v.kernels), plan.describe()
    tf_fn = tf.function(fn, input_signature=specs, autograph=False)
    disc_tf.reset_stats()
    jitted = disc_tf.jit(tf_fn, min_cluster_size=1, strict=True)
    assert jitted.report.compiled, jitted.report
    rng = np.random.default_rng(7)
    # Lengths to 300: up to 300 x 300 scores a head, the masked one's in sub-blocks of rows.
    shapes = [(int(rng.integers(1, 4)), int(rng.integers(1, 300))) for _ in range(12)]
    cases = [_inputs(np.random.default_rng(i), block, b, s) for i, (b, s) in enumerate(shapes)]
    wants = [[np.asarray(w) for w in tf.nest.flatten(tf_fn(*args))] for args in cases]
    jitted(*cases[0])  # compiled and warmed before the threads start

    def run(worker: int) -> int:
        order = np.random.default_rng(100 + worker).permutation(len(cases) * 3) % len(cases)
        for i in order:
            got = tf.nest.flatten(jitted(*cases[i]))
            for g, w in zip(got, wants[i]):
                np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-5,
                                           err_msg=f"case {i} at {shapes[i]}")
        return len(order)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        done = sum(pool.map(run, range(4)))
    assert done == 4 * 3 * len(cases)
    stats = disc_tf.stats()
    assert stats["fallbacks"] == 0 and stats["compilations"] == 1, stats
