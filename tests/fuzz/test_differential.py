"""Differential fuzzing: random registry-op programs, disc_tf against TF.

Each example jits one generated program (min_cluster_size=1) and runs TF and
disc on 3 shape sets.  Where TF raises (an invalid broadcast), disc must raise
InvalidArgumentError; otherwise outputs must match (rtol 1e-4, atol 1e-5,
NaN == NaN) and nothing may fall back to TF.

The slow variant runs ``DISC_TF_FUZZ_EXAMPLES`` examples (default 1000):
    DISC_TF_FUZZ_EXAMPLES=200 .venv/bin/python -m pytest -q -m slow tests/fuzz
The large-shape mode (slow) runs ``DISC_TF_FUZZ_LARGE_EXAMPLES`` programs (default
40, no matmuls) at shapes with one dim up to 2^20 + 3: long reductions and scans,
compared normwise (TF's own float running sums drift by ~1e-5 there).
Every run draws the same examples unless ``DISC_TF_FUZZ_SEED`` names a campaign's seed
(``fuzz_settings``).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, note
from hypothesis import strategies as st

import disc_tf
from disc_tf.runtime.target import resolve_target
from tests.fuzz.fuzz_settings import fuzzed
from tests.fuzz.graph_gen import TRIVIAL_MOVES, Program, programs, random_inputs, shape_sets

RTOL = 1e-4
ATOL = 1e-5
SLOW_EXAMPLES = int(os.environ.get("DISC_TF_FUZZ_EXAMPLES", "1000"))
LARGE_EXAMPLES = int(os.environ.get("DISC_TF_FUZZ_LARGE_EXAMPLES", "40"))


def check_program(program: Program, shape_list: list[list[tuple]], seed: int,
                  normwise: bool = False) -> None:
    """Runs ``program`` through TF and disc_tf at each shape set and compares
    (``normwise``: the absolute tolerance scales with the output's largest value)."""
    fn = program.function()
    tf_fn = tf.function(fn, input_signature=program.signature(), autograph=False)
    disc_tf.reset_stats()
    jitted = disc_tf.jit(tf_fn, min_cluster_size=1)
    assert jitted.report.compiled, f"nothing compiled:\n{program}"
    target = resolve_target("auto")  # $DISC_TF_TARGET=cuda-emu: the GPU code path
    assert all(c.target == target for c in jitted.report.compiled)
    errors = [c.error for c in jitted.report.clusters if c.error is not None]
    assert not errors, f"clusters left as TF ops: {errors}"
    rng = np.random.default_rng(seed)
    for shapes in shape_list:
        args = random_inputs(rng, shapes)
        try:
            # Eager TF is the reference: grappler may rewrite the graph
            # (e.g. Max(Erf(x)) -> Erf(Max(x)), which differs on empty x).
            expected = fn(*[tf.constant(a) for a in args])
        except tf.errors.OpError as e:
            note(f"TF raised {type(e).__name__} at {shapes}")
            with pytest.raises(tf.errors.InvalidArgumentError):
                jitted(*args)
            continue
        got = jitted(*args)
        for i, (e, g) in enumerate(zip(tf.nest.flatten(expected), tf.nest.flatten(got))):
            e, g = np.asarray(e), np.asarray(g)
            assert e.shape == g.shape, f"output {i} at {shapes}: shape {g.shape} != TF {e.shape}"
            assert e.dtype == g.dtype, f"output {i} at {shapes}: dtype {g.dtype} != TF {e.dtype}"
            finite = np.abs(e[np.isfinite(e)])
            atol = max(ATOL, RTOL * float(finite.max())) if normwise and finite.size else ATOL
            np.testing.assert_allclose(g, e, rtol=RTOL, atol=atol, equal_nan=True,
                                       err_msg=f"output {i} at shapes {shapes}")
    assert disc_tf.stats()["fallbacks"] == 0, disc_tf.stats()


@fuzzed(300, HealthCheck.filter_too_much)
@given(programs())
def test_every_program_computes_something(program):
    # A program of reshapes alone makes no cluster (they are trivial ops), so
    # check_program's "nothing compiled" would fail on it: the generator adds ops.
    assert not all(op in TRIVIAL_MOVES for op in program.ops), program


@st.composite
def cases(draw):
    program = draw(programs())
    return program, draw(shape_sets(program)), draw(st.integers(0, 2**16))


@fuzzed(50, HealthCheck.filter_too_much)
@given(cases())
def test_differential(case):
    check_program(*case)


@pytest.mark.slow
@fuzzed(SLOW_EXAMPLES, HealthCheck.filter_too_much)
@given(cases())
def test_differential_slow(case):
    check_program(*case)


@st.composite
def large_cases(draw):
    program = draw(programs(matmul=False))
    return program, draw(shape_sets(program, count=2, large=True)), draw(st.integers(0, 2**16))


@pytest.mark.slow
@fuzzed(LARGE_EXAMPLES, HealthCheck.filter_too_much)
@given(large_cases())
def test_differential_large_shapes(case):
    check_program(*case, normwise=True)
