"""Runs exported replay cases on a GPU and compares every output with TF's.

Needs numpy, g++, a CUDA driver, cuda.h and cuBLAS -- no TensorFlow. Builds
``replay.cc`` with the project's CUDA RAL, then for each case of ``manifest.json``
(see ``export.py``) loads the artifact, copies the inputs to the GPU, runs the
cluster once and compares its outputs with TF's (at ``sample_positions``, plus the
sum and sum of squares of the whole output), then times back-to-back calls with CUDA
events. Writes ``replay.json`` and ``REPLAY.md`` to ``--out``; exits 1 if any case
failed.

    python3 -m bench.gpu_replay.check --cases DIR --out DIR
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import numpy as np

from bench.gpu_replay.synthetic import sample_positions, synthetic

ROOT = pathlib.Path(__file__).resolve().parents[2]
DTYPE_CODES = {"float32": 1, "int32": 3, "int64": 9, "bool": 10, "bfloat16": 14, "float16": 19}
NUMPY_TYPES = {"float32": np.float32, "int32": np.int32, "int64": np.int64, "bool": np.bool_,
               "bfloat16": np.uint16, "float16": np.float16}
#: (rtol, atol) of float32 outputs when GEMMs ran on TF32 tensor cores (``--tf32``):
#: operands keep 10 mantissa bits, so results move by ~1e-3 of their scale.
TF32_TOLERANCE = (2e-2, 2e-2)
#: Timed calls per case aim at this much GPU time (at least MIN_CALLS calls).
TIMED_MS = 30.0
MIN_CALLS = 5


def cuda_include() -> str:
    """The folder holding cuda.h: next to nvcc, else /usr/local/cuda/include. (The rule of
    ``disc_tf.runtime.native_build.cuda_include_dir``, which this machine cannot import:
    ``disc_tf`` imports TensorFlow.)"""
    nvcc = shutil.which("nvcc")
    candidates = [os.environ.get("DISC_TF_CUDA_INCLUDE", "")]
    if nvcc:
        candidates.append(str(pathlib.Path(os.path.realpath(nvcc)).parents[1] / "include"))
    candidates.append("/usr/local/cuda/include")
    for c in candidates:
        if c and (pathlib.Path(c) / "cuda.h").is_file():
            return c
    raise SystemExit("no cuda.h (set DISC_TF_CUDA_INCLUDE)")


def build_library(out: pathlib.Path) -> pathlib.Path:
    """Compiles replay.cc and the CUDA RAL into ``out/libreplay.so``."""
    lib = out / "libreplay.so"
    cmd = ["g++", "-std=c++17", "-O2", "-shared", "-fPIC", f"-I{ROOT / 'cc/ral'}",
           f"-I{ROOT / 'cc/ral_cuda'}", f"-I{cuda_include()}",
           str(ROOT / "bench/gpu_replay/replay.cc"), str(ROOT / "cc/ral_cuda/disc_ral_cuda_impl.cc"),
           "-ldl", "-o", str(lib)]
    subprocess.run(cmd, check=True)
    return lib


def preload_cublas() -> str:
    """Loads libcublas.so.13 (or .12) globally from wherever it is, so that the RAL's
    dlopen by name finds it; returns its path ("" if none was found)."""
    patterns = ["/usr/local/cuda*/lib64/libcublas.so.1[23]*", "/usr/lib/x86_64-linux-gnu/libcublas.so.1[23]*"]
    for site in sys.path:
        patterns.append(os.path.join(site, "nvidia/cu*/lib/libcublas.so.1[23]*"))
        patterns.append(os.path.join(site, "nvidia/cublas/lib/libcublas.so.1[23]*"))
    for pattern in patterns:
        for path in sorted(glob.glob(pattern), reverse=True):
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                return path
            except OSError:
                continue
    return ""


class Library:
    """The ctypes face of replay.cc."""

    def __init__(self, path: pathlib.Path):
        lib = ctypes.CDLL(str(path))
        lib.replay_open.restype = ctypes.c_void_p
        lib.replay_open.argtypes = [ctypes.c_char_p, ctypes.c_int32, ctypes.c_int32,
                                    ctypes.POINTER(ctypes.c_int32), ctypes.c_char_p, ctypes.c_int32]
        lib.replay_set_input.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32,
                                         ctypes.c_int32, ctypes.POINTER(ctypes.c_int64),
                                         ctypes.c_void_p, ctypes.c_int64, ctypes.c_char_p,
                                         ctypes.c_int32]
        lib.replay_run.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32,
                                   ctypes.POINTER(ctypes.c_double),
                                   ctypes.POINTER(ctypes.c_double), ctypes.c_char_p, ctypes.c_int32]
        lib.replay_output_dims.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.POINTER(ctypes.c_int64)]
        lib.replay_output_copy.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p,
                                           ctypes.c_int64, ctypes.c_char_p, ctypes.c_int32]
        lib.replay_peak_temp_bytes.restype = ctypes.c_int64
        lib.replay_peak_temp_bytes.argtypes = [ctypes.c_void_p]
        lib.replay_device_name.argtypes = [ctypes.c_char_p, ctypes.c_int32]
        lib.replay_close.argtypes = [ctypes.c_void_p]
        self.lib = lib

    def device_name(self) -> str:
        buf = ctypes.create_string_buffer(256)
        self.lib.replay_device_name(buf, 256)
        return buf.value.decode()


def _load(cases: pathlib.Path, entry: dict) -> np.ndarray:
    if "synthetic" in entry:
        s = entry["synthetic"]
        return synthetic(entry["shape"], s["seed"], s["scale"], s["offset"])
    return np.load(cases / entry["file"], allow_pickle=False)


def _as_float(values: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (values.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return values.astype(np.float64)


def compare(got: np.ndarray, want: dict, cases: pathlib.Path, tolerance: dict,
            compute_dtype: str = "") -> tuple[bool, float, str]:
    """Checks ``got`` (the whole output) against an exported expected output, with the
    tolerance of ``compute_dtype`` if given, else of the output's type. Returns (ok, the
    worst error in units of its bound, a reason naming the worst elements when not ok)."""
    if list(got.shape) != want["shape"]:
        return False, float("inf"), f"shape {list(got.shape)} != {want['shape']}"
    dtype = want["dtype"]
    flat = got.reshape(-1)
    positions = sample_positions(flat.size)
    g = _as_float(flat[positions], dtype)
    w = _as_float(np.load(cases / want["sample"], allow_pickle=False), dtype)
    whole = _as_float(flat, dtype)
    n = max(flat.size, 1)
    if dtype not in tolerance:  # integers and booleans: exact
        bad = np.flatnonzero(g != w)
        sums_ok = whole.sum() == want["sum"]
        if bad.size or not sums_ok:
            where = f"at sampled position {int(bad[0])}" if bad.size else "in the sum"
            return False, float("inf"), f"differs {where}"
        return True, 0.0, ""
    rtol, atol = tolerance[compute_dtype or dtype]
    rms = np.sqrt(want["sum_squares"] / n)
    both_nan = np.isnan(g) & np.isnan(w)
    bound = atol * rms + rtol * np.abs(w) + 1e-30
    err = np.where(both_nan, 0.0, np.abs(g - w) / bound)
    worst = float(np.nanmax(err)) if err.size else 0.0
    if np.isnan(err).any():
        return False, float("inf"), "NaN where TF has a number (or the reverse)"
    finite = np.isfinite(whole).all() and np.isfinite(want["sum"])
    sum_bound = 10 * atol * rms * n
    if finite and abs(whole.sum() - want["sum"]) > sum_bound:
        return False, worst, f"sum {whole.sum():.6g} != TF's {want['sum']:.6g}"
    squares = float(np.square(whole).sum())
    if finite and abs(squares - want["sum_squares"]) > 10 * atol * want["sum_squares"] + 1e-30:
        return False, worst, f"sum of squares {squares:.6g} != TF's {want['sum_squares']:.6g}"
    if worst > 1.0:
        top = np.argsort(err)[-3:][::-1]
        detail = ", ".join(f"[{int(positions[t])}] {g[t]:.7g} vs {w[t]:.7g}" for t in top)
        return False, worst, f"error {worst:.2f}x its bound; worst (flat position, got vs TF): {detail}"
    return True, worst, ""


def run_case(lib: Library, cases: pathlib.Path, case: dict, tolerance: dict, tf32: bool = False) -> dict:
    """Runs one case; returns its result (ok, errors, timings). With ``tf32`` float GEMMs
    run on TF32 tensor cores and float outputs are compared with TF32's tolerance."""
    err = ctypes.create_string_buffer(2048)
    out_codes = (ctypes.c_int32 * len(case["outputs"]))(*[DTYPE_CODES[o["dtype"]] for o in case["outputs"]])
    handle = lib.lib.replay_open(str(cases / case["artifact"]).encode(), len(case["inputs"]),
                                 len(case["outputs"]), out_codes, err, 2048)
    result = {k: case[k] for k in ("model", "cluster", "call", "arg_shapes", "kernels")}
    if not handle:
        return {**result, "ok": False, "reason": err.value.decode()}
    try:
        for i, entry in enumerate(case["inputs"]):
            value = np.ascontiguousarray(_load(cases, entry))
            dims = (ctypes.c_int64 * max(value.ndim, 1))(*value.shape)
            if lib.lib.replay_set_input(handle, i, DTYPE_CODES[entry["dtype"]], value.ndim, dims,
                                        value.ctypes.data, value.nbytes, err, 2048):
                return {**result, "ok": False, "reason": err.value.decode()}
        gpu, host = ctypes.c_double(), ctypes.c_double()
        if lib.lib.replay_run(handle, 1, tf32, ctypes.byref(gpu), ctypes.byref(host), err, 2048):
            return {**result, "ok": False, "reason": err.value.decode()}
        worst, reasons = 0.0, []
        for i, want in enumerate(case["outputs"]):
            dims = (ctypes.c_int64 * 8)()
            rank = lib.lib.replay_output_dims(handle, i, dims)
            got = np.empty([dims[d] for d in range(rank)], NUMPY_TYPES[want["dtype"]])
            if lib.lib.replay_output_copy(handle, i, got.ctypes.data, got.nbytes, err, 2048):
                return {**result, "ok": False, "reason": err.value.decode()}
            compute = case.get("compute_dtype", "") or ("tf32" if tf32 and want["dtype"] == "float32" else "")
            ok, w, why = compare(got, want, cases, tolerance, compute)
            worst = max(worst, w)
            if not ok:
                reasons.append(f"output {i}: {why}")
        # Timing: a probe of MIN_CALLS calls, then enough calls for TIMED_MS.
        lib.lib.replay_run(handle, MIN_CALLS, tf32, ctypes.byref(gpu), ctypes.byref(host), err, 2048)
        calls = int(min(max(TIMED_MS / max(gpu.value / MIN_CALLS, 1e-3), MIN_CALLS), 500))
        lib.lib.replay_run(handle, calls, tf32, ctypes.byref(gpu), ctypes.byref(host), err, 2048)
        return {**result, "ok": not reasons, "reason": "; ".join(reasons), "worst_error": worst,
                "gpu_ms": gpu.value / calls, "host_ms": host.value / calls, "timed_calls": calls,
                "peak_temp_bytes": lib.lib.replay_peak_temp_bytes(handle)}
    finally:
        lib.lib.replay_close(handle)


def report(results: list[dict], refused: list[dict], device: str, cublas: str,
           tf32: bool = False) -> str:
    """The markdown summary."""
    mode = ("float GEMMs on TF32 tensor cores (TF's GPU default), float outputs compared with "
            f"rtol, atol = {TF32_TOLERANCE}" if tf32 else "float GEMMs in strict fp32")
    lines = [f"# GPU replay: {device}", "", f"Mode: {mode}.", "",
             f"cuBLAS: `{cublas or 'not found'}`. Each row: one compiled cluster at one call "
             "shape, run through the project's CUDA RAL with TF's inputs; `ok` when every "
             "output matches TF's (CPU) outputs. Times per call: GPU (CUDA events around "
             "back-to-back calls) and host (the generated runner: shapes, allocation, launches).",
             "", "| model | cluster | call | input shapes | kernels | ok | worst error / bound "
             "| GPU ms | host ms | note |",
             "|---|---|---:|---|---:|---|---:|---:|---:|---|"]
    for r in results:
        lines.append(f"| {r['model']} | {r['cluster']} | {r['call']} | "
                     f"{' '.join('x'.join(map(str, s)) for s in r['arg_shapes'])} | {r['kernels']} | "
                     f"{'yes' if r['ok'] else '**NO**'} | {r.get('worst_error', float('nan')):.3f} | "
                     f"{r.get('gpu_ms', float('nan')):.4f} | {r.get('host_ms', float('nan')):.4f} | "
                     f"{r.get('reason', '')[:300]} |")
    passed = sum(r["ok"] for r in results)
    lines += ["", f"{passed} of {len(results)} cases match TF."]
    for r in refused:
        lines.append(f"Refused in {r['model']}: {r['refused']}")
    return "\n".join(lines) + "\n"


def run_models(lib_path: pathlib.Path, cases: pathlib.Path, manifest: dict, models: set[str],
               calls: set[int] | None, tf32: bool = False) -> list[dict]:
    """Runs the cases of ``models`` in this process (a child of ``main``)."""
    tolerance = {"tf32": TF32_TOLERANCE, **manifest["tolerance"]}
    cublas = preload_cublas()
    lib = Library(lib_path)
    results = []
    for case in manifest["cases"]:
        if case["model"] not in models or "refused" in case or (calls and case["call"] not in calls):
            continue
        started = time.perf_counter()
        r = run_case(lib, cases, case, tolerance, tf32)
        r["cublas"] = cublas
        results.append(r)
        print(f"{r['model']}/{r['cluster']}/{r['call']}: {'ok' if r['ok'] else 'FAILED ' + r['reason']}"
              f" gpu {r.get('gpu_ms', 0):.4f} ms host {r.get('host_ms', 0):.4f} ms"
              f" ({time.perf_counter() - started:.1f} s)", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring. Each model runs in a child process
    (``--child``), so a device fault, which poisons a CUDA context, fails that model
    alone."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", required=True, type=pathlib.Path)
    parser.add_argument("--out", required=True, type=pathlib.Path)
    parser.add_argument("--models", default="", help="only these models (comma-separated)")
    parser.add_argument("--calls", default="", help="only these calls (comma-separated)")
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds per model")
    parser.add_argument("--prefix", default="", help="a command to run each child under "
                        "(e.g. 'compute-sanitizer --tool memcheck')")
    parser.add_argument("--tf32", action="store_true", help="float GEMMs on TF32 tensor cores "
                        "(TF's GPU default), compared with TF32's tolerance")
    parser.add_argument("--child", type=pathlib.Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    manifest = json.loads((args.cases / "manifest.json").read_text())
    calls = {int(c) for c in args.calls.split(",") if c} or None
    if args.child:  # write this model's results next to the library
        results = run_models(args.child, args.cases, manifest, set(args.models.split(",")), calls,
                             args.tf32)
        (args.out / f"part-{args.models}.json").write_text(json.dumps(results))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    lib_path = build_library(args.out)
    device = Library(lib_path).device_name()
    print(f"device: {device}", flush=True)
    wanted = [m for m in args.models.split(",") if m] or list(
        dict.fromkeys(c["model"] for c in manifest["cases"]))
    results, refused = [], [c for c in manifest["cases"] if "refused" in c and c["model"] in wanted]
    for model in wanted:
        part = args.out / f"part-{model}.json"
        part.unlink(missing_ok=True)
        cmd = [*args.prefix.split(), sys.executable, "-m", "bench.gpu_replay.check", "--cases",
               str(args.cases), "--out", str(args.out), "--models", model, "--calls", args.calls,
               "--child", str(lib_path), *(["--tf32"] if args.tf32 else [])]
        returncode = None
        try:
            proc = subprocess.run(cmd, cwd=ROOT, timeout=args.timeout, capture_output=True, text=True)
            print(proc.stdout + proc.stderr[-3000:], end="", flush=True)
            returncode = proc.returncode
            why = f"the process ended with {returncode}: {proc.stderr[-300:]}"
        except subprocess.TimeoutExpired:
            why = f"over {args.timeout:.0f} s"
        if part.exists():
            results.extend(json.loads(part.read_text()))
        if not part.exists() or returncode != 0:
            results.append({"model": model, "cluster": "-", "call": -1, "arg_shapes": [],
                            "kernels": 0, "ok": False, "reason": why})
    cublas = next((r.get("cublas", "") for r in results if r.get("cublas")), "")
    (args.out / "replay.json").write_text(json.dumps({"device": device, "results": results,
                                                      "refused": refused}, indent=1))
    (args.out / "REPLAY.md").write_text(report(results, refused, device, cublas, args.tf32))
    print(f"{sum(r['ok'] for r in results)} of {len(results)} cases match TF", flush=True)
    return 0 if all(r["ok"] for r in results) and results else 1


if __name__ == "__main__":
    sys.exit(main())
