"""Compile time of one BERT-base encoder layer cluster: cold, then from the artifact cache.

    python -m bench.compile_time            # prints a JSON record

A one-layer ``BertBase`` SavedModel is optimized twice, each time in a fresh
process: first with an empty ``DISC_TF_CACHE_DIR`` (cold: every stage plus the
C++ compile), then with the same cache (the artifact is found by content hash,
so there is no C++ compile). Per cluster it records the report's compile profile:
the front end (DHLO, fusion, codegen), the C++ compile alone (0 from the cache),
bytes of generated code, and kernels against distinct kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent

Record = dict[str, Any]


def optimize_timed(model_dir: str, out_dir: str) -> Record:
    """Optimizes ``model_dir`` in this process; returns the per-cluster compile profile."""
    start = time.perf_counter()
    from disc_tf.saved_model import optimize_saved_model

    imported = time.perf_counter()
    t0 = time.perf_counter()
    report = optimize_saved_model(model_dir, out_dir)
    optimize_s = time.perf_counter() - t0
    clusters = [{
        "name": c.name, "body": c.body, "ops": len(c.ops), "kernels": c.kernels,
        "distinct_kernels": c.distinct_kernels, "source_bytes": c.source_bytes,
        "from_cache": c.from_cache, "front_end_s": c.front_end_seconds,
        "cxx_compile_s": 0.0 if c.from_cache else c.compile_seconds,
        "cluster_build_s": c.front_end_seconds + c.compile_seconds, "error": c.error,
    } for c in report.clusters]
    return {"import_s": imported - start, "optimize_s": optimize_s, "clusters": clusters,
            "profile": report.profile_line()}


def _child(model_dir: str, cache_dir: str, out_dir: str, timeout: float) -> Record:
    env = dict(os.environ, DISC_TF_CACHE_DIR=cache_dir,
               TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    proc = subprocess.run(
        [sys.executable, "-m", "bench.compile_time", "--child", model_dir, out_dir],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"status": f"error: exit code {proc.returncode}", "stderr_tail": proc.stderr[-2000:]}
    return {"status": "ok", **json.loads(lines[-1])}


def measure(timeout: float = 600.0) -> Record:
    """Saves a one-layer BERT-base model and optimizes it cold, then from cache."""
    from bench.models import BertBase

    with tempfile.TemporaryDirectory(prefix="disc_compile_time_") as tmp:
        work = pathlib.Path(tmp)
        model = BertBase(layers=1)
        model_dir = str(work / "model")
        import tensorflow as tf

        tf.saved_model.save(model, model_dir, signatures={"serving_default": model.__call__})
        cache = str(work / "cache")
        cold = _child(model_dir, cache, str(work / "cold"), timeout)
        warm = _child(model_dir, cache, str(work / "warm"), timeout)
    return {"model": "bert_base, 1 encoder layer (768 hidden, 12 heads, FFN 3072)",
            "cores": os.cpu_count(), "cold": cold, "cached": warm}


#: Target: a BERT encoder layer cluster compiles in at most this many seconds, cold, on 2 cores.
COLD_TARGET_S = 10.0


def target_line(record: Record) -> str:
    """One line: the cold build and the cached compile against the targets."""
    cold, cached = record.get("cold", {}), record.get("cached", {})
    if cold.get("status") != "ok" or cached.get("status") != "ok":
        return f"BERT layer compile time: cold {cold.get('status')}, cached {cached.get('status')}."
    cold_s = sum(c["cluster_build_s"] or 0.0 for c in cold["clusters"])
    cached_cxx = sum(c["cxx_compile_s"] for c in cached["clusters"])
    all_cached = all(c["from_cache"] for c in cached["clusters"])
    ok_cold = "ok" if cold_s <= COLD_TARGET_S else "**miss**"
    ok_cached = "ok" if all_cached and cached_cxx == 0.0 else "**miss**"
    return (f"BERT-base encoder layer cluster, {record['cores']} cores: cold build {cold_s:.2f} s "
            f"(target <= {COLD_TARGET_S:g} s: {ok_cold}); from cache {cached_cxx:.2f} s of C++ compile "
            f"(target 0 s: {ok_cached}).")


def summary(record: Record) -> list[str]:
    """Markdown lines for the report."""
    out = [f"Model: {record['model']}; {record['cores']} cores. Each run is a fresh process; "
           "`front end` is DHLO + fusion + codegen, `C++ compile` the compiler alone (0 from the "
           "cache); `kernels (distinct)` counts kernels whose code differs other than in names.",
           "",
           "| run | cluster | ops | kernels (distinct) | KiB of code | from cache | front end s "
           "| C++ compile s | optimize s |",
           "|---|---|---:|---:|---:|---|---:|---:|---:|"]
    for label in ("cold", "cached"):
        rec = record.get(label, {})
        if rec.get("status") != "ok":
            out.append(f"| {label} | {rec.get('status')} | | | | | | | |")
            continue
        for c in rec["clusters"]:
            if c["error"] is not None:
                out.append(f"| {label} | {c['name']} | {c['ops']} | - | - | "
                           f"FAILED: {c['error'][:80]} | | | |")
                continue
            out.append(f"| {label} | {c['name']} | {c['ops']} | {c['kernels']} "
                       f"({c['distinct_kernels']}) | {c['source_bytes'] / 1024:.0f} | "
                       f"{c['from_cache']} | {c['front_end_s']:.2f} | {c['cxx_compile_s']:.2f} | "
                       f"{rec['optimize_s']:.2f} |")
    return out


def main(argv: list[str] | None = None) -> int:
    """``--child MODEL OUT`` optimizes in this process; otherwise runs both children."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", nargs=2, metavar=("MODEL", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(optimize_timed(*args.child)))
        return 0
    record = measure()
    print(json.dumps(record, indent=1))
    print("\n".join(summary(record)))
    return 0 if record["cold"].get("status") == record["cached"].get("status") == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
