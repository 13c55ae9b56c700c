"""Fast checks of the benchmark's parts: workloads, streams, report, progress bar, CLI hook."""

from __future__ import annotations

import io
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from bench import compile_time, driver, peer, report
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


def test_real_model_streams() -> None:
    tokens = next(WORKLOADS["gpt2_decoder"].stream(0, 1))
    assert tokens.dtype == np.int32 and tokens.ndim == 2 and 8 <= tokens.shape[1] <= 256
    assert 0 <= tokens.min() and tokens.max() < 1000
    images = WORKLOADS["mobilenet_v2"].shapes(0, FULL_STREAM)
    assert all(1 <= b <= 4 and 96 <= h <= 224 and 96 <= w <= 224 and c == 3
               for b, h, w, c in images)
    assert len(set(images)) >= 0.9 * FULL_STREAM


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
        "tf": rec("tf", 1.0, 0.8, peak_act_mb=10.0, alloc_peak_mb=40.0,
                  hot_pass_runs_s=[0.8, 0.9, 1.0]),
        "xla": rec("xla", 20.0, 0.7, compiles=47, memory_status="error: timeout after 9s"),
        "disc": rec("disc", 0.7, 0.5, hot_pass_runs_s=[0.5, 0.6, 0.5], compiles=1, clusters=1,
                    cluster_ops=[40], optimize_s=2.0,
                    failed_clusters=["disc_cluster_1"], failed_cluster_errors=["boom"],
                    disc_stats={"fallbacks": 0}, peak_act_mb=15.0, alloc_peak_mb=30.25,
                    peak_act_shape=[4, 256, 768]),
        "ort": {"peer": "ort", "status": "not installed"},
    }
    report.add_speedups(records)
    return {
        "machine": {"cpu": "test cpu", "cores": 2, "python": "3", "tensorflow": "2", "numpy": "2",
                    "date": "today"},
        "config": {"count": 48, "seed": 0, "quick": False},
        "results": {"bert_base": records},
        "compile_time": {"cores": 2, "isa": "AVX2", "models": {
            "m": {"status": "ok", "description": "d", "break_even": 0.5,
                  "cold": {"status": "ok", "optimize_s": 2.0, "clusters": [_cluster(False, 4, 0)]},
                  "kernel_warm": {"status": "ok", "optimize_s": 0.9,
                                  "clusters": [_cluster(False, 0, 4)]},
                  "cached": {"status": "ok", "optimize_s": 0.3, "clusters": [_cluster(True, 0, 0)]},
                  "xla": {"status": "ok", "compile_s": [3.9, 4.1], "call_s": [0.1, 0.1]}},
            "n": {"status": "ok", "cold": {"status": "error: x"}, "xla": {"status": "ok"}}}},
    }


def _cluster(from_cache: bool, compiled: int, cached: int) -> dict:
    return {"name": "c0", "ops": 60, "kernels": 17, "distinct_kernels": 9, "source_bytes": 40960,
            "from_cache": from_cache, "front_end_s": 0.2, "cxx_compile_s": 0.0 if from_cache else 1.5,
            "units_compiled": compiled, "units_cached": cached, "error": None}


def test_report_tables_targets_and_fallbacks() -> None:
    results = _results()
    text = report.markdown_report(results, "plot.png")
    # per-round ratios tf/disc: 1.6, 1.5, 2.0 -> median 1.6 (1.5-2.0)
    assert "| bert_base | 1.60x (1.50-2.00) ok | n/a | 1.43x ok | 28.57x ok |" in text
    assert "1 failed to compile" in text
    assert "cluster disc_cluster_1 left as TF ops: boom" in text
    assert "| ort | not installed |" in text
    assert "![speedups over TF](plot.png)" in text
    assert "| m | cached | 17 (9) | 0 / 0 | 40 | 0.20 | 0.00 | 0.30 |" in text
    assert "| n | cold | error: x | | | | | |" in text
    assert "m (2 cores, AVX2): optimize cold 2.0 s = 0.50 XLA shape compiles" in text


def test_report_says_when_avx512_was_hidden_from_the_peers() -> None:
    results = _results()
    results["machine"]["isa"] = "AVX-512"
    assert "AVX-512); " in report.markdown_report(results)
    results["machine"]["isa_cap"] = "x86-64-v3"
    results["machine"]["isa_caps"] = {"disc": "DISC_TF_ISA=x86-64-v3",
                                      "all": "AVX-512 hidden from CPUID by hide_avx512.so"}
    text = report.markdown_report(results)
    assert "AVX-512, hidden from every peer's CPUID: all ran their AVX2 paths)" in text
    assert "- Code paths capped at x86-64-v3: disc: DISC_TF_ISA=x86-64-v3; all: AVX-512" in text


def test_report_calls_a_spread_across_one_a_tie() -> None:
    results = _results()
    records = results["results"]["bert_base"]
    records["ort"] = {**records["tf"], "peer": "ort", "hot_pass_runs_s": [0.45, 0.7, 0.75]}
    report.add_speedups(records)
    # ort/disc per round: 0.9, 1.1667, 1.5 -> the spread crosses 1.0
    assert records["disc"]["rounds_vs_ort"]["verdict"] == "tie"
    text = report.markdown_report(results)
    assert "| 1.17x (0.90-1.50) **tie** |" in text
    records["tf"]["round_loads"] = [1.5, 0.25, None]
    assert "start of each hot round: 1.50, 0.25, -." in report.markdown_report(results)
    records["ort"]["hot_pass_runs_s"] = [0.55, 0.65, 0.56]  # 1.1, 1.083, 1.12
    assert "| 1.10x (1.08-1.12) ok |" in report.markdown_report(results)  # bert_base: >= 1.05
    results["results"]["bert_small"] = results["results"].pop("bert_base")
    assert "| 1.10x (1.08-1.12) **miss** |" in report.markdown_report(results)  # >= 1.15


def test_round_ratio_pairs_rounds_and_judges_targets() -> None:
    from bench import rounds

    ratio = rounds.round_ratio([1.0, 2.0, 1.0, 1.0], [1.2, 2.6, 1.5])  # 3 common rounds
    assert ratio is not None and ratio.rounds == 3
    assert (ratio.median, ratio.low, ratio.high) == pytest.approx((1.3, 1.2, 1.5))
    assert ratio.verdict == "faster" and ratio.meets(1.3) == "ok" and ratio.meets(1.4) == "miss"
    slower = rounds.round_ratio([2.0, 2.0], [1.0, 1.5])
    assert slower is not None and slower.verdict == "slower" and slower.meets(1.0) == "miss"
    assert rounds.round_ratio([], [1.0]) is None


def test_hot_rounds_reverse_the_peer_order_every_other_round() -> None:
    peers = ["tf", "xla", "disc", "ort"]
    orders = [driver.round_order(peers, r) for r in range(4)]
    assert orders[0] == orders[2] == peers
    assert orders[1] == orders[3] == ["ort", "disc", "xla", "tf"]

    def before(order: list[str]) -> dict[str, str]:
        return {b: a for a, b in zip(order, order[1:])}

    # Over a pair of rounds no peer runs right after the same neighbour both times.
    first, second = before(orders[0]), before(orders[1])
    assert all(first[p] != second.get(p) for p in first)
    assert peers == ["tf", "xla", "disc", "ort"]  # the caller's list is left as it was


def test_report_shows_peak_activation_memory() -> None:
    text = report.markdown_report(_results())
    assert "| peak RSS MiB | peak act MiB | alloc peak MiB |" in text
    assert "| 500 | 10.0 | 40.0 |" in text  # tf
    assert "| 500 | - | - |" in text  # xla: its memory pass failed
    assert "| 500 | 15.0 | 30.2 |" in text  # disc
    assert "peak act / TF (<= 1) |" in text and "| 1.50x **miss** | 1 failed" in text
    assert ("disc peak activation memory is 15.0 MiB, 1.50x TF's 10.0 MiB "
            "(at input [4, 256, 768]).") in text
    assert "xla: memory pass error: timeout after 9s." in text
    results = _results()
    results["results"]["bert_base"]["disc"]["peak_act_mb"] = 9.0
    assert report.activation_ratio(results["results"]["bert_base"]) == pytest.approx(0.9)
    assert "| 0.90x ok |" in report.markdown_report(results)


def test_activation_summary_takes_the_largest_increase() -> None:
    mib = 2**20
    samples = [((1, 8), 10 * mib, 13 * mib), ((2, 8), 12 * mib, 16 * mib), ((1, 9), 20 * mib,
                                                                          21 * mib)]
    assert peer.activation_summary(samples) == {
        "peak_act_mb": 4.0, "peak_act_shape": [2, 8], "alloc_peak_mb": 21.0}
    assert peer.activation_summary([])["peak_act_mb"] is None


def test_measure_activations_counts_kept_scratch_as_the_calls(
        monkeypatch: pytest.MonkeyPatch) -> None:
    mib = 2**20
    held = {"current": 30 * mib, "peak": 30 * mib}
    kept = {"bytes": 0}

    def call(x: object) -> None:  # reuses 4 MiB kept by the last call, allocates 1 MiB more
        held["peak"] = max(held["peak"], held["current"] + 1 * mib)
        kept["bytes"] = 4 * mib

    monkeypatch.setattr(tf.config.experimental, "reset_memory_stats",
                        lambda device: held.update(peak=held["current"]))
    monkeypatch.setattr(tf.config.experimental, "get_memory_info", lambda device: dict(held))
    got = peer.measure_activations(call, [np.zeros((2, 3), np.float32)], lambda x: x,
                                   kept=lambda: kept["bytes"])
    assert got["peak_act_mb"] == 5.0
    assert peer.measure_activations(call, [np.zeros((2, 3), np.float32)],
                                    lambda x: x)["peak_act_mb"] == 1.0


def test_measure_memory_runs_a_separate_bfc_process(tmp_path: pathlib.Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def fake_run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        seen.append(cmd)
        out = pathlib.Path(cmd[cmd.index("--out") + 1])
        record = {"status": "ok", "peak_act_mb": 3.5, "peak_act_shape": [1, 8],
                  "alloc_peak_mb": 9.0, "setup_s": 1.0}
        out.write_text(json.dumps(record))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(driver.subprocess, "run", fake_run)
    fields = driver.measure_memory("disc", "w", tmp_path / "m", tmp_path, 4, 0, 10.0)
    assert fields == {"peak_act_mb": 3.5, "peak_act_shape": [1, 8], "alloc_peak_mb": 9.0}
    assert "--measure-memory" in seen[0] and "--interleave" not in seen[0]

    def failing_run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        out = pathlib.Path(cmd[cmd.index("--out") + 1])
        out.write_text(json.dumps({"status": "error: ValueError: x"}))
        return subprocess.CompletedProcess(cmd, 1)

    monkeypatch.setattr(driver.subprocess, "run", failing_run)
    assert driver.measure_memory("tf", "w2", tmp_path / "m", tmp_path, 4, 0, 10.0) == {
        "memory_status": "error: ValueError: x"}


def test_measure_memory_flag_sets_the_bfc_allocator(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv(peer.BFC_ENV, "false")  # restored after the test
    seen: dict[str, str | None] = {}

    def fake_run_peer(args: object) -> dict:
        import os

        seen["env"] = os.environ.get(peer.BFC_ENV)
        return {"peer": "tf", "workload": "w", "status": "ok"}

    monkeypatch.setattr(peer, "run_peer", fake_run_peer)
    out = tmp_path / "r.json"
    assert peer.main(["--peer", "tf", "--workload", "w", "--model-dir", "m", "--out", str(out),
                      "--measure-memory"]) == 0
    assert seen["env"] == "true"


def test_compile_time_target_line() -> None:
    line = compile_time.target_line(_results()["compile_time"])
    assert "= 0.50 XLA shape compiles (target <= 5: ok)" in line
    assert "with the kernels of a sibling cached 0.9 s (target <= 3 s: ok)" in line
    assert "n compile time: ok {'cold': 'error: x', 'xla': 'ok'}." in line


def test_compile_time_names_the_code_path_its_children_take(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import machine, run

    monkeypatch.setattr(machine, "host_isa", lambda: "AVX-512")
    plain = run.parse_args([])
    assert run.isa_label(plain) == "AVX-512"
    assert run.isa_label(run.parse_args(["--isa", "x86-64-v3"])) == "AVX-512 capped at x86-64-v3"
    hidden = run.parse_args(["--hide-avx512"])
    hidden.isa = "x86-64-v3"  # as main() sets it before the compile-time children start
    label = run.isa_label(hidden)
    assert label == "AVX-512 hidden from CPUID: AVX2 paths"
    assert compile_time.measure(models=(), isa=label)["isa"] == label
    assert compile_time.measure(models=())["isa"] == "AVX-512"


def test_plot_writes_png(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # matplotlib from the venv's plot-lib, where `make install` puts it (outside
    # site-packages: tests/requirements-plot.txt says why)
    monkeypatch.setattr(sys, "path", list(sys.path))  # plot() appends PLOT_LIB
    png = tmp_path / "r.png"
    assert report.plot(_results(), png), f"no matplotlib in {report.PLOT_LIB} or site-packages"
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


def test_compile_time_summary_lists_every_run_and_xla() -> None:
    lines = compile_time.summary(_results()["compile_time"])
    assert "| m | cold | 17 (9) | 4 / 0 | 40 | 0.20 | 1.50 | 2.00 |" in lines
    assert "| m | kernel_warm | 17 (9) | 0 / 4 | 40 | 0.20 | 1.50 | 0.90 |" in lines
    assert "| m | 3.90, 4.10 | 2.00 | 0.50 |" in lines
    assert "| n | ok | | |" in lines


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


def test_gemm_vs_tf_measures_and_reports_one_shape() -> None:
    from bench import gemm_vs_tf

    records = gemm_vs_tf.measure([(5, 16, 24)], calls=3)
    assert len(records) == 1 and records[0]["tf_s"] > 0 and records[0]["disc_s"] > 0
    text = gemm_vs_tf.to_markdown(records, "CPU: test")
    assert "| 5 | 16 | 24 |" in text and "over 1 shapes" in text
    assert gemm_vs_tf.DEFAULT_SHAPES and all(len(s) == 3 for s in gemm_vs_tf.DEFAULT_SHAPES)
    assert "ORT" not in text  # no ORT records: no ORT columns


def test_reads_in_place_measures_both_paths() -> None:
    from bench import reads_in_place

    records = reads_in_place.measure(1, shapes=[(2, 8)])
    assert len(records) == 2 and all(r["on"] > 0 and r["off"] > 0 and r["tf"] > 0 for r in records)
    text = reads_in_place.table(records, "test")
    assert "embeddings + layer norm (gather) | 2 x 8 |" in text and "shifted sequence (pad)" in text


def test_gemm_report_with_ort_column() -> None:
    from bench import gemm_vs_tf

    record = {"m": 4, "k": 8, "n": 16, "tf_s": 2e-5, "disc_s": 1e-5, "tf_gflops": 0.1,
              "disc_gflops": 0.2, "x_tf": 2.0, "ort_s": 5e-6, "ort_gflops": 0.4}
    text = gemm_vs_tf.to_markdown([record], "CPU: test")
    assert "| ORT us | ORT GF/s | x ORT |" in text
    assert "| 4 | 8 | 16 | 20.0 | 0 | 10.0 | 0 | 2.00 | 5.0 | 0 | 0.50 |" in text
    assert "x ORT (ORT time / disc time, > 1: disc faster): 0.50-0.50." in text


def test_gpu_script_dry_run_finds_everything_it_uses():
    """bench/gpu.sh --dry-run: every module, flag, workload, pin and test path the GPU
    run uses exists here (the script cannot rot between GPU machines)."""
    repo = pathlib.Path(__file__).resolve().parents[2]
    proc = subprocess.run(["bash", str(repo / "bench" / "gpu.sh"), "--dry-run"], cwd=repo,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.rstrip().endswith("gpu.sh --dry-run: ok")
    assert "DISC_TF_TARGET=cuda" in proc.stdout and "--note GPU:" in proc.stdout


def test_per_request_report_takes_medians_per_request() -> None:
    from bench.per_request import report

    shapes = [(4, 8), (1, 8), (2, 8)]
    times = {"disc": [[1.0, 0.1, 0.2], [3.0, 0.3, 0.2], [2.0, 0.2, 0.2]],
             "ort": [[2.0, 0.1, 0.4], [2.0, 0.1, 0.4], [9.0, 0.1, 0.4]]}
    text = report(["disc", "ort"], shapes, times)
    rows = [line for line in text.splitlines() if line.startswith("| ") and "x8" in line]
    # by input size: 1x8 (request 1), 2x8 (request 2), 4x8 (request 0)
    assert [r.split("|")[1].strip() for r in rows] == ["1", "2", "0"]
    assert rows[0].split("|")[3:6] == [" 200.00 ", " 100.00 ", " 0.50 "]
    assert rows[2].split("|")[3:6] == [" 2000.00 ", " 2000.00 ", " 1.00 "]
    assert "disc 2.400 s, ort 2.500 s; ort / disc = 1.042 (per request 0.50-2.00" in text
    assert "Pass totals, ort: 2.500, 2.500, 9.500" in text
    # per pass: 2.5 / 1.3, 2.5 / 3.5, 9.5 / 2.4
    assert "Per pass, ort total / disc total: median 1.923 (0.714-3.958)." in text


def test_per_request_passes_alternate_and_each_follows_a_pause() -> None:
    """A B, B A, ...: and before every pass the settle pause, so that the other peer's
    polling pool threads are quiet when a pass starts."""
    from bench.per_request import alternate

    events: list[str] = []

    def run_pass(peer: str) -> list[float]:
        events.append(peer)
        return [len(events) / 10]

    times = alternate(["disc", "ort"], 3, run_pass, 0.25,
                      sleep=lambda s: events.append(f"sleep {s}"))
    assert events == ["sleep 0.25", "disc", "sleep 0.25", "ort", "sleep 0.25", "ort",
                      "sleep 0.25", "disc", "sleep 0.25", "disc", "sleep 0.25", "ort"]
    assert times == {"disc": [[0.2], [0.8], [1.0]], "ort": [[0.4], [0.6], [1.2]]}


def test_per_request_requests_take_turns_and_each_follows_a_pause() -> None:
    """Request by request: A B on request 0 of pass 0, B A on request 1, and the order
    flips from one pass to the next; the settle pause before every turn."""
    from bench.per_request import alternate_requests

    events: list[str] = []

    def run_request(peer: str, i: int) -> float:
        events.append(f"{peer}{i}")
        return float(len(events))

    times = alternate_requests(["disc", "ort"], 2, 2, run_request, 0.5,
                               sleep=lambda s: events.append(f"sleep {s}"))
    turns = [e for e in events if not e.startswith("sleep")]
    assert turns == ["disc0", "ort0", "ort1", "disc1", "ort0", "disc0", "disc1", "ort1"]
    assert events.count("sleep 0.5") == 8 and events[0] == "sleep 0.5"
    assert all(events[i].startswith("sleep") for i in range(0, 16, 2))
    assert times == {"disc": [[2.0, 8.0], [12.0, 14.0]], "ort": [[4.0, 6.0], [10.0, 16.0]]}


def _run_worker(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                tmp_path: pathlib.Path, stdin: str, shapes: str
                ) -> tuple[list[tuple[int, ...] | str], list[str]]:
    """A tf per_request worker on ``shapes`` fed ``stdin``: the shapes it called and its
    garbage collections ("gc"), in order, and its stdout lines."""
    import argparse
    import gc
    import tempfile

    from bench import per_request

    calls: list[tuple[int, ...] | str] = []
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append("gc"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the worker's work dir
    monkeypatch.setattr(peer, "setup_tf", lambda model_dir, result: (
        lambda x: calls.append(tuple(x.shape))))
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    args = argparse.Namespace(worker="tf", model_dir="unused", workload="bert_small",
                              count=len(shapes.split(";")), seed=0, shapes=shapes)
    assert per_request.worker(args) == 0
    return calls, capsys.readouterr().out.splitlines()


def test_per_request_worker_times_one_request_after_the_one_before(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: pathlib.Path) -> None:
    """``request i``: a garbage collection, the stream's request i - 1 untimed (the last
    one before request 0), then request i alone, timed, with no collection between."""
    calls, out = _run_worker(monkeypatch, capsys, tmp_path, "request 0\nrequest 2\nstop\n",
                             "1,2;3,4;5,6")
    assert calls == ["gc", (1, 2), (3, 4), (5, 6)] + ["gc", (5, 6), (1, 2)] + [
        "gc", (3, 4), (5, 6)]
    assert out[0] == "@ready" and [len(json.loads(line)) for line in out[1:]] == [1, 1]


def test_per_request_worker_wakes_its_peer_before_each_timed_pass(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: pathlib.Path) -> None:
    """The worker's first pass is untimed; each ``go`` then collects garbage and calls the
    first request once, untimed, before the timed pass, whose times alone it prints."""
    calls, out = _run_worker(monkeypatch, capsys, tmp_path, "go\ngo\nstop\n", "1,2;3,4")
    assert calls == ["gc", (1, 2), (3, 4)] + ["gc", (1, 2), (1, 2), (3, 4)] * 2
    assert out[0] == "@ready" and [len(json.loads(line)) for line in out[1:]] == [2, 2]


def test_per_request_names_the_machine_and_its_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """The report says what it ran on: CPU, ISA (and a hidden AVX-512), cores, the load at
    both ends and the commit."""
    from bench import machine, per_request

    monkeypatch.setattr(machine, "cpu_model", lambda: "Some CPU")
    monkeypatch.setattr(machine, "host_isa", lambda: "AVX2")
    monkeypatch.setattr(machine, "git_revision", lambda: "abc1234")
    line = per_request.machine_line(False, 0.5, 1.25)
    assert line.startswith("Machine: Some CPU, AVX2, ")
    assert "load 0.5 at the start, 1.25 at the end; commit abc1234" in line
    assert "AVX-512 hidden" in per_request.machine_line(True, None, None)
