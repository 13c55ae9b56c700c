"""GEMMs each reading the last one's result run as one launch, every block of rows
through each layer in turn (``fusion/layer_chain.py``, RAL ABI 12 ``sgemm_layers``): an
MLP tower, a transformer's projection + LayerNorm, FFN up (GELU) and down + LayerNorm,
layers without an epilogue between them, a hidden result that is also returned, a
residual read from an earlier layer. Plans are checked for which GEMMs join a run and
which Cs never exist whole; results against TF at many rows, strict, on each path of
the RAL (blocks, one launch per layer for few rows or with DISC_TF_LAYER_BLOCKS=0,
column epilogues on registers or as passes, the baseline ISA without a GEMM block),
the counter layer_blocks proving the blocks ran."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from disc_tf import pipeline
from tests import fresh_python
from tests.stage_helpers import cluster_of

#: The CPU backend plans runs of layers (the CUDA one does not).
pytestmark = pytest.mark.cpu_backend

_MODELS = """
import numpy as np, tensorflow as tf
rng = np.random.default_rng(5)
def v(shape, scale=0.1):
    return tf.Variable((rng.standard_normal(shape) * scale).astype(np.float32))

w1, b1 = v([64, 512], 0.125), v([512])
w2, b2 = v([512, 256], 0.045), v([256])
w3, b3 = v([256, 64], 0.0625), v([64])
def tower(x):  # an MLP, its last layer's L2 normalisation a row-wise epilogue
    h = tf.nn.relu(tf.matmul(x, w1) + b1)
    h = tf.nn.relu(tf.matmul(h, w2) + b2)
    y = tf.matmul(h, w3) + b3
    return y * tf.math.rsqrt(tf.reduce_sum(y * y, axis=1, keepdims=True) + 1e-6)

H, F = 64, 256
wo, bo, go, eo = v([H, H], 0.125), v([H]), v([H]) + 1.0, v([H])
wu, bu = v([H, F], 0.125), v([F])
wd, bd, gd, ed = v([F, H], 0.0625), v([H]), v([H]) + 1.0, v([H])
def layer_norm(x, g, b):
    mean = tf.reduce_mean(x, -1, keepdims=True)
    var = tf.reduce_mean(tf.square(x - mean), -1, keepdims=True)
    return (x - mean) * tf.math.rsqrt(var + 1e-5) * g + b
def ffn_block(x):  # [batch, seq, H]: projection, FFN up and down, residuals and norms
    h = layer_norm(x + tf.einsum("bsh,hk->bsk", x, wo) + bo, go, eo)
    f = tf.nn.gelu(tf.einsum("bsh,hf->bsf", h, wu) + bu, approximate=True)
    return layer_norm(h + tf.einsum("bsf,fh->bsh", f, wd) + bd, gd, ed)

w4, w5, b5 = v([48, 96], 0.15), v([96, 40], 0.1), v([40])
def no_epilogue_between(x):  # the first C is the second GEMM's A as it is
    return tf.nn.relu(tf.matmul(tf.matmul(x, w4), w5) + b5)

def hidden_too(x):  # the hidden layer (GELU: no column steps) is a result too, read there
    h = tf.nn.gelu(tf.matmul(x, w1) + b1, approximate=True)
    return tf.matmul(h, w2) + b2, h

w8, b8, w9 = v([64, 1024], 0.125), v([1024]), v([1024, 700], 0.03)
def big_weights(x):  # 780 K floats of B: past what a block may stream, one launch a layer
    return tf.matmul(tf.nn.relu(tf.matmul(x, w8) + b8), w9)

w6, b6, w7, b7 = v([32, 32], 0.2), v([32]), v([32, 32], 0.2), v([32])
def residual_mlp(x):  # the second layer's epilogue adds the first layer's result
    h = tf.nn.relu(tf.matmul(x, w6) + b6)
    return tf.nn.relu(tf.matmul(h, w7) + b7 + h)
"""

_SCRIPT = _MODELS + """
import hashlib, json, os
import disc_tf
# rows from which a launch runs by blocks on this pool (TF's intra-op threads: the CPUs
# this process may run on); every case has a call past it
big = 48 * len(os.sched_getaffinity(0))
cases = {
    "tower": (tower, [None, 64], [(0, 64), (1, 64), (7, 64), (95, 64), (96, 64), (301, 64),
                                  (2000, 64), (big + 7, 64)]),
    "ffn_block": (ffn_block, [None, None, H], [(1, 5, H), (2, 37, H), (3, 50, H), (8, 250, H),
                                               (1, big + 7, H)]),
    "no_epilogue_between": (no_epilogue_between, [None, 48], [(1, 48), (50, 48), (big + 7, 48)]),
    "hidden_too": (hidden_too, [None, 64], [(3, 64), (500, 64), (big + 7, 64)]),
    "residual_mlp": (residual_mlp, [None, 32], [(9, 32), (130, 32), (big + 7, 32)]),
    "big_weights": (big_weights, [None, 64], [(5, 64), (big + 7, 64)]),
}
xr = np.random.default_rng(7)
out = {}
for name, (fn, spec, shapes) in cases.items():
    f = tf.function(fn, input_signature=[tf.TensorSpec(spec, tf.float32)])
    jitted = disc_tf.jit(f, strict=True)
    before = disc_tf.stats()
    h, big_calls = hashlib.sha256(), 0
    for shape in shapes:
        x = xr.normal(size=shape).astype(np.float32)
        got, want = jitted(x), f(x)
        got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
        for g, w in zip(got, want):
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-4, atol=2e-5,
                                       err_msg=f"{name} at {shape}")
            h.update(g.numpy().tobytes())
        big_calls += int(np.prod(shape[:-1])) >= big
    after = disc_tf.stats()
    out[name] = {"blocks": after["layer_blocks"] - before["layer_blocks"],
                 "registers": after["register_epilogues"] - before["register_epilogues"],
                 "big_calls": big_calls, "digest": h.hexdigest()}
out["fallbacks"] = disc_tf.stats()["fallbacks"]
print("STATS", json.dumps(out))
"""


def _run(**env_vars: str) -> dict:
    return fresh_python.stats_of(_SCRIPT, drop=("DISC_TF_ISA", "DISC_TF_GEMM_ISA",
                                                "DISC_TF_REGISTER_EPILOGUE",
                                                "DISC_TF_LAYER_BLOCKS"), **env_vars)


def _models() -> dict:
    scope: dict = {}
    exec(compile(_MODELS, "models", "exec"), scope)  # noqa: S102 - the test's own models
    return scope


def _plan(fn, *specs):
    return pipeline.front_end(cluster_of(fn, *specs)).plan


def _runs(plan) -> list[tuple[list[str], list[bool]]]:
    """Each run of layers: the TF op of each GEMM, and whether its C is in scratch."""
    by_name = {k.name: k for k in plan.kernels}
    runs = []
    for k in plan.kernels:
        if k.layers:
            gemms = [k, *(by_name[n] for n in k.layers)]
            runs.append(([g.ops[0].tf_node for g in gemms], [g.c_in_scratch for g in gemms]))
    return runs


def test_layers_match_tf_by_blocks_and_one_by_one_with_the_same_bits() -> None:
    """Every case matches TF; each call of a big enough request ran by blocks (and the
    column epilogues on registers); DISC_TF_LAYER_BLOCKS=0 (one launch per layer, Cs in
    temps) and passes instead of registers give the same bits."""
    on = _run()
    assert on.pop("fallbacks") == 0
    assert on["big_weights"]["blocks"] == 0, on["big_weights"]
    for name, s in on.items():
        assert s["big_calls"] >= 1 and (s["blocks"] >= s["big_calls"]
                                        or name == "big_weights"), (name, s)
    assert on["tower"]["registers"] > 0, on["tower"]
    one_by_one = _run(DISC_TF_LAYER_BLOCKS="0")
    assert one_by_one.pop("fallbacks") == 0
    assert all(s["blocks"] == 0 for s in one_by_one.values()), one_by_one
    passes = _run(DISC_TF_REGISTER_EPILOGUE="0")
    assert passes.pop("fallbacks") == 0
    assert all(s["registers"] == 0 for s in passes.values()), passes
    for name in on:
        assert one_by_one[name]["digest"] == on[name]["digest"], name
        assert passes[name]["digest"] == on[name]["digest"], name


def test_plans_join_the_layers_and_keep_cs_that_only_the_run_reads_in_scratch() -> None:
    m = _models()
    spec = tf.TensorSpec
    (tower_ops, tower_scratch), = _runs(_plan(m["tower"], spec([None, 64], tf.float32)))
    assert tower_ops == ["MatMul", "MatMul_1", "MatMul_2"]
    assert tower_scratch == [True, True, True]  # the last one's norm writes the result
    (ffn_ops, _), = _runs(_plan(m["ffn_block"], spec([None, None, 64], tf.float32)))
    assert len(ffn_ops) == 3, ffn_ops  # projection, up and down
    (between_ops, between_scratch), = _runs(
        _plan(m["no_epilogue_between"], spec([None, 48], tf.float32)))
    assert between_scratch == [True, True], between_scratch
    hidden = pipeline.front_end(cluster_of(m["hidden_too"], spec([None, 64], tf.float32)))
    (_, hidden_scratch), = _runs(hidden.plan)
    assert hidden_scratch == [True, True]  # both epilogues write results elsewhere
    assert "layers[0].result = " in hidden.source  # where the second GEMM reads its A
    (_, residual_scratch), = _runs(_plan(m["residual_mlp"], spec([None, 32], tf.float32)))
    assert residual_scratch[0] is False  # the second epilogue reads the first result


def test_a_layer_whose_weights_the_run_makes_is_not_joined() -> None:
    """The second GEMM's B is rows of the first layer's result: a block cannot run it
    before every block of the first layer is done, so the GEMMs run one launch each."""
    w = tf.constant(np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32))

    def made_weights(x):
        h = tf.nn.relu(tf.matmul(x, w) + 1.0)
        return tf.matmul(h, h[:16, :])

    plan = _plan(made_weights, tf.TensorSpec([None, 16], tf.float32))
    assert sum(k.kind == "library" for k in plan.kernels) == 2
    assert _runs(plan) == []


@pytest.mark.parametrize("env", [{"DISC_TF_ISA": "x86-64-v3"}, {"DISC_TF_ISA": "x86-64"},
                                 {"DISC_TF_L2_BYTES": str(2 << 20)}],
                         ids=["avx2", "baseline", "l2_2mib"])
def test_layers_match_tf_on_the_capped_isa_paths_and_a_large_l2(env: dict) -> None:
    """The AVX2 block, the baseline (no GEMM block: Eigen per block, the steps as
    passes) and a 2 MiB L2 (one block of rows per thread) run the same launches by
    blocks and match TF."""
    stats = _run(**env)
    assert stats.pop("fallbacks") == 0
    for name, s in stats.items():
        assert s["blocks"] >= s["big_calls"] >= 1 or name == "big_weights", (name, s)


def test_a_loop_body_runs_its_layers_by_blocks() -> None:
    """Two dense layers in a tf.while_loop body: the step's runner reaches sgemm_layers
    through the loop's child RAL (``codegen/cpu_loop.py``); results as TF's."""
    import os

    import disc_tf
    from tests.harness import compiled

    rng = np.random.default_rng(3)
    w1 = tf.constant((rng.standard_normal((32, 64)) * 0.2).astype(np.float32))
    b1 = tf.constant((rng.standard_normal(64) * 0.1).astype(np.float32))
    w2 = tf.constant((rng.standard_normal((64, 32)) * 0.2).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 32], tf.float32),
                                  tf.TensorSpec([], tf.int32)])
    def steps(x, n):
        def body(i, h):
            return i + 1, tf.tanh(tf.matmul(tf.nn.relu(tf.matmul(h, w1) + b1), w2))

        return tf.while_loop(lambda i, h: i < n, body, (tf.constant(0), x),
                             shape_invariants=(tf.TensorShape([]),
                                               tf.TensorShape([None, 32])))[1]

    jitted = compiled(steps)
    assert [c.name for c in jitted.report.compiled] == ["disc_loop_0"]
    before = disc_tf.stats()["layer_blocks"]
    rows = [3, 48 * len(os.sched_getaffinity(0)) + 5]
    for m in rows:
        x = rng.standard_normal((m, 32)).astype(np.float32)
        np.testing.assert_allclose(jitted(x, tf.constant(3)).numpy(),
                                   steps(x, tf.constant(3)).numpy(), rtol=1e-4, atol=1e-5)
    assert disc_tf.stats()["layer_blocks"] - before >= 3  # the big call's three steps
