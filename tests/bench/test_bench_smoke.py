"""Smoke tests of the benchmark: quick streams, peers tf and disc, and tf and ort."""

from __future__ import annotations

import json
import pathlib

import pytest

from bench.peer import TF_CALL_PASSES
from tests import fresh_python

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_quick_tf_and_disc(tmp_path: pathlib.Path) -> None:
    report = tmp_path / "RESULTS.md"
    proc = fresh_python.run(
        ["-m", "bench.run", "--workloads", "feature_normalizer", "--quick",
         "--peers", "tf,disc", "--out-dir", str(tmp_path), "--report", str(report),
         "--timeout", "80", "--skip-compile-time"],
        cwd=REPO_ROOT, timeout=85,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads((tmp_path / "results.json").read_text())
    records = results["results"]["feature_normalizer"]
    assert set(records) == {"tf", "disc"}
    tf_rec, disc = records["tf"], records["disc"]
    assert tf_rec["status"] == "ok" and disc["status"] == "ok", records
    assert disc["num_calls"] == results["config"]["count"] == 12
    assert disc["max_abs_err"] is not None and disc["max_abs_err"] < 1e-4
    assert disc["clusters"] >= 1
    assert disc["compiles"] == disc["clusters"], disc
    assert disc["disc_stats"]["fallbacks"] == 0
    assert disc["direct"] == {"__call__": None, "serving_default": None}  # disc_tf.load's calls
    assert disc["hot_tf_call_s"] > 0  # the same model through the restored TF function
    assert len(disc["hot_tf_call_runs_s"]) == TF_CALL_PASSES == 3  # the best of three
    assert disc["hot_tf_call_s"] == min(disc["hot_tf_call_runs_s"])
    for key in ("setup_s", "first_pass_s", "hot_pass_s", "hot_p50_ms", "hot_p99_ms",
                "peak_rss_mb"):
        assert tf_rec[key] > 0 and disc[key] > 0, key
    for rec in (tf_rec, disc):  # from the separate memory pass
        assert "memory_status" not in rec, rec
        assert rec["peak_act_mb"] > 0 and rec["alloc_peak_mb"] >= rec["peak_act_mb"], rec
    assert "| disc |" in report.read_text()


ORT_PYTHON = REPO_ROOT / "bench" / ".venv-ort" / "bin" / "python"


@pytest.mark.slow
def test_quick_ort_peer_in_its_own_venv(tmp_path: pathlib.Path) -> None:
    """Needs the ONNX Runtime venv that ``make bench-deps`` builds (run on demand)."""
    if not ORT_PYTHON.exists():
        pytest.fail("no bench/.venv-ort: run `make bench-deps` first")
    report = tmp_path / "RESULTS.md"
    proc = fresh_python.run(
        ["-m", "bench.run", "--workloads", "recommender_tower", "--count", "4",
         "--peers", "tf,ort", "--out-dir", str(tmp_path), "--report", str(report),
         "--timeout", "80", "--skip-compile-time"],
        cwd=REPO_ROOT, timeout=85,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    ort = json.loads((tmp_path / "results.json").read_text())["results"]["recommender_tower"]["ort"]
    assert ort["status"] == "ok", ort
    assert ort["max_abs_err"] is not None and ort["max_abs_err"] < 1e-4
    assert ort["ort_versions"]["tf2onnx"] and ort["convert_s"] > 0


def test_per_request_alternates_two_peers(tmp_path: pathlib.Path) -> None:
    """bench.per_request: tf and disc workers, two passes of three requests each in
    alternating order; a row per request and every pass's times kept."""
    out = tmp_path / "times.json"
    proc = fresh_python.run(
        ["-m", "bench.per_request", "--workload", "feature_normalizer", "--peers", "tf,disc",
         "--passes", "2", "--count", "3", "--out", str(out)],
        cwd=REPO_ROOT, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and "x" in line
            and not line.startswith("| request")]
    assert len(rows) == 3, proc.stdout
    raw = json.loads(out.read_text())
    assert raw["peers"] == ["tf", "disc"] and len(raw["shapes"]) == 3
    for peer in ("tf", "disc"):
        assert len(raw["times"][peer]) == 2 and all(len(p) == 3 for p in raw["times"][peer])
        assert all(t > 0 for p in raw["times"][peer] for t in p)
    assert "Sum of per-request medians: tf" in proc.stdout
    assert "Per pass, disc total / tf total: median" in proc.stdout
    assert raw["machine"].startswith("Machine: ") and raw["machine"] in proc.stdout
    assert raw["interleave"] == "pass"


def test_per_request_takes_turns_request_by_request(tmp_path: pathlib.Path) -> None:
    """bench.per_request --interleave request: the same table and raw times, the peers
    taking turns on each request."""
    out = tmp_path / "times.json"
    proc = fresh_python.run(
        ["-m", "bench.per_request", "--workload", "feature_normalizer", "--peers", "tf,disc",
         "--passes", "2", "--count", "3", "--interleave", "request", "--out", str(out)],
        cwd=REPO_ROOT, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "peers taking turns request by request" in proc.stdout
    raw = json.loads(out.read_text())
    assert raw["interleave"] == "request"
    for peer in ("tf", "disc"):
        assert len(raw["times"][peer]) == 2 and all(len(p) == 3 for p in raw["times"][peer])
        assert all(t > 0 for p in raw["times"][peer] for t in p)
