"""The host cost of each exported case's generated runner, with no GPU (runner_cost.cc).

    python -m bench.gpu_replay.runner_cost --cases DIR [--call 2]

Prints, per model and cluster: microseconds per call of the runner alone, and how many
kernel launches, cuBLAS GEMMs and allocations one call makes.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import tempfile

from bench.gpu_replay.check import DTYPE_CODES, ROOT


def build(out: pathlib.Path) -> pathlib.Path:
    """Compiles runner_cost.cc into ``out/runner_cost``."""
    exe = out / "runner_cost"
    subprocess.run(["g++", "-std=c++17", "-O2", f"-I{ROOT / 'cc/ral'}",
                    str(ROOT / "bench/gpu_replay/runner_cost.cc"), "-ldl", "-o", str(exe)], check=True)
    return exe


def measure(exe: pathlib.Path, cases: pathlib.Path, case: dict, calls: int = 2000) -> dict:
    """Runs one case's runner ``calls`` times with no-op GPU services."""
    shapes = [f"{DTYPE_CODES[i['dtype']]}:" + ",".join(map(str, i["shape"])) for i in case["inputs"]]
    out = subprocess.run([str(exe), str(cases / case["artifact"]), str(calls), str(len(case["outputs"])),
                          *shapes], capture_output=True, text=True, check=True).stdout.split()
    return {"us_per_call": float(out[0]), "launches": int(out[1]), "gemms": int(out[2]),
            "allocations": int(out[3])}


def main(argv: list[str] | None = None) -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", required=True, type=pathlib.Path)
    parser.add_argument("--call", type=int, default=2, help="which call of each model")
    args = parser.parse_args(argv)
    manifest = json.loads((args.cases / "manifest.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(pathlib.Path(tmp))
        print("| model | cluster | input shapes | runner us/call | launches | GEMMs | allocations |")
        print("|---|---|---|---:|---:|---:|---:|")
        for case in manifest["cases"]:
            if "refused" in case or case["call"] != args.call:
                continue
            m = measure(exe, args.cases, case)
            shapes = " ".join("x".join(map(str, s)) for s in case["arg_shapes"])
            print(f"| {case['model']} | {case['cluster']} | {shapes} | {m['us_per_call']:.2f} | "
                  f"{m['launches']} | {m['gemms']} | {m['allocations']} |")


if __name__ == "__main__":
    main()
