"""Conv1D paths raced, interleaved: the windowed GEMM, Winograd F(2, 3), F(4, 3), F(6, 3).

Each round runs one process per path (``DISC_TF_WINOGRAD=0`` / ``2`` / ``4`` / ``6``; the RAL
reads it once per process) over the same Conv1D shapes, each conv + bias + ReLU compiled
once with a variable filter and timed as the best of ``--repeats`` calls per width.
Reports per shape each path's median time over the rounds and, against the first path,
the median of the per-round ratios (first path's time / this path's) with their range; a
range that crosses 1.0 is a tie.

    python -m bench.conv_winograd --rounds 5 [--paths 2,4] [--isa avx2]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]

#: (kernel width, input channels, output channels): FastSpeech2's feed-forward conv and
#: its variance predictor's.
SHAPES = [(9, 256, 1024), (3, 256, 256)]
WIDTHS = [16, 32, 64, 96, 128, 200, 400, 800]

#: DISC_TF_WINOGRAD values and what they run.
PATHS = {"0": "windowed", "2": "F(2, 3)", "4": "F(4, 3)", "6": "F(6, 3)"}

_CHILD = r"""
import json, sys, time
import numpy as np, tensorflow as tf
import disc_tf

shapes, widths, repeats = json.loads(sys.argv[1])
rng = np.random.default_rng(0)
out = {}
for kw, ci, co in shapes:
    w = tf.Variable((rng.standard_normal((kw, ci, co)) / np.sqrt(kw * ci)).astype(np.float32))
    b = tf.Variable(rng.standard_normal(co).astype(np.float32))
    fn = tf.function(lambda x: tf.nn.relu(tf.nn.conv1d(x, w, 1, "SAME") + b),
                     input_signature=[tf.TensorSpec([None, None, ci], tf.float32)])
    jitted = disc_tf.jit(fn, min_cluster_size=1)
    assert jitted.report.compiled, jitted.report
    for t in widths:
        x = tf.constant(rng.standard_normal((1, t, ci)).astype(np.float32))
        jitted(x)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            jitted(x)
            best = min(best, time.perf_counter() - start)
        out[f"{kw} {ci} {co} {t}"] = best * 1e3
print("RESULT", json.dumps(out))
"""


def _one_pass(path: str, repeats: int, gemm_isa: str | None) -> dict[str, float]:
    env = dict(os.environ, DISC_TF_WINOGRAD=path, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    if gemm_isa:
        env["DISC_TF_GEMM_ISA"] = gemm_isa
        if gemm_isa == "avx2":
            env["DISC_TF_ISA"] = "x86-64-v3"
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps([SHAPES, WIDTHS, repeats])],
                          env=env, capture_output=True, text=True, check=True)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
    return json.loads(line.split(" ", 1)[1])


def main(argv: list[str] | None = None) -> None:
    """Runs the rounds and prints a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--isa", choices=["avx2", "avx512"], default=None,
                        help="cap the RAL's GEMM block (default: the CPU's best)")
    parser.add_argument("--paths", default="0,2,4",
                        help="DISC_TF_WINOGRAD values to race, the first the reference: "
                        + ", ".join(f"{k} {v}" for k, v in PATHS.items()))
    args = parser.parse_args(argv)
    paths = args.paths.split(",")
    if len(paths) < 2 or any(p not in PATHS for p in paths):
        parser.error(f"--paths: two or more of {', '.join(PATHS)}")
    runs: dict[str, list[dict[str, float]]] = {p: [] for p in paths}
    for r in range(args.rounds):
        for p in paths:
            runs[p].append(_one_pass(p, args.repeats, args.isa))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    ref, others = paths[0], paths[1:]
    print("| kw, ci -> co | T | " + " | ".join(f"{PATHS[p]} ms" for p in paths) + " | "
          + " | ".join(f"{PATHS[ref]} / {PATHS[p]} (range)" for p in others) + " |")
    print("|---|---:|" + "---:|" * len(paths) + "---|" * len(others))
    for key in runs[ref][0]:
        kw, ci, co, t = key.split()
        times = " | ".join(f"{statistics.median(run[key] for run in runs[p]):.3f}" for p in paths)
        cells = []
        for p in others:
            ratios = [a[key] / b[key] for a, b in zip(runs[ref], runs[p])]
            verdict = "" if min(ratios) > 1.0 or max(ratios) < 1.0 else " tie"
            cells.append(f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
                         f"{verdict}")
        print(f"| {kw}, {ci} -> {co} | {t} | {times} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
