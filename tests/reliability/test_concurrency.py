"""Concurrency: processes compiling the same cluster at once, and threads calling one
optimized SavedModel at many shapes (a 60 s soak with a memory check is marked slow)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import stat
import textwrap
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from tests import fresh_python
from tests.reliability import models

REPO = pathlib.Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

_COMPILE = textwrap.dedent("""
    import json, pathlib, sys, time
    import tensorflow as tf
    import disc_tf
    barrier, me, n = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def f(x):
        return tf.tanh(x * 0.75 + 1.0) * tf.sigmoid(x) - x

    (barrier / f"ready-{me}").touch()
    deadline = time.monotonic() + 240
    while len(list(barrier.glob("ready-*"))) < n:
        assert time.monotonic() < deadline, "barrier timed out"
        time.sleep(0.01)
    disc_tf.reset_stats()
    jitted = disc_tf.jit(f, min_cluster_size=1)
    assert len(jitted.report.compiled) == 1, jitted.report
    x = tf.random.normal([5, 9])
    tf.debugging.assert_near(jitted(x), f(x), rtol=1e-5, atol=1e-6)
    s = disc_tf.stats()
    assert s["fallbacks"] == 0, s
    print("STATS", json.dumps(s))
""")


def _start_together(tmp_path: pathlib.Path, script: str, n: int, tag: str) -> list:
    """Runs ``script`` in ``n`` processes that start compiling together (a barrier),
    with one cache and a compiler slow enough that every process arrives while the
    first compiles; returns the JSON each printed after ``tag``."""
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    slow = tmp_path / "slow-g++"
    slow.write_text(f'#!/bin/sh\n[ "$1" = "--version" ] || sleep 2\nexec {shutil.which("g++")} "$@"\n')
    slow.chmod(slow.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ, PYTHONPATH=str(REPO), DISC_TF_CACHE_DIR=str(tmp_path / "cache"),
               DISC_TF_CXX=str(slow))
    procs = [fresh_python.start(["-c", script, str(barrier), str(i), str(n)],
                                env=env)
             for i in range(n)]
    printed = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-4000:]
        line = [x for x in out.splitlines() if x.startswith(tag)][-1]
        printed.append(json.loads(line[len(tag):]))
    return printed


def test_processes_compiling_one_cluster_compile_it_once(tmp_path: pathlib.Path) -> None:
    n = 3
    stats = _start_together(tmp_path, _COMPILE, n, "STATS ")
    assert sum(s["compilations"] for s in stats) == 1, stats
    assert sum(s["cache_hits"] for s in stats) == n - 1, stats
    entries = sorted((tmp_path / "cache").glob("*/*.so"))
    assert len(entries) == 1, entries


_SHARED_KERNEL = textwrap.dedent("""
    import json, pathlib, sys, time
    import tensorflow as tf
    import disc_tf
    barrier, me, n = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    # The same kernel in every process; the input's name (a comment of the host
    # runner) makes each process's cluster its own.
    f = tf.function(lambda x: tf.tanh(x * 0.75 + 1.0) * tf.sigmoid(x) - x,
                    input_signature=[tf.TensorSpec([None, None], tf.float32, name=f"x{me}")])
    (barrier / f"ready-{me}").touch()
    deadline = time.monotonic() + 240
    while len(list(barrier.glob("ready-*"))) < n:
        assert time.monotonic() < deadline, "barrier timed out"
        time.sleep(0.01)
    jitted = disc_tf.jit(f, min_cluster_size=1)
    (c,) = jitted.report.compiled
    x = tf.random.normal([5, 9])
    tf.debugging.assert_near(jitted(x), f(x), rtol=1e-5, atol=1e-6)
    print("UNITS", json.dumps([c.from_cache, c.units_compiled, c.units_cached]))
""")


def test_four_processes_compile_a_shared_kernel_once(tmp_path: pathlib.Path) -> None:
    """Four processes start together, each with its own cluster around the same
    kernel: one compiles the kernel's object, the others link it from the cache."""
    n = 4
    units = _start_together(tmp_path, _SHARED_KERNEL, n, "UNITS ")
    assert all(not from_cache for from_cache, _, _ in units), units  # four clusters
    assert sorted((compiled, cached) for _, compiled, cached in units) == [(0, 1)] * 3 + [(1, 0)]
    assert len(list((tmp_path / "cache").glob("*/*.o"))) == 1
    assert len(list((tmp_path / "cache").glob("*/*.so"))) == n


@pytest.fixture(scope="module")
def optimized(tmp_path_factory):
    root = tmp_path_factory.mktemp("threads")
    model, orig = models.save_original(root)
    report, _ = models.optimize(orig, root / "opt")
    assert report.compiled, report
    return model, tf.saved_model.load(str(root / "opt"))


def _statm_rss_bytes() -> int:
    return int(pathlib.Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _hammer(model, loaded, seconds: float, threads: int = 16, on_tick=None) -> list[int]:
    """Calls ``loaded`` from ``threads`` threads at random shapes for ``seconds``; every
    output is compared with the original model. Returns the calls of each thread."""
    stop = threading.Event()
    errors: list[BaseException] = []
    calls = [0] * threads

    def work(i: int) -> None:
        rng = np.random.default_rng(1000 + i)
        try:
            while not stop.is_set():
                x, y = models.inputs(rng, int(rng.integers(0, 300)))
                got = loaded(x, y).numpy()
                want = model(x, y).numpy()
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
                calls[i] += 1
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)
            stop.set()

    pool = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
    for t in pool:
        t.start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not stop.is_set():
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        if on_tick is not None:
            on_tick()
    stop.set()
    for t in pool:
        t.join(60)
    if errors:
        raise errors[0]
    return calls


def test_sixteen_threads_at_random_shapes(optimized) -> None:
    model, loaded = optimized
    disc_tf.reset_stats()
    calls = _hammer(model, loaded, seconds=4.0)
    assert all(c > 0 for c in calls), calls
    stats = disc_tf.stats()
    assert stats["fallbacks"] == 0 and stats["compilations"] == 0, stats


@pytest.mark.slow
def test_sixteen_threads_for_a_minute_memory_stays_flat(optimized) -> None:
    model, loaded = optimized
    _hammer(model, loaded, seconds=10.0)  # warm-up: pools, allocator, TF caches
    baseline = _statm_rss_bytes()
    samples: list[int] = []
    disc_tf.reset_stats()
    calls = _hammer(model, loaded, seconds=60.0, on_tick=lambda: samples.append(_statm_rss_bytes()))
    assert sum(calls) > 0 and all(c > 0 for c in calls), calls
    assert disc_tf.stats()["fallbacks"] == 0
    peak = max(samples)
    assert peak <= baseline * 1.10, (
        f"resident memory grew from {baseline >> 20} MiB to {peak >> 20} MiB "
        f"over {sum(calls)} calls")
