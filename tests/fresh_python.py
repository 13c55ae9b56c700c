"""Fresh Python processes for tests, without paying TensorFlow's import each time.

About 65 tests run a script in a new interpreter (a second process hitting the cache, an
optimized model served elsewhere, one ISA or packing setting per process). Each paid
``import tensorflow``, 3-4 CPU-seconds of the ~4.5 such a child costs: a third of the
default suite's CPU on a 2-core host. Here each test worker starts one *zygote*, an
interpreter that has imported numpy and TensorFlow and nothing else (no TF context, no
disc_tf, one thread), and forks it for each child. The child sets the environment,
working directory, ``sys.argv``, ``sys.path`` and standard streams it was asked for and
runs its script as ``__main__``, as ``python -c`` / ``python script.py`` / ``python -m``
would; its exit status is the script's.

What a forked child shares with the zygote: the modules TensorFlow's import loaded, and
whatever that import read from the environment. So an environment that differs from the
zygote's in a variable an import may read (``TF_*`` but for the C++ log level,
``PYTHON*`` but for ``PYTHONPATH`` and ``PYTHONDONTWRITEBYTECODE``, ``LD_*``,
thread-pool and allocator settings), another interpreter, or
``DISC_TF_TEST_FRESH_PYTHON=exec`` runs a real new interpreter instead. ``TF_DISC_ENABLE``
is one: its ``.pth`` hook acts when the interpreter starts. disc_tf is never imported by
the zygote, so everything disc_tf does at import (the op library, the cache, the
settings it reads) happens in the child, as in production.

Run as a script (``python fresh_python.py``) this file is the zygote: requests come as
JSON lines on stdin, replies go as JSON lines to stdout.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time

#: Variables a module imported by the zygote may read at import: a child whose value
#: differs from the zygote's runs in a real new interpreter.
_IMPORT_TIME_PREFIXES = ("TF_", "PYTHON", "LD_", "OMP_", "OPENBLAS_", "MKL_", "KMP_",
                         "GOTO_", "CUDA_", "XLA_", "MALLOC_", "GLIBC_", "NUMPY_", "NPY_",
                         "LANG", "LC_", "TZ")
#: ... except these: set up by the child itself (below), or TensorFlow's C++ log level
#: (read once, by the zygote's import: a child's setting changes only which lines of
#: TensorFlow's own C++ logging reach its stderr).
_CHILD_SET = ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "TF_CPP_MIN_LOG_LEVEL")


def _needs_exec(env: dict[str, str], zygote_env: dict[str, str]) -> str | None:
    """The variable that makes ``env`` need a real new interpreter, or None."""
    for name in sorted(set(env) | set(zygote_env)):
        if env.get(name) == zygote_env.get(name):
            continue
        if name.startswith(_IMPORT_TIME_PREFIXES) and not name.startswith(_CHILD_SET):
            return name
    return None


# ---------------------------------------------------------------------------------------
# The zygote (this file run as a script).


def _send(message: dict) -> None:
    os.write(1, (json.dumps(message) + "\n").encode())


def _serve() -> dict:
    """Imports TensorFlow, then forks a child per request and reports how each ended.
    Returns only in a child, with its request."""
    import numpy  # noqa: F401  (the point: imported once, before the forks)
    import tensorflow  # noqa: F401

    _send({"ready": os.getpid()})
    children: set[int] = set()
    pending = b""
    while True:
        ready, _, _ = select.select([0], [], [], 0.02 if children else None)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            _send({"pid": pid, "code": os.waitstatus_to_exitcode(status)})
        if not ready:
            continue
        chunk = os.read(0, 1 << 16)
        if not chunk:  # the test worker is gone; children finish on their own
            os._exit(0)
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                return request
            children.add(pid)
            _send({"id": request["id"], "pid": pid})


def _redirect(fd: int, path: str, flags: int) -> None:
    opened = os.open(path, flags, 0o600)
    os.dup2(opened, fd)
    os.close(opened)


def _become(request: dict) -> None:
    """Turns this forked zygote into the interpreter the request describes."""
    env = request["env"]
    base_path = [p for p in sys.path[1:] if p not in _pythonpath(os.environ)]
    os.environ.clear()
    os.environ.update(env)
    os.chdir(request["cwd"])
    _redirect(0, request["stdin"], os.O_RDONLY)
    _redirect(1, request["stdout"], os.O_WRONLY | os.O_TRUNC)
    _redirect(2, request["stderr"], os.O_WRONLY | os.O_TRUNC)
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    tempfile.tempdir = None  # $TMPDIR as the child has it
    import numpy

    numpy.random.seed()  # its own entropy, should the zygote's imports ever draw from it
    args = request["args"]
    if args[0] == "-c":
        first = ""
    elif args[0] == "-m":
        first = os.getcwd()
    else:
        first = os.path.dirname(os.path.abspath(args[0]))
    sys.path[:] = [first, *_pythonpath(env), *base_path]


def _pythonpath(env: dict | os._Environ) -> list[str]:
    return [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]


def _run_main(args: list[str]) -> None:
    """Runs the script as ``python ARGS`` would; its exceptions and exit propagate."""
    import runpy
    import types

    if args[0] == "-c":
        sys.argv = ["-c", *args[2:]]
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        # dont_inherit: not this file's `from __future__ import annotations`
        exec(compile(args[1], "<string>", "exec", dont_inherit=True), main.__dict__)
    elif args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(args)
        if not os.path.exists(args[0]):
            print(f"{sys.executable}: can't open file {os.path.abspath(args[0])!r}: "
                  "[Errno 2] No such file or directory", file=sys.stderr)
            raise SystemExit(2)
        runpy.run_path(args[0], run_name="__main__")


# ---------------------------------------------------------------------------------------
# The client (the test worker).


class _Zygote:
    """One zygote process and the replies read from it so far."""

    def __init__(self) -> None:
        self.env = dict(os.environ)
        self._log = tempfile.TemporaryFile()  # the zygote's own stderr, for its errors
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._log, env=self.env,
            cwd=os.path.dirname(os.path.abspath(__file__)))
        self.gone = False  # its stdout ended: it died
        self._buffer = b""
        self._next_id = 0
        self.exits: dict[int, int] = {}
        self._started: dict[int, int] = {}
        if not self._reply(lambda: self._ready is not None, time.monotonic() + 120):
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"the test zygote did not start: {self.log_tail()}")

    _ready: int | None = None

    def alive(self) -> bool:
        return not self.gone and self.proc.poll() is None

    def log_tail(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-2000:]

    def _reply(self, done, deadline: float | None) -> bool:
        """Reads replies until ``done()`` or the deadline; False on timeout or EOF."""
        while not done():
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.proc.stdout], [], [], wait)
            if not ready:
                return False
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                self.gone = True
                return False
            self._buffer += chunk
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                message = json.loads(line)
                if "ready" in message:
                    self._ready = message["ready"]
                elif "id" in message:
                    self._started[message["id"]] = message["pid"]
                    self.exits.pop(message["pid"], None)  # an unwaited child's, pid reused
                else:
                    self.exits[message["pid"]] = message["code"]
        return True

    def fork(self, request: dict) -> int:
        """Starts a child; returns its pid."""
        self._next_id += 1
        rid = request["id"] = self._next_id
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.gone = True
        if not self._reply(lambda: rid in self._started, time.monotonic() + 60):
            raise RuntimeError(f"the test zygote did not fork: {self.log_tail()}")
        return self._started.pop(rid)

    def wait(self, pid: int, timeout: float | None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        self._reply(lambda: pid in self.exits, deadline)
        return self.exits.pop(pid, None)


_zygote: _Zygote | None = None


def _get_zygote() -> _Zygote:
    global _zygote
    if _zygote is None or not _zygote.alive():
        _zygote = _Zygote()
    return _zygote


class Child:
    """A running child: ``subprocess.Popen``'s ``pid``, ``returncode``, ``wait``,
    ``communicate`` and ``kill``, with its output captured as text."""

    def __init__(self, args: list[str], env: dict[str, str] | None, cwd: str | None,
                 input: str | None) -> None:
        if args[0].startswith("-") and args[0] not in ("-c", "-m"):
            raise ValueError(f"interpreter option {args[0]!r}: only -c, -m or a script")
        self.args = [sys.executable, *args]
        self.returncode: int | None = None
        env = dict(os.environ if env is None else env)
        cwd = os.path.abspath(cwd or os.getcwd())
        self._dir = tempfile.TemporaryDirectory(prefix="disc_tf_child_")
        paths = {k: os.path.join(self._dir.name, k) for k in ("stdin", "stdout", "stderr")}
        with open(paths["stdin"], "w", encoding="utf-8") as f:
            f.write(input or "")
        for k in ("stdout", "stderr"):
            open(paths[k], "wb").close()
        self._paths = paths
        zygote = _get_zygote() if _use_zygote() else None
        if zygote is None or _needs_exec(env, zygote.env) is not None:
            self._zygote = None
            self.forked = False
            with open(paths["stdin"], "rb") as stdin, open(paths["stdout"], "wb") as out, \
                    open(paths["stderr"], "wb") as err:
                self._proc = subprocess.Popen(self.args, env=env, cwd=cwd, stdin=stdin,
                                              stdout=out, stderr=err)
            self.pid = self._proc.pid
        else:
            self._zygote = zygote
            self.forked = True
            self.pid = zygote.fork({"args": list(args), "env": env, "cwd": cwd, **paths})

    def wait(self, timeout: float | None = None) -> int:
        """The exit status (negative: the signal); TimeoutExpired after ``timeout``."""
        if self.returncode is None:
            if self._zygote is None:
                self.returncode = self._proc.wait(timeout)
            else:
                code = self._zygote.wait(self.pid, timeout)
                if code is None and self._zygote.gone:
                    raise RuntimeError(f"the test zygote died while pid {self.pid} ran: "
                                       f"{self._zygote.log_tail()}")
                if code is None:
                    raise subprocess.TimeoutExpired(self.args, timeout)
                self.returncode = code
        return self.returncode

    def kill(self) -> None:
        """SIGKILL, unless it has ended."""
        if self.returncode is None:
            try:
                os.kill(self.pid, 9)
            except ProcessLookupError:
                pass

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Waits for the end (killing the child after ``timeout``); its stdout and stderr."""
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.wait()
            raise
        return self._read("stdout"), self._read("stderr")

    def _read(self, stream: str) -> str:
        with open(self._paths[stream], encoding="utf-8", errors="replace") as f:
            return f.read()


def _use_zygote() -> bool:
    return os.environ.get("DISC_TF_TEST_FRESH_PYTHON", "") != "exec"


def start(args: list[str], *, env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
          input: str | None = None) -> Child:
    """Starts ``python ARGS`` (``-c CODE ...``, ``-m MODULE ...`` or ``SCRIPT ...``)."""
    return Child(list(map(str, args)), env, None if cwd is None else str(cwd), input)


def run(args: list[str], *, env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
        input: str | None = None, timeout: float | None = None) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, *ARGS], capture_output=True, text=True)``, in a
    fresh process forked from the zygote where the environment allows."""
    child = start(args, env=env, cwd=cwd, input=input)
    out, err = child.communicate(timeout)
    return subprocess.CompletedProcess(child.args, child.returncode, out, err)


def stats_of(script: str, drop: tuple[str, ...] = (), **env_vars: str) -> dict:
    """Runs ``python -c SCRIPT`` in the repository root (on its ``PYTHONPATH``), without
    the variables starting with one of ``drop`` and with ``env_vars``; asserts it exits
    0 and returns the JSON of the last line it prints that starts ``STATS ``."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if not (drop and k.startswith(drop))}
    env.update(PYTHONPATH=repo, TF_CPP_MIN_LOG_LEVEL="2", **env_vars)
    proc = run(["-c", script], env=env, timeout=300, cwd=repo)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("STATS ")][-1]
    return json.loads(line[len("STATS "):])


def _exit(code: object) -> None:
    """Ends the child as the interpreter would (non-daemon threads joined, atexit
    handlers, streams flushed, then C's ``exit``: its atexit hooks and static
    destructors), less the teardown of every module TensorFlow loaded (a second of CPU)."""
    import atexit
    import ctypes
    import threading
    import traceback

    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        print(code, file=sys.stderr)
        status = 1
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001  (reported as the interpreter would)
        traceback.print_exc()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    # PyDLL: the call keeps the GIL, so no Python thread runs during C's exit handlers
    # and static destructors (as none does after a real interpreter's finalization).
    ctypes.PyDLL(None).exit(status & 0xFF)


if __name__ == "__main__":
    _request = _serve()
    _become(_request)
    try:
        _run_main(_request["args"])
    except SystemExit as e:
        _exit(e.code)
    except BaseException as e:  # noqa: BLE001  (what an uncaught exception does)
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next  # the zygote's own frames
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        _exit(1)
    _exit(0)
