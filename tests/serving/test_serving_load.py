"""A serving load test (slow suite): the C++ host serves one optimized model from 16
threads for 60 s in strict mode, every response checked against TF's. Latency
percentiles and RSS go to stdout and to ``serving_load.json`` in the test's
temporary directory."""

from __future__ import annotations

import json
import pathlib

import pytest

from tests.serving.host_harness import (
    ATOL,
    RTOL,
    ServingModel,
    host_env,
    random_requests,
    reference,
    run_host,
    save_optimized,
    write_requests,
)

pytestmark = pytest.mark.slow

THREADS, SECONDS = 16, 60
#: RSS may grow this much between 10 s in and the end of the run (arenas warm up;
#: a leak of even 1 KiB a call would exceed it)
RSS_GROWTH_MB = 64


def test_sixteen_threads_for_a_minute(serving_host: pathlib.Path, op_library: pathlib.Path,
                                      tmp_path: pathlib.Path) -> None:
    model = ServingModel()
    requests = random_requests(3, 32)
    expected = write_requests(tmp_path / "expected.bin", reference(model, requests))
    result = run_host(
        serving_host, save_optimized(model, tmp_path), op_library,
        write_requests(tmp_path / "requests.bin", requests),
        "--threads", str(THREADS), "--seconds", str(SECONDS), "--expected", str(expected),
        "--rtol", str(RTOL), "--atol", str(ATOL),
        env=host_env(DISC_TF_STRICT="1"), timeout=SECONDS + 240)
    rss = result["rss_mb"]  # before the first request, then once a second
    summary = {key: result[key] for key in ("threads", "calls", "errors", "mismatches", "wall_s",
                                            "p50_us", "p99_us", "max_us", "peak_rss_mb", "stats")}
    summary.update(calls_per_s=round(result["calls"] / result["wall_s"], 1), rss_start_mb=rss[0],
                   rss_10s_mb=rss[min(10, len(rss) - 1)], rss_end_mb=rss[-1])
    (tmp_path / "serving_load.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("serving load:", json.dumps(summary))

    assert result["returncode"] == 0, result
    assert (result["errors"], result["mismatches"]) == (0, 0), result
    assert result["wall_s"] >= SECONDS and result["calls"] >= THREADS * len(requests), summary
    stats = result["stats"]
    assert stats["clusters"] >= 1 and stats["fallbacks"] == 0 and stats["compilations"] == 0, stats
    assert max(rss[10:]) - summary["rss_10s_mb"] < RSS_GROWTH_MB, rss
