"""A dependency-free text progress bar for the benchmark runner.

On a terminal the bar redraws in place; elsewhere (CI logs, pipes) it prints a
line only when a run starts, changes phase or ends, so logs stay short.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

WIDTH = 28


class ProgressBar:
    """Shows ``[k/N] workload/peer phase [####----] done/total`` for peer runs."""

    def __init__(self, total_runs: int, stream: TextIO | None = None) -> None:
        self.total_runs = total_runs
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.run = 0
        self.label = ""
        self.phase = ""
        self.started = time.perf_counter()
        self._last_len = 0

    def start(self, label: str) -> None:
        """A new peer run begins."""
        self.run += 1
        self.label = label
        self.phase = ""
        self.started = time.perf_counter()
        self._emit(self._line("starting", 0, 0), force=True)

    def update(self, phase: str, done: int, total: int) -> None:
        """Progress inside the current run (``phase`` is setup, first or hot)."""
        changed = phase != self.phase
        self.phase = phase
        self._emit(self._line(phase, done, total), force=changed)

    def finish(self, status: str) -> None:
        """The current run ended with ``status``."""
        elapsed = time.perf_counter() - self.started
        self._emit(f"[{self.run}/{self.total_runs}] {self.label}: {status} ({elapsed:.1f} s)",
                   force=True, final=True)

    def _line(self, phase: str, done: int, total: int) -> str:
        filled = int(WIDTH * done / total) if total else 0
        bar = "#" * filled + "-" * (WIDTH - filled)
        return (f"[{self.run}/{self.total_runs}] {self.label} {phase:<5} [{bar}] "
                f"{done}/{total} calls  {time.perf_counter() - self.started:.0f} s")

    def _emit(self, text: str, force: bool = False, final: bool = False) -> None:
        if self.tty:
            pad = " " * max(self._last_len - len(text), 0)
            self.stream.write("\r" + text + pad + ("\n" if final else ""))
            self._last_len = 0 if final else len(text)
            self.stream.flush()
        elif force:
            self.stream.write(text + "\n")
            self.stream.flush()
