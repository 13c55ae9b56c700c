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
if os.environ.get("DISC_TF_TARGET") == "cuda":  # on a GPU: fp32 GEMMs in both TF and disc_tf
    import tensorflow as tf  # (TF32, TF's GPU default, would leave them ~1e-3 apart)

    tf.config.experimental.enable_tensor_float_32_execution(False)


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


#: Seconds the longest files take one worker (default run, cuda-emu run), measured on
#: 2 cores of an AVX2 host (each test's start and end, summed per file). Files run
#: longest first (the rest after them, in collection order), so that ``--dist loadfile``
#: does not start a long file last while the other worker has nothing left to do.
#: (pytest-xdist's own order, most tests first, started the bench smoke test, the
#: concurrency tests and the fuzzer last: a 28-second tail.)
FILE_SECONDS = {
    "e2e/test_long_reductions.py": (35, 55), "integration/test_subprocess_compiler.py": (42, 0),
    "e2e/test_reductions.py": (29, 34), "codegen/test_cuda_codegen.py": (33, 0),
    "e2e/test_elementwise_ops.py": (33, 29), "e2e/test_conv_ops.py": (26, 32),
    "e2e/test_data_ops.py": (31, 32), "e2e/test_direct_call_loops.py": (16, 26),
    "bench/test_bench_smoke.py": (24, 0), "integration/test_enable.py": (22, 0),
    "fuzz/test_differential.py": (20, 20), "e2e/test_layout_ops.py": (14, 19),
    "e2e/test_keras_models.py": (19, 15), "cluster/test_clustering.py": (18, 0),
    "serving/test_serving_host.py": (18, 0), "reliability/test_concurrency.py": (17, 0),
    "e2e/test_direct_call.py": (8, 15), "bench/test_bench_parts.py": (14, 0),
    "bench/test_gemm_variant.py": (20, 0), "bench/test_gpu_replay.py": (30, 0),
    "e2e/test_gemm_epilogue.py": (10, 14), "e2e/test_half_types.py": (13, 8),
    "runtime/test_remote_cache.py": (12, 0), "e2e/test_matmul.py": (11, 9),
    "ops/test_op_table.py": (11, 0), "e2e/test_saved_model.py": (11, 6),
}
TESTS_DIR = pathlib.Path(__file__).resolve().parent
if _gone := [n for n in FILE_SECONDS if not (TESTS_DIR / n).is_file()]:
    raise RuntimeError(f"tests/conftest.py FILE_SECONDS names missing files: {_gone}")


def _file_seconds(item: pytest.Item) -> float:
    try:
        name = item.path.resolve().relative_to(TESTS_DIR).as_posix()
    except ValueError:
        return 0.0
    default, emu = FILE_SECONDS.get(name, (0, 0))
    return emu if os.environ.get("DISC_TF_TARGET") == "cuda-emu" else default


def pytest_configure(config: pytest.Config) -> None:
    """Keeps the collection order (longest files first) under ``--dist loadfile``:
    pytest-xdist otherwise reorders files by their number of tests."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Puts the longest files first (a stable sort: each file's tests keep their order).
    Under cuda-emu, also marks the listed gaps as strict xfails and leaves out the tests
    of CPU-backend features (``cpu_backend``)."""
    items.sort(key=lambda item: -_file_seconds(item))
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
