"""The shared remote tier of the artifact cache: one compile per fleet.

``$DISC_TF_REMOTE_CACHE=redis://host:port/db`` (also ``rediss://`` for TLS and
``unix://path``; empty: off) puts a Redis server behind the local cache
(``cache.py``). A cluster missing locally is looked up there (a hit is stored in
the local cache too), and one compiled here is stored there, so the processes of a
fleet sharing the server compile each cluster once (``compiler.cached_build``).
Only cluster artifacts go there; kernel objects stay in the local cache.

Entries: ``disc_tf:v1:<key>:so`` is one Redis string, written by one ``SET NX``
(atomic; the first writer wins, and any writer's artifact of a key is as good as
another's): a magic line, an HMAC-SHA256 under the fleet secret of the Redis key
and the header, the header (JSON: key, suffix, size, sha256, num_kernels, name,
target, ...) and the bytes. Every read verifies all of it; an entry that does not
verify is a miss, logged once per entry and never used. One whose format or bytes
are wrong is also deleted (compare-and-delete) so that the next build replaces it;
one whose HMAC does not verify is left, since a host given another secret must not
delete the fleet's entries.

The fleet secret (``$DISC_TF_REMOTE_CACHE_SECRET_FILE``): 32 or more bytes in a
regular file owned by this user that no one else may read or write, the same file
on every host. Without it the tier is off (one warning): whoever can write to the
server could otherwise plant native code. The local cache's per-user secret cannot
serve, as it is not shared between hosts.

Compiling once: a process that misses takes the key's build lock,
``disc_tf:v1:<key>:so:lock`` (``SET NX PX`` with a random token; kept alive while
the holder compiles; released by compare-and-delete), and another process that
misses meanwhile waits for the holder's entry instead of compiling too, for at most
the time it is given (then it compiles itself). A dead holder's lock expires after
``LOCK_TTL_SECONDS``.

Failures: every network call has a timeout (``$DISC_TF_REMOTE_CACHE_TIMEOUT``
seconds, default 2). A server that is down, slow or refusing never fails a compile:
one warning, then this process uses the local cache alone for ``RETRY_SECONDS``
before it tries the server again.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
import re
import socket
import stat
import struct
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

log = logging.getLogger("disc_tf.runtime")

URL_ENV = "DISC_TF_REMOTE_CACHE"
SECRET_ENV = "DISC_TF_REMOTE_CACHE_SECRET_FILE"
TIMEOUT_ENV = "DISC_TF_REMOTE_CACHE_TIMEOUT"

NAMESPACE = "disc_tf:v1"
DEFAULT_TIMEOUT = 2.0
MIN_SECRET_BYTES = 32
MAX_SECRET_BYTES = 4096
#: Larger artifacts are not stored remotely (Redis strings end at 512 MiB).
MAX_ENTRY_BYTES = 256 << 20
#: A build lock lives this long unless its holder renews it (every third of it).
LOCK_TTL_SECONDS = 30.0
#: After a failed call, the server is left alone this long.
RETRY_SECONDS = 30.0
#: Suffix of cluster artifacts (``cache.ARTIFACT``).
ARTIFACT = ".so"

#: (artifact bytes, metadata) of an entry.
Entry = tuple[bytes, dict]
T = TypeVar("T")

_MAGIC = b"disc_tf remote cache entry 1\n"
_MAC_HEX = 64
_HEADER_LEN = struct.Struct(">I")
_KEY_RE = re.compile(r"^[0-9a-f]{64}$")
_MAC_MISMATCH = "not signed by the fleet secret (HMAC mismatch)"

# Lua, run atomically by the server.
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
_RENEW = ("if redis.call('GET', KEYS[1]) == ARGV[1] then "
          "return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0")
_DELETE_IF_SAME = ("local v = redis.call('GET', KEYS[1]) "
                   "if v and redis.sha1hex(v) == ARGV[1] then return redis.call('DEL', KEYS[1]) end "
                   "return 0")

_state_lock = threading.Lock()
_tiers: dict[tuple[str, str, str], RemoteCache | None] = {}
_reported: set[str] = set()


class _Unavailable(Exception):
    """The server is down, or was recently: this call is not made."""


def _warn_once(what: str, msg: str, *args: Any) -> None:
    with _state_lock:
        if what in _reported:
            return
        _reported.add(what)
    log.warning(msg, *args)


def _shown(url: str) -> str:
    """``url`` without its password, for logs."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def read_secret(path: str) -> bytes:
    """The fleet secret in ``path``; ValueError (or OSError) unless it is a regular
    file of 32 to 4096 bytes, owned by this user, that no one else may read or write.
    A symbolic link to such a file is followed (secret mounts are links)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("is not a regular file")
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise ValueError(f"is not owned by this user with mode 0600 or 0400 "
                             f"(uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})")
        secret = f.read(MAX_SECRET_BYTES + 1)
    if not MIN_SECRET_BYTES <= len(secret) <= MAX_SECRET_BYTES:
        raise ValueError(f"holds {len(secret)} bytes, not {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES}")
    return secret


def timeout() -> float:
    """Seconds any one call to the server may take: ``$DISC_TF_REMOTE_CACHE_TIMEOUT``,
    else 2."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if value > 0:
        return value
    _warn_once(f"timeout {raw}", "%s=%r is not a positive number of seconds; using %g", TIMEOUT_ENV,
               raw, DEFAULT_TIMEOUT)
    return DEFAULT_TIMEOUT


def entry_key(key: str, suffix: str = ARTIFACT) -> str:
    """The Redis key of the entry of cache key ``key``."""
    return f"{NAMESPACE}:{key}:{suffix.lstrip('.')}"


class RemoteCache:
    """One server's entries and build locks, and whether it is reachable from here."""

    def __init__(self, url: str, secret: bytes, seconds: float) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.url = url
        self._secret = secret
        # One retry: a pooled connection the server closed while idle is reopened.
        self._client = redis.Redis.from_url(
            url, socket_timeout=seconds, socket_connect_timeout=seconds,
            retry=Retry(NoBackoff(), 1))
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self._release = self._client.register_script(_RELEASE)
        self._renew = self._client.register_script(_RENEW)
        self._delete_if_same = self._client.register_script(_DELETE_IF_SAME)
        self._down_until = 0.0
        self._down = False
        self._lock = threading.Lock()
        self._reported: set[tuple[str, str]] = set()

    # -- calls ------------------------------------------------------------------

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()``, a call to the server; _Unavailable if it fails (one warning per
        outage) or the server failed less than ``RETRY_SECONDS`` ago."""
        if time.monotonic() < self._down_until:
            raise _Unavailable
        try:
            result = fn()
        except self._errors as e:
            with self._lock:
                self._down_until = time.monotonic() + RETRY_SECONDS
                first, self._down = not self._down, True
            if first:
                log.warning("remote artifact cache %s: %s failed (%s: %s); using the local cache "
                            "alone, retrying in %.0fs", _shown(self.url), what, type(e).__name__, e,
                            RETRY_SECONDS)
            raise _Unavailable from e
        if self._down:
            with self._lock:
                was, self._down = self._down, False
            if was:
                log.info("remote artifact cache %s is reachable again", _shown(self.url))
        return result

    # -- entries ----------------------------------------------------------------

    def _mac(self, rkey: str, header: bytes) -> bytes:
        message = b"disc_tf remote cache entry 1\0" + rkey.encode() + b"\0" + header
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest().encode()

    def encode(self, key: str, data: bytes, info: dict, suffix: str = ARTIFACT) -> bytes:
        """The value stored for ``key``: magic, HMAC, header length, header, bytes."""
        header = json.dumps({**info, "key": key, "suffix": suffix, "size": len(data),
                             "sha256": hashlib.sha256(data).hexdigest()}, sort_keys=True).encode()
        return (_MAGIC + self._mac(entry_key(key, suffix), header) + _HEADER_LEN.pack(len(header))
                + header + data)

    def decode(self, key: str, value: bytes, suffix: str = ARTIFACT) -> tuple[Entry | None, str]:
        """(entry, "") if ``value`` is a sound entry of ``key``, else (None, what is
        wrong)."""
        start = len(_MAGIC) + _MAC_HEX + _HEADER_LEN.size
        if len(value) < start or not value.startswith(_MAGIC):
            return None, "not a disc_tf entry"
        mac = value[len(_MAGIC):len(_MAGIC) + _MAC_HEX]
        (length,) = _HEADER_LEN.unpack_from(value, start - _HEADER_LEN.size)
        header, data = value[start:start + length], value[start + length:]
        if len(header) != length:
            return None, "truncated header"
        if not hmac.compare_digest(mac, self._mac(entry_key(key, suffix), header)):
            return None, _MAC_MISMATCH
        try:
            info = json.loads(header)
        except ValueError as e:
            return None, f"header is not JSON ({e})"
        if not isinstance(info, dict) or info.get("key") != key or info.get("suffix") != suffix:
            return None, "header is not this key's"
        if info.get("size") != len(data):
            return None, f"size {len(data)} != recorded {info.get('size')!r}"
        if info.get("sha256") != hashlib.sha256(data).hexdigest():
            return None, "sha256 of the bytes != recorded"
        if not isinstance(info.get("num_kernels"), int):
            return None, "header lacks num_kernels"
        return (data, {k: v for k, v in info.items() if k not in ("key", "suffix", "size")}), ""

    def get(self, key: str, suffix: str = ARTIFACT) -> Entry | None:
        """The verified entry of ``key``, or None (absent, unsound or unreachable)."""
        rkey = entry_key(key, suffix)
        try:
            value = self._call("GET", lambda: self._client.get(rkey))
        except _Unavailable:
            return None
        if value is None:
            return None
        entry, problem = self.decode(key, value, suffix)
        if entry is not None:
            return entry
        # Unsound under any secret: deleted, to make room for a sound one. One that
        # another secret may have signed is left for the hosts that hold it.
        unsound = problem != _MAC_MISMATCH
        with self._lock:
            first = (rkey, problem) not in self._reported
            self._reported.add((rkey, problem))
        if first:
            log.warning("remote artifact cache %s: entry %s is not used: %s%s", _shown(self.url),
                        rkey, problem, "; deleted" if unsound else "")
        if unsound:
            sha1 = hashlib.sha1(value).hexdigest()
            with contextlib.suppress(_Unavailable):
                self._call("DEL", lambda: self._delete_if_same(keys=[rkey], args=[sha1]))
        return None

    def put(self, key: str, data: bytes, info: dict, suffix: str = ARTIFACT) -> bool:
        """Stores ``data`` and ``info`` under ``key`` unless an entry is there already;
        whether it did."""
        if len(data) > MAX_ENTRY_BYTES:
            log.info("artifact %s (%d bytes) is too large for the remote cache", key[:12], len(data))
            return False
        value = self.encode(key, data, info, suffix)
        rkey = entry_key(key, suffix)
        try:
            return bool(self._call("SET", lambda: self._client.set(rkey, value, nx=True)))
        except _Unavailable:
            return False

    # -- build locks ------------------------------------------------------------

    def _try_lock(self, lkey: str, token: str) -> bool:
        ttl_ms = int(LOCK_TTL_SECONDS * 1000)
        return bool(self._call("SET NX", lambda: self._client.set(lkey, token, nx=True, px=ttl_ms)))

    def _claim(self, key: str, wait: float, suffix: str, token: str) -> tuple[Entry | None, bool]:
        """(the entry, False) once there is one; else (None, whether this process now
        holds the build lock: not if the server is unreachable or ``wait`` ran out)."""
        lkey = entry_key(key, suffix) + ":lock"
        deadline = time.monotonic() + wait
        delay, waited = 0.02, False
        while True:
            entry = self.get(key, suffix)
            if entry is not None:
                return entry, False
            try:
                if self._try_lock(lkey, token):
                    # The holder may have stored and released between GET and SET.
                    entry = self.get(key, suffix)
                    if entry is not None:
                        self.release(lkey, token)
                    return entry, entry is None
                holder = self._call("GET", lambda: self._client.get(lkey))
            except _Unavailable:
                return None, False
            now = time.monotonic()
            if now >= deadline:
                log.warning("artifact %s: another process (%s) is still building it after %.0fs; "
                            "building it here too", key[:12], _text(holder), wait)
                return None, False
            if not waited:
                log.info("artifact %s: waiting for another process (%s) to build it", key[:12],
                         _text(holder))
                waited = True
            time.sleep(min(delay, deadline - now))
            delay = min(delay * 2, 0.5)

    def release(self, lkey: str, token: str) -> None:
        """Deletes the build lock ``lkey`` if it is still ``token``'s."""
        with contextlib.suppress(_Unavailable):
            self._call("release", lambda: self._release(keys=[lkey], args=[token]))

    @contextlib.contextmanager
    def claim(self, key: str, wait: float, suffix: str = ARTIFACT) -> Iterator[Entry | None]:
        """Yields the entry of ``key`` if there is one, or once another process that
        holds the key's build lock stores it (waiting at most ``wait`` seconds); else
        yields None, holding the build lock where it could be taken, while the
        caller builds and ``put``s the artifact."""
        token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"
        entry, held = self._claim(key, wait, suffix, token)
        if not held:
            yield entry
            return
        lkey = entry_key(key, suffix) + ":lock"
        stop = threading.Event()
        renewer = threading.Thread(target=self._keep, args=(lkey, token, stop),
                                   name="disc_tf-remote-lock", daemon=True)
        renewer.start()
        try:
            yield None
        finally:
            stop.set()
            renewer.join()
            self.release(lkey, token)

    def _keep(self, lkey: str, token: str, stop: threading.Event) -> None:
        """Renews the build lock every third of its life until ``stop`` or it is lost."""
        ttl_ms = int(LOCK_TTL_SECONDS * 1000)
        while not stop.wait(LOCK_TTL_SECONDS / 3):
            try:
                kept = self._call("renew", lambda: self._renew(keys=[lkey], args=[token, ttl_ms]))
            except _Unavailable:
                return
            if not kept:
                log.info("remote build lock %s was lost; another process may build it too", lkey)
                return


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return "gone" if value is None else str(value)


def _open(url: str, secret_file: str) -> RemoteCache | None:
    """The tier for ``url`` and ``secret_file``, or None (one warning) if it cannot be."""
    if not secret_file:
        log.warning("%s is set but %s is not: the remote artifact cache is off (its entries are "
                    "authenticated with a fleet secret)", URL_ENV, SECRET_ENV)
        return None
    try:
        secret = read_secret(secret_file)
    except (OSError, ValueError) as e:
        log.warning("remote artifact cache secret %s: %s; the remote artifact cache is off",
                    secret_file, e)
        return None
    try:
        tier = RemoteCache(url, secret, timeout())
    except ImportError:
        log.warning("%s is set but the redis package is not installed (pip install "
                    "'disc_tf[remote]'); the remote artifact cache is off", URL_ENV)
        return None
    except ValueError as e:
        log.warning("%s=%s: %s; the remote artifact cache is off", URL_ENV, _shown(url), e)
        return None
    log.info("remote artifact cache: %s", _shown(url))
    return tier


def remote() -> RemoteCache | None:
    """The remote tier ``$DISC_TF_REMOTE_CACHE`` configures, or None where it is off."""
    url = os.environ.get(URL_ENV, "").strip()
    if not url:
        return None
    config = (url, os.environ.get(SECRET_ENV, "").strip(), os.environ.get(TIMEOUT_ENV, "").strip())
    with _state_lock:
        if config in _tiers:
            return _tiers[config]
    tier = _open(url, config[1])
    with _state_lock:
        return _tiers.setdefault(config, tier)


def lookup(key: str, suffix: str = ARTIFACT) -> Entry | None:
    """The remote entry (bytes, metadata) of ``key``, verified; None on a miss or
    where the tier is off or unreachable."""
    tier = remote()
    return None if tier is None or not _KEY_RE.match(key) else tier.get(key, suffix)


def store(key: str, data: bytes, info: dict, suffix: str = ARTIFACT) -> bool:
    """Stores an artifact and its metadata (``sha256``, ``num_kernels``, ...) under
    ``key`` unless the remote tier is off or has it; whether it did. Never raises
    for the server's sake."""
    tier = remote()
    return tier is not None and _KEY_RE.match(key) is not None and tier.put(key, data, info, suffix)


@contextlib.contextmanager
def claim(key: str, wait: float, suffix: str = ARTIFACT) -> Iterator[Entry | None]:
    """``RemoteCache.claim`` of the configured tier: the remote entry of ``key``
    (perhaps after waiting at most ``wait`` seconds for another process's build),
    else None while this process builds it under the fleet-wide build lock. Yields
    None at once where the tier is off."""
    tier = remote()
    if tier is None or not _KEY_RE.match(key):
        yield None
        return
    with tier.claim(key, wait, suffix) as entry:
        yield entry
