"""TF Serving warm-up requests (disc_tf/serving_warmup.py): ``optimize`` writes one
predict request per signature that ran, read back here with protobuf's own parser from
TF Serving's field numbers, and replayed as TF Serving does (a TF1 session over the
SavedModel, feeding the signature's tensors). After the replay the session's
DiscCluster has packed every weight operand: requests at any width pack nothing more,
and match TF."""

from __future__ import annotations

import pathlib
import shutil

import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from tensorflow.core.framework import tensor_pb2

import disc_tf
from disc_tf.serving_warmup import WARMUP_FILE
from tests.harness import gpu_code_path

RTOL = ATOL = 1e-4
F = descriptor_pb2.FieldDescriptorProto


def _prediction_log_class():
    """``tensorflow.serving.PredictionLog`` with only the fields a predict warm-up
    uses, in a private pool (TF Serving's numbers: model.proto, predict.proto,
    prediction_log.proto)."""
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(fd) -> None:
        if fd.name in added:
            return
        for dep in fd.dependencies:
            add(dep)
        proto = descriptor_pb2.FileDescriptorProto()
        fd.CopyToProto(proto)
        pool.Add(proto)
        added.add(fd.name)

    add(tensor_pb2.DESCRIPTOR)
    f = descriptor_pb2.FileDescriptorProto(name="warmup_test.proto",
                                           package="tensorflow.serving", syntax="proto3",
                                           dependency=[tensor_pb2.DESCRIPTOR.name])

    def message(name, fields, nested=()):
        m = f.message_type.add(name=name)
        for n, number, kind, type_name, label in fields:
            m.field.add(name=n, number=number, type=kind, type_name=type_name,
                        label=label or F.LABEL_OPTIONAL)
        for entry in nested:
            m.nested_type.add().CopyFrom(entry)
        return m

    entry = descriptor_pb2.DescriptorProto(name="InputsEntry")
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=F.TYPE_MESSAGE,
                    type_name=".tensorflow.TensorProto", label=F.LABEL_OPTIONAL)
    entry.options.map_entry = True
    message("ModelSpec", [("name", 1, F.TYPE_STRING, None, None),
                          ("signature_name", 3, F.TYPE_STRING, None, None)])
    message("PredictRequest", [
        ("model_spec", 1, F.TYPE_MESSAGE, ".tensorflow.serving.ModelSpec", None),
        ("inputs", 2, F.TYPE_MESSAGE, ".tensorflow.serving.PredictRequest.InputsEntry",
         F.LABEL_REPEATED)], [entry])
    message("PredictLog", [("request", 1, F.TYPE_MESSAGE, ".tensorflow.serving.PredictRequest",
                            None)])
    message("PredictionLog", [("predict_log", 6, F.TYPE_MESSAGE,
                               ".tensorflow.serving.PredictLog", None)])
    pool.Add(f)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("tensorflow.serving.PredictionLog"))


class _Conv1D(tf.Module):
    """A kernel-9 Conv1D + bias + ReLU and a dense layer: 1 + 4 + 6 + 8 packed
    operands for the conv (its windowed GEMM's filter and three Winograd variants'
    transforms), 1 for the dense layer."""

    def __init__(self) -> None:
        rng = np.random.default_rng(2)
        self.w = tf.Variable(rng.normal(size=(9, 16, 70)).astype(np.float32) / 12)
        self.b = tf.Variable(rng.normal(size=(70,)).astype(np.float32))
        self.v = tf.Variable(rng.normal(size=(70, 30)).astype(np.float32) / 8)

    @tf.function(input_signature=[tf.TensorSpec([None, None, 16], tf.float32, name="frames")])
    def __call__(self, frames):
        h = tf.nn.relu(tf.nn.conv1d(frames, self.w, 1, "SAME") + self.b)
        return {"out": tf.matmul(h, self.v)}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("warmup")
    module = _Conv1D()
    tf.saved_model.save(module, str(root / "orig"),
                        signatures={"serving_default": module.__call__.get_concrete_function()})
    disc_tf.optimize(str(root / "orig"), str(root / "opt"), quiet=True, serving_warmup=True)
    assert disc_tf.last_report().serving_warmup == ["serving_default"]
    disc_tf.optimize(str(root / "orig"), str(root / "plain"), quiet=True)  # off by default
    return root


def _records(model_dir: pathlib.Path) -> list:
    log_class = _prediction_log_class()
    return [log_class.FromString(r.numpy())
            for r in tf.data.TFRecordDataset(str(model_dir / WARMUP_FILE))]


def test_optimize_writes_one_predict_request_per_signature(model_dirs):
    (log,) = _records(model_dirs / "opt")
    request = log.predict_log.request
    assert request.model_spec.signature_name == "serving_default"
    assert list(request.inputs) == ["frames"]
    frames = tf.make_ndarray(request.inputs["frames"])
    np.testing.assert_array_equal(frames, np.ones((8, 8, 16), np.float32))
    assert not (model_dirs / "plain" / WARMUP_FILE).exists()


def test_a_models_own_warmup_file_is_kept(model_dirs, tmp_path):
    src = tmp_path / "orig"
    shutil.copytree(model_dirs / "orig", src)
    (src / WARMUP_FILE).parent.mkdir(parents=True, exist_ok=True)
    (src / WARMUP_FILE).write_bytes(b"the user's own")
    disc_tf.optimize(str(src), str(tmp_path / "opt"), quiet=True, serving_warmup=True)
    assert (tmp_path / "opt" / WARMUP_FILE).read_bytes() == b"the user's own"
    assert disc_tf.last_report().serving_warmup == []


@pytest.mark.skipif(gpu_code_path(), reason="packed GEMM operands are the CPU backend's")
@pytest.mark.parametrize("variant, packed_by_warmup", [("opt", 20), ("plain", 0)])
def test_a_replayed_warmup_packs_every_weight_before_the_first_request(
        model_dirs, variant, packed_by_warmup):
    """TF Serving's replay: each record's inputs fed to the signature's tensors in the
    session that then serves. Without the file ("plain"), the first requests pack."""
    model_dir = model_dirs / variant
    logs = _records(model_dirs / "opt")  # the requests, replayed only where written
    reference = tf.saved_model.load(str(model_dirs / "orig"))
    rng = np.random.default_rng(9)
    requests = [rng.normal(size=(1 + i % 2, t, 16)).astype(np.float32)
                for i, t in enumerate([300, 40, 5, 129, 64])]
    expected = [reference(x)["out"].numpy() for x in requests]
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], str(model_dir))
        signature = meta.signature_def["serving_default"]
        feeds = {name: info.name for name, info in signature.inputs.items()}
        fetch = signature.outputs["out"].name
        disc_tf.reset_stats()
        if (model_dir / WARMUP_FILE).exists():
            for log in logs:
                inputs = log.predict_log.request.inputs
                sess.run(fetch, {feeds[k]: tf.make_ndarray(v) for k, v in inputs.items()})
        assert disc_tf.stats()["packed_weights"] == packed_by_warmup
        for x, want in zip(requests, expected):
            np.testing.assert_allclose(sess.run(fetch, {feeds["frames"]: x}), want, RTOL, ATOL)
    stats = disc_tf.stats()
    assert stats["packed_weights"] == 20, stats  # by the warm-up, or else by the requests
    assert stats["fallbacks"] == 0 and stats["clusters"] >= 1, stats


class _Tokens(tf.Module):
    """A string input beside a float one: no warm-up request can be made of ones."""

    def __init__(self) -> None:
        self.w = tf.Variable(np.random.default_rng(3).normal(size=(6, 5)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 6], tf.float32, name="x"),
                                  tf.TensorSpec([None], tf.string, name="s")])
    def __call__(self, x, s):
        lengths = tf.cast(tf.strings.length(s), tf.float32)
        return {"y": tf.nn.relu(tf.matmul(x, self.w) * 2.0 + 1.0) + lengths[:, None]}


def test_a_signature_with_a_string_input_gets_no_request(tmp_path):
    """Ones of strings do not exist: no request, and disc_tf.load's own warm-up skips
    the signature (it raised before)."""
    module = _Tokens()
    tf.saved_model.save(module, str(tmp_path / "orig"),
                        signatures={"serving_default": module.__call__.get_concrete_function()})
    disc_tf.optimize(str(tmp_path / "orig"), str(tmp_path / "opt"), quiet=True,
                     serving_warmup=True)
    report = disc_tf.last_report()
    assert report.compiled and report.serving_warmup == []
    assert not (tmp_path / "opt" / WARMUP_FILE).exists()
    model = disc_tf.load(str(tmp_path / "opt"))  # its own warm-up skips the signature too
    assert model.warmed_up["serving_default"] is False
    x = np.random.default_rng(4).normal(size=(3, 6)).astype(np.float32)
    s = tf.constant(["a", "bcd", ""])
    np.testing.assert_allclose(model.signatures["serving_default"](x=x, s=s)["y"],
                               module(x, s)["y"], RTOL, ATOL)
