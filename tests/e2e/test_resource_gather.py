"""Embedding lookups on resource variables (``ResourceGather``) inside compiled
clusters: the DiscCluster op reads the variable when it runs, so assignments are
seen; the body that holds them is analysed although its colocation attribute
names the traced capture (a node its FunctionDef does not have)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from disc_tf.saved_model import optimize_saved_model
from tests.harness import assert_ops_compiled, assert_same, compiled, gpu_code_path

IDS = tf.TensorSpec([None, None], tf.int32)
VOCAB, WIDTH = 50, 6


def _lookup_fn(table: tf.Variable):
    @tf.function(input_signature=[IDS])
    def fn(ids):
        e = tf.nn.embedding_lookup(table, ids)  # ResourceGather colocated with the table
        return tf.reverse(tf.tanh(e) * 2.0 + 1.0, axis=[1])

    return fn


def _ids(rng, shape) -> np.ndarray:
    return rng.integers(0, VOCAB, shape).astype(np.int32)


SHAPES = [(2, 3), (1, 1), (0, 4), (4, 0), (5, 2)]


def test_jit_reads_the_variable_at_each_call():
    table = tf.Variable(np.random.default_rng(0).standard_normal((VOCAB, WIDTH))
                        .astype(np.float32))
    fn = _lookup_fn(table)
    jitted = compiled(fn)
    assert_ops_compiled(jitted, {"ResourceGather", "ReverseV2"})
    rng = np.random.default_rng(1)
    disc_tf.reset_stats()
    for shape in SHAPES:
        ids = _ids(rng, shape)
        assert_same(fn(ids), jitted(ids), tf.float32)
    table.assign(table * -3.0)  # a new value, seen by the next call
    ids = _ids(rng, (3, 4))
    assert_same(fn(ids), jitted(ids), tf.float32)
    assert disc_tf.stats()["fallbacks"] == 0
    if gpu_code_path():  # TF's GPU kernel: a row of zeros for the bad index, no error
        bad = jitted(np.array([[1, VOCAB]], np.int32)).numpy()  # reversed along dim 1
        np.testing.assert_array_equal(bad[0, 0], np.full(WIDTH, 1.0, np.float32))  # tanh(0)*2+1
        assert_same(fn(np.array([[1]], np.int32))[0, 0], bad[0, 1], tf.float32)
    else:
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"indices.* = 50 is not in \[0, 50\)"):
            jitted(np.array([[1, VOCAB]], np.int32))
    assert_same(fn(ids), jitted(ids), tf.float32)  # the next call works


class _Embedder(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = tf.Variable(np.random.default_rng(2).standard_normal((VOCAB, WIDTH))
                                 .astype(np.float32))
        self.serve = _lookup_fn(self.table)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("embed")
    src, dst = root / "model", root / "opt"
    tf.saved_model.save(_Embedder(), str(src))
    report = optimize_saved_model(str(src), str(dst), strict=True)
    return src, dst, report


def test_saved_model_with_a_captured_table_compiles_whole(saved):
    src, dst, report = saved
    assert not report.not_analysed, report.not_analysed
    assert len(report.compiled) == 1 and not report.refused
    done, total = report.serving_share()
    assert done == total > 0, report.unclustered_ops
    assert {"ResourceGather", "ReverseV2"} <= {op for _, op in report.compiled[0].ops}
    original, optimized, direct = (tf.saved_model.load(str(src)), tf.saved_model.load(str(dst)),
                                   disc_tf.load(str(dst)))
    rng = np.random.default_rng(3)
    disc_tf.reset_stats()
    for shape in SHAPES:
        ids = _ids(rng, shape)
        assert_same(original.serve(ids), optimized.serve(ids), tf.float32)
        assert_same(original.serve(ids), direct.serve(ids), tf.float32)
        want = original.signatures["serving_default"](ids=ids)
        got = optimized.signatures["serving_default"](ids=ids)
        for key in want:
            assert_same(want[key], got[key], tf.float32)
    stats = disc_tf.stats()
    assert stats["fallbacks"] == 0 and stats["kernels"] > 0, stats


@pytest.mark.fallback
def test_the_fallback_function_gathers_the_value(saved, monkeypatch):
    """The fallback receives the variable's value (the op reads it), so it runs a
    GatherV2 where the body had a ResourceGather."""
    src, dst, _ = saved
    monkeypatch.setenv("DISC_TF_FORCE_FALLBACK", "1")
    original, optimized = tf.saved_model.load(str(src)), tf.saved_model.load(str(dst))
    rng = np.random.default_rng(4)
    disc_tf.reset_stats()
    for shape in SHAPES[:3]:
        ids = _ids(rng, shape)
        assert_same(original.serve(ids), optimized.serve(ids), tf.float32)
    stats = disc_tf.stats()
    assert stats["fallbacks"] == 3 and stats["kernels"] == 0, stats


class _TwoTables(tf.Module):
    """Word and position embeddings summed (as BERT's embedding layer does): two
    stateful lookups, so two control outputs of the function, in one cluster."""

    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(5)
        self.words = tf.Variable(rng.standard_normal((VOCAB, WIDTH)).astype(np.float32))
        self.positions = tf.Variable(rng.standard_normal((16, WIDTH)).astype(np.float32))

    @tf.function(input_signature=[IDS])
    def serve(self, ids):
        pos = tf.range(tf.shape(ids)[1])
        return tf.gather(self.words, ids) + tf.gather(self.positions, pos) * 0.5


def test_two_lookups_in_one_cluster_load_and_match(tmp_path):
    module = _TwoTables()
    src, dst = tmp_path / "model", tmp_path / "opt"
    tf.saved_model.save(module, str(src))
    report = optimize_saved_model(str(src), str(dst), strict=True)
    lookups = [c for c in report.compiled
               if sum(op == "ResourceGather" for _, op in c.ops) == 2]
    assert lookups, report.summary()
    loaded = tf.saved_model.load(str(dst))
    rng = np.random.default_rng(6)
    for shape in [(2, 5), (1, 16), (3, 1)]:
        ids = _ids(rng, shape)
        assert_same(module.serve(ids), loaded.serve(ids), tf.float32)
