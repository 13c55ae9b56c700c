"""MatMul and BatchMatMulV2 inside clusters (library GEMM kernels), against TF
at random shapes with zero-size and size-1 dims; fused epilogues; run-time
size errors."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from disc_tf.dhlo_bridge.lower import lower_cluster, parse_and_verify
from tests import fresh_python
from tests.harness import assert_matches_tf, compiled, random_value
from tests.stage_helpers import cluster_of, dyn

F32 = tf.float32


def _compare(tf_fn, jitted, args, rtol=1e-4, atol=1e-4):
    assert_matches_tf(tf_fn, jitted, args, rtol, atol)


MKN = [(3, 4, 5), (1, 1, 1), (0, 4, 5), (3, 0, 5), (4, 6, 0), (17, 33, 9), (64, 40, 70)]


@pytest.mark.parametrize("ta", [False, True], ids=["a", "aT"])
@pytest.mark.parametrize("tb", [False, True], ids=["b", "bT"])
def test_matmul_transposes(ta, tb):
    tf_fn = tf.function(lambda a, b: tf.matmul(a, b, transpose_a=ta, transpose_b=tb) * 2.0,
                        input_signature=[dyn(2), dyn(2)])
    disc_tf.reset_stats()
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(int(ta) * 2 + int(tb))
    for m, k, n in MKN:
        a = random_value(rng, (k, m) if ta else (m, k), F32)
        b = random_value(rng, (n, k) if tb else (k, n), F32)
        _compare(tf_fn, jitted, [a, b])
    assert disc_tf.stats()["fallbacks"] == 0


BATCH_CASES = [
    # (x shape, y shape) before adjoints; batch dims broadcast
    ((2, 1, 3, 4), (5, 4, 6)),
    ((2, 3, 4), (2, 4, 6)),
    ((1, 3, 4), (7, 4, 2)),
    ((3, 4), (2, 4, 5)),
    ((2, 3, 3, 4), (4, 6)),
    ((0, 3, 4), (1, 4, 5)),
    ((2, 1, 1), (2, 1, 1)),
]


def _adjoint(shape, adj):
    return shape[:-2] + (shape[-1], shape[-2]) if adj else shape


@pytest.mark.parametrize("adj_x", [False, True], ids=["x", "xH"])
@pytest.mark.parametrize("adj_y", [False, True], ids=["y", "yH"])
@pytest.mark.parametrize("case", range(len(BATCH_CASES)))
def test_batch_matmul(case, adj_x, adj_y):
    xs, ys = BATCH_CASES[case]
    tf_fn = tf.function(
        lambda x, y: tf.raw_ops.BatchMatMulV2(x=x, y=y, adj_x=adj_x, adj_y=adj_y) + 1.0,
        input_signature=[dyn(len(xs)), dyn(len(ys))])
    disc_tf.reset_stats()
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(case)
    x = random_value(rng, _adjoint(xs, adj_x), F32)
    y = random_value(rng, _adjoint(ys, adj_y), F32)
    _compare(tf_fn, jitted, [x, y])
    # A second call at other sizes reuses the same artifact.
    x2 = random_value(rng, _adjoint(xs[:-2] + (5, xs[-1] + 2), adj_x), F32)
    y2 = random_value(rng, _adjoint(ys[:-2] + (ys[-2] + 2, 3), adj_y), F32)
    _compare(tf_fn, jitted, [x2, y2])
    assert disc_tf.stats()["fallbacks"] == 0


def test_dense_layer_is_library_plus_one_loop_kernel():
    sig = [tf.TensorSpec([None, 32], F32), tf.TensorSpec([32, 16], F32),
           tf.TensorSpec([16], F32)]
    tf_fn = tf.function(lambda x, w, b: tf.nn.relu(tf.matmul(x, w) + b), input_signature=sig)
    jitted = compiled(tf_fn)
    (cluster,) = jitted.report.compiled
    assert cluster.kernels == 2, jitted.report
    rng = np.random.default_rng(7)
    for rows in [5, 1, 0, 33, 2]:
        args = [random_value(rng, (rows, 32), F32), random_value(rng, (32, 16), F32),
                random_value(rng, (16,), F32)]
        _compare(tf_fn, jitted, args)


def test_dense_layer_plan_kinds():
    from disc_tf.fusion.dhlo_reader import read_module
    from disc_tf.fusion.planner import plan_fusion

    spec = cluster_of(lambda x, w, b: tf.nn.relu(tf.matmul(x, w) + b),
                      tf.TensorSpec([None, 32], F32), tf.TensorSpec([32, 16], F32),
                      tf.TensorSpec([16], F32))
    plan, _ = plan_fusion(read_module(lower_cluster(spec).text), "c0")
    assert [k.kind for k in plan.kernels] == ["library", "loop"], plan.describe()
    assert plan.kernels[1].inputs[0].buffer in {b for _, b in plan.kernels[0].outputs}


def _attention(q, k, v):
    scale = 1.0 / np.sqrt(8.0)
    scores = tf.matmul(q, k, transpose_b=True) * scale
    return tf.matmul(tf.nn.softmax(scores), v)


def test_attention_block():
    tf_fn = tf.function(_attention, input_signature=[dyn(4)] * 3)
    disc_tf.reset_stats()
    jitted = compiled(tf_fn)
    (cluster,) = jitted.report.compiled
    assert cluster.ops and any(op == "BatchMatMulV2" for _, op in cluster.ops)
    rng = np.random.default_rng(11)
    for b, h, t, s, d in [(2, 3, 5, 7, 8), (1, 1, 1, 1, 1), (2, 2, 0, 4, 8), (1, 2, 3, 0, 8),
                          (3, 4, 16, 16, 8), (2, 1, 9, 5, 3)]:
        q = random_value(rng, (b, h, t, d), F32)
        k = random_value(rng, (b, h, s, d), F32)
        v = random_value(rng, (b, h, s, d + 1), F32)
        _compare(tf_fn, jitted, [q, k, v])
    assert disc_tf.stats()["fallbacks"] == 0


@pytest.mark.parametrize("which", ["MatMul", "BatchMatMulV2"])
def test_size_mismatch_is_invalid_argument_and_next_call_works(which):
    if which == "MatMul":
        tf_fn = tf.function(lambda a, b: tf.matmul(a, b) + 1.0, input_signature=[dyn(2)] * 2)
        good = [np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)]
        bad = [np.ones((2, 3), np.float32), np.ones((4, 4), np.float32)]
    else:
        tf_fn = tf.function(lambda a, b: tf.matmul(a, b) + 1.0, input_signature=[dyn(3)] * 2)
        good = [np.ones((2, 2, 3), np.float32), np.ones((2, 3, 4), np.float32)]
        bad = [np.ones((2, 2, 3), np.float32), np.ones((3, 3, 4), np.float32)]
    jitted = compiled(tf_fn)
    _compare(tf_fn, jitted, good)
    with pytest.raises(tf.errors.InvalidArgumentError, match="Matrix size-incompatible|Incompat"):
        jitted(*bad)
    _compare(tf_fn, jitted, good)


@pytest.mark.parametrize("name", ["matmul_tt", "batch_broadcast", "rank3_by_rank2"])
def test_dot_general_dhlo_verifies(name):
    fn, specs = {
        "matmul_tt": (lambda a, b: tf.matmul(a, b, transpose_a=True, transpose_b=True),
                      [dyn(2), dyn(2)]),
        "batch_broadcast": (lambda a, b: tf.matmul(a, b, adjoint_a=True), [dyn(4), dyn(3)]),
        "rank3_by_rank2": (lambda a, b: tf.matmul(a, b), [dyn(3), dyn(2)]),
    }[name]
    module = lower_cluster(cluster_of(fn, *specs))
    assert '"stablehlo.dot_general"' in module.text
    assert "transpose" not in module.text
    assert "dot_dimension_numbers = #stablehlo.dot<" in module.text
    parse_and_verify(module.text)


_GEMM_PATHS_SCRIPT = """
import numpy as np, tensorflow as tf, disc_tf
fn = tf.function(lambda a, b: tf.matmul(a, b, transpose_b=True) + 1.0,
                 input_signature=[tf.TensorSpec([None, None, None])] * 2)
jitted = disc_tf.jit(fn, min_cluster_size=1)
assert jitted.report.compiled
rng = np.random.default_rng(0)
for b, m, n, k in [(1, 130, 70, 90), (5, 3, 4, 2), (2, 0, 3, 4), (3, 2, 2, 0), (1, 200, 1, 300)]:
    x = rng.standard_normal((b, m, k)).astype(np.float32)
    y = rng.standard_normal((b, n, k)).astype(np.float32)
    np.testing.assert_allclose(jitted(x, y), fn(x, y), rtol=1e-4, atol=1e-4)
# attention over heads read in place: the scores only ever a block at a time, in the
# RAL's scratch (sgemm_scratch_c), softmax and P . V on each block
def attention(q, k, v):
    q, k, v = (tf.transpose(t, [0, 2, 1, 3]) for t in (q, k, v))
    p = tf.nn.softmax(tf.matmul(q, k, transpose_b=True) * 0.25, axis=-1)
    return tf.transpose(tf.matmul(p, v), [0, 2, 1, 3])
specs = [tf.TensorSpec([None, None, 2, 8])] * 3
from disc_tf import pipeline
from tests.stage_helpers import cluster_of
plan = pipeline.front_end(cluster_of(attention, *specs)).plan
assert plan.speculative.kernels[0].c_in_scratch  # when q, k and v's batches are equal
att = tf.function(attention, input_signature=specs)
jatt = disc_tf.jit(att, min_cluster_size=1)
for b, s, t in [(2, 150, 150), (1, 1, 7), (1, 300, 40), (2, 5, 0)]:
    q = rng.standard_normal((b, s, 2, 8)).astype(np.float32)
    k, v = (rng.standard_normal((b, t, 2, 8)).astype(np.float32) for _ in range(2))
    np.testing.assert_allclose(jatt(q, k, v), att(q, k, v), rtol=1e-4, atol=1e-4)
assert disc_tf.stats()["fallbacks"] == 0
print("OK")
"""


@pytest.mark.cpu_backend  # the RAL's CPU GEMM blocks; cuda-emu runs GEMMs in its cuBLAS
@pytest.mark.parametrize("isa", ["baseline", "avx2"])
def test_gemm_isa_paths(isa):
    """The RAL's GEMM dispatch: the Eigen fallback and the AVX2 block agree with TF.
    The child uses the session's cache: the setting picks the RAL's GEMM at run time,
    the compiled cluster is the same."""
    import os
    import pathlib

    repo = pathlib.Path(__file__).resolve().parents[2]
    env = dict(os.environ, DISC_TF_GEMM_ISA=isa, PYTHONPATH=str(repo))
    proc = fresh_python.run(["-c", _GEMM_PATHS_SCRIPT], env=env,
                            timeout=300)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


_STREAMED_SCRIPT = """
import numpy as np, tensorflow as tf, disc_tf
mm = tf.function(lambda a, b: tf.nn.relu(tf.matmul(a, b) + 0.5),
                 input_signature=[tf.TensorSpec([None, None])] * 2)
conv = tf.function(lambda x, w: tf.nn.conv1d(x, w, 1, "SAME") * 2.0,
                   input_signature=[tf.TensorSpec([None, None, 8]), tf.TensorSpec([3, 8, None])])
jm, jc = disc_tf.jit(mm, min_cluster_size=1), disc_tf.jit(conv, min_cluster_size=1)
assert jm.report.compiled and jc.report.compiled
rng = np.random.default_rng(0)
# few rows (streamed B, no packing): whole panels, a partial last panel, row
# remainders 1..5, k over one pass of B (256 rows), k = 1; then an Eigen-sized m
for m, k, n in [(1, 5, 64), (7, 300, 130), (13, 1, 200), (96, 513, 64), (40, 64, 100),
                (2, 770, 1000), (200, 40, 96), (5, 16, 63)]:
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    np.testing.assert_allclose(jm(a, b), mm(a, b), rtol=1e-4, atol=1e-4)
# Conv1D by filter taps: the taps after the first accumulate into C
for t, o in [(9, 64), (20, 130), (3, 70)]:
    x = rng.standard_normal((1, t, 8)).astype(np.float32)
    w = rng.standard_normal((3, 8, o)).astype(np.float32)
    np.testing.assert_allclose(jc(x, w), conv(x, w), rtol=1e-4, atol=1e-4)
assert disc_tf.stats()["fallbacks"] == 0
print("OK")
"""


@pytest.mark.cpu_backend  # the RAL's CPU GEMM blocks; cuda-emu runs GEMMs in its cuBLAS
@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_streamed_few_row_gemm(isa):
    """Blocks of few rows stream B unpacked (RAL GEMM block); results agree with TF,
    accumulating (Conv1D taps) and with partial panels, on each ISA's block."""
    import os
    import pathlib

    repo = pathlib.Path(__file__).resolve().parents[2]
    env = dict(os.environ, DISC_TF_GEMM_ISA="" if isa == "native" else isa,
               PYTHONPATH=str(repo))  # the session's cache, as above
    proc = fresh_python.run(["-c", _STREAMED_SCRIPT], env=env,
                            timeout=300)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
