"""The RAL's GEMM microkernel against GEMM libraries: interleaved rounds, both ISAs.

How to run (as root on Debian 12; about 15 minutes on a 2-core machine)::

    bench/gemm_libs/setup.sh          # pinned libraries (idempotent)
    bench/gemm_libs/build.sh          # builds bench/gemm_libs/build/gemm_libs
    python3 bench/gemm_libs/run.py    # writes bench/gemm_libs/RESULTS.md (+ out/*.jsonl)
    python3 bench/gemm_libs/run.py --quick   # 3 rounds, a few shapes: a smoke test
    python3 bench/gemm_libs/run.py --from-jsonl   # only rewrite RESULTS.md from out/
    .venv/bin/python bench/gemm_libs/call_path.py --threads 2   # call path vs kernel
                                      # (from the repo root; writes CALL_PATH.md)

Findings are summarised in bench/GEMM.md, "Library study".

Each configuration (ISA path x threads) runs in its own process of the harness
(gemm_libs.cc), since the libraries read their ISA caps and thread counts
from the environment at start-up:

- ISA ``avx512``: the microkernel's AVX-512 entry, every library uncapped but
  BLIS, whose own pick on this CPU is ``zen3`` (AVX2 kernels): BLIS_ARCH_TYPE
  forces its ``skx`` (AVX-512) kernels;
- ISA ``avx2``: the microkernel's AVX2 entry, MKL_ENABLE_INSTRUCTIONS=AVX2,
  ONEDNN_MAX_CPU_ISA=AVX2, LIBXSMM_TARGET=hsw, BLIS_ARCH_TYPE=zen3;
- threads 1 or 2: OMP/MKL/BLIS_NUM_THREADS; the microkernel (and libxsmm,
  which has no threading of its own) split a product as the RAL does.

Within a process, every shape runs all candidates in rounds (each round: every
candidate once, a batch of back-to-back calls timed as a whole, after a short
idle gap); per shape the table gives each candidate's median per-round time and
the median, min and max of the per-round ratios disc time / library time
(> 1: the library is faster). A ratio whose min-max spread crosses 1.0 is a tie.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import statistics
import subprocess
import time

HERE = pathlib.Path(__file__).resolve().parent
BINARY = HERE / "build" / "gemm_libs"

#: (k, n): BERT-base (768, FFN 3072, fused QKV 2304) and BERT-small (256, FFN 1024)
BERT_KN = [(768, 768), (768, 3072), (3072, 768), (768, 2304), (256, 256), (256, 1024),
           (1024, 256), (256, 768)]
BERT_M = [1, 16, 64, 256, 1024]
#: bench.models.RecommenderTower: a 64-512-256-64 MLP on [batch 1-2048, 64]
TOWER_KN = [(64, 512), (512, 256), (256, 64)]
TOWER_M = [1, 64, 512, 2048]
SHAPES = ([(m, k, n) for k, n in BERT_KN for m in BERT_M]
          + [(m, k, n) for k, n in TOWER_KN for m in TOWER_M])
QUICK_SHAPES = [(16, 768, 768), (256, 768, 3072), (1, 256, 256), (2048, 512, 256)]

LIBS = ["mkl_packed", "mkl_sgemm", "xsmm", "blis", "dnnl_rt", "dnnl_fixed", "disc_variant"]
LABEL = {"disc": "disc microkernel", "mkl_packed": "MKL packed", "mkl_sgemm": "MKL sgemm",
         "xsmm": "libxsmm", "blis": "BLIS", "dnnl_rt": "oneDNN runtime-m",
         "dnnl_fixed": "oneDNN per-m", "disc_variant": "disc variant"}

CAPS = {
    "avx512": {"BLIS_ARCH_TYPE": "0"},  # skx
    "avx2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2",
             "LIBXSMM_TARGET": "hsw", "BLIS_ARCH_TYPE": "6"},  # zen3
}
CAP_VARS = ["MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
            "LIBXSMM_TARGET", "BLIS_ARCH_TYPE", "MKL_CBWR"]


def shape_class(m: int) -> str:
    """small (m <= 16), medium (64 <= m <= 512) or large (m >= 1024)."""
    return "small" if m <= 16 else "medium" if m <= 512 else "large"


def loadavg() -> str:
    return " ".join(pathlib.Path("/proc/loadavg").read_text().split()[:3])


def run_config(isa: str, threads: int, shapes, rounds: int, batch_ms: float,
               out: pathlib.Path) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k not in CAP_VARS}
    env.update(CAPS[isa])
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
        env[var] = str(threads)
    spec = ",".join(f"{m}x{k}x{n}" for m, k, n in shapes)
    cmd = [str(BINARY), "--isa", isa, "--threads", str(threads), "--rounds", str(rounds),
           "--batch-ms", str(batch_ms), "--shapes", spec]
    start = loadavg()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    records[0].update(load_start=start, load_end=loadavg(), caps=CAPS[isa])
    out.write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


def summarize(rec: dict) -> dict:
    """Per candidate: median seconds; per library: median/min/max of disc/lib per round."""
    disc = rec["cands"]["disc"]["s"]
    out = {"m": rec["m"], "k": rec["k"], "n": rec["n"], "calls": rec["calls"], "libs": {}}
    for name, c in rec["cands"].items():
        entry = {"median_s": statistics.median(c["s"]), "packed_bytes": c["packed_bytes"],
                 "err": c["err"], "note": c["note"]}
        if name != "disc":
            ratios = [d / s for d, s in zip(disc, c["s"])]
            entry.update(ratio=statistics.median(ratios), lo=min(ratios), hi=max(ratios))
        out["libs"][name] = entry
    return out


def verdict(e: dict) -> str:
    """'lib' (library faster in every round), 'disc' (disc faster in every round) or 'tie'."""
    return "lib" if e["lo"] > 1 else "disc" if e["hi"] < 1 else "tie"


def fmt_ratio(e: dict) -> str:
    mark = {"lib": "**", "disc": "", "tie": "~"}[verdict(e)]
    core = f"{e['ratio']:.2f} ({e['lo']:.2f}-{e['hi']:.2f})"
    return f"{mark}{core}{mark}" if mark == "**" else (f"~{core}" if mark == "~" else core)


def geomean(xs) -> float:
    xs = list(xs)
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def config_tables(info: dict, rows: list[dict]) -> list[str]:
    isa, threads = info["isa"], info["threads"]
    libs = [n for n in LIBS if n in rows[0]["libs"]]
    lines = [f"### ISA {isa} ({'native' if isa == 'avx512' else 'capped to AVX2'}), "
             f"{threads} thread{'s' if threads > 1 else ''}", "",
             f"- load average (1/5/15 min) at start {info.get('load_start', '?')}, at end "
             f"{info.get('load_end', '?')}",
             f"- caps: {info.get('caps', CAPS[isa])}; MKL {info.get('mkl', '-')}; libxsmm target "
             f"{info.get('libxsmm_target', '-')}; BLIS arch {info.get('blis_arch', '-')}; "
             f"oneDNN {info.get('onednn', '-')}",
             "- oneDNN implementations seen: "
             + "; ".join(sorted({f"{n}: {r['libs'][n]['note']}" for r in rows
                                 for n in ("dnnl_rt", "dnnl_fixed") if n in r["libs"]})), "",
             "| m | k | n | disc us | disc GF/s | " + " | ".join(LABEL[n] for n in libs)
             + " | fastest |",
             "|---:|---:|---:|---:|---:|" + "---|" * len(libs) + "---|"]
    for r in rows:
        d = r["libs"]["disc"]["median_s"]
        gf = 2.0 * r["m"] * r["k"] * r["n"] / d / 1e9
        best = min(r["libs"], key=lambda n: r["libs"][n]["median_s"])
        cells = [fmt_ratio(r["libs"][n]) for n in libs]
        lines.append(f"| {r['m']} | {r['k']} | {r['n']} | {d * 1e6:.1f} | {gf:.0f} | "
                     + " | ".join(cells) + f" | {LABEL[best]} |")
    lines.append("")
    return lines


def class_summary(configs: list[tuple[dict, list[dict]]]) -> list[str]:
    """Per config and shape class: each library's geomean ratio, range, wins/ties/losses."""
    lines = ["| ISA | threads | m class | " + " | ".join(LABEL[n] for n in LIBS) + " |",
             "|---|---:|---|" + "---|" * len(LIBS)]
    for info, rows in configs:
        for cls in ("small", "medium", "large"):
            sel = [r for r in rows if shape_class(r["m"]) == cls]
            if not sel:
                continue
            cells = []
            for n in LIBS:
                es = [r["libs"][n] for r in sel if n in r["libs"]]
                if not es:
                    cells.append("-")
                    continue
                v = [verdict(e) for e in es]
                cells.append(f"{geomean(e['ratio'] for e in es):.2f} "
                             f"[{min(e['ratio'] for e in es):.2f}-{max(e['ratio'] for e in es):.2f}] "
                             f"{v.count('lib')}/{v.count('tie')}/{v.count('disc')}")
            lines.append(f"| {info['isa']} | {info['threads']} | {cls} | " + " | ".join(cells) + " |")
    lines += ["", "Cells: geometric mean over the class's shapes of the median per-round ratio "
              "disc time / library time (> 1: library faster), [lowest-highest shape median], "
              "then shapes where the library won every round / tied (spread crosses 1.0) / "
              "lost every round.", ""]
    return lines


def memory_table(rows: list[dict]) -> list[str]:
    """Packed-B bytes kept per weight, relative to the raw k x n floats (one row per (k, n))."""
    seen, lines = set(), ["| k | n | raw KiB | " + " | ".join(LABEL[n] for n in ["disc", *LIBS])
                          + " |", "|---:|---:|---:|" + "---:|" * (len(LIBS) + 1)]
    for r in rows:
        key = (r["k"], r["n"])
        if key in seen:
            continue
        seen.add(key)
        raw = 4 * r["k"] * r["n"]
        sizes = []
        for n in ["disc", *LIBS]:
            vals = sorted({x["libs"][n]["packed_bytes"] for x in rows
                           if (x["k"], x["n"]) == key and n in x["libs"]})
            if not vals:
                sizes.append("-")
            elif vals == [0]:
                sizes.append("0")
            else:
                sizes.append("/".join(f"{v / raw:.2f}x" for v in sorted({vals[0], vals[-1]})))
        lines.append(f"| {r['k']} | {r['n']} | {raw / 1024:.0f} | " + " | ".join(sizes) + " |")
    lines += ["", "Bytes of B kept packed per weight, as a multiple of the raw k x n floats "
              "(a/b: smallest/largest over m, where the packed size depends on m); 0: none "
              "kept (the library packs inside every call).", ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--batch-ms", type=float, default=20.0)
    p.add_argument("--isa", default="avx512,avx2")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--quick", action="store_true", help="3 rounds on a few shapes")
    p.add_argument("--out", type=pathlib.Path, default=HERE / "RESULTS.md")
    p.add_argument("--from-jsonl", action="store_true",
                   help="only rewrite the report from out/*.jsonl of an earlier run")
    args = p.parse_args(argv)
    shapes, rounds = (QUICK_SHAPES, 3) if args.quick else (SHAPES, args.rounds)
    raw_dir = HERE / "out"
    raw_dir.mkdir(exist_ok=True)
    if not args.from_jsonl and not BINARY.exists():
        raise SystemExit(f"{BINARY} missing: run {HERE / 'build.sh'} first")
    configs = []
    started = time.time()
    for isa in args.isa.split(","):
        for threads in (int(t) for t in args.threads.split(",")):
            out = raw_dir / f"{isa}_t{threads}.jsonl"
            if args.from_jsonl:
                records = [json.loads(x) for x in out.read_text().splitlines() if x.startswith("{")]
            else:
                print(f"{isa} x {threads} thread(s): {len(shapes)} shapes, {rounds} rounds ...",
                      flush=True)
                records = run_config(isa, threads, shapes, rounds, args.batch_ms, out)
            configs.append((records[0], [summarize(r) for r in records[1:]]))
    info = configs[0][0]
    cpu = next((line.split(":", 1)[1].strip() for line in
                pathlib.Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "?")
    lines = ["# GEMM library study: raw tables", "",
             f"- CPU: {cpu}, {os.cpu_count()} cores; written by bench/gemm_libs/run.py "
             f"({rounds} interleaved rounds of ~{args.batch_ms:.0f} ms batches per candidate)",
             f"- versions: MKL {info.get('mkl', '-')}; libxsmm {info.get('libxsmm', '-')}; "
             f"BLIS {info.get('blis', '-')}; oneDNN {info.get('onednn', '-')}",
             "- cells: median per-round ratio disc time / library time (min-max over rounds); "
             "> 1: the library is faster; **bold**: faster in every round; ~: a tie (the "
             "spread crosses 1.0); plain: disc faster in every round", "",
             "## Per shape class", "", *class_summary(configs),
             "## Packed-weight memory", "", *memory_table(configs[0][1])]
    for info_c, rows in configs:
        lines += config_tables(info_c, rows)
    if not args.from_jsonl:
        lines.append(f"Measured in {time.time() - started:.0f} s.")
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
