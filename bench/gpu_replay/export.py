"""Exports replay cases: each compiled CUDA cluster of a model, with inputs and TF's outputs.

A machine with a GPU but no TensorFlow build for it (no network to install one, as on a
lent GPU machine) can still run every CUDA artifact disc_tf makes: ``check.py`` loads
each through the project's CUDA RAL and compares its outputs with TF's. This module
makes what it needs, on a machine with TF (no GPU):

1. compile the model with ``disc_tf.jit(target="cuda")``: the artifacts TF's GPU
   ``DiscCluster`` kernel would run (nvcc's fatbin inside);
2. run the rewritten graph on the CPU: the CPU kernel refuses a CUDA artifact and runs
   each cluster's fallback function, so every cluster's outputs are TF's own; fetch each
   cluster's inputs and outputs;
3. write ``manifest.json``, the artifacts, and inputs and outputs as ``.npy`` files.
   Float variables over 16 KiB are first set to ``synthetic`` values and recorded by
   seed, so the folder stays small (BERT-base's weights would be 57 MB).

    python -m bench.gpu_replay.export --out DIR [--models a,b] [--calls 3]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import pathlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

import disc_tf
from bench.gpu_replay import kinds
from bench.gpu_replay.synthetic import sample_positions, synthetic
from bench.workloads import WORKLOADS
from disc_tf import strict
from disc_tf.codegen import cuda_config

#: Float variables above this size are replaced by synthetic values, named by seed.
SYNTHETIC_BYTES = 16 * 1024
#: Tolerances of the comparison on the GPU, per element type: |got - want| <=
#: atol * rms(want) + rtol * |want| (the GPU sums in another order than TF's CPU
#: kernels, so the scale of an error is the output's).
TOLERANCE = {"float32": (1e-4, 1e-4), "float16": (4e-3, 4e-3), "bfloat16": (3e-2, 3e-2)}


@dataclass
class Model:
    """A function to compile, its module (kept alive: a method's tf.function holds its
    instance weakly) and its call arguments."""

    name: str
    fn: tf.types.experimental.PolymorphicFunction
    module: tf.Module | None
    calls: list[tuple[np.ndarray, ...]]
    #: The element type the outputs are computed in, where it is narrower than theirs
    #: (an f32 output of bf16 math is compared with bf16's tolerance).
    compute_dtype: str = ""


def bench_model(name: str, count: int) -> Model:
    """A bench workload at ``count`` shapes: its first in-range draws, and the largest."""
    w = WORKLOADS[name]
    module = w.make_module()
    rng = np.random.default_rng(7)
    shapes = w.shapes(seed=11, count=max(count - 1, 1))
    biggest = tuple(max(s[d] for s in w.shapes(seed=3, count=64)) for d in range(len(shapes[0])))
    calls = [(w.value_sampler(rng, s),) for s in [*shapes, biggest][:count]]
    return Model(name, module.__call__, module, calls)


Synthetic = dict[tuple, list[tuple[int, float, float, np.ndarray]]]


def _make_synthetic(value: np.ndarray, seed: int, made: Synthetic) -> np.ndarray:
    """``value`` itself if small, constant or not float32; else synthetic values of its
    shape, mean and standard deviation, recorded in ``made`` by (shape, dtype)."""
    if value.dtype != np.float32 or value.nbytes < SYNTHETIC_BYTES:
        return value
    scale, offset = float(np.std(value)), float(np.mean(value))
    if not scale > 0:
        return value
    values = synthetic(value.shape, seed, scale, offset)
    made.setdefault((values.shape, "float32"), []).append((seed, scale, offset, values))
    return values


def _synthesize(model: Model) -> Synthetic:
    """Sets the large float variables and call arguments of ``model`` to synthetic
    values; returns them by (shape, dtype) with their seeds and scales."""
    made: Synthetic = {}
    # The concrete function's variables: a tf.Module's and a Keras model's alike.
    for seed, var in enumerate(model.fn.get_concrete_function().variables, start=1):
        values = _make_synthetic(var.numpy(), seed, made)
        var.assign(values)
    seed = 1000
    for c, args in enumerate(model.calls):
        model.calls[c] = tuple(_make_synthetic(a, seed := seed + 1, made) for a in args)
    return made


class _Store:
    """Writes arrays once each (named by content) under ``root``."""

    def __init__(self, root: pathlib.Path):
        self.root = root
        self.bytes = 0

    def put(self, data: bytes, suffix: str) -> str:
        name = hashlib.sha256(data).hexdigest()[:20] + suffix
        path = self.root / name
        if not path.exists():
            path.write_bytes(data)
            self.bytes += len(data)
        return name

    def array(self, value: np.ndarray) -> str:
        raw = value.view(np.uint16) if value.dtype.name == "bfloat16" else value
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(raw), allow_pickle=False)
        return self.put(buf.getvalue(), ".npy")


def _input_entry(value: np.ndarray, store: _Store, made: Synthetic) -> dict:
    """An input: its seed if it is one of the synthetic arrays, else its data."""
    entry = {"dtype": value.dtype.name, "shape": list(value.shape)}
    for seed, scale, offset, values in made.get((value.shape, value.dtype.name), []):
        if np.array_equal(values, value):
            entry["synthetic"] = {"seed": seed, "scale": scale, "offset": offset}
            return entry
    entry["file"] = store.array(value)
    return entry


def _output_entry(value: np.ndarray, store: _Store) -> dict:
    """An expected output: its values at ``sample_positions`` and, in float64, the sum
    and the sum of squares of all of it."""
    flat = value.reshape(-1)
    wide = flat.astype(np.float64)
    return {"dtype": value.dtype.name, "shape": list(value.shape),
            "sample": store.array(flat[sample_positions(flat.size)]),
            "sum": float(wide.sum()), "sum_squares": float(np.square(wide).sum())}


def export_model(model: Model, store: _Store) -> list[dict]:
    """Compiles ``model`` for CUDA and returns one manifest entry per cluster and call."""
    made = _synthesize(model)
    started = time.perf_counter()
    jitted = disc_tf.jit(model.fn, target="cuda", min_cluster_size=1, strict=False)
    compile_s = time.perf_counter() - started
    refused = [(c.name, c.error) for c in jitted.report.clusters if c.error]
    wrapped = jitted.graph_function  # the rewritten graph, imported under "disc/"
    nodes = [n for n in jitted.graph_def.node if n.op == "DiscCluster"]
    ops = [wrapped.graph.get_operation_by_name("disc/" + n.name) for n in nodes]
    # every cluster's inputs and outputs, then the function's outputs
    fetches = [t for op in ops for t in (*op.inputs, *op.outputs)] + list(wrapped.outputs)
    run = wrapped.prune(feeds=wrapped.inputs[:len(model.calls[0])], fetches=fetches)
    entries = []
    with _fallback_allowed():
        _run_calls(model, nodes, ops, run, store, made, compile_s, entries)
    if refused:
        entries.append({"model": model.name, "refused": refused})
    return entries


@contextlib.contextmanager
def _fallback_allowed():
    """Strict mode off: the CPU kernel must run each CUDA cluster's fallback (TF)."""
    old = os.environ.get(strict.ENV)
    os.environ[strict.ENV] = "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ[strict.ENV]
        else:
            os.environ[strict.ENV] = old


def _run_calls(model, nodes, ops, run, store, made, compile_s, entries) -> None:
    """Runs ``model``'s calls on the CPU and appends a manifest entry per cluster and call."""
    for call, args in enumerate(model.calls):
        values = [np.asarray(v) for v in run(*map(tf.constant, args))]
        want = [np.asarray(v) for v in tf.nest.flatten(model.fn(*args))]
        got = values[len(values) - len(want):]
        # The CPU ran every cluster's fallback: TF's answer, up to the order of its sums and
        # the rounding of the compute type, which TF's graph of the optimized function may
        # pick otherwise than the plain function's (seen: 2 f16 ulps in a softmax; 1e-4 on
        # the small elements of a Gram matrix whose diagonal is 1e3). The GPU's own bound.
        rtol, atol = TOLERANCE[model.compute_dtype or "float32"]
        for w, g in zip(want, got, strict=True):
            w64 = np.asarray(w, np.float64)
            rms = float(np.sqrt(np.mean(np.square(w64)))) if w64.size else 0.0
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol * rms + 1e-6)
        at = 0
        for node, op in zip(nodes, ops):
            ins = values[at: at + len(op.inputs)]
            outs = values[at + len(op.inputs): at + len(op.inputs) + len(op.outputs)]
            at += len(op.inputs) + len(op.outputs)
            artifact = store.put(node.attr["artifact"].s, ".so")
            entries.append({
                "model": model.name, "cluster": node.name, "call": call,
                "arg_shapes": [list(np.shape(a)) for a in args],
                "artifact": artifact, "kernels": int(node.attr["num_kernels"].i),
                "compute_dtype": model.compute_dtype,
                "compile_seconds": round(compile_s, 2),
                "inputs": [_input_entry(v, store, made) for v in ins],
                "outputs": [_output_entry(v, store) for v in outs],
            })


def models(names: list[str], count: int) -> list[Model]:
    """The bench workloads and kernel-kind functions named in ``names``."""
    out = []
    for name in names:
        if name in WORKLOADS:
            out.append(bench_model(name, count))
        else:
            fn, make_args = kinds.KINDS[name]
            rng = np.random.default_rng(5)
            out.append(Model(name, fn, None, [make_args(rng, i) for i in range(count)],
                             kinds.COMPUTE_DTYPES.get(name, "")))
    return out


def parse_variant(text: str) -> dict[str, int]:
    """``"WARP_ROW_MAX=0,THREAD_REDUCE_MIN=64"`` -> settings of ``cuda_config`` ("": none)."""
    settings = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        if not hasattr(cuda_config, name) or not isinstance(getattr(cuda_config, name), int):
            raise ValueError(f"not an integer setting of disc_tf.codegen.cuda_config: {name}")
        settings[name] = int(value)
    return settings


@contextlib.contextmanager
def cuda_config_variant(settings: dict[str, int]):
    """The CUDA backend's launch constants set to ``settings`` (in cuda_config and every
    CUDA codegen module that imported them) while the block runs."""
    modules = [m for n, m in sorted(sys.modules.items()) if n.startswith("disc_tf.codegen.cuda")]
    saved = [(m, name, getattr(m, name)) for m in modules for name in settings if hasattr(m, name)]
    try:
        for m, name, _ in saved:
            setattr(m, name, settings[name])
        yield
    finally:
        for m, name, value in saved:
            setattr(m, name, value)


def export(out: pathlib.Path, names: list[str], count: int,
           progress: Callable[[str], None] = print, variants: tuple[str, ...] = ("",),
           variant_names: list[str] | None = None) -> dict:
    """Exports ``names`` into ``out`` (manifest.json and the files it names), once per
    variant of the CUDA launch constants (a variant's models are named ``model[A=1+B=2]``,
    so that one GPU run times the variants side by side; ``variant_names``, if given, are
    the models the non-default variants export)."""
    out.mkdir(parents=True, exist_ok=True)
    store = _Store(out)
    cases = []
    for variant in variants:
        settings = parse_variant(variant)
        tag = "+".join(f"{k}={v}" for k, v in settings.items())
        for model in models(variant_names if tag and variant_names else names, count):
            if tag:
                model.name = f"{model.name}[{tag}]"
            started = time.perf_counter()
            with cuda_config_variant(settings):
                cases.extend(export_model(model, store))
            progress(f"{model.name}: {time.perf_counter() - started:.1f} s, "
                     f"{store.bytes / 2**20:.1f} MiB so far")
    manifest = {"tolerance": TOLERANCE, "cases": cases, "tensorflow": tf.__version__}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def main(argv: list[str] | None = None) -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=pathlib.Path)
    parser.add_argument("--models", default=",".join([*kinds.KINDS, *DEFAULT_MODELS]))
    parser.add_argument("--calls", type=int, default=3, help="calls (shapes) per model")
    parser.add_argument("--variants", default="", help="';'-separated variants of the CUDA "
                        "launch constants, each 'NAME=VALUE,...' of disc_tf/codegen/cuda_config.py "
                        "('' is the default), e.g. ';WARP_ROW_MAX=0'")
    parser.add_argument("--variant-models", default="",
                        help="models of the non-default variants (default: --models)")
    args = parser.parse_args(argv)
    export(args.out, [m for m in args.models.split(",") if m], args.calls,
           variants=tuple(args.variants.split(";")),
           variant_names=[m for m in args.variant_models.split(",") if m] or None)


#: The bench workloads exported by default (every kind of kernel the bench reaches).
DEFAULT_MODELS = ["bert_small", "bert_base", "recommender_tower", "fastspeech_conv",
                  "keras_encoder", "gpt2_decoder", "mobilenet_v2", "feature_normalizer",
                  "swish_layer_stack", "gelu_bias_stream"]

if __name__ == "__main__":
    main()
