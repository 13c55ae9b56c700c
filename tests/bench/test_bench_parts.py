"""Fast checks of the benchmark's parts: workloads, streams, report, progress bar, CLI hook."""

from __future__ import annotations

import io
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from bench import compile_time, report
from bench.progress import ProgressBar
from bench.workloads import DEFAULT_WORKLOADS, FULL_STREAM, WORKLOADS

ISSUE_WORKLOADS = {"bert_base", "bert_small", "fastspeech_conv", "recommender_tower", "keras_encoder"}


def test_default_workloads_are_the_model_sized_ones() -> None:
    assert set(DEFAULT_WORKLOADS) == ISSUE_WORKLOADS


@pytest.mark.parametrize("name", sorted(ISSUE_WORKLOADS))
def test_stream_is_long_mostly_distinct_and_seeded(name: str) -> None:
    w = WORKLOADS[name]
    shapes = w.shapes(0, FULL_STREAM)
    assert FULL_STREAM >= 40
    assert len(set(shapes)) >= 0.9 * FULL_STREAM
    assert shapes == w.shapes(0, FULL_STREAM)
    first = next(w.stream(0, 2))
    assert first.dtype == np.float32 and first.shape == shapes[0]
    np.testing.assert_array_equal(first, next(w.stream(0, 2)))


def test_stream_ranges() -> None:
    bert = WORKLOADS["bert_base"].shapes(0, FULL_STREAM)
    assert all(1 <= b <= 4 and 8 <= s <= 256 and h == 768 for b, s, h in bert)
    speech = WORKLOADS["fastspeech_conv"].shapes(0, FULL_STREAM)
    assert all(b == 1 and 16 <= t <= 800 for b, t, _ in speech)
    tower = WORKLOADS["recommender_tower"].shapes(0, FULL_STREAM)
    assert all(1 <= b <= 2048 for b, _ in tower)


@pytest.mark.parametrize("name", sorted(ISSUE_WORKLOADS))
def test_workload_runs_in_tf_at_two_shapes(name: str) -> None:
    module = WORKLOADS[name].make_module()
    spec = module.__call__.input_signature[0]
    for fill in (3, 17):
        shape = [fill if d is None else d for d in spec.shape]
        x = np.random.default_rng(fill).standard_normal(shape).astype(np.float32)
        y = module(tf.constant(x)).numpy()
        assert np.isfinite(y).all()
        assert y.shape[0] == shape[0] and y.shape[1] == shape[1]


def _results() -> dict:
    def rec(peer: str, first: float, hot: float, **extra: object) -> dict:
        return {"peer": peer, "status": "ok", "setup_s": 0.1, "first_pass_s": first,
                "hot_pass_s": hot, "hot_p50_ms": 1.0, "hot_p99_ms": 2.0, "compiles": None,
                "peak_rss_mb": 500.0, "max_abs_err": 1e-6, "num_calls": 48,
                "distinct_shapes": 47, "first_call_s": 0.01, **extra}

    records = {
        "tf": rec("tf", 1.0, 0.8),
        "xla": rec("xla", 20.0, 0.7, compiles=47),
        "disc": rec("disc", 0.7, 0.5, compiles=1, clusters=1, cluster_ops=[40], optimize_s=2.0,
                    failed_clusters=["disc_cluster_1"], failed_cluster_errors=["boom"],
                    disc_stats={"fallbacks": 0}),
        "ort": {"peer": "ort", "status": "not installed"},
    }
    report.add_speedups(records)
    return {
        "machine": {"cpu": "test cpu", "cores": 2, "python": "3", "tensorflow": "2", "numpy": "2",
                    "date": "today"},
        "config": {"count": 48, "seed": 0, "quick": False},
        "results": {"bert_base": records},
        "compile_time": {"model": "m", "cores": 2, "cold": {"status": "error: x"},
                         "cached": {"status": "ok", "optimize_s": 0.3, "clusters": [
                             {"name": "c0", "ops": 60, "kernels": 17, "from_cache": True,
                              "cxx_compile_s": 0.0, "cluster_build_s": 0.2, "error": None}]}},
    }


def test_report_tables_targets_and_fallbacks() -> None:
    results = _results()
    text = report.markdown_report(results, "plot.png")
    assert "| bert_base | 1.60x ok | n/a | 1.43x ok | 28.57x ok |" in text
    assert "1 failed to compile" in text
    assert "cluster disc_cluster_1 left as TF ops: boom" in text
    assert "| ort | not installed |" in text
    assert "![speedups over TF](plot.png)" in text
    assert "| cached | c0 | 60 | 17 | True | 0.20 | 0.00 | 0.30 |" in text
    assert "| cold | error: x |" in text
    assert "BERT layer compile time: cold error: x, cached ok." in text


def test_compile_time_target_line() -> None:
    record = {"cores": 2, "cold": {"status": "ok", "clusters": [
        {"cluster_build_s": 2.5, "cxx_compile_s": 2.3, "from_cache": False}]},
        "cached": {"status": "ok", "clusters": [
            {"cluster_build_s": 0.1, "cxx_compile_s": 0.0, "from_cache": True}]}}
    line = compile_time.target_line(record)
    assert "cold build 2.50 s (target <= 10 s: ok)" in line
    assert "0.00 s of C++ compile (target 0 s: ok)" in line


def test_plot_writes_png(tmp_path: pathlib.Path) -> None:
    png = tmp_path / "r.png"
    assert report.plot(_results(), png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_progress_bar_logs_phase_changes_only_off_a_terminal() -> None:
    out = io.StringIO()
    bar = ProgressBar(2, out)
    bar.start("w/tf")
    bar.update("first", 1, 4)
    bar.update("first", 2, 4)
    bar.update("hot", 1, 4)
    bar.finish("ok")
    lines = out.getvalue().splitlines()
    assert len(lines) == 4
    assert lines[1].startswith("[1/2] w/tf first [#######")
    assert lines[-1].startswith("[1/2] w/tf: ok")


def test_compile_time_summary_lists_both_runs() -> None:
    lines = compile_time.summary(_results()["compile_time"])
    assert any(line.startswith("| cold |") for line in lines)
    assert any(line.startswith("| cached | c0 |") for line in lines)


def test_cli_bench_subcommand_shows_bench_options(capsys: pytest.CaptureFixture[str]) -> None:
    from disc_tf import cli

    assert cli.main(["bench", "--help"]) == 0
    assert "--workloads" in capsys.readouterr().out


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_redraws_in_place_on_a_terminal() -> None:
    out = _Terminal()
    bar = ProgressBar(1, out)
    bar.start("w/disc")
    for i in range(1, 5):
        bar.update("hot", i, 4)
    bar.finish("ok")
    text = out.getvalue()
    assert text.count("\n") == 1 and text.count("\r") == 6
    assert "[############################] 4/4 calls" in text
