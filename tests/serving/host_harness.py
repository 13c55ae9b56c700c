"""What the serving tests share: a small dynamic-shape model, random requests, TF's
answers, and a runner for the C++ host (``serving/host/disc_serving_host.cc``)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from serving import tensor_file

FEATURES, UNITS = 32, 64
RTOL, ATOL = 1e-4, 1e-5


class ServingModel(tf.Module):
    """``x [batch, seq, 32]`` through a dense layer with a tanh GELU, then either two
    reductions (``pooled [batch, 64]``, ``score [batch, seq]``) or, with
    ``reductions=False``, per-token outputs only (``hidden``, ``score`` as a
    matrix-vector product)."""

    def __init__(self, reductions: bool = True, seed: int = 0) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        self.reductions = reductions
        self.w = tf.Variable(rng.standard_normal((FEATURES, UNITS)).astype(np.float32) * 0.3)
        self.b = tf.Variable(rng.standard_normal(UNITS).astype(np.float32) * 0.1)
        self.v = tf.Variable(rng.standard_normal((UNITS, 1)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, None, FEATURES], tf.float32)])
    def __call__(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        h = tf.matmul(x, self.w) + self.b
        g = 0.5 * h * (1.0 + tf.tanh(0.7978845608 * (h + 0.044715 * h * h * h)))
        if self.reductions:
            return {"pooled": tf.reduce_mean(g, axis=1),
                    "score": tf.reduce_sum(g * self.v[:, 0], axis=-1)}
        return {"hidden": g, "score": tf.squeeze(tf.matmul(g, self.v), axis=-1)}


def save(model: ServingModel, path: pathlib.Path) -> pathlib.Path:
    """Saves ``model`` with its call as the serving_default signature."""
    tf.saved_model.save(model, str(path), signatures=model.__call__)
    return path


def save_optimized(model: ServingModel, root: pathlib.Path,
                   signing_key: pathlib.Path | None = None) -> pathlib.Path:
    """Saves ``model`` to ``root/original`` and its optimized copy (kernels for this
    machine's ISA only, to keep the test short) to ``root/optimized``; returns the
    latter. ``signing_key`` (an Ed25519 private key's PEM file) adds its signature
    to every artifact."""
    import disc_tf

    out = root / "optimized"
    disc_tf.optimize(str(save(model, root / "original")), str(out), isa="host", quiet=True,
                     signing_key=signing_key)
    return out


def random_requests(seed: int, count: int) -> list[list[np.ndarray]]:
    """``count`` requests at random shapes (batch 1-8, sequence 1-48), after three
    edge cases: one token, an empty batch and an empty sequence."""
    rng = np.random.default_rng(seed)
    shapes = [(1, 1), (0, 3), (2, 0)] + [(int(rng.integers(1, 9)), int(rng.integers(1, 49)))
                                         for _ in range(count - 3)]
    return [[rng.standard_normal((b, t, FEATURES)).astype(np.float32)] for b, t in shapes]


def reference(model: ServingModel, requests: Sequence[Sequence[np.ndarray]]
              ) -> list[list[np.ndarray]]:
    """TF's responses (Python, original ops), outputs sorted by key as the host
    orders them."""
    responses = []
    for (x,) in requests:
        out = model(tf.constant(x))
        responses.append([out[k].numpy() for k in sorted(out)])
    return responses


def host_env(**extra: str) -> dict[str, str]:
    """The test's environment (artifact cache, its key, strict mode) plus ``extra``;
    TF's info logs off."""
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **extra}


#: Settings of the test session that another host would not share.
_THIS_HOST_ONLY = ("DISC_TF_TRUSTED_KEYS", "DISC_TF_ARTIFACTS", "TF_DISC_ENABLE",
                   "DISC_TF_FORCE_FALLBACK", "DISC_TF_TARGET")


def other_host_env(home: pathlib.Path, **extra: str) -> dict[str, str]:
    """:func:`host_env` for a host that built nothing the test session did: its own
    empty artifact cache and its own cache secret (created by its compiler) under
    ``home``, none of the session's trust settings, and ``extra``."""
    home.mkdir(mode=0o700, exist_ok=True)
    env = {k: v for k, v in host_env().items() if k not in _THIS_HOST_ONLY}
    return {**env, "DISC_TF_CACHE_DIR": str(home / "cache"),
            "DISC_TF_CACHE_KEY_FILE": str(home / "secret.key"), **extra}


def run_host(host: pathlib.Path, model_dir: pathlib.Path, op_lib: pathlib.Path | None,
             requests: pathlib.Path, *args: str, env: dict[str, str] | None = None,
             timeout: float = 300) -> dict:
    """Runs the host; returns its JSON summary plus ``returncode`` and ``log``
    (stderr). Raises AssertionError if it printed no summary."""
    cmd = [str(host), "--model", str(model_dir), "--requests", str(requests), *args]
    if op_lib is not None:
        cmd += ["--op-lib", str(op_lib)]
    proc = subprocess.run(cmd, env=env or host_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)
    lines = proc.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("{"), f"no summary (exit {proc.returncode}):\n" \
        f"{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}"
    return {**json.loads(lines[-1]), "returncode": proc.returncode, "log": proc.stderr}


def assert_close(got: Sequence[Sequence[np.ndarray]], want: Sequence[Sequence[np.ndarray]]
                 ) -> None:
    """Every response of ``got`` matches ``want`` (shapes, then rtol/atol)."""
    assert len(got) == len(want)
    for i, (g_msg, w_msg) in enumerate(zip(got, want)):
        for g, w in zip(g_msg, w_msg, strict=True):
            assert g.shape == w.shape, (i, g.shape, w.shape)
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=f"request {i}")


def write_requests(path: pathlib.Path, requests: Sequence[Sequence[np.ndarray]]) -> pathlib.Path:
    """Writes requests (or responses) as a tensor file; returns ``path``."""
    tensor_file.write(path, requests)
    return path
