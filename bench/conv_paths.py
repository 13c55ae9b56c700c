"""Conv2D without an im2col buffer against im2col + one GEMM, in one process.

    python -m bench.conv_paths                  # prints a markdown table
    python -m bench.conv_paths --rounds 9 --isa x86-64-v3   # the AVX2 code path

Each case is ``relu(conv2d(x, W) + b)`` with W and b variables, compiled twice
through ``disc_tf.jit``: once as the CPU backend plans it (``conv_rows``: one GEMM
per filter row over the input rows' overlapping windows, bias and ReLU on each
block of the last), once with the window fusions off (an im2col index kernel
writing the patches, then one GEMM with the epilogue). The two run in
interleaved rounds of back-to-back calls (A B A B ...); the table gives the
median of the per-round ratios (im2col time / windows time) with their range, and
TF's time for scale.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import statistics
import time

import numpy as np

#: name -> (input NHWC, filter HWIO, strides, padding): the image models' conv shapes
CASES = {
    "mobilenet stem 3x3/2, 3->32 @224": ((1, 224, 224, 3), (3, 3, 3, 32), 2, "SAME"),
    "resnet 3x3, 64->64 @56": ((1, 56, 56, 64), (3, 3, 64, 64), 1, "SAME"),
    "resnet 3x3/2, 128->128 @56": ((1, 56, 56, 128), (3, 3, 128, 128), 2, "SAME"),
    "resnet 3x3, 256->256 @14 x4": ((4, 14, 14, 256), (3, 3, 256, 256), 1, "SAME"),
    "resnet 3x3, 256->256 @28": ((1, 28, 28, 256), (3, 3, 256, 256), 1, "SAME"),
    "resnet 3x3, 512->512 @7 x8": ((8, 7, 7, 512), (3, 3, 512, 512), 1, "SAME"),
    "resnet stem 7x7/2, 3->64 @224": ((1, 224, 224, 3), (7, 7, 3, 64), 2, "SAME"),
    "unet 3x3, 32->32 @128 x2": ((2, 128, 128, 32), (3, 3, 32, 32), 1, "SAME"),
}


def _seconds(fn, x, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(x)
    return (time.perf_counter() - start) / calls


def _compiled(layer, spec, im2col: bool):
    """``layer`` through disc_tf.jit, its convolutions planned with or without the
    window fusions (the plan options are read when the cluster compiles)."""
    import tensorflow as tf

    import disc_tf
    from disc_tf import backends

    cpu = backends.BACKENDS["cpu"]
    if im2col:
        backends.BACKENDS["cpu"] = dataclasses.replace(
            cpu, plan_options=dataclasses.replace(cpu.plan_options, conv_taps=False))
    try:
        fn = disc_tf.jit(tf.function(lambda x: layer(x), input_signature=[spec]))
        fn(np.zeros([1 if d is None else d for d in [1, 8, 8, spec.shape[-1]]], np.float32))
    finally:
        backends.BACKENDS["cpu"] = cpu
    return fn


def _conv_layer(w, b, stride: int, padding: str):
    """``relu(conv2d(x, w) + b)`` with w and b captured (variables)."""
    import tensorflow as tf

    def layer(x):
        return tf.nn.relu(tf.nn.conv2d(x, w, stride, padding) + b)

    return layer


def measure(rounds: int, seed: int = 0, only: str = "") -> list[dict]:
    """Per case (those whose name matches the regex ``only``): seconds per call of each path
    (median over rounds) and the ratio."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    records = []
    for name, (shape, filt, stride, padding) in CASES.items():
        if not re.search(only, name):
            continue
        w = tf.Variable(rng.standard_normal(filt).astype(np.float32) / 8)
        b = tf.Variable(rng.standard_normal(filt[3]).astype(np.float32))

        layer = _conv_layer(w, b, stride, padding)

        spec = tf.TensorSpec([None, None, None, filt[2]], tf.float32)
        x = rng.standard_normal(shape).astype(np.float32)
        paths = {"windows": _compiled(layer, spec, False), "im2col": _compiled(layer, spec, True),
                 "tf": tf.function(layer, input_signature=[spec])}
        expected = paths["tf"](x).numpy()
        for fn in paths.values():
            np.testing.assert_allclose(fn(x).numpy(), expected, rtol=1e-3, atol=1e-3)
        flops = 2.0 * np.prod(expected.shape) * np.prod(filt[:3])
        calls = max(3, min(200, int(2e9 / flops)))
        times = {p: [] for p in paths}
        for _ in range(rounds):
            for p, fn in paths.items():
                times[p].append(_seconds(fn, x, calls))
        ratios = [i / w for i, w in zip(times["im2col"], times["windows"])]
        records.append({"case": name, **{p: statistics.median(t) for p, t in times.items()},
                        "ratio": statistics.median(ratios), "low": min(ratios),
                        "high": max(ratios), "gflops": flops / 1e9})
    return records


def table(records: list[dict], isa: str) -> str:
    """The records as a markdown table."""
    lines = [f"ISA: {isa}; per-call ms, median of interleaved rounds; ratio = im2col / windows",
             "", "| case | GFLOP | TF ms | im2col ms | windows ms | ratio (range) |",
             "|---|---:|---:|---:|---:|---|"]
    for r in records:
        lines.append(f"| {r['case']} | {r['gflops']:.2f} | {r['tf'] * 1e3:.2f} | "
                     f"{r['im2col'] * 1e3:.2f} | {r['windows'] * 1e3:.2f} | "
                     f"{r['ratio']:.2f} ({r['low']:.2f}-{r['high']:.2f}) |")
    return "\n".join(lines)


def main() -> None:
    """Command line: measure and print the table."""
    from bench.machine import add_isa_cap, capped_isa

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--cases", default="", help="only the cases whose name matches this regex")
    add_isa_cap(parser)
    args = parser.parse_args()
    print(table(measure(args.rounds, only=args.cases), capped_isa(args.isa)))


if __name__ == "__main__":
    main()
