"""The on-disk artifact cache: content-addressed, atomic, locked, size-capped.

Layout: ``<DISC_TF_CACHE_DIR>/<key[:2]>/<key>.so`` plus ``<key>.json`` (the
artifact's metadata: its size and sha256). Writes go to a temp file and are
renamed into place; a lock file per key makes concurrent processes build a
cluster once. Directories are 0700 and files 0600.

Every lookup verifies the entry (metadata parses, size and sha256 of the bytes
match it); a corrupt entry is logged, deleted and reported as a miss, so the
caller rebuilds it. A hit touches the entry's mtime; after each store the
least recently used entries are evicted, under a cache-wide lock, until the
cache is within ``$DISC_TF_CACHE_MAX_BYTES`` (default 2 GiB).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import pathlib
import re
import tempfile
import threading
import time
from collections.abc import Iterator

log = logging.getLogger("disc_tf.runtime")

DEFAULT_MAX_BYTES = 2 << 30
#: A temp file older than this is left over by a dead writer and removed on eviction.
STALE_TEMP_SECONDS = 3600.0

_KEY_RE = re.compile(r"^[0-9a-f]{64}$")
_SHARD_RE = re.compile(r"^[0-9a-f]{2}$")

_reported_lock = threading.Lock()
_reported: set[tuple[str, str]] = set()


def cache_dir() -> pathlib.Path:
    """``$DISC_TF_CACHE_DIR``, else ``~/.cache/disc_tf`` (created 0700)."""
    root = os.environ.get("DISC_TF_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "disc_tf"
    )
    path = pathlib.Path(root)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def max_bytes() -> int:
    """The size cap: ``$DISC_TF_CACHE_MAX_BYTES`` (bytes), else 2 GiB."""
    raw = os.environ.get("DISC_TF_CACHE_MAX_BYTES", "").strip()
    if not raw:
        return DEFAULT_MAX_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        _report_once("max_bytes", raw, "DISC_TF_CACHE_MAX_BYTES=%r is not a byte count; using %d",
                     raw, DEFAULT_MAX_BYTES)
        return DEFAULT_MAX_BYTES
    return value


def _report_once(kind: str, what: str, msg: str, *args) -> None:
    with _reported_lock:
        if (kind, what) in _reported:
            return
        _reported.add((kind, what))
    log.warning(msg, *args)


def _shard(key: str) -> pathlib.Path:
    d = cache_dir() / key[:2]
    d.mkdir(mode=0o700, exist_ok=True)
    return d


def _paths(key: str) -> tuple[pathlib.Path, pathlib.Path]:
    d = _shard(key)
    return d / f"{key}.so", d / f"{key}.json"


def _remove(*paths: pathlib.Path) -> None:
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


def _check(data: bytes, raw_meta: str) -> tuple[dict | None, str | None]:
    """(metadata, None) for a sound entry, else (None, what is wrong)."""
    try:
        info = json.loads(raw_meta)
    except ValueError as e:
        return None, f"metadata is not JSON ({e})"
    if not isinstance(info, dict):
        return None, "metadata is not a JSON object"
    if info.get("size") != len(data):
        return None, f"size {len(data)} != recorded {info.get('size')!r}"
    sha = info.get("sha256")
    if not isinstance(sha, str) or hashlib.sha256(data).hexdigest() != sha.lower():
        return None, f"sha256 of the bytes != recorded {sha!r}"
    if not isinstance(info.get("num_kernels"), int):
        return None, "metadata lacks num_kernels"
    return info, None


def lookup(key: str) -> tuple[bytes, dict] | None:
    """The cached (artifact bytes, metadata) of ``key``, or None.

    A corrupt entry is logged (once per process), deleted and reported
    as a miss. Call under ``key_lock(key)``.
    """
    so, meta = _paths(key)
    try:
        data = so.read_bytes()
        raw_meta = meta.read_text(errors="replace")
    except FileNotFoundError:
        return None  # absent, or half of an entry whose writer died: rebuilt
    except OSError as e:
        _report_once("unreadable", key, "artifact cache entry %s is unreadable (%s); rebuilding",
                     so, e)
        _remove(so, meta)
        return None
    info, problem = _check(data, raw_meta)
    if info is None:
        # Logged once per entry and problem, even if the entry cannot be deleted.
        _report_once("corrupt", f"{key}: {problem}",
                     "artifact cache entry %s is corrupt: %s; deleted, rebuilding", so, problem)
        _remove(so, meta)
        return None
    now = time.time()
    for p in (so, meta):  # least recently used entries are evicted first
        with contextlib.suppress(OSError):
            os.utime(p, (now, now))
    return data, info


def _atomic_write(path: pathlib.Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def store(key: str, data: bytes, info: dict) -> None:
    """Stores an artifact and its metadata under ``key``, then evicts down to the cap.

    Call under ``key_lock(key)``.
    """
    so, meta = _paths(key)
    _atomic_write(so, data)
    _atomic_write(meta, json.dumps({**info, "size": len(data)}, indent=1).encode())
    try:
        evict(keep=key)
    except OSError as e:  # a full or read-only cache must not fail a build
        log.warning("artifact cache eviction failed: %s", e)


def entries() -> list[tuple[str, int, float]]:
    """(key, bytes of .so + .json, mtime of the .so) of every complete entry."""
    out = []
    root = cache_dir()
    for shard in root.iterdir():
        if not _SHARD_RE.match(shard.name) or not shard.is_dir():
            continue
        for so in shard.glob("*.so"):
            key = so.stem
            if not _KEY_RE.match(key):
                continue
            try:
                st = so.stat()
                size = st.st_size + (shard / f"{key}.json").stat().st_size
            except FileNotFoundError:
                continue
            out.append((key, size, st.st_mtime))
    return out


def total_bytes() -> int:
    """Bytes held by complete cache entries."""
    return sum(size for _, size, _ in entries())


@contextlib.contextmanager
def _try_key_lock(key: str) -> Iterator[bool]:
    """Takes ``key``'s lock if no one holds it; yields whether it did."""
    path = cache_dir() / key[:2] / f"{key}.lock"
    try:
        f = open(path, "a")
    except OSError:
        yield False
        return
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _remove_stale_temps(root: pathlib.Path) -> None:
    cutoff = time.time() - STALE_TEMP_SECONDS
    for shard in root.iterdir():
        if not _SHARD_RE.match(shard.name) or not shard.is_dir():
            continue
        for tmp in shard.glob("*.tmp*"):
            with contextlib.suppress(OSError):
                if tmp.stat().st_mtime < cutoff:
                    tmp.unlink()


def evict(keep: str | None = None, limit: int | None = None) -> list[str]:
    """Removes least recently used entries until the cache fits ``limit``.

    ``limit`` defaults to ``max_bytes()``. ``keep`` is never removed, nor is an
    entry whose key lock another thread or process holds (it is being read or
    built). Runs under the cache-wide lock; returns the evicted keys.
    """
    limit = max_bytes() if limit is None else limit
    root = cache_dir()
    evicted: list[str] = []
    with _cache_lock(root):
        _remove_stale_temps(root)
        found = entries()
        total = sum(size for _, size, _ in found)
        for key, size, _ in sorted(found, key=lambda e: e[2]):
            if total <= limit:
                break
            if key == keep:
                continue
            with _try_key_lock(key) as locked:
                if not locked:
                    continue
                _remove(*_paths(key))
            total -= size
            evicted.append(key)
    if evicted:
        log.info("artifact cache: evicted %d entries to stay under %d bytes", len(evicted), limit)
    return evicted


@contextlib.contextmanager
def _exclusive(lock_file: pathlib.Path) -> Iterator[None]:
    """Holds an exclusive ``flock`` on ``lock_file`` (created 0600)."""
    with open(lock_file, "a") as f:
        os.fchmod(f.fileno(), 0o600)
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _cache_lock(root: pathlib.Path):
    """The cache-wide lock (eviction)."""
    return _exclusive(root / ".lock")


def key_lock(key: str):
    """Holds an exclusive inter-process lock for ``key``."""
    return _exclusive(_shard(key) / f"{key}.lock")
