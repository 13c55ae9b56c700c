"""``disc_tf.load``: an optimized SavedModel whose calls run their DiscCluster ops directly.

Calling a function restored by ``tf.saved_model.load`` costs about 170 us on
a 2-core machine before any kernel runs (Python argument binding, then TF's
function runtime), more than a small model's kernels take. ``load`` restores
the model the same way, then plans each of its functions (``direct_plan``):
where the body is DiscCluster ops fed by the arguments and by variables, a call
is one eager op execution per cluster (a DiscCall of the cluster's attributes,
recorded once: ``cluster_call``), with the variables' handles as inputs
(the op reads each variable when it runs, as ReadVariableOp would have); a
stateless TF op left outside the clusters is one more eager op. The signatures,
``__call__`` and every other ``tf.function`` of the restored root object are
planned.

A call goes the direct way only when it can give the same answer: eager
execution, no gradient tape recording, no GPU in the process, and every
argument a tensor or array of the signature's dtype and a compatible shape, or
(a positional argument) a dict, list or tuple of them of exactly the traced
structure (same container types, keys and lengths; a Keras ``model.export``'s
``serve(inputs)`` takes a dict). Any other call, and any function the planner
refuses, runs the restored function as ``tf.saved_model.load`` would. The
outputs have the structure TF's call gives them (the function's output type).
"""

from __future__ import annotations

import hashlib
import logging
import os
import pathlib
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context, execute, record
from tensorflow.python.util import nest

from disc_tf import background, cluster_call, strict, trust
from disc_tf.direct_plan import DirectPlan, NotDirect, Source, plan_function

logger = logging.getLogger("disc_tf.direct")

_EagerTensor = type(tf.constant(0.0))


def _lookup_function(name: str):
    ctx = context.context()
    if not ctx.has_function(name):
        return None
    return ctx.get_function_def(name)


_TRUE = ("1", "true", "yes", "on")


def _publish_artifacts(plan: DirectPlan) -> tuple[str, ...]:
    """Publishes each step's artifact under a key; returns the key per step.

    A step whose node has no artifact keeps its node's pending key (empty:
    always the fallback; set: a background compile the op waits for), as does every
    step under DISC_TF_FORCE_FALLBACK (nothing is loaded). Raises NotDirect when an
    artifact has no trusted signature: the op's own kernel then decides what runs
    (``disc_tf/trust.py``).
    """
    keys = []
    for step in plan.steps:
        if not step.is_cluster:
            keys.append("")
            continue
        if not step.artifact:
            keys.append(step.pending_key)
            continue
        if os.environ.get("DISC_TF_FORCE_FALLBACK", "").strip().lower() in _TRUE:
            keys.append("")  # loads nothing: the op runs the cluster's TF ops
            continue
        trusted, why = trust.check(step.artifact_sha256, step.signatures)
        if not trusted:
            raise NotDirect(f"cluster {step.cluster_name}'s artifact is not loaded: {why}")
        # The key names the bytes, so a key never stands for two artifacts.
        key = f"direct/{hashlib.sha256(step.artifact).hexdigest()}/{step.artifact_sha256}"
        if background.pending_state(key) == "unknown" and not background.publish_bytes(
                key, step.artifact, step.artifact_sha256, step.num_kernels):
            logger.warning("disc_tf.load: cluster %s's artifact does not load; it runs its "
                           "fallback", step.cluster_name)
        keys.append(key)
    return tuple(keys)


#: Sizes of an unknown dim in a warm-up call's arguments, tried in turn (1 when
#: dims must broadcast against each other; 8 for a conv's taps to have rows).
WARMUP_DIMS = (8, 1)


#: Appends a structured argument's leaves to a list in ``tf.nest`` order; False
#: (the list then partly filled) when the value's structure is not the traced one.
Flatten = Callable[[Any, list[Any]], bool]
#: Builds a call's result from the flat outputs.
Pack = Callable[[list[Any]], Any]


def _tensor_leaves(spec: Any) -> int | None:
    """How many TensorSpecs ``spec`` holds if it is one, or dicts, lists and tuples
    (exactly those types) of them; None if it holds anything else."""
    if isinstance(spec, tf.TensorSpec):
        return 1
    kind = type(spec)
    if kind is dict:
        parts = list(spec.values())
    elif kind is list or kind is tuple:
        parts = spec
    else:
        return None
    total = 0
    for part in parts:
        n = _tensor_leaves(part)
        if n is None:
            return None
        total += n
    return total


def _flattener(spec: Any) -> Flatten | None:
    """A ``Flatten`` for a structure ``_tensor_leaves`` counts, checking container
    types, dict keys and lengths exactly; None for a TensorSpec (the value is the
    leaf). Dict values go in sorted-key order, as ``tf.nest`` and TF's binding
    take them."""
    if isinstance(spec, tf.TensorSpec):
        return None
    kind = type(spec)
    if kind is dict:
        keys = tuple(sorted(spec))
        parts = tuple(_flattener(spec[k]) for k in keys)
        size = len(keys)
        if not any(parts):

            def flat_dict(value: Any, out: list[Any]) -> bool:
                if type(value) is not dict or len(value) != size:
                    return False
                try:  # same length and every key: the same keys
                    out.extend([value[k] for k in keys])
                except KeyError:
                    return False
                return True

            return flat_dict

        def nested_dict(value: Any, out: list[Any]) -> bool:
            if type(value) is not dict or len(value) != size:
                return False
            try:  # same length and every key: the same keys
                items = [value[k] for k in keys]
            except KeyError:
                return False
            return _collect(items, parts, out)

        return nested_dict
    parts = tuple(_flattener(s) for s in spec)
    size = len(parts)
    if not any(parts):

        def flat_sequence(value: Any, out: list[Any]) -> bool:
            if type(value) is not kind or len(value) != size:
                return False
            out.extend(value)
            return True

        return flat_sequence

    def nested_sequence(value: Any, out: list[Any]) -> bool:
        if type(value) is not kind or len(value) != size:
            return False
        return _collect(value, parts, out)

    return nested_sequence


def _collect(items: Any, parts: tuple[Flatten | None, ...], out: list[Any]) -> bool:
    """Appends each item (a tensor where its part is None, else flattened by its
    part) to ``out``; False when a part's structure does not match."""
    for item, part in zip(items, parts):
        if part is None:
            out.append(item)
        elif not part(item, out):
            return False
    return True


def _output_packer(concrete: Any, count: int) -> Pack:
    """What builds a call's result from its ``count`` flat outputs as TF's restored
    call does: ``structured_outputs`` packed by ``tf.nest`` (its dicts keep that
    structure's key order, which is the order TF's call gives; the output type's
    ``pack_output`` may order keys otherwise), checked once on stand-ins; else the
    output type's ``pack_output``; a lone tensor is returned as it is."""
    structure = concrete.structured_outputs
    if count == 1 and isinstance(structure, (tf.TensorSpec, tf.Tensor)) and \
            structure.dtype not in (tf.resource, tf.variant):  # no handle data to set
        return _first

    def pack(outs: list[Any]) -> Any:
        return nest.pack_sequence_as(structure, outs)

    function_type = getattr(concrete, "function_type", None)
    candidates = [pack]
    if getattr(function_type, "output", None) is not None:
        candidates.append(function_type.pack_output)
    for candidate in candidates:
        stand_ins = [_StandIn() for _ in range(count)]
        try:
            leaves = [x for x in nest.flatten(candidate(stand_ins)) if type(x) is _StandIn]
        except Exception:  # noqa: BLE001 - any failure: the next way
            continue
        if len(leaves) == count and all(a is b for a, b in zip(leaves, stand_ins)):
            return candidate
    return pack


def _as_call(step: tuple[str, int, tuple[Source, ...], tuple]
             ) -> tuple[str, int, tuple[Source, ...], tuple]:
    """A DiscCluster step as a DiscCall: its attributes recorded once (``cluster_call``)."""
    op, num_outputs, sources, attrs = step
    if op != "DiscCluster":
        return step
    op, attrs = cluster_call.as_call(attrs)
    return op, num_outputs, sources, attrs


def _ranges(positions: list[int]) -> list[int]:
    """Ascending ``positions`` as the [begin, end) pairs of their runs, flat."""
    out: list[int] = []
    for i in positions:
        if out and out[-1] == i:
            out[-1] = i + 1
        else:
            out += [i, i + 1]
    return out


class _Recipe:
    """How a step's inputs (or a call's outputs) are made from the call's arguments and
    the earlier steps' results: ``fixed`` holds what every call passes the same (None
    where a value comes from the call), ``args`` (position, argument) and ``steps``
    (position, step, output) fill in the rest."""

    __slots__ = ("fixed", "args", "steps")

    def __init__(self, fixed: list[Any], args: tuple[tuple[int, int], ...],
                 steps: tuple[tuple[int, int, int], ...]) -> None:
        self.fixed, self.args, self.steps = fixed, args, steps

    def values(self, flat: Any, results: list[list[Any]]) -> list[Any]:
        """The values for one call."""
        values = self.fixed.copy()
        for pos, index in self.args:
            values[pos] = flat[index]
        for pos, step, output in self.steps:
            values[pos] = results[step][output]
        return values


class _StandIn:
    """An output in ``_output_packer``'s dry run."""

    __slots__ = ()


def _first(outs: list[Any]) -> Any:
    return outs[0]


class _Spec:
    """One argument's dtype and shape, checked per call."""

    __slots__ = ("dtype", "dtype_enum", "np_dtype", "dims")

    def __init__(self, spec: tf.TensorSpec) -> None:
        self.dtype = spec.dtype
        self.dtype_enum = spec.dtype.as_datatype_enum
        self.np_dtype = np.dtype(spec.dtype.as_numpy_dtype) if spec.dtype.is_numpy_compatible \
            else None
        self.dims = None if spec.shape.rank is None else tuple(spec.shape.as_list())

    def warmup_value(self, size: int) -> Any:
        """Ones of this spec's dtype, unknown dims ``size`` (None for unknown rank, or a
        dtype without ones: strings)."""
        if self.dims is None or self.np_dtype is None or self.np_dtype.kind not in "biufc":
            return None
        shape = [size if d is None else d for d in self.dims]
        return tf.constant(np.ones(shape, self.np_dtype))

    def convert(self, value: Any) -> Any:
        """``value`` as an eager tensor of this spec, or None if the call must go TF's way."""
        if type(value) is _EagerTensor:
            # The enum, not ``value.dtype``: that makes a DType and compares it in Python,
            # 5 us of a 1-row recommender call of 60 (the eager op before it leaves
            # Python's caches cold).
            if value._datatype_enum() != self.dtype_enum:  # noqa: SLF001
                return None
            tensor = value
        elif isinstance(value, (np.ndarray, np.generic)) and value.dtype == self.np_dtype:
            tensor = tf.constant(value)
        else:
            return None
        if self.dims is not None:
            shape = tensor._shape_tuple()  # noqa: SLF001 - the cheap shape read
            if len(shape) != len(self.dims):
                return None
            for want, got in zip(self.dims, shape):
                if want is not None and want != got:
                    return None
        if "CPU" not in tensor.device:
            return None
        return tensor


class DirectFunction:
    """A restored concrete function, called through its plan when it has one.

    ``plan`` is the ``DirectPlan`` (None when the function runs TF's way, and
    ``reason`` says why: ``refuse`` when given, else what the planner refused);
    ``direct_calls`` and ``tf_calls`` count the calls that went each way.
    """

    def __init__(self, name: str, function: Any, concrete: Any, keyword: bool,
                 refuse: str | None = None) -> None:
        self.name = name
        #: the values of the parameters a positional call may omit (Python defaults)
        self._defaults = _python_defaults(function) if not keyword else ()
        self._function = function  # what a TF-way call calls
        self._keyword = keyword  # signatures take keyword arguments, __call__ positional ones
        self.plan: DirectPlan | None = None
        self.reason: str | None = None
        self.direct_calls = 0
        self.tf_calls = 0
        self._count_lock = threading.Lock()  # calls may come from many threads
        #: positional calls: how many arguments hold tensors, and their ``Flatten``s
        #: (None for a plain tensor; all None: every argument a plain tensor)
        self._num_args = 0
        self._flatteners: tuple[Flatten | None, ...] | None = None
        try:
            if refuse is not None:
                raise NotDirect(refuse)
            self._prepare(concrete)
        except NotDirect as e:
            self.plan, self.reason = None, str(e)
        if self.plan is None:
            log = logger.info if refuse is not None else logger.warning
            log("disc_tf.load: %s runs through TF's function runtime (slower calls): %s",
                name, self.reason)
        else:
            logger.info("disc_tf.load: %s is called directly (%d cluster(s), %d eager op(s))",
                        name, sum(s.is_cluster for s in self.plan.steps),
                        sum(not s.is_cluster for s in self.plan.steps))
            logger.debug("disc_tf.load: %s\n%s", name, self.plan.describe())

    def _prepare(self, concrete: Any) -> None:
        args, kwargs = concrete.structured_input_signature
        if self._keyword:
            if args:
                raise NotDirect("positional signature arguments")
            names = sorted(kwargs)
            specs = [kwargs[n] for n in names]
        else:
            if kwargs:
                raise NotDirect("keyword-only arguments")
            names = []
            # Leading arguments are tensors or dicts, lists and tuples of them.
            tensors = next((i for i, a in enumerate(args) if not _tensor_leaves(a)), len(args))
            structured, fixed = tuple(args[:tensors]), tuple(args[tensors:])
            # Trailing Python values (training=False) are the trace's: a call that omits
            # them runs it only if they are the defaults.
            if any(isinstance(x, tf.TensorSpec) for x in nest.flatten(fixed)):
                raise NotDirect("an argument is not a plain tensor or a dict, list or tuple "
                                "of tensors")
            if fixed and (len(fixed) > len(self._defaults)
                          or any((type(f), f) != (type(d), d)
                                 for f, d in zip(fixed, self._defaults[-len(fixed):]))):
                raise NotDirect("traced with Python arguments other than their defaults")
            specs = self._prepare_structure(structured)
        if not all(isinstance(s, tf.TensorSpec) for s in specs):
            raise NotDirect("an argument is not a plain tensor")
        captured = list(concrete.captured_inputs)
        flat_inputs = list(concrete.graph.inputs)
        if len(flat_inputs) != len(specs) + len(captured):
            raise NotDirect(f"{len(flat_inputs)} graph inputs for {len(specs)} arguments and "
                            f"{len(captured)} captures")
        # The graph's placeholders follow the flattened signature (sorted keyword names).
        for name, t in zip(names, flat_inputs):
            if t.op.name != name:
                raise NotDirect(f"argument {name} has placeholder {t.op.name}")
        for spec, t in zip(specs, flat_inputs):
            if t.dtype != spec.dtype or not t.shape.is_compatible_with(spec.shape):
                raise NotDirect(f"placeholder {t.op.name} ({t.dtype.name} {t.shape}) is not "
                                f"the signature's {spec}")
        is_resource = [t.dtype == tf.resource for t in flat_inputs]
        plan = plan_function(concrete.function_def, len(specs), is_resource, _lookup_function)
        if len(plan.outputs) != len(concrete.outputs):
            raise NotDirect(f"{len(plan.outputs)} planned outputs for {len(concrete.outputs)}")
        for step in plan.steps:
            fallback = dict(step.attrs).get("fallback")
            if fallback and _lookup_function(str(fallback)) is None:
                raise NotDirect(f"fallback function {fallback} is not registered")
        self._names = names
        self._specs = [_Spec(s) for s in specs]
        self._captured = captured
        self._pack = _output_packer(concrete, len(plan.outputs))
        keys = _publish_artifacts(plan)
        self._bundles: list[Any] = []  # one DiscVariableBundle handle per bundled step
        #: each step as its op's node has it (a cluster's variables bundled)
        self._full_steps = [
            self._bundled(step.op, step.num_outputs, step.inputs,
                          tuple(x for name, value in step.attrs for x in (name, value))
                          + (("artifact", b"", "pending_key", key.encode())
                             if step.is_cluster else ()))
            for step, key in zip(plan.steps, keys)]
        #: each step as a call executes it (a cluster's as a DiscCall)
        self._steps = [_as_call(step) for step in self._full_steps]
        self._constants = [tf.constant(c) for c in plan.constants]
        self.plan = plan
        #: each step's (op, outputs, attributes) and the recipe of its inputs, and the
        #: recipe of the call's outputs
        self._calls = tuple((op, num_outputs, attrs, self._recipe(inputs))
                            for op, num_outputs, inputs, attrs in self._steps)
        self._out_recipe = self._recipe(plan.outputs)
        #: a call of one plain tensor argument: its spec (the cheap check in __call__)
        self._lone_spec = self._specs[0] if (
            not self._keyword and self._flatteners is None and len(self._specs) == 1) \
            else None

    def _recipe(self, sources: tuple[Source, ...]) -> _Recipe:
        """``sources`` as a ``_Recipe``: what does not change between calls (constants,
        captures, variable handles and bundles) in place, the rest by position."""
        fixed: list[Any] = []
        args: list[tuple[int, int]] = []
        steps: list[tuple[int, int, int]] = []
        for pos, source in enumerate(sources):
            if source.kind == "arg":
                fixed.append(None)
                args.append((pos, source.index))
            elif source.kind == "step":
                fixed.append(None)
                steps.append((pos, source.index, source.output))
            else:
                fixed.append(self._value(source, [], []))
        return _Recipe(fixed, tuple(args), tuple(steps))

    def _bundled(self, op: str, num_outputs: int, sources: tuple[Source, ...],
                 attrs: tuple) -> tuple[str, int, tuple[Source, ...], tuple]:
        """The step with its variable handles fed as one DiscVariableBundle.

        TF's eager runtime costs about 1.7 us per resource input on every call (0.45 ms
        for MobileNetV2's 260 variables); a bundle is one input, made here once. The op
        still reads each variable when it runs (``cc/kernels/variable_bundle.h``). The
        bundled positions and the constant inputs go as runs of positions. A step with
        fewer than two variables, or whose bundle cannot be made, is unchanged.
        """
        positions = [i for i, s in enumerate(sources) if s.kind == "variable"]
        if op != "DiscCluster" or len(positions) < 2:
            return op, num_outputs, sources, attrs
        handles = [self._captured[sources[i].index] for i in positions]
        try:
            bundle = execute.quick_execute("DiscVariableBundle", 1, handles,
                                           ("N", len(handles)), context.context())[0]
        except (tf.errors.OpError, TypeError, ValueError) as e:
            logger.info("disc_tf.load: %s feeds its %d variables one by one: %s",
                        self.name, len(handles), e)
            return op, num_outputs, sources, attrs
        bundled = set(positions)
        named = dict(zip(attrs[::2], attrs[1::2]))
        tin = [t for i, t in enumerate(named["Tin"]) if i not in bundled]
        named["Tin"] = tin + [tf.resource.as_datatype_enum]
        # As runs: TF's eager runtime converts and copies every attr on each call
        # (MobileNetV2's two lists of 260 positions cost about 2% of a small call).
        named.pop("bundled_inputs", None)
        named["bundled_input_ranges"] = _ranges(positions)
        constants = list(named.get("constant_inputs", ()))
        if constants and all(a < b for a, b in zip(constants, constants[1:])):
            named.pop("constant_inputs")
            named["constant_input_ranges"] = _ranges(constants)
        kept = tuple(s for i, s in enumerate(sources) if i not in bundled)
        self._bundles.append(bundle)
        return (op, num_outputs, kept + (Source("bundle", len(self._bundles) - 1),),
                tuple(x for item in named.items() for x in item))

    def _prepare_structure(self, structured: tuple) -> list[tf.TensorSpec]:
        """The flat specs of the positional tensor arguments ``structured``, and
        ``_flatteners`` for the call (None when every one is a plain tensor)."""
        self._num_args = len(structured)
        if all(isinstance(a, tf.TensorSpec) for a in structured):
            return list(structured)
        try:
            flatteners = tuple(_flattener(a) for a in structured)
        except TypeError as e:  # dict keys that do not sort
            raise NotDirect(f"an argument's structure does not flatten: {e}") from e
        specs: list[Any] = []
        for flatten, arg in zip(flatteners, structured):
            if flatten is None:
                specs.append(arg)
            elif not flatten(arg, specs):
                raise NotDirect("an argument's structure does not flatten")
        # The order TF binds the graph's inputs in is tf.nest's.
        if len(specs) != len(nest.flatten(structured)) or any(
                a is not b for a, b in zip(specs, nest.flatten(structured))):
            raise NotDirect("an argument flattens in an order other than tf.nest's")
        self._flatteners = flatteners
        return specs

    def _args(self, args: tuple, kwargs: dict) -> list[Any] | None:
        if self._keyword:
            if args or len(kwargs) != len(self._names):
                return None
            try:
                values = [kwargs[n] for n in self._names]
            except KeyError:
                return None
        else:
            if kwargs or len(args) != self._num_args:
                return None
            flatteners = self._flatteners
            if flatteners is None:
                values = args
            else:
                values = []
                for flatten, value in zip(flatteners, args):
                    if flatten is None:
                        values.append(value)
                    elif not flatten(value, values):
                        return None
        out = []
        for spec, value in zip(self._specs, values):
            t = spec.convert(value)
            if t is None:
                return None
            out.append(t)
        return out

    def warmup_arguments(self, size: int) -> dict[str, Any] | None:
        """A signature's warm-up arguments by name: ones, unknown dims ``size``; None for
        a positional function, one without a plan, or an argument of unknown rank or of
        strings."""
        if self.plan is None or not self._keyword:
            return None
        values = self._warmup_values(size)
        return None if values is None else dict(zip(self._names, values))

    def _warmup_values(self, size: int) -> list[Any] | None:
        """The arguments, ones with unknown dims ``size``; None if one has no ones."""
        values = [spec.warmup_value(size) for spec in self._specs]
        return None if any(v is None for v in values) else values

    def warm_up(self) -> bool:
        """One direct call on ones (unknown dims each of WARMUP_DIMS in turn, until a
        call succeeds), so that what the ops do on their first call (loading
        artifacts, packing GEMM weights) is done before the first real one. The plan
        holds DiscCluster ops, stateless ops and loops that only read variables, so the
        call changes no state.
        False, and nothing else, when there is no plan or no call succeeds; in strict mode
        a cluster refusing to fall back raises (every real call would too)."""
        if self.plan is None:
            return False
        for size in WARMUP_DIMS:
            values = self._warmup_values(size)
            if values is None:
                return False
            try:
                self._run(values)
                return True
            except (tf.errors.OpError, ValueError, TypeError) as e:
                if strict.is_runtime_refusal(e):
                    raise
                logger.debug("disc_tf.load: warm-up call of %s at unknown dims %d failed: %s",
                             self.name, size, e)
        return False

    def _run(self, flat: Any) -> Any:
        ctx = context.context()
        results: list[list[Any]] = []
        for op, num_outputs, attrs, recipe in self._calls:
            results.append(execute.quick_execute(op, num_outputs, recipe.values(flat, results),
                                                 attrs, ctx))
        return self._pack(self._out_recipe.values(flat, results))

    def _value(self, source: Source, args: list[Any], results: list[list[Any]]) -> Any:
        if source.kind == "arg":
            return args[source.index]
        if source.kind == "step":
            return results[source.index][source.output]
        if source.kind == "const":
            return self._constants[source.index]
        if source.kind == "bundle":
            return self._bundles[source.index]
        return self._captured[source.index]  # a capture, or a variable's handle

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calls the function, directly when the plan and the arguments allow it."""
        flat = None
        if self.plan is not None and context.executing_eagerly() and \
                not record.could_possibly_record():
            lone = self._lone_spec
            if lone is not None and len(args) == 1 and not kwargs:
                tensor = lone.convert(args[0])
                flat = None if tensor is None else (tensor,)
            else:
                flat = self._args(args, kwargs)
        if flat is None:
            with self._count_lock:
                self.tf_calls += 1
            return self._function(*args, **kwargs)
        out = self._run(flat)
        with self._count_lock:
            self.direct_calls += 1
        return out

    def __getattr__(self, name: str) -> Any:
        # Everything else is the restored function's (``concrete_functions``,
        # ``get_concrete_function``, a signature's ``structured_outputs``...).
        function = self.__dict__.get("_function")
        if function is None:
            raise AttributeError(name)
        return getattr(function, name)


class DiscModel:
    """A loaded optimized SavedModel: ``model(x)`` and ``model.signatures[name](**kw)``
    as on the object ``tf.saved_model.load`` returns, direct where possible.

    Every other attribute is the restored object's (``model.module``).
    ``warmed_up`` says, per function, whether its warm-up call ran (see ``load``).
    With ``refuse``, no function is planned (every call goes through TF) and
    ``refuse`` is each one's reason.
    """

    def __init__(self, module: Any, warmup: bool = True, refuse: str | None = None,
                 function_names: tuple[str, ...] = ()) -> None:
        self.module = module
        self.signatures: Mapping[str, DirectFunction] = {
            name: DirectFunction(f"signature {name}", fn, fn, keyword=True, refuse=refuse)
            for name, fn in module.signatures.items()}
        self._call: DirectFunction | None = None
        call = module.__call__ if callable(module) else None
        concretes = _serving_traces(call)
        if call is not None and len(concretes) == 1:
            self._call = DirectFunction("__call__", call, concretes[0], keyword=False,
                                        refuse=refuse)
        #: the root's other tf.functions (``serve``...), by attribute name
        self._methods: dict[str, DirectFunction] = {}
        for name in function_names:
            fn = getattr(module, name, None)
            concretes = _serving_traces(fn)
            if name == "__call__" or fn is None or not concretes:
                continue
            why = refuse if refuse is not None or len(concretes) == 1 else (
                f"{len(concretes)} traced signatures")
            self._methods[name] = DirectFunction(name, fn, concretes[0], keyword=False,
                                                 refuse=why)
        self.warmed_up: dict[str, bool] = {}
        if warmup and refuse is None:
            for name, fn in self._functions().items():
                self.warmed_up[name] = fn.warm_up()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._call is not None:
            return self._call(*args, **kwargs)
        return self.module(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        methods = self.__dict__.get("_methods", {})
        if name in methods:
            return methods[name]
        return getattr(self.__dict__["module"], name)

    def _functions(self) -> dict[str, DirectFunction]:
        fns = dict(self.signatures)
        if self._call is not None:
            fns["__call__"] = self._call
        fns.update(self._methods)
        return fns

    def direct_functions(self) -> dict[str, str | None]:
        """Each planned function's name and None if it runs directly, else why not."""
        return {name: fn.reason for name, fn in self._functions().items()}


def load(export_dir: str, tags: Any = None, options: Any = None, *,
         warmup: bool = True, artifacts: str | None = None,
         trusted_keys: Any = None) -> DiscModel:
    """Loads a SavedModel (as ``tf.saved_model.load``) whose DiscCluster ops are called
    directly, without TF's function runtime, where the model allows it.

    With ``warmup``, each directly-called function runs once on ones (unknown dims
    8, or 1 if 8 fails) before ``load`` returns, so that the first request does not pay
    for packing the GEMM weights; a warm-up that fails is skipped.

    ``artifacts`` ('trusted', 'rebuild' or 'fallback') and ``trusted_keys`` (PEM files
    of Ed25519 public keys) set this process's artifact policy, as
    ``$DISC_TF_ARTIFACTS`` and ``$DISC_TF_TRUSTED_KEYS`` do (``disc_tf/trust.py``): an
    embedded artifact no trusted signature vouches for is never loaded.
    """
    from disc_tf.runtime import native

    native.load()
    if artifacts is not None or trusted_keys is not None:
        trust.configure(artifacts, trusted_keys)
    module = tf.saved_model.load(export_dir, tags=tags, options=options)
    # Direct calls place the op by its inputs; with a GPU, TF's placement must decide.
    refuse = "a GPU is visible" if tf.config.list_logical_devices("GPU") else None
    return DiscModel(module, warmup=warmup, refuse=refuse,
                     function_names=_root_function_names(export_dir))


def _root_function_names(export_dir: str) -> tuple[str, ...]:
    """Names of the root object's tf.functions in the SavedModel (``serve``...)."""
    from tensorflow.core.protobuf import saved_model_pb2

    from disc_tf.scope import root_functions

    path = pathlib.Path(export_dir) / "saved_model.pb"
    sm = saved_model_pb2.SavedModel.FromString(path.read_bytes())
    return tuple(sorted({name for mg in sm.meta_graphs for name in root_functions(mg)
                         if name != "signatures"}))


def _fullargspec(function: Any) -> Any:
    """A restored tf.function's ``inspect.FullArgSpec``, or None."""
    return getattr(getattr(function, "function_spec", None), "fullargspec", None)


def _python_defaults(function: Any) -> tuple:
    """The default values of ``function``'s trailing parameters (empty if unknown)."""
    return tuple(getattr(_fullargspec(function), "defaults", None) or ())


def _serving_traces(function: Any) -> list[Any]:
    """``function``'s restored concrete functions less those traced with
    ``training=True`` (a Keras model's training-mode calls), which a call that omits
    ``training`` never runs; all of them when ``training`` defaults to True."""
    concretes = list(getattr(function, "concrete_functions", ()) or ())
    spec = _fullargspec(function)
    if spec is None or "training" not in spec.args:
        return concretes
    at = spec.args.index("training")
    defaults = _python_defaults(function)
    first_default = len(spec.args) - len(defaults)
    if at >= first_default and defaults[at - first_default] is True:
        return concretes

    def trains(concrete: Any) -> bool:
        args, kwargs = concrete.structured_input_signature
        return kwargs.get("training", args[at] if at < len(args) else None) is True

    return [c for c in concretes if not trains(c)]
