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
        ``disc_tf.load`` of the optimized model (its DiscCluster ops called
        directly, not through TF's function runtime). A cluster that fails to
        compile stays as TF ops (listed in the record); if ``optimize`` itself
        fails, the original model runs and the record says so. After the hot
        passes, the same optimized model is also timed through the restored TF
        function (``hot_tf_call_s``), the call path ``tf.saved_model.load`` gives.
  ort   ONNX Runtime on a tf2onnx conversion of the same SavedModel (conversion
        is part of the setup time); runs under ``bench/.venv-ort`` (``make
        bench-deps``), "not installed" when onnxruntime or tf2onnx is missing.

Every call is timed from the input tensor to the output as a numpy array. The
first pass over the stream includes whatever the peer compiles lazily; the hot
pass repeats the same stream.

With ``--measure-memory`` (peers tf, xla, disc) the process times nothing: it
sets up, runs the stream once to warm up, then once more reading TF's CPU
allocator statistics around each call (see ``measure_activations``).
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
#: Peers that allocate their tensors through TF's CPU allocator (``--measure-memory``).
MEMORY_PEERS = ("tf", "xla", "disc")

#: Makes the CPU device allocate through a BFC allocator, whose statistics count
#: every allocation. The default oneDNN CPU allocator leaves small ones out of them.
BFC_ENV = "TF_CPU_ALLOCATOR_USE_BFC"

MIB = float(2**20)

#: ONNX opset tf2onnx converts to.
ORT_OPSET = 17

Result = dict[str, Any]
CallFn = Callable[[Any], np.ndarray]


#: Timed passes of disc's optimized model through the restored TF function, after the
#: hot rounds; the best is ``hot_tf_call_s`` (one pass read 0.82x and 1.18x TF for the
#: recommender on one host an hour apart).
TF_CALL_PASSES = 3


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB.

    ``VmHWM`` from /proc belongs to this process's own address space; ``ru_maxrss``
    (the fallback elsewhere) also carries the parent's peak across fork + exec.
    """
    try:
        for line in pathlib.Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except (OSError, ValueError):
        pass
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


def progress_printer(label: str, total: int) -> Callable[[int], None]:
    """Prints ``@progress LABEL DONE TOTAL`` lines on stdout for ``bench.run``'s progress bar."""
    def report(done: int) -> None:
        print(f"@progress {label} {done} {total}", flush=True)
    return report


def run_pass(call: CallFn, inputs: list[np.ndarray], to_tensor: Callable[[np.ndarray], Any],
             ref: Any | None = None, writer: RefWriter | None = None,
             progress: Callable[[int], None] | None = None,
             collect: bool = True) -> tuple[list[float], float | None]:
    """Calls ``call`` on every input; returns per-call seconds and max abs error vs ``ref``.

    With ``collect``, a full garbage collection runs first (untimed), so that a
    collection of the garbage left by the setup does not land on the first timed call
    (a caller that warms the peer up after its own collection passes False).
    ``progress(i)`` is called (untimed) after the ``i``-th call.
    """
    if collect:
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
        if progress is not None:
            progress(i + 1)
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


def setup_disc(model_dir: str, result: Result,
               work: pathlib.Path) -> tuple[CallFn, CallFn]:
    """Optimizes the SavedModel with an empty artifact cache, then loads it; returns the
    direct call and the call through the restored TF function."""
    cache = work / "disc_cache"
    cache.mkdir()
    os.environ["DISC_TF_CACHE_DIR"] = str(cache)
    import disc_tf

    disc_tf.reset_stats()
    out = work / "optimized"
    start = time.perf_counter()
    try:
        disc_tf.optimize(model_dir, str(out))
    except Exception as e:  # noqa: BLE001 - the bench goes on with the model's own ops
        traceback.print_exc()
        result["optimize_error"] = f"{type(e).__name__}: {e}"[:500]
        out = pathlib.Path(model_dir)
    optimized = time.perf_counter()
    model = disc_tf.load(str(out))
    done = time.perf_counter()
    result["direct"] = model.direct_functions()
    result["setup_s"] = done - start
    result["optimize_s"] = optimized - start
    result["load_s"] = done - optimized
    manifest_path = out / "assets.extra" / "disc" / "clusters.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else []
    result["clusters"] = sum(1 for c in manifest if c.get("error") is None)
    result["failed_clusters"] = [c["name"] for c in manifest if c.get("error") is not None]
    result["failed_cluster_errors"] = [str(c["error"])[:300] for c in manifest
                                       if c.get("error") is not None]
    result["cluster_ops"] = [
        sum(1 for _, op in c["ops"] if op != "Const") for c in manifest if c.get("error") is None
    ]
    return _tf_call(model), _tf_call(model.module)


def optimize_again(model_dir: str, work: pathlib.Path) -> float:
    """Seconds to optimize the model again with the now-warm artifact cache (no C++ compile)."""
    import disc_tf

    start = time.perf_counter()
    disc_tf.optimize(model_dir, str(work / "optimized_warm"))
    return time.perf_counter() - start


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
        tf.function(lambda x: model(x)), input_signature=specs, opset=ORT_OPSET,
        output_path=str(work / "model.onnx"))
    converted = time.perf_counter()
    session = ort.InferenceSession(proto.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name
    done = time.perf_counter()
    result["setup_s"] = done - start
    result["convert_s"] = converted - start
    result["session_s"] = done - converted
    result["compiles"] = None
    result["ort_versions"] = {"onnxruntime": ort.__version__, "tf2onnx": tf2onnx.__version__,
                              "tensorflow": tf.__version__, "opset": ORT_OPSET}

    def call(x: np.ndarray) -> np.ndarray:
        return session.run(None, {input_name: x})[0]

    return call


def ort_available() -> bool:
    """True when both onnxruntime and tf2onnx are importable."""
    return all(importlib.util.find_spec(m) is not None for m in ("onnxruntime", "tf2onnx"))


def hot_passes(call: CallFn, inputs: list[np.ndarray], to_tensor: Callable[[np.ndarray], Any],
               ref: Any | None, args: argparse.Namespace) -> tuple[list[list[float]], float | None]:
    """The hot passes: ``--hot-repeats`` in a row or, with ``--interleave``, one per ``hot``
    line on stdin (the runner alternates peers between passes) until ``stop`` or EOF."""
    runs: list[list[float]] = []
    max_err: float | None = None

    def one(progress: Callable[[int], None] | None) -> None:
        nonlocal max_err
        lat, err = run_pass(call, inputs, to_tensor, ref, progress=progress)
        runs.append(lat)
        if err is not None:
            max_err = err if max_err is None else max(max_err, err)

    if args.interleave:
        print("@ready", flush=True)
        for line in sys.stdin:
            if line.strip() != "hot":
                break
            one(progress_printer("hot", len(inputs)) if args.progress else None)
            print(f"@hotdone {sum(runs[-1]):.6f}", flush=True)
        return runs, max_err
    total = args.hot_repeats * len(inputs)
    report = progress_printer("hot", total) if args.progress else None
    for k in range(args.hot_repeats):
        done = k * len(inputs)
        one(None if report is None else (lambda i, d=done: report(d + i)))
    return runs, max_err


def activation_summary(samples: list[tuple[tuple[int, ...], int, int]]) -> Result:
    """Summarises ``(input shape, bytes held before the call, allocator peak during it)`` per call.

    ``peak_act_mb``: the largest ``peak - before`` over the calls (MiB), with its input
    shape; ``alloc_peak_mb``: the largest ``peak`` (weights, constants and the input included).
    """
    if not samples:
        return {"peak_act_mb": None, "peak_act_shape": None, "alloc_peak_mb": None}
    shape, before, peak = max(samples, key=lambda s: s[2] - s[1])
    return {"peak_act_mb": (peak - before) / MIB, "peak_act_shape": list(shape),
            "alloc_peak_mb": max(s[2] for s in samples) / MIB}


def measure_activations(call: CallFn, inputs: list[np.ndarray],
                        to_tensor: Callable[[np.ndarray], Any],
                        kept: Callable[[], int] | None = None) -> Result:
    """Peak allocator bytes per call over the stream, after an untimed warm-up pass.

    Before each call the input tensor exists and the allocator's peak is reset to
    what it holds; the call's activation memory is the peak during the call (the
    output included) minus that. ``kept`` gives the bytes the peer holds between
    calls for its calls' temporaries (disc's kept scratch): they count as the call's,
    not as what it held before. Only meaningful with ``BFC_ENV`` set before TF
    creates its devices (``main`` does that).
    """
    import tensorflow as tf

    memory = tf.config.experimental
    for x in inputs:
        call(to_tensor(x))
    gc.collect()
    samples: list[tuple[tuple[int, ...], int, int]] = []
    for x in inputs:
        t = to_tensor(x)
        memory.reset_memory_stats("CPU:0")
        before = int(memory.get_memory_info("CPU:0")["current"]) - (kept() if kept else 0)
        call(t)
        samples.append((tuple(x.shape), before, int(memory.get_memory_info("CPU:0")["peak"])))
    return activation_summary(samples)


def run_peer(args: argparse.Namespace) -> Result:
    """Sets up ``args.peer``, runs both passes and returns its record."""
    from bench.workloads import WORKLOADS

    result: Result = {"peer": args.peer, "workload": args.workload, "status": "ok"}
    if args.measure_memory and args.peer not in MEMORY_PEERS:
        raise ValueError(f"--measure-memory supports {', '.join(MEMORY_PEERS)}, not {args.peer}")
    if args.peer == "ort" and not ort_available():
        result["status"] = "not installed"
        return result
    workload = WORKLOADS[args.workload]
    inputs = list(workload.stream(args.seed, args.count))
    result["num_calls"] = len(inputs)
    result["distinct_shapes"] = len({x.shape for x in inputs})

    if args.progress:
        progress_printer("setup", len(inputs))(0)
    work = pathlib.Path(tempfile.mkdtemp(prefix=f"bench_{args.peer}_"))
    traces: Callable[[], int | None] | None = None
    tf_call: CallFn | None = None  # disc: the same model through the restored TF function
    try:
        if args.peer == "tf":
            call = setup_tf(args.model_dir, result)
        elif args.peer == "xla":
            call, traces = setup_xla(args.model_dir, result)
        elif args.peer == "disc":
            call, tf_call = setup_disc(args.model_dir, result, work)
        else:
            call = setup_ort(args.model_dir, result, work)

        if args.peer == "ort":
            def to_tensor(x: np.ndarray) -> Any:
                return x
        else:
            import tensorflow as tf

            result["tf_version"] = tf.__version__
            to_tensor = tf.constant

        if args.measure_memory:
            kept = None
            if args.peer == "disc":
                import disc_tf

                def kept() -> int:
                    return int(disc_tf.stats()["temp_kept_bytes"])

            result.update(measure_activations(call, inputs, to_tensor, kept))
            if args.peer == "disc":
                result["disc_stats"] = disc_tf.stats()
            return result
        ref = np.load(args.ref) if args.ref and not args.write_ref else None
        writer = RefWriter(args.ref) if args.write_ref else None
        try:
            try:
                first, err_first = run_pass(
                    call, inputs, to_tensor, ref, writer,
                    progress_printer("first", len(inputs)) if args.progress else None)
            finally:
                if writer is not None:
                    writer.close()  # complete before the next peer starts reading it
            hot_runs, err_hot = hot_passes(call, inputs, to_tensor, ref, args)
        finally:
            if ref is not None:
                ref.close()

        result["first_pass_s"] = float(np.sum(first))
        result["first_call_s"] = first[0]
        # Hot numbers are the best of the repeats (less noise from other work on the cores):
        # the smallest pass total, and percentiles of each call's fastest time.
        if not hot_runs:
            raise RuntimeError("no hot pass was run")
        totals = [float(np.sum(lat)) for lat in hot_runs]
        best = np.min(np.array(hot_runs), axis=0)
        result["hot_pass_s"] = min(totals)
        result["hot_pass_runs_s"] = totals
        result["hot_p50_ms"] = float(np.percentile(best, 50) * 1e3)
        result["hot_p99_ms"] = float(np.percentile(best, 99) * 1e3)
        errors = [e for e in (err_first, err_hot) if e is not None]
        result["max_abs_err"] = max(errors) if errors else None
        if traces is not None:
            result["compiles"] = traces()
        if args.peer == "disc":
            import disc_tf

            stats = disc_tf.stats()
            result["disc_stats"] = stats
            result["compiles"] = stats["compilations"]
            if tf_call is not None:  # a warm-up pass, then the best of TF_CALL_PASSES
                run_pass(tf_call, inputs, to_tensor)
                runs = [float(np.sum(run_pass(tf_call, inputs, to_tensor)[0]))
                        for _ in range(TF_CALL_PASSES)]
                result["hot_tf_call_runs_s"] = runs
                result["hot_tf_call_s"] = min(runs)
        result["peak_rss_mb"] = peak_rss_mb()
        if args.peer == "disc" and not result.get("optimize_error"):
            result["optimize_warm_cache_s"] = optimize_again(args.model_dir, work)
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
    p.add_argument("--hot-repeats", type=int, default=3,
                   help="hot passes over the stream; the best is reported")
    p.add_argument("--interleave", action="store_true",
                   help="after the first pass, run one hot pass per 'hot' line on stdin")
    p.add_argument("--progress", action="store_true",
                   help="print @progress lines on stdout after every call")
    p.add_argument("--measure-memory", action="store_true",
                   help=f"time nothing; record peak allocator bytes per call ({BFC_ENV}=true)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Runs one peer; always writes a JSON record, with the error if it failed."""
    args = parse_args(argv)
    if args.measure_memory:
        os.environ[BFC_ENV] = "true"  # read when TF creates the CPU device, after this
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
