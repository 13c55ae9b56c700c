"""The model zoo's fresh process: loads an optimized SavedModel with
``tf.saved_model.load`` and with ``disc_tf.load``, runs each feed through both
loaders' serving signature, and pickles the outputs, the stats and which
functions ``disc_tf.load`` calls directly.

Usage: ``python fresh_load.py OPTIMIZED_DIR FEEDS.npz RESULT.pkl``
"""

from __future__ import annotations

import pickle
import sys

import numpy as np
import tensorflow as tf

import disc_tf


def main(model_dir: str, feeds_path: str, result_path: str) -> None:
    """Runs the feeds through both loaders and writes what the zoo test checks."""
    with np.load(feeds_path) as data:
        feeds: dict[int, dict[str, np.ndarray]] = {}
        for key in data.files:
            index, name = key.split("/", 1)
            feeds.setdefault(int(index), {})[name] = data[key]
    inputs = [feeds[i] for i in sorted(feeds)]
    plain = tf.saved_model.load(model_dir).signatures["serving_default"]
    model = disc_tf.load(model_dir)
    direct = model.signatures["serving_default"]
    disc_tf.reset_stats()
    result = {"direct_functions": model.direct_functions()}
    for loader, fn in (("tf.saved_model.load", plain), ("disc_tf.load", direct)):
        result[loader] = [{k: v.numpy() for k, v in fn(**x).items()} for x in inputs]
    result["stats"] = disc_tf.stats()
    result["direct_calls"] = getattr(direct, "direct_calls", 0)
    with open(result_path, "wb") as f:
        pickle.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
