"""The artifact cache: corrupt entries are rebuilt, LRU eviction keeps it under its cap."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
import stat
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from disc_tf.runtime import cache, compiler
from tests.harness import assert_same


@pytest.fixture()
def cache_root(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("DISC_TF_CACHE_DIR", str(root))
    monkeypatch.delenv("DISC_TF_CACHE_MAX_BYTES", raising=False)
    return root


def _key(i: int) -> str:
    return hashlib.sha256(f"entry {i}".encode()).hexdigest()


def _put(key: str, data: bytes) -> None:
    with cache.key_lock(key):
        cache.store(key, data, {"sha256": hashlib.sha256(data).hexdigest(), "num_kernels": 1})


def _files(root: pathlib.Path, key: str) -> tuple[pathlib.Path, pathlib.Path]:
    return root / key[:2] / f"{key}.so", root / key[:2] / f"{key}.json"


def _corrupt(case: str, so: pathlib.Path, meta: pathlib.Path) -> None:
    data = so.read_bytes()
    info = json.loads(meta.read_text())
    if case == "truncated_so":
        so.write_bytes(data[: len(data) // 2])
    elif case == "empty_so":
        so.write_bytes(b"")
    elif case == "bad_json":
        meta.write_text('{"sha256": "abc", "size"')
    elif case == "json_not_object":
        meta.write_text("[1, 2]")
    elif case == "size_mismatch":
        meta.write_text(json.dumps({**info, "size": info["size"] + 1}))
    elif case == "sha_mismatch":  # same size, one byte flipped
        so.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    elif case == "wrong_recorded_sha":
        meta.write_text(json.dumps({**info, "sha256": "0" * 64}))
    elif case == "json_rewritten_to_match":  # bytes changed, size and sha recorded anew
        data = data[:-1] + bytes([data[-1] ^ 0xFF])
        so.write_bytes(data)
        meta.write_text(json.dumps({**info, "size": len(data),
                                    "sha256": hashlib.sha256(data).hexdigest()}))
    elif case == "no_hmac":
        meta.write_text(json.dumps({k: v for k, v in info.items() if k != "hmac"}))
    else:
        raise AssertionError(case)


CORRUPTIONS = ["truncated_so", "empty_so", "bad_json", "json_not_object", "size_mismatch",
               "sha_mismatch", "wrong_recorded_sha", "json_rewritten_to_match", "no_hmac"]


def test_store_lookup_modes(cache_root: pathlib.Path) -> None:
    key, data = _key(0), b"\x7fELF" + bytes(range(256)) * 4
    _put(key, data)
    with cache.key_lock(key):
        got = cache.lookup(key)
    assert got is not None and got[0] == data
    assert got[1]["size"] == len(data) and got[1]["sha256"] == hashlib.sha256(data).hexdigest()
    so, meta = _files(cache_root, key)
    for d in (cache_root, so.parent):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    for f in (so, meta, so.parent / f"{key}.lock", cache_root / ".lock"):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    assert not [p for p in so.parent.iterdir() if ".tmp" in p.name]


@pytest.mark.parametrize("case", CORRUPTIONS)
def test_corrupt_entry_is_deleted_logged_once_and_rebuilt(
    cache_root: pathlib.Path, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    key, data = _key(1000 + CORRUPTIONS.index(case)), os.urandom(3000)
    _put(key, data)
    so, meta = _files(cache_root, key)
    _corrupt(case, so, meta)
    caplog.set_level(logging.WARNING, logger="disc_tf.runtime")
    with cache.key_lock(key):
        assert cache.lookup(key) is None
        assert not so.exists() and not meta.exists()
        assert cache.lookup(key) is None  # a plain miss now: no second warning
    warnings = [r for r in caplog.records if "corrupt" in r.getMessage()]
    assert len(warnings) == 1, caplog.text
    assert key[:12] in warnings[0].getMessage()
    _put(key, data)  # the rebuild
    with cache.key_lock(key):
        got = cache.lookup(key)
    assert got is not None and got[0] == data


def test_half_written_entry_is_a_miss(cache_root: pathlib.Path) -> None:
    key, data = _key(2), b"abc" * 100
    _put(key, data)
    _files(cache_root, key)[1].unlink()  # the writer died between .so and .json
    with cache.key_lock(key):
        assert cache.lookup(key) is None
    _put(key, data)
    with cache.key_lock(key):
        assert cache.lookup(key) is not None


def test_hit_touches_mtime(cache_root: pathlib.Path) -> None:
    key = _key(3)
    _put(key, b"x" * 100)
    so, meta = _files(cache_root, key)
    old = time.time() - 1000
    for p in (so, meta):
        os.utime(p, (old, old))
    with cache.key_lock(key):
        assert cache.lookup(key) is not None
    assert so.stat().st_mtime > old + 900 and meta.stat().st_mtime > old + 900


def _age(root: pathlib.Path, key: str, seconds_ago: float) -> None:
    t = time.time() - seconds_ago
    for p in _files(root, key):
        os.utime(p, (t, t))


def test_eviction_is_lru_and_keeps_total_under_cap(
    cache_root: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cap = 20_000
    monkeypatch.setenv("DISC_TF_CACHE_MAX_BYTES", str(cap))
    keys = [_key(100 + i) for i in range(30)]
    for i, key in enumerate(keys):
        _put(key, os.urandom(1500))
        _age(cache_root, key, 1000 - i)  # stored in order: keys[0] is the oldest
        assert cache.total_bytes() <= cap
        if i == 5:  # a hit makes keys[0] the most recently used
            with cache.key_lock(keys[0]):
                assert cache.lookup(keys[0]) is not None
    present = {k for k, _, _ in cache.entries()}
    assert keys[-1] in present
    assert keys[0] in present, "a recently hit entry was evicted before older ones"
    assert keys[1] not in present
    # The survivors are the most recently used ones.
    assert present == {keys[0], *keys[len(keys) - len(present) + 1:]}, sorted(present)
    # Nothing but whole entries was removed: every .so still has its .json.
    for k in present:
        so, meta = _files(cache_root, k)
        assert so.exists() and meta.exists()


def test_eviction_never_removes_the_key_just_stored_or_a_locked_entry(
    cache_root: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, busy = _key(200), _key(201)
    _put(old, b"o" * 1000)
    _put(busy, b"b" * 1000)
    _age(cache_root, old, 100)
    _age(cache_root, busy, 200)
    monkeypatch.setenv("DISC_TF_CACHE_MAX_BYTES", "10")
    big = _key(202)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # another thread reading or building `busy`
        with cache.key_lock(busy):
            held.set()
            release.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert held.wait(30)
        _put(big, b"g" * 5000)  # alone above the cap
        present = {k for k, _, _ in cache.entries()}
        assert present == {big, busy}
    finally:
        release.set()
        t.join()
    with cache.key_lock(big):
        assert cache.lookup(big) is not None
    assert cache.evict(keep=big) == [busy]


def test_bad_cap_falls_back_to_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISC_TF_CACHE_MAX_BYTES", "lots")
    assert cache.max_bytes() == 2 << 30
    monkeypatch.delenv("DISC_TF_CACHE_MAX_BYTES")
    assert cache.max_bytes() == 2 << 30
    monkeypatch.setenv("DISC_TF_CACHE_MAX_BYTES", "4096")
    assert cache.max_bytes() == 4096


def test_stale_temp_files_are_removed_on_eviction(cache_root: pathlib.Path) -> None:
    key = _key(300)
    _put(key, b"z" * 10)
    shard = cache_root / key[:2]
    stale, fresh = shard / f"{key}.so.tmpdead", shard / f"{key}.so.tmplive"
    stale.write_bytes(b"partial")
    fresh.write_bytes(b"partial")
    t = time.time() - 2 * cache.STALE_TEMP_SECONDS
    os.utime(stale, (t, t))
    cache.evict()
    assert not stale.exists() and fresh.exists()


def _fn():
    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def f(x):
        return tf.tanh(x * 1.5 + 0.25) * tf.sigmoid(x)

    return f


@pytest.mark.parametrize("case", ["truncated_so", "sha_mismatch", "bad_json",
                                  "json_rewritten_to_match"])
def test_corrupt_cached_cluster_is_rebuilt_end_to_end(cache_root: pathlib.Path, case: str) -> None:
    x = np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32)
    disc_tf.reset_stats()
    first = disc_tf.jit(_fn(), min_cluster_size=1)
    assert len(first.report.compiled) == 1
    assert disc_tf.stats()["compilations"] == 1
    [(k, _, _)] = cache.entries()
    _corrupt(case, *_files(cache_root, k))

    disc_tf.reset_stats()
    second = disc_tf.jit(_fn(), min_cluster_size=1)
    assert second.report.compiled and not second.report.compiled[0].from_cache
    assert disc_tf.stats()["compilations"] == 1 and disc_tf.stats()["cache_hits"] == 0
    assert_same(_fn()(x), second(x), tf.float32)
    with cache.key_lock(k):
        assert cache.lookup(k) is not None  # the rebuilt entry is sound

    disc_tf.reset_stats()
    third = disc_tf.jit(_fn(), min_cluster_size=1)
    assert third.report.compiled[0].from_cache
    assert disc_tf.stats()["compilations"] == 0 and disc_tf.stats()["cache_hits"] == 1
    assert_same(_fn()(x), third(x), tf.float32)
    assert disc_tf.stats()["fallbacks"] == 0


def test_compiler_build_counts_a_hit_after_a_rebuild(cache_root: pathlib.Path) -> None:
    source = ("#include <stdint.h>\n"
              'extern "C" int32_t disc_abi_version(void) { return 4; }\n'
              'extern "C" int32_t disc_num_kernels(void) { return 7; }\n'
              'extern "C" int32_t disc_entry(void*) { return 0; }\n')
    disc_tf.reset_stats()
    a = compiler.build(source, "probe", 0)
    b = compiler.build(source, "probe", 0)
    assert not a.from_cache and b.from_cache and a.data == b.data and a.sha256 == b.sha256
    assert disc_tf.stats()["compilations"] == 1 and disc_tf.stats()["cache_hits"] == 1


def test_stores_under_the_cap_do_not_walk_the_cache(
    cache_root: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store costs O(1): only the first store, one that would pass the cap, or one
    after the estimate has aged scans the cache; an eviction goes down to LOW_WATER."""
    scans = []
    real_evict = cache.evict
    monkeypatch.setattr(cache, "evict", lambda **kw: scans.append(1) or real_evict(**kw))
    cap = 40_000
    monkeypatch.setenv("DISC_TF_CACHE_MAX_BYTES", str(cap))
    for i in range(10):  # about 1.75 kB each: 17.5 kB in all, under the cap
        _put(_key(400 + i), os.urandom(1500))
    assert len(scans) == 1
    for i in range(10, 25):  # passes the cap once: one scan, evicting down to 80%
        _put(_key(400 + i), os.urandom(1500))
    assert len(scans) == 2
    assert cache.total_bytes() <= cap * cache.LOW_WATER + 2 * 1800
    monkeypatch.setattr(cache, "RESCAN_SECONDS", 0.0)  # an aged estimate is checked again
    _put(_key(430), os.urandom(10))
    assert len(scans) == 3


def test_a_store_sees_what_other_processes_stored_once_its_estimate_ages(
    cache_root: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISC_TF_CACHE_MAX_BYTES", "20000")
    _put(_key(500), os.urandom(1000))
    # Another process fills the cache behind this one's estimate.
    for i in range(20):
        key = _key(510 + i)
        data = os.urandom(1500)
        so, meta = _files(cache_root, key)
        so.parent.mkdir(exist_ok=True)
        so.write_bytes(data)
        meta.write_text("{}")
    assert cache.total_bytes() > 20000
    _put(_key(501), os.urandom(10))  # the estimate is fresh: no scan yet
    assert cache.total_bytes() > 20000
    monkeypatch.setattr(cache, "RESCAN_SECONDS", 0.0)
    _put(_key(502), os.urandom(10))
    assert cache.total_bytes() <= 20000 * cache.LOW_WATER
