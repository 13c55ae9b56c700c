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
import json
import os
import pathlib
import sys
import tempfile
from typing import Any

from bench import driver, machine
from bench import report as report_mod
from bench.peer import MEMORY_PEERS, PEERS
from bench.progress import ProgressBar

BENCH_DIR = driver.BENCH_DIR
REPO_ROOT = driver.REPO_ROOT

Record = dict[str, Any]


#: Per x86-64 level, the environment that caps each peer's code path at it.
ISA_CAPS = {
    "x86-64-v3": {"DISC_TF_ISA": "x86-64-v3", "ONEDNN_MAX_CPU_ISA": "AVX2",
                  "XLA_FLAGS": "--xla_cpu_max_isa=AVX2"},
    "x86-64": {"DISC_TF_ISA": "x86-64", "ONEDNN_MAX_CPU_ISA": "SSE41",
               "XLA_FLAGS": "--xla_cpu_max_isa=SSE4_2"},
}


def cap_isa(level: str) -> dict[str, str]:
    """Sets the environment the peers inherit so that they run ``level``'s code path;
    returns what each peer was capped by (ort's MLAS dispatches on CPUID alone)."""
    env = ISA_CAPS[level]
    for key, value in env.items():
        if key == "XLA_FLAGS" and os.environ.get(key):
            value = f"{os.environ[key]} {value}"
        os.environ[key] = value
    return {"disc": f"DISC_TF_ISA={env['DISC_TF_ISA']} (kernels and RAL GEMM)",
            "tf": f"ONEDNN_MAX_CPU_ISA={env['ONEDNN_MAX_CPU_ISA']} (oneDNN kernels; Eigen "
                  "as built)",
            "xla": f"XLA_FLAGS={env['XLA_FLAGS']}",
            "ort": "not capped (MLAS picks its kernels from CPUID)"}


def isa_label(args: argparse.Namespace) -> str:
    """The code path the peers' processes take: the host's ISA, and the cap or the hiding
    of AVX-512 that ``--isa`` / ``--hide-avx512`` put on them."""
    isa = machine.host_isa()
    if args.hide_avx512:
        return f"{isa} hidden from CPUID: AVX2 paths"
    return f"{isa} capped at {args.isa}" if args.isa else isa


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
    p.add_argument("--hot-repeats", type=int, default=7,
                   help="rounds of hot passes, alternating peers; ratios are the median of "
                        "per-round ratios, with their spread")
    p.add_argument("--isa", choices=sorted(ISA_CAPS), default=None,
                   help="cap the peers' code paths at this x86-64 level (disc: DISC_TF_ISA; "
                        "tf's oneDNN and XLA by their own caps; ort cannot be capped)")
    p.add_argument("--hide-avx512", action="store_true",
                   help="hide AVX-512 from every peer's CPUID (bench/hide_avx512.py), ort "
                        "included, and cap the others at x86-64-v3: all peers' AVX2 paths")
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
    load_start = machine.load_average()
    if args.hide_avx512:
        from bench import hide_avx512

        args.isa = "x86-64-v3"
        caps = cap_isa(args.isa)
        caps["all"] = f"AVX-512 hidden from CPUID by {pathlib.Path(hide_avx512.enable()).name}"
        caps["ort"] = "MLAS takes its AVX2 kernels (AVX-512 hidden from CPUID)"
    else:
        caps = cap_isa(args.isa) if args.isa else {}
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from bench.workloads import FULL_STREAM, QUICK_STREAM

    count = args.count or (QUICK_STREAM if args.quick else FULL_STREAM)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    previous = json.loads(results_path.read_text()) if args.merge and results_path.exists() else {}
    results: dict[str, Any] = {
        "machine": {**machine.machine_info(tf.__version__), "loadavg_start": load_start,
                    "isa_caps": caps},
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
        results["compile_time"] = compile_time.measure(timeout=args.timeout,
                                                       isa=isa_label(args))
    records, failed = run_workloads(args, count)
    results["results"].update(records)
    results["machine"]["loadavg_end"] = machine.load_average()
    results_path.write_text(json.dumps(results, indent=1))
    print(write_report(results, args.report))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
