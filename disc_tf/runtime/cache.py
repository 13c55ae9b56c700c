"""The on-disk artifact cache: content-addressed, atomic, locked per key.

Layout: ``<DISC_TF_CACHE_DIR>/<key[:2]>/<key>.so`` plus ``<key>.json`` (the
artifact's metadata). Writes go to a temp file and are renamed into place; a
lock file per key makes concurrent processes build a cluster once.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pathlib
import tempfile
from collections.abc import Iterator


def cache_dir() -> pathlib.Path:
    """``$DISC_TF_CACHE_DIR``, else ``~/.cache/disc_tf`` (created 0700)."""
    root = os.environ.get("DISC_TF_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "disc_tf"
    )
    path = pathlib.Path(root)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def _paths(key: str) -> tuple[pathlib.Path, pathlib.Path]:
    d = cache_dir() / key[:2]
    d.mkdir(mode=0o700, exist_ok=True)
    return d / f"{key}.so", d / f"{key}.json"


def lookup(key: str) -> tuple[bytes, dict] | None:
    """The cached (artifact bytes, metadata) of ``key``, or None."""
    so, meta = _paths(key)
    try:
        data = so.read_bytes()
        info = json.loads(meta.read_text())
    except (OSError, ValueError):
        return None
    if info.get("size") != len(data):
        return None  # truncated or foreign: rebuild
    return data, info


def _atomic_write(path: pathlib.Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def store(key: str, data: bytes, info: dict) -> None:
    """Stores an artifact and its metadata under ``key``."""
    so, meta = _paths(key)
    _atomic_write(so, data)
    _atomic_write(meta, json.dumps({**info, "size": len(data)}, indent=1).encode())


@contextlib.contextmanager
def key_lock(key: str) -> Iterator[None]:
    """Holds an exclusive inter-process lock for ``key``."""
    d = cache_dir() / key[:2]
    d.mkdir(mode=0o700, exist_ok=True)
    with open(d / f"{key}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
