"""Conv1D by Winograd F(2, 3), F(4, 3) and F(6, 3) (cc/ral/conv_winograd.h, RAL ``conv1d_winograd``):
kernel widths that are multiples of 3 over filters the RAL keeps transformed (constant inputs),
against TF at random shapes: SAME, VALID and explicit padding, odd and even output
widths, batches, channel counts off the 64-column panels, fused bias + ReLU and a
whole-row layer norm, a filter assigned between calls, a conv in a while loop's step.
The launch profile shows which convs ran as which Winograd tiles (each variant on the
calls the RAL picks it for, or on every call when DISC_TF_WINOGRAD names it); with
DISC_TF_WINOGRAD=0, on
the baseline GEMM (no AVX2 block), for too few outputs or for a filter computed in the
graph the RAL declines and the windowed GEMM gives the answer."""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from disc_tf.runtime import isa
from tests import fresh_python

#: The RAL's CPU GEMM blocks (cuda-emu lowers convolutions to its own kernels).
pytestmark = pytest.mark.cpu_backend

REPO = pathlib.Path(__file__).resolve().parents[2]

_SCRIPT = r"""
import os
import numpy as np, tensorflow as tf
import disc_tf

rng = np.random.default_rng(7)
FORCED = int(os.environ.get("DISC_TF_WINOGRAD", "-1"))  # 2, 4 or 6: every tiled call's F(m, 3)


def variant(ow):  # the RAL's pick for ow output columns: F(m, 3)'s m; 0: too few
    if ow < 15:  # fewer than 8 pairs
        return 0
    return FORCED if FORCED in (2, 4, 6) else 6 if ow >= 128 else 4 if ow >= 64 else 2


# name: kernel width, padding (explicit: [left, right]), ci, co, epilogue
CASES = {
    "k9_same_relu": (9, "SAME", 24, 130, "relu"),
    "k3_valid_relu": (3, "VALID", 16, 70, "relu"),
    "k6_explicit": (6, [4, 1], 5, 64, "bias"),
    "k3_same_layer_norm": (3, "SAME", 32, 48, "layer_norm"),
    "k9_computed_filter": (9, "SAME", 8, 16, "computed"),
}

def make(kw, padding, ci, co, epilogue):
    w = tf.Variable(rng.normal(size=(1, kw, ci, co)).astype(np.float32) / np.float32(kw * ci) ** 0.5)
    b = tf.Variable(rng.normal(size=(co,)).astype(np.float32))
    pad = padding if isinstance(padding, str) else [[0, 0], [0, 0], padding, [0, 0]]

    def fn(x):
        f = w * 2.0 if epilogue == "computed" else w  # kept by folding (test_folded.py)
        h = tf.nn.conv2d(x[:, None], f, 1, pad)[:, 0] + b
        if epilogue == "relu":
            return tf.nn.relu(h)
        if epilogue == "layer_norm":
            mean = tf.reduce_mean(h, -1, keepdims=True)
            var = tf.reduce_mean(tf.math.squared_difference(h, mean), -1, keepdims=True)
            return (h - mean) * tf.math.rsqrt(var + 1e-5)
        return h
    return tf.function(fn, input_signature=[tf.TensorSpec([None, None, ci], tf.float32)]), w

for name, (kw, padding, ci, co, epilogue) in CASES.items():
    tf_fn, w = make(kw, padding, ci, co, epilogue)
    jitted = disc_tf.jit(tf_fn, min_cluster_size=1)
    assert jitted.report.compiled, (name, jitted.report)
    # widths: odd and even outputs, few pairs (declined), one tile and several
    widths = [40, 17, 16, 301, 64, 5, 1000] + [int(t) for t in rng.integers(kw, 400, 3)]
    tiled = {2: 0, 4: 0, 6: 0}  # calls tiled by each F(m, 3)
    for i, t in enumerate(widths):
        if i == 4:  # a new filter value: its transforms are derived again, not reused
            w.assign(w * -0.5 + 0.25)
        x = rng.normal(size=(1 + i % 3, t, ci)).astype(np.float32)
        np.testing.assert_allclose(jitted(x).numpy(), tf_fn(x).numpy(), rtol=1e-4, atol=1e-4,
                                   err_msg=f"{name} {x.shape}")
        m = variant(t - kw + 1 if padding == "VALID" else t)
        if m:
            tiled[m] += 1
    for m, calls in tiled.items():
        print("EXPECT", f"winograd{m}", f"ci={ci} co={co} kw={kw}", calls)

# a Conv1D in a while loop's step: the step's RAL forwards conv1d_winograd to the call's
from tests.loop_steps import jit_looped
w_loop = tf.Variable(rng.normal(size=(3, 12, 12)).astype(np.float32) / 6)
looped, jitted = jit_looped(lambda h, w: tf.nn.conv1d(h, w, 1, "SAME"), w_loop, [None, None, 12])
tiled = {2: 0, 4: 0, 6: 0}
for i, t in enumerate([40, 9, 130, 16]):
    x = rng.normal(size=(1 + i % 2, t, 12)).astype(np.float32)
    np.testing.assert_allclose(jitted(x).numpy(), looped(x).numpy(), rtol=1e-4, atol=1e-4)
    if variant(t):
        tiled[variant(t)] += 3
for m, calls in tiled.items():
    print("EXPECT", f"winograd{m}", "ci=12 co=12 kw=3", calls)
assert disc_tf.stats()["fallbacks"] == 0
print("OK")
"""


def _run(tmp_path: pathlib.Path, **env: str) -> tuple[dict[str, int], dict[str, int]]:
    """Runs the script; returns the calls of each conv and variant (``winograd2 ci= co=
    kw=``) that ran as Winograd tiles (launch profile), and of each that should have."""
    profile = tmp_path / "profile.txt"
    full = dict(os.environ, DISC_TF_PROFILE=str(profile), PYTHONPATH=str(REPO),
                TF_CPP_MIN_LOG_LEVEL="2", **env)
    proc = fresh_python.run(["-c", _SCRIPT], env=full, timeout=600)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
    rows = [line.split() for line in profile.read_text().splitlines()[2:]]
    ran: dict[str, int] = {}
    for r in rows:  # a conv in a loop's step is a launch site per iteration
        if len(r) > 3 and r[2].startswith("winograd"):
            conv = " ".join([r[2], *(w for w in r if w.startswith(("ci=", "co=", "kw=")))])
            ran[conv] = ran.get(conv, 0) + int(r[3])
    expected = {" ".join(line.split()[1:5]): int(line.split()[5])
                for line in proc.stdout.splitlines() if line.startswith("EXPECT")}
    return ran, {conv: calls for conv, calls in expected.items() if calls}




@pytest.mark.skipif(isa.host_level() == "x86-64", reason="the GEMM blocks need AVX2+FMA")
@pytest.mark.parametrize("gemm_isa", ["avx2", "avx512"])
@pytest.mark.parametrize("forced", ["", "2", "4", "6"], ids=["picked", "f2", "f4", "f6"])
def test_winograd_conv1d_matches_tf(tmp_path, gemm_isa, forced):
    """Every case matches TF; each conv with a constant filter (or one computed from a
    variable: a result kept across calls) ran as Winograd tiles
    on the GEMM block of ``gemm_isa`` (the AVX2 block on an AVX-512 host too) on every
    call with 8 output pairs or more, as the windowed GEMM on the others: F(4, 3) from
    64 output columns, F(6, 3) from 128, F(2, 3) below 64, or the variant
    DISC_TF_WINOGRAD names."""
    if gemm_isa == "avx512" and isa.host_level() != "x86-64-v4":
        pytest.skip("the AVX-512 block needs AVX-512")
    env = {"DISC_TF_GEMM_ISA": gemm_isa, **({"DISC_TF_WINOGRAD": forced} if forced else {})}
    ran, expected = _run(tmp_path, **env)
    convs = {conv.split(" ", 1)[1] for conv in expected}
    assert len(convs) == 6, expected
    variants = {conv.split(" ", 1)[0] for conv in expected}
    assert variants == ({f"winograd{forced}"} if forced else
                        {"winograd2", "winograd4", "winograd6"})
    # the filter computed from the variable (w * 2) is a result the RAL keeps across
    # calls, so its transforms are kept too, and derived again after w.assign
    assert ran == expected


@pytest.mark.parametrize("env", [{"DISC_TF_WINOGRAD": "0"}, {"DISC_TF_GEMM_ISA": "baseline"}],
                         ids=["off", "baseline_gemm"])
def test_declined_winograd_runs_the_windowed_gemm(tmp_path, env):
    """Switched off, or without a GEMM block to run its tiles, the RAL declines every
    conv and the windowed GEMM gives TF's answers."""
    ran, expected = _run(tmp_path, **env)
    assert ran == {} and len({conv.split(" ", 1)[1] for conv in expected}) == 6


class _Conv1D(tf.Module):
    """Conv1D kernel 9, SAME, + bias + ReLU; its filter a variable."""

    def __init__(self) -> None:
        rng = np.random.default_rng(5)
        self.w = tf.Variable(rng.normal(size=(9, 24, 130)).astype(np.float32) / 15)
        self.b = tf.Variable(rng.normal(size=(130,)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, None, 24], tf.float32)])
    def __call__(self, x):
        return tf.nn.relu(tf.nn.conv1d(x, self.w, 1, "SAME") + self.b)


@pytest.mark.skipif(isa.host_level() == "x86-64", reason="the GEMM blocks need AVX2+FMA")
def test_load_warm_up_packs_every_filter_transform(tmp_path):
    """disc_tf.load's warm-up call (8 output columns: the windowed GEMM) packs the
    filter for every path a request's width may take: the windowed GEMM's B, F(2, 3)'s
    four G_u, F(4, 3)'s six and F(6, 3)'s eight. No request packs again, at any width."""
    module = _Conv1D()
    tf.saved_model.save(module, str(tmp_path / "orig"))
    disc_tf.optimize(str(tmp_path / "orig"), str(tmp_path / "opt"))
    disc_tf.reset_stats()
    model = disc_tf.load(str(tmp_path / "opt"))
    assert model.warmed_up["__call__"], model.warmed_up
    assert disc_tf.stats()["packed_weights"] == 1 + 4 + 6 + 8
    rng = np.random.default_rng(11)
    widths = [300, 40, 5, 64, 17] + [int(t) for t in rng.integers(1, 500, 3)]
    for i, t in enumerate(widths):
        x = rng.normal(size=(1 + i % 2, t, 24)).astype(np.float32)
        np.testing.assert_allclose(model(x).numpy(), module(x).numpy(), rtol=1e-4, atol=1e-4,
                                   err_msg=str(x.shape))
    stats = disc_tf.stats()
    assert stats["packed_weights"] == 1 + 4 + 6 + 8 and stats["fallbacks"] == 0, stats
    assert model._call.direct_calls == len(widths)  # each ran the DiscCluster op


@pytest.mark.parametrize("kw", [3, 9])
def test_nan_infinite_and_huge_inputs_reach_only_their_windows(kw):
    """A NaN, an infinity or a huge value (1e30) in the input reaches exactly the outputs
    whose window holds it, as in TF: the RAL declines Winograd for such an input, whose
    transforms would carry it to every output of its tile (or overflow). Widths of each
    F(m, 3); the same convs' clean inputs between them."""
    rng = np.random.default_rng(kw)
    w = tf.constant(rng.normal(size=(kw, 16, 24)).astype(np.float32) / 8)
    tf_fn = tf.function(lambda x: tf.nn.conv1d(x * 1.0, w, 1, "SAME"),
                        input_signature=[tf.TensorSpec([None, None, 16], tf.float32)])
    jitted = disc_tf.jit(tf_fn, min_cluster_size=1)
    assert jitted.report.compiled, jitted.report
    for width in (40, 100, 300):
        for bad in (np.nan, np.inf, -np.inf, 1e30, None):
            x = rng.normal(size=(2, width, 16)).astype(np.float32)
            if bad is not None:
                x[1, width // 2 + 1, 5] = bad
            want, got = tf_fn(x).numpy(), jitted(x).numpy()
            for mask in (np.isnan, np.isposinf, np.isneginf):
                np.testing.assert_array_equal(mask(got), mask(want), err_msg=f"{width} {bad}")
            finite = np.isfinite(want)
            np.testing.assert_allclose(got[finite], want[finite], rtol=1e-4, atol=1e-4)
    assert disc_tf.stats()["fallbacks"] == 0
