"""Call path vs kernel: what a relu(x @ W + b) call costs around the GEMM itself.

    .venv/bin/python bench/gemm_libs/call_path.py --threads 1   # from the repo root,
    .venv/bin/python bench/gemm_libs/call_path.py --threads 2   # after build.sh
    # each writes out/call_path_t<N>.json, then CALL_PATH.md from every such file

``--threads N`` sets TF's intra-op pool (so disc_tf's GEMM split), ORT's
intra-op threads and the bare kernel's split alike.

Per shape, in interleaved rounds (each round: every path once, a batch of
back-to-back calls timed as a whole after a short idle gap), the same layer
through: TF (a tf.function: Grappler's fused MatMul + bias + ReLU on oneDNN),
``disc_tf.jit`` (the same tf.function rewritten to DiscCluster ops, called
through TF's function runtime), ``disc_tf.load`` (an optimized SavedModel whose
cluster op is executed directly, without the function runtime) and, where
``bench/.venv-ort`` exists, ONNX Runtime (MatMul + Add + Relu, in a worker
process that times its own batches), interleaved with batches of the bare
microkernel (AVX-512 entry, N threads with the RAL's split) that the harness
(build/gemm_libs --serve) times on the same shape. Overhead: the median over
rounds of path time - kernel time in the same round.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
ORT_PYTHON = REPO / "bench" / ".venv-ort" / "bin" / "python"
#: a tiny layer (the call path alone), then m = 16 on the BERT projections
SHAPES = [(1, 4, 4)] + [(16, k, n) for k, n in [(768, 768), (768, 3072), (3072, 768),
                                                (768, 2304), (256, 256), (256, 1024),
                                                (1024, 256), (256, 768)]]

ORT_WORKER = r"""
import json, sys, time
import numpy as np
import onnxruntime as ort
from bench.gemm_vs_tf import ort_dense_session
session = x = None
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd["op"] == "setup":
        session, x, _, _ = ort_dense_session(np.random.default_rng(0), cmd["m"], cmd["k"],
                                             cmd["n"], cmd["threads"])
        for _ in range(5):
            session.run(None, {"x": x})
        print(json.dumps({"ok": True, "version": ort.__version__}), flush=True)
    else:
        calls = cmd["calls"]
        start = time.perf_counter()
        for _ in range(calls):
            session.run(None, {"x": x})
        print(json.dumps({"s": (time.perf_counter() - start) / calls}), flush=True)
"""


class OrtWorker:
    """ONNX Runtime in its own venv's interpreter, driven line by line."""

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO))  # the worker imports bench.gemm_vs_tf
        self.proc = subprocess.Popen([str(ORT_PYTHON), "-c", ORT_WORKER], env=env,
                                     stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.version = None

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def setup(self, m: int, k: int, n: int, threads: int) -> None:
        self.version = self.ask(op="setup", m=m, k=k, n=n, threads=threads)["version"]

    def batch(self, calls: int) -> float:
        return self.ask(op="run", calls=calls)["s"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def make_paths(m: int, k: int, n: int, workdir: pathlib.Path):
    """(x, {name: fn}) for TF, disc_tf.jit and disc_tf.load on one layer."""
    import tensorflow as tf

    import disc_tf

    rng = np.random.default_rng(0)

    class Dense(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable(rng.standard_normal((k, n)).astype(np.float32))
            self.b = tf.Variable(rng.standard_normal(n).astype(np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, k], tf.float32)])
        def __call__(self, x):
            return tf.nn.relu(tf.matmul(x, self.w) + self.b)

    module = Dense()
    x = tf.constant(rng.standard_normal((m, k)).astype(np.float32))
    jit_fn = disc_tf.jit(tf.function(lambda v: tf.nn.relu(tf.matmul(v, module.w) + module.b),
                                     input_signature=[tf.TensorSpec([None, k], tf.float32)]))
    saved, optimized = workdir / f"dense_{k}x{n}", workdir / f"dense_{k}x{n}_disc"
    tf.saved_model.save(module, str(saved))
    disc_tf.optimize(str(saved), str(optimized), quiet=True)
    loaded = disc_tf.load(str(optimized))
    paths = {"tf": module.__call__, "disc_jit": jit_fn, "disc_load": loaded}
    want = module(x).numpy()
    for name, fn in paths.items():
        np.testing.assert_allclose(fn(x).numpy(), want, rtol=1e-3, atol=1e-3, err_msg=name)
    direct = loaded.direct_functions()
    return x, paths, direct


def timed_batch(fn, x, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(x)
    return (time.perf_counter() - start) / calls


class KernelWorker:
    """build/gemm_libs --serve: batches of the bare microkernel on request."""

    def __init__(self, threads: int) -> None:
        self.proc = subprocess.Popen(
            [str(HERE / "build" / "gemm_libs"), "--serve", "--isa", "avx512", "--threads",
             str(threads)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.shape = (1, 1, 1)

    def batch(self, calls: int) -> float:
        m, k, n = self.shape
        self.proc.stdin.write(f"{m} {k} {n} {calls}\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def render() -> str:
    """CALL_PATH.md from every out/call_path_t<N>.json."""
    us = lambda s: f"{s * 1e6:.1f}"  # noqa: E731
    lines = ["# Call path vs kernel: relu(x @ W + b)", "",
             "Written by bench/gemm_libs/call_path.py. Per thread count: the median of "
             "interleaved rounds per path; kernel: the bare disc_gemm_prepacked_block_avx512 "
             "product (no bias/ReLU) in build/gemm_libs --serve with the RAL's split; overhead: "
             "the median over rounds of (path time - kernel time that round).", ""]
    for f in sorted((HERE / "out").glob("call_path_t*.json")):
        data = json.loads(f.read_text())
        meta, rows = data["meta"], data["rows"]
        has_ort = meta["ort"] is not None
        lines += [f"## {meta['threads']} thread(s)", "",
                  f"- TF {meta['tf']}, disc_tf {meta['disc_tf']}"
                  + (f", ONNX Runtime {meta['ort']}" if has_ort else "")
                  + f"; {meta['rounds']} rounds; load average at start {meta['load_start']}, "
                  f"at end {meta['load_end']}", "",
                  "| m | k | n | kernel us | TF us | disc_tf.jit us | jit overhead | "
                  "disc_tf.load us | load overhead |"
                  + (" ORT us | ORT - kernel |" if has_ort else ""),
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if has_ort else "")]
        for r in rows:
            s, o = r["s"], r["over"]
            line = (f"| {r['m']} | {r['k']} | {r['n']} | {us(s['kernel'])} | {us(s['tf'])} | "
                    f"{us(s['disc_jit'])} | {us(o['disc_jit'])} | {us(s['disc_load'])} | "
                    f"{us(o['disc_load'])} |")
            if has_ort:
                line += f" {us(s['ort'])} | {us(o['ort'])} |"
            lines.append(line)
        lines += ["", "disc_tf.load direct plans: " + "; ".join(sorted(
            {f"{k}: {v or 'direct'}" for r in rows for k, v in r["direct"].items()})), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--batch-ms", type=float, default=20.0)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--out", type=pathlib.Path, default=HERE / "CALL_PATH.md")
    args = p.parse_args(argv)
    sys.path.insert(0, str(REPO))
    import tensorflow as tf

    threads = args.threads
    tf.config.threading.set_intra_op_parallelism_threads(threads)  # before TF starts
    import disc_tf
    load_start = " ".join(pathlib.Path("/proc/loadavg").read_text().split()[:3])
    ort = OrtWorker() if ORT_PYTHON.exists() else None
    kernels = {"kernel": KernelWorker(threads)}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for m, k, n in SHAPES:
            x, paths, direct = make_paths(m, k, n, pathlib.Path(tmp))
            names = list(paths) + list(kernels)
            for worker in kernels.values():
                worker.shape = (m, k, n)
                worker.batch(3)  # packs B, warms up
            if ort is not None:
                ort.setup(m, k, n, threads)
                names.append("ort")
            for fn in paths.values():  # warm up
                for _ in range(5):
                    fn(x)
            one = min(timed_batch(paths["disc_jit"], x, 5) for _ in range(3))
            calls = int(min(5000, max(5, args.batch_ms * 1e-3 / one)))
            times = {name: [] for name in names}
            for r in range(args.rounds):
                for j in range(len(names)):
                    name = names[(j + r) % len(names)]
                    time.sleep(0.01)
                    if name == "ort":
                        times[name].append(ort.batch(calls))
                    elif name in kernels:
                        times[name].append(kernels[name].batch(calls))
                    else:
                        times[name].append(timed_batch(paths[name], x, calls))
            rows.append({"m": m, "k": k, "n": n, "calls": calls, "direct": direct,
                         "s": {name: statistics.median(v) for name, v in times.items()},
                         "rounds": times})
            print(f"{m}x{k}x{n}: " + ", ".join(f"{name} {statistics.median(v) * 1e6:.1f} us"
                                             for name, v in times.items()), flush=True)
    if ort is not None:
        ort.close()
    for worker in kernels.values():
        worker.close()
    load_end = " ".join(pathlib.Path("/proc/loadavg").read_text().split()[:3])
    for r in rows:
        t = r["rounds"]
        r["over"] = {name: statistics.median(a - b for a, b in zip(t[name], t["kernel"]))
                     for name in t if not name.startswith("kernel")}
    (HERE / "out").mkdir(exist_ok=True)
    meta = {"threads": threads, "rounds": args.rounds, "load_start": load_start,
            "load_end": load_end, "tf": tf.__version__, "disc_tf": disc_tf.__version__,
            "ort": ort.version if ort is not None else None}
    (HERE / "out" / f"call_path_t{threads}.json").write_text(
        json.dumps({"meta": meta, "rows": rows}, indent=1))
    args.out.write_text(render())
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
