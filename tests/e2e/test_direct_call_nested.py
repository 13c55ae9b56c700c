"""disc_tf.load: functions whose arguments are dicts, lists and tuples of tensors (a
Keras 3 ``model.export``'s ``serve(inputs)``) called directly, against TF at random
shapes, and the calls whose structure is not the traced one, which go TF's way."""

from __future__ import annotations

import collections
import pathlib

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import layers

import disc_tf
from disc_tf.direct_call import _flattener, _tensor_leaves

RTOL = ATOL = 1e-4
VOCAB = 50


def _keras_dict_model() -> keras.Model:
    """A keras-hub-like backbone: inputs {token_ids, padding_mask}, two outputs."""
    keras.utils.set_random_seed(0)
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    mask = keras.Input((None,), dtype="int32", name="padding_mask")
    h = layers.Dense(16, activation="gelu")(layers.Embedding(VOCAB, 16)(ids))
    weight = keras.ops.expand_dims(keras.ops.cast(mask, "float32"), -1)
    seq = layers.Dense(8)(h * weight)
    pooled = keras.ops.sum(seq, axis=1) / (keras.ops.sum(weight, axis=1) + 1.0)
    return keras.Model({"token_ids": ids, "padding_mask": mask},
                       {"sequence_output": seq, "pooled_output": pooled})


def _keras_list_model() -> keras.Model:
    """Inputs as a list: a float [None, None, 4] and a float [None, 4]."""
    keras.utils.set_random_seed(1)
    x = keras.Input((None, 4), name="x")
    bias = keras.Input((4,), name="bias")
    h = layers.Dense(6, activation="tanh")(x + keras.ops.expand_dims(bias, 1))
    return keras.Model([x, bias], h)


def _export(model: keras.Model, root: pathlib.Path) -> None:
    model.export(str(root / "orig"), verbose=False)
    disc_tf.optimize(str(root / "orig"), str(root / "opt"))


@pytest.fixture(scope="module")
def dict_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("nested_dict")
    _export(_keras_dict_model(), root)
    return root


def _tokens(rng: np.random.Generator, batch: int, length: int) -> dict[str, np.ndarray]:
    ids = rng.integers(0, VOCAB, (batch, length)).astype(np.int32)
    mask = (rng.random((batch, length)) < 0.8).astype(np.int32)
    return {"token_ids": ids, "padding_mask": mask}


def _check(want, got) -> None:
    """Same structure (container types, dict key order), dtypes and values."""
    assert tf.nest.map_structure(lambda _: 0, want) == tf.nest.map_structure(lambda _: 0, got)
    tf.nest.assert_same_structure(want, got, check_types=True)
    for w, g in zip(_dicts(want), _dicts(got)):
        assert list(w) == list(g), (list(w), list(g))
    for w, g in zip(tf.nest.flatten(want), tf.nest.flatten(got)):
        assert type(g) is type(w) and g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g.numpy(), w.numpy(), RTOL, ATOL)


def _dicts(value) -> list[dict]:
    """Every dict in a nested result, outermost first."""
    if isinstance(value, dict):
        return [value] + [d for v in value.values() for d in _dicts(v)]
    if isinstance(value, (list, tuple)):
        return [d for v in value for d in _dicts(v)]
    return []


def test_a_keras_export_with_dict_inputs_is_called_directly(dict_dirs):
    reference = tf.saved_model.load(str(dict_dirs / "orig"))
    model = disc_tf.load(str(dict_dirs / "opt"))
    assert model.direct_functions() == {"serve": None, "serving_default": None}
    assert model.warmed_up["serve"]
    disc_tf.reset_stats()
    rng = np.random.default_rng(0)
    shapes = [(1, 1), (2, 7), (3, 0), (5, 33)] + [tuple(int(d) for d in rng.integers(1, 40, 2))
                                                  for _ in range(3)]
    for batch, length in shapes:
        x = _tokens(rng, batch, length)
        want = reference.serve(x)
        _check(want, model.serve(x))
        _check(want, model.serve({k: tf.constant(v) for k, v in x.items()}))
        _check(reference.signatures["serving_default"](**x),
               model.signatures["serving_default"](**x))
    assert model.serve.direct_calls == 2 * len(shapes) and model.serve.tf_calls == 0
    assert model.signatures["serving_default"].direct_calls == len(shapes)
    assert disc_tf.stats()["fallbacks"] == 0


def test_a_structure_other_than_the_traced_one_goes_through_tf(dict_dirs):
    reference = tf.saved_model.load(str(dict_dirs / "orig"))
    model = disc_tf.load(str(dict_dirs / "opt"))
    x = _tokens(np.random.default_rng(1), 2, 5)
    ids, mask = x["token_ids"], x["padding_mask"]
    # TF's binding refuses each of these with a TypeError; so does the model, through TF.
    for bad in ({"token_ids": ids}, dict(x, extra=ids), dict(x, extra=None), [ids, mask],
                (ids, mask), {"token_ids": ids, "padding_mask": {"m": mask}},
                {"token_ids": tf.constant(ids, tf.float32), "padding_mask": mask}):
        with pytest.raises(TypeError):
            reference.serve(bad)
        with pytest.raises(TypeError):
            model.serve(bad)
    with pytest.raises(TypeError):
        model.serve(inputs=x)  # serve's argument is positional-only
    with pytest.raises(TypeError):
        model.serve(x, x)
    assert model.serve.direct_calls == 0
    calls = model.serve.tf_calls
    assert calls == 9
    # What TF accepts and converts (another mapping type, int64 arrays, Python lists)
    # runs TF's way, with TF's answer.
    for ok in (collections.OrderedDict(x), {"token_ids": ids.astype(np.int64), "padding_mask": mask},
               {k: v.tolist() for k, v in x.items()}):
        _check(reference.serve(ok), model.serve(ok))
    assert model.serve.tf_calls == calls + 3 and model.serve.direct_calls == 0
    _check(reference.serve(x), model.serve(x))
    assert model.serve.direct_calls == 1


def test_a_keras_export_with_list_inputs_is_called_directly(tmp_path):
    _export(_keras_list_model(), tmp_path)
    reference = tf.saved_model.load(str(tmp_path / "orig"))
    model = disc_tf.load(str(tmp_path / "opt"))
    assert model.direct_functions()["serve"] is None
    rng = np.random.default_rng(2)
    for batch, length in ((1, 1), (3, 9), (4, 0), (2, 17)):
        x = [rng.standard_normal((batch, length, 4)).astype(np.float32),
             rng.standard_normal((batch, 4)).astype(np.float32)]
        _check(reference.serve(x), model.serve(x))
    assert model.serve.direct_calls == 4
    x = [rng.standard_normal((2, 3, 4)).astype(np.float32),
         rng.standard_normal((2, 4)).astype(np.float32)]
    for bad in (tuple(x), x[:1], x + [x[1]]):
        with pytest.raises(TypeError):
            reference.serve(bad)
        with pytest.raises(TypeError):
            model.serve(bad)
    assert model.serve.direct_calls == 4 and model.serve.tf_calls == 3


class _Nested(tf.Module):
    """A dict holding a list, then a tuple; nested outputs of dicts, lists and tuples."""

    def __init__(self) -> None:
        self.w = tf.Variable(np.linspace(-1, 1, 8).astype(np.float32))

    @tf.function(input_signature=[
        {"a": tf.TensorSpec([None, 8], tf.float32),
         "b": [tf.TensorSpec([None], tf.float32), tf.TensorSpec([None, 8], tf.float32)]},
        (tf.TensorSpec([], tf.float32),)])
    def serve(self, d, t):
        h = tf.tanh(d["a"] * self.w) + d["b"][1] * t[0]
        return {"z": [h, tf.reduce_sum(h, -1) + d["b"][0]], "y": (h * 2.0,)}


def test_nested_arguments_and_outputs_have_tf_s_structure(tmp_path):
    module = _Nested()
    tf.saved_model.save(module, str(tmp_path / "orig"))
    disc_tf.optimize(str(tmp_path / "orig"), str(tmp_path / "opt"))
    reference = tf.saved_model.load(str(tmp_path / "orig"))
    model = disc_tf.load(str(tmp_path / "opt"))
    assert model.direct_functions()["serve"] is None
    rng = np.random.default_rng(3)
    for rows in (1, 0, 6, 41):
        d = {"a": rng.standard_normal((rows, 8)).astype(np.float32),
             "b": [rng.standard_normal(rows).astype(np.float32),
                   tf.constant(rng.standard_normal((rows, 8)).astype(np.float32))]}
        t = (np.float32(rng.standard_normal()),)
        want = reference.serve(d, t)
        got = model.serve(d, t)
        _check(want, got)
        assert type(got["z"]) is list and type(got["y"]) is tuple
    assert model.serve.direct_calls == 4 and model.serve.tf_calls == 0
    d = {"a": np.ones((2, 8), np.float32), "b": [np.ones(2, np.float32), np.ones((2, 8), np.float32)]}
    for bad in ((dict(d, b=tuple(d["b"])), (np.float32(1),)), (d, [np.float32(1)]),
                (dict(d, b=d["b"][:1]), (np.float32(1),))):
        with pytest.raises(TypeError):
            reference.serve(*bad)
        with pytest.raises(TypeError):
            model.serve(*bad)
    assert model.serve.direct_calls == 4 and model.serve.tf_calls == 3


_S = tf.TensorSpec([None], tf.float32)


@pytest.mark.parametrize("spec", [
    {"b": _S, "a": _S},
    [_S, {"y": _S, "x": (_S, _S)}, ()],
    ({"k": [_S]}, _S, {}),
])
def test_flattening_follows_tf_nest_and_checks_the_structure_exactly(spec):
    flatten = _flattener(spec)
    leaves = tf.nest.flatten(spec)
    assert _tensor_leaves(spec) == len(leaves)
    value = tf.nest.map_structure(lambda _: object(), spec)
    out: list = []
    assert flatten(value, out)
    assert all(a is b for a, b in zip(out, tf.nest.flatten(value))) and len(out) == len(leaves)
    # Every container swapped for another type, or given one item more, is refused.
    variants = []
    if isinstance(spec, dict):
        variants += [collections.OrderedDict(value), dict(value, extra=1),
                     {k: v for k, v in list(value.items())[1:]}]
    else:
        variants += [list(value) if type(value) is tuple else tuple(value), type(value)(value[:-1]),
                     type(value)([*value, 1])]
    first = value[sorted(value)[0]] if isinstance(value, dict) else value[0]
    if isinstance(first, (dict, list, tuple)) and first:
        changed = dict(value) if isinstance(value, dict) else list(value)
        changed[sorted(value)[0] if isinstance(value, dict) else 0] = (
            list(first) if type(first) is tuple else tuple(first) if type(first) is list
            else collections.OrderedDict(first))
        variants.append(changed if isinstance(value, dict) else type(value)(changed))
    for bad in variants:
        assert not flatten(bad, [])


def test_mixed_or_other_structures_are_not_flattened():
    assert _tensor_leaves({"a": _S, "b": 3}) is None
    assert _tensor_leaves(collections.namedtuple("P", "a b")(_S, _S)) is None
    assert _tensor_leaves([[], {}]) == 0
    assert _flattener(_S) is None
