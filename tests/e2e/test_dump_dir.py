"""DISC_TF_DUMP_DIR: every stage of every cluster is written out."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import disc_tf
from tests.harness import gpu_code_path


def test_dump_dir_has_every_stage(tmp_path, monkeypatch):
    monkeypatch.setenv("DISC_TF_DUMP_DIR", str(tmp_path))

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32),
                                  tf.TensorSpec([None], tf.float32)])
    def f(x, b):
        return tf.nn.relu(x + b) * 2.0

    jitted = disc_tf.jit(f)
    x, b = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), np.ones(4, np.float32)
    np.testing.assert_allclose(jitted(x, b), f(x, b), rtol=1e-6)  # what was dumped runs
    (cluster_dir,) = list(tmp_path.iterdir())
    files = {p.name: p.read_text() for p in cluster_dir.iterdir() if p.is_file()}
    stages = {"cluster.pbtxt", "dhlo.mlir", "shapes.txt", "fusion_plan.txt", "host_runner.cc"}
    if gpu_code_path():  # the device code is one source, for nvcc (or the emulator)
        assert set(files) == stages | {"kernels.cu"}
        assert "TF ops: add, Relu, mul" in files["kernels.cu"]
        assert "disc_cuda_entry" in files["host_runner.cc"]
        return
    assert set(files) == stages | {"kernels.cc"}
    # each kernel unit as it was compiled
    (unit,) = (cluster_dir / "kernels").iterdir()
    assert unit.stem in files["kernels.cc"] and unit.stem in files["host_runner.cc"]
    assert "TF ops: add, Relu, mul" in unit.read_text()
    assert 'op: "Relu"' in files["cluster.pbtxt"]
    assert "stablehlo.dynamic_broadcast_in_dim" in files["dhlo.mlir"]
    assert "check broadcast" in files["shapes.txt"]
    assert "TF ops: add, Relu, mul" in files["fusion_plan.txt"]
    assert "disc_entry" in files["host_runner.cc"]
