"""The CPU backend's types and the C++ helpers every generated source defines.

Per-op expressions live in the op table (``disc_tf.ops.elementwise``): values are
held in a *compute type* (float for f16, so that every f16 op computes in float
and rounds once per op, as TensorFlow's CPU kernels do).
"""

from __future__ import annotations

from disc_tf.codegen.cpu_text import CASCADE
from disc_tf.ops import elementwise
from disc_tf.ops.elementwise import COMPUTE, literal

#: Storage type of each element type in generated C++.
STORAGE = {"f32": "float", "f16": "_Float16", "bf16": "disc_bf16", "i32": "int32_t",
           "i64": "int64_t", "i1": "bool", "f64": "double"}
#: RAL dtype constant of each element type.
RAL_DTYPE = {"f32": "DISC_F32", "f16": "DISC_F16", "bf16": "DISC_BF16", "i32": "DISC_I32",
             "i64": "DISC_I64", "i1": "DISC_BOOL"}
#: Bytes per element.
ITEMSIZE = {"f32": 4, "f16": 2, "bf16": 2, "i32": 4, "i64": 8, "i1": 1}

__all__ = ["COMPUTE", "STORAGE", "RAL_DTYPE", "ITEMSIZE", "PRELUDE", "VECTOR_MATH", "expression",
           "literal", "op_cost"]


def expression(op: str, args: list[str], elem: str, operand_elems: list[str],
               attrs: dict[str, str]) -> str:
    """The C++ expression computing DHLO ``op`` on compute-type ``args``."""
    try:
        return elementwise.expression(op, args, elem, operand_elems, attrs)
    except ValueError:
        raise ValueError(f"CPU codegen has no expression for DHLO op {op}") from None


def op_cost(op: str) -> int:
    """Rough cycles per element of DHLO ``op``, for the thread pool's cost model."""
    return elementwise.cost(op)


#: Declarations that let the compiler call glibc's vector math (libmvec) from
#: vectorized loops; must precede any use, outside any namespace.
VECTOR_MATH = elementwise.vector_math_declarations()

#: The libm functions and macros generated code uses, declared instead of including
#: <math.h>: in C++ that header brings <cmath>'s overloads and templates, 0.25 s of
#: parsing in every translation unit (a third of a small kernel unit's compile).
MATH = r"""extern "C" {
float expf(float) noexcept;
float logf(float) noexcept;
float tanhf(float) noexcept;
float sqrtf(float) noexcept;
float floorf(float) noexcept;
float ceilf(float) noexcept;
float nearbyintf(float) noexcept;
float log1pf(float) noexcept;
float expm1f(float) noexcept;
float sinf(float) noexcept;
float cosf(float) noexcept;
float tanf(float) noexcept;
float erff(float) noexcept;
float erfcf(float) noexcept;
float powf(float, float) noexcept;
float fmodf(float, float) noexcept;
float fabsf(float) noexcept;
}
#define INFINITY (__builtin_inff())
#define NAN (__builtin_nanf(""))
#define isfinite(x) __builtin_isfinite(x)
// expf within libmvec's fast range: its vector expf runs glibc's scalar expf (with its
// errno) for every lane outside about [-87.33, 87.33], 10-20x slower per element; a
// masked softmax's -1e9 scores are all below it. Below it the result is 0 (e^x is at
// most a denormal there, flushed); above it e^(x - 64 ln 2) * 2^64, up to infinity;
// NaN stays NaN. Selects of constants: it vectorizes. (A select of 0 or 1 alone lets
// GCC fold the clamp away and call expf on x itself.)
static inline float disc_expf(float x) {
  float c = x < -87.33f ? -87.33f : x;
  c = c > 130.0f ? 130.0f : c;
  const bool high = x > 87.0f;
  const float shift = high ? 44.3614196f : 0.0f;
  float scale = high ? 0x1p64f : 1.0f;
  scale = x < -87.33f ? 0.0f : scale;
  return expf(c - shift) * scale;
}
// 1 / (1 + e^-x) with e^-x's argument clamped into libmvec's fast range instead: below
// -87.33 e^-x adds nothing to 1; above 87.33 (x < -87.33) the result is 1.2e-38, and 0
// below x = -88 (TF's: at most a denormal there), so that x * sigmoid(x) is 0 or NaN as
// TF's for any huge x. (The zero's bound differs from the clamp's: with the same one GCC
// drops the clamp, which only that select's other arm reads, and calls expf on z.)
// The quotient is computed before the zero's select (in its arm, the libmvec call
// made the select 4-10% slower). Three selects where disc_expf's fix-ups cost five:
// GELU's epilogue (x * sigmoid) took 1.33-1.37 ns per element with disc_expf, about 1.0
// with this (AVX2 clone; docs/architecture.md, "*sigmoid*").
static inline float disc_sigmoidf(float x) {
  float z = -x;
  z = z < -87.33f ? -87.33f : z;
  z = z > 87.33f ? 87.33f : z;
  const float s = 1.0f / (1.0f + expf(z));
  return x < -88.0f ? 0.0f : s;
}"""

#: Helpers every generated source defines once.
PRELUDE = r"""
// Kernels are built for AVX-512, AVX2 and baseline x86-64; the loader picks
// the best the CPU has (GCC function multi-versioning). A build for one level
// (a JIT compile for its host) defines DISC_CLONES empty and passes -march.
#ifndef DISC_CLONES
#define DISC_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
// A kernel's entry points: called from the host runner's translation unit, not
// exported from the shared object.
#define DISC_ENTRY __attribute__((visibility("hidden")))
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
// Float to integer as TF's CPU Cast converts (x86's truncating conversion): NaN and
// values outside the type's range give its most negative value. Spelled out because C++
// leaves them undefined, and GCC (no trapping math) folds (float)(int32_t)x to truncf(x).
static inline int32_t disc_f2i32(float x) {
  return x >= -0x1p31f && x < 0x1p31f ? (int32_t)x : INT32_MIN;
}
static inline int64_t disc_f2i64(float x) {
  return x >= -0x1p63f && x < 0x1p63f ? (int64_t)x : INT64_MIN;
}
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
