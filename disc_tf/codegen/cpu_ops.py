"""Per-op C++ expressions for the CPU backend.

Values are held in a *compute type* (float for f16, so that every f16 op
computes in float and rounds once per op, as TensorFlow's CPU kernels do).
"""

from __future__ import annotations

import math

from disc_tf.codegen.cpu_text import CASCADE

#: Storage type of each element type in generated C++.
STORAGE = {"f32": "float", "f16": "_Float16", "bf16": "disc_bf16", "i32": "int32_t",
           "i64": "int64_t", "i1": "bool", "f64": "double"}
#: Type values are computed in.
#: (f64 only accumulates products of floats; no tensor holds it.)
COMPUTE = {"f32": "float", "f16": "float", "bf16": "float", "i32": "int32_t", "i64": "int64_t",
           "i1": "bool", "f64": "double"}
#: RAL dtype constant of each element type.
RAL_DTYPE = {"f32": "DISC_F32", "f16": "DISC_F16", "bf16": "DISC_BF16", "i32": "DISC_I32",
             "i64": "DISC_I64", "i1": "DISC_BOOL"}
#: Bytes per element.
ITEMSIZE = {"f32": 4, "f16": 2, "bf16": 2, "i32": 4, "i64": 8, "i1": 1}

_FLOAT = ("f32", "f16", "bf16")

_COMPARE = {"EQ": "==", "NE": "!=", "LT": "<", "LE": "<=", "GT": ">", "GE": ">="}

#: Rough cost in cycles per element, for the thread pool's cost model.
COST = {"exponential": 20, "log": 20, "tanh": 25, "logistic": 25, "power": 40,
        "sqrt": 8, "rsqrt": 10, "divide": 4, "erf": 25, "erfc": 25, "log_plus_one": 20,
        "exponential_minus_one": 20, "sine": 20, "cosine": 20, "remainder": 10}


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


def _round(expr: str, elem: str) -> str:
    """Rounds a float expression to f16 precision when ``elem`` is f16."""
    if elem in ("f16", "bf16"):
        return f"disc_round_{elem}({expr})"
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


def _power(a: str, b: str) -> str:
    """``pow(a, b)``; a constant exponent of -1, 1, 2, 3 or 4 becomes multiplies.

    ``x * x * x`` is what XLA emits for ``x ** 3`` too: it keeps the loop
    vectorized (a vector ``powf`` costs ~20x more) and differs from ``powf`` by at
    most a rounding per multiply; NaN, infinities and signed zeros come out as
    ``powf``'s.
    """
    e = _float_literal_value(b)
    if e == 1.0:
        return a
    if e == 2.0:
        return f"({a} * {a})"
    if e == 3.0:
        return f"({a} * {a} * {a})"
    if e == 4.0:
        return f"(({a} * {a}) * ({a} * {a}))"
    if e == -1.0:
        return f"(1.0f / {a})"
    return f"powf({a}, {b})"


def expression(op: str, args: list[str], elem: str, operand_elems: list[str],
               attrs: dict[str, str]) -> str:
    """The C++ expression computing DHLO ``op`` on compute-type ``args``."""
    a = args[0]
    b = args[1] if len(args) > 1 else ""
    is_float = elem in _FLOAT
    ct = COMPUTE[elem]
    simple = {
        "add": f"{a} + {b}", "subtract": f"{a} - {b}", "multiply": f"{a} * {b}",
        "divide": f"{a} / {b}", "negate": f"-{a}", "and": f"{a} && {b}", "or": f"{a} || {b}",
        "not": f"!{a}",
    }
    if op in simple:
        expr = simple[op]
        if not is_float and elem != "i1":
            expr = f"{ct}({expr})"
        return _round(expr, elem)
    if op == "maximum":
        if is_float:
            return f"disc_max({a}, {b})"
        return f"({a} > {b} ? {a} : {b})"
    if op == "minimum":
        if is_float:
            return f"disc_min({a}, {b})"
        return f"({a} < {b} ? {a} : {b})"
    if op == "abs":
        return _round(f"fabsf({a})", elem) if is_float else f"{ct}({a} < 0 ? -{a} : {a})"
    unary_float = {
        "exponential": "expf", "log": "logf", "tanh": "tanhf", "sqrt": "sqrtf",
        "floor": "floorf", "ceil": "ceilf", "round_nearest_even": "nearbyintf",
        "log_plus_one": "log1pf", "exponential_minus_one": "expm1f", "sine": "sinf",
        "cosine": "cosf", "erf": "erff", "erfc": "erfcf",
    }
    if op in unary_float:
        return _round(f"{unary_float[op]}({a})", elem)
    if op == "sign":
        if is_float:
            return f"({a} != {a} ? {a} : (float)(({a} > 0) - ({a} < 0)))"
        return f"{ct}(({a} > 0) - ({a} < 0))"
    if op == "is_finite":
        return f"(bool)isfinite({a})"
    if op == "remainder":
        return _round(f"fmodf({a}, {b})", elem) if is_float else f"{ct}({a} % {b})"
    if op == "rsqrt":
        return _round(f"1.0f / sqrtf({a})", elem)
    if op == "logistic":
        return _round(f"1.0f / (1.0f + expf(-{a}))", elem)
    if op == "power":
        return _round(_power(a, b), elem)
    if op == "compare":
        direction = attrs["comparison_direction"].split()[-1].rstrip(">")
        return f"({a} {_COMPARE[direction]} {b})"
    if op == "select":
        return f"({a} ? {b} : {args[2]})"
    if op == "convert":
        src = operand_elems[0]
        if elem == "i1":
            return f"({a} != 0)"
        if src == elem:
            return a
        return _round(f"{ct}({a})", elem)
    raise ValueError(f"CPU codegen has no expression for DHLO op {op}")


#: Declarations that let the compiler call glibc's vector math (libmvec) from
#: vectorized loops; must precede any use, outside any namespace.
VECTOR_MATH = """extern "C" {
__attribute__((simd("notinbranch"))) float expf(float) noexcept;
__attribute__((simd("notinbranch"))) float logf(float) noexcept;
__attribute__((simd("notinbranch"))) float tanhf(float) noexcept;
__attribute__((simd("notinbranch"))) float powf(float, float) noexcept;
__attribute__((simd("notinbranch"))) float log1pf(float) noexcept;
__attribute__((simd("notinbranch"))) float expm1f(float) noexcept;
__attribute__((simd("notinbranch"))) float sinf(float) noexcept;
__attribute__((simd("notinbranch"))) float cosf(float) noexcept;
__attribute__((simd("notinbranch"))) float erff(float) noexcept;
__attribute__((simd("notinbranch"))) float erfcf(float) noexcept;
}"""

#: Helpers every generated source defines once.
PRELUDE = r"""
// Kernels are built for AVX-512, AVX2 and baseline x86-64; the loader picks
// the best the CPU has (GCC function multi-versioning).
#define DISC_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
static inline float disc_round_f16(float x) { return (float)(_Float16)x; }
// bfloat16 storage: the high half of a float, rounded to nearest even (as TF does).
struct disc_bf16 {
  uint16_t bits;
  disc_bf16() = default;
  disc_bf16(float x) {  // NOLINT: implicit, like a float narrowing
    uint32_t u;
    __builtin_memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = (uint16_t)((u >> 16) | 0x40u);  // a quiet NaN
    } else {
      bits = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
  }
  operator float() const {
    const uint32_t u = (uint32_t)bits << 16;
    float x;
    __builtin_memcpy(&x, &u, 4);
    return x;
  }
};
static inline float disc_round_bf16(float x) { return (float)disc_bf16(x); }
// NaN-propagating max/min, as TensorFlow's Maximum/Minimum.
static inline float disc_max(float a, float b) { return (a > b || a != a) ? a : b; }
static inline float disc_min(float a, float b) { return (a < b || a != a) ? a : b; }
// Eight float lanes (a GCC vector): row accumulators of stitch kernels. The
// scalar max/min above do not vectorize (the || is a branch); these select.
typedef float disc_f32x8 __attribute__((vector_size(32)));
static inline disc_f32x8 disc_max(disc_f32x8 a, disc_f32x8 b) { return ((a > b) | (a != a)) ? a : b; }
static inline disc_f32x8 disc_min(disc_f32x8 a, disc_f32x8 b) { return ((a < b) | (a != a)) ? a : b; }
static inline disc_f32x8 disc_splat8(float x) { return disc_f32x8{x, x, x, x, x, x, x, x}; }
// Lanes i and i ^ k of v, swapped (k = 4, 2, 1: the steps of a tree reduction).
typedef int32_t disc_i32x8 __attribute__((vector_size(32)));
static inline disc_f32x8 disc_swap8(disc_f32x8 v, int k) {
  if (k == 4) return __builtin_shuffle(v, disc_i32x8{4, 5, 6, 7, 0, 1, 2, 3});
  if (k == 2) return __builtin_shuffle(v, disc_i32x8{2, 3, 0, 1, 6, 7, 4, 5});
  return __builtin_shuffle(v, disc_i32x8{1, 0, 3, 2, 5, 4, 7, 6});
}
static inline disc_f32x8 disc_load8(const float* p) {
  disc_f32x8 v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
// Long reductions fold DISC_REDUCE_BLOCK elements at a time (eight lanes, then a
// tree), and combine the blocks pairwise: a binary counter of partial results in
// which level l holds the combination of 2^l blocks. A value then passes through
// O(BLOCK / 8 + log2(blocks)) roundings instead of one per element before it.
#define DISC_REDUCE_BLOCK 1024
#define DISC_CASCADE_FN inline
""" + CASCADE + r"""// acc + v with Neumaier's compensation: err collects what each add rounds off
// (a running sum, such as a cumsum, stays as accurate as a pairwise one).
static inline float disc_neumaier_add(float acc, float& err, float v) {
  const float s = acc + v;
  err += __builtin_fabsf(acc) >= __builtin_fabsf(v) ? (acc - s) + v : (v - s) + acc;
  return s;
}
// Eight lane accumulators combined as a tree.
template <typename T, typename F>
static inline T disc_tree8(const T* l, F comb) {
  return comb(comb(comb(l[0], l[4]), comb(l[2], l[6])), comb(comb(l[1], l[5]), comb(l[3], l[7])));
}
// Parts (tasks) each of `outputs` reductions over `reduced` elements is cut into:
// enough tasks for a large pool when there are few outputs, none shorter than
// 16384 elements. A function of the sizes only, so results never depend on the
// number of threads.
static inline int64_t disc_reduce_parts(int64_t outputs, int64_t reduced) {
  if (outputs <= 0 || outputs >= 128) return 1;
  int64_t parts = reduced / 16384;
  const int64_t cap = (256 + outputs - 1) / outputs;
  if (parts > cap) parts = cap;
  return parts > 1 ? parts : 1;
}
// One numpy-broadcast step of a dimension; clears *ok if incompatible.
static inline int64_t disc_bcast_dim(int64_t acc, int64_t d, bool* ok) {
  if (acc == d || d == 1) return acc;
  if (acc == 1) return d;
  *ok = false;
  return acc;
}
// Host index arithmetic of shape computations (TF semantics: floor division;
// a zero divisor yields 0 and is caught by the element-count checks).
static inline int64_t disc_floordiv(int64_t a, int64_t b) {
  if (b == 0) return 0;
  const int64_t q = a / b;
  return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static inline int64_t disc_ceildiv(int64_t a, int64_t b) {
  return b == 0 ? 0 : -disc_floordiv(-a, b);
}
static inline int64_t disc_rem(int64_t a, int64_t b) { return b == 0 ? 0 : a % b; }
static inline int64_t disc_max(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t disc_min(int64_t a, int64_t b) { return a < b ? a : b; }
// True if a buffer of these dims would not fit in int64 bytes (or a dim is
// negative). A zero dim makes any buffer empty, however large the others (TF
// returns an empty [2^62, 0] tensor).
static inline bool disc_size_overflows(const int64_t* dims, int n, int64_t itemsize) {
  for (int i = 0; i < n; ++i) {
    if (dims[i] < 0) return true;
  }
  for (int i = 0; i < n; ++i) {
    if (dims[i] == 0) return false;
  }
  int64_t total = itemsize;
  for (int i = 0; i < n; ++i) {
    if (__builtin_mul_overflow(total, dims[i], &total)) return true;
  }
  return false;
}
static int32_t disc_fail(disc_ral* ral, int32_t code, const char* message) {
  ral->set_error(ral, code, message);
  return 1;
}
// Formats "<prefix>[a,b] vs. [c,d]" and reports it as InvalidArgument.
static int32_t disc_fail_shapes(disc_ral* ral, const char* prefix, int n,
                                const int64_t* const* shapes, const int* ranks) {
  char msg[1024];
  int len = snprintf(msg, sizeof(msg), "%s", prefix);
  for (int i = 0; i < n && len < (int)sizeof(msg); ++i) {
    len += snprintf(msg + len, sizeof(msg) - len, "%s[", i ? " vs. " : "");
    for (int d = 0; d < ranks[i] && len < (int)sizeof(msg); ++d)
      len += snprintf(msg + len, sizeof(msg) - len, d ? ",%lld" : "%lld",
                      (long long)shapes[i][d]);
    if (len < (int)sizeof(msg)) len += snprintf(msg + len, sizeof(msg) - len, "]");
  }
  return disc_fail(ral, DISC_INVALID_ARGUMENT, msg);
}
// Formats "<prefix>In[0]: [a,b], In[1]: [c,d]" (TF's MatMul wording).
static int32_t disc_fail_matmul(disc_ral* ral, const char* prefix,
                                const int64_t* const* shapes, const int* ranks) {
  char msg[1024];
  int len = snprintf(msg, sizeof(msg), "%s", prefix);
  for (int i = 0; i < 2 && len < (int)sizeof(msg); ++i) {
    len += snprintf(msg + len, sizeof(msg) - len, "%sIn[%d]: [", i ? ", " : "", i);
    for (int d = 0; d < ranks[i] && len < (int)sizeof(msg); ++d)
      len += snprintf(msg + len, sizeof(msg) - len, d ? ",%lld" : "%lld",
                      (long long)shapes[i][d]);
    if (len < (int)sizeof(msg)) len += snprintf(msg + len, sizeof(msg) - len, "]");
  }
  return disc_fail(ral, DISC_INVALID_ARGUMENT, msg);
}
"""
