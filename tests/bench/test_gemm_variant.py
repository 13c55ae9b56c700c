"""bench/gemm_libs races a second build of the RAL's GEMM block (DISC_VARIANT_FLAGS)
against the RAL's own: the build, the candidate, and the unroll macro's effect on values."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess

import pytest

from disc_tf.runtime import isa

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD = REPO / "bench" / "gemm_libs" / "build.sh"
#: Odd sizes: row, column and depth remainders of the 6 x 16 tile and of the 4-times unroll.
SHAPES = "7x37x19,13x301x70,1x5x3,50x1026x33"


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build the harness")
@pytest.mark.skipif(isa.host_level() == "x86-64", reason="the AVX2 block needs AVX2+FMA")
def test_variant_build_races_the_ral_block_with_the_same_values(tmp_path: pathlib.Path) -> None:
    env = {**os.environ, "GEMM_LIBS_OUT": str(tmp_path),
           "DISC_VARIANT_FLAGS": "-DDISC_GEMM_K_UNROLL=1"}
    built = subprocess.run(["bash", str(BUILD)], env=env, capture_output=True, text=True,
                           timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    assert "-DHAVE_DISC_VARIANT" in built.stdout
    out = subprocess.run([str(tmp_path / "gemm_libs"), "--isa", "avx2", "--threads", "2",
                          "--rounds", "2", "--batch-ms", "1", "--gap-ms", "0", "--shapes", SHAPES,
                          "--only", "disc_variant"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    shapes = [json.loads(x) for x in out.stdout.splitlines() if x.startswith('{"type": "shape"')]
    assert len(shapes) == len(SHAPES.split(","))
    for rec in shapes:
        disc, variant = rec["cands"]["disc"], rec["cands"]["disc_variant"]
        assert len(disc["s"]) == len(variant["s"]) == 2  # both timed in each round
        # Checked against a float64 reference by the harness; unrolling reorders no
        # addition, so the two builds' largest errors are the same number.
        assert disc["err"] < 1e-4 * max(1.0, rec["k"] ** 0.5)
        assert variant["err"] == disc["err"], rec
