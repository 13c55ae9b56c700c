"""disc_tf.jit: variables, structured outputs, errors, cache across processes."""

from __future__ import annotations

import json
import os
import pathlib
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from tests import fresh_python
from tests.harness import assert_same

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_jit_reads_variables_at_call_time_and_returns_structures():
    v = tf.Variable(np.arange(4, dtype=np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    def f(x):
        return {"a": tf.nn.relu(x * v + 1.0), "b": (tf.exp(x) - v) * 0.5}

    disc_tf.reset_stats()
    jitted = disc_tf.jit(f)
    assert jitted.report.compiled
    rng = np.random.default_rng(0)
    for rows in (3, 1, 0, 17, 5):
        x = rng.standard_normal((rows, 4)).astype(np.float32)
        assert_same(f(x), jitted(x), tf.float32)
        v.assign(v * 1.5)  # the compiled function must see the new value
        assert_same(f(x), jitted(x), tf.float32)
    assert disc_tf.stats()["fallbacks"] == 0


def test_jit_needs_an_input_signature():
    with pytest.raises(ValueError, match="input signature"):
        disc_tf.jit(tf.function(lambda x: x * 2.0 + 1.0))


def test_jit_accepts_plain_python_function_with_signature():
    jitted = disc_tf.jit(lambda x: tf.tanh(x) * 3.0 - 1.0,
                         input_signature=[tf.TensorSpec([None], tf.float32)])
    x = np.linspace(-2, 2, 9).astype(np.float32)
    np.testing.assert_allclose(jitted(x).numpy(), np.tanh(x) * 3.0 - 1.0, rtol=1e-5, atol=1e-6)


_JIT = """
import json
import tensorflow as tf
import disc_tf
@tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
def f(x):
    return tf.sigmoid(x) * x - tf.square(x) * 0.25
disc_tf.reset_stats()
g = disc_tf.jit(f)
for n in (1, 5, 9):
    g(tf.ones([n, 3]))
print("STATS", json.dumps(disc_tf.stats()))
"""


def test_second_process_gets_a_cache_hit(tmp_path):
    env = dict(os.environ, DISC_TF_CACHE_DIR=str(tmp_path), PYTHONPATH=str(REPO))
    results = []
    for _ in range(2):
        proc = fresh_python.run(["-c", textwrap.dedent(_JIT)], env=env,
                                timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        line = [x for x in proc.stdout.splitlines() if x.startswith("STATS ")][-1]
        results.append(json.loads(line[6:]))
    first, second = results
    assert (first["compilations"], first["cache_hits"]) == (1, 0)
    assert (second["compilations"], second["cache_hits"]) == (0, 1)
    assert second["clusters"] == 1 and second["fallbacks"] == 0
