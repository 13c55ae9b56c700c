"""Lowering rules of data-movement ops: slices, concatenation, padding, gathers.

Bounds, sizes and paddings are host shape operands (``index`` scalars the host
runner computes from constants and dims), so these ops work at any input shape.
TF's clamping and negative-index rules are host arithmetic; what TF rejects
at run time (a Slice past the end, a gather index out of range) is checked by
the host runner or the kernel and reported as TF's InvalidArgument.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import node_def_pb2

from disc_tf.dhlo_bridge.builder import DhloBuilder, TValue
from disc_tf.dhlo_bridge.rules import LoweringError, host_shape
from disc_tf.dhlo_bridge.types import MLIR_TYPE
from disc_tf.ops.elementwise import arg_reduce_init, lowest_finite
from disc_tf.ops.table import ALL_TYPES, FLOAT_TYPES, INT_TYPES, MOVE_TYPES, NUMERIC_TYPES, tf_op


def _strided_slice_check(node) -> str | None:
    attr = node.attr
    if attr["ellipsis_mask"].i & attr["new_axis_mask"].i:
        return "StridedSlice with ellipsis and new_axis on one index"
    return None


def _one_hot_check(node) -> str | None:
    if node.attr["TI"].type in (tf.int32.as_datatype_enum, tf.int64.as_datatype_enum):
        return None
    return "OneHot indices must be integers"


def _nhwc_check(node) -> str | None:
    fmt = node.attr["data_format"].s.decode() if "data_format" in node.attr else "NHWC"
    if fmt != "NHWC":
        return f"data_format {fmt} (only NHWC)"
    if node.attr["padding"].s.decode() not in ("SAME", "VALID", "EXPLICIT"):
        return "unsupported padding"
    return None


def _static_window(node) -> str | None:
    """The filter window (and a depthwise conv's channel count) must be static."""
    dims = node.inputs[1].dims if len(node.inputs) > 1 else None
    if dims is None or len(dims) != 4 or None in dims[:2]:
        return "filter window must be static"
    x = node.inputs[0].dims
    if node.op == "DepthwiseConv2dNative" and (x is None or len(x) != 4 or x[3] is None):
        return "depthwise input channels must be static"
    return None


def _static_index_depth(node) -> str | None:
    depth = node.inputs[1].dims
    return None if depth and depth[-1] is not None else "index depth must be static"


def _axis(b: DhloBuilder, node: node_def_pb2.NodeDef, value: TValue | int, rank: int) -> int:
    axis = value if isinstance(value, int) else (b.known_ints(value) or [None])[0]
    if axis is None or not -rank <= axis < rank:
        raise LoweringError(f"{node.op} {node.name}: axis {axis} invalid for rank {rank}")
    return axis % rank


def slice_value(b: DhloBuilder, x: TValue, start: list[str], limit: list[str],
                stride: list[int], dims: tuple | None = None) -> TValue:
    """``stablehlo.real_dynamic_slice`` of ``x`` (host starts/limits, constant strides)."""
    strides = [b.index_const(s) for s in stride]
    operands = [x] + [(b.shape_from(v), x.rank) for v in (start, limit, strides)]
    return b.op_with_shapes("real_dynamic_slice", operands, x.elem, dims or (None,) * x.rank)


def _reshape_to(b: DhloBuilder, x: TValue, extents: list[str], dims: tuple) -> TValue:
    return b.dynamic_reshape(x, extents, dims)


@tf_op("Slice", dtypes=MOVE_TYPES, shape_inputs=(1, 2))
def _slice(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    x, begin_v, size_v = xs
    begin = host_shape(b, node, begin_v, "begin")
    size = host_shape(b, node, size_v, "size")
    if len(begin) != x.rank or len(size) != x.rank:
        raise LoweringError(f"Slice {node.name}: begin/size length must be the rank {x.rank}")
    limit, dims = [], []
    for d in range(x.rank):
        if b.index_values.get(size[d]) == -1:
            size[d] = b.index_arith("subi", b.dim(x, d), begin[d])  # -1: to the end
        limit.append(b.index_arith("addi", begin[d], size[d]))
        dims.append(b.index_values.get(size[d]))
    return [slice_value(b, x, begin, limit, [1] * x.rank, tuple(dims))]


def _normalize(b: DhloBuilder, value: str, dim: str, positive: bool) -> str:
    """A StridedSlice bound: negative counts from the end, then clamped to the dim
    ([0, dim] for a positive stride, [-1, dim - 1] for a negative one)."""
    zero = b.index_const(0)
    wrapped = b.index_select("slt", value, zero, b.index_arith("addi", value, dim), value)
    if positive:
        return b.index_arith("maxsi", zero, b.index_arith("minsi", wrapped, dim))
    return b.index_arith("maxsi", b.index_const(-1),
                         b.index_arith("minsi", wrapped, b.index_arith("subi", dim, b.index_const(1))))


@tf_op("StridedSlice", dtypes=MOVE_TYPES, shape_inputs=(1, 2), const_inputs=(3,),
       check=_strided_slice_check)
def _strided_slice(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    x, begin_v, end_v, strides_v = xs
    begin = host_shape(b, node, begin_v, "begin")
    end = host_shape(b, node, end_v, "end")
    strides = b.known_ints(strides_v)
    if strides is None or len(strides) != len(begin) or len(end) != len(begin):
        raise LoweringError(f"StridedSlice {node.name}: strides must be constants")
    masks = {k: node.attr[f"{k}_mask"].i for k in ("begin", "end", "ellipsis", "new_axis",
                                                    "shrink_axis")}
    # The sparse spec -> one entry per input dim (ellipsis expanded), plus new axes.
    n_spec = len(begin)
    real = [i for i in range(n_spec) if not masks["new_axis"] >> i & 1
            and not masks["ellipsis"] >> i & 1]
    ellipsis = [i for i in range(n_spec) if masks["ellipsis"] >> i & 1]
    if len(ellipsis) > 1:
        raise LoweringError(f"StridedSlice {node.name}: more than one ellipsis")
    fill = x.rank - len(real)
    if fill < 0:
        raise LoweringError(f"StridedSlice {node.name}: index of rank {len(real)} > rank {x.rank}")
    if not ellipsis:
        entries = list(range(n_spec)) + [None] * fill
    else:
        e = ellipsis[0]
        entries = list(range(e)) + [None] * fill + list(range(e + 1, n_spec))
    start, limit, steps, reversed_dims = [], [], [], []
    d = 0
    for i in entries:
        if i is not None and masks["new_axis"] >> i & 1:
            continue
        dim = b.dim(x, d)
        if i is None:
            start.append(b.index_const(0))
            limit.append(dim)
            steps.append(1)
            d += 1
            continue
        s = strides[i]
        if s == 0:
            raise LoweringError(f"StridedSlice {node.name}: stride 0")
        if masks["shrink_axis"] >> i & 1:
            zero = b.index_const(0)
            lo = b.index_select("slt", begin[i], zero, b.index_arith("addi", begin[i], dim), begin[i])
            start.append(lo)
            limit.append(b.index_arith("addi", lo, b.index_const(1)))
            steps.append(1)
            d += 1
            continue  # the dim disappears; the slice bounds are checked by the host
        if s < 0:
            # Slice the reversed dim (position r = dim - 1 - i) with stride -s.
            last = b.index_arith("subi", dim, b.index_const(1))
            first = last if masks["begin"] >> i & 1 else _normalize(b, begin[i], dim, False)
            stop = b.index_const(-1) if masks["end"] >> i & 1 else _normalize(b, end[i], dim, False)
            lo = b.index_arith("subi", last, first)
            start.append(lo)
            limit.append(b.index_arith("maxsi", b.index_arith("subi", last, stop), lo))
            steps.append(-s)
            reversed_dims.append(d)
            d += 1
            continue
        lo = b.index_const(0) if masks["begin"] >> i & 1 else _normalize(b, begin[i], dim, True)
        hi = dim if masks["end"] >> i & 1 else _normalize(b, end[i], dim, True)
        hi = b.index_arith("maxsi", hi, lo)
        start.append(lo)
        limit.append(hi)  # the slice has ceil((hi - lo) / s) elements
        steps.append(s)
        d += 1
    if reversed_dims:
        x = b.op("reverse", [x], x.elem, x.dims,
                 f"dimensions = array<i64: {', '.join(map(str, reversed_dims))}>")
    sliced = slice_value(b, x, start, limit, steps)
    # Result extents: the sliced dims in order, with new axes inserted and shrunk dims gone.
    extents = []
    k = 0
    shrunk_before = 0
    for i in entries:
        if i is not None and masks["new_axis"] >> i & 1:
            extents.append(b.index_const(1))
            continue
        if i is not None and masks["shrink_axis"] >> i & 1:
            k += 1
            shrunk_before += 1
            continue
        extents.append(b.dim(sliced, k))
        k += 1
    if not shrunk_before and not masks["new_axis"]:
        return [sliced]
    dims = tuple(1 if b.index_values.get(e) == 1 else None for e in extents)
    return [_reshape_to(b, sliced, extents, dims)]


@tf_op("ConcatV2", dtypes=MOVE_TYPES, const_inputs=(-1,))
def _concat(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    *parts, axis_v = xs
    axis = _axis(b, node, axis_v, parts[0].rank)
    if len(parts) == 1:
        return [b.op("convert", parts, parts[0].elem, parts[0].dims)]
    dims = tuple(None if d == axis else parts[0].dims[d] for d in range(parts[0].rank))
    return [b.op("concatenate", parts, parts[0].elem, dims, f"dimension = {axis} : i64")]


@tf_op("Pack", dtypes=MOVE_TYPES)
def _pack(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    rank = xs[0].rank + 1
    axis = _axis(b, node, node.attr["axis"].i, rank)
    expanded = []
    for x in xs:
        extents = [b.dim(x, d) for d in range(x.rank)]
        extents.insert(axis, b.index_const(1))
        dims = list(x.dims)
        dims.insert(axis, 1)
        expanded.append(b.dynamic_reshape(x, extents, tuple(dims)))
    if len(expanded) == 1:
        return [b.op("convert", expanded, expanded[0].elem, expanded[0].dims)]
    dims = list(xs[0].dims)
    dims.insert(axis, len(xs))
    return [b.op("concatenate", expanded, xs[0].elem, tuple(dims), f"dimension = {axis} : i64")]


def _split_along(b: DhloBuilder, x: TValue, axis: int, sizes: list[str]) -> list[TValue]:
    """Consecutive slices of ``x`` along ``axis`` with the given host sizes."""
    outs = []
    offset = b.index_const(0)
    for size in sizes:
        start = [offset if d == axis else b.index_const(0) for d in range(x.rank)]
        end = b.index_arith("addi", offset, size)
        limit = [end if d == axis else b.dim(x, d) for d in range(x.rank)]
        dims = tuple(b.index_values.get(size) if d == axis else x.dims[d] for d in range(x.rank))
        outs.append(slice_value(b, x, start, limit, [1] * x.rank, dims))
        offset = end
    return outs


@tf_op("Unpack", dtypes=MOVE_TYPES)
def _unpack(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    x = xs[0]
    axis = _axis(b, node, node.attr["axis"].i, x.rank)
    num = node.attr["num"].i
    b.require_equal_extents([b.shape_from([b.dim(x, axis)]), b.shape_from([b.index_const(num)])], 1)
    outs = []
    for part in _split_along(b, x, axis, [b.index_const(1)] * num):
        extents = [b.dim(part, d) for d in range(x.rank) if d != axis]
        outs.append(b.dynamic_reshape(part, extents, tuple(x.dims[d] for d in range(x.rank)
                                                           if d != axis)))
    return outs


@tf_op("Split", dtypes=MOVE_TYPES, const_inputs=(0,))
def _split(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    axis_v, x = xs
    axis = _axis(b, node, axis_v, x.rank)
    num = node.attr["num_split"].i
    dim = b.dim(x, axis)
    size = b.index_arith("floordivsi", dim, b.index_const(num))
    # TF requires the dim to divide evenly: the host checks num * size == dim.
    b.require_equal_extents([b.shape_from([b.index_arith("muli", size, b.index_const(num))]),
                             b.shape_from([dim])], 1)
    return _split_along(b, x, axis, [size] * num)


@tf_op("SplitV", dtypes=MOVE_TYPES, const_inputs=(1, 2))
def _split_v(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    x, sizes_v, axis_v = xs
    axis = _axis(b, node, axis_v, x.rank)
    sizes = b.known_ints(sizes_v)
    if sizes is None or sizes.count(-1) > 1 or any(s < -1 for s in sizes):
        raise LoweringError(f"SplitV {node.name}: size_splits must be constants")
    dim = b.dim(x, axis)
    known = sum(s for s in sizes if s != -1)
    extents = [b.index_const(s) for s in sizes]
    if -1 in sizes:
        extents[sizes.index(-1)] = b.index_arith("subi", dim, b.index_const(known))
        total = dim
    else:
        total = b.index_const(known)
    b.require_equal_extents([b.shape_from([total]), b.shape_from([dim])], 1)
    return _split_along(b, x, axis, extents)


def _paddings(b: DhloBuilder, node: node_def_pb2.NodeDef, value: TValue, rank: int):
    elems = b.host_elements(value)
    if elems is None or len(elems) != 2 * rank:
        raise LoweringError(f"{node.op} {node.name}: paddings must be a [{rank}, 2] constant "
                            "or computed from dims")
    if any(b.index_values.get(e, 0) < 0 for e in elems):
        raise LoweringError(f"{node.op} {node.name}: negative paddings")
    return elems[0::2], elems[1::2]


@tf_op("Pad", "PadV2", dtypes=MOVE_TYPES, shape_inputs=(1,))
def _pad(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    x, paddings = xs[0], xs[1]
    low, high = _paddings(b, node, paddings, x.rank)
    if node.op == "PadV2":
        value = xs[2]
    else:
        from disc_tf.dhlo_bridge.rules import _scalar

        value = _scalar(b, 0, x.elem)
    zeros = [b.index_const(0) for _ in range(x.rank)]
    operands = [x, value] + [(b.shape_from(v), x.rank) for v in (low, high, zeros)]
    dims = []
    for d in range(x.rank):
        lo, hi = b.index_values.get(low[d]), b.index_values.get(high[d])
        dims.append(None if None in (x.dims[d], lo, hi) else x.dims[d] + lo + hi)
    padded = b.op_with_shapes("dynamic_pad", operands, x.elem, tuple(dims))
    fill = np.asarray(0.0 if node.op == "Pad" else b.const_values.get(value.ssa, np.nan))
    if x.rank == 4 and fill.size == 1 and float(fill) == 0.0 and all(
            b.index_values.get(v) == 0 for v in (low[0], high[0], low[3], high[3])):
        b.zero_padded[padded.ssa] = (x, low[1:3], high[1:3])  # a ZeroPadding2D
    return [padded]


@tf_op("Fill", dtypes=ALL_TYPES, shape_inputs=(0,))
def _fill(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    dims_v, value = xs
    extents = host_shape(b, node, dims_v, "dims")
    filled = b.broadcast_to(value, b.shape_from(extents), len(extents), [])
    return [b.op("convert", [filled], filled.elem, filled.dims)]


@tf_op("BroadcastTo", dtypes=MOVE_TYPES, shape_inputs=(1,))
def _broadcast_to(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    """numpy broadcasting of ``x`` to a host shape (every dim of ``x`` is 1 or the
    target's: the host checks it)."""
    x, shape_v = xs
    extents = host_shape(b, node, shape_v, "shape")
    if len(extents) < x.rank:
        raise LoweringError(f"BroadcastTo {node.name}: target rank {len(extents)} is below the "
                            f"input's {x.rank}")
    rank = len(extents)
    # An index map on its readers (a result gets its own copy), never a kernel.
    return [b.broadcast_to(x, b.shape_from(extents), rank, list(range(rank - x.rank, rank)))]


def iota(b: DhloBuilder, extents: list[str], dim: int, elem: str) -> TValue:
    """``stablehlo.dynamic_iota``: the index along ``dim`` of a shape of host extents."""
    dims = tuple(b.index_values.get(e) for e in extents)
    return b.op_with_shapes("dynamic_iota", [(b.shape_from(extents), len(extents))], elem, dims,
                            f"iota_dimension = {dim} : i64")


def _float_range(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    """A float Range: of constant bounds (its length known when lowering), or with
    host integers cast to float among its bounds (``arange`` over a sequence
    length). The latter is computed as an integer Range over the bounds scaled by
    2^m so that the constant ones are integers, converted and scaled back: exact, as
    TF's float arithmetic is for such bounds (the host checks they stay within
    float32's integers)."""
    from disc_tf.dhlo_bridge.rules import _scalar

    bounds = [b.const_values.get(v.ssa) for v in xs]
    elem = MLIR_TYPE[tf.as_dtype(node.attr["Tidx"].type)]
    if any(v is None for v in bounds):
        scale = _dyadic_scale(node, [float(np.asarray(c).reshape(())) for c in bounds
                                     if c is not None])
        start, limit, delta = (_scaled_bound(b, node, v, c, scale) for v, c in zip(xs, bounds))
        step = b.index_values.get(delta)
        if step is None or step == 0:
            raise LoweringError(f"Range {node.name}: delta must be a non-zero constant")
        count = _range_count(b, start, limit, delta, step)
        ramp = iota(b, [count], 0, "i64")
        shape = b.shape_of(ramp)
        scaled = b.op("multiply", [ramp, b.broadcast_to(b.host_tensor([delta], "i64", 0), shape,
                                                        1, [])], "i64", ramp.dims)
        offset = b.broadcast_to(b.host_tensor([start], "i64", 0), shape, 1, [])
        values = b.op("convert", [b.op("add", [scaled, offset], "i64", ramp.dims)], elem,
                      ramp.dims)
        if scale == 1:
            return [values]
        inverse = b.broadcast_to(_scalar(b, 1.0 / scale, elem), shape, 1, [])
        return [b.op("multiply", [values, inverse], elem, ramp.dims)]
    start, limit, delta = (float(np.asarray(v).reshape(())) for v in bounds)
    if delta == 0 or (limit - start) * delta < 0:
        raise LoweringError(f"Range {node.name}: bounds TF rejects")
    count = int(np.ceil(abs((limit - start) / delta)))
    ramp = b.op("convert", [iota(b, [b.index_const(count)], 0, "i64")], elem, (count,))
    shape = b.shape_of(ramp)
    scaled = b.op("multiply", [ramp, b.broadcast_to(_scalar(b, delta, elem), shape, 1, [])],
                  elem, ramp.dims)
    return [b.op("add", [scaled, b.broadcast_to(_scalar(b, start, elem), shape, 1, [])], elem,
                 ramp.dims)]


#: Integers a float32 holds exactly: a scaled bound beyond this would round in TF.
_EXACT_F32 = 2**24
#: Finest step of a float Range with a computed bound: 2^-8.
_MAX_SCALE_BITS = 8


def _dyadic_scale(node: node_def_pb2.NodeDef, constants: list[float]) -> int:
    """The least 2^m (m <= 8) that makes every constant bound an integer."""
    for bits in range(_MAX_SCALE_BITS + 1):
        scale = 1 << bits
        if all((c * scale).is_integer() and abs(c * scale) <= _EXACT_F32 for c in constants):
            return scale
    raise LoweringError(f"Range {node.name}: constant bounds {constants} beside a computed one "
                        "are not multiples of 2^-8")


def _scaled_bound(b: DhloBuilder, node: node_def_pb2.NodeDef, value: TValue, const,
                  scale: int) -> str:
    """A float Range bound times ``scale`` as an ``index`` scalar: a constant, or a
    host integer cast to float (the host checks the product is exact in float32)."""
    if const is not None:
        return b.index_const(int(float(np.asarray(const).reshape(())) * scale))
    scalar = b.exact_ints.get(value.ssa)
    if scalar is None:
        raise LoweringError(f"Range {node.name}: float bounds must be constants or cast dims")
    for predicate, bound in (("sle", _EXACT_F32 // scale), ("sge", -_EXACT_F32 // scale)):
        b.require(predicate, scalar, b.index_const(bound),
                  "float Range bound too large to be exact in float32")
    return scalar if scale == 1 else b.index_arith("muli", scalar, b.index_const(scale))


def _range_count(b: DhloBuilder, start: str, limit: str, delta: str, step: int) -> str:
    """Elements of an integer Range; the host checks TF's order of the bounds."""
    lo, hi = (start, limit) if step > 0 else (limit, start)
    b.require_equal_extents([b.shape_from([b.index_arith("maxsi", lo, hi)]), b.shape_from([hi])], 1)
    span = b.index_arith("subi", limit, start)
    return b.index_arith("maxsi", b.index_const(0), b.index_arith("ceildivsi", span, delta))


@tf_op("Range", dtypes=INT_TYPES | {tf.float32}, dtype_attr="Tidx", shape_inputs=(0, 1),
       const_inputs=(2,))
def _range(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    if tf.as_dtype(node.attr["Tidx"].type).is_floating:
        return _float_range(b, node, xs)
    start, limit, delta = (host_shape(b, node, v, "bounds") for v in xs)
    if len(start) != 1 or len(limit) != 1 or len(delta) != 1:
        raise LoweringError(f"Range {node.name}: bounds must be scalars")
    step = b.index_values.get(delta[0])
    if step is None or step == 0:
        raise LoweringError(f"Range {node.name}: delta must be a non-zero constant")
    # TF requires start <= limit (delta > 0) or start >= limit (delta < 0).
    count = _range_count(b, start[0], limit[0], delta[0], step)
    elem = MLIR_TYPE[tf.as_dtype(node.attr["Tidx"].type)]
    ramp = iota(b, [count], 0, elem)
    scaled = b.op("multiply", [ramp, b.broadcast_to(b.host_tensor(delta, elem, 0), b.shape_of(ramp),
                                                      1, [])], elem, ramp.dims)
    offset = b.broadcast_to(b.host_tensor(start, elem, 0), b.shape_of(ramp), 1, [])
    return [b.op("add", [scaled, offset], elem, ramp.dims)]


@tf_op("ReverseV2", dtypes=MOVE_TYPES, const_inputs=(1,))
def _reverse(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    # One ``reverse`` op (an index kernel, as a StridedSlice of negative step is); it
    # was a gather of (dim - 1) - iota per axis, three kernels each.
    x, axes_v = xs
    axes = b.known_ints(axes_v)
    if axes is None:
        raise LoweringError(f"ReverseV2 {node.name}: axes must be constants")
    if any(not -x.rank <= a < x.rank for a in axes):
        raise LoweringError(f"ReverseV2 {node.name}: axes {axes} invalid for rank {x.rank}")
    normal = [a % x.rank for a in axes]
    if len(set(normal)) != len(normal):
        raise LoweringError(f"ReverseV2 {node.name}: axis given twice in {axes}")
    if not normal:
        return [x]
    dims = ", ".join(map(str, sorted(normal)))
    return [b.op("reverse", [x], x.elem, x.dims, f"dimensions = array<i64: {dims}>")]


@tf_op("Tile", dtypes=MOVE_TYPES, shape_inputs=(1,))
def _tile(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    x, multiples_v = xs
    multiples = host_shape(b, node, multiples_v, "multiples")
    if len(multiples) != x.rank:
        raise LoweringError(f"Tile {node.name}: multiples length must be the rank {x.rank}")
    # [m0, d0, m1, d1, ...] by broadcast, then merged pairwise.
    extents = []
    for d in range(x.rank):
        extents += [multiples[d], b.dim(x, d)]
    wide = b.broadcast_to(x, b.shape_from(extents), 2 * x.rank, list(range(1, 2 * x.rank, 2)))
    merged = [b.index_arith("muli", multiples[d], b.dim(x, d)) for d in range(x.rank)]
    dims = tuple(b.index_values.get(m) for m in merged)
    return [b.dynamic_reshape(wide, merged, dims)]


@tf_op("OneHot", dtypes=MOVE_TYPES, shape_inputs=(1,), check=_one_hot_check)
def _one_hot(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    indices, depth_v, on, off = xs
    (depth,) = host_shape(b, node, depth_v, "depth")
    rank = indices.rank + 1
    axis = node.attr["axis"].i
    axis = rank - 1 if axis == -1 else axis
    if not 0 <= axis < rank:
        raise LoweringError(f"OneHot {node.name}: axis {axis} invalid")
    extents = [b.dim(indices, d) for d in range(indices.rank)]
    extents.insert(axis, depth)
    shape = b.shape_from(extents)
    # The positions along the axis: a vector of depth, broadcast (an index map on the
    # compare's read: no kernel writes the whole output's worth of them).
    line = iota(b, [depth], 0, indices.elem)
    positions = b.broadcast_to(line, shape, rank, [axis])
    spread = b.broadcast_to(indices, shape, rank, [d for d in range(rank) if d != axis])
    hit = b.op("compare", [positions, spread], "i1", positions.dims,
               "comparison_direction = #stablehlo<comparison_direction EQ>")
    on_b = b.broadcast_to(on, shape, rank, [])
    off_b = b.broadcast_to(off, shape, rank, [])
    return [b.op("select", [hit, on_b, off_b], on.elem, positions.dims)]


@tf_op("GatherV2", dtypes=MOVE_TYPES, dtype_attr="Tparams", const_inputs=(2,))
def _gather(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    params, indices, axis_v = xs
    axis = _axis(b, node, axis_v, params.rank)
    batch = node.attr["batch_dims"].i
    if batch < 0:
        batch += indices.rank
    if not 0 <= batch <= min(axis, indices.rank):
        raise LoweringError(f"GatherV2 {node.name}: batch_dims {batch} invalid")
    return [index_select(b, params, indices, axis, batch)]


def index_select(b: DhloBuilder, params: TValue, indices: TValue, axis: int,
                 batch: int) -> TValue:
    """``stablehlo.torch_index_select``: the slices of ``params`` along ``axis`` that
    ``indices`` name, the first ``batch`` dims shared (TF's GatherV2)."""
    dims = params.dims[:axis] + indices.dims[batch:] + params.dims[axis + 1:]
    return b.op("torch_index_select", [params, indices], params.elem, dims,
                f"dim = {axis} : i64, batch_dims = {batch} : i64")


@tf_op("ResourceGather", dtypes=MOVE_TYPES, dtype_attr="dtype", resource_inputs=(0,))
def _resource_gather(b: DhloBuilder, node: node_def_pb2.NodeDef,
                     xs: list[TValue]) -> list[TValue]:
    # Operand 0 is the variable's value (the DiscCluster op reads the variable);
    # TF gathers along axis batch_dims.
    params, indices = xs
    batch = node.attr["batch_dims"].i
    if batch < 0:
        batch += indices.rank
    if not 0 <= batch <= indices.rank or batch >= params.rank:
        raise LoweringError(f"ResourceGather {node.name}: batch_dims {batch} invalid")
    return [index_select(b, params, indices, batch, batch)]


@tf_op("ArgMax", "ArgMin", dtypes=NUMERIC_TYPES, const_inputs=(1,))
def _arg_max(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    x, axis_v = xs
    if x.rank == 0:
        raise LoweringError(f"{node.op} {node.name}: a scalar has no axis")
    axis = _axis(b, node, axis_v, x.rank)
    # TF rejects an empty reduced dim: the host checks max(dim, 1) == dim.
    dim = b.dim(x, axis)
    b.require_equal_extents([b.shape_from([b.index_arith("maxsi", dim, b.index_const(1))]),
                             b.shape_from([dim])], 1)
    direction = "max" if node.op == "ArgMax" else "min"
    # TF's start: the type's lowest/highest finite value (NaNs never count)
    init = arg_reduce_init(x.elem, direction)
    out = MLIR_TYPE[tf.as_dtype(node.attr["output_type"].type)]
    return [b.arg_reduce(x, axis, direction, out, init)]


# --------------------------------------------------------------------------
# Convolutions and pooling (NHWC)
# --------------------------------------------------------------------------


def _ints(node: node_def_pb2.NodeDef, name: str, default: list[int]) -> list[int]:
    return list(node.attr[name].list.i) if name in node.attr and node.attr[name].list.i else default


def _same_padding(b: DhloBuilder, size: str, window: int, stride: int,
                  dilation: int) -> tuple[str, str]:
    """TF's SAME padding (low, high) of one spatial dim: output ceil(size / stride)."""
    out = b.index_arith("ceildivsi", size, b.index_const(stride))
    needed = b.index_arith("addi", b.index_arith("muli", b.index_arith("subi", out, b.index_const(1)),
                                                 b.index_const(stride)),
                           b.index_const((window - 1) * dilation + 1))
    total = b.index_arith("maxsi", b.index_arith("subi", needed, size), b.index_const(0))
    low = b.index_arith("floordivsi", total, b.index_const(2))
    return low, b.index_arith("subi", total, low)


def _spatial_padding(b: DhloBuilder, node: node_def_pb2.NodeDef, x: TValue,
                     windows: list[int], strides: list[int], dilations: list[int],
                     sizes: list[str] | None = None):
    """(low, high) padding of H and W; ``sizes``: x's H and W, if not its own dims."""
    padding = node.attr["padding"].s.decode()
    pads = []
    for i, d in enumerate((1, 2)):
        if padding == "SAME":
            size = b.dim(x, d) if sizes is None else sizes[i]
            pads.append(_same_padding(b, size, windows[i], strides[i], dilations[i]))
        elif padding == "VALID":
            pads.append((b.index_const(0), b.index_const(0)))
        elif padding == "EXPLICIT":
            explicit = _ints(node, "explicit_paddings", [0] * 8)
            pads.append((b.index_const(explicit[2 * d]), b.index_const(explicit[2 * d + 1])))
        else:
            raise LoweringError(f"{node.op} {node.name}: padding {padding!r}")
    return pads


def _nhwc(node: node_def_pb2.NodeDef) -> None:
    fmt = node.attr["data_format"].s.decode() if "data_format" in node.attr else "NHWC"
    if fmt not in ("NHWC", ""):
        raise LoweringError(f"{node.op} {node.name}: data_format {fmt} (only NHWC)")


# f16/bf16 multiplied in f32; the window (filter kh, kw) must be static.
@tf_op("Conv2D", "DepthwiseConv2dNative", dtypes=FLOAT_TYPES, check=_nhwc_check,
       shape_check=_static_window)
def _conv2d(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    x, w = xs
    _nhwc(node)
    if x.elem in ("f16", "bf16"):  # multiplied in f32, like f16/bf16 MatMul
        wide = _conv2d(b, node, [b.op("convert", [x], "f32", x.dims),
                                 b.op("convert", [w], "f32", w.dims)])[0]
        return [b.op("convert", [wide], x.elem, wide.dims)]
    if x.rank != 4 or w.rank != 4 or None in w.dims[:2]:
        raise LoweringError(f"{node.op} {node.name}: needs rank-4 operands and a static window")
    strides = _ints(node, "strides", [1, 1, 1, 1])
    dilations = _ints(node, "dilations", [1, 1, 1, 1])
    if strides[0] != 1 or strides[3] != 1 or dilations[0] != 1 or dilations[3] != 1:
        raise LoweringError(f"{node.op} {node.name}: batch/channel strides must be 1")
    kh, kw = w.dims[0], w.dims[1]
    source, low, high = b.zero_padded.get(x.ssa, (x, None, None))
    sizes = None
    if low is not None:  # ZeroPadding2D then a convolution: the pad is read in place
        # (x's H and W from the pad's input, so that nothing reads x, not even its shape)
        sizes = [b.index_arith("addi", b.dim(source, d), b.index_arith("addi", low[i], high[i]))
                 for i, d in enumerate((1, 2))]
    pads = _spatial_padding(b, node, x, [kh, kw], strides[1:3], dilations[1:3], sizes)
    if low is not None:
        pads = [(b.index_arith("addi", lo, low[i]), b.index_arith("addi", hi, high[i]))
                for i, (lo, hi) in enumerate(pads)]
    flat = [p for pair in pads for p in pair]
    padding2d = b.host_tensor(flat, "i64", 2, (2, 2))
    groups = 1
    if node.op == "DepthwiseConv2dNative":
        # [kh, kw, C, M] -> [kh, kw, 1, C*M] with C groups (a grouped convolution).
        c, m = b.dim(w, 2), b.dim(w, 3)
        if x.dims[3] is None or w.dims[2] is None:
            raise LoweringError(f"{node.op} {node.name}: channels must be static")
        groups = x.dims[3]
        out_c = None if w.dims[3] is None else w.dims[2] * w.dims[3]
        w = b.dynamic_reshape(w, [b.index_const(kh), b.index_const(kw), b.index_const(1),
                                  b.index_arith("muli", c, m)], (kh, kw, 1, out_c))
    else:
        b.require_equal_dims(source, 3, w, 2)  # TF: input depth must equal filter depth
    attrs = (f"window_strides = array<i64: {strides[1]}, {strides[2]}>, "
             f"rhs_dilation = array<i64: {dilations[1]}, {dilations[2]}>, "
             "lhs_dilation = array<i64: 1, 1>, "
             "dimension_numbers = #stablehlo.conv<[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]>, "
             f"feature_group_count = {groups} : i64, batch_group_count = 1 : i64")
    dims = (x.dims[0], None, None, w.dims[3])
    return [b.op("dynamic_conv", [source, w, padding2d], x.elem, dims, attrs)]


@tf_op("MaxPool", "AvgPool", dtypes=FLOAT_TYPES, check=_nhwc_check)
def _pool(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    x = xs[0]
    _nhwc(node)
    ksize = _ints(node, "ksize", [])
    strides = _ints(node, "strides", [])
    if x.rank != 4 or len(ksize) != 4 or len(strides) != 4 or ksize[0] != 1 or ksize[3] != 1 \
            or strides[0] != 1 or strides[3] != 1:
        raise LoweringError(f"{node.op} {node.name}: only spatial NHWC windows")
    pads = _spatial_padding(b, node, x, ksize[1:3], strides[1:3], [1, 1])
    zero = b.index_const(0)
    low = [zero, pads[0][0], pads[1][0], zero]
    high = [zero, pads[0][1], pads[1][1], zero]
    is_max = node.op == "MaxPool"
    from disc_tf.dhlo_bridge.rules import _compare, _like, _scalar, _select

    start_value = 0.0
    if is_max:
        # TF's MaxPool starts each window at the type's lowest finite value and takes
        # only greater elements: a NaN never wins, and a window of -inf and NaN gives
        # that lowest value (bfloat16: -inf, oneDNN's kernel, which TF runs by default on
        # x86). So NaNs read as that start, which also pads and starts each window.
        start_value = -np.inf if x.elem == "bf16" else lowest_finite(x.elem)
        x = _select(b, _compare(b, x, x, "EQ"), x, _like(b, x, start_value))
    start = _scalar(b, start_value, x.elem)
    padded = _pad_value(b, x, start, low, high)
    window = (f"window_dimensions = array<i64: 1, {ksize[1]}, {ksize[2]}, 1>, "
              f"window_strides = array<i64: 1, {strides[1]}, {strides[2]}, 1>")
    pooled = b.reduce_window(padded, start, "maximum" if is_max else "add", window)
    if is_max:
        return [pooled]
    counts = _window_counts(b, x, pooled, ksize[1:3], strides[1:3], [lo for lo, _ in pads],
                            [hi for _, hi in pads])
    return [b.op("divide", [pooled, counts], x.elem, pooled.dims)]


def _window_counts(b: DhloBuilder, x: TValue, pooled: TValue, windows: list[int],
                   strides: list[int], low: list[str], high: list[str]) -> TValue:
    """An AvgPool's divisors, shaped as ``pooled``: each window's elements inside x
    (TF excludes the padding). Along H and W, a vector over the output positions of
    ``min(start + k, size) - max(start, 0)`` from each window's start (f32, exact to
    2^24; at most k), broadcast into the product (an index map: no kernel writes it);
    a dim without padding contributes its window size."""
    from disc_tf.dhlo_bridge.rules import _like

    total: TValue | None = None
    constant = 1
    for i, d in enumerate((1, 2)):
        k, s = windows[i], strides[i]
        if b.index_values.get(low[i]) == 0 and b.index_values.get(high[i]) == 0:
            constant *= k
            continue
        where = iota(b, [b.dim(pooled, d)], 0, "f32")
        dims = where.dims
        start = b.op("subtract", [b.op("multiply", [where, _like(b, where, s)], "f32", dims),
                                  b.broadcast_to(b.index_scalar(low[i], "f32"),
                                                 b.shape_of(where), 1, [])], "f32", dims)
        size = b.broadcast_to(b.index_scalar(b.dim(x, d), "f32"), b.shape_of(where), 1, [])
        end = b.op("minimum", [b.op("add", [start, _like(b, where, k)], "f32", dims), size],
                   "f32", dims)
        count = b.op("subtract", [end, b.op("maximum", [start, _like(b, where, 0.0)], "f32",
                                            dims)], "f32", dims)
        wide = b.broadcast_to(count, b.shape_of(pooled), 4, [d])
        total = wide if total is None else b.op("multiply", [total, wide], "f32", pooled.dims)
    if total is None:
        return _like(b, pooled, constant)
    if constant != 1:
        total = b.op("multiply", [total, _like(b, pooled, constant, "f32")], "f32", pooled.dims)
    return total if x.elem == "f32" else b.op("convert", [total], x.elem, pooled.dims)


def _pad_value(b: DhloBuilder, x: TValue, value: TValue, low: list[str], high: list[str]) -> TValue:
    if all(b.index_values.get(e) == 0 for e in low + high):
        return x
    zeros = [b.index_const(0) for _ in range(x.rank)]
    operands = [x, value] + [(b.shape_from(v), x.rank) for v in (low, high, zeros)]
    return b.op_with_shapes("dynamic_pad", operands, x.elem, (None,) * x.rank)


@tf_op("Cumsum", "Cumprod", dtypes=FLOAT_TYPES | INT_TYPES, const_inputs=(1,))
def _cumulative(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    """A scan along one axis: ``stablehlo.custom_call @disc.scan`` (StableHLO's
    reduce_window needs a static window, a scan over a dynamic dim has none)."""
    x, axis_v = xs
    if x.rank == 0:
        raise LoweringError(f"{node.op} {node.name}: a scalar has no axis")
    axis = _axis(b, node, axis_v, x.rank)
    combiner = "add" if node.op == "Cumsum" else "multiply"
    exclusive = str(bool(node.attr["exclusive"].b)).lower()
    reverse = str(bool(node.attr["reverse"].b)).lower()
    attrs = (f'call_target_name = "disc.scan", backend_config = "", disc.axis = {axis} : i64, '
             f'disc.combiner = "{combiner}", disc.exclusive = {exclusive}, '
             f"disc.reverse = {reverse}")
    return [b.op("custom_call", [x], x.elem, x.dims, attrs)]


@tf_op("MirrorPad", dtypes=MOVE_TYPES, shape_inputs=(1,))
def _mirror_pad(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    """REFLECT/SYMMETRIC padding: ``stablehlo.custom_call @disc.mirror_pad`` with host
    widths (StableHLO has no mirrored pad; each output element reads its mirror)."""
    x, paddings = xs
    mode = node.attr["mode"].s.decode()
    if mode not in ("REFLECT", "SYMMETRIC"):
        raise LoweringError(f"MirrorPad {node.name}: mode {mode!r}")
    low, high = _paddings(b, node, paddings, x.rank)
    # TF: each width at most dim - 1 (REFLECT) or dim (SYMMETRIC); the host checks.
    for d in range(x.rank):
        limit = b.dim(x, d) if mode == "SYMMETRIC" else b.index_arith("subi", b.dim(x, d),
                                                                       b.index_const(1))
        for width in (low[d], high[d]):
            b.require_equal_extents([b.shape_from([b.index_arith("maxsi", width, limit)]),
                                     b.shape_from([limit])], 1)
    attrs = f'call_target_name = "disc.mirror_pad", backend_config = "", disc.mode = "{mode}"'
    operands = [x, b.host_tensor(low, "i64", 1), b.host_tensor(high, "i64", 1)]
    return [b.op("custom_call", operands, x.elem, (None,) * x.rank, attrs)]


@tf_op("GatherNd", dtypes=MOVE_TYPES, dtype_attr="Tparams", shape_check=_static_index_depth)
def _gather_nd(b: DhloBuilder, node: node_def_pb2.NodeDef, xs: list[TValue]) -> list[TValue]:
    """``stablehlo.dynamic_gather`` of whole slices: indices [..., K] pick params[i0..iK-1]."""
    params, indices = xs
    k = indices.dims[-1] if indices.rank else None
    if k is None or not 1 <= k <= params.rank:
        raise LoweringError(f"GatherNd {node.name}: index depth must be static, 1..{params.rank}")
    q = indices.rank - 1
    rest = params.rank - k
    sizes = [b.index_const(1)] * k + [b.dim(params, d) for d in range(k, params.rank)]

    def ints(v: list[int]) -> str:
        return "[" + ", ".join(map(str, v)) + "]"

    attrs = ("dimension_numbers = #stablehlo.gather<"
             f"offset_dims = {ints(list(range(q, q + rest)))}, "
             f"collapsed_slice_dims = {ints(list(range(k)))}, "
             f"start_index_map = {ints(list(range(k)))}, index_vector_dim = {q}>, "
             "indices_are_sorted = false")
    dims = indices.dims[:-1] + params.dims[k:]
    return [b.op("dynamic_gather", [params, indices, b.host_tensor(sizes, "i64", 1)], params.elem,
                 dims, attrs)]
