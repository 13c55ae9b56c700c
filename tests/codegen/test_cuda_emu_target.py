"""The ``cuda-emu`` target: the CUDA backend's device code and host runner, built
against the CPU emulation of a GPU, run by the CPU DiscCluster kernel. Each case
is jitted for ``cuda-emu`` (strict: a refusal or a fallback fails), picks the
kernel version its shape calls for (warp or block rows, thread or block per
output), and matches TensorFlow."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from disc_tf.sources import Sources
from tests.harness import tf_ops_left
from tests.stage_helpers import dyn


def layer_norm(x, g, b):
    mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
    return (x - mean) * tf.math.rsqrt(var + 1e-5) * g + b


CASES = {
    "layer_norm": (layer_norm, dyn(2), dyn(1), dyn(1)),
    "softmax": (lambda x: tf.nn.softmax(x), dyn(3)),
    "bias_gelu": (lambda x, b: tf.nn.gelu(x + b, approximate=False), dyn(2), dyn(1)),
    "matmul_bias": (lambda x, w, b: tf.nn.relu(tf.matmul(x, w) + b), dyn(2), dyn(2), dyn(1)),
    "batched_matmul_t": (lambda x, y: tf.matmul(x, y, transpose_b=True) * 0.5, dyn(3), dyn(3)),
    "broadcast": (lambda x, y: x * y + 1.0, dyn(3), dyn(3)),
    "column_reduce": (lambda x: tf.reduce_max(x * 2.0, axis=0), dyn(2)),
    "row_sum": (lambda x: tf.reduce_sum(x, axis=-1), dyn(2)),
    "column_sum": (lambda x: tf.reduce_sum(x, axis=0), dyn(2)),
    "row_prod": (lambda x: tf.reduce_prod(x, axis=-1), dyn(2)),
    "argmax_last": (lambda x: tf.argmax(x, axis=-1, output_type=tf.int32), dyn(2)),
    "argmin_first": (lambda x: tf.argmin(x, axis=0, output_type=tf.int32), dyn(2)),
    "inner_sum": (lambda x: tf.reduce_sum(x, axis=[1, 2]), dyn(3)),
    "inner_sum_transposed": (lambda x: tf.reduce_sum(tf.transpose(x, [0, 2, 1]), axis=[1, 2]),
                             dyn(3)),
    "transposed_row_sum": (lambda x: tf.reduce_sum(tf.transpose(x), axis=-1), dyn(2)),
    "layer_norm_f16": (layer_norm, dyn(3, tf.float16), dyn(1, tf.float16), dyn(1, tf.float16)),
    "constants": (lambda x: x * tf.constant([1.0, 2.0, 3.0]) + tf.constant([0.5, 0.25, 0.125]),
                  tf.TensorSpec([None, 3])),
}
_JITTED: dict[str, object] = {}


def emulated(name: str):
    """CASES[name] jitted for cuda-emu (once per session); asserts it compiled whole."""
    if name not in _JITTED:
        fn, *specs = CASES[name]
        jitted = disc_tf.jit(tf.function(fn, input_signature=list(specs)), min_cluster_size=1,
                             strict=True, target="cuda-emu")
        assert jitted.report.compiled and not tf_ops_left(jitted), jitted.report
        assert {c.target for c in jitted.report.compiled} == {"cuda-emu"}
        _JITTED[name] = (fn, jitted)
    return _JITTED[name]


def check(name: str, *args, rtol: float = 1e-5, atol: float = 1e-6):
    fn, jitted = emulated(name)
    want = fn(*[tf.constant(a) for a in args]).numpy()
    got = jitted(*args).numpy()
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol,
                               atol=atol)
    return got


def rand(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# warp rows, block rows with the row cached in shared memory, block rows
@pytest.mark.parametrize("shape", [(3, 5, 37), (2, 1, 3000), (1, 2, 13000), (0, 4, 5)])
def test_softmax(shape):
    check("softmax", rand(np.random.default_rng(1), *shape))


@pytest.mark.parametrize("shapes", [((4, 50), (50,), (50,)), ((3, 1500), (1,), (1500,))])
def test_layer_norm(shapes):
    rng = np.random.default_rng(2)
    check("layer_norm", *(rand(rng, *s) for s in shapes), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shapes", [((3, 7), (7,)), ((3, 300), (300,)), ((2, 8), (8,))])
def test_bias_gelu_vector_and_flat_versions(shapes):
    rng = np.random.default_rng(3)
    check("bias_gelu", *(rand(rng, *s) for s in shapes))


# strided per element, flat, vectorized, few rows (per element); dims merged (the inner
# two), merged through a size-1 dim, not mergeable (a broadcast in the middle); rows
@pytest.mark.parametrize("shapes", [((2, 3, 4), (1, 3, 1)), ((2, 3, 4), (2, 3, 4)),
                                    ((2, 3, 5), (2, 3, 5)), ((1, 2, 200), (3, 1, 200)),
                                    ((3, 4, 64), (1, 4, 64)), ((3, 1, 70), (1, 1, 70)),
                                    ((2, 1, 64), (2, 5, 64)), ((2, 5, 1), (1, 5, 30)),
                                    ((3, 70, 1), (1, 70, 1)), ((260, 1, 130), (1, 1, 130))])
def test_broadcast_versions(shapes):
    rng = np.random.default_rng(4)
    check("broadcast", *(rand(rng, *s) for s in shapes))


@pytest.mark.parametrize("m,k,n", [(5, 7, 3), (1, 64, 33), (4, 0, 3)])
def test_matmul_through_the_cublas_mapping(m, k, n):
    rng = np.random.default_rng(5)
    check("matmul_bias", rand(rng, m, k), rand(rng, k, n), rand(rng, n), rtol=1e-5, atol=1e-5)


def test_batched_transposed_matmul():
    rng = np.random.default_rng(10)
    check("batched_matmul_t", rand(rng, 3, 5, 8), rand(rng, 3, 6, 8), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(5, 3000), (600, 3)])  # thread per output, block per output
def test_column_reduce_versions(shape):
    check("column_reduce", rand(np.random.default_rng(6), *shape))


# rows of adjacent elements: thread per output (short rows), warp per output (many rows,
# or rows shorter than a block), block per output, split over blocks (few long rows)
@pytest.mark.parametrize("shape", [(3000, 10), (3000, 40), (5, 300), (5, 3000), (3, 70000)])
def test_row_sum_versions(shape):
    check("row_sum", rand(np.random.default_rng(11), *shape), rtol=1e-5, atol=1e-4)


# a reduce kernel over adjacent elements: thread (under a warp's worth), warp (many
# outputs), block (few outputs), split (few outputs over very many elements)
@pytest.mark.parametrize("shape", [(5, 3, 7), (3000, 4, 10), (5, 20, 30), (2, 300, 200)])
def test_inner_sum_versions(shape):
    x = rand(np.random.default_rng(15), *shape)
    check("inner_sum", x, rtol=1e-5, atol=1e-4)  # the reduced dims as one run
    check("inner_sum_transposed", x, rtol=1e-5, atol=1e-4)  # strides not chained: per dim


@pytest.mark.parametrize("shape", [(40, 3000), (3000, 5)])  # reduced elements strided
def test_transposed_row_sum(shape):
    check("transposed_row_sum", rand(np.random.default_rng(12), *shape), rtol=1e-5, atol=1e-4)


def ties_and_nans(rng, *shape):
    """Few distinct values (ties everywhere), NaNs first in some rows, later in others."""
    x = rng.integers(0, 4, shape).astype(np.float32)
    x[rng.random(shape) < 0.01] = np.nan
    x.reshape(-1, shape[-1])[::7, 0] = np.nan
    return x


# thread per output, warp per output (many outputs, or short), block per output
@pytest.mark.parametrize("shape", [(3000, 10), (3000, 40), (5, 200), (5, 3000), (2, 70000)])
def test_argmax_versions(shape):
    rng = np.random.default_rng(13)
    check("argmax_last", rand(rng, *shape))
    check("argmax_last", ties_and_nans(rng, *shape))


# reduced elements strided: thread (many outputs), warp (short), block (few, long)
@pytest.mark.parametrize("shape", [(40, 3000), (100, 50), (3000, 5)])
def test_argmin_strided_versions(shape):
    rng = np.random.default_rng(14)
    check("argmin_first", rand(rng, *shape))
    check("argmin_first", ties_and_nans(rng, *shape[::-1]).T.copy())


# 1 + 2^-12: a thread's float running sum drops the 2^-12 of every element once it
# passes 2^13, so 2^15 elements a thread (256 threads, block per row or per output)
# lose most of them (relative error 2e-4); folded in blocks combined pairwise, every
# partial sum is exact.
LONG = 2**23


@pytest.mark.parametrize("name,shape", [("row_sum", (1, LONG)), ("column_sum", (LONG, 2))])
def test_long_sums_fold_pairwise(name, shape):
    _, jitted = emulated(name)
    x = np.full(shape, 1 + 2**-12, np.float32)
    got = jitted(x).numpy()
    np.testing.assert_array_equal(got, np.full(got.shape, LONG + LONG // 2**12, np.float32))


def test_long_product_accumulates_in_double():
    _, jitted = emulated("row_prod")
    x = (1.0 + (np.random.default_rng(9).random((2, 2**20)) - 0.5) * 1e-5).astype(np.float32)
    np.testing.assert_allclose(jitted(x).numpy(), np.prod(x.astype(np.float64), -1), rtol=1e-6)


def test_f16_layer_norm_rounds_as_tf():
    rng = np.random.default_rng(7)
    args = [rand(rng, *s, dtype=np.float16) for s in [(2, 3, 40), (40,), (40,)]]
    check("layer_norm_f16", *args, rtol=2e-3, atol=2e-3)


def test_constant_tensors_are_device_globals():
    check("constants", rand(np.random.default_rng(8), 6, 3))


@pytest.mark.parametrize("shape", [(3, 0), (0, 0), (2, 1)])
def test_empty_rows_reduce_to_the_initial_value(shape):
    """Rows of no element still get their sum (0): the row count comes from the outer
    dims, never from elements / row length (found by the fuzzer under cuda-emu)."""
    _, jitted = emulated("row_sum")
    x = np.ones(shape, np.float32)
    np.testing.assert_array_equal(jitted(x).numpy(), x.sum(axis=-1))


def _softmax_build_commands(monkeypatch, tmp_path) -> list[list[str]]:
    """Jits softmax for cuda-emu into an empty cache, checks it against TF at two
    shapes, and returns the compiler commands of its build (the units', then the link)."""
    from disc_tf.runtime import cuda_emu_build

    monkeypatch.setenv("DISC_TF_CACHE_DIR", str(tmp_path / "cache"))
    commands: list[list[str]] = []
    popen = cuda_emu_build.subprocess.Popen

    def recording(cmd, *args, **kwargs):
        commands.append(list(cmd))
        for arg in cmd:  # the device unit, kept for a look at what it includes
            if arg.endswith("/device.cc"):
                shutil.copyfile(arg, tmp_path / "device_unit.cc")
        return popen(cmd, *args, **kwargs)

    monkeypatch.setattr(cuda_emu_build.subprocess, "Popen", recording)  # the link's too
    fn = lambda x: tf.nn.softmax(x * 3.0)  # noqa: E731 - not the cached CASES graph
    jitted = disc_tf.jit(tf.function(fn, input_signature=[dyn(2)]), min_cluster_size=1,
                         strict=True, target="cuda-emu")
    assert jitted.report.compiled and not tf_ops_left(jitted), jitted.report
    rng = np.random.default_rng(21)
    for shape in [(3, 70), (5, 1030)]:
        x = rand(rng, *shape)
        np.testing.assert_allclose(jitted(x).numpy(), fn(tf.constant(x)).numpy(),
                                   rtol=1e-5, atol=1e-6)
    return [c for c in commands if "-c" in c] + [c for c in commands if "-shared" in c]


def test_units_see_c_headers_only_and_link_the_prebuilt_launch_loop(monkeypatch, tmp_path):
    """Each process prepares once what every artifact links (the launch loop, the
    emulated RAL); the device unit parses the emulator's device API and its own
    <math.h> before the system headers, and neither unit reads a C++ library header."""
    from disc_tf.runtime import cuda_emu_build

    pre = cuda_emu_build.prebuilt_dir()
    assert pre is not None and cuda_emu_build.prebuilt_dir() == pre
    assert all((pre / name).stat().st_size > 0 for name in cuda_emu_build.PREBUILT)
    device, host, link = _softmax_build_commands(monkeypatch, tmp_path)
    emulator = cuda_emu_build.header_dirs()["emu"] / "cuda_emulator.h"
    assert device[device.index("-include") + 1] == str(emulator)  # not the working dir's
    includes = [a for a in device if a.startswith("-I")]
    assert includes[0] == f"-I{cuda_emu_build.header_dirs()['emu_device_include']}"
    assert "-include" not in host  # the runner as generated: C and RAL headers only
    # the launch loop and the emulated RAL come linked, not compiled in the units
    assert {str(pre / o) for o in ("emu_runtime.o", "emu_host_runtime.o")} <= set(link)
    assert link[1:1 + len(cuda_emu_build.link_flags())] == cuda_emu_build.link_flags()
    runner = Sources("cuda", device="", host="// the host runner\n")
    assert cuda_emu_build.host_unit(runner, ral_linked=True) == runner.host
    assert '#include "emu_ral.h"' in cuda_emu_build.host_unit(runner)
    # the headers the device unit reads: none of the C++ library's
    deps = subprocess.run([*device[:device.index("-c")], "-M", str(tmp_path / "device_unit.cc")],
                          capture_output=True, text=True, check=True).stdout
    assert "device_include/math.h" in deps and "cuda_fp16.h" in deps, deps
    assert "/c++/" not in deps, deps


def test_units_without_the_prebuilt_parts_compute_the_same(monkeypatch, tmp_path, caplog):
    """Where the shared parts cannot be made, each build compiles the launch loop with
    its units and the RAL in its host unit (a warning says so); the artifact computes
    the same."""
    from disc_tf.errors import CompileError
    from disc_tf.runtime import cuda_emu_build

    def broken(output, key, out_dir):
        raise CompileError(f"cannot build {output}")

    monkeypatch.setattr(cuda_emu_build, "_prebuilt", {})
    monkeypatch.setattr(cuda_emu_build, "_prebuild", broken)
    with caplog.at_level("WARNING", logger="disc_tf.runtime"):
        commands = _softmax_build_commands(monkeypatch, tmp_path)
    assert "no prebuilt launch loop and RAL" in caplog.text
    units, link = commands[:-1], commands[-1]
    assert any(c[c.index("-c") + 1].endswith("emu_runtime.cc") for c in units)
    assert not any(o.endswith("emu_host_runtime.o") for o in link)
