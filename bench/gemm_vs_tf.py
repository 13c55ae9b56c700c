"""disc_tf's GEMM against TF's MatMul on BERT projection shapes, in one process.

    python -m bench.gemm_vs_tf                 # writes bench/GEMM.md (and prints it)
    python -m bench.gemm_vs_tf --out /tmp/g.md --shapes 16x768x768

Each case is ``relu(x @ W + b)`` with W and b variables (as in a model: disc_tf
packs W once, as ORT does), as a tf.function (TF's
oneDNN MatMul, with Grappler's fused bias + ReLU) and through ``disc_tf.jit``
(the RAL's GEMM with the bias + ReLU as its epilogue). Each is timed as the best
of 5 rounds of back-to-back calls; the ratio is TF time / disc time. Where
``bench/.venv-ort`` exists (``make bench-deps``), the same layer as an ONNX
MatMul + Add + Relu runs in ONNX Runtime there (a subprocess: its MLAS packs W
once per session), for an ORT column.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import time

import numpy as np

BENCH_DIR = pathlib.Path(__file__).resolve().parent
#: (m, k, n): BERT-base (768, FFN 3072) and BERT-small (256, FFN 1024) projections
DEFAULT_SHAPES = [(m, k, n) for k, n in [(768, 768), (768, 3072), (3072, 768), (256, 256),
                                         (256, 1024), (1024, 256)]
                  for m in (16, 64, 256, 1024)]


def _best_seconds(fn, x, calls: int, rounds: int = 5) -> float:
    for _ in range(3):
        fn(x)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn(x)
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def _dense_layer(w, b):
    """``relu(x @ w + b)`` with w and b captured (variables)."""
    import tensorflow as tf

    def dense(x):
        return tf.nn.relu(tf.matmul(x, w) + b)

    return dense


def measure(shapes: list[tuple[int, int, int]], seed: int = 0,
            calls: int | None = None) -> list[dict]:
    """One record per (m, k, n): seconds per call for TF and disc, GF/s, ratio.
    ``calls`` per round defaults to about 0.2 GFLOP of work (20 to 500 calls)."""
    import tensorflow as tf

    import disc_tf

    rng = np.random.default_rng(seed)
    records = []
    for m, k, n in shapes:
        w = tf.Variable(rng.standard_normal((k, n)).astype(np.float32))
        b = tf.Variable(rng.standard_normal(n).astype(np.float32))
        sig = [tf.TensorSpec([None, k], tf.float32)]

        dense = _dense_layer(w, b)
        tf_fn = tf.function(dense, input_signature=sig)
        disc_fn = disc_tf.jit(tf.function(dense, input_signature=sig))
        x = tf.constant(rng.standard_normal((m, k)).astype(np.float32))
        np.testing.assert_allclose(disc_fn(x).numpy(), tf_fn(x).numpy(), rtol=1e-3, atol=1e-3)
        per_round = calls or min(500, max(20, int(2e8 / (2 * m * k * n))))
        t_tf, t_disc = _best_seconds(tf_fn, x, per_round), _best_seconds(disc_fn, x, per_round)
        flops = 2.0 * m * k * n
        records.append({"m": m, "k": k, "n": n, "tf_s": t_tf, "disc_s": t_disc,
                        "tf_gflops": flops / t_tf / 1e9, "disc_gflops": flops / t_disc / 1e9,
                        "x_tf": t_tf / t_disc})
    return records


def ort_dense_session(rng: np.random.Generator, m: int, k: int, n: int,
                      threads: int) -> tuple:
    """An ONNX Runtime session of ``relu(x @ W + b)`` (MatMul + Add + Relu, W and b
    seeded from ``rng``) with ``threads`` intra-op threads, and its x [m, k], W, b.
    Runs where onnxruntime is installed (``bench/.venv-ort``)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    w = rng.standard_normal((k, n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["xw"]),
             helper.make_node("Add", ["xw", "b"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    graph = helper.make_graph(
        nodes, "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what the installed runtime reads
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session, rng.standard_normal((m, k)).astype(np.float32), w, b


def measure_ort(shapes: list[tuple[int, int, int]], seed: int = 0,
                calls: int | None = None) -> list[dict]:
    """ONNX Runtime's seconds per call of the same layers (run where onnxruntime is
    installed): one session per shape, as many intra-op threads as cores."""
    import os

    rng = np.random.default_rng(seed)
    records = []
    for m, k, n in shapes:
        session, x, w, b = ort_dense_session(rng, m, k, n, os.cpu_count() or 1)
        expected = np.maximum(x @ w + b, 0)
        np.testing.assert_allclose(session.run(None, {"x": x})[0], expected, rtol=1e-3, atol=1e-3)
        per_round = calls or min(500, max(20, int(2e8 / (2 * m * k * n))))
        t = _best_seconds(lambda v, s=session: s.run(None, {"x": v}), x, per_round)
        records.append({"m": m, "k": k, "n": n, "ort_s": t, "ort_gflops": 2.0 * m * k * n / t / 1e9})
    return records


def ort_records(shapes: list[tuple[int, int, int]]) -> list[dict] | None:
    """``measure_ort`` in the ORT venv's interpreter; None when it is not installed."""
    from bench.driver import peer_env, peer_python

    python = peer_python("ort")
    if python is None:
        return None
    spec = ",".join(f"{m}x{k}x{n}" for m, k, n in shapes)
    proc = subprocess.run([python, "-m", "bench.gemm_vs_tf", "--ort-worker", "--shapes", spec],
                          env=peer_env(), capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"ORT GEMM worker failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def to_markdown(records: list[dict], machine: str) -> str:
    """The report: one row per shape, then the range of ratios."""
    with_ort = all("ort_s" in r for r in records)
    lines = ["# disc_tf GEMM vs TF MatMul" + (" and ONNX Runtime" if with_ort else ""), "",
             f"- {machine}",
             "- `relu(x @ W + b)`, W and b variables; best of 5 rounds of back-to-back calls; "
             "`x TF` = TF time / disc time (> 1: disc faster)", "",
             "| m | k | n | TF us | TF GF/s | disc us | disc GF/s | x TF |"
             + (" ORT us | ORT GF/s | x ORT |" if with_ort else ""),
             "|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" * 3 if with_ort else "")]
    for r in records:
        row = (f"| {r['m']} | {r['k']} | {r['n']} | {r['tf_s'] * 1e6:.1f} | "
               f"{r['tf_gflops']:.0f} | {r['disc_s'] * 1e6:.1f} | {r['disc_gflops']:.0f} | "
               f"{r['x_tf']:.2f} |")
        if with_ort:
            row += f" {r['ort_s'] * 1e6:.1f} | {r['ort_gflops']:.0f} | {r['ort_s'] / r['disc_s']:.2f} |"
        lines.append(row)
    ratios = [r["x_tf"] for r in records]
    lines += ["", f"x TF: {min(ratios):.2f}-{max(ratios):.2f} over {len(records)} shapes; "
              f"{sum(x >= 0.95 for x in ratios)} of them at >= 0.95."]
    if with_ort:
        vs = [r["ort_s"] / r["disc_s"] for r in records]
        lines.append(f"x ORT (ORT time / disc time, > 1: disc faster): {min(vs):.2f}-{max(vs):.2f}.")
    return "\n".join(lines + [""])


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=pathlib.Path, default=BENCH_DIR / "GEMM.md")
    p.add_argument("--shapes", default="", help="comma-separated MxKxN (default: BERT shapes)")
    p.add_argument("--no-ort", action="store_true", help="skip the ONNX Runtime column")
    p.add_argument("--ort-worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    shapes = ([tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
              if args.shapes else DEFAULT_SHAPES)
    if args.ort_worker:  # inside the ORT venv: one JSON line of records
        print(json.dumps(measure_ort(shapes)))
        return 0
    from bench.machine import cpu_model

    records = measure(shapes)
    ort = None if args.no_ort else ort_records(shapes)
    for r, o in zip(records, ort or []):
        r.update(ort_s=o["ort_s"], ort_gflops=o["ort_gflops"])
    text = to_markdown(records, f"CPU: {cpu_model()}")
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
