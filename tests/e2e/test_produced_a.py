"""A depthwise convolution's pixels made by the GEMM that reads them
(fusion/produced_a.py, RAL ``sgemm_gathered_a``): in MobileNetV2's inverted residual
block (1x1 expand, batch norm, ReLU6, depthwise conv, batch norm, ReLU6, 1x1 project,
batch norm, residual) each task of the projection runs the depthwise convolution and
its epilogue on its own rows into scratch, so neither result is ever in memory whole.
Against TF at random shapes (strides 1 and 2, SAME and VALID, a depth multiplier,
channel counts off the vector width, one-pixel inputs), the plan,
and the call's temporaries; a second reader of the convolution keeps it a kernel."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from disc_tf import pipeline
from tests.harness import assert_matches_tf, assert_ops_compiled, compiled
from tests.stage_helpers import cluster_of

#: The CPU backend's planner option (the CUDA backend launches each kernel).
pytestmark = pytest.mark.cpu_backend

F32 = tf.float32
RNG = np.random.default_rng(53)


def _var(*shape, scale=0.5):
    return tf.Variable((RNG.normal(size=shape) * scale).astype(np.float32))


def _bn(channels):
    """A folded inference batch norm: gamma, beta, mean and a positive variance."""
    return (_var(channels), _var(channels), _var(channels),
            tf.Variable(RNG.uniform(0.5, 2.0, channels).astype(np.float32)))


class Block:
    """An inverted residual block of ``cin`` -> ``cin * expand`` (times ``mult`` in the
    depthwise conv) -> ``cout`` channels."""

    def __init__(self, cin, expand, cout, stride=1, padding="SAME", mult=1):
        self.cexp, self.cdw, self.cout = cin * expand, cin * expand * mult, cout
        self.stride, self.padding = stride, padding
        self.w_expand = _var(1, 1, cin, self.cexp)
        self.w_dw = _var(3, 3, self.cexp, mult)
        self.w_project = _var(1, 1, self.cdw, cout, scale=0.2)
        self.bn = [_bn(self.cexp), _bn(self.cdw), _bn(cout)]
        self.residual = stride == 1 and cin == cout and padding == "SAME"

    @staticmethod
    def _norm(x, bn):
        gamma, beta, mean, var = bn
        return tf.nn.batch_normalization(x, mean, var, beta, gamma, 1e-3)

    def depthwise(self, x):
        h = tf.nn.relu6(self._norm(tf.nn.conv2d(x, self.w_expand, 1, "SAME"), self.bn[0]))
        h = tf.nn.depthwise_conv2d(h, self.w_dw, [1, self.stride, self.stride, 1], self.padding)
        return tf.nn.relu6(self._norm(h, self.bn[1]))

    def project(self, x, d):
        y = self._norm(tf.nn.conv2d(d, self.w_project, 1, "VALID"), self.bn[2])
        return x + y if self.residual else y

    def __call__(self, x):
        return self.project(x, self.depthwise(x))


BLOCKS = {
    "s1_residual": Block(8, 6, 8),
    "s2_same": Block(8, 6, 16, stride=2),
    "s2_valid": Block(16, 6, 24, stride=2, padding="VALID"),
    "multiplier2": Block(8, 3, 16, mult=2),
    "channels_20": Block(5, 4, 6),
}


def _spec(cin):
    return tf.TensorSpec([None, None, None, cin], F32)


def _producing(plan) -> list:
    return [k for k in plan.kernels if k.a_producer]


@pytest.mark.parametrize("name", list(BLOCKS))
def test_the_projection_makes_the_depthwise_pixels(name):
    """One GEMM names the depthwise convolution as its A's producer; the call matches
    TF, and its temporaries hold the expanded input and the projection, not the
    convolution's result."""
    block = BLOCKS[name]
    cin = block.w_expand.shape[2]
    plan = pipeline.front_end(cluster_of(block, _spec(cin))).plan
    (gemm,) = _producing(plan)
    conv = next(k for k in plan.kernels if k.name == gemm.a_producer)
    assert conv.kind == "index" and conv.epilogue, plan.describe()
    assert "A: made by" in plan.describe()
    tf_fn = tf.function(block, input_signature=[_spec(cin)])
    jitted = compiled(tf_fn)
    assert_ops_compiled(jitted, {"DepthwiseConv2dNative", "Conv2D"})
    shapes = [(1, 9, 11), (2, 16, 13), (3, 5, 7), (2, 23, 17)]
    # (TF's VALID depthwise conv of an input smaller than its window returns the input's
    # size, where the window fits nowhere; disc_tf's result is empty.)
    for n, h, w in shapes + ([(1, 1, 1)] if block.padding == "SAME" else []):
        x = RNG.normal(size=(n, h, w, cin)).astype(np.float32)
        disc_tf.reset_stats()
        assert_matches_tf(tf_fn, jitted, [x], 1e-4, 1e-4)
        conv_out = int(np.prod(block.depthwise(x).shape))
        project = conv_out // block.cdw * block.cout
        if conv_out > 4 * (project + 256):  # the conv's result would dominate the peak
            assert disc_tf.stats()["peak_temp_bytes"] < 4 * (n * h * w * block.cexp + project
                                                            + 256), (name, n, h, w)
    assert disc_tf.stats()["fallbacks"] == 0


def test_a_second_reader_keeps_the_convolution_a_kernel():
    """The convolution's result also leaves the cluster: it is written whole, by its
    own launch, and the projection reads it from memory."""
    block = BLOCKS["s1_residual"]

    def both(x):
        d = block.depthwise(x)
        return block.project(x, d), d

    plan = pipeline.front_end(cluster_of(both, _spec(8))).plan
    assert not _producing(plan), plan.describe()
    tf_fn = tf.function(both, input_signature=[_spec(8)])
    jitted = compiled(tf_fn)
    for shape in [(2, 9, 10, 8), (1, 3, 3, 8)]:
        assert_matches_tf(tf_fn, jitted, [RNG.normal(size=shape).astype(np.float32)], 1e-4, 1e-4)


WDW = tf.constant(RNG.normal(size=(3, 3, 8, 1)).astype(np.float32))
WP = tf.constant(RNG.normal(size=(1, 1, 8, 16)).astype(np.float32))
TABLE = tf.constant(RNG.normal(size=(5, 8)).astype(np.float32))


def overwritten_input(inp):
    """The conv's input x dies at the conv, so z is written in its memory, and z is
    computed before the GEMM (its epilogue reads r): the conv stays at its own place."""
    x = tf.nn.relu(inp)
    z = x * tf.reduce_sum(x) + 1.0
    r = tf.reduce_mean(z, [1, 2, 3], keepdims=True) + tf.reduce_max(z, [1, 2, 3], keepdims=True)
    a = tf.nn.relu6(tf.nn.depthwise_conv2d(x, WDW, [1, 2, 2, 1], "SAME") * 0.5 + 0.1)
    return tf.nn.conv2d(a, WP, 1, "VALID") + r


def gathered_epilogue(inp):
    """The conv's epilogue reads gathered table rows (whose ids it checks)."""
    x = tf.nn.relu(inp)
    ids = tf.cast(tf.clip_by_value(inp[..., 0] * 2.0, 0.0, 4.0), tf.int32)
    a = tf.nn.relu6(tf.nn.depthwise_conv2d(x, WDW, [1, 1, 1, 1], "SAME") + tf.gather(TABLE, ids))
    return tf.nn.conv2d(a, WP, 1, "VALID")


@pytest.mark.parametrize("fn", [overwritten_input, gathered_epilogue],
                         ids=["overwritten_input", "gathered_epilogue"])
def test_a_conv_the_gemm_cannot_take_keeps_its_launch(fn):
    """A conv whose input a kernel before the GEMM overwrites (the buffer planner let it),
    or whose epilogue reads gathered rows, keeps its launch; both compile and match TF."""
    assert not _producing(pipeline.front_end(cluster_of(fn, _spec(8))).plan)
    tf_fn = tf.function(fn, input_signature=[_spec(8)])
    jitted = compiled(tf_fn)
    for shape in [(2, 9, 10, 8), (1, 4, 3, 8)]:
        assert_matches_tf(tf_fn, jitted, [RNG.normal(size=shape).astype(np.float32)], 1e-4, 1e-4)
    assert disc_tf.stats()["fallbacks"] == 0


_FEW_ROWS_SCRIPT = """
import numpy as np, tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(2)  # a caller and one worker
import disc_tf
from tests.e2e.test_produced_a import Block, _spec

block = Block(160, 6, 320)  # MobileNetV2's last block: 960 channels into 320
tf_fn = tf.function(block, input_signature=[_spec(160)])
jitted = disc_tf.jit(tf_fn, strict=True)
rng = np.random.default_rng(7)
for shape in ((1, 3, 3, 160), (1, 2, 5, 160), (2, 2, 3, 160), (1, 1, 1, 160)):
    x = rng.normal(size=shape).astype(np.float32)
    np.testing.assert_allclose(jitted(x).numpy(), tf_fn(x).numpy(), rtol=1e-4, atol=1e-4)
assert disc_tf.stats()["fallbacks"] == 0
print("OK")
"""


def test_a_projection_of_few_pixels_shares_its_columns_between_threads(tmp_path):
    """Fewer pixels than make two row blocks (3 x 3: 9 rows of 960 channels into 320)
    still give every thread a share: columns, each task making the 9 rows itself (the
    launch profile's blocks=1x2); one block left the second thread idle. Matches TF at
    few-pixel shapes."""
    import os
    import pathlib

    from tests import fresh_python

    profile = tmp_path / "profile.txt"
    repo = pathlib.Path(__file__).resolve().parents[2]
    env = dict(os.environ, DISC_TF_PROFILE=str(profile), PYTHONPATH=str(repo),
               TF_CPP_MIN_LOG_LEVEL="2")
    proc = fresh_python.run(["-c", _FEW_ROWS_SCRIPT], env=env, timeout=300, cwd=repo)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
    rows = [line for line in profile.read_text().splitlines() if " gathered " in line]
    assert len(rows) == 1 and "m=9 n=320 k=960" in rows[0], profile.read_text()
    assert rows[0].rstrip().removesuffix(" on registers").endswith("blocks=1x2"), rows[0]
