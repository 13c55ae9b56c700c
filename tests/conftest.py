"""Test session set-up: a private artifact cache unless one is given, and strict
mode (``DISC_TF_STRICT=1``): a cluster that fails to compile, an artifact that does
not load or a call that runs the original ops is an error, so a test cannot pass on
TF's own answer. Tests that exercise a fallback say so with ``@pytest.mark.fallback``."""

from __future__ import annotations

import os
import tempfile

import pytest

if "DISC_TF_CACHE_DIR" not in os.environ:
    os.environ["DISC_TF_CACHE_DIR"] = tempfile.mkdtemp(prefix="disc_tf_test_cache_")
# The cache's HMAC key: one for the session and its subprocesses, whatever HOME is.
os.environ.setdefault("DISC_TF_CACHE_KEY_FILE",
                      os.path.join(tempfile.mkdtemp(prefix="disc_tf_test_key_"), "cache.key"))
os.environ.setdefault("DISC_TF_STRICT", "1")


@pytest.fixture(autouse=True)
def _fallback_allowed(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests marked ``fallback`` run (and start subprocesses) without strict mode."""
    if request.node.get_closest_marker("fallback") is not None:
        monkeypatch.setenv("DISC_TF_STRICT", "0")
