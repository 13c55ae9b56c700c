"""Runs the benchmark: every workload through every peer, each peer in its own process.

    python -m bench.run                                  # all workloads, all peers
    python -m bench.run --workloads feature_normalizer --quick --peers tf,disc

Writes ``<out-dir>/results.json``, a markdown report (``--report``, also printed)
and, when matplotlib is importable, ``<out-dir>/hot_pass.png``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
from typing import Any

from bench.peer import PEERS

BENCH_DIR = pathlib.Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent

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


def machine_info(tf_version: str) -> dict[str, Any]:
    """What the numbers were measured on."""
    import numpy as np

    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
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


def run_peer(peer: str, workload: str, model_dir: pathlib.Path, work: pathlib.Path,
             count: int, seed: int, ref: pathlib.Path | None, write_ref: bool,
             timeout: float) -> Record:
    """Runs ``python -m bench.peer`` in a fresh process; returns its record."""
    out = work / f"{workload}.{peer}.json"
    cmd = [sys.executable, "-m", "bench.peer", "--peer", peer, "--workload", workload,
           "--model-dir", str(model_dir), "--out", str(out), "--seed", str(seed),
           "--count", str(count)]
    if ref is not None:
        cmd += ["--ref", str(ref)]
    if write_ref:
        cmd.append("--write-ref")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    try:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"peer": peer, "workload": workload, "status": f"error: timeout after {timeout}s"}
    if out.exists():
        record = json.loads(out.read_text())
    else:
        record = {"peer": peer, "workload": workload,
                  "status": f"error: exit code {proc.returncode}"}
    if record.get("status") not in ("ok", "not installed"):
        record["stderr_tail"] = proc.stderr[-2000:]
        print(f"[bench] {workload}/{peer} failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
    return record


def add_speedups(records: dict[str, Record]) -> None:
    """Adds speedup ratios vs the tf peer (tf seconds / peer seconds; > 1 is faster)."""
    base = records.get("tf")
    if not base or base.get("status") != "ok":
        return
    for rec in records.values():
        if rec.get("status") != "ok":
            continue
        for key, name in (("first_pass_s", "speedup_first"), ("hot_pass_s", "speedup_hot")):
            if rec.get(key):
                rec[name] = base[key] / rec[key]
        if rec.get("first_pass_s"):
            rec["speedup_setup_first"] = (
                (base["setup_s"] + base["first_pass_s"]) / (rec["setup_s"] + rec["first_pass_s"])
            )


def _num(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


COLUMNS = (
    ("peer", "peer", None),
    ("setup s", "setup_s", ".3f"),
    ("first pass s", "first_pass_s", ".3f"),
    ("hot pass s", "hot_pass_s", ".4f"),
    ("hot p50 ms", "hot_p50_ms", ".3f"),
    ("hot p99 ms", "hot_p99_ms", ".3f"),
    ("compiles", "compiles", "d"),
    ("peak RSS MiB", "peak_rss_mb", ".0f"),
    ("max abs err", "max_abs_err", ".2e"),
    ("x TF first", "speedup_first", ".2f"),
    ("x TF hot", "speedup_hot", ".2f"),
    ("x TF setup+first", "speedup_setup_first", ".2f"),
)


def markdown_table(records: dict[str, Record]) -> str:
    """One workload's peers as a markdown table."""
    lines = ["| " + " | ".join(c[0] for c in COLUMNS) + " |",
             "|" + "|".join("---" if c[2] is None else "---:" for c in COLUMNS) + "|"]
    for peer, rec in records.items():
        if rec.get("status") != "ok":
            lines.append(f"| {peer} | {rec.get('status')} |" + " |" * (len(COLUMNS) - 2))
            continue
        cells = [peer] + [_num(rec.get(key), fmt) for _, key, fmt in COLUMNS[1:]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def findings(records: dict[str, Record]) -> list[str]:
    """Plain-language flags: peers slower than TF, errors, fallbacks, disc amortisation."""
    notes: list[str] = []
    base = records.get("tf", {})
    for peer, rec in records.items():
        if peer == "tf" or rec.get("status") != "ok":
            continue
        for key, label in (("speedup_first", "first pass"), ("speedup_hot", "hot pass")):
            ratio = rec.get(key)
            if ratio is not None and ratio < 1.0:
                slower = (f"{100.0 * (1.0 / ratio - 1.0):.0f}% slower" if ratio > 0.5
                          else f"{1.0 / ratio:.1f}x slower")
                notes.append(f"{peer} {label} is {slower} than TF.")
        err = rec.get("max_abs_err")
        if err is not None and err > 1e-4:
            notes.append(f"{peer} max abs error {err:.2e} exceeds 1e-4.")
        stats = rec.get("disc_stats") or {}
        if stats.get("fallbacks"):
            notes.append(f"{peer}: {stats['fallbacks']} cluster fallback(s) to TF ops.")
        if rec.get("failed_clusters"):
            notes.append(f"{peer}: clusters left as TF ops: {rec['failed_clusters']}.")
        # Only disc compiles once for all shapes; XLA pays again for every new shape.
        if (peer == "disc" and base.get("status") == "ok" and rec.get("hot_pass_s")
                and rec.get("num_calls")):
            saved = (base["hot_pass_s"] - rec["hot_pass_s"]) / rec["num_calls"]
            extra = rec["setup_s"] + rec["first_pass_s"] - base["setup_s"] - base["first_pass_s"]
            if saved > 0 and extra > 0:
                notes.append(f"{peer} pays back its extra setup + first pass ({extra:.2f} s) "
                             f"after ~{extra / saved:.0f} hot calls "
                             f"({saved * 1e3:.3f} ms saved per call).")
    return notes


def markdown_report(results: dict[str, Any]) -> str:
    """The full report: machine, configuration, one table per workload."""
    from bench.workloads import WORKLOADS

    m = results["machine"]
    cfg = results["config"]
    out = [
        "# disc_tf benchmark results",
        "",
        f"- CPU: {m['cpu']} ({m['cores']} cores)",
        f"- TensorFlow {m['tensorflow']}, numpy {m['numpy']}, Python {m['python']}",
        f"- Date: {m['date']}",
        f"- 1-min load average at start / end: {m.get('loadavg_start')} / "
        f"{m.get('loadavg_end')} (> 0 before the run means other work shared the cores)",
        f"- Stream: {cfg['count']} calls per pass, seed {cfg['seed']}"
        + (" (quick)" if cfg["quick"] else ""),
        "",
        "Times are sums of per-call wall time over the stream; setup is load (tf, xla) "
        "or optimize + load with an empty artifact cache (disc). `x TF` columns are "
        "TF time / peer time (> 1 = faster than TF). `compiles`: XLA traces "
        "(one per distinct shape) or disc cluster compilations.",
    ]
    for name, records in results["results"].items():
        any_rec = next(iter(records.values()), {})
        out += ["", f"## {name}", "", WORKLOADS[name].description + ".", ""]
        if "distinct_shapes" in any_rec:
            out += [f"{any_rec['num_calls']} calls, {any_rec['distinct_shapes']} distinct "
                    "shapes.", ""]
        disc = records.get("disc", {})
        if disc.get("status") == "ok":
            out += [f"disc: {disc['clusters']} cluster(s) of {disc.get('cluster_ops')} ops; "
                    f"optimize {disc['optimize_s']:.2f} s; first call "
                    f"{disc['first_call_s'] * 1e3:.1f} ms; stats {disc.get('disc_stats')}.", ""]
        out.append(markdown_table(records))
        notes = findings(records)
        if notes:
            out += [""] + [f"- {n}" for n in notes]
    return "\n".join(out) + "\n"


def plot(results: dict[str, Any], path: pathlib.Path) -> bool:
    """Bar chart of hot-pass totals per workload and peer; False without matplotlib."""
    if importlib.util.find_spec("matplotlib") is None:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(results["results"])
    peers = [p for p in PEERS
             if any(results["results"][w].get(p, {}).get("status") == "ok" for w in workloads)]
    fig, ax = plt.subplots(figsize=(2.5 + 2.5 * len(workloads), 4))
    width = 0.8 / max(len(peers), 1)
    for i, peer in enumerate(peers):
        values = [results["results"][w].get(peer, {}).get("hot_pass_s") or 0.0
                  for w in workloads]
        ax.bar([k + i * width for k in range(len(workloads))], values, width, label=peer)
    ax.set_xticks([k + width * (len(peers) - 1) / 2 for k in range(len(workloads))])
    ax.set_xticklabels(workloads)
    ax.set_ylabel("hot pass total (s)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of the benchmark."""
    from bench.workloads import WORKLOADS

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default=",".join(WORKLOADS),
                   help=f"comma-separated subset of {','.join(WORKLOADS)}")
    p.add_argument("--peers", default=",".join(PEERS),
                   help=f"comma-separated subset of {','.join(PEERS)} (tf gives the reference)")
    p.add_argument("--quick", action="store_true", help="short stream, for smoke tests")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", type=pathlib.Path, default=BENCH_DIR / "out")
    p.add_argument("--report", type=pathlib.Path, default=BENCH_DIR / "RESULTS.md",
                   help="markdown report path")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per peer process")
    args = p.parse_args(argv)
    args.workloads = [w for w in args.workloads.split(",") if w]
    args.peers = [x for x in args.peers.split(",") if x]
    for w in args.workloads:
        if w not in WORKLOADS:
            p.error(f"unknown workload {w!r}")
    for x in args.peers:
        if x not in PEERS:
            p.error(f"unknown peer {x!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark; returns non-zero if a peer failed."""
    args = parse_args(argv)
    load_start = load_average()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from bench.workloads import FULL_STREAM, QUICK_STREAM, WORKLOADS

    count = QUICK_STREAM if args.quick else FULL_STREAM
    args.out_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "machine": {**machine_info(tf.__version__), "loadavg_start": load_start},
        "config": {"count": count, "seed": args.seed, "quick": args.quick,
                   "peers": args.peers, "workloads": args.workloads},
        "results": {},
    }
    failed = False
    # The tf peer runs first: it writes the reference outputs the others compare to.
    order = sorted(args.peers, key=lambda x: x != "tf")
    with tempfile.TemporaryDirectory(prefix="disc_bench_") as tmp:
        work = pathlib.Path(tmp)
        for name in args.workloads:
            model_dir = WORKLOADS[name].save(work / name / "model")
            ref = work / name / "ref.npz" if "tf" in args.peers else None
            records: dict[str, Record] = {}
            for peer in order:
                print(f"[bench] {name}: {peer} ...", file=sys.stderr, flush=True)
                records[peer] = run_peer(peer, name, model_dir, work / name, count, args.seed,
                                         ref, peer == "tf", args.timeout)
                failed |= records[peer].get("status") not in ("ok", "not installed")
            add_speedups(records)
            results["results"][name] = records
    results["machine"]["loadavg_end"] = load_average()
    (args.out_dir / "results.json").write_text(json.dumps(results, indent=1))
    report = markdown_report(results)
    png = args.out_dir / "hot_pass.png"
    if plot(results, png):
        report += f"\nPlot: `{os.path.relpath(png, args.report.parent)}`.\n"
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(report)
    print(report)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
