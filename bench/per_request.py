"""Per-request comparison of two peers on one workload's stream, for a noisy host.

``bench.run`` times whole passes and takes per-round ratios of pass totals; on a host
whose speed moves by 1.5-2x within seconds, one slow stretch decides a round. This tool
runs each peer in its own worker process (set up as ``bench.peer`` sets it up) and reports,
per request, the median of each peer's times over the passes: how the two compare shape by
shape. Two ways to interleave the peers:

* ``--interleave pass``: each peer runs the whole pass of the stream, in alternating order
  (A B, B A, ...); each stretch of host noise is spread over every request of a pass.
* ``--interleave request``: the peers take turns request by request (A B for request 0,
  B A for request 1, ...), each turn after the settle pause, a garbage collection and one
  untimed call of the stream's previous request (the state a pass leaves). Both peers'
  times of a request are then taken a few hundred ms apart, so a pass's totals compare two
  peers under the same stretch of host speed; the per-pass ratio of totals is what to read
  on a host whose speed moves within seconds.

    .venv/bin/python -m bench.per_request --workload bert_base --peers disc,ort --passes 16
    .venv/bin/python -m bench.per_request --workload recommender_tower --interleave request
    .venv/bin/python -m bench.per_request --workload bert_base --shapes "2,64,768;4,105,768"
    .venv/bin/python -m bench.per_request --workload recommender_tower --hide-avx512

The table is markdown on stdout; ``--out FILE`` also keeps the raw times as JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def _inputs(workload: str, count: int, seed: int, shapes: str) -> list[np.ndarray]:
    """The stream's first ``count`` inputs, or seeded normal inputs of ``shapes``
    (``"2,64,768;4,105,768"``)."""
    from bench.workloads import WORKLOADS

    if shapes:
        return [np.random.default_rng(seed + i).standard_normal(
                    tuple(int(d) for d in s.split(","))).astype(np.float32)
                for i, s in enumerate(x for x in shapes.split(";") if x)]
    return list(WORKLOADS[workload].stream(seed, count))


def worker(args: argparse.Namespace) -> int:
    """One peer: set up, one untimed pass, then per ``go`` line on stdin an untimed call
    of the first request and a timed pass (a JSON list of per-request seconds on stdout).
    The untimed call is for the pause before each pass: after it, ONNX Runtime's first
    two requests of a pass (MobileNetV2) took up to 1.8x their median time."""
    from bench import peer as peer_mod

    work = pathlib.Path(tempfile.mkdtemp(prefix=f"per_request_{args.worker}_"))
    result: dict[str, Any] = {}
    if args.worker == "disc":
        call, _ = peer_mod.setup_disc(args.model_dir, result, work)
    elif args.worker == "ort":
        call = peer_mod.setup_ort(args.model_dir, result, work)
    elif args.worker == "tf":
        call = peer_mod.setup_tf(args.model_dir, result)
    else:
        raise SystemExit(f"unknown peer {args.worker!r}")
    if args.worker == "ort":
        to_tensor = np.asarray
    else:
        import tensorflow as tf

        to_tensor = tf.constant
    inputs = _inputs(args.workload, args.count, args.seed, args.shapes)
    peer_mod.run_pass(call, inputs, to_tensor)
    print("@ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        # ``warm``, called untimed: after the pause it warms caches and pool threads.
        if words == ["go"]:
            warm, timed = inputs[0], inputs  # the first request, then the pass
        elif len(words) == 2 and words[0] == "request":
            i = int(words[1])
            warm, timed = inputs[i - 1], inputs[i:i + 1]  # the previous request, as in a pass
        else:
            break
        # The collection first, then the untimed call, then the timed ones: a collection
        # between them (a TF process's heap: tens of ms) let the pool threads fall
        # asleep and walked the caches, a state no request of a pass meets.
        gc.collect()
        call(to_tensor(warm))
        latencies, _ = peer_mod.run_pass(call, timed, to_tensor, collect=False)
        print(json.dumps(latencies), flush=True)
    return 0


def _start(peer: str, args: argparse.Namespace, model_dir: pathlib.Path) -> subprocess.Popen:
    from bench import driver

    python = driver.peer_python(peer)
    if python is None:
        raise SystemExit(f"no interpreter for {peer}: run `make bench-deps`")
    cmd = [python, "-m", "bench.per_request", "--worker", peer, "--workload", args.workload,
           "--model-dir", str(model_dir), "--count", str(args.count), "--seed", str(args.seed),
           "--shapes", args.shapes]
    proc = subprocess.Popen(cmd, env=driver.peer_env(), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in proc.stdout:
        if line.strip() == "@ready":
            return proc
    raise SystemExit(f"{peer} worker exited before it was ready")


def _ask(proc: subprocess.Popen, line: str) -> list[float]:
    """Sends one command line to a worker; returns the seconds of its timed calls."""
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())


def alternate(peers: list[str], passes: int, run_pass: Callable[[str], list[float]],
              settle_s: float, sleep: Callable[[float], None] = time.sleep
              ) -> dict[str, list[list[float]]]:
    """``passes`` passes of each peer in alternating order (A B, B A, ...), each after
    ``settle_s`` of quiet: the previous peer's pool threads keep polling for a while after
    its pass (ONNX Runtime's for tens of ms), which would slow the next pass's first
    requests (``bench.driver.SETTLE_S``)."""
    times: dict[str, list[list[float]]] = {peer: [] for peer in peers}
    for n in range(passes):
        for peer in (peers if n % 2 == 0 else peers[::-1]):
            sleep(settle_s)
            times[peer].append(run_pass(peer))
    return times


def alternate_requests(peers: list[str], passes: int, count: int,
                       run_request: Callable[[str, int], float], settle_s: float,
                       sleep: Callable[[float], None] = time.sleep
                       ) -> dict[str, list[list[float]]]:
    """``passes`` passes of ``count`` requests, the peers taking turns on each request
    (request i of pass n: A B where n + i is even, else B A), each turn after ``settle_s``
    of quiet; per peer, per pass, the seconds of each request."""
    times: dict[str, list[list[float]]] = {peer: [] for peer in peers}
    for n in range(passes):
        for peer in peers:
            times[peer].append([0.0] * count)
        for i in range(count):
            for peer in (peers if (n + i) % 2 == 0 else peers[::-1]):
                sleep(settle_s)
                times[peer][n][i] = run_request(peer, i)
    return times


def report(peers: list[str], shapes: list[tuple[int, ...]], times: dict[str, list[list[float]]]
           ) -> str:
    """Markdown: per request (by size), each peer's median time over the passes and the
    ratio second / first; then the totals of the medians and each pass's total."""
    a, b = peers
    med = {p: [statistics.median(run[i] for run in times[p]) for i in range(len(shapes))]
           for p in peers}
    rows = sorted(range(len(shapes)), key=lambda i: (int(np.prod(shapes[i])), i))
    lines = [f"| request | input | {a} ms | {b} ms | {b} / {a} |", "|---:|---|---:|---:|---:|"]
    for i in rows:
        lines.append(f"| {i} | {'x'.join(map(str, shapes[i]))} | {med[a][i] * 1e3:.2f} | "
                     f"{med[b][i] * 1e3:.2f} | {med[b][i] / med[a][i]:.2f} |")
    total = {p: sum(med[p]) for p in peers}
    ratios = sorted(med[b][i] / med[a][i] for i in range(len(shapes)))
    lines += ["", f"Sum of per-request medians: {a} {total[a]:.3f} s, {b} {total[b]:.3f} s; "
              f"{b} / {a} = {total[b] / total[a]:.3f} (per request {ratios[0]:.2f}-"
              f"{ratios[-1]:.2f}, median {statistics.median(ratios):.2f})."]
    for p in peers:
        lines.append(f"Pass totals, {p}: " + ", ".join(f"{sum(r):.3f}" for r in times[p]))
    per_pass = sorted(sum(rb) / sum(ra) for ra, rb in zip(times[a], times[b]))
    lines.append(f"Per pass, {b} total / {a} total: median {statistics.median(per_pass):.3f} "
                 f"({per_pass[0]:.3f}-{per_pass[-1]:.3f}).")
    return "\n".join(lines)


def machine_line(hidden: bool, load_start: float | None, load_end: float | None) -> str:
    """What the comparison ran on: CPU, ISA (and whether AVX-512 was hidden), cores, the
    1-minute load average at the start and the end, and the commit."""
    from bench import machine

    hidden_note = " (AVX-512 hidden: every peer's AVX2 path)" if hidden else ""
    return (f"Machine: {machine.cpu_model()}, {machine.capped_isa(None)}{hidden_note}; 1-min "
            f"load {load_start} at the start, {load_end} at the end; commit "
            f"{machine.git_revision()}")


def main(argv: list[str] | None = None) -> int:
    """Runs the comparison (or, with ``--worker``, one peer's worker)."""
    p = argparse.ArgumentParser(prog="python -m bench.per_request",
                                description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="bert_base")
    p.add_argument("--peers", default="disc,ort", help="two of tf, disc, ort")
    p.add_argument("--passes", type=int, default=16)
    p.add_argument("--count", type=int, default=48, help="requests of the stream")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shapes", default="", help='inputs instead of the stream: "2,64,768;..."')
    p.add_argument("--interleave", choices=("pass", "request"), default="pass",
                   help="the peers take turns by whole passes or request by request")
    p.add_argument("--hide-avx512", action="store_true",
                   help="every peer's AVX2 path, as bench.run --hide-avx512")
    p.add_argument("--out", type=pathlib.Path, help="also write the raw times (JSON)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    peers = [x for x in args.peers.split(",") if x]
    if len(peers) != 2:
        p.error("--peers takes two peers")
    if args.hide_avx512:
        from bench import hide_avx512
        from bench.run import cap_isa

        cap_isa("x86-64-v3")
        hide_avx512.enable()
    from bench.workloads import WORKLOADS

    model_dir = pathlib.Path(tempfile.mkdtemp(prefix="per_request_")) / "model"
    WORKLOADS[args.workload].save(model_dir)
    from bench.driver import SETTLE_S
    from bench.machine import load_average

    load_start = load_average()
    shapes = [tuple(x.shape) for x in _inputs(args.workload, args.count, args.seed, args.shapes)]
    procs = {peer: _start(peer, args, model_dir) for peer in peers}
    try:
        if args.interleave == "request":
            times = alternate_requests(
                peers, args.passes, len(shapes),
                lambda peer, i: _ask(procs[peer], f"request {i}")[0], SETTLE_S)
        else:
            times = alternate(peers, args.passes, lambda peer: _ask(procs[peer], "go"), SETTLE_S)
    finally:
        for proc in procs.values():
            proc.stdin.close()
            proc.wait(timeout=60)
    order = "taking turns request by request" if args.interleave == "request" else \
        "in alternating order"
    print(f"{args.workload}: {args.passes} passes of {len(shapes)} requests, peers {order}"
          f"{' (AVX-512 hidden)' if args.hide_avx512 else ''}\n")
    print(report(peers, shapes, times))
    line = machine_line(args.hide_avx512, load_start, load_average())
    print(line)
    if args.out is not None:
        args.out.write_text(json.dumps({"workload": args.workload, "peers": peers,
                                        "interleave": args.interleave, "shapes": shapes,
                                        "times": times, "machine": line}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
