"""Fixtures of the serving tests: the C++ host (built once per source and flags, see
``serving/build_host.py``) and the op library it loads."""

from __future__ import annotations

import pathlib

import pytest

from serving.build_host import build_host


@pytest.fixture(scope="session")
def serving_host() -> pathlib.Path:
    """The ``disc_serving_host`` binary for this environment (g++ is a requirement of
    the whole project: without it the build fails with its reason, not a skip)."""
    return build_host()


@pytest.fixture(scope="session")
def op_library() -> pathlib.Path:
    """``libdisc_tf_ops.so`` of this environment (the copy this process loads)."""
    from disc_tf.runtime import native

    return native.load().ops_lib_path
