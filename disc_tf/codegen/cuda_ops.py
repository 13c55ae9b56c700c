"""Types, per-op expressions and device helpers of the CUDA backend.

Values are computed in a *compute type* (float for f16 and bf16; every f16 or
bf16 op rounds its result once, as TensorFlow's kernels do). Expressions are
the CPU backend's (the CUDA math library has the same C names); bf16 is
handled here by rounding to bf16 where the CPU backend rounds to f16.
"""

from __future__ import annotations

from disc_tf.codegen.cpu_ops import literal
from disc_tf.codegen.cpu_text import CASCADE
from disc_tf.errors import CodegenError
from disc_tf.ops import elementwise


class CudaCodegenError(CodegenError):
    """The CUDA backend cannot generate code for a plan (an unsupported kernel
    kind, op or element type); the optimizer leaves the cluster as TF ops."""


#: Storage type of each element type in device code.
STORAGE = {"f32": "float", "f16": "__half", "bf16": "__nv_bfloat16", "i32": "int32_t",
           "i64": "int64_t", "i1": "bool", "f64": "double"}
#: Type values are computed in (f64 only accumulates products of floats).
COMPUTE = {"f32": "float", "f16": "float", "bf16": "float", "i32": "int32_t",
           "i64": "int64_t", "i1": "bool", "f64": "double"}
#: RAL dtype constant of each element type.
RAL_DTYPE = {"f32": "DISC_F32", "f16": "DISC_F16", "bf16": "DISC_BF16", "i32": "DISC_I32",
             "i64": "DISC_I64", "i1": "DISC_BOOL"}
#: Bytes per element.
ITEMSIZE = {"f32": 4, "f16": 2, "bf16": 2, "i32": 4, "i64": 8, "i1": 1}

_HALF = {"f16": "f16", "bf16": "f16"}


def check_elem(elem: str, where: str) -> None:
    """Raises CudaCodegenError for an element type the backend does not know."""
    if elem not in STORAGE:
        raise CudaCodegenError(f"CUDA codegen: {where}: element type {elem!r} is not supported")


def cuda_literal(value: object, elem: str) -> str:
    """A literal of ``value`` in the compute type of ``elem``."""
    check_elem(elem, "literal")
    return literal(value, "f32" if elem == "bf16" else elem)


def load(expr: str, elem: str) -> str:
    """Converts a stored element to its compute type."""
    if elem == "f16":
        return f"__half2float({expr})"
    if elem == "bf16":
        return f"__bfloat162float({expr})"
    return f"({COMPUTE[elem]})({expr})"


def store(expr: str, elem: str) -> str:
    """Converts a compute-type value to its storage type."""
    if elem == "f16":
        return f"__float2half_rn({expr})"
    if elem == "bf16":
        return f"__float2bfloat16_rn({expr})"
    return f"({STORAGE[elem]})({expr})"


def dims_offset(dims: list[int], indent: str, rem: str = "rem", off: str = "base") -> list[str]:
    """Device lines adding to ``off`` input 0's offset of the coordinates ``rem`` holds
    over ``dims`` (innermost last), dividing ``rem`` down dim by dim (``disc_divmod``)."""
    return [f"{indent}{off} += disc_divmod({rem}, a.dims[{d}]) * a.in0_strides[{d}];"
            for d in reversed(dims)]


def cuda_expression(op: str, args: list[str], elem: str, operand_elems: list[str],
                    attrs: dict) -> str:
    """The device expression computing DHLO ``op`` on compute-type ``args``."""
    for e in [elem, *operand_elems]:
        check_elem(e, f"op {op}")
    if op == "convert" and "bf16" in (elem, *operand_elems):
        a, src = args[0], operand_elems[0]
        if elem == "i1":
            return f"({a} != 0)"
        if src == elem:
            return a
        if elem in _HALF:
            return f"disc_round_{elem}((float)({a}))"
        if elem in ("i32", "i64"):  # from bf16: saturated, NaN to 0, as a GPU converts
            return f"disc_f2{elem}({a})"
        return f"{COMPUTE[elem]}({a})"
    try:
        text = elementwise.expression(op, args, _HALF.get(elem, elem),
                                      [_HALF.get(e, e) for e in operand_elems], attrs, backend="cuda")
    except (ValueError, KeyError) as e:
        raise CudaCodegenError(f"CUDA codegen has no expression for DHLO op {op}: {e}") from e
    if elem == "bf16":
        text = text.replace("disc_round_f16(", "disc_round_bf16(")
    return text


#: Device helpers every generated device source defines once.
DEVICE_PRELUDE = r"""
#include <stdint.h>
#include <math.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#define DISC_DEV static __device__ __forceinline__
DISC_DEV float disc_round_f16(float x) { return __half2float(__float2half_rn(x)); }
DISC_DEV float disc_round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
// Float to integer as a GPU converts (and TF's GPU Cast): saturating, NaN to 0.
// Spelled out so that the emulator, on the CPU, computes the same.
DISC_DEV int32_t disc_f2i32(float x) {
  return x != x ? 0 : x < -0x1p31f ? INT32_MIN : x >= 0x1p31f ? INT32_MAX : (int32_t)x;
}
DISC_DEV int64_t disc_f2i64(float x) {
  return x != x ? 0 : x < -0x1p63f ? INT64_MIN : x >= 0x1p63f ? INT64_MAX : (int64_t)x;
}
// NaN-propagating max/min, as TensorFlow's Maximum/Minimum.
DISC_DEV float disc_max(float a, float b) { return (a > b || a != a) ? a : b; }
DISC_DEV float disc_min(float a, float b) { return (a < b || a != a) ? a : b; }
// Index arithmetic: idx = rem % dim, rem /= dim, in 32 bits when both fit (a GPU
// divides 64-bit integers in a software routine several times as long).
DISC_DEV int64_t disc_divmod(int64_t& rem, int64_t dim) {
  if ((((uint64_t)rem | (uint64_t)dim) >> 32) == 0) {
    const uint32_t q = (uint32_t)rem / (uint32_t)dim;
    const int64_t idx = (int64_t)((uint32_t)rem - q * (uint32_t)dim);
    rem = (int64_t)q;
    return idx;
  }
  const int64_t q = rem / dim, idx = rem - q * dim;
  rem = q;
  return idx;
}
// Butterfly exchange inside a warp for every compute type.
DISC_DEV float disc_shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
DISC_DEV int32_t disc_shfl_xor(int32_t v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
DISC_DEV int64_t disc_shfl_xor(int64_t v, int m) {
  return (int64_t)__shfl_xor_sync(0xffffffffu, (long long)v, m);
}
DISC_DEV bool disc_shfl_xor(bool v, int m) { return __shfl_xor_sync(0xffffffffu, (int)v, m) != 0; }
DISC_DEV double disc_shfl_xor(double v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
// A thread's long sum (or product) folds DISC_THREAD_BLOCK of its elements at a
// time and combines the blocks pairwise: level l of this binary counter holds
// the combination of 2^l blocks, so the rounding error grows with the log of
// the length, not the length (a float running sum of 2^24 ones stops at 2^24).
#define DISC_THREAD_BLOCK 64
#define DISC_CASCADE_FN __device__
""" + CASCADE + r"""// Dynamic shared memory of a launch (an embedder may predefine this).
#ifndef DISC_DYNAMIC_SMEM
#define DISC_DYNAMIC_SMEM(name) extern __shared__ double name[]
#endif
// acc + v with Neumaier's compensation: err collects what each add rounds off.
DISC_DEV float disc_neumaier_add(float acc, float& err, float v) {
  const float s = acc + v;
  err += fabsf(acc) >= fabsf(v) ? (acc - s) + v : (v - s) + acc;
  return s;
}
// Pointers of an argument struct: typed here, void in the host runner.
#define DISC_IN(T) const T*
#define DISC_OUT(T) T*
// N elements loaded or stored as one aligned access.
template <typename T, int N>
struct alignas(sizeof(T) * N) disc_vec { T v[N]; };
"""

#: Host-runner helpers (C++ compiled by the host compiler; no CUDA headers).
HOST_PRELUDE = r"""
// Blocks of a 1-D grid-stride launch: enough to fill the GPU, at most `cap`.
static inline uint32_t disc_grid(int64_t work, int64_t per_block, int64_t cap) {
  int64_t g = (work + per_block - 1) / per_block;
  if (g < 1) g = 1;
  return (uint32_t)(g < cap ? g : cap);
}
// Pointers of an argument struct: the device code's types are not known here.
#define DISC_IN(T) const void*
#define DISC_OUT(T) void*
static inline bool disc_aligned(const void* p, uint64_t bytes) {
  return ((uint64_t)(uintptr_t)p % bytes) == 0;
}
// Merges adjacent dims of a strided elementwise kernel that every input reads as one
// run (stride[d] == stride[d + 1] * dims[d + 1], or either dim of size 1), keeping the
// row-major order of the elements: the merged dims end at rank - 1 and the dims before
// them become 1 (stride 0). E.g. a bias [12, 64] added to [b, s, 12, 64]: [1, 1, b*s, 768],
// one block per row of 768 instead of a division per dim for every element.
static inline void disc_collapse_dims(int rank, int64_t* dims, int inputs, int64_t** strides) {
  int w = rank - 1;  // the dim being merged into
  for (int d = rank - 2; d >= 0; --d) {
    bool merge = true;
    if (dims[d] != 1 && dims[w] != 1) {
      for (int j = 0; j < inputs && merge; ++j) merge = strides[j][d] == strides[j][w] * dims[w];
    }
    if (merge) {
      if (dims[w] == 1) {
        for (int j = 0; j < inputs; ++j) strides[j][w] = strides[j][d];
      }
      dims[w] *= dims[d];
    } else {
      --w;
      dims[w] = dims[d];
      for (int j = 0; j < inputs; ++j) strides[j][w] = strides[j][d];
    }
  }
  for (int d = w - 1; d >= 0; --d) {
    dims[d] = 1;
    for (int j = 0; j < inputs; ++j) strides[j][d] = 0;
  }
}
"""
