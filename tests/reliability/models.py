"""A small one-cluster model, its optimized SavedModel and proto surgery on it."""

from __future__ import annotations

import pathlib
import shutil

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

import disc_tf
from disc_tf import trust
from disc_tf.saved_model import optimize_saved_model

WIDTH = 8


class OneCluster(tf.Module):
    """Elementwise ops on two [None, 8] inputs and a variable: one cluster."""

    def __init__(self) -> None:
        self.w = tf.Variable(np.linspace(-1.0, 1.0, WIDTH).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, WIDTH], tf.float32),
                                  tf.TensorSpec([None, WIDTH], tf.float32)])
    def __call__(self, x, y):
        h = x * self.w + y
        return tf.tanh(h) * tf.sigmoid(x) - 0.5 * y


def inputs(rng: np.random.Generator, rows: int) -> tuple[np.ndarray, np.ndarray]:
    return (rng.standard_normal((rows, WIDTH)).astype(np.float32),
            rng.standard_normal((rows, WIDTH)).astype(np.float32))


def save_original(root: pathlib.Path) -> tuple[OneCluster, pathlib.Path]:
    model = OneCluster()
    path = root / "orig"
    tf.saved_model.save(model, str(path))
    return model, path


def optimize(orig: pathlib.Path, out: pathlib.Path):
    disc_tf.reset_stats()
    report = optimize_saved_model(str(orig), str(out))
    return report, disc_tf.stats()


def disc_nodes(sm: saved_model_pb2.SavedModel) -> list:
    """Every DiscCluster NodeDef of ``sm`` (graphs and function bodies)."""
    out = []
    for mg in sm.meta_graphs:
        out += [n for n in mg.graph_def.node if n.op == "DiscCluster"]
        for f in mg.graph_def.library.function:
            out += [n for n in f.node_def if n.op == "DiscCluster"]
    return out


def read_saved_model(path: pathlib.Path) -> saved_model_pb2.SavedModel:
    sm = saved_model_pb2.SavedModel()
    sm.ParseFromString((path / "saved_model.pb").read_bytes())
    return sm


def count_disc_nodes(path: pathlib.Path) -> int:
    return len(disc_nodes(read_saved_model(path)))


def rewrite_artifacts(src: pathlib.Path, dst: pathlib.Path, edit, sign: bool = True) -> None:
    """Copies the SavedModel ``src`` to ``dst`` with ``edit(artifact, sha) -> (artifact, sha)``
    applied to every DiscCluster node.

    With ``sign``, each edited artifact carries this user's signature, as if this user's
    compiler had built it (the loader is then what the damage meets); without, it
    keeps the signatures of the bytes it replaced (an attacker's edit)."""
    shutil.copytree(src, dst)
    sm = read_saved_model(src)
    nodes = disc_nodes(sm)
    assert nodes, "no DiscCluster node to edit"
    for n in nodes:
        art, sha = edit(n.attr["artifact"].s, n.attr["artifact_sha256"].s.decode())
        n.attr["artifact"].s = art
        n.attr["artifact_sha256"].s = sha.encode()
        if sign:
            del n.attr["artifact_signatures"].list.s[:]
            n.attr["artifact_signatures"].list.s.append(trust.local_signature(sha).encode())
    (dst / "saved_model.pb").write_bytes(sm.SerializeToString())
    fingerprint = dst / "fingerprint.pb"
    if fingerprint.exists():
        fingerprint.unlink()
