"""Ratios of interleaved hot passes: the median of per-round ratios and their spread.

The driver runs the peers' hot passes in rounds (tf, xla, disc, ort, tf, ...), so
round ``k`` of two peers ran minutes apart at most, under the same load. A ratio
taken within each round cancels most of the load that a shared host adds to both;
the median over rounds is the result and the smallest and largest per-round ratio
its spread. A spread that crosses 1.0 is a tie, whatever the median says.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class RoundRatio:
    """``slow / fast`` per round (> 1: the measured peer is faster), summarised."""

    median: float
    low: float
    high: float
    rounds: int

    @property
    def verdict(self) -> str:
        """"faster", "slower" or "tie" (the spread crosses 1.0)."""
        if self.low > 1.0:
            return "faster"
        if self.high < 1.0:
            return "slower"
        return "tie"

    def meets(self, target: float) -> str:
        """Against a speed-up ``target`` (>= 1): "ok" when the median reaches it and every
        round was faster, "tie" when the spread crosses 1.0, else "miss"."""
        if self.verdict == "tie":
            return "tie"
        return "ok" if self.verdict == "faster" and self.median >= target else "miss"

    def as_dict(self) -> dict[str, Any]:
        """Printable form, with the verdict."""
        return {**asdict(self), "verdict": self.verdict}

    def cell(self) -> str:
        """``1.23x (1.10-1.31)``."""
        return f"{self.median:.2f}x ({self.low:.2f}-{self.high:.2f})"


def round_ratio(peer_runs: list[float], other_runs: list[float]) -> RoundRatio | None:
    """``other / peer`` per round over the rounds both ran; None without a common round."""
    pairs = [(p, o) for p, o in zip(peer_runs, other_runs) if p > 0 and o > 0]
    if not pairs:
        return None
    ratios = [o / p for p, o in pairs]
    return RoundRatio(statistics.median(ratios), min(ratios), max(ratios), len(ratios))


def from_records(records: dict[str, dict[str, Any]], peer: str, other: str) -> RoundRatio | None:
    """How many times faster ``peer`` ran than ``other``, round by round."""
    a, b = records.get(peer, {}), records.get(other, {})
    if a.get("status") != "ok" or b.get("status") != "ok":
        return None
    return round_ratio(a.get("hot_pass_runs_s") or [], b.get("hot_pass_runs_s") or [])
