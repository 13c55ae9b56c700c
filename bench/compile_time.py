"""Compile time against XLA's: one disc_tf compile costs how many XLA shape compiles?

    python -m bench.compile_time            # prints a JSON record, then the tables

For each model (BERT-small-like with 4 layers, BERT-base with 2), each step in a
fresh process, with its own ``DISC_TF_CACHE_DIR``:

- ``cold``: ``optimize`` with an empty cache (every stage and every C++ compile);
- ``kernel_warm``: ``optimize`` with the cache a sibling of the same family left
  (the same layers, fewer of them): its kernel objects are reused, the host runner
  and the link are not;
- ``cached``: ``optimize`` again with its own cache (the artifact is found whole);
- ``xla``: the SavedModel's function under ``tf.function(jit_compile=True)``, called
  at two new shapes and again at each: the difference is XLA's compile of one shape.

``break_even`` is the cold ``optimize`` time over XLA's compile of one shape: the
number of distinct shapes after which disc_tf has compiled less than XLA.
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

from bench import machine

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent

Record = dict[str, Any]

#: model -> (hidden, layers, heads, exact GELU, sibling's layers, description)
MODELS = {
    "bert_small": (256, 4, 4, False, 2, "BERT-small-like: 4 layers, hidden 256, 4 heads"),
    "bert_base_2l": (768, 2, 12, True, 1, "BERT-base: 2 layers, hidden 768, 12 heads"),
}
#: (batch, seq) of the two shapes XLA compiles
XLA_SHAPES = ((2, 128), (3, 96))

#: Targets (issue "compile in seconds"), 2 cores, empty cache.
BREAK_EVEN_TARGET = 5.0
KERNEL_WARM_TARGET_S = 3.0


def save_model(name: str, out_dir: str, sibling: bool = False) -> None:
    """Saves model ``name`` (or its sibling: fewer layers, other weights) with a
    ``serve`` function over ``[batch, seq, hidden]``."""
    import tensorflow as tf

    from bench.models import BertEncoder

    hidden, layers, heads, exact, sibling_layers, _ = MODELS[name]
    enc = BertEncoder(hidden, sibling_layers if sibling else layers, heads,
                      seed=7 if sibling else 0, exact_gelu=exact)
    enc.serve = tf.function(enc.encode, input_signature=[
        tf.TensorSpec([None, None, hidden], tf.float32, name="x")])
    tf.saved_model.save(enc, out_dir, signatures={"serving_default": enc.serve})


def optimize_timed(model_dir: str, out_dir: str) -> Record:
    """Optimizes ``model_dir`` in this process; returns the per-cluster compile profile."""
    from disc_tf.saved_model import optimize_saved_model

    t0 = time.perf_counter()
    report = optimize_saved_model(model_dir, out_dir)
    optimize_s = time.perf_counter() - t0
    clusters = [{
        "name": c.name, "ops": len(c.ops), "kernels": c.kernels,
        "distinct_kernels": c.distinct_kernels, "source_bytes": c.source_bytes,
        "from_cache": c.from_cache, "front_end_s": c.front_end_seconds,
        "cxx_compile_s": 0.0 if c.from_cache else c.compile_seconds,
        "units_compiled": c.units_compiled, "units_cached": c.units_cached,
        "unit_seconds": c.unit_seconds, "error": c.error,
    } for c in report.clusters]
    return {"optimize_s": optimize_s, "clusters": clusters, "profile": report.profile_line()}


def xla_timed(model_dir: str) -> Record:
    """XLA's compile of each of ``XLA_SHAPES``: first call minus a second call."""
    import numpy as np
    import tensorflow as tf

    model = tf.saved_model.load(model_dir)
    fn = tf.function(lambda x: model.serve(x), jit_compile=True)
    hidden = int(model.serve.function_spec.input_signature[0].shape[-1])
    compile_s, call_s = [], []
    for batch, seq in XLA_SHAPES:
        x = tf.constant(np.random.default_rng(0).standard_normal((batch, seq, hidden)), tf.float32)
        t0 = time.perf_counter()
        fn(x).numpy()
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        fn(x).numpy()
        again = time.perf_counter() - t0
        compile_s.append(first - again)
        call_s.append(again)
    return {"compile_s": compile_s, "call_s": call_s, "shapes": [list(s) for s in XLA_SHAPES]}


def _child(args: list[str], cache_dir: str | None, timeout: float) -> Record:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    if cache_dir is not None:
        env["DISC_TF_CACHE_DIR"] = cache_dir
    try:
        proc = subprocess.run([sys.executable, "-m", "bench.compile_time", *args], cwd=REPO_ROOT,
                              env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": f"error: timeout after {timeout:g}s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"status": f"error: exit code {proc.returncode}", "stderr_tail": proc.stderr[-2000:]}
    return {"status": "ok", **json.loads(lines[-1])}


def measure_model(name: str, work: pathlib.Path, timeout: float) -> Record:
    """Every step for one model (each a fresh process)."""
    model, sibling = str(work / name), str(work / f"{name}_sibling")
    for path, is_sibling in ((model, False), (sibling, True)):
        saved = _child(["--save", name, path] + (["--sibling"] if is_sibling else []), None, timeout)
        if saved["status"] != "ok":
            return {"status": f"save failed: {saved['status']}", "stderr_tail": saved.get("stderr_tail")}
    own, family = str(work / f"{name}_cache"), str(work / f"{name}_family_cache")
    record: Record = {"status": "ok", "description": MODELS[name][5]}
    record["cold"] = _child(["--optimize", model, str(work / f"{name}_cold")], own, timeout)
    record["cached"] = _child(["--optimize", model, str(work / f"{name}_cached")], own, timeout)
    _child(["--optimize", sibling, str(work / f"{name}_sib")], family, timeout)
    record["kernel_warm"] = _child(["--optimize", model, str(work / f"{name}_warm")], family,
                                   timeout)
    record["xla"] = _child(["--xla", model], None, timeout)
    cold, xla = record["cold"], record["xla"]
    if cold["status"] == "ok" and xla["status"] == "ok" and min(xla["compile_s"]) > 0:
        record["break_even"] = cold["optimize_s"] / (sum(xla["compile_s"]) / len(xla["compile_s"]))
    return record


def measure(timeout: float = 900.0, models: tuple[str, ...] = tuple(MODELS),
            isa: str | None = None) -> Record:
    """Measures every model of ``models``, in one run, side by side; ``isa`` names the code
    path the child processes take (default: the host's ISA, uncapped)."""
    with tempfile.TemporaryDirectory(prefix="disc_compile_time_") as tmp:
        return {"cores": os.cpu_count(), "isa": isa or machine.host_isa(),
                "models": {m: measure_model(m, pathlib.Path(tmp), timeout) for m in models}}


def _ok(value: float, target: float) -> str:
    return "ok" if value <= target else "**miss**"


def target_line(record: Record) -> str:
    """One line per model: cold optimize in XLA shape compiles, and the kernel-warm
    optimize, against the targets."""
    lines = []
    for name, rec in record.get("models", {}).items():
        if rec.get("status") != "ok" or "break_even" not in rec:
            statuses = {k: rec.get(k, {}).get("status") for k in ("cold", "xla")}
            lines.append(f"{name} compile time: {rec.get('status')} {statuses}.")
            continue
        warm = rec["kernel_warm"]
        warm_s = warm["optimize_s"] if warm.get("status") == "ok" else float("inf")
        lines.append(
            f"{name} ({record['cores']} cores, {record['isa']}): optimize cold "
            f"{rec['cold']['optimize_s']:.1f} s = {rec['break_even']:.2f} XLA shape compiles "
            f"(target <= {BREAK_EVEN_TARGET:g}: {_ok(rec['break_even'], BREAK_EVEN_TARGET)}); "
            f"with the kernels of a sibling cached {warm_s:.1f} s "
            f"(target <= {KERNEL_WARM_TARGET_S:g} s: {_ok(warm_s, KERNEL_WARM_TARGET_S)}).")
    return "\n".join(lines)


def summary(record: Record) -> list[str]:
    """Markdown lines for the report: the compile profile of every run, then XLA."""
    out = [f"{record.get('cores')} cores, {record.get('isa')}. Each run is a fresh process. "
           "`front end` is DHLO + fusion + codegen; `C++` the compiler and linker (0 from the "
           "cache); `kernels (distinct)` counts kernels whose code differs other than in names; "
           "`units` are the distinct kernels' translation units, compiled or from the kernel "
           "cache.",
           "",
           "| model | run | kernels (distinct) | units compiled / cached | KiB of code "
           "| front end s | C++ s | optimize s |",
           "|---|---|---:|---:|---:|---:|---:|---:|"]
    xla = ["", "| model | XLA compile of one shape s | disc_tf cold optimize s "
               "| break-even shapes |", "|---|---:|---:|---:|"]
    for name, rec in record.get("models", {}).items():
        for label in ("cold", "kernel_warm", "cached"):
            run = rec.get(label, {})
            if run.get("status") != "ok":
                out.append(f"| {name} | {label} | {run.get('status', rec.get('status'))} "
                           "| | | | | |")
                continue
            cs = run["clusters"]
            failed = [c for c in cs if c["error"] is not None]
            kernels = f"{sum(c['kernels'] for c in cs)} ({sum(c['distinct_kernels'] for c in cs)})"
            units = (f"{sum(c['units_compiled'] for c in cs)} / "
                     f"{sum(c['units_cached'] for c in cs)}")
            note = f" ({len(failed)} failed)" if failed else ""
            out.append(f"| {name} | {label}{note} | {kernels} | {units} | "
                       f"{sum(c['source_bytes'] for c in cs) / 1024:.0f} | "
                       f"{sum(c['front_end_s'] for c in cs):.2f} | "
                       f"{sum(c['cxx_compile_s'] for c in cs):.2f} | {run['optimize_s']:.2f} |")
        x = rec.get("xla", {})
        if x.get("status") == "ok" and "break_even" in rec:
            per_shape = ", ".join(f"{s:.2f}" for s in x["compile_s"])
            xla.append(f"| {name} | {per_shape} | {rec['cold']['optimize_s']:.2f} "
                       f"| {rec['break_even']:.2f} |")
        else:
            xla.append(f"| {name} | {x.get('status', rec.get('status'))} | | |")
    return out + xla


def main(argv: list[str] | None = None) -> int:
    """Runs every model; ``--save``/``--optimize``/``--xla`` are the child steps."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--save", nargs=2, metavar=("MODEL", "DIR"), help=argparse.SUPPRESS)
    p.add_argument("--sibling", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--optimize", nargs=2, metavar=("MODEL_DIR", "OUT"), help=argparse.SUPPRESS)
    p.add_argument("--xla", metavar="MODEL_DIR", help=argparse.SUPPRESS)
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated, of: "
                   + ", ".join(MODELS))
    args = p.parse_args(argv)
    if args.save:
        save_model(*args.save, sibling=args.sibling)
        print(json.dumps({"saved": args.save[1]}))
        return 0
    if args.optimize:
        print(json.dumps(optimize_timed(*args.optimize)))
        return 0
    if args.xla:
        print(json.dumps(xla_timed(args.xla)))
        return 0
    record = measure(models=tuple(m for m in args.models.split(",") if m))
    print(json.dumps(record, indent=1))
    print("\n".join(summary(record)))
    print(target_line(record))
    return 0 if all(r.get("status") == "ok" for r in record["models"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
