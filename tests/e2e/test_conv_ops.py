"""Conv2D (SAME/VALID/EXPLICIT, strides, dilations, 1x1), DepthwiseConv2dNative,
MaxPool/AvgPool and ArgMax/ArgMin inside clusters, against TF at random shapes
(including windows larger than the input for SAME padding and size-1 dims)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from disc_tf.runtime import isa
from tests import fresh_python
from tests.harness import assert_ops_compiled, assert_same, compiled, gpu_code_path, random_value
from tests.stage_helpers import dyn

F32 = tf.float32
# No empty batch: TF's own CPU Conv2D returns the *input* shape for one (0, H, W, C).
IMAGES = [(1, 5, 7, 3), (2, 8, 8, 3), (1, 1, 1, 3), (3, 4, 9, 3), (1, 6, 6, 3)]

CONVS = {
    "conv_same": (lambda x, w: tf.nn.relu(tf.nn.conv2d(x, w, 1, "SAME") + 1.0), (3, 3, 3, 5)),
    "conv_valid_stride2": (lambda x, w: tf.nn.conv2d(x, w, 2, "VALID") * 2.0, (1, 2, 3, 4)),
    "conv_same_strides_2_1": (lambda x, w: tf.nn.conv2d(x, w, [1, 2, 1, 1], "SAME") * 2.0,
                              (2, 3, 3, 4)),
    "conv_dilated": (lambda x, w: tf.nn.conv2d(x, w, 1, "SAME", dilations=2) * 2.0, (3, 3, 3, 4)),
    "conv_explicit": (lambda x, w: tf.nn.conv2d(x, w, 1, [[0, 0], [1, 2], [0, 1], [0, 0]]) + 1.0,
                      (2, 2, 3, 4)),
    "conv_1x1": (lambda x, w: tf.nn.conv2d(x, w, 1, "VALID") + 1.0, (1, 1, 3, 6)),
    "depthwise_same": (lambda x, w: tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME") + 1.0,
                       (3, 3, 3, 2)),
    "depthwise_valid_stride2": (lambda x, w: tf.nn.depthwise_conv2d(x, w, [1, 2, 2, 1], "VALID")
                                + 1.0, (1, 1, 3, 1)),
    "maxpool_valid": (lambda x, w: tf.nn.max_pool2d(x * 2.0, 2, 2, "VALID") + w[0, 0, 0, 0],
                      (1, 1, 1, 1)),
    "maxpool_same": (lambda x, w: tf.nn.max_pool2d(x * w[0, 0, 0, 0], 3, 2, "SAME") + 1.0,
                     (1, 1, 1, 1)),
    "avgpool_same": (lambda x, w: tf.nn.avg_pool2d(x * w[0, 0, 0, 0], 3, 2, "SAME") + 1.0,
                     (1, 1, 1, 1)),
    "avgpool_valid": (lambda x, w: tf.nn.avg_pool2d(x * w[0, 0, 0, 0], 2, 1, "VALID") + 1.0,
                      (1, 1, 1, 1)),
}


@pytest.mark.parametrize("name", sorted(CONVS))
def test_conv_and_pool_match_tf(name):
    fn, filter_shape = CONVS[name]
    # Depthwise convolutions need static channels (the group count is an attribute).
    image = tf.TensorSpec([None, None, None, 3], F32) if "depthwise" in name else dyn(4)
    tf_fn = tf.function(fn, input_signature=[image, tf.TensorSpec(filter_shape, F32)])
    disc_tf.reset_stats()
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(len(name))
    w = rng.normal(size=filter_shape).astype(np.float32)
    for shape in IMAGES:
        if "valid" in name and min(shape[1:3]) < filter_shape[0] + 1:
            continue  # TF itself rejects a window larger than a VALID input
        x = rng.normal(size=shape).astype(np.float32)
        expected, actual = tf_fn(x, w), jitted(x, w)
        np.testing.assert_allclose(actual.numpy(), expected.numpy(), rtol=1e-4, atol=1e-4)
    stats = disc_tf.stats()
    assert stats["fallbacks"] == 0 and stats["compilations"] + stats["cache_hits"] >= 1


def test_depthwise_with_dynamic_channels_stays_in_tf_with_a_reason():
    from disc_tf.cluster import clustering
    from disc_tf.cluster.graph_view import view_of_graph_def

    fn = tf.function(lambda x, w: tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME") + 1.0,
                     input_signature=[dyn(4), tf.TensorSpec([3, 3, 3, 1], F32)])
    gd = fn.get_concrete_function().graph.as_graph_def()
    reasons = clustering.find_clusters(view_of_graph_def(gd), min_cluster_size=1).reasons
    assert reasons["depthwise"] == "depthwise input channels must be static"


def test_depthwise_after_a_batch_norm_knows_its_channels():
    """MobileNet's block: the channel count comes from the first conv's filter and
    must survive the batch norm's broadcasts to reach the depthwise conv (which
    needs it static); the whole block is then one cluster."""
    import keras

    keras.utils.set_random_seed(0)
    block = keras.Sequential([
        keras.Input((None, None, 3)), keras.layers.Conv2D(8, 3, padding="same"),
        keras.layers.BatchNormalization(), keras.layers.ReLU(6.0),
        keras.layers.DepthwiseConv2D(3, padding="same"), keras.layers.Conv2D(4, 1)])
    fn = tf.function(lambda x: block(x), input_signature=[tf.TensorSpec([None, None, None, 3])])
    jitted = compiled(fn)
    assert len(jitted.report.compiled) == 1
    assert "DepthwiseConv2dNative" in {op for _, op in jitted.report.compiled[0].ops}
    rng = np.random.default_rng(1)
    for shape in [(2, 9, 7, 3), (1, 16, 16, 3), (3, 5, 12, 3)]:
        x = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(jitted(x), fn(x), rtol=1e-4, atol=1e-5)


def test_conv1d_is_conv2d_with_expand_dims():
    w = np.random.default_rng(0).normal(size=(3, 4, 6)).astype(np.float32)
    tf_fn = tf.function(lambda x: tf.nn.relu(tf.nn.conv1d(x, w, 1, "SAME") + 0.5),
                        input_signature=[tf.TensorSpec([None, None, 4], F32)])
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(1)
    for t in [1, 5, 16, 33, 2]:
        x = rng.normal(size=(2, t, 4)).astype(np.float32)
        np.testing.assert_allclose(jitted(x).numpy(), tf_fn(x).numpy(), rtol=1e-4, atol=1e-4)


CONV1D_TAPS = {  # (kernel width, padding, dilation, output channels)
    "k9_same": (9, "SAME", 1, 12), "k4_same_asymmetric": (4, "SAME", 1, 12),
    "k3_valid": (3, "VALID", 1, 12), "k3_same_dilated": (3, "SAME", 2, 12),
    "k2_valid_dilated": (2, "VALID", 3, 12), "k5_same_wide": (5, "SAME", 1, 70),
}


@pytest.mark.parametrize("name", sorted(CONV1D_TAPS))
def test_conv1d_runs_without_an_im2col_buffer(name):
    """No im2col buffer: undilated, one GEMM over the (padded) input's overlapping
    windows; dilated, a GEMM per tap adds the shifted input to the result (70 output
    channels: the few-row streamed GEMM block, accumulating)."""
    from disc_tf import pipeline
    from tests.stage_helpers import cluster_of

    width, padding, dilation, out = CONV1D_TAPS[name]
    w = np.random.default_rng(width).normal(size=(width, 8, out)).astype(np.float32)

    def fn(x):
        return tf.nn.relu(tf.nn.conv1d(x, w, 1, padding, dilations=dilation) + 0.5)

    spec = tf.TensorSpec([None, None, 8], F32)
    plan = pipeline.front_end(cluster_of(fn, spec)).plan
    assert [op.op for k in plan.kernels for op in k.ops if k.kind == "library"] == ["conv_taps"]
    assert not any(op.op == "im2col" for k in plan.kernels for op in k.ops), plan.describe()
    # Undilated, the one GEMM writes each block of C once: + 0.5 and ReLU run on each.
    (lib,) = [k for k in plan.kernels if k.kind == "library"]
    assert (lib.epilogue is not None) == (dilation == 1), plan.describe()
    tf_fn = tf.function(fn, input_signature=[spec])
    disc_tf.reset_stats()
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(2)
    reach = (width - 1) * dilation + 1  # VALID needs this many input columns
    for b, t in [(1, 40), (2, 7), (3, 1 if padding == "SAME" else reach), (1, 300), (2, reach)]:
        x = rng.normal(size=(b, t, 8)).astype(np.float32)
        np.testing.assert_allclose(jitted(x).numpy(), tf_fn(x).numpy(), rtol=1e-4, atol=1e-4)
    assert disc_tf.stats()["fallbacks"] == 0


CONV2D_ROWS = {  # filter (kh, kw, ci, co), strides, padding, dilations
    "k3_same": ((3, 3, 8, 12), [1, 1], "SAME", [1, 1]),
    "k3_valid_stride2": ((3, 3, 8, 12), [2, 2], "VALID", [1, 1]),
    "k2x4_same_strides_2_1": ((2, 4, 5, 70), [2, 1], "SAME", [1, 1]),
    "k3_same_dilated_h": ((3, 3, 8, 12), [1, 1], "SAME", [2, 1]),
    "k3_same_dilated_hw": ((3, 2, 8, 12), [1, 1], "SAME", [2, 3]),
    "k1_stride2": ((1, 1, 16, 12), [2, 2], "VALID", [1, 1]),
    "k5_explicit": ((5, 3, 8, 12), [1, 2], [[0, 0], [2, 1], [0, 3], [0, 0]], [1, 1]),
    "conv1d_stride2": ((1, 3, 8, 12), [1, 2], "SAME", [1, 1]),
    # gathered patches and one GEMM: shallow filter rows (an RGB stem), and big filter
    # rows at outputs narrower than PATCH_MAX_COLUMNS
    "k3_stem_rgb_stride2": ((3, 3, 3, 16), [2, 2], "SAME", [1, 1]),
    "k3_big_rows": ((3, 3, 128, 176), [1, 1], "SAME", [1, 1]),
    "k3_big_rows_dilated_w": ((3, 2, 128, 260), [2, 1], "SAME", [1, 2]),
}


@pytest.mark.parametrize("name", sorted(CONV2D_ROWS))
def test_conv2d_runs_without_an_im2col_buffer(name):
    """No im2col buffer: one GEMM per filter row (per tap when dilated along W) over
    the (padded) input rows' overlapping windows, each adding to the result; the bias
    and ReLU run on each block of the last one. Batch > 1, windows past the input,
    one-pixel images, 70 output channels (partial panels); shallow filter rows, and big
    ones at outputs narrower than ``PATCH_MAX_COLUMNS``, as one GEMM over gathered
    patches."""
    from disc_tf import pipeline
    from tests.stage_helpers import cluster_of

    filt, strides, padding, dilations = CONV2D_ROWS[name]
    rng = np.random.default_rng(len(name))
    w = rng.normal(size=filt).astype(np.float32)
    b = rng.normal(size=filt[3]).astype(np.float32)

    def fn(x):
        return tf.nn.relu(tf.nn.conv2d(x, w, strides, padding, dilations=dilations) + b)

    spec = tf.TensorSpec([None, None, None, filt[2]], F32)
    plan = pipeline.front_end(cluster_of(fn, spec)).plan
    (lib,) = [k for k in plan.kernels if k.kind == "library"]
    assert lib.ops[0].op == "conv_rows" and lib.epilogue is not None, plan.describe()
    assert not any(op.op == "im2col" for k in plan.kernels for op in k.ops), plan.describe()
    tf_fn = tf.function(fn, input_signature=[spec])
    jitted = compiled(tf_fn)
    assert_ops_compiled(jitted, {"Conv2D"})
    disc_tf.reset_stats()
    reach = [(k - 1) * d + 1 for k, d in zip(filt[:2], dilations)]
    shapes = [(2, 9, 11), (1, 17, 6), (3, reach[0], reach[1]), (1, 40, 33)]
    if padding == "SAME":
        shapes.append((2, 1, 1))
    for n, h, wd in shapes:
        x = rng.normal(size=(n, h, wd, filt[2])).astype(np.float32)
        np.testing.assert_allclose(jitted(x).numpy(), tf_fn(x).numpy(), rtol=1e-4, atol=1e-4)
    assert disc_tf.stats()["fallbacks"] == 0


_GATHERED_SCRIPT = """
import numpy as np, tensorflow as tf, disc_tf
rng = np.random.default_rng(31)
mem = tf.config.experimental
# (filter, strides): an RGB stem (filter rows 9 floats deep), and big filter rows at an
# output narrower than PATCH_MAX_COLUMNS
for filt, strides in (((3, 3, 3, 16), 2), ((3, 3, 128, 176), 1)):
    w = rng.normal(size=filt).astype(np.float32) / np.float32(np.prod(filt[:3]) ** 0.5)
    b = rng.normal(size=filt[3]).astype(np.float32)
    fn = tf.function(lambda x: tf.nn.relu(tf.nn.conv2d(x, w, strides, "SAME") + b),
                     input_signature=[tf.TensorSpec([None, None, None, filt[2]], tf.float32)])
    jitted = disc_tf.jit(fn, min_cluster_size=1)
    assert jitted.report.compiled
    for n, h, wd in ((2, 37, 29), (1, 1, 1), (3, 9, 14), (4, 20, 20)):
        x = tf.constant(rng.normal(size=(n, h, wd, filt[2])).astype(np.float32))
        np.testing.assert_allclose(jitted(x).numpy(), fn(x).numpy(), rtol=1e-4, atol=1e-4)
        mem.reset_memory_stats("CPU:0")
        before = mem.get_memory_info("CPU:0")["current"]
        jitted(x)
        oh, ow = -(-h // strides), -(-wd // strides)
        out = n * oh * ow * filt[3] * 4
        print("PEAK", filt[2], int(ow < 24), mem.get_memory_info("CPU:0")["peak"] - before, out,
              np.prod(filt[:3]) * out // filt[3])
# in a while loop's step: the step's RAL forwards sgemm_gathered_a to the call's
from tests.loop_steps import jit_looped
w_loop = tf.Variable(rng.normal(size=(3, 3, 3, 3)).astype(np.float32) / 3)
looped, jitted = jit_looped(lambda h, w: tf.nn.conv2d(h, w, 1, "SAME"), w_loop,
                            [None, None, None, 3])
for shape in ((2, 11, 13, 3), (1, 30, 4, 3)):
    x = rng.normal(size=shape).astype(np.float32)
    np.testing.assert_allclose(jitted(x).numpy(), looped(x).numpy(), rtol=1e-4, atol=1e-4)
assert disc_tf.stats()["fallbacks"] == 0
print("OK")
"""


@pytest.mark.cpu_backend  # the CPU backend's conv_rows
@pytest.mark.parametrize("gemm_isa", ["", "avx2", "baseline"], ids=["host", "avx2", "baseline"])
def test_gathered_window_convs_hold_no_im2col_buffer(tmp_path, gemm_isa):
    """The convolutions that run as one GEMM over the whole filter (shallow filter rows,
    big ones at narrow outputs) gather each task's windows into its own scratch (RAL
    sgemm_gathered_a, forwarded by a while loop's step too), on every GEMM path (the
    host's block, the AVX2 block, Eigen without one): the launch profile shows every
    call as such a GEMM, and with big
    filter rows the call's activation memory (TF's BFC allocator) stays a few outputs'
    worth where the gathered windows alone were 6.5 times the output."""
    import os
    import pathlib

    if gemm_isa == "avx2" and isa.host_level() == "x86-64":
        pytest.skip("the AVX2 GEMM block needs AVX2+FMA")
    repo = pathlib.Path(__file__).resolve().parents[2]
    profile = tmp_path / "profile.txt"
    env = dict(os.environ, DISC_TF_GEMM_ISA=gemm_isa, PYTHONPATH=str(repo),
               TF_CPU_ALLOCATOR_USE_BFC="true", DISC_TF_PROFILE=str(profile))
    proc = fresh_python.run(["-c", _GATHERED_SCRIPT], env=env, timeout=300)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
    rows = [line.split() for line in profile.read_text().splitlines()[2:]]
    gathered = sum(int(r[3]) for r in rows if len(r) > 3 and r[2] == "gathered")
    # Each shape's call twice: the stem's four, the big rows' three narrower than 24
    # output columns (29 columns run a GEMM per filter row); the loop's conv three
    # times a call, for two calls.
    assert gathered == 2 * (4 + 3) + 3 * 2, profile.read_text()
    for ci, narrow, peak, out, windows in (tuple(int(v) for v in line.split()[1:])
                                           for line in proc.stdout.splitlines()
                                           if line.startswith("PEAK")):
        if ci == 128 and narrow:  # gathered; BFC may hand out a chunk up to 2x the size
            assert peak < 3 * out < windows, (peak, out, windows)


def test_conv2d_with_a_layer_norm_on_each_block_of_rows():
    """A layer norm over the output channels on each whole-row block of the last
    filter row's GEMM (the earlier ones only add into C)."""
    rng = np.random.default_rng(23)
    w = rng.normal(size=(3, 3, 6, 40)).astype(np.float32) / 4

    def fn(x):
        h = tf.nn.conv2d(x, w, 1, "SAME")
        mean = tf.reduce_mean(h, -1, keepdims=True)
        var = tf.reduce_mean(tf.math.squared_difference(h, mean), -1, keepdims=True)
        return (h - mean) * tf.math.rsqrt(var + 1e-5)

    from disc_tf import pipeline
    from tests.stage_helpers import cluster_of

    spec = tf.TensorSpec([None, None, None, 6], F32)
    plan = pipeline.front_end(cluster_of(fn, spec)).plan
    (lib,) = [k for k in plan.kernels if k.kind == "library"]
    assert lib.ops[0].op == "conv_rows", plan.describe()
    assert lib.epilogue is not None and lib.epilogue_full_rows, plan.describe()
    tf_fn = tf.function(fn, input_signature=[spec])
    jitted = compiled(tf_fn)
    assert_ops_compiled(jitted, {"Conv2D", "Mean", "Rsqrt"})
    disc_tf.reset_stats()
    for shape in [(2, 7, 9), (1, 1, 1), (3, 20, 4)]:
        x = rng.normal(size=shape + (6,)).astype(np.float32)
        np.testing.assert_allclose(jitted(x).numpy(), tf_fn(x).numpy(), rtol=1e-4, atol=1e-4)
    assert disc_tf.stats()["fallbacks"] == 0


_CONV1D_PEAK_SCRIPT = """
import numpy as np, tensorflow as tf, disc_tf
rng = np.random.default_rng(3)
w = rng.normal(size=(9, 256, 8)).astype(np.float32) / 48
fn = tf.function(lambda x: tf.nn.relu(tf.nn.conv1d(x, w, 1, "SAME") + 0.5),
                 input_signature=[tf.TensorSpec([None, None, 256], tf.float32)])
jitted = disc_tf.jit(fn, min_cluster_size=1)
assert jitted.report.compiled
mem = tf.config.experimental
for t in (4000, 4001, 37):
    x = tf.constant(rng.normal(size=(2, t, 256)).astype(np.float32))
    np.testing.assert_allclose(jitted(x).numpy(), fn(x).numpy(), rtol=1e-4, atol=1e-4)
    mem.reset_memory_stats("CPU:0")
    before = mem.get_memory_info("CPU:0")["current"]
    jitted(x)
    print("PEAK", t, mem.get_memory_info("CPU:0")["peak"] - before, x.shape.num_elements() * 4)
assert disc_tf.stats()["fallbacks"] == 0
"""


def _peaks(script: str) -> list[tuple[int, int, int]]:
    """Runs a script printing ``PEAK size bytes x_bytes`` for three inputs, in a fresh
    process on TF's BFC allocator; returns those rows."""
    import os
    import pathlib

    repo = pathlib.Path(__file__).resolve().parents[2]
    env = dict(os.environ, TF_CPU_ALLOCATOR_USE_BFC="true", PYTHONPATH=str(repo))
    proc = fresh_python.run(["-c", script], env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    peaks = [tuple(int(v) for v in line.split()[1:])
             for line in proc.stdout.splitlines() if line.startswith("PEAK")]
    assert len(peaks) == 3
    return peaks


@pytest.mark.cpu_backend  # the CPU backend's windowed Conv1D GEMM
def test_a_padded_conv1d_makes_no_padded_copy_of_its_input():
    """SAME padding: only the output columns whose windows reach into the zeros read a
    copy (of their windows); the rest read x in place. With 256 input and 8 output
    channels a padded copy of x would be 32 times the output; the call's activation
    memory (TF's BFC allocator, as the bench measures it) stays a few outputs' worth."""
    for t, peak, x_bytes in _peaks(_CONV1D_PEAK_SCRIPT):
        if t < 1000:
            continue  # a short input: the copies of the edges' windows are most of it
        # The output and the GEMM's result are x_bytes / 32 each; BFC may hand out a
        # chunk up to twice the size asked for. A padded copy alone was x_bytes (8.9 MB
        # at t = 4000, against 0.54 MB now).
        assert peak < x_bytes / 4, (t, peak, x_bytes)


_CONV2D_PEAK_SCRIPT = """
import numpy as np, tensorflow as tf, disc_tf
rng = np.random.default_rng(3)
w = rng.normal(size=(3, 3, 128, 8)).astype(np.float32) / 34
fn = tf.function(lambda x: tf.nn.relu(tf.nn.conv2d(x, w, 1, "SAME") + 0.5),
                 input_signature=[tf.TensorSpec([None, None, None, 128], tf.float32)])
jitted = disc_tf.jit(fn, min_cluster_size=1)
assert jitted.report.compiled
mem = tf.config.experimental
for h, wd in ((100, 300), (101, 299), (5, 7)):
    x = tf.constant(rng.normal(size=(1, h, wd, 128)).astype(np.float32))
    np.testing.assert_allclose(jitted(x).numpy(), fn(x).numpy(), rtol=1e-4, atol=1e-4)
    mem.reset_memory_stats("CPU:0")
    before = mem.get_memory_info("CPU:0")["current"]
    jitted(x)
    print("PEAK", h * wd, mem.get_memory_info("CPU:0")["peak"] - before, x.shape.num_elements() * 4)
assert disc_tf.stats()["fallbacks"] == 0
"""


@pytest.mark.cpu_backend  # the CPU backend's GEMMs per filter row
def test_a_padded_conv2d_makes_no_padded_copy_of_its_input():
    """SAME padding: each filter row's GEMM reads the rows and columns of x its windows
    cover in place, and only the edge columns read a copy of their windows. With 128
    input and 8 output channels a padded copy of x (18.7 MB at 100 x 300 before) would
    be 16 times the output; the call's activation memory (TF's BFC allocator, as the
    bench measures it) stays a few outputs' worth (2.9 MB)."""
    for pixels, peak, x_bytes in _peaks(_CONV2D_PEAK_SCRIPT):
        if pixels < 1000:
            continue  # a small image: the copies of the edges' windows are most of it
        # The output and the GEMMs' result are x_bytes / 16 each, the edge windows
        # (two columns of 9 * 128 floats a row) x_bytes / 17; BFC may hand out a chunk
        # up to twice the size asked for.
        assert peak < x_bytes / 4, (pixels, peak, x_bytes)


def test_conv1d_with_a_layer_norm_on_each_block_of_rows():
    """A layer norm over the output channels as the windowed GEMM's epilogue (whole
    rows of C per block), with batch > 1 and widths narrower than the filter."""
    rng = np.random.default_rng(21)
    w = rng.normal(size=(5, 6, 40)).astype(np.float32) / 4
    b = rng.normal(size=(40,)).astype(np.float32)

    def fn(x):
        h = tf.nn.relu(tf.nn.conv1d(x, w, 1, "SAME") + b)
        mean = tf.reduce_mean(h, -1, keepdims=True)
        var = tf.reduce_mean(tf.math.squared_difference(h, mean), -1, keepdims=True)
        return (h - mean) * tf.math.rsqrt(var + 1e-5)

    from disc_tf import pipeline
    from tests.stage_helpers import cluster_of

    spec = tf.TensorSpec([None, None, 6], F32)
    plan = pipeline.front_end(cluster_of(fn, spec)).plan
    (lib,) = [k for k in plan.kernels if k.kind == "library"]
    assert lib.epilogue is not None and lib.epilogue_full_rows, plan.describe()
    tf_fn = tf.function(fn, input_signature=[spec])
    jitted = compiled(tf_fn)
    disc_tf.reset_stats()
    for batch, t in [(2, 33), (1, 1), (3, 4), (2, 130), (1, 2)]:
        x = rng.normal(size=(batch, t, 6)).astype(np.float32)
        np.testing.assert_allclose(jitted(x).numpy(), tf_fn(x).numpy(), rtol=1e-4, atol=1e-4)
    assert disc_tf.stats()["fallbacks"] == 0


@pytest.mark.parametrize("dtype", [F32, tf.int32, tf.float16], ids=lambda d: d.name)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_argmax_argmin_first_extreme_like_tf(dtype, axis):
    rng = np.random.default_rng(axis + 5)
    for op in (lambda x: tf.argmax(x * 2, axis=axis) + 1,
               lambda x: tf.argmin(x * 2, axis=axis, output_type=tf.int32) * 3):
        tf_fn = tf.function(op, input_signature=[dyn(3, dtype)])
        jitted = compiled(tf_fn)
        for shape in [(2, 3, 4), (1, 1, 1), (3, 5, 2), (2, 0, 3) if axis == 0 else (0, 2, 3)]:
            x = random_value(rng, shape, dtype)  # small ints: many ties
            assert_same(tf_fn(x), jitted(x), tf.int64)


def edge_rows(dtype: tf.DType, direction: str) -> np.ndarray:
    """Rows where a start from the first element and TF's rule (start from the type's
    extreme value at position 0, move only to a strictly better element) disagree:
    NaN first, infinities and the extreme finite value that never count."""
    np_type = dtype.as_numpy_dtype
    if dtype.is_integer:
        low, high = np.iinfo(np_type).min, np.iinfo(np_type).max
        rows = [[low, low, low], [high, high, high], [low, 3, low], [high, 3, high], [3, 3, 3]]
    else:
        low = float(tf.as_dtype(dtype).min)
        nan, inf = np.nan, np.inf
        rows = [[nan, 1, 3], [-inf, -inf, -inf], [nan, -inf, -inf], [low, low, low],
                [1, nan, 3], [nan, nan, nan], [nan, low, 2], [-inf, low, -inf], [3, nan, 3]]
    x = np.array(rows, np_type)
    return x if direction == "max" or dtype.is_integer else -x


@pytest.mark.parametrize("dtype", [F32, tf.float16, tf.bfloat16, tf.int32], ids=lambda d: d.name)
@pytest.mark.parametrize("direction", ["max", "min"])
def test_arg_reduce_of_nans_and_extremes_like_tf(dtype, direction):
    """TF's CPU kernel never counts a NaN, even first, nor the type's extreme values
    (a start from the first element gave 0 for [NaN, 1, 3]; TF gives 2). Along the
    row and along the columns, short and long (each backend's versions)."""
    arg = tf.argmax if direction == "max" else tf.argmin
    rows = edge_rows(dtype, direction)
    for axis in (-1, 0):
        tf_fn = tf.function(lambda x, a=axis: arg(x, axis=a, output_type=tf.int32),
                            input_signature=[dyn(2, dtype)])
        jitted = compiled(tf_fn)
        for repeat in (1, 700):
            x = np.tile(rows, (1, repeat))
            x = x if axis == -1 else np.ascontiguousarray(x.T)
            assert_same(tf_fn(x), jitted(x), tf.int32)



@pytest.mark.parametrize("dtype", [F32, tf.float16, tf.bfloat16], ids=lambda d: d.name)
@pytest.mark.parametrize("window,stride,padding", [(2, 1, "VALID"), (3, 2, "SAME"), (2, 2, "SAME")])
def test_max_pool_of_nans_and_infinities_like_tf(dtype, window, stride, padding):
    """TF's MaxPool never takes a NaN, and a window of only -inf and NaN gives the type's
    lowest finite value (bfloat16: -inf, from TF's default oneDNN kernel); a
    NaN-propagating maximum from -inf gave NaN and -inf."""
    np_type = dtype.as_numpy_dtype
    low = float(tf.as_dtype(dtype).min)
    values = np.array([np.nan, -np.inf, np.inf, low, 1.0, -2.0, np.nan, -np.inf], np.float32)
    rng = np.random.default_rng(window * 10 + stride)
    tf_fn = tf.function(lambda x: tf.nn.max_pool2d(x * 1.0, window, stride, padding),
                        input_signature=[dyn(4, dtype)])
    jitted = compiled(tf_fn)
    # No window-less output: TF's own MaxPool then dies of SIGFPE (f32, bf16).
    for shape in [(1, 4, 4, 2), (2, 5, 3, 3), (1, 2, 2, 1), (1, 7, 6, 1)]:
        x = rng.choice(values, size=shape).astype(np_type)
        x[0, :2, :2, 0] = -np.inf  # a window of -inf alone
        if shape[1] > 2:
            x[0, 2:, :, 0] = np.nan  # windows of NaN alone
        want, got = np.asarray(tf_fn(x)), np.asarray(jitted(x))
        assert want.dtype == got.dtype
        np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))  # exact

def test_argmax_of_an_empty_axis_is_invalid_argument():
    tf_fn = tf.function(lambda x: tf.argmax(x * 2.0, axis=1), input_signature=[dyn(2)])
    jitted = compiled(tf_fn)
    with pytest.raises(tf.errors.InvalidArgumentError):
        jitted(np.ones((2, 0), np.float32))
    assert_same(tf_fn(np.ones((2, 3), np.float32)), jitted(np.ones((2, 3), np.float32)), tf.int64)


def test_filters_computed_from_variables_compile():
    """Weight normalisation and a folded per-channel scale: the filters are computed
    in the cluster from variables, with static shapes, and the convolutions accept
    them (a Keras model with weight norm or folded batch norm)."""

    rng = np.random.default_rng(21)
    w = tf.Variable(rng.standard_normal((3, 3, 4, 8)).astype(np.float32))
    g = tf.Variable(rng.uniform(0.5, 1.5, 8).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, None, None, 4], F32)])
    def fn(x):
        normed = w * (g / tf.sqrt(tf.reduce_sum(w * w, axis=[0, 1, 2])))
        y = tf.nn.conv2d(x, normed, 1, "SAME")
        depthwise = tf.reshape(g, [1, 1, 8, 1]) * tf.ones([3, 3, 8, 1])
        return tf.nn.relu(tf.nn.depthwise_conv2d(y, depthwise, [1, 1, 1, 1], "SAME"))

    jitted = compiled(fn)
    assert_ops_compiled(jitted, {"Conv2D", "DepthwiseConv2dNative"})
    for shape in [(2, 9, 7, 4), (1, 1, 1, 4), (3, 16, 5, 4)]:
        x = random_value(rng, shape, F32)
        assert_same(fn(x), jitted(x), F32)


@pytest.mark.parametrize("channels,multiplier,strides,dilations,padding", [
    (150, 1, [1, 1, 1, 1], [1, 1], "SAME"),  # three channel blocks, the last partial
    (70, 2, [1, 2, 2, 1], [1, 1], "SAME"),  # two outputs per input channel
    (64, 1, [1, 2, 1, 1], [1, 1], "VALID"),  # exactly one block, unequal strides
])
def test_depthwise_over_many_channels_matches_tf(channels, multiplier, strides, dilations,
                                                 padding):
    """MobileNet-sized depthwise convolutions: channel runs in blocks, taps skipped at
    the borders, a depth multiplier, strides. (TF runs a dilated depthwise_conv2d as
    SpaceToBatchND around a plain one.) TF's own CPU kernel takes unequal row and column
    strides only where oneDNN runs it (Intel AVX-512 hosts); elsewhere the reference of a
    VALID conv with unequal strides is the unit-stride conv, subsampled."""

    def fn(x, w):
        return tf.nn.relu6(tf.nn.depthwise_conv2d(x, w, strides, padding, dilations=dilations))

    def unit_stride_then_subsample(x, w):
        full = tf.nn.relu6(tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], padding,
                                                  dilations=dilations))
        return full[:, ::strides[1], ::strides[2], :]

    specs = [tf.TensorSpec([None, None, None, channels], F32),
             tf.TensorSpec([3, 3, channels, multiplier], F32)]
    jitted = compiled(tf.function(fn, input_signature=specs))
    assert_ops_compiled(jitted, {"DepthwiseConv2dNative"})
    reference = fn
    if strides[1] != strides[2]:
        assert padding == "VALID", "subsampling matches a strided conv only without padding"
        reference = unit_stride_then_subsample
    reference = tf.function(reference, input_signature=specs)
    rng = np.random.default_rng(channels)
    w = rng.normal(size=(3, 3, channels, multiplier)).astype(np.float32)
    for shape in [(2, 9, 7), (1, 5, 5), (3, 16, 11)]:
        x = rng.normal(size=shape + (channels,)).astype(np.float32)
        np.testing.assert_allclose(jitted(x, w).numpy(), reference(x, w).numpy(), rtol=1e-4,
                                   atol=1e-4)


def test_a_1x1_same_conv_is_one_gemm_over_every_pixel():
    """SAME padding of a 1x1 window is computed as max((d - 1) + 1 - d, 0): the shape
    analysis sees it is 0 and the output d + 0 + 0 is d, so the conv is one GEMM over
    every pixel (no GEMM per image row) and its output has its input's dims."""
    rng = np.random.default_rng(11)
    w = rng.normal(size=(1, 1, 16, 24)).astype(np.float32)

    def fn(x):
        return tf.nn.relu6(tf.nn.conv2d(x, w, 1, "SAME") + 0.5)

    from disc_tf import pipeline
    from tests.stage_helpers import cluster_of

    spec = tf.TensorSpec([None, None, None, 16], F32)
    plan = pipeline.front_end(cluster_of(fn, spec)).plan
    (lib,) = [k for k in plan.kernels if k.kind == "library"]
    assert lib.ops[0].op == "dot_general", plan.describe()
    (_, out), = lib.outputs
    assert plan.buffers[out].dims[:3] == plan.buffers["arg0"].dims[:3], plan.describe()
    tf_fn = tf.function(fn, input_signature=[spec])
    jitted = compiled(tf_fn)
    assert_ops_compiled(jitted, {"Conv2D", "Relu6"})
    for shape in [(2, 9, 7), (1, 1, 1), (3, 17, 12)]:
        x = rng.normal(size=shape + (16,)).astype(np.float32)
        np.testing.assert_allclose(jitted(x).numpy(), tf_fn(x).numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("channels,multiplier,strides", [
    (61, 1, 2),  # three register blocks of 16 channels, one of 8, then five one at a time
    (96, 1, 1),  # a block of 64 and one of 32 (MobileNetV2's first expansion)
    (6, 2, 1),  # two outputs per input channel: every channel one at a time
])
def test_depthwise_runs_its_batch_norm_on_each_task(channels, multiplier, strides):
    """MobileNet's depthwise conv, batch norm and ReLU6: on the CPU the batch norm runs
    inside the depthwise kernel, on each task's pixels once they are written (an
    epilogue, as a GEMM's), not as a second pass over the conv's result."""
    rng = np.random.default_rng(channels)
    outputs = channels * multiplier
    scale = rng.uniform(0.5, 1.5, outputs).astype(np.float32)
    shift = rng.normal(size=outputs).astype(np.float32)

    def fn(x, w):
        h = tf.nn.depthwise_conv2d(x, w, [1, strides, strides, 1], "SAME")
        return tf.nn.relu6(h * scale + shift)

    specs = [tf.TensorSpec([None, None, None, channels], F32),
             tf.TensorSpec([3, 3, channels, multiplier], F32)]
    from disc_tf import pipeline
    from tests.stage_helpers import cluster_of

    plan = pipeline.front_end(cluster_of(fn, *specs)).plan
    (conv,) = [k for k in plan.kernels if k.ops[0].op == "grouped_conv"]
    assert conv.epilogue is not None, plan.describe()
    tf_fn = tf.function(fn, input_signature=specs)
    jitted = compiled(tf_fn)
    assert_ops_compiled(jitted, {"DepthwiseConv2dNative", "Relu6"})
    w = rng.normal(size=(3, 3, channels, multiplier)).astype(np.float32)
    for shape in [(2, 9, 7), (1, 1, 1), (3, 17, 12)]:
        x = rng.normal(size=shape + (channels,)).astype(np.float32)
        np.testing.assert_allclose(jitted(x, w).numpy(), tf_fn(x, w).numpy(), rtol=1e-4,
                                   atol=1e-4)


@pytest.mark.parametrize("op", ["depthwise", "conv"])
def test_zero_padding_then_a_convolution_is_read_in_place(op):
    """Keras ZeroPadding2D before a stride-2 convolution (MobileNetV2, ResNet): the
    pad becomes the convolution's padding, no kernel of its own."""
    channels, outputs = 8, (1 if op == "depthwise" else 4)

    def fn(x, w):
        padded = tf.pad(x, [[0, 0], [0, 1], [1, 2], [0, 0]])
        if op == "depthwise":
            return tf.nn.depthwise_conv2d(padded, w, [1, 2, 2, 1], "VALID") + 1.0
        return tf.nn.conv2d(padded, w, 2, "SAME") + 1.0

    specs = [tf.TensorSpec([None, None, None, channels], F32),
             tf.TensorSpec([3, 3, channels, outputs], F32)]
    tf_fn = tf.function(fn, input_signature=specs)
    jitted = compiled(tf_fn)
    (cluster,) = jitted.report.compiled
    assert "Pad" in [op_type for _, op_type in cluster.ops]
    # no pad kernel: the depthwise conv and its +1.0; on the CPU the GEMMs over the
    # windows and their epilogue, on the GPU im2col, the GEMM and the +1.0
    assert cluster.kernels == (3 if op == "conv" and gpu_code_path() else 2), cluster
    rng = np.random.default_rng(5)
    w = rng.normal(size=(3, 3, channels, outputs)).astype(np.float32)
    for shape in [(2, 9, 7), (1, 4, 4), (3, 16, 11)]:  # TF misreports windows past the input
        x = rng.normal(size=shape + (channels,)).astype(np.float32)
        np.testing.assert_allclose(jitted(x, w).numpy(), tf_fn(x, w).numpy(), rtol=1e-4,
                                   atol=1e-4)


@pytest.mark.parametrize("padded", ["pad", "explicit"])
def test_a_one_row_conv_padded_above_and_below_is_not_a_row_conv(padded):
    """A height-1 input padded in H (a zero Pad folded into the conv, or EXPLICIT
    padding) has output rows of zeros around the real one: not the one-row conv_taps
    kernel, which writes a single row (it left the others unwritten)."""
    def fn(x, w):
        if padded == "pad":
            return tf.nn.conv2d(tf.pad(x, [[0, 0], [1, 1], [1, 1], [0, 0]]), w, 1, "VALID") + 1.0
        return tf.nn.conv2d(x, w, 1, [[0, 0], [1, 1], [1, 1], [0, 0]]) + 1.0

    specs = [tf.TensorSpec([None, 1, None, 4], F32), tf.TensorSpec([1, 3, 4, 5], F32)]
    tf_fn = tf.function(fn, input_signature=specs)
    jitted = compiled(tf_fn)
    rng = np.random.default_rng(9)
    w = rng.normal(size=(1, 3, 4, 5)).astype(np.float32)
    for n, width in [(2, 8), (1, 3), (3, 17)]:
        x = 1e3 * rng.normal(size=(n, 1, width, 4)).astype(np.float32)
        jitted(x, w)  # leaves large values in the memory pool
        x = rng.normal(size=(n, 1, width, 4)).astype(np.float32)
        np.testing.assert_allclose(jitted(x, w).numpy(), tf_fn(x, w).numpy(), rtol=1e-4,
                                   atol=1e-4)
