"""TF_DISC_ENABLE=1: unmodified TensorFlow scripts run through disc_tf.

Each script runs in a fresh interpreter: once with the variable (disc_tf is
loaded by the ``disc_tf_autoload.pth`` hook when TensorFlow is imported) and
once without; the outputs must agree. ``DISC_TF_COMPILE_MODE=sync`` makes the
first call wait for the compiled cluster; the default (async) serves the first
calls with the original ops while a background thread compiles.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import pathlib
import shutil
import site
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest

from tests import fresh_python

SHAPES = [(2, 3), (5, 7), (1, 129)]

_REPORT = textwrap.dedent(
    """
    import json, sys
    print("LOADED", "disc_tf" in sys.modules or "disc_tf_autoload" in sys.modules)
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

# Async: the first call must run the original ops (the compiler is still
# busy: a fresh cache, g++ takes seconds), later calls the compiled cluster.
_ASYNC_BODY = f"""
rng = np.random.default_rng(0)
xs = [rng.standard_normal(s).astype(np.float32) for s in {SHAPES!r}]
first = call(xs[0])
if "disc_tf" in sys.modules:
    import disc_tf
    print("FIRST", json.dumps(disc_tf.stats()))
    from disc_tf.background import pending_calls
    from disc_tf.enable import compile_queue
    print("PENDING_CALLS", sum(pending_calls(k) for k in compile_queue().submitted()))
    deadline = time.monotonic() + 240
    while disc_tf.stats()["clusters"] == 0 and time.monotonic() < deadline:
        time.sleep(0.1)  # the compiler publishes the cluster when it is built
    print("WAITED", disc_tf.stats()["clusters"] > 0)
    print("BEFORE", json.dumps(disc_tf.stats()))
for x in xs:
    print("OUT", json.dumps(call(x).tolist()))
"""

ASYNC_TF2_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def f(x):
        return tf.tanh(x * 2.0 + 1.0) * tf.sigmoid(x)

    def call(v):
        return f(v).numpy()
    """
) + _ASYNC_BODY + _REPORT

ASYNC_TF1_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    x_in = tf.compat.v1.placeholder(tf.float32, [None, None], name="x")
    y = tf.tanh(x_in * 2.0 + 1.0) * tf.sigmoid(x_in)
    sess = tf.compat.v1.Session()

    def call(v):
        return sess.run(y, {x_in: v})
    """
) + _ASYNC_BODY + _REPORT

# The job ends while its cluster is still compiling: it must exit cleanly.
EXIT_EARLY_SCRIPT = textwrap.dedent(
    """
    import numpy as np
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def f(x):
        return tf.tanh(x * 2.0 + 1.0) * tf.sigmoid(x)

    print("OUT", f(np.ones((2, 2), np.float32)).numpy().tolist())
    raise SystemExit(0)
    """
)

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


def run_script(script: str, tmp_path: pathlib.Path, enabled: bool, mode: str = "sync",
         extra_env: dict[str, str] | None = None) -> dict:
    env = dict(os.environ)
    env.pop("TF_DISC_ENABLE", None)
    env["DISC_TF_COMPILE_MODE"] = mode
    if enabled:
        env["TF_DISC_ENABLE"] = "1"
    env["DISC_TF_CACHE_DIR"] = str(tmp_path / "cache")
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env.update(extra_env or {})
    path = tmp_path / "script.py"
    path.write_text(script)
    proc = fresh_python.run([str(path)], cwd=tmp_path, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result: dict = {"outs": [], "loaded": None, "stats": None}
    for line in proc.stdout.splitlines():
        key, _, rest = line.partition(" ")
        if key == "OUT":
            result["outs"].append(np.array(json.loads(rest), np.float32))
        elif key == "LOADED":
            result["loaded"] = rest == "True"
        elif key in ("STATS", "FIRST", "BEFORE", "PENDING_CALLS"):
            result[key.lower()] = json.loads(rest)
        elif key == "WAITED":
            result["waited"] = rest == "True"
    assert len(result["outs"]) == len(SHAPES), proc.stdout + proc.stderr
    result["log"] = proc.stdout + proc.stderr
    assert "failed to load" not in result["log"], result["log"]
    return result


def _same_outputs(disc: dict, plain: dict) -> None:
    for got, want, shape in zip(disc["outs"], plain["outs"], SHAPES):
        assert got.shape == shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@functools.cache
def plain_run(script: str) -> dict:
    """``script`` run without the variable: the reference outputs. Memoized per test process
    (the outputs are TF's own; tests of one script share one run of it)."""
    workdir = tempfile.mkdtemp(prefix="plain_")
    atexit.register(shutil.rmtree, workdir, True)
    return run_script(script, pathlib.Path(workdir), enabled=False)


def check_enabled(script: str, tmp_path: pathlib.Path, extra_env: dict[str, str] | None = None) -> dict:
    plain = plain_run(script)
    assert plain["loaded"] is False  # without the variable nothing is imported
    disc = run_script(script, tmp_path, enabled=True, extra_env=extra_env)
    assert disc["loaded"] is True, disc["log"]
    stats = disc["stats"]
    assert stats["clusters"] >= 1, disc["log"]
    assert stats["fallbacks"] == 0, disc["log"]
    _same_outputs(disc, plain)
    return stats


def test_tf_function_script(tmp_path):
    stats = check_enabled(TF2_SCRIPT, tmp_path)
    assert stats["compilations"] + stats["cache_hits"] >= 1


def test_tf1_session_script(tmp_path):
    stats = check_enabled(TF1_SCRIPT, tmp_path)
    assert stats["compilations"] + stats["cache_hits"] >= 1


def check_async(tmp_path: pathlib.Path, extra_env: dict[str, str] | None = None,
                script: str = ASYNC_TF2_SCRIPT) -> dict:
    """Runs an async script with and without disc_tf; checks the switch-over."""
    plain = plain_run(script)
    disc = run_script(script, tmp_path, enabled=True, mode="async", extra_env=extra_env)
    first, before, after = disc["first"], disc["before"], disc["stats"]
    # The first call ran the original ops through the DiscCluster's fallback.
    assert first["fallbacks"] >= 1 and first["clusters"] == 0, disc["log"]
    assert disc["waited"] is True, disc["log"]  # compiled within the bound
    assert before["clusters"] >= 1, disc["log"]
    # Every later call ran the compiled cluster: no more fallbacks.
    assert after["fallbacks"] == before["fallbacks"], disc["log"]
    _same_outputs(disc, plain)
    return disc


@pytest.mark.fallback
def test_async_mode_serves_tf_ops_first_then_the_compiled_cluster(tmp_path):
    disc = check_async(tmp_path)
    assert disc["before"]["compilations"] >= 1, disc["log"]  # compiled in this process
    # the fallback calls were counted, so the compile queue builds the hottest first
    assert disc["pending_calls"] >= 1, disc["log"]


# Slow suite: async mode is in the default run with a tf.function, a TF1 session sync.
@pytest.mark.slow
@pytest.mark.fallback
def test_async_mode_tf1_session(tmp_path):
    check_async(tmp_path, script=ASYNC_TF1_SCRIPT)


def test_async_job_exits_cleanly_while_compiling(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TF_DISC_ENABLE"}
    env.update(TF_DISC_ENABLE="1", DISC_TF_CACHE_DIR=str(tmp_path / "cache"),
               TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("DISC_TF_COMPILE_MODE", None)  # the default is async
    path = tmp_path / "early.py"
    path.write_text(EXIT_EARLY_SCRIPT)
    proc = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("OUT "), proc.stdout + proc.stderr


def test_not_imported_without_variable():
    """Without the variable, importing TensorFlow loads neither the hook's module nor disc_tf
    (the plain run of a script that imports TensorFlow says which it saw)."""
    assert plain_run(TF2_SCRIPT)["loaded"] is False
