"""Elementwise ops: one table entry per DHLO elementwise op, and one line per TF op
that is exactly one of them.

An ``Elementwise`` entry is everything the later stages need of a DHLO op that
maps elements to elements: its shape rule (its operands' shape: the shape
analysis unions their dims), its C++ expression on compute-type values (the CPU
backend; the CUDA backend uses the same text, CUDA's math library having the C
names, unless ``cuda`` says otherwise), its cost per element for the thread
pool, and whether glibc's libmvec has a vector version of its C function.

``elementwise_op("Tan", "tan", FLOAT_TYPES)`` then defines a TF op: its support
(dtypes) and its lowering (numpy broadcasting for binary ops, then the DHLO op).

Values are held in a *compute type* (float for f16/bf16, so every half-type op
computes in float and rounds once per op, as TensorFlow's CPU kernels do).
"""

from __future__ import annotations

import dataclasses
import math
import struct
from collections.abc import Callable

from disc_tf.ops.table import BOOL_TYPES, FLOAT_TYPES, NUMERIC_TYPES, tf_op

#: Type values are computed in. (f64 only accumulates products of floats.)
COMPUTE = {"f32": "float", "f16": "float", "bf16": "float", "i32": "int32_t", "i64": "int64_t",
           "i1": "bool", "f64": "double"}
_FLOAT = ("f32", "f16", "bf16")
_COMPARE = {"EQ": "==", "NE": "!=", "LT": "<", "LE": "<=", "GT": ">", "GE": ">="}

#: (compute-type argument texts, result elem, operand elems, attrs) -> C++ expression
Expression = Callable[[list[str], str, list[str], dict], str]


@dataclasses.dataclass(frozen=True)
class Elementwise:
    """A DHLO elementwise op: the shape of its operands, and its expression."""

    name: str  # without dialect ("add", "erf")
    cpu: Expression
    #: rough cost in cycles per element, for the thread pool's cost model
    cost: int = 1
    #: the CUDA expression, where it is not the CPU one
    cuda: Expression | None = None
    #: the C function (float) glibc's libmvec has a vector version of
    vector_fn: str | None = None
    #: operands of the vector function (1 or 2)
    vector_arity: int = 1


_DHLO: dict[str, Elementwise] = {}


def _define(entry: Elementwise) -> Elementwise:
    if entry.name in _DHLO:
        raise ValueError(f"DHLO elementwise op {entry.name} is defined twice")
    _DHLO[entry.name] = entry
    return entry


def round_half(expr: str, elem: str) -> str:
    """Rounds a float expression to half precision when ``elem`` is f16 or bf16."""
    if elem in ("f16", "bf16"):
        return f"disc_round_{elem}({expr})"
    return expr


def literal(value: object, elem: str) -> str:
    """A C++ literal of ``value`` in the compute type of ``elem``."""
    if elem == "f64":
        return repr(float(value)) if math.isfinite(float(value)) else literal(value, "f32")
    if elem in _FLOAT:
        v = float(value)
        if math.isnan(v):
            return "NAN"
        if math.isinf(v):
            return "INFINITY" if v > 0 else "(-INFINITY)"
        return f"{v.hex()}f" if v >= 0 else f"(-{(-v).hex()}f)"
    if elem == "i1":
        return "true" if value else "false"
    if elem == "i64":
        return f"INT64_C({int(value)})"
    return f"int32_t({int(value)})"


#: The most negative finite value of each float type: TF's CPU ArgMax (Eigen's arg
#: reducer) starts from it at position 0 and moves only to a strictly greater element, so
#: NaNs, -inf and this value itself never count, and a row of only those gives 0.
_LOWEST = {"f32": -3.4028234663852886e38, "f16": -65504.0, "bf16": -3.3895313892515355e38,
           "f64": -1.7976931348623157e308}


def lowest_finite(elem: str) -> float:
    """The most negative finite value of the float type ``elem`` (f32, f16, bf16, f64)."""
    return _LOWEST[elem]


def arg_reduce_init(elem: str, direction: str) -> str:
    """The same start value as a DHLO ``dense<...>`` literal: the bit pattern of the
    float types (``0xFF7FFFFF`` for an f32 ArgMax), the decimal bound of the int types."""
    if elem in ("i32", "i64"):
        bits = int(elem[1:])
        return str(-(1 << (bits - 1)) if direction == "max" else (1 << (bits - 1)) - 1)
    if elem not in _LOWEST or elem == "f64":
        raise ValueError(f"ArgMax/ArgMin over {elem} elements")
    low = _LOWEST[elem] if direction == "max" else -_LOWEST[elem]
    if elem == "f16":
        return f"0x{struct.unpack('<H', struct.pack('<e', low))[0]:04X}"
    f32 = struct.unpack("<I", struct.pack("<f", low))[0]
    return f"0x{f32 >> 16:04X}" if elem == "bf16" else f"0x{f32:08X}"  # bf16: f32's top half


def arg_reduce_start(elem: str, direction: str) -> str:
    """C++ literal (in the compute type) of the value an ArgMax (``direction`` "max") or
    ArgMin over ``elem`` elements starts from at position 0: the type's lowest (highest)
    finite value, as in TF's CPU kernel."""
    if elem in ("i32", "i64"):
        return f"INT{elem[1:]}_{'MIN' if direction == 'max' else 'MAX'}"
    if elem not in _LOWEST:
        raise ValueError(f"ArgMax/ArgMin over {elem} elements")
    low = _LOWEST[elem]
    return literal(low if direction == "max" else -low, "f64" if elem == "f64" else "f32")


def _infix(template: str) -> Expression:
    """``template`` over the operands ({0}, {1}); integer results are cast back to
    their type (C++ promotes narrow ints), half-type results rounded once."""

    def expr(args: list[str], elem: str, operand_elems: list[str], attrs: dict) -> str:
        text = template.format(*args)
        if elem not in _FLOAT and elem != "i1":
            text = f"{COMPUTE[elem]}({text})"
        return round_half(text, elem)

    return expr


def _float_fn(name: str) -> Expression:
    """A float C function of the operands, rounded once for half types."""
    return lambda args, elem, operand_elems, attrs: round_half(f"{name}({', '.join(args)})", elem)


def _extremum(float_fn: str, cmp: str) -> Expression:
    """NaN-propagating max/min for floats (TF's Maximum/Minimum), a select for ints."""

    def expr(args: list[str], elem: str, operand_elems: list[str], attrs: dict) -> str:
        a, b = args
        return f"{float_fn}({a}, {b})" if elem in _FLOAT else f"({a} {cmp} {b} ? {a} : {b})"

    return expr


def _float_literal_value(text: str) -> float | None:
    """The value of a float literal written by ``literal`` (None for any other text)."""
    t = text.strip("()")
    if not t.endswith("f"):
        return None
    try:
        return float.fromhex(t[:-1])
    except ValueError:
        return None


def _power(args: list[str], elem: str, operand_elems: list[str], attrs: dict) -> str:
    """``pow(a, b)``; a constant exponent of -1, 1, 2, 3 or 4 becomes multiplies.

    ``x * x * x`` is what XLA emits for ``x ** 3`` too: it keeps the loop
    vectorized (a vector ``powf`` costs ~20x more) and differs from ``powf`` by at
    most a rounding per multiply; NaN, infinities and signed zeros come out as
    ``powf``'s.
    """
    a, b = args
    e = _float_literal_value(b)
    text = {1.0: a, 2.0: f"({a} * {a})", 3.0: f"({a} * {a} * {a})",
            4.0: f"(({a} * {a}) * ({a} * {a}))", -1.0: f"(1.0f / {a})"}.get(e, f"powf({a}, {b})")
    return round_half(text, elem)


def _abs(args: list[str], elem: str, operand_elems: list[str], attrs: dict) -> str:
    a = args[0]
    return round_half(f"fabsf({a})", elem) if elem in _FLOAT else f"{COMPUTE[elem]}({a} < 0 ? -{a} : {a})"


def _sign(args: list[str], elem: str, operand_elems: list[str], attrs: dict) -> str:
    a = args[0]
    if elem in _FLOAT:
        return f"({a} != {a} ? {a} : (float)(({a} > 0) - ({a} < 0)))"
    return f"{COMPUTE[elem]}(({a} > 0) - ({a} < 0))"


def _remainder(args: list[str], elem: str, operand_elems: list[str], attrs: dict) -> str:
    a, b = args
    return round_half(f"fmodf({a}, {b})", elem) if elem in _FLOAT else f"{COMPUTE[elem]}({a} % {b})"


def _compare(args: list[str], elem: str, operand_elems: list[str], attrs: dict) -> str:
    direction = attrs["comparison_direction"].split()[-1].rstrip(">")
    return f"({args[0]} {_COMPARE[direction]} {args[1]})"


def _convert(args: list[str], elem: str, operand_elems: list[str], attrs: dict) -> str:
    a, src = args[0], operand_elems[0]
    if elem == "i1":
        return f"({a} != 0)"
    if src == elem:
        return a
    if src in _FLOAT and elem in ("i32", "i64"):
        return f"disc_f2{elem}({a})"  # NaN and out-of-range values as TF's kernels give them
    return round_half(f"{COMPUTE[elem]}({a})", elem)


for _name, _template in (("add", "{0} + {1}"), ("subtract", "{0} - {1}"),
                         ("multiply", "{0} * {1}"), ("divide", "{0} / {1}"),
                         ("negate", "-{0}"), ("and", "{0} && {1}"), ("or", "{0} || {1}"),
                         ("not", "!{0}")):
    _define(Elementwise(_name, _infix(_template), cost=4 if _name == "divide" else 1))
_define(Elementwise("maximum", _extremum("disc_max", ">")))
_define(Elementwise("minimum", _extremum("disc_min", "<")))
_define(Elementwise("abs", _abs))
_define(Elementwise("sign", _sign))
_define(Elementwise("remainder", _remainder, cost=10))
_define(Elementwise("power", _power, cost=40, vector_fn="powf", vector_arity=2))
_define(Elementwise("compare", _compare))
_define(Elementwise("select", lambda args, *_: f"({args[0]} ? {args[1]} : {args[2]})"))
_define(Elementwise("convert", _convert))
_define(Elementwise("is_finite", lambda args, *_: f"(bool)isfinite({args[0]})"))
_define(Elementwise("rsqrt", lambda args, elem, *_: round_half(f"1.0f / sqrtf({args[0]})", elem),
                    cost=10))
_define(Elementwise("logistic", lambda args, elem, *_: round_half(
    f"disc_sigmoidf({args[0]})", elem), cost=25,
    cuda=lambda args, elem, *_: round_half(f"1.0f / (1.0f + expf(-{args[0]}))", elem)))
#: DHLO name -> (C function, cost, libmvec has it)
_FLOAT_FUNCTIONS = {
    "log": ("logf", 20, True), "tanh": ("tanhf", 25, True),
    "sqrt": ("sqrtf", 8, False), "floor": ("floorf", 1, False), "ceil": ("ceilf", 1, False),
    "round_nearest_even": ("nearbyintf", 1, False), "log_plus_one": ("log1pf", 20, True),
    "exponential_minus_one": ("expm1f", 20, True), "sine": ("sinf", 20, True),
    "cosine": ("cosf", 20, True), "erf": ("erff", 25, True), "erfc": ("erfcf", 25, True),
    "tan": ("tanf", 25, False),
}
for _name, (_fn, _cost, _vector) in _FLOAT_FUNCTIONS.items():
    _define(Elementwise(_name, _float_fn(_fn), cost=_cost, vector_fn=_fn if _vector else None))
# CPU: libmvec's vector expf runs glibc's scalar expf for each lane outside about
# [-87.3, 87.3], 10-20x slower per element (a masked softmax's -1e9 columns); the
# prelude's disc_expf keeps every lane inside that range (codegen/cpu_ops.py).
_define(Elementwise("exponential", _float_fn("disc_expf"), cost=20, cuda=_float_fn("expf"),
                    vector_fn="expf"))


def entry(name: str) -> Elementwise | None:
    """The elementwise entry of DHLO op ``name`` (dialect prefix allowed), or None."""
    return _DHLO.get(name.split(".", 1)[-1])


def names() -> frozenset[str]:
    """DHLO elementwise op names (without dialect)."""
    return frozenset(_DHLO)


def expression(op: str, args: list[str], elem: str, operand_elems: list[str],
               attrs: dict, backend: str = "cpu") -> str:
    """The C++ (``backend`` "cpu") or CUDA ("cuda") expression of DHLO ``op`` on
    compute-type ``args``; ValueError for an op the table does not have."""
    found = entry(op)
    if found is None:
        raise ValueError(f"no elementwise expression for DHLO op {op}")
    fn = found.cuda if backend == "cuda" and found.cuda is not None else found.cpu
    return fn(args, elem, operand_elems, attrs)


def cost(op: str) -> int:
    """Rough cycles per element of DHLO ``op`` (1 for anything not in the table)."""
    found = entry(op)
    return found.cost if found is not None else 1


def vector_math_declarations() -> str:
    """Declarations that let the compiler call glibc's vector math (libmvec) from
    vectorized loops; must precede any use, outside any namespace."""
    lines = ['extern "C" {']
    for e in _DHLO.values():
        if e.vector_fn:
            params = ", ".join(["float"] * e.vector_arity)
            lines.append(f'__attribute__((simd("notinbranch"))) float {e.vector_fn}({params}) '
                         "noexcept;")
    return "\n".join(lines + ["}"])


# ---- TF ops that are one DHLO elementwise op: one line each ----------------


def elementwise_op(tf_name: str, dhlo: str, dtypes, arity: int = 1, dtype_attr: str = "T",
                   dialect: str = "stablehlo") -> None:
    """Defines TF op ``tf_name`` as DHLO elementwise op ``dhlo`` (numpy broadcasting
    first for ``arity`` 2)."""
    if entry(dhlo) is None:
        raise ValueError(f"TF op {tf_name}: DHLO op {dhlo} has no elementwise entry")
    full = dhlo if dialect == "stablehlo" else f"{dialect}.{dhlo}"

    def lower(b, node, xs):
        operands = b.numpy_broadcast(xs) if arity > 1 else xs
        first = operands[0]
        return [b.op(full, operands, first.elem, first.dims)]

    lower.__name__ = f"lower_{tf_name}"
    tf_op(tf_name, dtypes=dtypes, dtype_attr=dtype_attr)(lower)


for _tf, _dhlo in (("Add", "add"), ("AddV2", "add"), ("Sub", "subtract"), ("Mul", "multiply"),
                   ("Maximum", "maximum"), ("Minimum", "minimum")):
    elementwise_op(_tf, _dhlo, NUMERIC_TYPES, arity=2)
for _tf, _dhlo in (("RealDiv", "divide"), ("Pow", "power")):
    elementwise_op(_tf, _dhlo, FLOAT_TYPES, arity=2)
for _tf, _dhlo in (("LogicalAnd", "and"), ("LogicalOr", "or")):
    elementwise_op(_tf, _dhlo, BOOL_TYPES, arity=2, dtype_attr="")
elementwise_op("LogicalNot", "not", BOOL_TYPES, dtype_attr="")
for _tf, _dhlo in (("Neg", "negate"), ("Abs", "abs"), ("Sign", "sign")):
    elementwise_op(_tf, _dhlo, NUMERIC_TYPES)
for _tf, _dhlo in (("Exp", "exponential"), ("Log", "log"), ("Tanh", "tanh"), ("Sigmoid", "logistic"),
                   ("Rsqrt", "rsqrt"), ("Sqrt", "sqrt"), ("Floor", "floor"), ("Ceil", "ceil"),
                   ("Round", "round_nearest_even"), ("Log1p", "log_plus_one"),
                   ("Expm1", "exponential_minus_one"), ("Sin", "sine"), ("Cos", "cosine")):
    elementwise_op(_tf, _dhlo, FLOAT_TYPES)
elementwise_op("Erf", "erf", FLOAT_TYPES, dialect="chlo")
elementwise_op("Erfc", "erfc", FLOAT_TYPES, dialect="chlo")
elementwise_op("Tan", "tan", FLOAT_TYPES)
