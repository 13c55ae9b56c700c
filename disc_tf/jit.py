"""``disc_tf.jit``: a tf.function whose graph runs through DiscCluster ops."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import tensorflow as tf
from tensorflow.python.framework.ops import EagerTensor

from disc_tf.optimizer import BodyOptimizer, OptimizeReport, Options
from disc_tf.runtime import isa, native
from disc_tf.runtime.target import resolve_target

log = logging.getLogger("disc_tf")


class JitFunction:
    """A compiled tf.function: traced once, clustered once, runs at any shape.

    Calling it runs the rewritten graph; ``report`` says what was clustered.
    """

    def __init__(self, fn: Callable, input_signature=None, options: Options | None = None):
        native.load()
        if not isinstance(fn, tf.types.experimental.PolymorphicFunction):
            fn = tf.function(fn, input_signature=input_signature)
        if fn.input_signature is None and input_signature is None:
            raise ValueError(
                "disc_tf.jit needs an input signature (tf.function(input_signature=...) "
                "or jit(fn, input_signature=...)); dims may be None, ranks must be known"
            )
        sig = input_signature or fn.input_signature
        self._concrete = fn.get_concrete_function(*sig) if input_signature else (
            fn.get_concrete_function()
        )
        concrete = self._concrete
        graph_def = concrete.graph.as_graph_def()
        captured = list(concrete.captured_inputs)
        n_args = len(concrete.inputs) - len(captured)
        capture_inputs = concrete.inputs[n_args:]
        self._arg_names = [t.name for t in concrete.inputs[:n_args]]
        self._capture_names = [t.name for t in capture_inputs]
        output_names = [t.name for t in concrete.outputs]
        protected = frozenset(t.op.name for t in list(concrete.inputs) + list(concrete.outputs))
        self.report = OptimizeReport()
        opt = BodyOptimizer(graph_def.library, options, self.report)
        name = concrete.name.decode() if isinstance(concrete.name, bytes) else str(concrete.name)
        # Captured eager tensors other than variable handles (a ``tf.constant`` weight)
        # are bound below once, as they are now: constant inputs of their clusters, so
        # that their GEMMs pack them once (as a SavedModel's captured constants are).
        opt.constant_args[name] = frozenset(
            t.op.name for t, c in zip(capture_inputs, captured)
            if isinstance(c, EagerTensor) and c.dtype != tf.resource)
        new_graph = opt.optimize_graph_def(graph_def, protected, body=name,
                                           graph=concrete.graph, prune=True)
        opt.add_new_functions(new_graph.library)
        self.graph_def = new_graph
        self._signature = [tf.TensorSpec(t.shape, t.dtype) for t in concrete.inputs[:n_args]]

        def run_graph(*args):
            input_map = dict(zip(self._arg_names, args))
            # Variables and other captures of the original function become
            # captures of the wrapper graph.
            graph = tf.compat.v1.get_default_graph()
            input_map.update(zip(self._capture_names, (graph.capture(c) for c in captured)))
            return tf.graph_util.import_graph_def(
                new_graph, input_map=input_map, return_elements=output_names, name="disc"
            )

        self._wrapped = tf.compat.v1.wrap_function(run_graph, self._signature)
        self._structured_outputs = concrete.structured_outputs
        self._input_structure = sig

    @property
    def graph_function(self):
        """The rewritten graph as a TF function of the flat arguments (its nodes imported
        under the name scope ``disc/``): for fetching what a cluster reads or writes."""
        return self._wrapped

    def __call__(self, *args: Any) -> Any:
        flat = tf.nest.flatten(args)
        outs = self._wrapped(*flat)
        return tf.nest.pack_sequence_as(self._structured_outputs, outs)


def jit(fn: Callable | None = None, *, input_signature=None, min_cluster_size: int = 2,
        strict: bool | None = None, target: str = "auto"):
    """Compiles ``fn`` (a tf.function with an input signature, or a Python
    function plus ``input_signature``) into a JitFunction. Usable as a decorator.
    ``strict`` (default ``$DISC_TF_STRICT``): a cluster that fails to compile
    raises StrictModeError instead of staying as TF ops. ``target``: see
    ``disc_tf.runtime.target`` ("auto": ``$DISC_TF_TARGET``, else the GPU if TF
    has one and this op library runs on it, else the CPU).
    """
    options = Options(target=resolve_target(target), min_cluster_size=min_cluster_size,
                      strict=strict,
                      isa_levels=isa.resolve(None, "host"))
    if fn is None:
        return lambda f: JitFunction(f, input_signature, options)
    return JitFunction(fn, input_signature, options)
