"""Hypothesis settings the fuzzers share.

By default every run draws the same examples (derandomized), as CI needs. A campaign for
new examples names a seed; each seed draws other programs and blocks, and the same seed
draws the same ones again (a failure prints its reproduction blob too):

    DISC_TF_FUZZ_SEED=7 DISC_TF_FUZZ_EXAMPLES=400 .venv/bin/python -m pytest -q -m slow tests/fuzz
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, seed, settings

_RAW_SEED = os.environ.get("DISC_TF_FUZZ_SEED", "").strip()
#: The campaign's seed (``$DISC_TF_FUZZ_SEED``), or None for the derandomized examples.
FUZZ_SEED: int | None = int(_RAW_SEED) if _RAW_SEED else None


def fuzzed(max_examples: int, *health_checks: HealthCheck) -> Callable[[Any], Any]:
    """Settings (and the campaign's seed, if any) of a ``@given`` test drawing
    ``max_examples`` examples; ``health_checks`` are suppressed besides the slow-data ones."""
    chosen = settings(max_examples=max_examples, deadline=None, derandomize=FUZZ_SEED is None,
                      database=None, print_blob=FUZZ_SEED is not None,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                             *health_checks])

    def apply(test: Any) -> Any:
        test = chosen(test)
        return seed(FUZZ_SEED)(test) if FUZZ_SEED is not None else test

    return apply
