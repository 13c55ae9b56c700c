"""The on-disk artifact cache: content-addressed, authenticated, atomic, locked,
size-capped.

Layout: ``<DISC_TF_CACHE_DIR>/<key[:2]>/<key>.so`` plus ``<key>.json`` (the
artifact's metadata: its size, sha256 and an HMAC); kernel objects, which
artifacts are linked from (``cpu_build.py``), are ``<key>.o`` plus ``<key>.json``
under the same rules. Writes go to a temp file and
are renamed into place; a lock file per key makes concurrent processes build a
cluster once. Directories are 0700 and files 0600.

No one else may write the cache: a root that is not a directory owned by this
user, or that group or others may write, is refused (one warning) for a private
directory of this process. Every entry carries an HMAC-SHA256 of its key, bytes
and kernel count under a per-user secret (``~/.config/disc_tf/cache.key``, or
``$DISC_TF_CACHE_KEY_FILE``; 32 random bytes, 0600, owned by the user), so a
``.so`` + ``.json`` pair planted by anyone without that secret is never used.

Every lookup verifies the entry (metadata parses; size, sha256 and HMAC match
the bytes); a corrupt entry is logged, deleted and reported as a miss, so the
caller rebuilds it. A lookup takes no lock and writes nothing when asked not to
(``repair=False``), so a read-only cache with valid entries serves them. Lock
waits are bounded (``key_lock(key, timeout)`` yields whether it got the lock).
A hit touches the entry's mtime. Each process keeps a running estimate of the
cache's bytes (a scan, plus what it stored since); when a store takes it over
``$DISC_TF_CACHE_MAX_BYTES`` (default 2 GiB), or the estimate is a minute old,
the store scans the cache and, if it is over the cap, evicts the least recently
used entries, under a cache-wide lock, down to 80% of the cap. The cap thus holds
to within what other processes stored in that minute.

This directory is the front of a shared remote tier where one is configured
(``$DISC_TF_REMOTE_CACHE``, ``remote_cache.py``): ``compiler.cached_build`` looks
a cluster up here, then there (a remote hit is stored here), and stores what it
compiles in both. Remote entries are authenticated with a fleet secret instead.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import hashlib
import hmac
import json
import logging
import os
import pathlib
import re
import shutil
import stat
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

#: Seconds a lock wait may take by default (``key_lock``'s callers pass their own).
DEFAULT_LOCK_TIMEOUT = 300.0
_HMAC_KEY_BYTES = 32

#: An eviction removes entries down to this fraction of the cap (as ccache does).
LOW_WATER = 0.8
#: Seconds a process trusts its running estimate of the cache's size before it
#: scans the cache again on its next store.
RESCAN_SECONDS = 60.0

#: Cache root -> (bytes it held at this process's last scan plus what this process
#: stored since, time.monotonic() of that scan).
_usage_lock = threading.Lock()
_usage: dict[str, tuple[int, float]] = {}
_reported_lock = threading.Lock()
_reported: set[tuple[str, str]] = set()
_private: dict[str, pathlib.Path] = {}
_secret: dict[str, bytes] = {}


def _unsafe(path: pathlib.Path) -> str | None:
    """Why another user could write ``path`` (None if only this user can)."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory (or is a symbolic link)"
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not this user ({os.geteuid()})"
    if st.st_mode & 0o022:
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def cache_dir() -> pathlib.Path:
    """``$DISC_TF_CACHE_DIR``, else ``~/.cache/disc_tf`` (created 0700), if only this
    user can write it; else (one warning) a private directory of this process."""
    root = os.environ.get("DISC_TF_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "disc_tf"
    )
    path = pathlib.Path(root)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        problem = _unsafe(path)
    except OSError as e:
        problem = f"cannot be created or read ({e})"
    if problem is None:
        return path
    with _reported_lock:
        private = _private.get(root)
        if private is None:
            private = _private[root] = pathlib.Path(tempfile.mkdtemp(prefix="disc_tf_cache_"))
            atexit.register(shutil.rmtree, private, True)  # no other process can use it
            log.warning("artifact cache %s %s; using the private directory %s instead",
                        root, problem, private)
    return private


def _key_file() -> pathlib.Path:
    return pathlib.Path(os.environ.get("DISC_TF_CACHE_KEY_FILE") or os.path.join(
        os.path.expanduser("~"), ".config", "disc_tf", "cache.key"))


def _read_secret(path: pathlib.Path) -> bytes:
    """The secret in ``path``, created (0600) if absent; ValueError if anyone else
    could have written or read it."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        _create_secret(path)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise ValueError(f"is not owned by this user with mode 0600 "
                             f"(uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})")
        secret = f.read(_HMAC_KEY_BYTES + 1)
    if len(secret) != _HMAC_KEY_BYTES:
        raise ValueError(f"does not hold {_HMAC_KEY_BYTES} bytes")
    return secret


def _create_secret(path: pathlib.Path) -> None:
    """Puts a new random secret at ``path`` unless another process got there first.
    The secret is written whole to a temp file and hard-linked into place (which
    fails if ``path`` exists), so no process ever reads a half-written key: with
    a create-then-write, a second process starting at the same moment read an empty
    file and fell back to a secret of its own."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp")  # 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(_HMAC_KEY_BYTES))
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _hmac_secret() -> bytes:
    """This user's cache secret; a random one of this process (one warning) if it
    cannot be kept safely, so that entries then only serve this process."""
    path = _key_file()
    with _reported_lock:
        secret = _secret.get(str(path))
        if secret is None:
            try:
                secret = _read_secret(path)
            except (OSError, ValueError) as e:
                secret = os.urandom(_HMAC_KEY_BYTES)
                log.warning("artifact cache key file %s: %s; cached artifacts of other "
                            "processes will not be used", path, e)
            _secret[str(path)] = secret
    return secret


def entry_mac(key: str, sha256: str, num_kernels: int) -> str:
    """The HMAC authenticating an entry: its key, bytes (by sha256) and kernel count."""
    message = f"disc_tf cache entry 1\0{key}\0{sha256.lower()}\0{num_kernels}".encode()
    return hmac.new(_hmac_secret(), message, hashlib.sha256).hexdigest()


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


def _shard(key: str, create: bool = True) -> pathlib.Path:
    d = cache_dir() / key[:2]
    if create:
        d.mkdir(mode=0o700, exist_ok=True)
    return d


#: File suffixes of the two kinds of entries: artifacts and kernel objects.
ARTIFACT, OBJECT = ".so", ".o"


def _paths(key: str, create: bool = True,
           suffix: str = ARTIFACT) -> tuple[pathlib.Path, pathlib.Path]:
    d = _shard(key, create)
    return d / f"{key}{suffix}", d / f"{key}.json"


def _remove(*paths: pathlib.Path) -> None:
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


def _check(key: str, data: bytes, raw_meta: str) -> tuple[dict | None, str | None]:
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
    mac = info.get("hmac")
    if not isinstance(mac, str) or not hmac.compare_digest(
            mac, entry_mac(key, sha, info["num_kernels"])):
        return None, "not authenticated by this user's cache key (HMAC mismatch)"
    return info, None


def lookup(key: str, repair: bool = True, suffix: str = ARTIFACT) -> tuple[bytes, dict] | None:
    """The cached (artifact bytes, metadata) of ``key``, or None; ``suffix=OBJECT``
    looks up a kernel object.

    With ``repair`` (call under ``key_lock(key)``), a corrupt entry is logged
    (once per process), deleted and reported as a miss. Without it, nothing is
    written or deleted (no lock needed; a read-only cache is read this way): a
    corrupt entry, or one being replaced while read, is just a miss.
    """
    so, meta = _paths(key, create=False, suffix=suffix)
    try:
        data = so.read_bytes()
        raw_meta = meta.read_text(errors="replace")
    except FileNotFoundError:
        return None  # absent, or half of an entry whose writer died: rebuilt
    except OSError as e:
        if repair:
            _report_once("unreadable", key, "artifact cache entry %s is unreadable (%s); "
                         "rebuilding", so, e)
            _remove(so, meta)
        return None
    info, problem = _check(key, data, raw_meta)
    if info is None:
        if repair:  # logged once per entry and problem, even if it cannot be deleted
            _report_once("corrupt", f"{key}: {problem}",
                         "artifact cache entry %s is corrupt: %s; deleted, rebuilding", so,
                         problem)
            with contextlib.suppress(OSError):
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


def store(key: str, data: bytes, info: dict, suffix: str = ARTIFACT) -> None:
    """Stores an artifact (or with ``suffix=OBJECT`` a kernel object) and its
    metadata (with the entry's HMAC) under ``key``, then evicts down to the cap.
    ``info`` holds ``sha256`` and ``num_kernels``.

    Call under ``key_lock(key)``. Raises OSError (e.g. ENOSPC) if it cannot store.
    """
    so, meta = _paths(key, suffix=suffix)
    mac = entry_mac(key, info["sha256"], info["num_kernels"])
    raw_meta = json.dumps({**info, "size": len(data), "hmac": mac}, indent=1).encode()
    _atomic_write(so, data)
    _atomic_write(meta, raw_meta)
    try:
        _evict_if_over(keep=key, added=len(data) + len(raw_meta))
    except OSError as e:  # a full or read-only cache must not fail a build
        log.warning("artifact cache eviction failed: %s", e)


def _evict_if_over(keep: str, added: int) -> None:
    """Evicts (a full scan of the cache) when this process's running estimate of the
    cache's bytes, plus the ``added`` bytes just stored, exceeds the cap, or when the
    estimate is older than ``RESCAN_SECONDS`` (other processes store too); otherwise
    only adds ``added`` to the estimate. A store thus costs O(1), not a walk of
    every entry."""
    limit = max_bytes()
    root = str(cache_dir())
    with _usage_lock:
        known = _usage.get(root)
        if (known is not None and time.monotonic() - known[1] < RESCAN_SECONDS
                and known[0] + added <= limit):
            _usage[root] = (known[0] + added, known[1])
            return
    evict(keep=keep, limit=limit)


def _all_entries(suffixes: tuple[str, ...] = (ARTIFACT, OBJECT)) -> list[tuple[str, str, int, float]]:
    """(key, suffix, bytes of the file + .json, mtime of the file) of every complete entry."""
    return _scan(cache_dir(), suffixes)[0]


def _scan(root: pathlib.Path, suffixes: tuple[str, ...] = (ARTIFACT, OBJECT)
          ) -> tuple[list[tuple[str, str, int, float]], list[pathlib.Path]]:
    """One pass over ``root``'s shards: (key, suffix, bytes of the file + .json, mtime
    of the file) of every complete entry, and the temp files left by writers."""
    found: list[tuple[str, str, int, float]] = []
    temps: list[pathlib.Path] = []
    with os.scandir(root) as shards:
        shard_paths = [e.path for e in shards if _SHARD_RE.match(e.name) and e.is_dir()]
    for shard in shard_paths:
        try:
            with os.scandir(shard) as it:
                names = [e.name for e in it]
        except FileNotFoundError:
            continue
        present = set(names)
        for name in names:
            if ".tmp" in name:
                temps.append(pathlib.Path(shard, name))
                continue
            for suffix in suffixes:
                key = name[:-len(suffix)]
                if not name.endswith(suffix) or not _KEY_RE.match(key) \
                        or f"{key}.json" not in present:
                    continue
                try:
                    st = os.stat(os.path.join(shard, name))
                    size = st.st_size + os.stat(os.path.join(shard, f"{key}.json")).st_size
                except FileNotFoundError:
                    continue
                found.append((key, suffix, size, st.st_mtime))
    return found, temps


def entries(suffix: str = ARTIFACT) -> list[tuple[str, int, float]]:
    """(key, bytes of the file + .json, mtime of the file) of every complete artifact
    entry (or kernel object entry, with ``suffix=OBJECT``)."""
    return [(key, size, mtime) for key, _, size, mtime in _all_entries((suffix,))]


def total_bytes() -> int:
    """Bytes held by complete cache entries, artifacts and kernel objects."""
    return sum(size for _, _, size, _ in _all_entries())


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


def _remove_stale_temps(temps: list[pathlib.Path]) -> None:
    cutoff = time.time() - STALE_TEMP_SECONDS
    for tmp in temps:
        with contextlib.suppress(OSError):
            if tmp.stat().st_mtime < cutoff:
                tmp.unlink()


def evict(keep: str | None = None, limit: int | None = None) -> list[str]:
    """Removes least recently used entries while the cache is over ``limit``, down to
    ``LOW_WATER`` of it (so that the stores after an eviction need no scan).

    ``limit`` defaults to ``max_bytes()``. ``keep`` is never removed, nor is an
    entry whose key lock another thread or process holds (it is being read or
    built). Runs under the cache-wide lock; returns the evicted keys.
    """
    limit = max_bytes() if limit is None else limit
    root = cache_dir()
    evicted: list[str] = []
    with _cache_lock(root) as locked:
        if not locked:
            return evicted
        found, temps = _scan(root)
        _remove_stale_temps(temps)
        total = sum(size for _, _, size, _ in found)
        if total > limit:
            target = int(limit * LOW_WATER)
            for key, suffix, size, _ in sorted(found, key=lambda e: e[3]):
                if total <= target:
                    break
                if key == keep:
                    continue
                with _try_key_lock(key) as locked:
                    if not locked:
                        continue
                    _remove(*_paths(key, suffix=suffix))
                total -= size
                evicted.append(key)
        with _usage_lock:
            _usage[str(root)] = (total, time.monotonic())
    if evicted:
        log.info("artifact cache: evicted %d entries to stay under %d bytes", len(evicted), limit)
    return evicted


@contextlib.contextmanager
def _exclusive(lock_file: pathlib.Path, timeout: float) -> Iterator[bool]:
    """Holds an exclusive ``flock`` on ``lock_file`` (created 0600), waiting at most
    ``timeout`` seconds; yields whether it holds it (not when the file cannot be
    opened, e.g. in a read-only cache, or the wait timed out)."""
    try:
        f = open(lock_file, "a")
    except OSError as e:
        _report_once("lock", str(lock_file.parent), "artifact cache lock %s cannot be created "
                     "(%s); going on without it", lock_file, e)
        yield False
        return
    with f:
        with contextlib.suppress(OSError):
            os.fchmod(f.fileno(), 0o600)
        deadline = time.monotonic() + timeout
        delay = 0.005
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
            if time.monotonic() >= deadline:
                log.warning("artifact cache lock %s still held after %.0fs; going on without it",
                            lock_file, timeout)
                yield False
                return
            time.sleep(delay)
            delay = min(delay * 2, 0.25)
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _cache_lock(root: pathlib.Path, timeout: float = DEFAULT_LOCK_TIMEOUT):
    """The cache-wide lock (eviction)."""
    return _exclusive(root / ".lock", timeout)


def key_lock(key: str, timeout: float = DEFAULT_LOCK_TIMEOUT):
    """An exclusive inter-process lock for ``key``, waited for at most ``timeout``
    seconds: a context manager yielding whether it is held."""
    try:
        shard = _shard(key)
    except OSError:  # a read-only cache: no lock file can be made
        shard = cache_dir() / key[:2]
    return _exclusive(shard / f"{key}.lock", timeout)
