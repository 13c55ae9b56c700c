"""Gathers and pads read in place by their consumers against their own kernels, in one process.

    python -m bench.reads_in_place              # prints a markdown table
    python -m bench.reads_in_place --isa x86-64-v3   # the AVX2 code path (disc and TF)

Each case is compiled twice through ``disc_tf.jit`` (strict): as the CPU backend
plans it (``PlanOptions.reads_in_place``: the consumer reads the table rows the ids
pick, or the unpadded tensor) and with that option off (an index kernel writes the
gathered or padded tensor, the consumer reads it). The two run in interleaved
rounds (A B, then B A, ...), each the best of back-to-back calls; the table gives
the median of the per-round ratios (off / on) with their range, and TF's time for
scale.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import numpy as np

VOCAB, HIDDEN, POSITIONS = 30000, 768, 1024
SHAPES = [(1, 128), (4, 256), (8, 512)]


def _cases(rng: np.random.Generator) -> dict:
    """name -> (function, input spec, input maker)."""
    import tensorflow as tf

    table = tf.constant(rng.normal(size=(VOCAB, HIDDEN)).astype(np.float32))
    positions = tf.constant(rng.normal(size=(POSITIONS, HIDDEN)).astype(np.float32))
    gamma = tf.constant(rng.normal(size=(HIDDEN,)).astype(np.float32))

    def embeddings(ids):
        """Token rows plus position rows, then a layer norm (GPT-2's first one)."""
        x = tf.gather(table, ids) + positions[: tf.shape(ids)[1]]
        mean = tf.reduce_mean(x, -1, keepdims=True)
        var = tf.reduce_mean(tf.square(x - mean), -1, keepdims=True)
        return (x - mean) * tf.math.rsqrt(var + 1e-5) * gamma

    def shifted(x):
        """A decoder's inputs shifted right by a step, added to themselves."""
        return tf.nn.relu(tf.pad(x, [[0, 0], [1, 0], [0, 0]])[:, :-1] * 2.0 + x)

    return {
        "embeddings + layer norm (gather)": (
            embeddings, tf.TensorSpec([None, None], tf.int32),
            lambda s: rng.integers(0, VOCAB, s).astype(np.int32)),
        "shifted sequence (pad)": (
            shifted, tf.TensorSpec([None, None, HIDDEN], tf.float32),
            lambda s: rng.normal(size=(*s, HIDDEN)).astype(np.float32)),
    }


def _compiled(fn, spec, in_place: bool):
    """``fn`` through disc_tf.jit, planned with or without reads in place (the plan
    options are read when the cluster compiles, at the first call)."""
    import tensorflow as tf

    import disc_tf
    from disc_tf import backends

    cpu = backends.BACKENDS["cpu"]
    backends.BACKENDS["cpu"] = dataclasses.replace(
        cpu, plan_options=dataclasses.replace(cpu.plan_options, reads_in_place=in_place))
    try:
        jitted = disc_tf.jit(tf.function(fn, input_signature=[spec]), min_cluster_size=1,
                             strict=True)
        jitted(np.zeros([2 if d is None else d for d in spec.shape], spec.dtype.as_numpy_dtype))
    finally:
        backends.BACKENDS["cpu"] = cpu
    return jitted


def _best(fn, x, calls: int) -> float:
    best = float("inf")
    for _ in range(calls):
        start = time.perf_counter()
        fn(x)
        best = min(best, time.perf_counter() - start)
    return best


def measure(rounds: int, seed: int = 0, shapes: list[tuple[int, int]] = SHAPES) -> list[dict]:
    """Per case and shape (``[batch, seq]``): seconds per call of each path (median
    over rounds) and the ratio off / on."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    records = []
    for name, (fn, spec, make) in _cases(rng).items():
        paths = {"on": _compiled(fn, spec, True), "off": _compiled(fn, spec, False),
                 "tf": tf.function(fn, input_signature=[spec])}
        for shape in shapes:
            x = make(shape)
            expected = paths["tf"](x).numpy()
            for p in ("on", "off"):
                np.testing.assert_allclose(paths[p](x).numpy(), expected, rtol=1e-4, atol=1e-4)
            times = {p: [] for p in paths}
            for r in range(rounds):
                for p in (("on", "off", "tf") if r % 2 else ("off", "on", "tf")):
                    times[p].append(_best(paths[p], x, 20))
            ratios = [off / on for off, on in zip(times["off"], times["on"])]
            records.append({"case": name, "shape": shape,
                            **{p: statistics.median(t) for p, t in times.items()},
                            "ratio": statistics.median(ratios), "low": min(ratios),
                            "high": max(ratios)})
    return records


def table(records: list[dict], isa: str) -> str:
    """The records as a markdown table."""
    lines = [f"ISA: {isa}; per-call ms, best of 20 calls, median of interleaved rounds; "
             "ratio = own kernel / read in place", "",
             "| case | shape | TF ms | own kernel ms | read in place ms | ratio (range) |",
             "|---|---|---:|---:|---:|---|"]
    for r in records:
        lines.append(f"| {r['case']} | {' x '.join(map(str, r['shape']))} | {r['tf'] * 1e3:.3f} | "
                     f"{r['off'] * 1e3:.3f} | {r['on'] * 1e3:.3f} | "
                     f"{r['ratio']:.2f} ({r['low']:.2f}-{r['high']:.2f}) |")
    return "\n".join(lines)


def main() -> None:
    """Command line: measure and print the table."""
    from bench.machine import add_isa_cap, capped_isa

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    add_isa_cap(parser)
    args = parser.parse_args()
    print(table(measure(args.rounds), capped_isa(args.isa)))


if __name__ == "__main__":
    main()
