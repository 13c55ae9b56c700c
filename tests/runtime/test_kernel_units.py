"""Each distinct kernel is compiled once: kernel units shared across layers, the
kernel cache across clusters, parallel compiles, and their failures."""

from __future__ import annotations

import os
import pathlib
import stat

import numpy as np
import pytest
import tensorflow as tf

from disc_tf import pipeline
from disc_tf.errors import CompileError
from disc_tf.runtime import cache, cpu_build, elf_check
from tests.harness import assert_matches_tf, compiled
from tests.stage_helpers import cluster_of, dyn

HIDDEN = 32


def _layer_norm(x: tf.Tensor, gamma: tf.Tensor, beta: tf.Tensor) -> tf.Tensor:
    mean = tf.reduce_mean(x, -1, keepdims=True)
    var = tf.reduce_mean(tf.square(x - mean), -1, keepdims=True)
    return (x - mean) * tf.math.rsqrt(var + 1e-6) * gamma + beta


def _layers(count: int, seed: int = 0):
    """``count`` identical residual blocks (GEMM, bias, GELU, layer norm) with their
    own weights, as a tf.function of ``[batch, seq, HIDDEN]``."""
    rng = np.random.default_rng(seed)
    weights = [(tf.constant(rng.normal(0, 0.2, (HIDDEN, HIDDEN)), tf.float32),
                tf.constant(rng.normal(0, 0.1, HIDDEN), tf.float32),
                tf.constant(1 + rng.normal(0, 0.1, HIDDEN), tf.float32),
                tf.constant(rng.normal(0, 0.1, HIDDEN), tf.float32)) for _ in range(count)]

    def fn(x):
        for w, b, gamma, beta in weights:
            h = tf.nn.gelu(tf.einsum("bsh,hk->bsk", x, w) + b, approximate=True)
            x = _layer_norm(x + h, gamma, beta)
        return x

    return fn


def _spec() -> tf.TensorSpec:
    return tf.TensorSpec([None, None, HIDDEN], tf.float32)


def test_layers_share_one_kernel_unit_each():
    fe = pipeline.front_end(cluster_of(_layers(3), _spec()))
    units = fe.sources.units
    coded = [k for k in fe.plan.kernels if k.kind != "library"]
    assert len(coded) >= 3 * len(units) / 2 and len(units) < len(coded), fe.plan.describe()
    for unit in units:
        # one translation unit per distinct kernel, launched once per layer
        assert fe.sources.device.count(f"// ---- {unit.name}") <= 1
        assert fe.sources.host.count(f"{unit.name}_") >= 3, unit.name
        assert "cluster" not in unit.text  # nothing in it names the cluster


def test_shared_units_compute_what_tf_does():
    fn = tf.function(_layers(3), input_signature=[_spec()])
    jitted = compiled(fn)
    rng = np.random.default_rng(1)
    for b, s in [(1, 1), (2, 7), (3, 33)]:
        x = tf.constant(rng.normal(size=(b, s, HIDDEN)), tf.float32)
        assert_matches_tf(fn, jitted, [x], rtol=1e-4, atol=1e-4)


def test_static_row_reads_take_no_template_flag():
    """A bias of static width runs along the row; one of dynamic width is decided per call."""
    static = pipeline.front_end(cluster_of(lambda x, b: tf.nn.softmax(x + b),
                                           tf.TensorSpec([None, 64]), tf.TensorSpec([64])))
    dynamic = pipeline.front_end(cluster_of(lambda x, b: tf.nn.softmax(x + b), dyn(2), dyn(1)))
    assert "template <bool" not in static.sources.device
    assert "template <bool" in dynamic.sources.device


@pytest.fixture
def fresh_cache(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    monkeypatch.setenv("DISC_TF_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_kernel_cache_serves_the_same_kernels_of_another_cluster(fresh_cache):
    two = pipeline.front_end(cluster_of(_layers(2, seed=1), _spec()))
    three = pipeline.front_end(cluster_of(_layers(3, seed=2), _spec()))
    assert {u.content_key for u in two.sources.units} == {u.content_key for u in three.sources.units}
    first = cpu_build.build(two.sources, "two", two.plan.num_kernels)
    assert (first.units_compiled, first.units_cached) == (len(two.sources.units), 0)
    # the compile profile: seconds of each translation unit compiled
    assert set(first.unit_seconds) == {"host runner"} | {u.name for u in two.sources.units}
    assert all(s > 0 for s in first.unit_seconds.values())
    second = cpu_build.build(three.sources, "three", three.plan.num_kernels)
    assert not second.from_cache  # another cluster: its own host runner and link
    assert (second.units_compiled, second.units_cached) == (0, len(three.sources.units))
    assert set(second.unit_seconds) == {"host runner"}
    assert elf_check.artifact_problem(second.data, "cpu") is None


def test_corrupt_kernel_object_is_compiled_again(fresh_cache):
    fe = pipeline.front_end(cluster_of(_layers(1), _spec()))
    units = fe.sources.units
    counts = cpu_build.UnitCounts()
    cpu_build.compile_and_link(fe.sources, "c", counts)
    assert counts.compiled == len(units) >= 1
    obj, _ = cache._paths(cpu_build.object_key(units[0]), create=False, suffix=cache.OBJECT)
    obj.write_bytes(b"\x7fELF" + obj.read_bytes()[4:-64])  # truncated
    counts = cpu_build.UnitCounts()
    data = cpu_build.compile_and_link(fe.sources, "c", counts)
    assert (counts.compiled, counts.cached) == (1, len(units) - 1)
    assert elf_check.artifact_problem(data, "cpu") is None


def test_a_failing_kernel_unit_is_a_compile_error(fresh_cache, tmp_path, monkeypatch):
    real = os.environ.get("DISC_TF_CXX") or "g++"
    fake = tmp_path / "cxx"
    fake.write_text("#!/bin/sh\n"
                    'case "$*" in *stitch_*) echo "stitch unit rejected" >&2; exit 1;; esac\n'
                    f'exec {real} "$@"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("DISC_TF_CXX", str(fake))
    fe = pipeline.front_end(cluster_of(_layers(1), _spec()))
    with pytest.raises(CompileError, match="stitch unit rejected"):
        cpu_build.build(fe.sources, "c", fe.plan.num_kernels)


def test_object_check_refuses_what_is_not_an_object():
    assert elf_check.object_problem(b"") is not None
    assert elf_check.object_problem(b"\x7fELF" + b"\0" * 100) is not None


@pytest.mark.parametrize(("raw", "expected"), [("3", 3), ("x", None), ("0", None), ("", None)])
def test_compile_jobs(raw, expected, monkeypatch):
    monkeypatch.setenv("DISC_TF_COMPILE_JOBS", raw)
    cores = len(os.sched_getaffinity(0))
    assert cpu_build.compile_jobs() == (expected or cores)
