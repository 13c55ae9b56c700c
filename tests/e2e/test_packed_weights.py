"""GEMM weights packed once (cc/ral/packed_weights.h): a B operand read from a
Const or a ReadVariableOp is packed on the first call and reused; a new
variable value is packed again. Results against TF at random shapes."""

from __future__ import annotations

import concurrent.futures
import os
import pathlib

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from tests import fresh_python
from tests.harness import assert_matches_tf, compiled

#: Packed GEMM operands are the CPU backend's (cuBLAS reads weights as they are).
pytestmark = pytest.mark.cpu_backend

RTOL = ATOL = 1e-4


def _weight(rng: np.random.Generator, shape: tuple[int, ...]) -> tf.Variable:
    return tf.Variable((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32))


def _rows(rng: np.random.Generator, m: int, k: int) -> np.ndarray:
    return rng.standard_normal((m, k)).astype(np.float32)


class _Layers(tf.Module):
    """Three GEMM weights: a partial panel, a transposed B and a wide B."""

    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.w1 = _weight(rng, (40, 70))   # n = 70: one whole panel and a partial one
        self.w2 = _weight(rng, (130, 40))  # read as its transpose
        self.w3 = _weight(rng, (70, 1000))
        self.b1 = _weight(rng, (70,))

    @tf.function(input_signature=[tf.TensorSpec([None, 40], tf.float32)])
    def __call__(self, x):
        h = tf.nn.relu(tf.matmul(x, self.w1) + self.b1)
        return tf.matmul(h, self.w3), tf.matmul(x, self.w2, transpose_b=True)


def test_weights_are_packed_once_and_reused():
    layers = _Layers(0)
    jitted = compiled(layers.__call__)
    disc_tf.reset_stats()
    rng = np.random.default_rng(1)
    assert_matches_tf(layers.__call__, jitted, [_rows(rng, 5, 40)], RTOL, ATOL)
    assert disc_tf.stats()["packed_weights"] == 3  # w1, w2 and w3; not the bias
    for m in [1, 7, 100, 300, 0, 97]:
        assert_matches_tf(layers.__call__, jitted, [_rows(rng, m, 40)], RTOL, ATOL)
    stats = disc_tf.stats()
    assert stats["packed_weights"] == 3, "packed again at a new shape"
    assert stats["fallbacks"] == 0


def test_packed_weights_over_deep_k_a_transposed_a_and_many_column_blocks():
    """Packed B read strip by strip (AVX2) or panel by panel: k over one packed depth
    (1024) in two passes, A read transposed, and with k = 24 one block of 1000 columns
    (a partial last panel) for each 6-row strip; row counts off the strip size."""
    rng = np.random.default_rng(5)
    deep, wide = _weight(rng, (1500, 90)), _weight(rng, (24, 1000))

    @tf.function(input_signature=[tf.TensorSpec([1500, None], tf.float32),
                                  tf.TensorSpec([None, 24], tf.float32)])
    def fn(xt, y):
        return tf.matmul(xt, deep, transpose_a=True) * 0.5, tf.nn.relu(y @ wide)

    jitted = compiled(fn)
    disc_tf.reset_stats()
    for m in [1, 7, 200, 601, 13]:
        assert_matches_tf(fn, jitted, [_rows(rng, 1500, m), _rows(rng, m + 3, 24)], RTOL, ATOL)
    stats = disc_tf.stats()
    assert stats["packed_weights"] == 2 and stats["fallbacks"] == 0, stats


def _warm_layers(seed: int, m: int):
    """Compiled _Layers after one checked call (weights packed), stats reset."""
    layers = _Layers(seed)
    jitted = compiled(layers.__call__)
    rng = np.random.default_rng(seed + 1)
    x = _rows(rng, m, 40)
    assert_matches_tf(layers.__call__, jitted, [x], RTOL, ATOL)
    disc_tf.reset_stats()
    return layers, jitted, rng, x


def test_a_new_variable_value_is_packed_again():
    layers, jitted, rng, x = _warm_layers(2, 50)
    for step in range(3):
        layers.w1.assign(layers.w1 * 0.5 + 0.1)
        layers.w2.assign_add(tf.ones_like(layers.w2) * 0.01 * step)
        assert_matches_tf(layers.__call__, jitted, [x], RTOL, ATOL)
        assert_matches_tf(layers.__call__, jitted, [_rows(rng, 9, 40)], RTOL, ATOL)
    assert disc_tf.stats()["packed_weights"] == 6  # w1 and w2 once per new value
    assert disc_tf.stats()["fallbacks"] == 0


def test_a_weight_that_changes_on_every_call_stops_being_cached():
    """After kMaxMoves new buffers (PackedWeights), the input is packed per call
    by the blocks again, and results stay right."""
    layers, jitted, _, x = _warm_layers(8, 30)
    for _ in range(12):
        layers.w1.assign(layers.w1 * 0.9)
        assert_matches_tf(layers.__call__, jitted, [x], RTOL, ATOL)
    assert disc_tf.stats()["packed_weights"] == 7  # kMaxMoves - 1 new values packed


@pytest.mark.parametrize("width, dilation, packs", [(4, 1, 1), (3, 1, 19), (3, 2, 3)])
def test_conv1d_filters_are_packed(width, dilation, packs):
    rng = np.random.default_rng(4)
    w = _weight(rng, (width, 8, 70))
    conv = tf.function(
        lambda x: tf.nn.relu(tf.nn.conv1d(x, w, 1, "SAME", dilations=dilation)),
        input_signature=[tf.TensorSpec([None, None, 8], tf.float32)])
    jitted = compiled(conv)
    disc_tf.reset_stats()
    for t in [9, 1, 40, 130]:
        x = rng.standard_normal((1, t, 8)).astype(np.float32)
        assert_matches_tf(conv, jitted, [x], RTOL, ATOL)
    # Undilated: one GEMM over the input's windows, B the whole filter; a kernel width
    # of 3 also runs as Winograd (F(2, 3) at t = 40, F(6, 3) at t = 130), and its first
    # call packs the four, six and eight transformed filters of F(2, 3), F(4, 3) and
    # F(6, 3) once each. Dilated: one GEMM per filter tap, each reading its own slice of
    # the filter.
    assert disc_tf.stats()["packed_weights"] == packs


def test_concurrent_first_calls_agree():
    layers = _Layers(5)
    jitted = compiled(layers.__call__)
    rng = np.random.default_rng(6)
    xs = [_rows(rng, int(m), 40) for m in rng.integers(1, 200, size=16)]
    expected = [layers(x) for x in xs]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        got = list(pool.map(jitted, xs))
    for e, g in zip(expected, got):
        for a, b in zip(e, g):
            np.testing.assert_allclose(b, a, rtol=RTOL, atol=ATOL)


def test_constant_inputs_are_the_weights():
    """The DiscCluster attr names the variable reads, not the activations."""
    rng = np.random.default_rng(7)
    w, b = _weight(rng, (40, 70)), _weight(rng, (70,))
    fn = tf.function(lambda x, y: tf.matmul(x, w) + b + y,
                     input_signature=[tf.TensorSpec([None, 40]), tf.TensorSpec([None, 70])])
    jitted = compiled(fn)
    (node,) = [n for n in jitted.graph_def.node if n.op == "DiscCluster"]
    producers = {n.name: n.op for n in jitted.graph_def.node}
    inputs = [producers[i.split(":")[0]] for i in node.input if not i.startswith("^")]
    marked = list(node.attr["constant_inputs"].list.i)
    assert sorted(inputs[i] for i in marked) == ["ReadVariableOp", "ReadVariableOp"], inputs
    assert sorted(op for i, op in enumerate(inputs) if i not in marked) == ["Placeholder"] * 2


_ENV_SCRIPT = """
import numpy as np, tensorflow as tf, disc_tf

rng = np.random.default_rng(0)
w = tf.Variable(rng.standard_normal((300, 200)).astype(np.float32) / 17.0)
v = tf.Variable(rng.standard_normal((90, 200)).astype(np.float32) / 14.0)
f = tf.function(lambda x: tf.matmul(tf.matmul(x, w), v, transpose_b=True) * 2.0,
                input_signature=[tf.TensorSpec([None, 300])])
j = disc_tf.jit(f, min_cluster_size=1)
assert j.report.compiled
for m in [3, 96, 97, 250]:
    x = rng.standard_normal((m, 300)).astype(np.float32)
    np.testing.assert_allclose(j(x), f(x), rtol=1e-4, atol=1e-4)
s = disc_tf.stats()
assert s["fallbacks"] == 0, s
print("PACKED", s["packed_weights"])
"""


@pytest.mark.parametrize("env,packed", [({}, 2), ({"DISC_TF_GEMM_ISA": "avx2"}, 2),
                                        ({"DISC_TF_PACK_WEIGHTS": "0"}, 0),
                                        ({"DISC_TF_PACKED_WEIGHTS_MB": "0"}, 0),
                                        ({"DISC_TF_GEMM_ISA": "baseline"}, 0)],
                         ids=["native", "avx2", "off", "no-budget", "eigen"])
def test_packing_settings(env, packed):
    """Each ISA packs weights; turned off (or out of budget), each call packs its own.
    The child uses the session's cache: packing is the RAL's run-time choice, the
    compiled cluster is the same under every setting."""
    repo = pathlib.Path(__file__).resolve().parents[2]
    full = dict(os.environ, PYTHONPATH=str(repo), **env)
    proc = fresh_python.run(["-c", _ENV_SCRIPT], env=full, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"PACKED {packed}" in proc.stdout, proc.stdout[-500:]


class _ConstantLayers(tf.Module):
    """Weights held as ``tf.constant``s: a saved function captures them, and the
    SavedModel binds those arguments to constants of its object graph."""

    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.w1 = tf.constant((rng.standard_normal((40, 130)) / 6.0).astype(np.float32))
        self.b1 = tf.constant(rng.standard_normal(130).astype(np.float32))
        self.w2 = tf.constant((rng.standard_normal((130, 40)) / 11.0).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 40], tf.float32)])
    def __call__(self, x):
        return tf.matmul(tf.nn.relu(tf.matmul(x, self.w1) + self.b1), self.w2)


def test_captured_constants_of_a_jit_function_are_packed_once():
    """``disc_tf.jit`` binds a function's captured ``tf.constant`` weights once, as they
    are when it traces: they are constant inputs of the DiscCluster (the argument is not),
    and the GEMMs pack them on the first call and reuse them at every shape."""
    layers = _ConstantLayers(10)
    jitted = compiled(layers.__call__)
    (node,) = [n for n in jitted.graph_def.node if n.op == "DiscCluster"]
    arg = jitted._arg_names[0].split(":")[0]
    inputs = [i.split(":")[0] for i in node.input if not i.startswith("^")]
    marked = sorted(node.attr["constant_inputs"].list.i)
    assert len(marked) == 3 and inputs.index(arg) not in marked, (inputs, marked)
    disc_tf.reset_stats()
    rng = np.random.default_rng(11)
    for m in [3, 64, 301, 17]:
        assert_matches_tf(layers.__call__, jitted, [_rows(rng, m, 40)], RTOL, ATOL)
    stats = disc_tf.stats()
    assert stats["packed_weights"] == 2 and stats["fallbacks"] == 0, stats


def test_captured_constants_of_a_saved_model_are_packed_once(tmp_path):
    """A SavedModel's captured ``tf.constant`` weights are marked constant inputs of its
    DiscCluster (they reach the function as arguments, not Const nodes), so the GEMMs
    pack them on the first call and reuse them at every shape."""
    layers = _ConstantLayers(8)
    tf.saved_model.save(layers, str(tmp_path / "src"))
    disc_tf.optimize(str(tmp_path / "src"), str(tmp_path / "out"))
    disc_tf.reset_stats()
    model = disc_tf.load(str(tmp_path / "out"))
    rng = np.random.default_rng(9)
    for m in [3, 64, 301, 17]:
        x = _rows(rng, m, 40)
        np.testing.assert_allclose(model(x).numpy(), layers(x).numpy(), rtol=RTOL, atol=ATOL)
    stats = disc_tf.stats()
    assert stats["packed_weights"] == 2 and stats["fallbacks"] == 0, stats
    assert model.direct_functions()["__call__"] is None


class _Mlp(tf.Module):
    """Two dense layers of width `width`: 2 * width^2 floats of weights."""

    def __init__(self, width: int) -> None:
        rng = np.random.default_rng(width)
        self.w1 = _weight(rng, (width, width))
        self.w2 = _weight(rng, (width, width))

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def __call__(self, x):
        return tf.matmul(tf.nn.relu(tf.matmul(x, self.w1)), self.w2)


@pytest.mark.parametrize("width, resident", [(64, True), (1024, False)])
def test_weights_within_half_of_l2_are_read_without_prefetching(width, resident):
    """32 KiB of weights stay in any core's L2 between calls: every call after the first
    (which packs them) runs its GEMMs through the block that does not prefetch B, the
    same launches on each call. 8 MiB do not: no launch does. Either way the results are
    TF's, at several row counts."""
    mlp = _Mlp(width)
    jitted = compiled(mlp.__call__)
    disc_tf.reset_stats()
    rng = np.random.default_rng(2)
    rows = [5, 1, 64, 13, 200, 6]
    for m in rows:
        assert_matches_tf(mlp.__call__, jitted, [_rows(rng, m, width)], RTOL, ATOL)
    stats = disc_tf.stats()
    assert stats["packed_weights"] == 2
    assert stats["fallbacks"] == 0
    launches = stats["resident_weight_gemms"]
    if resident:
        assert launches > 0 and launches % (len(rows) - 1) == 0, launches
    else:
        assert launches == 0
