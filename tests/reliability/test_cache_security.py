"""A cache no one else can write, and faults that must not lose work or hide it.

* a cache root others could write (or someone else owns) is refused for a private
  directory; entries are authenticated with a per-user key, so a planted
  ``.so`` + ``.json`` pair is never loaded; lock waits are bounded;
* a read-only cache with valid entries serves them; a full disk keeps the artifact
  in memory and in the model; a compiler that exits 0 with a truncated or
  symbol-less library fails the cluster at ``optimize`` with a message.
"""

from __future__ import annotations

import builtins
import errno
import hashlib
import io
import json
import logging
import os
import pathlib
import shutil
import stat
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from disc_tf.runtime import cache, compiler, elf_check
from tests.harness import assert_same
from tests.reliability import models
from tests.reliability.test_compiler_faults import SOURCE, _script

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


@pytest.fixture()
def root(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    path = tmp_path / "cache"
    monkeypatch.setenv("DISC_TF_CACHE_DIR", str(path))
    monkeypatch.setenv("DISC_TF_CACHE_KEY_FILE", str(tmp_path / "config" / "cache.key"))
    monkeypatch.delenv("DISC_TF_CXX", raising=False)
    monkeypatch.delenv("DISC_TF_COMPILE_TIMEOUT", raising=False)
    return path


def _fn():
    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def f(x):
        return tf.tanh(x * 0.75 + 0.5) * tf.sigmoid(x)

    return f


# ---- who may write the cache


def test_a_cache_others_can_write_is_refused_for_a_private_one(root, caplog):
    root.mkdir(mode=0o700)
    os.chmod(root, 0o777)
    caplog.set_level(logging.WARNING, logger="disc_tf.runtime")
    used = cache.cache_dir()
    assert used != root and stat.S_IMODE(used.stat().st_mode) == 0o700
    assert "writable by group or others" in caplog.text
    disc_tf.reset_stats()
    compiler.build(SOURCE, "probe", 0)
    assert not any(root.iterdir()), "an artifact was stored in the unsafe directory"
    assert any(used.glob("*/*.so"))


def test_the_private_cache_is_removed_when_the_process_exits(root, monkeypatch):
    """No other process can use it, so it does not outlive this one in the temp dir."""
    root.mkdir(mode=0o700)
    os.chmod(root, 0o777)
    monkeypatch.setattr(cache, "_private", {})
    at_exit = []
    monkeypatch.setattr(cache.atexit, "register", lambda *a: at_exit.append(a))
    used = cache.cache_dir()
    assert used != root and at_exit == [(shutil.rmtree, used, True)]
    shutil.rmtree(used)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory away needs root")
def test_a_cache_owned_by_someone_else_is_refused(root, caplog):
    root.mkdir(mode=0o700)
    os.chown(root, 65534, 65534)
    caplog.set_level(logging.WARNING, logger="disc_tf.runtime")
    assert cache.cache_dir() != root
    assert "is owned by uid 65534" in caplog.text


def test_a_planted_entry_is_never_loaded(root):
    """An attacker who can write a matching .so + .json (but not read this user's
    key) plants an entry under the very key disc_tf would look up."""
    key = compiler.cache_key(SOURCE)
    planted = compiler._run_compiler(SOURCE.replace("return 42", "return 666"), "planted")
    shard = root / key[:2]
    shard.mkdir(parents=True, mode=0o700)
    (shard / f"{key}.so").write_bytes(planted)
    sha = hashlib.sha256(planted).hexdigest()
    for mac in (None, "0" * 64, hashlib.sha256(planted).hexdigest()):
        info = {"sha256": sha, "size": len(planted), "num_kernels": 0}
        if mac is not None:
            info["hmac"] = mac
        (shard / f"{key}.json").write_text(json.dumps(info))
        (shard / f"{key}.so").write_bytes(planted)
        assert cache.lookup(key, repair=False) is None
    disc_tf.reset_stats()
    art = compiler.build(SOURCE, "probe", 0)
    assert not art.from_cache and art.data != planted
    assert disc_tf.stats()["compilations"] == 1 and disc_tf.stats()["cache_hits"] == 0
    assert compiler.build(SOURCE, "probe", 0).from_cache  # its own entry is used


def test_entries_of_another_key_do_not_authenticate(root, tmp_path, monkeypatch):
    compiler.build(SOURCE, "probe", 0)
    assert compiler.build(SOURCE, "probe", 0).from_cache
    monkeypatch.setenv("DISC_TF_CACHE_KEY_FILE", str(tmp_path / "other" / "cache.key"))
    assert not compiler.build(SOURCE, "probe", 0).from_cache


def test_a_key_file_others_can_read_is_not_trusted(root, tmp_path, monkeypatch, caplog):
    key_file = tmp_path / "loose" / "cache.key"
    key_file.parent.mkdir()
    key_file.write_bytes(os.urandom(32))
    os.chmod(key_file, 0o644)
    monkeypatch.setenv("DISC_TF_CACHE_KEY_FILE", str(key_file))
    caplog.set_level(logging.WARNING, logger="disc_tf.runtime")
    compiler.build(SOURCE, "probe", 0)
    assert "not owned by this user with mode 0600" in caplog.text
    assert compiler.build(SOURCE, "probe", 0).from_cache  # this process's own key still works
    created = tmp_path / "fresh" / "cache.key"
    monkeypatch.setenv("DISC_TF_CACHE_KEY_FILE", str(created))
    compiler.build(SOURCE, "probe", 0)
    assert stat.S_IMODE(created.stat().st_mode) == 0o600 and len(created.read_bytes()) == 32


def test_processes_creating_the_key_together_get_the_same_key(tmp_path, monkeypatch):
    """The first writer of the key file is stopped between creating and filling it
    while a second process reads it: the second must not see a half-written key (it
    then fell back to a secret of its own, and the artifacts it signed did not load)."""
    path = tmp_path / "config" / "cache.key"
    inside, release = threading.Event(), threading.Event()
    real_urandom = os.urandom
    got: dict[str, object] = {}

    def stalled_urandom(n: int) -> bytes:
        if threading.current_thread().name == "first":
            inside.set()
            release.wait(30)
        return real_urandom(n)

    def read(name: str) -> None:
        try:
            got[name] = cache._read_secret(path)
        except (OSError, ValueError) as e:
            got[name] = e

    monkeypatch.setattr(os, "urandom", stalled_urandom)
    first = threading.Thread(target=read, args=("first",), name="first")
    first.start()
    assert inside.wait(30)
    read("second")  # while the first writer is stalled
    release.set()
    first.join(30)
    assert isinstance(got["first"], bytes) and len(got["first"]) == 32, got
    assert got["second"] == got["first"] == path.read_bytes()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["cache.key"]  # no temp file left


def test_a_held_lock_cannot_hang_a_build_past_its_timeout(root, monkeypatch):
    key = compiler.cache_key(SOURCE)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # a stuck process holding the key's lock
        with cache.key_lock(key) as locked:
            assert locked
            held.set()
            release.wait(60)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert held.wait(30)
        monkeypatch.setenv("DISC_TF_COMPILE_TIMEOUT", "1")
        start = time.monotonic()
        art = compiler.build(SOURCE, "probe", 0)
        assert time.monotonic() - start < 30
        assert not art.from_cache and elf_check.artifact_problem(art.data, "cpu") is None
    finally:
        release.set()
        t.join()


# ---- faults that must not lose work or hide it


class _ReadOnly:
    """Every write under ``root`` fails with EROFS, as on a read-only mount."""

    def __init__(self, root: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = str(root.resolve())
        real_open, real_io_open, real_os_open = builtins.open, io.open, os.open

        def inside(path) -> bool:
            return isinstance(path, (str, os.PathLike)) and os.path.abspath(
                os.fspath(path)).startswith(self.root)

        def refuse(path):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))

        def guarded_open(file, mode="r", *args, **kwargs):
            if inside(file) and any(c in mode for c in "wax+"):
                refuse(file)
            return real_open(file, mode, *args, **kwargs)

        def guarded_io_open(file, mode="r", *args, **kwargs):
            if inside(file) and any(c in mode for c in "wax+"):
                refuse(file)
            return real_io_open(file, mode, *args, **kwargs)

        def guarded_os_open(path, flags, *args, **kwargs):
            if inside(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
                refuse(path)
            return real_os_open(path, flags, *args, **kwargs)

        def guard(real):
            def guarded(path, *args, **kwargs):
                if inside(path):
                    refuse(path)
                return real(path, *args, **kwargs)
            return guarded

        monkeypatch.setattr(builtins, "open", guarded_open)
        monkeypatch.setattr(io, "open", guarded_io_open)
        monkeypatch.setattr(os, "open", guarded_os_open)
        for name in ("utime", "unlink", "replace", "rename", "chmod"):
            monkeypatch.setattr(os, name, guard(getattr(os, name)))
        real_mkdir = os.mkdir

        def guarded_mkdir(path, *args, **kwargs):
            if inside(path) and not os.path.isdir(path):
                refuse(path)
            return real_mkdir(path, *args, **kwargs)

        monkeypatch.setattr(os, "mkdir", guarded_mkdir)


def test_a_read_only_cache_with_valid_entries_serves_them(root, monkeypatch):
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    disc_tf.reset_stats()
    assert disc_tf.jit(_fn(), min_cluster_size=1).report.compiled
    assert disc_tf.stats()["compilations"] == 1
    with monkeypatch.context() as m:
        _ReadOnly(root, m)
        with pytest.raises(OSError, match="Read-only"):
            (root / "probe").write_text("x")
        with pytest.raises(OSError, match="Read-only"):
            open(next(root.glob("*/*.lock")), "a")
        disc_tf.reset_stats()
        jitted = disc_tf.jit(_fn(), min_cluster_size=1)
        assert jitted.report.compiled and jitted.report.compiled[0].from_cache
        assert disc_tf.stats()["cache_hits"] == 1 and disc_tf.stats()["compilations"] == 0
        assert_same(_fn()(x), jitted(x), tf.float32)
        # A cluster not in the cache compiles, and is kept although it cannot be stored.
        other = disc_tf.jit(tf.function(lambda x: tf.exp(x) * 3.0 - x,
                                        input_signature=[tf.TensorSpec([None], tf.float32)]),
                            min_cluster_size=1)
        assert other.report.compiled and disc_tf.stats()["compilations"] == 1
        np.testing.assert_allclose(other(x[0]), np.exp(x[0]) * 3.0 - x[0], rtol=1e-5)
    assert disc_tf.stats()["fallbacks"] == 0


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    return models.save_original(tmp_path_factory.mktemp("cache_faults"))


def test_a_full_disk_keeps_the_artifact_in_memory_and_in_the_model(
        original, root, monkeypatch, tmp_path, caplog):
    model, orig = original

    def full(path, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(cache, "_atomic_write", full)
    caplog.set_level(logging.WARNING, logger="disc_tf")
    report, built = models.optimize(orig, tmp_path / "opt")
    assert report.compiled and built["compilations"] == len(report.compiled)
    assert "kept in memory and in the model" in caplog.text
    assert not list(root.glob("*/*.so"))
    assert models.count_disc_nodes(tmp_path / "opt") == len(report.compiled)
    disc_tf.reset_stats()
    loaded = tf.saved_model.load(str(tmp_path / "opt"))
    x, y = models.inputs(np.random.default_rng(3), 7)
    assert_same(model(x, y), loaded(x, y), tf.float32)
    assert disc_tf.stats()["fallbacks"] == 0 and disc_tf.stats()["clusters"] >= 1


_OUTPUT = 'out=""; prev=""\nfor a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done\n'


@pytest.mark.fallback
@pytest.mark.parametrize("fault", ["truncated", "no_entry_points"])
def test_a_compiler_exiting_0_with_an_unloadable_library_fails_the_cluster(
        original, fault, root, monkeypatch, tmp_path, caplog):
    model, orig = original
    real = shutil.which("g++")
    if fault == "truncated":
        body = f'{real} "$@" || exit $?\n{_OUTPUT}head -c 3000 "$out" > "$out.cut"\n' \
               'mv "$out.cut" "$out"\n'
    else:  # the link writes a library without the entry points
        body = (f'case "$*" in *-shared*) ;; *) exec {real} "$@";; esac\n{_OUTPUT}'
                f'echo "int unrelated;" | {real} -shared -fPIC -x c++ - -o "$out"\n')
    monkeypatch.setenv("DISC_TF_CXX", str(_script(tmp_path / "cxx", body)))
    caplog.set_level(logging.WARNING, logger="disc_tf")
    report, built = models.optimize(orig, tmp_path / "opt")
    assert report.clusters and not report.compiled
    # a truncated object file is refused before the link; a linked library, after it
    what, why = (("not a loadable object file", "outside the file") if fault == "truncated"
                 else ("not a loadable cpu artifact", "does not export disc_abi_version"))
    for c in report.clusters:
        assert what in c.error and why in c.error, c.error
    assert what in caplog.text
    assert built["compilations"] == 0 and not list(root.glob("*/*.so"))
    assert models.count_disc_nodes(tmp_path / "opt") == 0
    loaded = tf.saved_model.load(str(tmp_path / "opt"))
    x, y = models.inputs(np.random.default_rng(4), 5)
    assert_same(model(x, y), loaded(x, y), tf.float32)
