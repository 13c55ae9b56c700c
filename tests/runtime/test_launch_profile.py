"""DISC_TF_PROFILE: per-launch times of compiled clusters, written at exit."""

from __future__ import annotations

import os
import pathlib
import subprocess
import textwrap

from tests import fresh_python

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import numpy as np, tensorflow as tf, disc_tf
    w = tf.constant(np.ones((64, 32), np.float32))
    @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32)])
    def f(x):
        return tf.nn.softmax(tf.nn.relu(tf.matmul(tf.exp(x), w) + 1.0), axis=-1)
    g = disc_tf.jit(f)
    for rows in (3, 50, 7):
        x = np.random.default_rng(rows).standard_normal((rows, 64)).astype(np.float32)
        np.testing.assert_allclose(g(x).numpy(), f(x).numpy(), rtol=1e-4, atol=1e-6)
    assert disc_tf.stats()["fallbacks"] == 0
    """
)


def _run(tmp_path: pathlib.Path, profile: str | None) -> subprocess.CompletedProcess:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               DISC_TF_CACHE_DIR=os.environ.get("DISC_TF_CACHE_DIR", str(tmp_path / "cache")))
    env.pop("DISC_TF_PROFILE", None)
    if profile is not None:
        env["DISC_TF_PROFILE"] = profile
    return fresh_python.run(["-c", SCRIPT], cwd=REPO_ROOT, env=env,
                            timeout=300)


def test_profile_table_lists_every_launch_with_calls(tmp_path):
    out = tmp_path / "profile.txt"
    proc = _run(tmp_path, str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = out.read_text().splitlines()
    assert lines[0].startswith("disc_tf launch profile:")
    rows = [line.split() for line in lines[2:]]
    kinds = {r[2] for r in rows}
    assert kinds == {"call", "gemm", "kernel"}, lines
    # launch -1: the whole disc_entry of each call, which holds every launch
    call = next(r for r in rows if r[2] == "call")
    assert call[1] == "-1" and call[3] == "3", call
    assert call[6] == "-", call  # no share of the launches' total
    launches = [r for r in rows if r[2] != "call"]
    assert f"in {len(launches)} launch sites" in lines[0], lines[0]
    # totals are printed to 0.001 ms: allow each row's rounding
    assert float(call[4]) >= sum(float(r[4]) for r in launches) - 0.001 * len(rows), lines
    gemm = next(r for r in rows if r[2] == "gemm")
    assert gemm[3] == "3"  # three calls
    assert "m=3 n=32 k=64" in " ".join(gemm)  # sizes of the first call
    assert "+epilogue" in " ".join(gemm)  # bias + ReLU run inside the GEMM
    assert [int(r[1]) for r in rows] == sorted(int(r[1]) for r in rows) or len(rows) > 1


def test_no_profile_without_the_variable(tmp_path):
    proc = _run(tmp_path, None)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "launch profile" not in proc.stderr
