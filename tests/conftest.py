"""Test session set-up: a private artifact cache unless one is given."""

from __future__ import annotations

import os
import tempfile

if "DISC_TF_CACHE_DIR" not in os.environ:
    os.environ["DISC_TF_CACHE_DIR"] = tempfile.mkdtemp(prefix="disc_tf_test_cache_")
