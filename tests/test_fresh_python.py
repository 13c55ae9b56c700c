"""The test children forked from a TensorFlow-importing zygote behave as ``python ...``
would: arguments, paths, environment, streams, exit status, exit hooks, timeouts, and a
real interpreter where the environment needs one."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from tests import fresh_python

REPO = pathlib.Path(__file__).resolve().parents[1]


def _both(args: list[str], **kw) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """The same command forked and in a real interpreter."""
    child = fresh_python.start(args, **kw)
    out, err = child.communicate(60)
    assert child.forked
    forked = subprocess.CompletedProcess(child.args, child.returncode, out, err)
    real = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=60,
                          env=kw.get("env"), cwd=kw.get("cwd"), input=kw.get("input"))
    return forked, real


SHOW = textwrap.dedent("""
    import json, os, sys
    print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(),
                      "marker": os.environ.get("FRESH_MARKER"), "name": __name__,
                      "stdin": sys.stdin.read(), "pp": sys.path[1] if len(sys.path) > 1 else "",
                      "disc_tf": "disc_tf" in sys.modules}))
    print("to stderr", file=sys.stderr)
    sys.exit(int(os.environ.get("FRESH_CODE", "0")))
""")


def test_c_arguments_environment_streams_and_status_match_a_real_interpreter(tmp_path):
    env = dict(os.environ, FRESH_MARKER="m1", FRESH_CODE="7", PYTHONPATH=str(tmp_path))
    forked, real = _both(["-c", SHOW, "a", "b"], env=env, cwd=tmp_path, input="piped")
    assert forked.returncode == real.returncode == 7
    assert forked.stdout == real.stdout, (forked.stdout, real.stdout)
    assert '"disc_tf": false' in forked.stdout and '"stdin": "piped"' in forked.stdout
    assert forked.stderr.endswith("to stderr\n")


def test_script_and_module_runs_match_a_real_interpreter(tmp_path):
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    forked, real = _both([str(script), "x"], cwd=REPO)
    assert forked.returncode == real.returncode == 0
    assert forked.stdout == real.stdout
    pkg = tmp_path / "freshmod"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(SHOW)
    forked, real = _both(["-m", "freshmod", "y"], cwd=tmp_path)
    assert forked.returncode == real.returncode == 0
    assert forked.stdout == real.stdout


def test_code_compiles_as_the_interpreter_compiles_it():
    """No ``from __future__`` of the zygote's own module leaks into ``-c`` code."""
    forked, real = _both(["-c", "def f(x: int): pass\nprint(f.__annotations__)"])
    assert forked.stdout == real.stdout == "{'x': <class 'int'>}\n"


def test_an_uncaught_exception_exits_1_with_its_traceback_only():
    forked, real = _both(["-c", "def f():\n    raise ValueError('boom')\nf()"])
    assert forked.returncode == real.returncode == 1
    assert forked.stderr == real.stderr, (forked.stderr, real.stderr)


def test_exit_hooks_and_threads_run_as_at_a_normal_exit(tmp_path):
    code = textwrap.dedent("""
        import atexit, ctypes, sys, threading, time
        atexit.register(lambda: print("python atexit", flush=True))
        def late():
            time.sleep(0.3)
            print("thread done", flush=True)
        threading.Thread(target=late).start()
        sys.stdout.write("unflushed ")
        sys.exit("a message")
    """)
    forked, real = _both(["-c", code])
    assert forked.returncode == real.returncode == 1
    assert forked.stdout == real.stdout == "unflushed thread done\npython atexit\n"
    assert forked.stderr == real.stderr == "a message\n"


def test_a_signal_and_a_timeout():
    killed = fresh_python.run(["-c", "import os; os.kill(os.getpid(), 9)"], timeout=60)
    assert killed.returncode == -9
    with pytest.raises(subprocess.TimeoutExpired):
        fresh_python.run(["-c", "import time; time.sleep(60)"], timeout=1)


def test_children_run_at_once():
    children = [fresh_python.start(["-c", f"import time; time.sleep(1); print({i})"])
                for i in range(3)]
    assert [c.communicate(60) for c in children] == [(f"{i}\n", "") for i in range(3)]


def test_an_import_time_setting_gets_a_real_interpreter():
    for name in ("TF_DISC_ENABLE", "TF_ENABLE_ONEDNN_OPTS", "OMP_NUM_THREADS", "PYTHONHASHSEED"):
        child = fresh_python.start(["-c", "import os; print(os.getppid())"],
                                   env=dict(os.environ, **{name: "1"}))
        out, _ = child.communicate(60)
        assert not child.forked, name
        assert int(out) == os.getpid()
    same = fresh_python.start(["-c", "print(1)"], env=dict(os.environ, DISC_TF_STRICT="0"))
    same.communicate(60)
    assert same.forked
