"""One benchmark peer in its own process: set up, run the stream twice, report.

    python -m bench.peer --peer disc --workload gelu_bias_stream \\
        --model-dir /tmp/m --count 48 --ref /tmp/ref.npz --out /tmp/disc.json

Peers:
  tf    ``tf.saved_model.load`` of the original model. With ``--write-ref`` it
        also saves its first-pass outputs as the reference of the others.
  xla   the loaded model's call wrapped in ``tf.function(jit_compile=True)``;
        XLA traces and compiles once per distinct input shape.
  disc  ``disc_tf.optimize`` of the SavedModel (with a fresh, empty artifact
        cache so that every cluster compile is part of the setup time), then
        ``tf.saved_model.load`` of the optimized model.
  ort   ONNX Runtime on a tf2onnx conversion; only when both packages import.

Every call is timed from the input tensor to the output as a numpy array. The
first pass over the stream includes whatever the peer compiles lazily; the hot
pass repeats the same stream.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import pathlib
import resource
import shutil
import sys
import tempfile
import time
import traceback
import zipfile
from collections.abc import Callable
from typing import Any

import numpy as np

PEERS = ("tf", "xla", "disc", "ort")

Result = dict[str, Any]
CallFn = Callable[[Any], np.ndarray]


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class RefWriter:
    """Writes arrays one at a time into an .npz, so the outputs need not all fit in memory."""

    def __init__(self, path: str | pathlib.Path) -> None:
        self._zip = zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED, allowZip64=True)

    def add(self, name: str, array: np.ndarray) -> None:
        """Stores ``array`` under ``name``."""
        with self._zip.open(f"{name}.npy", "w", force_zip64=True) as f:
            np.lib.format.write_array(f, np.ascontiguousarray(array), allow_pickle=False)

    def close(self) -> None:
        """Finishes the archive."""
        self._zip.close()


def _key(i: int) -> str:
    return f"out_{i:04d}"


def run_pass(call: CallFn, inputs: list[np.ndarray], to_tensor: Callable[[np.ndarray], Any],
             ref: Any | None = None,
             writer: RefWriter | None = None) -> tuple[list[float], float | None]:
    """Calls ``call`` on every input; returns per-call seconds and max abs error vs ``ref``.

    A full garbage collection runs first (untimed), so that a collection of the
    garbage left by the setup does not land on the first timed call.
    """
    gc.collect()
    latencies: list[float] = []
    max_err: float | None = None if ref is None else 0.0
    for i, x in enumerate(inputs):
        t = to_tensor(x)
        start = time.perf_counter()
        y = call(t)
        latencies.append(time.perf_counter() - start)
        if writer is not None:
            writer.add(_key(i), y)
        if ref is not None:
            expected = ref[_key(i)]
            if expected.shape != y.shape:
                raise ValueError(f"call {i}: shape {y.shape}, reference {expected.shape}")
            diff = np.abs(y.astype(np.float64) - expected.astype(np.float64))
            err = float(np.nanmax(diff)) if diff.size else 0.0
            if np.isnan(y).sum() != np.isnan(expected).sum():
                err = float("inf")
            max_err = max(max_err or 0.0, err)
    return latencies, max_err


def _tf_call(fn: Callable[[Any], Any]) -> CallFn:
    def call(x: Any) -> np.ndarray:
        return fn(x).numpy()
    return call


def setup_tf(model_dir: str, result: Result) -> CallFn:
    """Loads the original SavedModel."""
    import tensorflow as tf

    start = time.perf_counter()
    model = tf.saved_model.load(model_dir)
    result["setup_s"] = time.perf_counter() - start
    result["compiles"] = None
    return _tf_call(model)


def setup_xla(model_dir: str, result: Result) -> tuple[CallFn, Callable[[], int | None]]:
    """Loads the original SavedModel and wraps its call in an XLA-compiled tf.function."""
    import tensorflow as tf

    start = time.perf_counter()
    model = tf.saved_model.load(model_dir)
    fn = tf.function(lambda x: model(x), jit_compile=True)
    result["setup_s"] = time.perf_counter() - start

    def traces() -> int | None:
        getter = getattr(fn, "experimental_get_tracing_count", None)
        return int(getter()) if getter is not None else None

    return _tf_call(fn), traces


def setup_disc(model_dir: str, result: Result, work: pathlib.Path) -> CallFn:
    """Optimizes the SavedModel with an empty artifact cache, then loads it."""
    cache = work / "disc_cache"
    cache.mkdir()
    os.environ["DISC_TF_CACHE_DIR"] = str(cache)
    import tensorflow as tf

    import disc_tf

    disc_tf.reset_stats()
    out = work / "optimized"
    start = time.perf_counter()
    disc_tf.optimize(model_dir, str(out))
    optimized = time.perf_counter()
    model = tf.saved_model.load(str(out))
    done = time.perf_counter()
    result["setup_s"] = done - start
    result["optimize_s"] = optimized - start
    result["load_s"] = done - optimized
    manifest = json.loads((out / "assets.extra" / "disc" / "clusters.json").read_text())
    result["clusters"] = sum(1 for c in manifest if c.get("error") is None)
    result["failed_clusters"] = [c["name"] for c in manifest if c.get("error") is not None]
    result["cluster_ops"] = [
        sum(1 for _, op in c["ops"] if op != "Const") for c in manifest if c.get("error") is None
    ]
    return _tf_call(model)


def setup_ort(model_dir: str, result: Result,
              work: pathlib.Path) -> CallFn:  # pragma: no cover - optional packages
    """Converts the model with tf2onnx and opens an ONNX Runtime session."""
    import onnxruntime as ort
    import tensorflow as tf
    import tf2onnx

    start = time.perf_counter()
    model = tf.saved_model.load(model_dir)
    concrete = model.signatures["serving_default"]
    specs = [tf.TensorSpec(s.shape, s.dtype, name=n)
             for n, s in concrete.structured_input_signature[1].items()]
    proto, _ = tf2onnx.convert.from_function(
        tf.function(lambda x: model(x)), input_signature=specs,
        output_path=str(work / "model.onnx"))
    session = ort.InferenceSession(proto.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name
    result["setup_s"] = time.perf_counter() - start
    result["compiles"] = None

    def call(x: np.ndarray) -> np.ndarray:
        return session.run(None, {input_name: x})[0]

    return call


def ort_available() -> bool:
    """True when both onnxruntime and tf2onnx are importable."""
    return all(importlib.util.find_spec(m) is not None for m in ("onnxruntime", "tf2onnx"))


def run_peer(args: argparse.Namespace) -> Result:
    """Sets up ``args.peer``, runs both passes and returns its record."""
    from bench.workloads import WORKLOADS

    result: Result = {"peer": args.peer, "workload": args.workload, "status": "ok"}
    if args.peer == "ort" and not ort_available():
        result["status"] = "not installed"
        return result
    workload = WORKLOADS[args.workload]
    inputs = list(workload.stream(args.seed, args.count))
    result["num_calls"] = len(inputs)
    result["distinct_shapes"] = len({x.shape for x in inputs})

    work = pathlib.Path(tempfile.mkdtemp(prefix=f"bench_{args.peer}_"))
    traces: Callable[[], int | None] | None = None
    try:
        if args.peer == "tf":
            call = setup_tf(args.model_dir, result)
        elif args.peer == "xla":
            call, traces = setup_xla(args.model_dir, result)
        elif args.peer == "disc":
            call = setup_disc(args.model_dir, result, work)
        else:
            call = setup_ort(args.model_dir, result, work)

        if args.peer == "ort":
            def to_tensor(x: np.ndarray) -> Any:
                return x
        else:
            import tensorflow as tf

            result["tf_version"] = tf.__version__
            to_tensor = tf.constant

        ref = np.load(args.ref) if args.ref and not args.write_ref else None
        writer = RefWriter(args.ref) if args.write_ref else None
        try:
            first, err_first = run_pass(call, inputs, to_tensor, ref, writer)
            hot, err_hot = run_pass(call, inputs, to_tensor, ref)
        finally:
            if writer is not None:
                writer.close()
            if ref is not None:
                ref.close()

        result["first_pass_s"] = float(np.sum(first))
        result["first_call_s"] = first[0]
        result["hot_pass_s"] = float(np.sum(hot))
        result["hot_p50_ms"] = float(np.percentile(hot, 50) * 1e3)
        result["hot_p99_ms"] = float(np.percentile(hot, 99) * 1e3)
        errors = [e for e in (err_first, err_hot) if e is not None]
        result["max_abs_err"] = max(errors) if errors else None
        if traces is not None:
            result["compiles"] = traces()
        if args.peer == "disc":
            import disc_tf

            stats = disc_tf.stats()
            result["disc_stats"] = stats
            result["compiles"] = stats["compilations"]
        result["peak_rss_mb"] = peak_rss_mb()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments of a peer run."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peer", choices=PEERS, required=True)
    p.add_argument("--workload", required=True)
    p.add_argument("--model-dir", required=True, help="the workload's SavedModel")
    p.add_argument("--out", required=True, help="JSON file for this peer's record")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--count", type=int, default=48, help="number of calls in the stream")
    p.add_argument("--ref", help="reference outputs (.npz) to compare against")
    p.add_argument("--write-ref", action="store_true", help="write --ref instead of reading it")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Runs one peer; always writes a JSON record, with the error if it failed."""
    args = parse_args(argv)
    try:
        result = run_peer(args)
    except Exception as e:  # noqa: BLE001 - the record carries the failure
        traceback.print_exc()
        result = {"peer": args.peer, "workload": args.workload,
                  "status": f"error: {type(e).__name__}: {e}"}
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1))
    return 0 if result["status"] in ("ok", "not installed") else 1


if __name__ == "__main__":
    sys.exit(main())
