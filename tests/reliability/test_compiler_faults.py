"""Compiler faults: missing compiler, compile errors, timeouts -> CompileError, and the
optimizer leaves the cluster as TF ops that compute the same values."""

from __future__ import annotations

import logging
import pathlib
import shutil
import stat
import time

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from disc_tf.runtime import compiler
from tests.harness import assert_same
from tests.reliability import models

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

#: The smallest loadable CPU artifact: the three entry points, no kernels.
SOURCE = ("#include <stdint.h>\n"
          'extern "C" int32_t disc_abi_version(void) { return 4; }\n'
          'extern "C" int32_t disc_num_kernels(void) { return 0; }\n'
          'extern "C" int32_t disc_entry(void*) { return 42; }\n')


@pytest.fixture()
def fresh_cache(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("DISC_TF_CACHE_DIR", str(root))
    monkeypatch.delenv("DISC_TF_CXX", raising=False)
    monkeypatch.delenv("DISC_TF_COMPILE_TIMEOUT", raising=False)
    return root


def _script(path: pathlib.Path, body: str) -> pathlib.Path:
    """A fake compiler: answers --version like g++, runs ``body`` otherwise."""
    path.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--version" ]; then echo "fake-c++ (test) 1.0"; exit 0; fi\n' + body
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _works_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a fault, the real compiler builds (the following successful call)."""
    monkeypatch.delenv("DISC_TF_CXX", raising=False)
    monkeypatch.delenv("DISC_TF_COMPILE_TIMEOUT", raising=False)
    disc_tf.reset_stats()
    art = compiler.build(SOURCE, "probe", 0)
    assert art.data.startswith(b"\x7fELF")
    assert disc_tf.stats()["compilations"] + disc_tf.stats()["cache_hits"] == 1


def test_disc_tf_cxx_pointing_nowhere(fresh_cache, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("DISC_TF_CXX", str(tmp_path / "no" / "such" / "g++"))
    disc_tf.reset_stats()
    with pytest.raises(compiler.CompileError, match="not found.*DISC_TF_CXX"):
        compiler.build(SOURCE, "probe", 0)
    assert disc_tf.stats()["compilations"] == 0
    _works_again(monkeypatch)


def test_gxx_not_on_path(fresh_cache, monkeypatch, tmp_path) -> None:
    empty = tmp_path / "empty_bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    disc_tf.reset_stats()
    with pytest.raises(compiler.CompileError, match="'g\\+\\+' not found"):
        compiler.build(SOURCE, "probe", 0)
    assert disc_tf.stats()["compilations"] == 0
    monkeypatch.undo()
    monkeypatch.setenv("DISC_TF_CACHE_DIR", str(fresh_cache))
    _works_again(monkeypatch)


def test_not_executable_compiler(fresh_cache, monkeypatch, tmp_path) -> None:
    fake = tmp_path / "cxx"
    fake.write_text("not a program")
    monkeypatch.setenv("DISC_TF_CXX", str(fake))
    with pytest.raises(compiler.CompileError):
        compiler.build(SOURCE, "probe", 0)
    _works_again(monkeypatch)


def test_compiler_error_is_a_compile_error_with_its_stderr(fresh_cache, monkeypatch, tmp_path):
    fake = _script(tmp_path / "bad-cxx", 'echo "kernels.cc:1:1: error: simulated" >&2\nexit 1\n')
    monkeypatch.setenv("DISC_TF_CXX", str(fake))
    disc_tf.reset_stats()
    with pytest.raises(compiler.CompileError, match="simulated") as info:
        compiler.build(SOURCE, "probe", 0)
    assert "exit 1" in str(info.value)
    assert disc_tf.stats()["compilations"] == 0 and disc_tf.stats()["cache_hits"] == 0
    assert not list(fresh_cache.glob("*/*.so")), "a failed compile left a cache entry"
    _works_again(monkeypatch)


def test_compiler_that_writes_nothing(fresh_cache, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("DISC_TF_CXX", str(_script(tmp_path / "lazy-cxx", "exit 0\n")))
    with pytest.raises(compiler.CompileError, match="no shared object"):
        compiler.build(SOURCE, "probe", 0)
    _works_again(monkeypatch)


def _dead(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def test_timeout_kills_the_compiler_and_its_children(fresh_cache, monkeypatch, tmp_path):
    pids = tmp_path / "pids"
    fake = _script(tmp_path / "slow-cxx", f"sleep 60 &\necho $$ $! > {pids}\nwait\n")
    monkeypatch.setenv("DISC_TF_CXX", str(fake))
    monkeypatch.setenv("DISC_TF_COMPILE_TIMEOUT", "1")
    disc_tf.reset_stats()
    start = time.monotonic()
    with pytest.raises(compiler.CompileError, match="did not finish within 1s"):
        compiler.build(SOURCE, "probe", 0)
    assert time.monotonic() - start < 15
    assert disc_tf.stats()["compilations"] == 0
    for pid in map(int, pids.read_text().split()):
        assert _dead(pid), f"compiler process {pid} survived the timeout"
    _works_again(monkeypatch)


def test_bad_timeout_value_uses_the_default(monkeypatch) -> None:
    monkeypatch.setenv("DISC_TF_COMPILE_TIMEOUT", "soon")
    assert compiler.compile_timeout() == 300.0
    monkeypatch.setenv("DISC_TF_COMPILE_TIMEOUT", "2.5")
    assert compiler.compile_timeout() == 2.5


def test_disc_tf_cxx_is_part_of_the_cache_key(fresh_cache, monkeypatch, tmp_path) -> None:
    real = shutil.which("g++")
    wrapper = _script(tmp_path / "wrapped-g++", f'exec {real} "$@"\n')
    base = compiler.cache_key(SOURCE)
    monkeypatch.setenv("DISC_TF_CXX", real)
    by_path = compiler.cache_key(SOURCE)
    monkeypatch.setenv("DISC_TF_CXX", str(wrapper))
    assert len({base, by_path, compiler.cache_key(SOURCE)}) == 3
    disc_tf.reset_stats()
    art = compiler.build(SOURCE, "probe", 0)
    assert art.data.startswith(b"\x7fELF") and not art.from_cache
    assert disc_tf.stats()["compilations"] == 1


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    return models.save_original(tmp_path_factory.mktemp("faults"))


@pytest.mark.fallback
@pytest.mark.parametrize("fault", ["missing", "error", "timeout"])
def test_optimize_with_a_faulty_compiler_leaves_tf_ops(
    original, fault, fresh_cache, monkeypatch, tmp_path, caplog
) -> None:
    model, orig = original
    if fault == "missing":
        monkeypatch.setenv("DISC_TF_CXX", str(tmp_path / "missing-g++"))
    elif fault == "error":
        monkeypatch.setenv("DISC_TF_CXX", str(_script(tmp_path / "cxx", "exit 3\n")))
    else:
        monkeypatch.setenv("DISC_TF_CXX", str(_script(tmp_path / "cxx", "exec sleep 30\n")))
        monkeypatch.setenv("DISC_TF_COMPILE_TIMEOUT", "1")
    caplog.set_level(logging.WARNING, logger="disc_tf")
    report, built = models.optimize(orig, tmp_path / "opt")
    assert report.clusters and not report.compiled
    assert all(c.error and c.error.startswith("CompileError") for c in report.clusters)
    left = [r for r in caplog.records if "left as TF ops" in r.getMessage()]
    assert len(left) == len(report.clusters), caplog.text
    assert built["compilations"] == 0 and built["cache_hits"] == 0
    assert models.count_disc_nodes(tmp_path / "opt") == 0

    loaded = tf.saved_model.load(str(tmp_path / "opt"))
    rng = np.random.default_rng(7)
    for rows in (0, 1, 5, 33):
        x, y = models.inputs(rng, rows)
        assert_same(model(x, y), loaded(x, y), tf.float32)
    assert disc_tf.stats()["fallbacks"] == 0 and disc_tf.stats()["compilations"] == 0

    # The next optimize with a working compiler compiles the cluster.
    monkeypatch.delenv("DISC_TF_CXX")
    monkeypatch.delenv("DISC_TF_COMPILE_TIMEOUT", raising=False)
    report, built = models.optimize(orig, tmp_path / "opt2")
    assert report.compiled and built["compilations"] == len(report.compiled)
    loaded = tf.saved_model.load(str(tmp_path / "opt2"))
    x, y = models.inputs(rng, 9)
    assert_same(model(x, y), loaded(x, y), tf.float32)


@pytest.mark.fallback
def test_jit_with_a_failing_compiler_runs_the_original_ops(fresh_cache, monkeypatch, tmp_path):
    monkeypatch.setenv("DISC_TF_CXX", str(_script(tmp_path / "cxx", "exit 1\n")))

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def f(x):
        return tf.exp(x * 0.5) - tf.tanh(x)

    disc_tf.reset_stats()
    jitted = disc_tf.jit(f, min_cluster_size=1)
    assert jitted.report.clusters and not jitted.report.compiled
    x = np.random.default_rng(3).standard_normal((4, 6)).astype(np.float32)
    assert_same(f(x), jitted(x), tf.float32)
    stats = disc_tf.stats()
    assert stats["compilations"] == 0 and stats["fallbacks"] == 0
