"""Conv1D as Winograd F(2, 3) against the windowed GEMM, interleaved.

Each round runs one process per path (``DISC_TF_WINOGRAD=1`` / ``0``; the RAL reads it
once per process) over the same Conv1D shapes, each conv + bias + ReLU compiled once with
a variable filter and timed as the best of ``--repeats`` calls per width. Reports per
shape the median over rounds of the per-round ratio (windowed time / Winograd time) with
its range; a range that crosses 1.0 is a tie.

    python -m bench.conv_winograd --rounds 5 [--isa avx2]
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
WIDTHS = [16, 64, 200, 400, 800]

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


def _one_pass(winograd: bool, repeats: int, gemm_isa: str | None) -> dict[str, float]:
    env = dict(os.environ, DISC_TF_WINOGRAD="1" if winograd else "0", PYTHONPATH=str(REPO),
               TF_CPP_MIN_LOG_LEVEL="2")
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
    args = parser.parse_args(argv)
    wino, direct = [], []
    for r in range(args.rounds):
        wino.append(_one_pass(True, args.repeats, args.isa))
        direct.append(_one_pass(False, args.repeats, args.isa))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print("| kw, ci -> co | T | windowed ms | Winograd ms | ratio (range) |")
    print("|---|---:|---:|---:|---|")
    for key in wino[0]:
        kw, ci, co, t = key.split()
        ratios = [d[key] / w[key] for w, d in zip(wino, direct)]
        verdict = "" if min(ratios) > 1.0 or max(ratios) < 1.0 else " tie"
        print(f"| {kw}, {ci} -> {co} | {t} | {statistics.median(d[key] for d in direct):.3f} | "
              f"{statistics.median(w[key] for w in wino):.3f} | {statistics.median(ratios):.2f} "
              f"({min(ratios):.2f}-{max(ratios):.2f}){verdict} |")


if __name__ == "__main__":
    main()
