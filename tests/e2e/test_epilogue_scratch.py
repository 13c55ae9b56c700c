"""C in per-block scratch for a GEMM whose row-wise epilogue is its only reader
(fusion/scratch_c.py): a projection followed by a residual and a layer norm never
holds its product whole, and the layer norm writes in place of the residual. Against
TF at row counts on every RAL path (few rows: columns, then rows of a temporary C;
more: row blocks in scratch, several per thread past 1 MiB; blocks that short with
a B beyond L2: C whole again), the call's temporaries counted, and the plans that
keep C in memory."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from disc_tf import pipeline
from tests.harness import assert_matches_tf, compiled
from tests.stage_helpers import cluster_of

#: The CPU backend's GEMM epilogues.
pytestmark = pytest.mark.cpu_backend

F32 = tf.float32
H, F = 64, 192
RNG = np.random.default_rng(53)
W0 = tf.Variable((RNG.normal(size=(H, H)) / 8).astype(np.float32))
W1 = tf.Variable((RNG.normal(size=(H, F)) / 8).astype(np.float32))
W2 = tf.Variable((RNG.normal(size=(F, H)) / 14).astype(np.float32))
W3 = tf.Variable((RNG.normal(size=(H, H)) / 8).astype(np.float32))


def _norm(x):
    mean = tf.reduce_mean(x, -1, keepdims=True)
    var = tf.reduce_mean(tf.square(x - mean), -1, keepdims=True)
    return (x - mean) * tf.math.rsqrt(var + 1e-5)


def ffn_block(x):
    """Attention-output-like projection, then an FFN with its residual and norm, and
    one more GEMM reading the norm (so its result is a temporary)."""
    x1 = _norm(x + tf.matmul(x, W0))
    h = tf.nn.relu(tf.matmul(x1, W1))
    x2 = _norm(x1 + tf.matmul(h, W2))
    return tf.matmul(x2, W3)


def _plan(fn, spec):
    return pipeline.front_end(cluster_of(fn, spec)).plan


def test_the_ffn_output_gemm_keeps_c_in_scratch_and_matches_tf():
    spec = tf.TensorSpec([None, H], F32)
    plan = _plan(ffn_block, spec)
    scratch = [k for k in plan.kernels if k.c_in_scratch]
    assert len(scratch) == 1 and scratch[0].ops[0].tf_node == "MatMul_2", plan.describe()
    (_, c), = scratch[0].outputs
    # the norm's result takes the residual's memory, not C's
    (_, normed), = [k for k in plan.kernels if k.name == scratch[0].epilogue][0].outputs
    assert plan.buffers[normed].reuses and plan.memory(normed) != c, plan.describe()
    tf_fn = tf.function(ffn_block, input_signature=[spec])
    jitted = compiled(tf_fn)
    # 5 and 40 rows: C whole, columns then rows; 700: a block of rows per task in
    # scratch; 20000: blocks cut to 1 MiB of C (B stays in L2), several per thread
    for rows in (5, 40, 700, 20000, 1, 0):
        x = RNG.normal(size=(rows, H)).astype(np.float32)
        disc_tf.reset_stats()
        assert_matches_tf(tf_fn, jitted, [x], 1e-4, 1e-4)
        # the plan's temporaries at the peak: x1 and h (C of MatMul_2 is none of them;
        # with few rows the launch keeps it whole a while)
        assert disc_tf.stats()["peak_temp_bytes"] == rows * (H + F) * 4, (rows, disc_tf.stats())


def _c_read_twice(x):
    x1 = _norm(x + tf.matmul(x, W0))
    c = tf.matmul(tf.nn.relu(tf.matmul(x1, W1)), W2)
    return _norm(x1 + c), c


def _residual_is_the_gemm_input(x):
    x1 = _norm(x * 2.0)
    return _norm(x1 + tf.matmul(x1, W0)) * 3.0


@pytest.mark.parametrize("fn", [_c_read_twice, _residual_is_the_gemm_input],
                         ids=["c_returned", "residual_is_a"])
def test_c_stays_in_memory_where_it_must(fn):
    """C returned too; the residual being the GEMM's own A (the norm may not write
    over it while other blocks read it): that C (the last GEMM's) not in scratch,
    answers as TF's. (The ReLU's C before it may be: only the next GEMM reads it.)"""
    spec = tf.TensorSpec([None, H], F32)
    plan = _plan(fn, spec)
    last_gemm = [k for k in plan.kernels if k.kind == "library"][-1]
    assert not last_gemm.c_in_scratch, plan.describe()
    tf_fn = tf.function(fn, input_signature=[spec])
    jitted = compiled(tf_fn)
    for rows in (3, 500):
        x = RNG.normal(size=(rows, H)).astype(np.float32)
        assert_matches_tf(tf_fn, jitted, [x], 1e-4, 1e-4)


_WHOLE_C_SCRIPT = """
import numpy as np, tensorflow as tf, disc_tf
from tests.e2e.test_epilogue_scratch import WIDE_N, wide_projection
fn = tf.function(wide_projection, input_signature=[tf.TensorSpec([None, WIDE_N], tf.float32)])
jitted = disc_tf.jit(fn, min_cluster_size=1, strict=True)
x = np.random.default_rng(3).normal(size=(2000, WIDE_N)).astype(np.float32)
np.testing.assert_allclose(jitted(x).numpy(), fn(x).numpy(), rtol=1e-4, atol=1e-4)
print("OK")
"""

WIDE_K, WIDE_N = 256, 768
W_WIDE = tf.Variable((RNG.normal(size=(WIDE_K, WIDE_N)) / 16).astype(np.float32))


def wide_projection(x):
    """An FFN's output projection whose packed B (192 K floats) is past half an L2 of
    1 MiB yet small enough that every ISA's split gives each thread one or two blocks of
    whole rows; its residual (a temp) and norm are C's only readers. (Its A is no GEMM's
    result, so that it runs alone, not as a run of layers.)"""
    x1 = _norm(x)
    return _norm(x1 + tf.matmul(tf.nn.relu(x1[:, :WIDE_K] * 2.0), W_WIDE))


def test_a_b_beyond_l2_keeps_c_whole_rather_than_cut_short_blocks(tmp_path):
    """Where 1 MiB blocks of C would be shorter than the GEMM's own row blocks and B
    does not stay in L2 (here: an L2 of 1 MiB, which every ISA's split rule cuts into
    blocks of 500-1000 rows at 2000 x 256 x 768, against 1 MiB blocks of 336 rows), the
    launch keeps C whole as a temp of its own and runs the epilogue on each row block of
    it; the answers hold."""
    import os
    import pathlib

    from tests import fresh_python

    spec = tf.TensorSpec([None, WIDE_N], F32)
    assert [k.c_in_scratch for k in _plan(wide_projection, spec).kernels].count(True) == 1
    repo = pathlib.Path(__file__).resolve().parents[2]
    profile = tmp_path / "profile.txt"
    env = dict(os.environ, PYTHONPATH=str(repo), DISC_TF_L2_BYTES=str(1 << 20),
               DISC_TF_PROFILE=str(profile))
    proc = fresh_python.run(["-c", _WHOLE_C_SCRIPT], env=env, timeout=300)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
    text = profile.read_text()
    assert "m=2000 n=768 k=256 +C whole prepacked" in text, text
