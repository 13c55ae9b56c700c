"""Random TF programs over registry ops, for differential fuzzing against TF.

``programs()`` is a hypothesis strategy producing a :class:`Program`: Python
source of a function over 1-3 float32 inputs (rank 1-4, every dim ``None`` in
the signature) plus a symbolic description of the input dims, from which
``shape_sets(program)`` (a strategy) or ``Program.random_shapes(rng)`` draw
concrete input shapes that broadcast validly in TF.

Dims are symbols.  Each input is right-aligned on a global rank-4 frame: the
dim at frame position ``p`` is either the shared symbol ``d<p>`` or a unit
symbol ``u<i>_<p>`` that is 1 at run time (a dynamic broadcast).  ``"1"`` is
the literal unit dim that keep_dims reductions produce.  A shape set may be
"perturbed": one unit symbol gets an arbitrary size, which usually makes TF
raise an incompatible-shapes error (disc must then raise too).

Values carry an ``exact`` flag: true when they are computed from inputs only by
ops whose float result cannot depend on evaluation order or fusion (Neg, Abs,
Relu, Maximum, Minimum, Floor, Select, Transpose, Max/Min reductions).
Discontinuous ops (Floor, comparisons) are only applied to exact values, so
rounding noise can never flip their result.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf
from hypothesis import strategies as st

FRAME_RANK = 4
MAX_DIM = 7
LIT1 = "1"

UNARY = {
    # name: (source template, exact-preserving, needs exact input)
    "Exp": ("tf.math.exp(tf.clip_by_value({x}, -5.0, 5.0))", False, False),
    "Tanh": ("tf.math.tanh({x})", False, False),
    "Sigmoid": ("tf.math.sigmoid({x})", False, False),
    "Abs": ("tf.math.abs({x})", True, False),
    "Neg": ("tf.math.negative({x})", True, False),
    "Square": ("tf.math.square(tf.clip_by_value({x}, -30.0, 30.0))", False, False),
    "Relu": ("tf.nn.relu({x})", True, False),
    "Sqrt": ("tf.math.sqrt(tf.math.abs({x}) + 1.0)", False, False),
    "Log": ("tf.math.log(tf.math.abs({x}) + 1.0)", False, False),
    "Erf": ("tf.math.erf({x})", False, False),
    "Sin": ("tf.math.sin(tf.clip_by_value({x}, -10.0, 10.0))", False, False),
    "Floor": ("tf.math.floor({x})", True, True),
}

#: Data movement that keeps the shape (so broadcasting facts still hold):
#: name: (source template over x, axis, index prefix, pads, reps; exact-preserving)
MOVES = {
    "Roll(Slice+ConcatV2)": ("tf.concat([{x}[{index}1:], {x}[{index}:1]], axis={axis})", True),
    "Reverse(StridedSlice)": ("{x}[{index}::-1]", True),
    "Pad+Slice": ("tf.pad({x}, {pads})[{index}1:tf.shape({x})[{axis}] + 1]", True),
    "Reshape(Shape)": ("tf.reshape(tf.reshape({x}, [-1]), tf.shape({x}))", True),
    "Tile+Slice": ("tf.tile({x}, {reps})[{index}:tf.shape({x})[{axis}]]", True),
    "GatherV2(Range)": ("tf.gather({x}, tf.range(tf.shape({x})[{axis}] - 1, -1, -1), "
                        "axis={axis})", True),
    "Cumsum": ("tf.math.cumsum({x}, axis={axis})", False),
}
#: Moves made of trivial ops only (no cluster counts them).
TRIVIAL_MOVES = frozenset({"Reshape(Shape)"})

BINARY = {
    # name: (source template, exact-preserving)
    "Add": ("tf.math.add({a}, {b})", False),
    "Sub": ("tf.math.subtract({a}, {b})", False),
    "Mul": ("tf.math.multiply({a}, {b})", False),
    "Maximum": ("tf.math.maximum({a}, {b})", True),
    "Minimum": ("tf.math.minimum({a}, {b})", True),
    "RealDiv": ("tf.math.truediv({a}, tf.math.abs({b}) + 0.5)", False),
    "SquaredDifference": ("tf.math.squared_difference({a}, {b})", False),
}

COMPARE = {
    "Less": "tf.math.less", "LessEqual": "tf.math.less_equal", "Greater": "tf.math.greater",
    "GreaterEqual": "tf.math.greater_equal", "Equal": "tf.math.equal", "NotEqual": "tf.math.not_equal",
}

REDUCE = {
    # name: (function, exact-preserving)
    "Sum": ("tf.math.reduce_sum", False), "Mean": ("tf.math.reduce_mean", False),
    "Max": ("tf.math.reduce_max", True), "Min": ("tf.math.reduce_min", True),
}


def is_unit(name: str) -> bool:
    """True for dims that are 1 at run time (unless a shape set perturbs them)."""
    return name == LIT1 or name.startswith("u")


def broadcast(a: tuple, b: tuple) -> tuple | None:
    """Symbolic numpy broadcast of two dim-name tuples, or None if not provably valid."""
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else None
        y = b[-i] if i <= len(b) else None
        if x is None or y is None:
            out.append(x if y is None else y)
        elif x == y:
            out.append(x)
        elif is_unit(y):
            out.append(x)
        elif is_unit(x):
            out.append(y)
        else:
            return None
    return tuple(reversed(out))


def fits(shape: tuple, exact: bool = False):
    """Predicate: a value broadcasts with ``shape`` (and is exact, if asked)."""
    return lambda v: (v.exact or not exact) and broadcast(shape, v.shape) is not None


@dataclasses.dataclass
class Value:
    name: str
    shape: tuple
    exact: bool
    is_input: bool = False
    used: bool = False


@dataclasses.dataclass
class Program:
    """A generated program: source, its input dim symbols, and the function."""

    source: str
    input_shapes: list  # per input: tuple of dim symbols
    ops: list  # TF op names used, for reports

    @property
    def symbols(self) -> list[str]:
        return sorted({d for s in self.input_shapes for d in s})

    def signature(self) -> list[tf.TensorSpec]:
        return [tf.TensorSpec([None] * len(s), tf.float32) for s in self.input_shapes]

    def function(self):
        namespace = {"tf": tf}
        exec(compile(self.source, "<fuzz program>", "exec"), namespace)  # noqa: S102
        return namespace["fn"]

    def shapes_from_sizes(self, sizes: dict) -> list[tuple]:
        return [tuple(int(sizes[d]) for d in s) for s in self.input_shapes]

    def random_shapes(self, rng: np.random.Generator, perturb: bool = False) -> list[tuple]:
        """One set of input shapes; with ``perturb``, one unit dim may be resized."""
        sizes = {}
        for d in self.symbols:
            if is_unit(d):
                sizes[d] = 1
            else:
                r = rng.random()
                sizes[d] = 0 if r < 0.1 else 1 if r < 0.25 else int(rng.integers(2, MAX_DIM + 1))
        units = [d for d in self.symbols if is_unit(d)]
        if perturb and units:
            sizes[units[int(rng.integers(len(units)))]] = int(rng.integers(0, MAX_DIM + 1))
        return self.shapes_from_sizes(sizes)

    def __repr__(self) -> str:
        shapes = ", ".join("(" + ", ".join(s) + ")" for s in self.input_shapes)
        return f"Program(input dims [{shapes}]):\n{self.source}"


@st.composite
def sizes_for(draw, program: Program) -> dict:
    """Concrete sizes of the program's dim symbols (hypothesis-shrinkable)."""
    sizes = {}
    for d in program.symbols:
        if is_unit(d):
            sizes[d] = 1
        else:
            sizes[d] = draw(st.sampled_from([3, 2, 5, 1, 4, 0, 6, 7]))
    units = [d for d in program.symbols if is_unit(d)]
    if units and draw(st.integers(0, 9)) == 9:  # perturbed: an invalid broadcast, mostly
        sizes[draw(st.sampled_from(units))] = draw(st.integers(0, MAX_DIM))
    return sizes


#: Sizes of the one long dim of a large shape set (every other dim is 1 or 2).
LARGE_DIMS = (1000, 4099, 65537, 2**20 + 3)


@st.composite
def large_sizes_for(draw, program: Program) -> dict:
    """Sizes with one dim symbol long (up to 2^20) and the others 1 or 2: long
    reductions, scans and rows, at most 8 * 2^20 elements a tensor."""
    names = [d for d in program.symbols if not is_unit(d)]
    sizes = {d: 1 if is_unit(d) else draw(st.sampled_from([2, 1])) for d in program.symbols}
    if names:
        sizes[draw(st.sampled_from(names))] = draw(st.sampled_from(LARGE_DIMS))
    return sizes


@st.composite
def shape_sets(draw, program: Program, count: int = 3, large: bool = False) -> list[list[tuple]]:
    sizes = large_sizes_for if large else sizes_for
    return [program.shapes_from_sizes(draw(sizes(program))) for _ in range(count)]


@st.composite
def programs(draw, max_ops: int = 8, matmul: bool = True, moves: bool = True) -> Program:
    n_inputs = draw(st.integers(1, 3))
    values: list[Value] = []
    input_shapes = []
    for i in range(n_inputs):
        rank = draw(st.integers(1, FRAME_RANK))
        dims = []
        for p in range(FRAME_RANK - rank, FRAME_RANK):
            unit = draw(st.integers(0, 4)) == 4
            dims.append(f"u{i}_{p}" if unit else f"d{p}")
        input_shapes.append(tuple(dims))
        values.append(Value(f"x{i}", tuple(dims), exact=True, is_input=True))

    lines = []
    ops = []

    def emit(expr: str, shape: tuple, exact: bool, op: str, *operands: Value) -> None:
        for v in operands:
            v.used = True
        name = f"v{len(lines)}"
        lines.append(f"    {name} = {expr}")
        values.append(Value(name, shape, exact))
        ops.append(op)

    def pick(cond=lambda v: True) -> Value | None:
        cands = [v for v in values if cond(v)]
        return draw(st.sampled_from(cands)) if cands else None

    kinds = ["unary", "binary", "const_binary", "select", "reduce", "softmax", "transpose"]
    if moves:
        kinds.append("move")
    if matmul:
        kinds.append("matmul")
    n_ops = draw(st.integers(1, max_ops))
    # A program of reshapes alone computes nothing: no cluster is made of it.
    while len(lines) < n_ops or all(op in TRIVIAL_MOVES for op in ops):
        kind = draw(st.sampled_from(kinds))
        if kind == "unary":
            op = draw(st.sampled_from(sorted(UNARY)))
            tmpl, keeps_exact, needs_exact = UNARY[op]
            x = pick(lambda v: v.exact) if needs_exact else pick()
            if x is None:
                continue
            emit(tmpl.format(x=x.name), x.shape, x.exact and keeps_exact, op, x)
        elif kind in ("binary", "const_binary"):
            op = draw(st.sampled_from(sorted(BINARY)))
            tmpl, keeps_exact = BINARY[op]
            a = pick()
            if kind == "const_binary":
                c = draw(st.sampled_from([-1.5, -0.5, 0.0, 0.5, 2.0]))
                exact = a.exact and keeps_exact
                if draw(st.booleans()):
                    emit(tmpl.format(a=a.name, b=repr(c)), a.shape, exact, op, a)
                else:
                    emit(tmpl.format(a=repr(c), b=a.name), a.shape, exact, op, a)
                continue
            b = pick(fits(a.shape))
            emit(tmpl.format(a=a.name, b=b.name), broadcast(a.shape, b.shape),
                 a.exact and b.exact and keeps_exact, op, a, b)
        elif kind == "select":
            x = pick(lambda v: v.exact)
            y = pick(fits(x.shape, exact=True))
            cmp = draw(st.sampled_from(sorted(COMPARE)))
            cshape = broadcast(x.shape, y.shape)
            a = pick(fits(cshape))
            shape = broadcast(cshape, a.shape)
            b = pick(fits(shape))
            shape = broadcast(shape, b.shape)
            if draw(st.booleans()):
                a, b = b, a
            emit(f"tf.where({COMPARE[cmp]}({x.name}, {y.name}), {a.name}, {b.name})", shape,
                 a.exact and b.exact, f"{cmp}+SelectV2", x, y, a, b)
        elif kind == "reduce":
            x = pick(lambda v: len(v.shape) >= 1)
            if x is None:
                continue
            op = draw(st.sampled_from(sorted(REDUCE)))
            fn, keeps_exact = REDUCE[op]
            rank = len(x.shape)
            axis = -1 if draw(st.booleans()) else draw(st.integers(-rank, rank - 1))
            keep = draw(st.booleans())
            ax = axis % rank
            shape = x.shape[:ax] + ((LIT1,) if keep else ()) + x.shape[ax + 1:]
            emit(f"{fn}({x.name}, axis={axis}, keepdims={keep})", shape,
                 x.exact and keeps_exact, op, x)
        elif kind == "softmax":
            x = pick(lambda v: len(v.shape) >= 1)
            if x is None:
                continue
            emit(f"tf.nn.softmax({x.name}, axis=-1)", x.shape, False, "Softmax", x)
        elif kind == "move":
            x = pick(lambda v: len(v.shape) >= 1)
            if x is None:
                continue
            op = draw(st.sampled_from(sorted(MOVES)))
            rank = len(x.shape)
            axis = draw(st.integers(0, rank - 1))
            index = ":, " * axis  # x[:, :, 1:] slices dim ``axis``
            expr = MOVES[op][0].format(x=x.name, axis=axis, index=index,
                                       pads=[[0, 0]] * axis + [[1, 2]] + [[0, 0]] * (rank - 1 - axis),
                                       reps=[1] * axis + [2] + [1] * (rank - 1 - axis))
            emit(expr, x.shape, x.exact and MOVES[op][1], op, x)
        elif kind == "transpose":
            x = pick(lambda v: len(v.shape) >= 2)
            if x is None:
                continue
            perm = draw(st.permutations(range(len(x.shape))))
            emit(f"tf.transpose({x.name}, perm={list(perm)})", tuple(x.shape[p] for p in perm),
                 x.exact, "Transpose", x)
        elif kind == "matmul":
            pairs = []
            two_d = [v for v in values if len(v.shape) == 2]
            for a in two_d:
                for b in two_d:
                    for ta in (False, True):
                        for tb in (False, True):
                            k_a = a.shape[0] if ta else a.shape[1]
                            k_b = b.shape[1] if tb else b.shape[0]
                            if k_a == k_b and (k_a == LIT1 or not is_unit(k_a)):
                                pairs.append((a, b, ta, tb))
            if not pairs:
                continue
            a, b, ta, tb = draw(st.sampled_from(pairs))
            m = a.shape[1] if ta else a.shape[0]
            n = b.shape[0] if tb else b.shape[1]
            emit(f"tf.linalg.matmul({a.name}, {b.name}, transpose_a={ta}, transpose_b={tb})",
                 (m, n), False, "MatMul", a, b)

    # Every value no other value consumes is an output: no dead code, whose
    # (pruned) errors TF would never report.
    outs = [v for v in values if not v.is_input and not v.used]
    args = ", ".join(f"x{i}" for i in range(n_inputs))
    source = "\n".join([f"def fn({args}):", *lines,
                        f"    return ({', '.join(v.name for v in outs)},)"]) + "\n"
    return Program(source, input_shapes, ops)


def random_inputs(rng: np.random.Generator, shapes: list[tuple]) -> list[np.ndarray]:
    """float32 inputs; some snapped to multiples of 0.5 so ties (==, max) occur."""
    out = []
    for shape in shapes:
        data = rng.standard_normal(shape) * 2.0
        if rng.random() < 0.3:
            data = np.round(data * 2.0) / 2.0
        out.append(data.astype(np.float32))
    return out
