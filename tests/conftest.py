"""Test session set-up: a private artifact cache unless one is given, and strict
mode (``DISC_TF_STRICT=1``): a cluster that fails to compile, an artifact that does
not load or a call that runs the original ops is an error, so a test cannot pass on
TF's own answer. Tests that exercise a fallback say so with ``@pytest.mark.fallback``."""

from __future__ import annotations

import atexit
import os
import pathlib
import shutil
import tempfile

import pytest


def _session_dir(prefix: str) -> str:
    """A directory for the whole session (the test workers inherit its path), removed
    when the process that made it exits."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, True)
    return path


if "DISC_TF_CACHE_DIR" not in os.environ:
    os.environ["DISC_TF_CACHE_DIR"] = _session_dir("disc_tf_test_cache_")
# The cache's HMAC key: one for the session and its subprocesses, whatever HOME is.
if "DISC_TF_CACHE_KEY_FILE" not in os.environ:
    os.environ["DISC_TF_CACHE_KEY_FILE"] = os.path.join(_session_dir("disc_tf_test_key_"),
                                                        "cache.key")
os.environ.setdefault("DISC_TF_STRICT", "1")


@pytest.fixture(autouse=True)
def _fallback_allowed(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests marked ``fallback`` run (and start subprocesses) without strict mode."""
    if request.node.get_closest_marker("fallback") is not None:
        monkeypatch.setenv("DISC_TF_STRICT", "0")


#: Tests the cuda-emu run (``$DISC_TF_TARGET=cuda-emu``, ``make test-cuda-emu``) cannot pass
#: yet, one per line with the reason after ``#``. Each is an xfail that must fail: one that
#: passes fails the run, so the list only shrinks.
CUDA_EMU_GAPS = os.path.join(os.path.dirname(__file__), "cuda_emu_gaps.txt")


def _cuda_emu_gaps() -> dict[str, str]:
    gaps = {}
    with open(CUDA_EMU_GAPS, encoding="utf-8") as f:
        for line in f:
            node, _, reason = line.partition("#")
            if node.strip():
                gaps[node.strip()] = reason.strip() or "no reason given"
    return gaps


#: The files that take one worker longest (about 40-150 s each, measured on 2 cores in the
#: default and the cuda-emu runs), longest first. They are collected first, so that
#: ``--dist loadfile`` (which hands out files in collection order) does not start one of them
#: last while the other workers have nothing left to do.
LONGEST_FIRST = [
    "e2e/test_elementwise_ops.py", "e2e/test_reductions.py", "e2e/test_long_reductions.py",
    "e2e/test_data_ops.py", "integration/test_subprocess_compiler.py", "e2e/test_conv_ops.py",
    "integration/test_enable.py", "reliability/test_concurrency.py", "e2e/test_layout_ops.py",
    "e2e/test_packed_weights.py", "bench/test_bench_smoke.py", "fuzz/test_differential.py",
    "e2e/test_matmul.py", "runtime/test_strict_mode.py", "runtime/test_artifact_trust.py",
    "codegen/test_cuda_codegen.py", "runtime/test_remote_cache.py",
]
TESTS_DIR = pathlib.Path(__file__).resolve().parent
if _gone := [n for n in LONGEST_FIRST if not (TESTS_DIR / n).is_file()]:
    raise RuntimeError(f"tests/conftest.py LONGEST_FIRST names missing files: {_gone}")


def _file_rank(item: pytest.Item) -> int:
    try:
        name = item.path.resolve().relative_to(TESTS_DIR).as_posix()
    except ValueError:
        return len(LONGEST_FIRST)
    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Puts the longest files first (a stable sort: each file's tests keep their order).
    Under cuda-emu, also marks the listed gaps as strict xfails and leaves out the tests
    of CPU-backend features (``cpu_backend``)."""
    items.sort(key=_file_rank)
    if os.environ.get("DISC_TF_TARGET") != "cuda-emu":
        return
    cpu_only = [i for i in items if i.get_closest_marker("cpu_backend") is not None]
    if cpu_only:
        config.hook.pytest_deselected(items=cpu_only)
        items[:] = [i for i in items if i.get_closest_marker("cpu_backend") is None]
    gaps = _cuda_emu_gaps()
    for item in items:
        if item.nodeid in gaps:
            item.add_marker(pytest.mark.xfail(strict=True, reason=f"cuda-emu gap: {gaps[item.nodeid]}"))
