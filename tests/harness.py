"""Shared helpers: random shapes with broadcasting, comparison against TF."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import disc_tf
from disc_tf.runtime.target import resolve_target

RTOL = {tf.float32: 1e-5, tf.float16: 2e-3, tf.int32: 0, tf.int64: 0, tf.bool: 0}
ATOL = {tf.float32: 1e-6, tf.float16: 1e-3, tf.int32: 0, tf.int64: 0, tf.bool: 0}


def random_value(rng: np.random.Generator, shape: tuple, dtype: tf.DType,
                 positive: bool = False) -> np.ndarray:
    """Random data of ``dtype``; small ints, normal floats (or positive)."""
    if dtype == tf.bool:
        return rng.random(shape) < 0.5
    if dtype.is_integer:
        lo = 1 if positive else -9
        return rng.integers(lo, 10, size=shape).astype(dtype.as_numpy_dtype)
    data = rng.standard_normal(shape)
    if positive:
        data = np.abs(data) + 0.1
    return data.astype(dtype.as_numpy_dtype)


def broadcast_shapes(rng: np.random.Generator, ranks: list[int], count: int,
                     max_dim: int = 6) -> list[list[tuple]]:
    """``count`` sets of operand shapes that numpy-broadcast together.

    The sets include a size-1 broadcast dim and a zero-size dim whenever the
    output rank allows.
    """
    out_rank = max(ranks)
    sets = []
    for n in range(count):
        hi = max_dim if out_rank <= 4 else 3
        full = [int(rng.integers(2, hi + 1)) for _ in range(out_rank)]
        if n == 1 and out_rank:
            full[int(rng.integers(out_rank))] = 0
        shapes = []
        for i, r in enumerate(ranks):
            dims = full[out_rank - r:]
            if n >= 2 and r and rng.random() < 0.6:
                k = int(rng.integers(r))
                dims = dims[:k] + [1] + dims[k + 1:]
            if n == 0 and i == 0 and r:
                dims = [1] * r  # everything broadcast from one element
            shapes.append(tuple(dims))
        sets.append(shapes)
    return sets


def assert_same(expected, actual, dtype: tf.DType) -> None:
    """Compares outputs (NaN == NaN) with the tolerance of ``dtype``."""
    for e, a in zip(tf.nest.flatten(expected), tf.nest.flatten(actual)):
        e = np.asarray(e)
        a = np.asarray(a)
        assert e.shape == a.shape, (e.shape, a.shape)
        assert e.dtype == a.dtype, (e.dtype, a.dtype)
        if e.dtype == np.float16:
            e, a = e.astype(np.float32), a.astype(np.float32)
        np.testing.assert_allclose(a, e, rtol=RTOL[dtype], atol=ATOL[dtype], equal_nan=True)


#: Ops that compute nothing: they stay outside clusters by design.
NOT_COMPUTE = frozenset({"Placeholder", "Const", "Identity", "IdentityN", "NoOp", "_Arg",
                         "_Retval", "ReadVariableOp", "VarHandleOp"})


def gpu_code_path() -> bool:
    """True when tests compile for the GPU (``$DISC_TF_TARGET`` cuda or cuda-emu): an
    out-of-range gather index then gives 0, as TF's GPU kernels do, not an error."""
    return resolve_target("auto") in ("cuda", "cuda-emu")


def tf_ops_left(jitted) -> list[str]:
    """Op types of the jitted graph that still run as TF ops (not DiscCluster)."""
    return sorted({n.op for n in jitted.graph_def.node
                   if n.op not in NOT_COMPUTE and n.op != "DiscCluster"})


def compiled(fn: tf.types.experimental.PolymorphicFunction, min_cluster_size: int = 1,
             allow_tf: tuple[str, ...] = ()):
    """jit-compiles ``fn`` and checks it really produced DiscCluster kernels: every
    computation of the graph is inside a compiled cluster, except op types in
    ``allow_tf`` (left to TF on purpose)."""
    jitted = disc_tf.jit(fn, min_cluster_size=min_cluster_size)
    built = jitted.report.compiled
    assert built, f"nothing compiled: {jitted.report}"
    target = resolve_target("auto")  # $DISC_TF_TARGET=cuda-emu: the GPU code path
    assert all(c.target == target for c in built), [(c.name, c.target) for c in built]
    left = [op for op in tf_ops_left(jitted) if op not in allow_tf]
    assert not left, f"TF ops left outside compiled clusters: {left}; {jitted.report.unclustered}"
    return jitted


def assert_ops_compiled(jitted, op_types: set[str]) -> None:
    """Every TF op type in ``op_types`` is inside a cluster that compiled."""
    inside = {op for c in jitted.report.compiled for _, op in c.ops}
    missing = set(op_types) - inside
    assert not missing, f"not in a compiled cluster: {sorted(missing)}; report: {jitted.report}"


def assert_matches_tf(tf_fn, jitted, args, rtol: float, atol: float) -> None:
    """Runs both on ``args``; every output must match TF's shape, dtype and values."""
    expected = tf.nest.flatten(tf_fn(*args))
    got = tf.nest.flatten(jitted(*args))
    for e, g in zip(expected, got):
        e, g = np.asarray(e), np.asarray(g)
        assert e.shape == g.shape and e.dtype == g.dtype
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)


def assert_same_outcome(tf_fn, jitted, args) -> None:
    """Both raise TF's InvalidArgument on ``args``, or both return outputs of one shape."""
    outcomes = []
    for impl in (tf_fn, jitted):
        try:
            outcomes.append(np.asarray(impl(*args)).shape)
        except tf.errors.InvalidArgumentError:
            outcomes.append("InvalidArgument")
    assert outcomes[0] == outcomes[1], outcomes


def run_in_session(graph_def, fetch: str, feeds: dict) -> np.ndarray:
    """Imports ``graph_def`` into a fresh graph and runs ``fetch`` in a TF1 Session."""
    with tf.Graph().as_default() as fresh:
        tf.graph_util.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session(graph=fresh) as sess:
            return sess.run(fetch, feeds)
