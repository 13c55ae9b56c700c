"""TF Serving warm-up requests written into optimized SavedModels.

TF Serving replays ``assets.extra/tf_serving_warmup_requests`` when it loads a model,
before the model takes traffic: a TFRecord file of ``tensorflow.serving.PredictionLog``
protos. A DiscCluster's first call packs its GEMM weights (and a Conv1D's Winograd
transforms); in TF Serving, without a warm-up, that lands on the first requests, as
it would in ``disc_tf.load`` without its own warm-up call.

``optimize`` therefore writes one predict request per serving signature that
``disc_tf.load``'s warm-up call ran on (ones, unknown dims 8 or 1), unless the model
already carries a warm-up file (the user's own is kept as it is). Only signatures that
ran are written, since TF Serving refuses to load a model whose warm-up request fails;
and only stateless ones (the direct-call plan holds no op that writes state).

The few serving messages are encoded here (the ``tensorflow-serving-api`` package is
not a dependency); their field numbers are those of TF Serving's ``model.proto``,
``predict.proto`` and ``prediction_log.proto``.
"""

from __future__ import annotations

import logging
import pathlib

import numpy as np
import tensorflow as tf

logger = logging.getLogger("disc_tf")

#: Where TF Serving looks for warm-up requests, under the SavedModel directory.
WARMUP_FILE = pathlib.Path("assets.extra") / "tf_serving_warmup_requests"

# Field numbers (wire type 2: length-delimited) of the messages a predict warm-up needs.
_PREDICTION_LOG_PREDICT_LOG = 6  # PredictionLog.predict_log (PredictLog)
_PREDICT_LOG_REQUEST = 1  # PredictLog.request (PredictRequest)
_PREDICT_REQUEST_MODEL_SPEC = 1  # PredictRequest.model_spec (ModelSpec)
_PREDICT_REQUEST_INPUTS = 2  # PredictRequest.inputs: map<string, TensorProto>
_MODEL_SPEC_SIGNATURE_NAME = 3  # ModelSpec.signature_name
_MAP_KEY, _MAP_VALUE = 1, 2  # a map entry's key and value


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def predict_log(signature_name: str, inputs: dict[str, np.ndarray]) -> bytes:
    """A serialized ``PredictionLog`` holding a predict request of ``inputs`` (by the
    signature's input names) to signature ``signature_name``."""
    spec = _field(_MODEL_SPEC_SIGNATURE_NAME, signature_name.encode())
    request = _field(_PREDICT_REQUEST_MODEL_SPEC, spec) + b"".join(
        _field(_PREDICT_REQUEST_INPUTS,
               _field(_MAP_KEY, name.encode())
               + _field(_MAP_VALUE, tf.make_tensor_proto(value).SerializeToString()))
        for name, value in sorted(inputs.items()))
    return _field(_PREDICTION_LOG_PREDICT_LOG, _field(_PREDICT_LOG_REQUEST, request))


def write_serving_warmup(export_dir: str | pathlib.Path) -> list[str]:
    """Writes TF Serving's warm-up requests into the optimized SavedModel at
    ``export_dir``: one per signature whose ``disc_tf.load`` warm-up call ran. Returns
    the signatures written; none (and nothing written) when the model has a warm-up
    file already, or no signature's warm-up ran."""
    from disc_tf.direct_call import load

    path = pathlib.Path(export_dir) / WARMUP_FILE
    if path.exists():
        logger.info("disc_tf.optimize: %s kept as the model has it", WARMUP_FILE)
        return []
    model = load(str(export_dir))
    requests = {name: fn.warmup_inputs for name, fn in model.signatures.items()
                if fn.warmup_inputs is not None}
    skipped = sorted(set(model.signatures) - set(requests))
    if skipped:
        logger.info("disc_tf.optimize: no TF Serving warm-up request for signature(s) %s "
                    "(%s)", ", ".join(skipped), "; ".join(
                        model.signatures[n].reason or "no warm-up call ran" for n in skipped))
    if not requests:
        return []
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for name, inputs in sorted(requests.items()):
            writer.write(predict_log(name, inputs))
    return sorted(requests)
