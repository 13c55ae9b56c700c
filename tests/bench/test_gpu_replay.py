"""The GPU replay (bench/gpu_replay): cases exported here, checked on a GPU machine.

Without a GPU these tests cover what decides a replay's verdict: the exported case
(artifact, inputs by seed or data, TF's outputs), the comparison that must reject a
wrong output, and the replay library, which must compile against the CUDA RAL.
"""

from __future__ import annotations

import json
import pathlib
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from bench.gpu_replay import check, export, kinds, runner_cost
from bench.gpu_replay.synthetic import EDGE, SAMPLE, sample_positions, synthetic
from disc_tf.runtime import native_build

pytestmark = pytest.mark.cpu_backend


def test_synthetic_values_are_a_function_of_shape_seed_and_scale():
    a = synthetic((300, 70), 5, 0.02)
    assert a.dtype == np.float32 and a.shape == (300, 70)
    np.testing.assert_array_equal(a, synthetic([300, 70], 5, 0.02))
    assert not np.array_equal(a, synthetic((300, 70), 6, 0.02))
    assert abs(float(a.std()) - 0.02) < 0.001 and abs(float(a.mean())) < 0.001


@pytest.mark.parametrize("n", [0, 1, 100, SAMPLE, SAMPLE + 1, 10_000_019])
def test_sample_positions_cover_both_ends_and_stay_in_range(n):
    p = sample_positions(n)
    assert np.all(np.diff(p) > 0) and (p.size == 0 or (p[0] >= 0 and p[-1] < n))
    if n <= SAMPLE:
        assert p.size == n
    else:
        assert set(range(EDGE)) <= set(p[:EDGE].tolist()) and p[-1] == n - 1
        assert SAMPLE // 2 < p.size <= SAMPLE
        assert np.array_equal(p, sample_positions(n))


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[pathlib.Path, dict, export.Model]:
    """gather_rows exported at two calls (the second with inputs over the synthetic
    threshold), and the model whose arguments the export replaced."""
    out = tmp_path_factory.mktemp("replay")
    fn, make_args = kinds.KINDS["gather_rows"]
    rng = np.random.default_rng(1)
    model = export.Model("gather_rows", fn, None, [make_args(rng, 0), make_args(rng, 1)])
    store = export._Store(out)
    cases = export.export_model(model, store)
    manifest = {"tolerance": export.TOLERANCE, "cases": cases}
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out, manifest, model


def test_export_writes_the_cuda_artifact_the_inputs_and_tfs_outputs(exported):
    out, manifest, model = exported
    cases = manifest["cases"]
    assert [c["call"] for c in cases] == [0, 1]
    for case, args in zip(cases, model.calls):
        artifact = (out / case["artifact"]).read_bytes()
        assert artifact[:4] == b"\x7fELF" and b"disc_cuda_entry" in artifact
        table, ids = (check._load(out, e) for e in case["inputs"])
        np.testing.assert_array_equal(table, args[0])
        np.testing.assert_array_equal(ids, args[1])
    big = cases[1]["inputs"][0]
    assert "synthetic" in big and "file" not in big  # regenerated from its seed, not shipped
    assert "file" in cases[0]["inputs"][0]


def test_compare_accepts_tfs_output_and_rejects_wrong_ones(exported):
    out, manifest, model = exported
    tol = manifest["tolerance"]
    for case, args in zip(manifest["cases"], model.calls):
        want = np.asarray(model.fn(*args))
        entry = case["outputs"][0]
        ok, worst, why = check.compare(want.copy(), entry, out, tol)
        assert ok, why
        assert worst < 1.0
        noisy = want * (1 + 1e-6)  # within the float32 tolerance
        assert check.compare(noisy, entry, out, tol)[0]
        wrong = want.copy()
        wrong.reshape(-1)[-1] += 0.05 * float(np.abs(want).max())  # the last element: always sampled
        assert not check.compare(wrong, entry, out, tol)[0]
        assert not check.compare(want[:-1], entry, out, tol)[0]  # wrong shape
        shifted = np.roll(want, 1, axis=0)  # rows in the wrong places
        assert not check.compare(shifted, entry, out, tol)[0]


def test_tf32_runs_are_judged_by_tf32s_tolerance(exported):
    out, manifest, model = exported
    case, args = manifest["cases"][1], model.calls[1]
    want = np.asarray(model.fn(*args))
    off = want + 2e-3 * float(np.sqrt(np.mean(want.astype(np.float64) ** 2)))  # TF32-sized
    tolerance = {"tf32": check.TF32_TOLERANCE, **manifest["tolerance"]}
    assert not check.compare(off, case["outputs"][0], out, tolerance)[0]
    assert check.compare(off, case["outputs"][0], out, tolerance, "tf32")[0]
    far = want + 0.2 * float(np.abs(want).max())
    assert not check.compare(far, case["outputs"][0], out, tolerance, "tf32")[0]


def test_compare_of_integers_is_exact(tmp_path):
    value = np.arange(-50, 50, dtype=np.int32).reshape(10, 10)
    store = export._Store(tmp_path)
    entry = export._output_entry(value, store)
    assert check.compare(value.copy(), entry, tmp_path, export.TOLERANCE)[0]
    off = value.copy()
    off[9, 9] += 1
    assert not check.compare(off, entry, tmp_path, export.TOLERANCE)[0]


def test_bfloat16_outputs_round_trip_through_their_bits(tmp_path):
    value = tf.constant(np.linspace(-3, 3, 77, dtype=np.float32), tf.bfloat16).numpy()
    entry = export._output_entry(value, export._Store(tmp_path))
    assert entry["dtype"] == "bfloat16"
    assert check.compare(value.view(np.uint16), entry, tmp_path, export.TOLERANCE)[0]
    wrong = value.view(np.uint16).copy()
    wrong[5] ^= 0x4000
    assert not check.compare(wrong, entry, tmp_path, export.TOLERANCE)[0]


def test_the_replay_library_compiles_against_the_cuda_ral(tmp_path):
    include = native_build.cuda_include_dir()
    if not include:
        pytest.skip("no cuda.h on this machine: the library needs CUDA's headers")
    lib = check.build_library(tmp_path)
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True,
                             text=True, check=True).stdout
    for name in ("replay_open", "replay_set_input", "replay_run", "replay_output_copy"):
        assert name in symbols
    # No CUDA library at link time: the driver and cuBLAS are opened at run time.
    needed = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True).stdout
    assert "libcuda" not in needed and "libcublas" not in needed


def test_runner_cost_counts_what_one_call_launches(exported, tmp_path):
    out, manifest, _ = exported
    exe = runner_cost.build(tmp_path)
    for case in manifest["cases"]:
        m = runner_cost.measure(exe, out, case, calls=50)
        assert m["launches"] == case["kernels"] and m["gemms"] == 0, m  # gather + stitch
        assert m["allocations"] >= 1 and m["us_per_call"] > 0


@tf.function(input_signature=[tf.TensorSpec([None, None, None, 16])] * 2)
def _attention_scores(q, k):
    """Scores of every head: operands read through a transpose (a two-level batch)."""
    return tf.nn.softmax(tf.einsum("bshd,bthd->bhst", q, k))


@pytest.mark.parametrize("batch,heads,calls", [(8, 2, 2), (2, 6, 2), (1, 5, 1)])
def test_a_two_level_gemm_batch_makes_one_cublas_call_per_index_of_its_smaller_level(
        tmp_path, batch, heads, calls):
    rng = np.random.default_rng(0)
    args = tuple(rng.standard_normal((batch, 7, heads, 16)).astype(np.float32) for _ in range(2))
    model = export.Model("attention", _attention_scores, None, [args])
    cases = export.export_model(model, export._Store(tmp_path))
    exe = runner_cost.build(tmp_path)
    gemms = sum(runner_cost.measure(exe, tmp_path, c, calls=10)["gemms"] for c in cases)
    assert gemms == calls


def test_variants_of_the_cuda_launch_constants_export_side_by_side(tmp_path):
    from disc_tf.codegen import cuda_config, cuda_stitch

    default = cuda_config.WARP_ROWS_MIN
    manifest = export.export(tmp_path, ["long_softmax"], 1, progress=lambda _: None,
                             variants=("", "WARP_ROWS_MIN=64"))
    by_model = {}
    for case in manifest["cases"]:
        by_model.setdefault(case["model"], set()).add(case["artifact"])
    assert set(by_model) == {"long_softmax", "long_softmax[WARP_ROWS_MIN=64]"}
    assert by_model["long_softmax"].isdisjoint(by_model["long_softmax[WARP_ROWS_MIN=64]"])
    assert cuda_config.WARP_ROWS_MIN == cuda_stitch.WARP_ROWS_MIN == default != 64  # restored
    with pytest.raises(ValueError):
        export.parse_variant("NO_SUCH_SETTING=1")
