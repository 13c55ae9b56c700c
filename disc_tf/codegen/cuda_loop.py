"""The host runner of a loop cluster on CUDA: the CPU loop runner's logic
(``cpu_loop.py``) over device memory.

The body and the condition are CUDA clusters of their own, emitted under entry
names that also prefix their device symbols, so both live in one device module;
the artifact's function list is the body's, then the condition's, and a step's
child table adds its first index to every launch. Loop values are device memory:
a list read is a view of a row, a list write a device-to-device copy on the stream,
a constant loop variable is uploaded once. Reading a value on the host -- the
condition, a list index computed on the device -- waits for the stream
(``download``), once per step, as TensorFlow's own GPU While does.
"""

from __future__ import annotations

import dataclasses

from disc_tf.cluster.loops import LoopPlan
from disc_tf.codegen.cpu_loop import (
    LOOP_COMMON,
    LOOP_STACK,
    LOOP_STEP_IO,
    LoopFlavor,
    emit_loop_runner,
)
from disc_tf.codegen.cuda import cuda_exports, repr_c
from disc_tf.codegen.cuda_ops import DEVICE_PRELUDE
from disc_tf.sources import Sources, SourceUnit

#: Device memory: constants uploaded, lists written by copies on the stream, values
#: read on the host through a waiting download, steps through a child disc_ral_cuda.
CUDA_LOOP_MEMORY = r"""
disc_ral_cuda* cuda_of(disc_ral* ral) { return reinterpret_cast<disc_ral_cuda*>(ral); }

// A constant loop variable: uploaded into a temporary once.
Value const_value(disc_ral* ral, int32_t dtype, int32_t rank, const int64_t* dims,
                  const void* data) {
  Value v{};
  v.rank = rank;
  for (int k = 0; k < rank; ++k) v.dims[k] = dims[k];
  v.dtype = dtype;
  const int64_t bytes = bytes_of(v);
  v.data = ral->alloc_temp(ral, bytes > 0 ? bytes : 1);
  v.owned = true;
  if (v.data == nullptr ||
      (bytes > 0 && cuda_of(ral)->upload(cuda_of(ral), v.data, data, bytes) != 0)) {
    v.rank = -1;  // failed: the error is set; the runner stops before any launch
  }
  return v;
}

// An index held on the device, read on the host (waits for the stream).
int64_t index_value(disc_ral* ral, const Value& v) {
  if (v.dtype == DISC_I64) {
    int64_t x = -1;
    if (cuda_of(ral)->download(cuda_of(ral), &x, v.data, 8)) return -1;
    return x;
  }
  int32_t y = -1;
  if (cuda_of(ral)->download(cuda_of(ral), &y, v.data, 4)) return -1;
  return y;
}

// A boolean held on the device (the condition), read on the host into *go.
int32_t truth(disc_ral* ral, const Value& v, bool* go) {
  uint8_t b = 0;
  if (cuda_of(ral)->download(cuda_of(ral), &b, v.data, 1)) return 1;  // the error is set
  *go = b != 0;
  return 0;
}

// ---- the child table a step's runner (body or condition) sees
struct SubCall {
  disc_ral_cuda ral;  // first member: the runner's `cu` is this SubCall
  disc_ral_cuda* parent;
  int32_t first_function;  // the step's first device function in the artifact's list
  const Value* inputs;
  Value* outputs;
  const int32_t* output_dtypes;
};

SubCall* sub_of(disc_ral* r) { return reinterpret_cast<SubCall*>(r); }
SubCall* sub_of(disc_ral_cuda* r) { return reinterpret_cast<SubCall*>(r); }
disc_ral* parent_of(disc_ral* r) { return &sub_of(r)->parent->base; }
disc_ral_cuda* parent_of(disc_ral_cuda* r) { return sub_of(r)->parent; }

""" + LOOP_STEP_IO + r"""
int32_t sub_launch(disc_ral_cuda* r, int32_t function, uint32_t grid, uint32_t block,
                   uint32_t shared_bytes, void** params) {
  return parent_of(r)->launch(parent_of(r), function + sub_of(r)->first_function, grid, block,
                              shared_bytes, params);
}
void* sub_device_global(disc_ral_cuda* r, const char* name) {
  return parent_of(r)->device_global(parent_of(r), name);
}
int32_t sub_gemm_batched(disc_ral_cuda* r, int32_t dtype, int64_t batch, int64_t m, int64_t n,
                         int64_t k, const void* a, int64_t lda, int64_t sa, int32_t ta,
                         const void* b, int64_t ldb, int64_t sb, int32_t tb, void* c,
                         int64_t ldc, int64_t sc) {
  return parent_of(r)->gemm_batched(parent_of(r), dtype, batch, m, n, k, a, lda, sa, ta, b, ldb,
                                    sb, tb, c, ldc, sc);
}
int32_t sub_memset_zero(disc_ral_cuda* r, void* ptr, int64_t bytes) {
  return parent_of(r)->memset_zero(parent_of(r), ptr, bytes);
}
int32_t sub_copy(disc_ral_cuda* r, void* dst, const void* src, int64_t bytes) {
  return parent_of(r)->copy(parent_of(r), dst, src, bytes);
}
int32_t sub_upload(disc_ral_cuda* r, void* dst, const void* src, int64_t bytes) {
  return parent_of(r)->upload(parent_of(r), dst, src, bytes);
}
int32_t sub_download(disc_ral_cuda* r, void* dst, const void* src, int64_t bytes) {
  return parent_of(r)->download(parent_of(r), dst, src, bytes);
}

// Runs one step's runner on `inputs`; its outputs are new temporaries in `outputs`.
int32_t run_step(disc_ral* ral, int32_t (*entry)(disc_ral_cuda*), int32_t first_function,
                 const char* what, int32_t n_in, const Value* inputs, int32_t n_out,
                 Value* outputs, const int32_t* dtypes) {
  SubCall call;
  call.ral = *cuda_of(ral);  // the ABI versions, the stream; every service is ours below
  call.ral.base.num_inputs = n_in;
  call.ral.base.num_outputs = n_out;
  call.ral.base.input_rank = &sub_input_rank;
  call.ral.base.input_dims = &sub_input_dims;
  call.ral.base.input_dtype = &sub_input_dtype;
  call.ral.base.input_data = &sub_input_data;
  call.ral.base.alloc_output = &sub_alloc_output;
  call.ral.base.alloc_temp = &sub_alloc_temp;
  call.ral.base.free_temp = &sub_free_temp;
  call.ral.base.set_error = &sub_set_error;
  call.ral.launch = &sub_launch;
  call.ral.device_global = &sub_device_global;
  call.ral.gemm_batched = &sub_gemm_batched;
  call.ral.memset_zero = &sub_memset_zero;
  call.ral.copy = &sub_copy;
  call.ral.upload = &sub_upload;
  call.ral.download = &sub_download;
  call.parent = cuda_of(ral);
  call.first_function = first_function;
  call.inputs = inputs;
  call.outputs = outputs;
  call.output_dtypes = dtypes;
  unset_outputs(outputs, n_out);
  if (entry(&call.ral) != 0) return 1;
  (void)what;
  return outputs_set(ral, outputs, n_out);
}

// Memory: zeros, and a copy between two of the call's buffers, on the stream.
int32_t fill_zero(disc_ral* ral, void* data, int64_t bytes) {
  return bytes > 0 ? cuda_of(ral)->memset_zero(cuda_of(ral), data, bytes) : 0;
}
int32_t copy_bytes(disc_ral* ral, void* dst, const void* src, int64_t bytes) {
  return bytes > 0 ? cuda_of(ral)->copy(cuda_of(ral), dst, src, bytes) : 0;
}
"""


def emit_cuda_loop(plan: LoopPlan, body: Sources, body_entry: str, cond: Sources | None,
                   cond_entry: str | None, num_kernels: int) -> Sources:
    """The sources of a loop cluster on CUDA: the body's and the condition's device
    code in one module, their runners as units, and the loop runner."""
    steps = [(body_entry, body)] + ([(cond_entry, cond)] if cond is not None and cond_entry else [])
    offsets, functions = {}, []
    for entry, sources in steps:
        offsets[entry] = len(functions)
        functions += sources.functions
    # One device prelude for the module: each step's device source starts with it.
    device = "\n".join([body.device] + [s.device.replace(DEVICE_PRELUDE, "")
                                        for _, s in steps[1:]])
    names = ", ".join(repr_c(f) for f in functions) or "nullptr"
    flavor = LoopFlavor(
        '#include "disc_ral_cuda.h"', LOOP_COMMON + CUDA_LOOP_MEMORY + LOOP_STACK,
        "disc_ral_cuda",
        ('extern "C" int32_t disc_cuda_entry(disc_ral_cuda* cu) {',
         "  disc_ral* ral = &cu->base;  // the loop runner's services: the host's",
         "  if (cu->cuda_abi_version != DISC_RAL_CUDA_ABI_VERSION) {",
         '    ral->set_error(ral, DISC_INTERNAL, "CUDA RAL ABI version mismatch");',
         "    return 1;",
         "  }"),
        offsets)
    exports = (f"static const char* const kFunctions[] = {{{names}}};",
               *(x for x in cuda_exports(num_kernels, functions)  # ABI, kernels: the runner's
                 if "disc_abi_version(void)" not in x and "disc_num_kernels(void)" not in x))
    host = emit_loop_runner(plan, body_entry, cond_entry, num_kernels, flavor, exports)
    units = tuple(SourceUnit(entry, s.host, "") for entry, s in steps)
    return dataclasses.replace(
        body, device=device, host=host, units=units, functions=tuple(functions),
        device_globals=tuple(g for _, s in steps for g in s.device_globals),
        kernel_texts=tuple(t for _, s in steps for t in s.kernel_texts))
