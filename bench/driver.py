"""Drives the peer processes of one workload, one at a time, with interleaved hot passes.

Each peer (``python -m bench.peer --interleave``) is started in turn and runs its
setup and first pass alone; it then waits on stdin. The hot passes go round the
peers (tf, xla, disc, ort, tf, xla, ...) for ``hot_repeats`` rounds, so that load
from other work on a shared machine spreads over all peers instead of landing on
one; each peer reports every round's time (``hot_pass_runs_s``) and the load at
each round's start (``round_loads``), from which ``bench.rounds`` takes per-round
ratios. Only one peer computes at any time.

Then each peer of ``MEMORY_PEERS`` that succeeded runs once more, alone, in a
fresh process that times nothing (``bench.peer --measure-memory``): its peak
allocator bytes per call are added to its record.
"""

from __future__ import annotations

import json
import os
import pathlib
import queue
import subprocess
import sys
import threading
import time
from typing import Any, TextIO

from bench import machine
from bench.peer import MEMORY_PEERS
from bench.progress import ProgressBar

BENCH_DIR = pathlib.Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
ORT_VENV = BENCH_DIR / ".venv-ort"
#: Seconds of quiet before each hot pass: a peer's pool threads keep polling for work
#: after its pass (ONNX Runtime's took a whole core for about 60 ms on a 2-core AVX2
#: host; disc_tf's poll for 200 us, DISC_TF_SPIN_US), which would take a core from the
#: next peer's pass.
SETTLE_S = 0.15

Record = dict[str, Any]


def peer_python(peer: str) -> str | None:
    """The interpreter a peer runs under; None when the ort venv is missing."""
    if peer != "ort":
        return sys.executable
    python = ORT_VENV / "bin" / "python"
    return str(python) if python.exists() else None


def peer_env() -> dict[str, str]:
    """The environment of a peer process: quiet TF logs, the repository on the path."""
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
                PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                         os.environ.get("PYTHONPATH")])))


#: Fields of a ``--measure-memory`` record that go into the peer's timed record.
MEMORY_FIELDS = ("peak_act_mb", "peak_act_shape", "alloc_peak_mb")


def measure_memory(peer: str, workload: str, model_dir: pathlib.Path, work: pathlib.Path,
                   count: int, seed: int, timeout: float) -> Record:
    """Runs ``peer`` with ``--measure-memory`` alone; returns ``MEMORY_FIELDS`` or ``memory_status``."""
    out = work / f"{workload}.{peer}.memory.json"
    stderr_path = work / f"{workload}.{peer}.memory.stderr"
    cmd = [sys.executable, "-m", "bench.peer", "--peer", peer, "--workload", workload,
           "--model-dir", str(model_dir), "--out", str(out), "--seed", str(seed),
           "--count", str(count), "--measure-memory"]
    with open(stderr_path, "w") as stderr:
        try:
            subprocess.run(cmd, cwd=REPO_ROOT, env=peer_env(), stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=stderr, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"memory_status": f"error: timeout after {timeout:.0f}s"}
    record = json.loads(out.read_text()) if out.exists() else {"status": "error: no record"}
    if record.get("status") != "ok":
        print(f"[bench] {workload}/{peer} memory pass failed:\n"
              f"{stderr_path.read_text(errors='replace')[-2000:]}", file=sys.stderr)
        return {"memory_status": record.get("status")}
    return {key: record.get(key) for key in MEMORY_FIELDS}


class PeerProcess:
    """One peer's process: progress lines feed the bar, ``@ready``/``@hotdone`` are events."""

    def __init__(self, cmd: list[str], stderr_path: pathlib.Path, bar: ProgressBar | None) -> None:
        env = peer_env()
        self.stderr_path = stderr_path
        self._stderr: TextIO = open(stderr_path, "w")  # closed in finish()
        self.proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._stderr, text=True)
        self.bar = bar
        self.events: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            parts = line.split()
            if len(parts) == 4 and parts[0] == "@progress" and self.bar is not None:
                self.bar.update(parts[1], int(parts[2]), int(parts[3]))
            elif parts and parts[0] in ("@ready", "@hotdone"):
                self.events.put(parts[0])
        self.events.put("eof")

    def wait_event(self, deadline: float) -> str:
        """The next event, ``eof`` when the process closed stdout, ``timeout`` past ``deadline``."""
        try:
            return self.events.get(timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Empty:
            return "timeout"

    def send(self, line: str) -> bool:
        """Writes a command line to the peer; False if it has gone."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    def finish(self, deadline: float) -> bool:
        """Closes stdin and waits for the exit (killing it past ``deadline``); True if it exited."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        exited = True
        try:
            self.proc.wait(timeout=max(deadline - time.monotonic(), 1.0))
        except subprocess.TimeoutExpired:
            exited = False
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=10)
        self._stderr.close()
        return exited

    def stderr_tail(self) -> str:
        """The last 2000 characters the peer wrote on stderr."""
        return self.stderr_path.read_text(errors="replace")[-2000:]


def _record(peer: str, workload: str, out: pathlib.Path, pp: PeerProcess, exited: bool,
            timeout: float) -> Record:
    if not exited:
        record: Record = {"peer": peer, "workload": workload,
                          "status": f"error: timeout after {timeout:.0f}s"}
    elif out.exists():
        record = json.loads(out.read_text())
    else:
        record = {"peer": peer, "workload": workload,
                  "status": f"error: exit code {pp.proc.returncode}"}
    if record.get("status") not in ("ok", "not installed"):
        record["stderr_tail"] = pp.stderr_tail()
        print(f"[bench] {workload}/{peer} failed:\n{record['stderr_tail']}", file=sys.stderr)
    return record


def round_order(peers: list[str], round_no: int) -> list[str]:
    """The peers of hot round ``round_no`` in the order they run: as given in even rounds,
    reversed in odd ones, so that over a pair of rounds no peer always runs right after the
    same one (a peer that leaves the host slower, or its caches colder, for the next
    pass would otherwise always tax the same neighbour)."""
    return list(peers) if round_no % 2 == 0 else list(reversed(peers))


def run_workload(name: str, peers: list[str], model_dir: pathlib.Path, work: pathlib.Path,
                 count: int, seed: int, hot_repeats: int, timeout: float,
                 bar: ProgressBar | None = None) -> dict[str, Record]:
    """All ``peers`` on one workload; ``peers[0]`` writes the reference if it is ``tf``."""
    ref = work / "ref.npz" if "tf" in peers else None
    records: dict[str, Record] = {}
    live: dict[str, tuple[PeerProcess, pathlib.Path]] = {}

    def deadline() -> float:  # each step (setup + first pass, a hot pass, the exit) gets `timeout`
        return time.monotonic() + timeout

    def close(peer: str) -> None:
        pp, out = live.pop(peer)
        records[peer] = _record(peer, name, out, pp, pp.finish(deadline()), timeout)

    for peer in peers:
        python = peer_python(peer)
        if bar is not None:
            bar.start(f"{name}/{peer}")
        if python is None:
            records[peer] = {"peer": peer, "workload": name, "status": "not installed",
                             "note": "run `make bench-deps` for bench/.venv-ort"}
            if bar is not None:
                bar.finish("not installed")
            continue
        out = work / f"{name}.{peer}.json"
        cmd = [python, "-m", "bench.peer", "--peer", peer, "--workload", name,
               "--model-dir", str(model_dir), "--out", str(out), "--seed", str(seed),
               "--count", str(count), "--interleave", "--progress"]
        if ref is not None:
            cmd += ["--ref", str(ref)] + (["--write-ref"] if peer == "tf" else [])
        pp = PeerProcess(cmd, work / f"{name}.{peer}.stderr", bar)
        live[peer] = (pp, out)
        event = pp.wait_event(deadline())
        if event != "@ready":
            close(peer)
        if bar is not None:
            bar.finish("first pass done" if event == "@ready" else records[peer].get("status", "?"))

    if live and bar is not None:
        bar.start(f"{name} hot x{hot_repeats}")
    round_loads: list[float | None] = []
    for round_no in range(hot_repeats):
        round_loads.append(machine.load_average())
        for peer in round_order(list(live), round_no):
            pp = live[peer][0]
            if bar is not None:
                bar.label = f"{name} hot {round_no + 1}/{hot_repeats} {peer}"
            time.sleep(SETTLE_S)  # the previous peer's pool threads stop polling
            if not pp.send("hot") or pp.wait_event(deadline()) != "@hotdone":
                close(peer)
    if bar is not None and hot_repeats:
        bar.label = f"{name} hot x{hot_repeats}"
        bar.finish("done")
    for peer in list(live):
        live[peer][0].send("stop")
        close(peer)
    for record in records.values():
        if record.get("status") == "ok":
            record["round_loads"] = round_loads
    for peer in (p for p in peers if p in MEMORY_PEERS):  # one progress step each
        if bar is not None:
            bar.start(f"{name}/{peer} memory")
        if records.get(peer, {}).get("status") != "ok":
            if bar is not None:
                bar.finish("skipped (no timed record)")
            continue
        records[peer].update(measure_memory(peer, name, model_dir, work, count, seed, timeout))
        if bar is not None:
            bar.finish(records[peer].get("memory_status", "done"))
    return {peer: records[peer] for peer in peers if peer in records}
