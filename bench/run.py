"""Runs the benchmark: every workload through every peer, each peer in its own process.

    python -m bench.run                                  # default workloads, all peers
    python -m bench.run --workloads feature_normalizer --quick --peers tf,disc

Peers run one after another (never in parallel), each in a fresh process, with
their hot passes interleaved (``bench.driver``); the ``ort`` peer runs under
``bench/.venv-ort`` (``make bench-deps``). Writes
``<out-dir>/results.json``, a markdown report (``--report``, also printed) and,
when matplotlib is importable, a PNG plot next to the report.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
from typing import Any

from bench import driver
from bench import report as report_mod
from bench.peer import MEMORY_PEERS, PEERS
from bench.progress import ProgressBar

BENCH_DIR = driver.BENCH_DIR
REPO_ROOT = driver.REPO_ROOT

Record = dict[str, Any]


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo ("unknown" elsewhere)."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_gib() -> float | None:
    """Total memory from /proc/meminfo, in GiB."""
    try:
        for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError):
        pass
    return None


def git_revision() -> str | None:
    """The checked-out commit (with ``+dirty`` when the tree has changes).

    ``BENCH_COMMIT`` names it instead, for a tree exported without ``.git``.
    """
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (rev + ("+dirty" if dirty else "")) or None


def machine_info(tf_version: str) -> dict[str, Any]:
    """What the numbers were measured on."""
    import numpy as np

    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": memory_gib(),
        "commit": git_revision(),
        "python": platform.python_version(),
        "tensorflow": tf_version,
        "numpy": np.__version__,
        "platform": platform.platform(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def load_average() -> float | None:
    """The 1-minute load average (other work on the machine skews the timings)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of the benchmark."""
    from bench.workloads import DEFAULT_WORKLOADS, WORKLOADS

    p = argparse.ArgumentParser(prog="disc-tf bench", description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS),
                   help=f"comma-separated subset of {','.join(WORKLOADS)}")
    p.add_argument("--peers", default=",".join(PEERS),
                   help=f"comma-separated subset of {','.join(PEERS)} (tf gives the reference)")
    p.add_argument("--quick", action="store_true", help="short stream, for smoke tests")
    p.add_argument("--count", type=int, default=None, help="calls per pass (overrides --quick)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hot-repeats", type=int, default=3,
                   help="rounds of hot passes, alternating peers; each peer's best is reported")
    p.add_argument("--out-dir", type=pathlib.Path, default=BENCH_DIR / "out")
    p.add_argument("--report", type=pathlib.Path, default=BENCH_DIR / "RESULTS.md",
                   help="markdown report path (the PNG plot goes next to it)")
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="seconds a peer may take for setup + first pass, and for each hot pass")
    p.add_argument("--skip-compile-time", action="store_true",
                   help="skip the BERT layer cold/cached compile-time measurement")
    p.add_argument("--merge", action="store_true",
                   help="keep the other workloads of an existing <out-dir>/results.json")
    p.add_argument("--report-only", action="store_true",
                   help="rewrite the report and plot from <out-dir>/results.json")
    p.add_argument("--note", action="append", default=[],
                   help="a line for the report's notes (repeatable; kept in results.json)")
    args = p.parse_args(argv)
    args.workloads = [w for w in args.workloads.split(",") if w]
    args.peers = [x for x in args.peers.split(",") if x]
    for w in args.workloads:
        if w not in WORKLOADS:
            p.error(f"unknown workload {w!r}")
    for x in args.peers:
        if x not in PEERS:
            p.error(f"unknown peer {x!r}")
    if args.hot_repeats < 1:
        p.error("--hot-repeats must be >= 1")
    return args


def run_workloads(args: argparse.Namespace, count: int) -> tuple[dict[str, dict[str, Record]], bool]:
    """Every workload through every peer (see ``bench.driver``); returns records and a failure flag."""
    from bench.workloads import WORKLOADS

    out: dict[str, dict[str, Record]] = {}
    # The tf peer runs first: it writes the reference outputs the others compare to.
    order = sorted(args.peers, key=lambda x: x != "tf")
    steps = len(order) + 1 + sum(p in MEMORY_PEERS for p in order)  # + the memory passes
    bar = ProgressBar(steps * len(args.workloads))
    with tempfile.TemporaryDirectory(prefix="disc_bench_") as tmp:
        work = pathlib.Path(tmp)
        for name in args.workloads:
            model_dir = WORKLOADS[name].save(work / name / "model")
            records = driver.run_workload(name, order, model_dir, work / name, count, args.seed,
                                          args.hot_repeats, args.timeout, bar)
            report_mod.add_speedups(records)
            out[name] = records
    failed = any(r.get("status") not in ("ok", "not installed")
                 for records in out.values() for r in records.values())
    return out, failed


def write_report(results: dict[str, Any], report: pathlib.Path) -> str:
    """Writes the markdown report and (with matplotlib) the PNG next to it; returns the text."""
    report.parent.mkdir(parents=True, exist_ok=True)
    png = report.with_suffix(".png")
    text = report_mod.markdown_report(results, png.name if report_mod.plot(results, png) else None)
    report.write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark; returns non-zero if a peer failed."""
    args = parse_args(argv)
    results_path = args.out_dir / "results.json"
    if args.report_only:
        results = json.loads(results_path.read_text())
        if args.note:
            results["notes"] = args.note
            results_path.write_text(json.dumps(results, indent=1))
        print(write_report(results, args.report))
        return 0
    load_start = load_average()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from bench.workloads import FULL_STREAM, QUICK_STREAM

    count = args.count or (QUICK_STREAM if args.quick else FULL_STREAM)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    previous = json.loads(results_path.read_text()) if args.merge and results_path.exists() else {}
    results: dict[str, Any] = {
        "machine": {**machine_info(tf.__version__), "loadavg_start": load_start},
        "config": {"count": count, "seed": args.seed, "quick": args.quick,
                   "hot_repeats": args.hot_repeats,
                   "peers": args.peers, "workloads": args.workloads},
        "results": dict(previous.get("results", {})),
        "compile_time": previous.get("compile_time"),
        "notes": args.note,
    }
    if not args.skip_compile_time:
        from bench import compile_time

        print("[bench] compile time against XLA (cold, kernel-warm, cached) ...",
              file=sys.stderr, flush=True)
        results["compile_time"] = compile_time.measure(timeout=args.timeout)
    records, failed = run_workloads(args, count)
    results["results"].update(records)
    results["machine"]["loadavg_end"] = load_average()
    results_path.write_text(json.dumps(results, indent=1))
    print(write_report(results, args.report))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
