"""TF Serving warm-up requests written into optimized SavedModels.

TF Serving replays ``assets.extra/tf_serving_warmup_requests`` when it loads a model,
before the model takes traffic: a TFRecord file of ``tensorflow.serving.PredictionLog``
protos. A DiscCluster's first call packs its GEMM weights (and a Conv1D's Winograd
transforms); in TF Serving, without a warm-up, that lands on the first requests, as
it would in ``disc_tf.load`` without its own warm-up call.

``optimize(..., serving_warmup=True)`` therefore writes one predict request per
serving signature (off by default: the check below costs about 0.6 s), on the
arguments of ``disc_tf.load``'s warm-up call (ones, unknown dims 8 or 1), unless the
model already carries a warm-up file (the user's own is kept as it is). Each request is
run once at optimize time, on the original model, and written only if it ran, since TF
Serving refuses to load a model whose warm-up request fails; and only stateless
signatures get one (their direct-call plan holds no op that writes state).

The few serving messages are encoded here (the ``tensorflow-serving-api`` package is
not a dependency); their field numbers are those of TF Serving's ``model.proto``,
``predict.proto`` and ``prediction_log.proto``.
"""

from __future__ import annotations

import gc
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


def _warmup_requests(export_dir: str, original_dir: str) -> dict[str, dict[str, np.ndarray]]:
    """Each stateless signature's warm-up arguments that ran, by signature name.

    The optimized model at ``export_dir`` says which signatures are stateless (those
    with a direct-call plan); the calls run on the original model at ``original_dir``,
    which computes the same function: a DiscCluster run here would keep the weights it
    packs in this process (its kernel outlives the restored function; 144 MiB for the
    FastSpeech-like model, against 31 MiB of TF's own caches for the original)."""
    from disc_tf.direct_call import WARMUP_DIMS, DiscModel

    planned = DiscModel(tf.saved_model.load(export_dir), warmup=False)
    original = tf.saved_model.load(original_dir)
    requests: dict[str, dict[str, np.ndarray]] = {}
    for name, fn in planned.signatures.items():
        for size in WARMUP_DIMS:
            args = fn.warmup_arguments(size)
            if args is None:
                logger.info("disc_tf.optimize: no TF Serving warm-up request for signature "
                            "%s: %s", name, fn.reason or "an argument of unknown rank or of strings")
                break
            try:
                original.signatures[name](**args)
            except (tf.errors.OpError, ValueError, TypeError) as e:
                logger.debug("disc_tf.optimize: warm-up of %s at unknown dims %d failed: %s",
                             name, size, e)
                continue
            requests[name] = {k: v.numpy() for k, v in args.items()}
            break
    del planned, original
    gc.collect()
    return requests


def write_serving_warmup(export_dir: str | pathlib.Path,
                         original_dir: str | pathlib.Path) -> list[str]:
    """Writes TF Serving's warm-up requests into the optimized SavedModel at
    ``export_dir`` (optimized from ``original_dir``): one per stateless signature that
    ran on ones (unknown dims 8, or 1). Returns the signatures written; none (and
    nothing written) when the model has a warm-up file already, or no signature ran."""
    path = pathlib.Path(export_dir) / WARMUP_FILE
    if path.exists():
        logger.info("disc_tf.optimize: %s kept as the model has it", WARMUP_FILE)
        return []
    requests = _warmup_requests(str(export_dir), str(original_dir))
    if not requests:
        return []
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for name, inputs in sorted(requests.items()):
            writer.write(predict_log(name, inputs))
    return sorted(requests)
