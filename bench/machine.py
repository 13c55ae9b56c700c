"""What a benchmark's numbers were measured on: CPU, ISA, cores, load, versions, commit."""

from __future__ import annotations

import datetime
import os
import pathlib
import platform
import subprocess
from typing import Any

_REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent


def host_isa() -> str:
    """"AVX-512", "AVX2" or "neither", from ``/proc/cpuinfo``."""
    try:
        flags = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    return "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "neither"


def add_isa_cap(parser) -> None:
    """The ``--isa`` option of the one-process A/B scripts (``conv_paths``,
    ``reads_in_place``)."""
    parser.add_argument("--isa", choices=["x86-64-v3", "x86-64"], default=None,
                        help="cap disc_tf's and TF's code paths at this x86-64 level")


def capped_isa(cap: str | None) -> str:
    """Caps disc_tf's and TF's code paths at ``cap`` (if given, before they load
    their kernels) and names what runs: the host's ISA, the cap and the cores."""
    from bench.run import cap_isa

    isa = host_isa()
    if cap:
        cap_isa(cap)
        isa += f" capped at {cap}"
    return f"{isa}, {os.cpu_count()} cores"


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo ("unknown" elsewhere)."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_gib() -> float | None:
    """Total memory from /proc/meminfo, in GiB."""
    try:
        for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError):
        pass
    return None


def git_revision() -> str | None:
    """The checked-out commit (with ``+dirty`` when the tree has changes).

    ``BENCH_COMMIT`` names it instead, for a tree exported without ``.git``.
    """
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=_REPO_ROOT,
                             capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=_REPO_ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (rev + ("+dirty" if dirty else "")) or None


def machine_info(tf_version: str) -> dict[str, Any]:
    """What the numbers were measured on."""
    import numpy as np

    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": memory_gib(),
        "isa": host_isa(),
        "isa_cap": os.environ.get("DISC_TF_ISA") or None,
        "commit": git_revision(),
        "python": platform.python_version(),
        "tensorflow": tf_version,
        "numpy": np.__version__,
        "platform": platform.platform(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def load_average() -> float | None:
    """The 1-minute load average (other work on the machine skews the timings)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None
