"""The graph pass's compiler for hosts without Python, forced in a Python host.

``DISC_TF_COMPILER=subprocess`` makes the pass run ``$DISC_TF_PYTHON -m disc_tf
compile-graph`` as a C++-only model server would. The compiled cluster must
give TF's outputs; compilation happens in the child (no compilation counted in
the job); and any failure of the child (no interpreter, a hang past the
timeout, a crash) leaves the job running its original ops with TF's outputs.
"""

from __future__ import annotations

import os
import pathlib
import stat
import subprocess
import sys
import time

import pytest

from tests.integration.test_enable import (
    EXIT_EARLY_SCRIPT,
    TF1_SCRIPT,
    TF2_SCRIPT,
    check_async,
    check_enabled,
    plain_run,
    run_script,
)


def _env(python: str = sys.executable, **extra: str) -> dict[str, str]:
    return {"DISC_TF_COMPILER": "subprocess", "DISC_TF_PYTHON": python, **extra}


def test_sync_tf_function_compiles_in_the_child(tmp_path):
    stats = check_enabled(TF2_SCRIPT, tmp_path, _env())
    assert stats["compilations"] == 0 and stats["cache_hits"] == 0, stats


# Slow suite (as the async case below): the default run keeps the tf.function case and
# the child's failures; test_enable runs a TF1 session and async mode in process.
@pytest.mark.slow
def test_sync_tf1_session_compiles_in_the_child(tmp_path):
    stats = check_enabled(TF1_SCRIPT, tmp_path, _env())
    assert stats["compilations"] == 0, stats


@pytest.mark.slow
@pytest.mark.fallback
def test_async_serves_tf_ops_until_the_child_publishes(tmp_path):
    disc = check_async(tmp_path, _env())
    assert disc["before"]["compilations"] == 0, disc["log"]


@pytest.fixture(scope="module")
def plain() -> dict:
    """TF2_SCRIPT without disc_tf."""
    return plain_run(TF2_SCRIPT)


def _fails_cleanly(tmp_path: pathlib.Path, plain: dict, env: dict[str, str],
                   max_seconds: float) -> str:
    env = dict(env, TF_CPP_MIN_LOG_LEVEL="0")  # the pass's warning must show
    start = time.monotonic()
    disc = run_script(TF2_SCRIPT, tmp_path, enabled=True, extra_env=env)
    assert time.monotonic() - start < max_seconds, disc["log"]
    assert disc["stats"]["clusters"] == 0, disc["log"]
    for got, want in zip(disc["outs"], plain["outs"]):
        assert got.tobytes() == want.tobytes()  # the very same TF ops ran
    return disc["log"]


def test_missing_interpreter_keeps_the_original_ops(tmp_path, plain):
    log = _fails_cleanly(tmp_path, plain, _env(str(tmp_path / "no-such-python")), 120)
    assert "DISC_TF_PYTHON" in log


def test_hanging_compiler_is_killed_at_the_timeout(tmp_path, plain):
    hang = tmp_path / "hang.sh"
    hang.write_text("#!/bin/sh\nsleep 300\n")
    hang.chmod(hang.stat().st_mode | stat.S_IXUSR)
    log = _fails_cleanly(tmp_path, plain, _env(str(hang), DISC_TF_SUBPROCESS_TIMEOUT="3"), 90)
    assert "DISC_TF_SUBPROCESS_TIMEOUT" in log


def test_crashing_compiler_keeps_the_original_ops(tmp_path, plain):
    crash = tmp_path / "crash.sh"
    crash.write_text("#!/bin/sh\necho 'GRAPH /nonexistent/graph.pb'\nkill -SEGV $$\n")
    crash.chmod(crash.stat().st_mode | stat.S_IXUSR)
    log = _fails_cleanly(tmp_path, plain, _env(str(crash)), 120)
    assert "disc_tf graph pass left a graph unchanged" in log


@pytest.mark.fallback
def test_child_cleans_up_when_the_host_exits_first(tmp_path):
    """Async: the host ends while the child compiles; the child must not leak."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    # The first g++ call waits: the host is surely gone when it is done (the calls
    # after it need not wait too).
    slow_cxx = tmp_path / "slow-g++"
    slow_cxx.write_text(f'#!/bin/sh\nmkdir "{tmp_path / "waited"}" 2>/dev/null && sleep 5\n'
                        'exec g++ "$@"\n')
    slow_cxx.chmod(slow_cxx.stat().st_mode | stat.S_IXUSR)
    env = {k: v for k, v in os.environ.items() if k != "DISC_TF_COMPILE_MODE"}
    env.update(_env(), TF_DISC_ENABLE="1", TMPDIR=str(tmp), TF_CPP_MIN_LOG_LEVEL="2",
               DISC_TF_CACHE_DIR=str(tmp_path / "cache"), DISC_TF_CXX=str(slow_cxx))
    script = tmp_path / "early.py"
    script.write_text(EXIT_EARLY_SCRIPT)
    # Output to files: the child shares the host's stderr, and a pipe would
    # make us wait for the child as well.
    log = tmp_path / "host.log"
    with open(log, "w") as out:
        proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                              stdout=out, stderr=subprocess.STDOUT, timeout=300)
    assert proc.returncode == 0, log.read_text()
    assert [p.name for p in tmp.iterdir() if p.name.startswith("disc_tf_graph_")], \
        "the host outlived the compiler: nothing tested"

    def leftovers() -> list[str]:
        # __pycache__: bytecode of TF autograph's generated modules, which TF itself
        # leaves in $TMPDIR where Python writes bytecode; not the compiler's.
        return sorted(p.name for p in tmp.iterdir() if p.name != "__pycache__")

    deadline = time.monotonic() + 180
    while leftovers() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not leftovers(), sorted(p.name for p in tmp.rglob("*"))
