"""What ``optimize`` compiles (the serving path, or what ``signatures`` names) and
the report it gives: per cluster compiled or refused with the reason, one total
line that ``inspect`` prints too, before and after optimizing."""

from __future__ import annotations

import json
import pathlib
import re

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

import disc_tf
from disc_tf import cli, pipeline
from disc_tf.cluster.rewrite import DISC_OP
from disc_tf.saved_model import optimize_saved_model
from tests.harness import assert_same

SPEC = tf.TensorSpec([None, None], tf.float32)
VSPEC = tf.TensorSpec([None], tf.float32)
TOTAL = re.compile(r"\d+ of \d+ clusters compiled, [\d.]+% of serving compute ops "
                   r"\(\d+ of \d+\)")


class _Sub(tf.Module):
    @tf.function(input_signature=[SPEC])
    def helper(self, x):
        return tf.tanh(x) * 3.0 + 1.0


class _Model(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        self.sub = _Sub()
        self.scale = tf.Variable(2.0)

    @tf.function(input_signature=[SPEC])
    def serve(self, x):
        return tf.exp(x) * self.scale + 1.0

    @tf.function(input_signature=[SPEC, VSPEC])
    def mixed(self, x, v):
        # A float Range over a cast dim with step 0.1 passes the op table but its
        # lowering refuses it: the node is left out, the ops around it compile.
        ramp = tf.range(0.0, tf.cast(tf.shape(v)[0], tf.float32), 0.1)
        return tf.exp(x) * 2.0 + 0.5, tf.tanh(ramp) * 3.0 + 1.0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("scope") / "model"
    m = _Model()
    tf.saved_model.save(m, str(path), signatures={"serving_default": m.serve,
                                                  "mixed": m.mixed})
    return path


def _functions_with_clusters(model: pathlib.Path) -> set[str]:
    sm = saved_model_pb2.SavedModel.FromString((model / "saved_model.pb").read_bytes())
    return {f.signature.name for f in sm.meta_graphs[0].graph_def.library.function
            if any(n.op == DISC_OP for n in f.node_def)}


def _library(model: pathlib.Path) -> dict[str, bytes]:
    sm = saved_model_pb2.SavedModel.FromString((model / "saved_model.pb").read_bytes())
    return {f.signature.name: f.SerializeToString(deterministic=True)
            for f in sm.meta_graphs[0].graph_def.library.function}


def test_default_compiles_the_serving_path_only(model_dir, tmp_path):
    out = tmp_path / "opt"
    report = optimize_saved_model(str(model_dir), str(out), strict=False)
    compiled = _functions_with_clusters(out)
    assert any(f.startswith("__inference_serve_") for f in compiled), compiled
    assert any(f.startswith("__inference_mixed_") for f in compiled), compiled
    helper = [f for f in report.skipped_functions if f.startswith("__inference_helper_")]
    assert helper, report.skipped_functions
    assert any("_traced_save" in f for f in report.skipped_functions)
    # Functions outside the scope are copied byte for byte.
    before, after = _library(model_dir), _library(out)
    assert all(after[f] == before[f] for f in report.skipped_functions)

    loaded, original = tf.saved_model.load(str(out)), tf.saved_model.load(str(model_dir))
    rng = np.random.default_rng(3)
    disc_tf.reset_stats()
    for shape in [(2, 3), (1, 7), (5, 1)]:
        x = rng.standard_normal(shape).astype(np.float32)
        v = rng.standard_normal(shape[1]).astype(np.float32)
        assert_same(original.serve(x), loaded.serve(x), tf.float32)
        assert_same(original.mixed(x, v), loaded.mixed(x, v), tf.float32)
        assert_same(original.sub.helper(x), loaded.sub.helper(x), tf.float32)
    stats = disc_tf.stats()
    assert stats["kernels"] > 0 and stats["fallbacks"] == 0, stats


def test_all_functions_and_signatures(model_dir, tmp_path):
    everything = optimize_saved_model(str(model_dir), str(tmp_path / "all"), strict=False,
                                      all_functions=True)
    assert not everything.skipped_functions
    assert any(f.startswith("__inference_helper_")
               for f in _functions_with_clusters(tmp_path / "all"))

    one = optimize_saved_model(str(model_dir), str(tmp_path / "one"), strict=True,
                               signatures=["serving_default"])
    compiled = _functions_with_clusters(tmp_path / "one")
    assert compiled and not any(f.startswith("__inference_mixed_") for f in compiled), compiled
    assert any(f.startswith("__inference_mixed_") for f in one.skipped_functions)
    assert not one.refused and one.serving_share()[0] == one.serving_share()[1] > 0

    with pytest.raises(ValueError, match=r"signatures \['nope'\] not in the model"):
        optimize_saved_model(str(model_dir), str(tmp_path / "bad"), signatures=["nope"])


class _KerasLike(tf.Module):
    """Saves its call traced twice, as Keras does: for inference and for training."""

    @tf.function
    def __call__(self, x, training=False):
        if training:
            return tf.nn.dropout(x, 0.5) * 2.0 + 1.0
        return tf.exp(x) * 2.0 + 1.0


@pytest.mark.parametrize("by_keyword", [True, False])
def test_training_mode_traces_are_not_the_serving_path(tmp_path, by_keyword):
    m = _KerasLike()
    if by_keyword:
        m.__call__.get_concrete_function(SPEC, training=True)
        m.__call__.get_concrete_function(SPEC, training=False)
    else:
        m.__call__.get_concrete_function(SPEC, True)
        m.__call__.get_concrete_function(SPEC, False)
    src = tmp_path / "model"
    tf.saved_model.save(m, str(src))
    report = optimize_saved_model(str(src), str(tmp_path / "opt"), strict=True)
    # The inference trace compiles; the training one (dropout) is left as it was.
    assert report.clusters and not report.refused
    assert any("1 training-mode trace(s) left out" in e for e in report.entries), report.entries
    training = [f for f in report.skipped_functions if f.startswith("__inference___call__")]
    assert len(training) == 1, report.skipped_functions
    compiled = _functions_with_clusters(tmp_path / "opt")
    assert len([f for f in compiled if f.startswith("__inference___call__")]) == 1, compiled
    everything = optimize_saved_model(str(src), str(tmp_path / "all"), strict=False,
                                      all_functions=True)
    assert not any(f.startswith("__inference___call__") for f in everything.skipped_functions)

    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    for loaded in (tf.saved_model.load(str(tmp_path / "opt")),
                   disc_tf.load(str(tmp_path / "opt"))):
        assert_same(tf.exp(x) * 2.0 + 1.0, loaded(x), tf.float32)
        assert loaded(x, training=True).shape == (3, 4)
    # disc_tf.load calls the inference trace directly; a training call goes through TF.
    assert loaded.direct_functions() == {"__call__": None}
    assert loaded.warmed_up == {"__call__": True}
    assert loaded._call.direct_calls == 1 and loaded._call.tf_calls == 1


def test_report_is_printed_stored_and_kept(model_dir, tmp_path, capsys):
    out = tmp_path / "opt"
    assert disc_tf.optimize(str(model_dir), str(out), strict=False) == str(out)
    report = disc_tf.last_report()
    assert isinstance(report, disc_tf.OptimizeReport)
    err = capsys.readouterr().err
    summary = [ln for ln in err.splitlines() if ln.startswith("disc_tf.optimize: ")]
    assert summary[-1] == f"disc_tf.optimize: {report.total_line()}", err
    assert any("refused node range (Range) of __inference_mixed_" in ln
               and "multiples of 2^-8" in ln for ln in summary), summary
    done, total = report.serving_share()
    assert 0 < done == total - 1  # only the Range stayed TF
    assert TOTAL.fullmatch(report.total_line())

    stored = json.loads((out / "assets.extra" / "disc" / "report.json").read_text())
    assert stored["summary"] == report.total_line()
    assert stored["serving_compute_ops"] == {"compiled": done, "total": total}
    assert [r["node"] for r in stored["refused_nodes"]] == ["range"]
    assert len(stored["clusters"]) == len(report.clusters) == len(report.compiled)


def test_a_refused_cluster_is_reported_and_strict_raises(model_dir, tmp_path, monkeypatch):
    real = pipeline.build_cluster

    def failing(spec, fe, *args):
        if spec.subgraph.node and any(n.op == "Exp" for n in spec.subgraph.node):
            raise RuntimeError("compiler crashed (injected)")
        return real(spec, fe, *args)

    monkeypatch.setattr(pipeline, "build_cluster", failing)
    report = optimize_saved_model(str(model_dir), str(tmp_path / "opt"), strict=False,
                                  signatures=["serving_default"])
    (refused,) = report.refused
    assert refused.error == "RuntimeError: compiler crashed (injected)"
    lines = report.summary().splitlines()
    assert lines[0].startswith(f"refused cluster {refused.name} of __inference_serve_")
    assert lines[0].endswith(": RuntimeError: compiler crashed (injected)")
    assert lines[-1].startswith("0 of 1 clusters compiled, 0.0% of serving compute ops")
    with pytest.raises(disc_tf.StrictModeError, match="compiler crashed"):
        optimize_saved_model(str(model_dir), str(tmp_path / "strict"), strict=True,
                             signatures=["serving_default"])


def _inspect_total(model: pathlib.Path, capsys, *args: str) -> str:
    assert cli.main(["inspect", str(model), *args]) == 0
    out = capsys.readouterr().out
    assert "unsupported op DiscCluster" not in out, out
    last = out.strip().splitlines()[-1]
    assert last.startswith("serving path: "), out
    return last[len("serving path: "):]


def test_inspect_agrees_with_optimize_before_and_after(model_dir, tmp_path, capsys):
    before = _inspect_total(model_dir, capsys)
    out = tmp_path / "opt"
    report = optimize_saved_model(str(model_dir), str(out), strict=False)
    assert before == report.total_line()
    assert _inspect_total(out, capsys) == report.total_line()
    # Clustering alone is labelled as such.
    assert cli.main(["inspect", str(model_dir), "--no-lower"]) == 0
    assert "serving path: clustered compute ops (not yet lowered): " in capsys.readouterr().out
    # Checkpoint functions are out of the serving path, and in with --all-functions.
    assert cli.main(["inspect", str(model_dir), "--all-functions"]) == 0
    assert "_traced_save" in capsys.readouterr().out
    assert cli.main(["inspect", str(model_dir), "--signatures", "nope"]) == 2
    assert "signatures ['nope'] not in the model" in capsys.readouterr().err
