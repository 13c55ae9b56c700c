"""Strict mode (``DISC_TF_STRICT=1``, ``strict=True``): every silent fallback to TF ops
becomes an error naming the cluster and the cause, and the test suite runs strict
(so forcing a fallback makes any e2e test fail: shown per file in the self-test)."""

from __future__ import annotations

import os
import pathlib
import stat
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from disc_tf import strict
from disc_tf.saved_model import optimize_saved_model
from tests import fresh_python

REPO = pathlib.Path(__file__).resolve().parents[2]


def _fn():
    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def f(x):
        return tf.tanh(x * 0.5 + 1.0) * tf.sigmoid(x)

    return f


@pytest.fixture()
def failing_compiler(tmp_path, monkeypatch):
    fake = tmp_path / "cxx"
    fake.write_text('#!/bin/sh\nif [ "$1" = "--version" ]; then echo "fake 1"; exit 0; fi\n'
                    'echo "simulated failure" >&2\nexit 1\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("DISC_TF_CXX", str(fake))
    monkeypatch.setenv("DISC_TF_CACHE_DIR", str(tmp_path / "cache"))


def test_the_suite_runs_strict():
    assert strict.strict_from_env(), "tests/conftest.py sets DISC_TF_STRICT=1"


def test_a_cluster_that_fails_to_compile_raises(failing_compiler):
    with pytest.raises(disc_tf.StrictModeError, match=r"(?s)cluster disc_cluster_0 .*simulated failure"):
        disc_tf.jit(_fn(), min_cluster_size=1)
    with pytest.raises(disc_tf.StrictModeError):
        disc_tf.jit(_fn(), min_cluster_size=1, strict=True)


@pytest.mark.fallback
def test_without_strict_the_cluster_stays_tf_ops(failing_compiler):
    jitted = disc_tf.jit(_fn(), min_cluster_size=1)
    assert jitted.report.clusters and not jitted.report.compiled
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(jitted(x), _fn()(x), rtol=1e-6)
    with pytest.raises(disc_tf.StrictModeError):  # an explicit strict=True still raises
        disc_tf.jit(_fn(), min_cluster_size=1, strict=True)


def test_optimize_strict_raises_and_writes_nothing(failing_compiler, tmp_path):
    class M(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def __call__(self, x):
            return tf.exp(x) * 2.0 + 1.0

    tf.saved_model.save(M(), str(tmp_path / "orig"))
    with pytest.raises(disc_tf.StrictModeError, match="failed to compile"):
        disc_tf.optimize(str(tmp_path / "orig"), str(tmp_path / "opt"), strict=True)
    assert not (tmp_path / "opt").exists()


def _saved(tmp_path: pathlib.Path) -> pathlib.Path:
    class M(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def __call__(self, x):
            return tf.exp(x) * 2.0 + 1.0

    tf.saved_model.save(M(), str(tmp_path / "orig"))
    report = optimize_saved_model(str(tmp_path / "orig"), str(tmp_path / "opt"))
    assert report.compiled
    return tmp_path / "opt"


_CALL = """
import sys
import numpy as np
import tensorflow as tf
import disc_tf
m = {loader}(sys.argv[1])
print("LOADED", flush=True)
print(m(np.ones(3, np.float32)).numpy())
"""


@pytest.mark.parametrize("strict_on", [True, False], ids=["strict", "lenient"])
@pytest.mark.parametrize("loader", ["tf.saved_model.load", "disc_tf.load"])
def test_a_forced_fallback_at_run_time(tmp_path, loader, strict_on):
    # Through disc_tf.load strict mode refuses already at the load's warm-up call, which
    # skips what fails at its made-up shapes but not that (the first real call would).
    opt = _saved(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(REPO), DISC_TF_FORCE_FALLBACK="1",
               DISC_TF_STRICT="1" if strict_on else "0")
    proc = fresh_python.run(["-c", _CALL.format(loader=loader), str(opt)], env=env, timeout=300)
    if strict_on:
        assert proc.returncode != 0
        assert "strict mode (DISC_TF_STRICT)" in proc.stderr
        assert "DISC_TF_FORCE_FALLBACK is set" in proc.stderr and "DiscCluster 'disc_cluster_0'" \
            in proc.stderr
        assert ("LOADED" in proc.stdout) == (loader == "tf.saved_model.load"), proc.stdout
    else:
        assert proc.returncode == 0 and "LOADED" in proc.stdout, proc.stderr[-2000:]


def test_an_artifact_that_does_not_load_is_an_error(tmp_path):
    from tests.reliability import models

    opt = _saved(tmp_path)
    bad = tmp_path / "bad"
    models.rewrite_artifacts(opt, bad, lambda art, sha: (art[: len(art) // 2], sha))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    script = _CALL.format(loader="tf.saved_model.load")
    proc = fresh_python.run(["-c", script, str(bad)], env=env, timeout=300)
    assert proc.returncode != 0 and "its artifact did not load" in proc.stderr, proc.stderr[-2000:]


def test_enable_compiles_synchronously_in_strict_mode(monkeypatch):
    from disc_tf.enable import MODE_VAR, compile_mode

    monkeypatch.delenv(MODE_VAR, raising=False)
    assert compile_mode() == "sync"
    monkeypatch.setenv("DISC_TF_STRICT", "0")
    assert compile_mode() == "async"


# ---- self-test: forcing a fallback makes every e2e test file fail

E2E_FILES = sorted(p.name for p in (REPO / "tests" / "e2e").glob("test_*.py"))
#: the files the default run tries; the slow suite tries every e2e file
DEFAULT_FILES = ["test_elementwise_ops.py", "test_saved_model.py"]


def _failures_with_fallback_forced(files: list[str], tmp_path: pathlib.Path) -> dict[str, str]:
    """{file: failure text} of the first strict test of each of ``files``, all run in one
    pytest process with every cluster forced to fall back; a passing test maps to ''."""
    report = tmp_path / "report.xml"
    env = dict(os.environ, DISC_TF_FORCE_FALLBACK="1", DISC_TF_CACHE_DIR=str(tmp_path / "cache"))
    proc = fresh_python.run(
        ["-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-p", "tests.first_test_per_file", "-m", "not slow and not fallback",
         f"--junitxml={report}", *(str(REPO / "tests" / "e2e" / f) for f in files)],
        env=env, cwd=REPO, timeout=1800)
    assert report.exists(), (proc.stdout + proc.stderr)[-3000:]
    results: dict[str, str] = {}
    for case in ET.parse(report).iter("testcase"):
        parts = case.get("classname", "").split(".")  # tests.e2e.<module>[.<class>]
        name = next((f for f in files if f.removesuffix(".py") in parts), case.get("name"))
        problems = [e for e in case if e.tag in ("failure", "error")]
        results[name] = "".join(
            (e.get("message") or "") + (e.text or "") for e in problems)
    return results


@pytest.mark.parametrize("files", [
    pytest.param(DEFAULT_FILES, id="default"),
    pytest.param(E2E_FILES, id="every_e2e_file", marks=pytest.mark.slow)])
def test_forcing_a_fallback_fails_each_file(files, tmp_path):
    results = _failures_with_fallback_forced(files, tmp_path)
    assert sorted(results) == sorted(files), results
    for name, failure in results.items():
        assert failure, f"{name}: its first test passed with every cluster running TF ops"
        assert "strict mode" in failure, (name, failure[-3000:])
