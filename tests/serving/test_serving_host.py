"""The serving path without Python: a C++ host (``serving/host``) linked against the
wheel's libtensorflow_cc loads SavedModels through TensorFlow's SavedModelBundle
loader with the op library registered, and serves requests at many shapes.

Outputs are compared with TF's (Python, original ops). That alone would pass on a
fallback, so the host also runs in strict mode (``DISC_TF_STRICT=1``: a
``DiscCluster`` that would run the original ops fails the request instead) and
reports the op library's counters: clusters loaded, nothing compiled in the host,
no fallback. ``test_strict_host_fails_every_request_that_would_run_tf_ops`` shows
that strict mode and the counters do catch a fallback in this host.

The trust policy (``docs/serving.md``, "Native code in models"), in this host: a
host that did not build a model's artifacts loads them only if a key it trusts
signed them. A planted shared object (``tests/runtime/test_artifact_trust.py``)
never runs; the cluster is rebuilt here through the subprocess compiler, or runs
TF's ops under ``DISC_TF_ARTIFACTS=fallback``.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from disc_tf import trust
from serving import tensor_file
from tests.runtime.test_artifact_trust import EVIL_SOURCE, plant_artifact
from tests.serving.host_harness import (
    ATOL,
    RTOL,
    ServingModel,
    assert_close,
    host_env,
    other_host_env,
    random_requests,
    reference,
    run_host,
    save,
    save_optimized,
    write_requests,
)

COUNT = 8


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The optimized model (signed by a vendor key, ``vendor.pub``), requests at
    COUNT shapes and TF's responses as files."""
    root = tmp_path_factory.mktemp("served")
    trust.generate_key(root / "vendor.pem", root / "vendor.pub")
    model = ServingModel()
    requests = random_requests(1, COUNT)
    want = reference(model, requests)
    return {"model": save_optimized(model, root, signing_key=root / "vendor.pem"),
            "vendor": root / "vendor.pub",
            "requests": write_requests(root / "requests.bin", requests),
            "expected": write_requests(root / "expected.bin", want), "want": want,
            "outputs": sorted(model.__call__.get_concrete_function().structured_outputs)}


def _check_args(served: dict) -> list[str]:
    return ["--expected", str(served["expected"]), "--rtol", str(RTOL), "--atol", str(ATOL)]


def test_host_links_tensorflow_but_no_python(serving_host: pathlib.Path) -> None:
    libs = subprocess.run(["ldd", str(serving_host)], capture_output=True, text=True,
                          check=True).stdout
    assert "libtensorflow_cc.so.2" in libs and "libtensorflow_framework.so.2" in libs, libs
    assert "libpython" not in libs, libs


def test_optimized_model_runs_compiled_code_at_every_shape(
        serving_host: pathlib.Path, op_library: pathlib.Path, served: dict,
        tmp_path: pathlib.Path) -> None:
    out = tmp_path / "responses.bin"
    result = run_host(serving_host, served["model"], op_library, served["requests"],
                      "--out", str(out), *_check_args(served),
                      env=host_env(DISC_TF_STRICT="1"))
    assert result["returncode"] == 0, result
    assert result["inputs"] == ["x"] and result["outputs"] == served["outputs"], result
    assert (result["calls"], result["errors"], result["mismatches"]) == (COUNT, 0, 0), result
    assert_close(tensor_file.read(out, len(served["outputs"])), served["want"])
    stats = result["stats"]
    assert stats["clusters"] >= 1 and stats["fallbacks"] == 0, stats
    # The artifacts stored in the model ran as they are: nothing compiled or rebuilt here.
    assert stats["compilations"] == 0 and stats["rebuilds"] == 0, stats


def test_threads_share_one_session(serving_host: pathlib.Path, op_library: pathlib.Path,
                                   served: dict) -> None:
    result = run_host(serving_host, served["model"], op_library, served["requests"],
                      "--threads", "4", *_check_args(served), env=host_env(DISC_TF_STRICT="1"))
    assert result["returncode"] == 0, result
    assert (result["calls"], result["errors"], result["mismatches"]) == (4 * COUNT, 0, 0), result
    assert result["stats"]["fallbacks"] == 0, result["stats"]


@pytest.mark.fallback
def test_strict_host_fails_every_request_that_would_run_tf_ops(
        serving_host: pathlib.Path, op_library: pathlib.Path, served: dict) -> None:
    """The proof's self-test: forced to fall back, the strict host fails each request
    and the lenient one answers with TF's ops, counted as fallbacks."""
    strict = run_host(serving_host, served["model"], op_library, served["requests"],
                      env=host_env(DISC_TF_STRICT="1", DISC_TF_FORCE_FALLBACK="1"))
    assert strict["returncode"] == 1 and strict["errors"] == COUNT, strict
    assert "strict mode" in strict["first_error"], strict["first_error"]
    lenient = run_host(serving_host, served["model"], op_library, served["requests"],
                       *_check_args(served),
                       env=host_env(DISC_TF_STRICT="0", DISC_TF_FORCE_FALLBACK="1"))
    assert lenient["returncode"] == 0 and lenient["mismatches"] == 0, lenient
    assert lenient["stats"]["fallbacks"] == COUNT, lenient["stats"]


def test_optimized_model_needs_the_op_library(serving_host: pathlib.Path, served: dict) -> None:
    proc = subprocess.run([str(serving_host), "--model", str(served["model"]),
                           "--requests", str(served["requests"])],
                          env=host_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "DiscCluster" in proc.stderr, proc.stderr[-2000:]


def _enable(serving_host: pathlib.Path, op_library: pathlib.Path, tmp_path: pathlib.Path,
            model: ServingModel) -> dict:
    """Serves the unoptimized ``model`` with TF_DISC_ENABLE=1, compiling synchronously
    (strict); returns the host's summary (every response checked against TF's)."""
    requests = random_requests(2, 6)
    want = reference(model, requests)
    return run_host(
        serving_host, save(model, tmp_path / "model"), op_library,
        write_requests(tmp_path / "requests.bin", requests),
        "--expected", str(write_requests(tmp_path / "expected.bin", want)),
        "--rtol", str(RTOL), "--atol", str(ATOL),
        env=host_env(TF_DISC_ENABLE="1", DISC_TF_PYTHON=sys.executable,
                     DISC_TF_COMPILE_MODE="sync", DISC_TF_STRICT="1"))


def test_graph_pass_compiles_an_unoptimized_model_in_a_subprocess(
        serving_host: pathlib.Path, op_library: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """TF_DISC_ENABLE=1 in a process without Python: the graph pass runs
    ``$DISC_TF_PYTHON -m disc_tf compile-graph`` and the compiled cluster serves."""
    result = _enable(serving_host, op_library, tmp_path, ServingModel(reductions=False))
    assert result["returncode"] == 0, result
    assert (result["errors"], result["mismatches"]) == (0, 0), result
    stats = result["stats"]
    # Clusters ran, none fell back, and the compiler ran in the child, not here.
    assert stats["clusters"] >= 1 and stats["fallbacks"] == 0, stats
    assert stats["compilations"] == 0, stats


@pytest.mark.slow  # ~25 s: two compiler subprocesses (restore graph, serving graph)
def test_graph_pass_compiles_reductions_of_a_session_function(
        serving_host: pathlib.Path, op_library: pathlib.Path, tmp_path: pathlib.Path) -> None:
    result = _enable(serving_host, op_library, tmp_path, ServingModel(reductions=True))
    assert result["returncode"] == 0 and result["stats"]["clusters"] >= 1, result


# ---- the trust policy: this host as another host


@pytest.fixture(scope="module")
def planted(served: dict, tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The served model with every artifact replaced by a shared object whose
    constructor writes ``$DISC_TEST_MARKER``, its sha256 updated (the vendor's
    signatures stay, over the replaced bytes)."""
    root = tmp_path_factory.mktemp("planted")
    (root / "evil.cc").write_text(EVIL_SOURCE)
    subprocess.run(["g++", "-shared", "-fPIC", str(root / "evil.cc"), "-o", str(root / "evil.so")],
                   check=True)
    # The tests' premise: loading the planted object does write the marker.
    marker = root / "loaded"
    subprocess.run([sys.executable, "-c", "import ctypes, sys; ctypes.CDLL(sys.argv[1])",
                    str(root / "evil.so")], env={**host_env(), "DISC_TEST_MARKER": str(marker)},
                   check=True, timeout=60)
    assert marker.read_text() == "ran\n"
    plant_artifact(served["model"], root / "model", (root / "evil.so").read_bytes())
    return root / "model"


def _serve_as_another_host(serving_host: pathlib.Path, op_library: pathlib.Path, served: dict,
                           model: pathlib.Path, tmp_path: pathlib.Path, **env: str) -> dict:
    """Serves ``model`` with the private state of another host (see
    :func:`other_host_env`), every response checked against TF's; asserts that the
    planted code did not run and that the responses match."""
    marker = tmp_path / "planted-code-ran"
    out = tmp_path / "responses.bin"
    result = run_host(serving_host, model, op_library, served["requests"], "--out", str(out),
                      *_check_args(served),
                      env=other_host_env(tmp_path / "host", DISC_TEST_MARKER=str(marker), **env))
    assert not marker.exists(), "the planted artifact's code ran"
    assert result["returncode"] == 0, result
    assert (result["calls"], result["errors"], result["mismatches"]) == (COUNT, 0, 0), result
    assert_close(tensor_file.read(out, len(served["outputs"])), served["want"])
    return result


def test_planted_artifact_is_rebuilt_by_the_subprocess_compiler(
        serving_host: pathlib.Path, op_library: pathlib.Path, served: dict,
        planted: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """Default policy, strict: nothing vouches for the planted bytes, so the cluster
    is compiled here (``$DISC_TF_PYTHON -m disc_tf compile-graph``) and runs compiled."""
    result = _serve_as_another_host(
        serving_host, op_library, served, planted, tmp_path, DISC_TF_PYTHON=sys.executable,
        DISC_TF_COMPILE_MODE="sync", DISC_TF_STRICT="1",
        TF_CPP_MIN_LOG_LEVEL="0")  # the rebuild's reason is an INFO line
    stats = result["stats"]
    assert stats["untrusted"] >= 1 and stats["rebuilds"] >= 1, stats
    assert stats["clusters"] >= 1 and stats["fallbacks"] == 0, stats
    assert "compiling the cluster on this host instead" in result["log"], result["log"][-4000:]


@pytest.mark.fallback
def test_planted_artifact_under_the_fallback_policy(
        serving_host: pathlib.Path, op_library: pathlib.Path, served: dict,
        planted: pathlib.Path, tmp_path: pathlib.Path) -> None:
    result = _serve_as_another_host(serving_host, op_library, served, planted, tmp_path,
                                    DISC_TF_ARTIFACTS="fallback", DISC_TF_STRICT="0")
    stats = result["stats"]
    assert stats["untrusted"] >= 1 and stats["rebuilds"] == 0, stats
    assert stats["fallbacks"] > 0 and stats["compilations"] == 0, stats


def test_signed_model_loads_where_its_key_is_trusted(
        serving_host: pathlib.Path, op_library: pathlib.Path, served: dict,
        tmp_path: pathlib.Path) -> None:
    """Another host's secret cannot vouch for the model's artifacts; the vendor's
    Ed25519 signature does, so they load as they are: nothing compiled or rebuilt."""
    result = _serve_as_another_host(serving_host, op_library, served, served["model"], tmp_path,
                                    DISC_TF_TRUSTED_KEYS=str(served["vendor"]),
                                    DISC_TF_STRICT="1")
    stats = result["stats"]
    assert stats["compilations"] == 0 and stats["rebuilds"] == 0, stats
    assert stats["untrusted"] == 0 and stats["fallbacks"] == 0, stats
    assert stats["clusters"] >= 1, stats
