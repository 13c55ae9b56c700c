"""Loads disc_tf's native libraries.

``load()`` never builds: it checks that this environment's libraries exist
(``native_build.check_built``: missing ones raise one clear error naming the
command that builds them; a build older than the checkout's sources only
warns), loads the op library with ``tf.load_op_library`` and then imports the
``_disc_py`` extension, which is linked against that same library so both see
one set of runtime counters. A host without a compiler loads and serves
optimized models.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import pathlib
import sys
import threading
import types
from dataclasses import dataclass

logger = logging.getLogger("disc_tf.runtime")

_PY_MODULE_QUALNAME = "disc_tf._native._disc_py"


@dataclass(frozen=True)
class Native:
    """The loaded native libraries.

    Attributes:
      ops: the module returned by ``tf.load_op_library``; ``ops.disc_cluster``
        is the DiscCluster op wrapper.
      py: the ``_disc_py`` extension (``stats()``, ``reset_stats()``,
        ``add_stat(name, n)``, ``note_cluster(sha, num_kernels)``).
      native_dir: the directory holding the libraries.
    """

    ops: types.ModuleType
    py: types.ModuleType
    native_dir: pathlib.Path

    @property
    def ops_lib_path(self) -> pathlib.Path:
        """Path of ``libdisc_tf_ops.so``."""
        from disc_tf.runtime import native_build

        return native_build.ops_lib_path(self.native_dir)


_lock = threading.Lock()
_native: Native | None = None


def _import_py_module(path: pathlib.Path) -> types.ModuleType:
    existing = sys.modules.get(_PY_MODULE_QUALNAME)
    if existing is not None:
        return existing
    spec = importlib.util.spec_from_file_location(_PY_MODULE_QUALNAME, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {_PY_MODULE_QUALNAME} from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[_PY_MODULE_QUALNAME] = module
    return module


def _check_shared_counters(ops_lib: pathlib.Path, py: types.ModuleType) -> None:
    """Verifies that ``py`` updates the counters of the loaded op library."""
    # RTLD_NOLOAD: only succeeds for the copy TensorFlow already loaded.
    lib = ctypes.CDLL(str(ops_lib), mode=os.RTLD_NOLOAD | os.RTLD_LOCAL)
    get = lib.disc_stats_get
    get.argtypes = [ctypes.POINTER(ctypes.c_int64)]
    get.restype = None
    # disc_stats_get writes kNumCounters (stats.h) values: room for more than that,
    # so that a counter added there can never write past this buffer.
    values = (ctypes.c_int64 * 64)()
    counters = len(py.stats())
    if counters > len(values):
        raise RuntimeError(f"disc_tf: {counters} counters outgrew the {len(values)} read here")
    get(values)
    before = values[1]  # compilations
    py.add_stat("compilations", 1)
    get(values)
    after = values[1]
    py.add_stat("compilations", -1)
    if after != before + 1:
        raise RuntimeError(
            "disc_tf: the _disc_py extension does not share counters with the "
            f"loaded op library {ops_lib}"
        )


def load() -> Native:
    """Builds (if needed) and loads the native libraries; cached, thread-safe."""
    global _native
    if _native is not None:
        return _native
    with _lock:
        if _native is None:
            import tensorflow as tf

            # Imported here, not at the top: `python -m disc_tf.runtime.native_build`
            # imports this package first and must not find itself imported already.
            from disc_tf.runtime import native_build

            native_dir = native_build.native_dir(tf.__version__)
            for warning in native_build.check_built(native_dir):
                logger.warning("%s", warning)
            ops_lib = native_build.ops_lib_path(native_dir)
            ops = tf.load_op_library(str(ops_lib))
            # Imported only now, so that its dependency on libdisc_tf_ops.so is
            # satisfied by the copy TensorFlow just loaded.
            py = _import_py_module(native_build.py_module_path(native_dir))
            _check_shared_counters(ops_lib, py)
            _native = Native(ops=ops, py=py, native_dir=native_dir)
            logger.debug("loaded disc_tf native libraries from %s", native_dir)
    return _native


def ral_include_dir() -> pathlib.Path:
    """Directory containing ``disc_ral.h`` for compiling cluster artifacts."""
    from disc_tf.runtime import native_build

    return native_build.include_dir(load().native_dir)
