"""Reproducible weights: the same values from a seed on any machine, numpy only.

Large float inputs of a replay case (a model's weights) are not shipped: the exporter
sets each such variable to ``synthetic(shape, seed, scale)`` before it asks TF for the
expected outputs, and the GPU side makes the same array from the seed. The values come
from splitmix64 over the element index, so they do not depend on numpy's random
generators (whose streams may change between versions).
"""

from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def synthetic(shape: tuple[int, ...] | list[int], seed: int, scale: float,
              offset: float = 0.0) -> np.ndarray:
    """float32 values uniform in ``offset`` +- scale*sqrt(3) (standard deviation
    ``scale``), a pure function of the arguments."""
    n = int(np.prod(shape, dtype=np.int64))
    with np.errstate(over="ignore"):
        z = _mix(np.arange(n, dtype=np.uint64) + np.uint64(seed) * _GOLDEN)
    unit = (z >> np.uint64(40)).astype(np.float64) / float(1 << 24)
    values = (unit * 2.0 - 1.0) * (scale * np.sqrt(3.0)) + offset
    return values.astype(np.float32).reshape(shape)


def _mix(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


#: Outputs larger than this many elements are compared at a sample of positions.
SAMPLE = 1 << 16
#: The sample always holds the first and last EDGE elements (partial blocks, tails).
EDGE = 4096


def sample_positions(n: int) -> np.ndarray:
    """The flat positions of an ``n``-element output that a replay compares: all of
    them up to ``SAMPLE``, else both ends and hashed positions in between (sorted)."""
    if n <= SAMPLE:
        return np.arange(n, dtype=np.int64)
    with np.errstate(over="ignore"):
        hashed = _mix(np.arange(SAMPLE - 2 * EDGE, dtype=np.uint64) + np.uint64(n) * _GOLDEN)
    picks = (hashed % np.uint64(n)).astype(np.int64)
    return np.unique(np.concatenate([np.arange(EDGE), np.arange(n - EDGE, n), picks]))
