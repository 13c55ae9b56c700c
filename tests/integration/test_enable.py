"""TF_DISC_ENABLE=1: unmodified TensorFlow scripts run through disc_tf.

Each script runs in a fresh interpreter: once with the variable (disc_tf is
loaded by the ``disc_tf_autoload.pth`` hook when TensorFlow is imported) and
once without; the outputs must agree.
"""

from __future__ import annotations

import json
import os
import pathlib
import site
import subprocess
import sys
import textwrap

import numpy as np

SHAPES = [(2, 3), (5, 7), (1, 129)]

_REPORT = textwrap.dedent(
    """
    import json, sys
    print("LOADED", "disc_tf" in sys.modules)
    if "disc_tf" in sys.modules:
        import disc_tf
        print("STATS", json.dumps(disc_tf.stats()))
    """
)

TF2_SCRIPT = textwrap.dedent(
    f"""
    import json
    import numpy as np
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def f(x):
        return tf.tanh(x * 2.0 + 1.0) * tf.sigmoid(x)

    rng = np.random.default_rng(0)
    for shape in {SHAPES!r}:
        x = rng.standard_normal(shape).astype(np.float32)
        print("OUT", json.dumps(f(x).numpy().tolist()))
    """
) + _REPORT

TF1_SCRIPT = textwrap.dedent(
    f"""
    import json
    import numpy as np
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    x = tf.compat.v1.placeholder(tf.float32, [None, None], name="x")
    y = tf.tanh(x * 2.0 + 1.0) * tf.sigmoid(x)
    rng = np.random.default_rng(0)
    with tf.compat.v1.Session() as sess:
        for shape in {SHAPES!r}:
            v = rng.standard_normal(shape).astype(np.float32)
            print("OUT", json.dumps(sess.run(y, {{x: v}}).tolist()))
    """
) + _REPORT


def _hook_installed() -> bool:
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return any((pathlib.Path(d) / "disc_tf_autoload.pth").is_file() for d in dirs)


def test_autoload_hook_is_installed():
    """`make install` (pip install -e .) must put the post-import hook in site-packages."""
    assert _hook_installed(), "disc_tf_autoload.pth is not installed (run `pip install -e .`)"


def _run(script: str, tmp_path: pathlib.Path, enabled: bool) -> dict:
    env = dict(os.environ)
    env.pop("TF_DISC_ENABLE", None)
    if enabled:
        env["TF_DISC_ENABLE"] = "1"
    env["DISC_TF_CACHE_DIR"] = str(tmp_path / "cache")
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    path = tmp_path / "script.py"
    path.write_text(script)
    proc = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result: dict = {"outs": [], "loaded": None, "stats": None}
    for line in proc.stdout.splitlines():
        key, _, rest = line.partition(" ")
        if key == "OUT":
            result["outs"].append(np.array(json.loads(rest), np.float32))
        elif key == "LOADED":
            result["loaded"] = rest == "True"
        elif key == "STATS":
            result["stats"] = json.loads(rest)
    assert len(result["outs"]) == len(SHAPES), proc.stdout + proc.stderr
    result["log"] = proc.stdout + proc.stderr
    return result


def _check(script: str, tmp_path: pathlib.Path) -> None:
    plain = _run(script, tmp_path, enabled=False)
    assert plain["loaded"] is False  # without the variable nothing is imported
    disc = _run(script, tmp_path, enabled=True)
    assert disc["loaded"] is True, disc["log"]
    stats = disc["stats"]
    assert stats["clusters"] >= 1, disc["log"]
    assert stats["compilations"] + stats["cache_hits"] >= 1, disc["log"]
    assert stats["fallbacks"] == 0, disc["log"]
    for got, want, shape in zip(disc["outs"], plain["outs"], SHAPES):
        assert got.shape == shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_tf_function_script(tmp_path):
    _check(TF2_SCRIPT, tmp_path)


def test_tf1_session_script(tmp_path):
    _check(TF1_SCRIPT, tmp_path)


def test_not_imported_without_variable(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TF_DISC_ENABLE"}
    proc = subprocess.run(
        [sys.executable, "-c",
         "import sys, tensorflow; print('disc_tf' in sys.modules, 'disc_tf_autoload' in sys.modules)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False"]
