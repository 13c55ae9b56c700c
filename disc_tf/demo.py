"""``make demo``: optimize a dynamic-shape model, run it at many shapes,
compare every output with TensorFlow, report compile count and speed.

Run with ``python -m disc_tf.demo [--shapes N] [--seed S]``.
"""

from __future__ import annotations

import argparse
import pathlib
import tempfile
import time

import numpy as np
import tensorflow as tf

HIDDEN = 256


class FeedForwardTail(tf.Module):
    """The elementwise tail of a transformer feed-forward block, every dim dynamic
    except the hidden size: bias, tanh-GELU, gating, residual, scaling."""

    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        self.bias = tf.Variable(rng.standard_normal(HIDDEN).astype(np.float32) * 0.1)
        self.gate = tf.Variable(rng.standard_normal(HIDDEN).astype(np.float32))
        self.scale = tf.Variable(0.5)

    @tf.function(input_signature=[tf.TensorSpec([None, None, HIDDEN], tf.float32),
                                  tf.TensorSpec([None, None, HIDDEN], tf.float32)])
    def __call__(self, x, residual):
        h = x + self.bias
        gelu = 0.5 * h * (1.0 + tf.tanh(0.7978845608 * (h + 0.044715 * h * h * h)))
        gated = gelu * tf.sigmoid(h * self.gate)
        out = residual + self.scale * gated
        return tf.maximum(tf.minimum(out, 6.0), -6.0)


def shape_stream(count: int, seed: int) -> list[tuple[int, int]]:
    """``count`` distinct (batch, seq) pairs, like a serving request stream."""
    rng = np.random.default_rng(seed)
    seen: list[tuple[int, int]] = []
    while len(seen) < count:
        shape = (int(rng.integers(1, 9)), int(rng.integers(8, 513)))
        if shape not in seen:
            seen.append(shape)
    return seen


def _time_stream(fn, inputs) -> tuple[float, list]:
    outs = []
    start = time.perf_counter()
    for x, r in inputs:
        outs.append(fn(x, r).numpy())
    return time.perf_counter() - start, outs


def main(argv: list[str] | None = None) -> int:
    """Runs the demo; returns a process exit code."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", type=int, default=24, help="distinct input shapes")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)

    import disc_tf
    from disc_tf.saved_model import optimize_saved_model

    work = pathlib.Path(tempfile.mkdtemp(prefix="disc_tf_demo_"))
    model = FeedForwardTail()
    tf.saved_model.save(model, str(work / "model"))
    print(f"saved a dynamic-shape model to {work / 'model'}  (input [batch, seq, {HIDDEN}])")

    disc_tf.reset_stats()
    start = time.perf_counter()
    report = optimize_saved_model(str(work / "model"), str(work / "optimized"))
    compile_seconds = time.perf_counter() - start
    for c in report.clusters:
        kernels = f"{c.kernels} kernel(s)"
        if c.speculative_kernels is not None:
            kernels += (f" ({c.kernels - c.speculative_kernels} general, {c.speculative_kernels} "
                        "when no dim is broadcast, chosen per call)")
        status = c.error or (kernels + ", "
                             + ("from cache" if c.from_cache else f"compiled in {c.compile_seconds:.2f}s"))
        print(f"  cluster {c.name} in {c.body}: {len(c.ops)} TF ops -> {status}")
    print(f"optimize: {compile_seconds:.2f}s total")

    original = tf.saved_model.load(str(work / "model"))
    optimized = disc_tf.load(str(work / "optimized"))  # its DiscCluster ops called directly
    rng = np.random.default_rng(args.seed)
    inputs = [
        (tf.constant(rng.standard_normal((b, t, HIDDEN)).astype(np.float32)),
         tf.constant(rng.standard_normal((b, t, HIDDEN)).astype(np.float32)))
        for b, t in shape_stream(args.shapes, args.seed)
    ]
    print(f"running a stream of {len(inputs)} distinct shapes, "
          f"batch 1-8 x seq 8-512 x {HIDDEN} ...")
    tf_first, expected = _time_stream(original, inputs)
    disc_first, got = _time_stream(optimized, inputs)
    worst = 0.0
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)
        worst = max(worst, float(np.max(np.abs(g - e))) if e.size else 0.0)
    tf_hot = min(_time_stream(original, inputs)[0] for _ in range(3))
    disc_hot = min(_time_stream(optimized, inputs)[0] for _ in range(3))
    plain = tf.saved_model.load(str(work / "optimized"))  # the same model, called TF's way
    _time_stream(plain, inputs)
    plain_hot = min(_time_stream(plain, inputs)[0] for _ in range(3))

    stats = disc_tf.stats()
    print(f"all {len(inputs)} outputs match TensorFlow (max abs error {worst:.2e})")
    print(f"clusters: {stats['clusters']}   kernels: {stats['kernels']}   "
          f"compilations: {stats['compilations']} (cache hits {stats['cache_hits']})   "
          f"fallbacks: {stats['fallbacks']}")
    print(f"compile count over {len(inputs)} shapes: {stats['compilations']} "
          f"(XLA would compile once per shape: {len(inputs)})")
    print(f"first pass: TF {tf_first * 1e3:.1f} ms, disc_tf {disc_first * 1e3:.1f} ms")
    print(f"hot pass:   TF {tf_hot * 1e3:.1f} ms, disc_tf {disc_hot * 1e3:.1f} ms "
          f"-> speed-up {tf_hot / disc_hot:.2f}x")
    direct = optimized.direct_functions().get("__call__", "no __call__")
    print("disc_tf calls: " + ("direct (disc_tf.load)" if direct is None
                               else f"through TF's function runtime ({direct})"))
    print(f"hot pass of the optimized model through tf.saved_model.load (TF's function "
          f"runtime): {plain_hot * 1e3:.1f} ms -> speed-up {tf_hot / plain_hot:.2f}x")
    if stats["fallbacks"] or not report.compiled:
        print("FAILED: disc_tf did not run compiled clusters")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
