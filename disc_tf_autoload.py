"""Loads disc_tf right after TensorFlow when ``TF_DISC_ENABLE=1``.

Imported at interpreter start by ``disc_tf_autoload.pth`` (only when the
variable is set). It installs an import hook that, once ``tensorflow`` has
finished importing, imports ``disc_tf`` and calls ``disc_tf.enable.enable()``,
so an unmodified TensorFlow script runs its graphs through disc_tf.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

_TRIGGER = "tensorflow"
_installed = False
_done = False


def _load_disc_tf() -> None:
    global _done
    if _done:
        return
    _done = True
    try:
        import importlib

        # Not `disc_tf.enable.enable()`: the package attribute `enable` is the
        # function, which shadows the module of the same name.
        importlib.import_module("disc_tf.enable").enable()
    except Exception as e:  # noqa: BLE001 - never break the user's import
        import logging

        logging.getLogger("disc_tf").warning("TF_DISC_ENABLE=1 but disc_tf failed to load: %s", e)


class _Loader(importlib.abc.Loader):
    """Runs the real loader, then loads disc_tf."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        _load_disc_tf()

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loader of the ``tensorflow`` package."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _TRIGGER or _done:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


def install() -> None:
    """Installs the hook if ``TF_DISC_ENABLE=1`` (idempotent)."""
    global _installed
    if _installed or os.environ.get("TF_DISC_ENABLE") != "1":
        return
    _installed = True
    if _TRIGGER in sys.modules:
        _load_disc_tf()
    else:
        sys.meta_path.insert(0, _Finder())


install()
