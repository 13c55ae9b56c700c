"""The host runner of a loop cluster (``cluster/loops.py``): the While runs here.

The body and the condition are clusters of their own, compiled as usual but under
entry names of their own; this runner calls them once per step through a child RAL
table whose inputs are the loop's values (loop variables, rows of an unstacked
tensor, variables' values) and whose outputs are new temporaries of the call. A
written list is one buffer: the stacked result itself when the loop's caller reads
it. Every service the child table offers other than inputs and outputs (temporaries,
the thread pool, GEMMs, errors) is the parent's.
"""

from __future__ import annotations

import dataclasses
import hashlib

import tensorflow as tf

from disc_tf.cluster.loops import Index, LoopPlan, Ref
from disc_tf.codegen.cpu import CODEGEN_VERSION, ENTRY, artifact_exports
from disc_tf.codegen.cpu_text import comment
from disc_tf.sources import Sources, SourceUnit

#: The support code of every loop runner, in three parts: values and the lists' rows
#: (LOOP_COMMON), what touches their memory (CPU_LOOP_MEMORY here; the CUDA backend has
#: its own: ``cuda_loop.py``), and list writes, stacking and results (LOOP_STACK).
LOOP_COMMON = r"""
constexpr int kMaxRank = 8;

// One tensor the loop holds: a loop variable, a step's input or output.
struct Value {
  int32_t rank;
  int64_t dims[kMaxRank];
  int32_t dtype;
  void* data;
  bool owned;  // a temporary of this call, freed once no loop variable holds it
};

int64_t dtype_bytes(int32_t dtype) {
  switch (dtype) {
    case DISC_I64: return 8;
    case DISC_BOOL: return 1;
    case DISC_F16: case DISC_BF16: return 2;
    default: return 4;
  }
}

int64_t bytes_of(const Value& v) {
  int64_t n = dtype_bytes(v.dtype);
  for (int k = 0; k < v.rank; ++k) n *= v.dims[k];
  return n;
}

int32_t fail(disc_ral* ral, const char* what, const char* message) {
  char text[256];
  snprintf(text, sizeof text, "%s: %s", what, message);
  ral->set_error(ral, DISC_INVALID_ARGUMENT, text);
  return 1;
}

Value input_value(disc_ral* ral, int32_t i) {
  Value v{};
  v.rank = ral->input_rank(ral, i);
  const int64_t* dims = ral->input_dims(ral, i);
  for (int k = 0; k < v.rank && k < kMaxRank; ++k) v.dims[k] = dims[k];
  v.dtype = ral->input_dtype(ral, i);
  v.data = const_cast<void*>(ral->input_data(ral, i));
  return v;
}

// A step's outputs before its runner sets them (rank -1: not set).
void unset_outputs(Value* outputs, int32_t n) {
  for (int32_t k = 0; k < n; ++k) {
    outputs[k] = Value{};
    outputs[k].rank = -1;
  }
}

// 0 if the step's runner set every output, else an error.
int32_t outputs_set(disc_ral* ral, const Value* outputs, int32_t n) {
  for (int32_t k = 0; k < n; ++k) {
    if (outputs[k].rank < 0) {
      ral->set_error(ral, DISC_INTERNAL, "loop step: the runner left an output unset");
      return 1;
    }
  }
  return 0;
}

// Frees each temporary of `old` that no value of `keep` holds, once.
void release(disc_ral* ral, const Value* old, int n_old, const Value* keep, int n_keep) {
  for (int i = 0; i < n_old; ++i) {
    if (!old[i].owned || old[i].data == nullptr) continue;
    bool held = false;
    for (int k = 0; k < n_keep && !held; ++k) held = keep[k].data == old[i].data;
    for (int k = 0; k < i && !held; ++k) held = old[k].owned && old[k].data == old[i].data;
    if (!held) ral->free_temp(ral, old[i].data);
  }
}

// ---- TensorLists: the rows of one buffer
struct List {
  Value all;            // [count, element dims...]
  int64_t count;
  int64_t row_bytes;
  bool ready;           // the buffer exists (an unstacked tensor, or the first write made it)
  int32_t output;       // the cluster output the buffer is (its Stack), or -1
  int32_t shape_rank;   // the element shape the list ops declare (-1: any rank)
  int64_t shape[kMaxRank];  // -1: any size
};

bool shape_fits(const List& l, int32_t rank, const int64_t* dims) {
  if (l.shape_rank < 0) return true;
  if (rank != l.shape_rank) return false;
  for (int k = 0; k < rank; ++k) {
    if (l.shape[k] >= 0 && l.shape[k] != dims[k]) return false;
  }
  return true;
}

int32_t list_from_tensor(disc_ral* ral, List* l, const Value& t) {
  if (t.rank < 0) return 1;  // a constant whose copy failed (the error is set)
  if (t.rank < 1) return fail(ral, "TensorListFromTensor", "the tensor is a scalar");
  if (!shape_fits(*l, t.rank - 1, t.dims + 1)) {
    return fail(ral, "TensorListFromTensor", "the rows do not have the declared element shape");
  }
  l->all = t;
  l->count = t.dims[0];
  l->row_bytes = l->count > 0 ? bytes_of(t) / l->count : 0;
  l->ready = true;
  return 0;
}

int32_t list_reserve(disc_ral* ral, List* l, int64_t count) {
  if (count < 0) return fail(ral, "TensorListReserve", "the number of elements is negative");
  l->count = count;
  return 0;
}

// The element at `index` of an unstacked list: a view of its row.
int32_t list_item(disc_ral* ral, const List& l, int64_t index, Value* item) {
  if (index < 0 || index >= l.count) {
    return fail(ral, "TensorListGetItem", "the index is out of the list's range");
  }
  *item = l.all;
  item->rank = l.all.rank - 1;
  for (int k = 0; k < item->rank; ++k) item->dims[k] = l.all.dims[k + 1];
  item->data = static_cast<char*>(l.all.data) + index * l.row_bytes;
  item->owned = false;
  return 0;
}

"""

#: A step's inputs, outputs, temporaries and errors through its child table: the same
#: for both backends' SubCall (each defines ``sub_of`` and ``parent_of(disc_ral*)``).
LOOP_STEP_IO = r"""
int32_t sub_input_rank(disc_ral* r, int32_t i) { return sub_of(r)->inputs[i].rank; }
const int64_t* sub_input_dims(disc_ral* r, int32_t i) { return sub_of(r)->inputs[i].dims; }
int32_t sub_input_dtype(disc_ral* r, int32_t i) { return sub_of(r)->inputs[i].dtype; }
const void* sub_input_data(disc_ral* r, int32_t i) { return sub_of(r)->inputs[i].data; }

void* sub_alloc_output(disc_ral* r, int32_t i, int32_t rank, const int64_t* dims) {
  SubCall* s = sub_of(r);
  Value& v = s->outputs[i];
  if (rank > kMaxRank) {
    parent_of(r)->set_error(parent_of(r), DISC_INTERNAL, "loop step: an output's rank is too large");
    return nullptr;
  }
  v.rank = rank;
  for (int k = 0; k < rank; ++k) v.dims[k] = dims[k];
  v.dtype = s->output_dtypes[i];
  v.data = parent_of(r)->alloc_temp(parent_of(r), bytes_of(v));
  v.owned = true;
  return v.data;
}

void* sub_alloc_temp(disc_ral* r, int64_t bytes) {
  return parent_of(r)->alloc_temp(parent_of(r), bytes);
}
void sub_free_temp(disc_ral* r, void* ptr) { parent_of(r)->free_temp(parent_of(r), ptr); }
void sub_set_error(disc_ral* r, int32_t code, const char* message) {
  parent_of(r)->set_error(parent_of(r), code, message);
}
"""

#: Host memory: constants in place, lists written with memcpy, steps through a child
#: disc_ral table.
CPU_LOOP_MEMORY = r"""
Value const_value(disc_ral*, int32_t dtype, int32_t rank, const int64_t* dims, const void* data) {
  Value v{};
  v.rank = rank;
  for (int k = 0; k < rank; ++k) v.dims[k] = dims[k];
  v.dtype = dtype;
  v.data = const_cast<void*>(data);
  return v;
}

int64_t index_value(disc_ral*, const Value& v) {
  return v.dtype == DISC_I64 ? *static_cast<const int64_t*>(v.data)
                             : *static_cast<const int32_t*>(v.data);
}

int32_t truth(disc_ral*, const Value& v, bool* go) {
  *go = *static_cast<const uint8_t*>(v.data) != 0;
  return 0;
}

// ---- the child RAL table a step's runner (body or condition) sees
struct SubCall {
  disc_ral ral;  // first member: the runner's `ral` is this SubCall
  disc_ral* parent;
  const Value* inputs;
  Value* outputs;
  const int32_t* output_dtypes;
};

SubCall* sub_of(disc_ral* r) { return reinterpret_cast<SubCall*>(r); }
disc_ral* parent_of(disc_ral* r) { return sub_of(r)->parent; }

""" + LOOP_STEP_IO + r"""
void sub_parallel_for(disc_ral* r, int64_t total, double cost, disc_range_fn fn, void* closure) {
  parent_of(r)->parallel_for(parent_of(r), total, cost, fn, closure);
}
void sub_sgemm_batched(disc_ral* r, int64_t batch, int64_t m, int64_t n, int64_t k,
                       const float* a, int64_t lda, int64_t sa, int ta, const float* b,
                       int64_t ldb, int64_t sb, int tb, float* c, int64_t ldc, int64_t sc) {
  parent_of(r)->sgemm_batched(parent_of(r), batch, m, n, k, a, lda, sa, ta, b, ldb, sb, tb, c,
                              ldc, sc);
}
void sub_sgemm_strided(disc_ral* r, int64_t bo, int64_t bi, int64_t m, int64_t n, int64_t k,
                       const float* a, int64_t lda, int64_t sao, int64_t sai, int ta,
                       const float* b, int64_t ldb, int64_t sbo, int64_t sbi, int tb, float* c,
                       int64_t ldc, int64_t sco, int64_t sci) {
  parent_of(r)->sgemm_strided(parent_of(r), bo, bi, m, n, k, a, lda, sao, sai, ta, b, ldb, sbo,
                              sbi, tb, c, ldc, sco, sci);
}
void sub_sgemm_epilogue(disc_ral* r, int64_t bo, int64_t bi, int64_t m, int64_t n, int64_t k,
                        const float* a, int64_t lda, int64_t sao, int64_t sai, int ta,
                        const float* b, int64_t ldb, int64_t sbo, int64_t sbi, int tb,
                        float* c, int64_t ldc, int64_t sco, int64_t sci,
                        disc_gemm_epilogue_fn epilogue, void* closure, int32_t full_rows,
                        int32_t accumulate) {
  parent_of(r)->sgemm_epilogue(parent_of(r), bo, bi, m, n, k, a, lda, sao, sai, ta, b, ldb, sbo,
                               sbi, tb, c, ldc, sco, sci, epilogue, closure, full_rows,
                               accumulate);
}
void sub_sgemm_rows(disc_ral* r, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                    int ta, const float* b, int64_t ldb, int tb, float* c, int64_t ldc,
                    int32_t accumulate) {
  parent_of(r)->sgemm_rows(parent_of(r), m, n, k, a, lda, ta, b, ldb, tb, c, ldc, accumulate);
}
void sub_sgemm_shared_a(disc_ral* r, int32_t count, int64_t m, int64_t k, const float* a,
                        int64_t lda, const float* const* b, const int64_t* ldb,
                        const int32_t* tb, const int64_t* n, float* const* c,
                        const int64_t* ldc, disc_gemm_epilogue_fn epilogue, void* closure) {
  parent_of(r)->sgemm_shared_a(parent_of(r), count, m, k, a, lda, b, ldb, tb, n, c, ldc,
                               epilogue, closure);
}
int32_t sub_conv1d_winograd(disc_ral* r, int64_t batch, int64_t width, int64_t ci, int64_t co,
                            int64_t kw, int64_t pad, int64_t ow, const float* x, const float* w,
                            float* c, disc_gemm_epilogue_fn epilogue, void* closure,
                            int32_t full_rows) {
  return parent_of(r)->conv1d_winograd(parent_of(r), batch, width, ci, co, kw, pad, ow, x, w, c,
                                       epilogue, closure, full_rows);
}
void sub_sgemm_scratch_c(disc_ral* r, int64_t bo, int64_t bi, int64_t m, int64_t n, int64_t k,
                         const float* a, int64_t lda, int64_t sao, int64_t sai, int ta,
                         const float* b, int64_t ldb, int64_t sbo, int64_t sbi, int tb,
                         disc_gemm_scratch_fn fn, void* closure) {
  parent_of(r)->sgemm_scratch_c(parent_of(r), bo, bi, m, n, k, a, lda, sao, sai, ta, b, ldb,
                                sbo, sbi, tb, fn, closure);
}
void sub_sgemm_scratch_c_cols(disc_ral* r, int64_t bo, int64_t bi, int64_t m, int64_t n,
                              int64_t k, const float* a, int64_t lda, int64_t sao, int64_t sai,
                              int ta, const float* b, int64_t ldb, int64_t sbo, int64_t sbi,
                              int tb, disc_gemm_scratch_fn fn, void* closure,
                              disc_gemm_cols_fn cols) {
  parent_of(r)->sgemm_scratch_c_cols(parent_of(r), bo, bi, m, n, k, a, lda, sao, sai, ta, b,
                                     ldb, sbo, sbi, tb, fn, closure, cols);
}
void sub_sgemm_gathered_a(disc_ral* r, int64_t m, int64_t n, int64_t k, disc_gemm_gather_fn rows,
                          void* rows_closure, const float* b, int64_t ldb, float* c, int64_t ldc,
                          disc_gemm_epilogue_fn epilogue, void* closure, int32_t full_rows) {
  parent_of(r)->sgemm_gathered_a(parent_of(r), m, n, k, rows, rows_closure, b, ldb, c, ldc,
                                 epilogue, closure, full_rows);
}
void sub_sgemm_layers(disc_ral* r, int64_t m, int64_t k, const float* a, int64_t lda,
                      int32_t count, const disc_gemm_layer* layers) {
  parent_of(r)->sgemm_layers(parent_of(r), m, k, a, lda, count, layers);
}

// A step's inputs are not the cluster's: nothing of a step is kept across calls.
int32_t sub_fold_begin(disc_ral*, int32_t, const int32_t*, int32_t, const int64_t*, int32_t,
                       const int64_t*, int32_t, void**) {
  return -1;
}
void sub_fold_done(disc_ral*, int32_t) {}

// Runs one step's runner on `inputs`; its outputs are new temporaries in `outputs`.
int32_t run_step(disc_ral* ral, int32_t (*entry)(disc_ral*), const char* what, int32_t n_in,
                 const Value* inputs, int32_t n_out, Value* outputs, const int32_t* dtypes) {
  SubCall call;
  call.ral = *ral;  // the ABI version and every service, then ours
  call.ral.num_inputs = n_in;
  call.ral.num_outputs = n_out;
  call.ral.input_rank = &sub_input_rank;
  call.ral.input_dims = &sub_input_dims;
  call.ral.input_dtype = &sub_input_dtype;
  call.ral.input_data = &sub_input_data;
  call.ral.alloc_output = &sub_alloc_output;
  call.ral.alloc_temp = &sub_alloc_temp;
  call.ral.free_temp = &sub_free_temp;
  call.ral.parallel_for = &sub_parallel_for;
  call.ral.set_error = &sub_set_error;
  call.ral.sgemm_batched = &sub_sgemm_batched;
  call.ral.sgemm_strided = &sub_sgemm_strided;
  call.ral.sgemm_epilogue = &sub_sgemm_epilogue;
  call.ral.sgemm_rows = &sub_sgemm_rows;
  call.ral.sgemm_shared_a = &sub_sgemm_shared_a;
  call.ral.conv1d_winograd = &sub_conv1d_winograd;
  call.ral.sgemm_scratch_c = &sub_sgemm_scratch_c;
  call.ral.sgemm_gathered_a = &sub_sgemm_gathered_a;
  call.ral.sgemm_scratch_c_cols = &sub_sgemm_scratch_c_cols;
  call.ral.sgemm_layers = &sub_sgemm_layers;
  call.ral.fold_begin = &sub_fold_begin;
  call.ral.fold_done = &sub_fold_done;
  call.parent = ral;
  call.inputs = inputs;
  call.outputs = outputs;
  call.output_dtypes = dtypes;
  unset_outputs(outputs, n_out);
  if (entry(&call.ral) != 0) return 1;
  return outputs_set(ral, outputs, n_out);
}

// Memory: zeros, and a copy between two of the call's buffers.
int32_t fill_zero(disc_ral*, void* data, int64_t bytes) {
  if (bytes > 0) memset(data, 0, bytes);
  return 0;
}
int32_t copy_bytes(disc_ral*, void* dst, const void* src, int64_t bytes) {
  if (bytes > 0) memcpy(dst, src, bytes);
  return 0;
}
"""

#: Lists written and stacked, results copied out (through the memory half's
#: fill_zero and copy_bytes).
LOOP_STACK = r"""
int32_t list_make(disc_ral* ral, List* l, int32_t elem_rank, const int64_t* elem_dims) {
  if (elem_rank + 1 > kMaxRank) return fail(ral, "TensorListSetItem", "the element rank is too large");
  l->all.rank = elem_rank + 1;
  l->all.dims[0] = l->count;
  for (int k = 0; k < elem_rank; ++k) l->all.dims[k + 1] = elem_dims[k];
  const int64_t bytes = bytes_of(l->all);
  l->all.data = l->output >= 0 ? ral->alloc_output(ral, l->output, l->all.rank, l->all.dims)
                               : ral->alloc_temp(ral, bytes);
  if (l->all.data == nullptr && bytes > 0) return 1;  // the allocator set the error
  l->all.owned = l->output < 0;
  // Elements never written are zeros, as in TF.
  if (fill_zero(ral, l->all.data, bytes)) return 1;
  l->row_bytes = l->count > 0 ? bytes / l->count : 0;
  l->ready = true;
  return 0;
}

// Copies `v` into row `index` (the first write makes the buffer, with v's shape).
int32_t list_set(disc_ral* ral, List* l, int64_t index, const Value& v) {
  if (index < 0 || index >= l->count) {
    return fail(ral, "TensorListSetItem", "the index is out of the list's range");
  }
  if (!shape_fits(*l, v.rank, v.dims)) {
    return fail(ral, "TensorListSetItem", "the element does not have the list's element shape");
  }
  if (!l->ready && list_make(ral, l, v.rank, v.dims) != 0) return 1;
  bool same = v.rank + 1 == l->all.rank;
  for (int k = 0; same && k < v.rank; ++k) same = v.dims[k] == l->all.dims[k + 1];
  if (!same) return fail(ral, "TensorListSetItem", "the element's shape differs from the others'");
  return copy_bytes(ral, static_cast<char*>(l->all.data) + index * l->row_bytes, v.data,
                    l->row_bytes);
}

int32_t copy_out(disc_ral* ral, int32_t k, const Value& v) {
  void* out = ral->alloc_output(ral, k, v.rank, v.dims);
  const int64_t bytes = bytes_of(v);
  if (out == nullptr && bytes > 0) return 1;
  return copy_bytes(ral, out, v.data, bytes);
}

// The stacked result of a written list once the loop is done.
int32_t list_stack(disc_ral* ral, List* l, int64_t num_elements) {
  if (num_elements >= 0 && num_elements != l->count) {
    return fail(ral, "TensorListStack", "the list does not have num_elements elements");
  }
  if (l->ready) return 0;
  bool defined = l->shape_rank >= 0;
  for (int k = 0; defined && k < l->shape_rank; ++k) defined = l->shape[k] >= 0;
  if (!defined) {
    return fail(ral, "TensorListStack",
                "no element was set and the element shape is not fully defined");
  }
  return list_make(ral, l, l->shape_rank, l->shape);
}

"""

LOOP_PRELUDE = LOOP_COMMON + CPU_LOOP_MEMORY + LOOP_STACK


def _code(dtype: tf.DType) -> int:
    return dtype.as_datatype_enum


def _index(at: Index) -> str:
    return f"index_value(ral, v[{at.slot}])" if at.slot is not None else str(at.const)


class _Step:
    """Emits the expressions of one step's references, with the statements reading
    list elements first."""

    def __init__(self, lines: list[str]) -> None:
        self.lines, self.outputs, self.items = lines, "", 0

    def value(self, ref: Ref) -> str:
        if ref.kind == "slot":
            return f"v[{ref.index}]"
        if ref.kind == "out":
            return f"{self.outputs}[{ref.index}]"
        name = f"item{self.items}"
        self.items += 1
        self.lines.append(f"    Value {name};")
        self.lines.append(f"    if (list_item(ral, list[{ref.index}], {_index(ref.at)}, "
                          f"&{name})) return 1;")
        return name


@dataclasses.dataclass(frozen=True)
class LoopFlavor:
    """What differs between the loop runners of the backends: the RAL header, the
    memory half of the prelude, the steps' entry type, the runner's exports and entry."""

    header: str
    prelude: str
    #: the type a step's runner takes ("disc_ral" or "disc_ral_cuda")
    step_ral: str
    #: lines opening the runner's entry function; they define ``disc_ral* ral``
    entry_open: tuple[str, ...]
    #: each step's first device function in the artifact's function list (CUDA launches
    #: index it); None: a step's call takes no offset
    offsets: dict[str, int] | None = None


CPU_FLAVOR = LoopFlavor('#include "disc_ral.h"', LOOP_PRELUDE, "disc_ral",
                        (f'extern "C" int32_t {ENTRY}(disc_ral* ral) {{',))


def emit_loop_runner(plan: LoopPlan, body_entry: str, cond_entry: str | None,
                     num_kernels: int, flavor: LoopFlavor = CPU_FLAVOR,
                     exports: tuple[str, ...] = ()) -> str:
    """The C++ host runner (``disc_entry``, or the flavor's entry) running ``plan``'s
    loop over the runners ``body_entry`` and ``cond_entry`` (None: the condition is a
    loop variable); ``exports``: lines after the ABI and kernel-count exports."""
    n = len(plan.slots)
    out = [f"// Generated by disc_tf ({CODEGEN_VERSION}) for loop cluster "
           f"'{comment(plan.name)}': While {comment(plan.while_node)}.",
           "// The loop runs here: the condition's runner, then the body's, each step.",
           *[f"//   {comment(line)}" for line in plan.describe().splitlines()],
           "#include <stdint.h>", "#include <stdio.h>", "#include <string.h>",
           flavor.header, "",
           f'extern "C" int32_t {body_entry}({flavor.step_ral}* ral);']
    if cond_entry:
        out.append(f'extern "C" int32_t {cond_entry}({flavor.step_ral}* ral);')
    out += ["", "namespace {", flavor.prelude.strip("\n"), "", "}  // namespace", ""]
    out += artifact_exports(num_kernels) + list(exports)

    def runner(entry: str) -> str:
        offset = f", {flavor.offsets[entry]}" if flavor.offsets is not None else ""
        return f"{entry}{offset}"

    out += ["", *flavor.entry_open,
            f"  if (ral->num_inputs != {len(plan.input_dtypes)} || "
            f"ral->num_outputs != {len(plan.output_dtypes)}) {{",
            f'    return fail(ral, "{plan.name}", "wrong number of inputs or outputs");',
            "  }"]
    for i, dtype in enumerate(plan.input_dtypes):
        out.append(f"  if (ral->input_dtype(ral, {i}) != {_code(dtype)}) "
                   f'return fail(ral, "{plan.name}", "input {i} is not {dtype.name}");')
    out.append("  // ---- the loop variables before the first step")
    out.append(f"  Value v[{n}] = {{}};")
    out.append(f"  List list[{n}] = {{}};")
    for j, slot in enumerate(plan.slots):
        out.append(f"  // v{j}: {comment(slot.describe())}")
        if slot.kind == "write_list" and slot.const is not None:  # a constant count
            source = None
        elif slot.const is not None:
            dims, values = slot.const
            st = "int64_t" if slot.dtype == tf.int64 else "int32_t" if slot.dtype == tf.int32 \
                else "float" if slot.dtype == tf.float32 else "uint8_t"
            text = ", ".join(str(int(x)) if st != "float" else repr(float(x)) + "f"
                             for x in values) or "0"
            out.append(f"  static const {st} v{j}_data[] = {{{text}}};")
            out.append(f"  static const int64_t v{j}_dims[] = {{{', '.join(map(str, dims)) or '0'}}};")
            source = f"const_value(ral, {_code(slot.dtype)}, {len(dims)}, v{j}_dims, v{j}_data)"
        else:
            source = f"input_value(ral, {slot.input})"
        if slot.kind in ("tensor", "variable"):
            out.append(f"  v[{j}] = {source};")
            if slot.const is not None:  # a constant's copy may fail (device memory)
                out.append(f"  if (v[{j}].rank < 0) return 1;")
            continue
        shape = slot.element_shape
        out.append(f"  list[{j}].output = {slot.output if slot.output is not None else -1};")
        out.append(f"  list[{j}].shape_rank = {len(shape) if shape is not None else -1};")
        out += [f"  list[{j}].shape[{k}] = {d};" for k, d in enumerate(shape or ())]
        out.append(f"  list[{j}].all.dtype = {_code(slot.dtype)};")
        if slot.kind == "read_list":
            out.append(f"  if (list_from_tensor(ral, &list[{j}], {source})) return 1;")
        else:
            count = f"index_value(ral, {source})" if source else str(int(slot.const[1][0]))
            out.append(f"  if (list_reserve(ral, &list[{j}], {count})) return 1;")
    out.append("  for (;;) {")
    step = _Step(out)
    if cond_entry:
        step.outputs = "cond_out"
        out.append("    // the condition")
        args = [step.value(r) for r in plan.cond_inputs]
        dtypes = ", ".join(str(_code(d)) for d in plan.cond_output_dtypes)
        out.append(f"    const Value cond_in[] = {{{', '.join(args) or 'Value{}'}}};")
        out.append(f"    static const int32_t cond_dtypes[] = {{{dtypes}}};")
        out.append(f"    Value cond_out[{len(plan.cond_output_dtypes)}];")
        out.append(f'    if (run_step(ral, {runner(cond_entry)}, "condition", {len(args)}, cond_in, '
                   f"{len(plan.cond_output_dtypes)}, cond_out, cond_dtypes)) return 1;")
        result = step.value(plan.cond_result)
        out.append("    bool go = false;")
        out.append(f"    if (truth(ral, {result}, &go)) return 1;")
        out.append(f"    release(ral, cond_out, {len(plan.cond_output_dtypes)}, v, {n});")
    else:
        out.append("    bool go = false;")
        out.append(f"    if (truth(ral, v[{plan.cond_result.index}], &go)) return 1;")
    out.append("    if (!go) break;")
    out.append("    // the body")
    step.outputs = "body_out"
    args = [step.value(r) for r in plan.body_inputs]
    m = len(plan.body_output_dtypes)
    out.append(f"    const Value body_in[] = {{{', '.join(args) or 'Value{}'}}};")
    out.append("    static const int32_t body_dtypes[] = "
               f"{{{', '.join(str(_code(d)) for d in plan.body_output_dtypes)}}};")
    out.append(f"    Value body_out[{m}];")
    out.append(f'    if (run_step(ral, {runner(body_entry)}, "body", {len(args)}, body_in, {m}, '
               "body_out, body_dtypes)) return 1;")
    if plan.writes:
        out.append("    // the elements written")
    for j, at, ref in plan.writes:
        out.append(f"    if (list_set(ral, &list[{j}], {_index(at)}, {step.value(ref)})) return 1;")
    out.append("    // the loop variables of the next step")
    out.append(f"    Value next[{n}];")
    out.append("    memcpy(next, v, sizeof v);")
    for j, ref in sorted(plan.next_values.items()):
        out.append(f"    next[{j}] = {step.value(ref)};")
    out.append(f"    release(ral, v, {n}, next, {n});")
    out.append(f"    release(ral, body_out, {m}, next, {n});")
    out.append("    memcpy(v, next, sizeof v);")
    out.append("  }")
    out.append("  // ---- results")
    for k, j in enumerate(plan.outputs):
        slot = plan.slots[j]
        if slot.kind == "write_list":
            out.append(f"  if (list_stack(ral, &list[{j}], {slot.stack_elements})) return 1;")
        else:
            out.append(f"  if (copy_out(ral, {k}, v[{j}])) return 1;")
    out.append(f"  release(ral, v, {n}, nullptr, 0);")
    out.append("  return 0;")
    out.append("}")
    return "\n".join(out) + "\n"


def runner_unit(name: str, host: str) -> SourceUnit:
    """A step's host runner as one more translation unit of a loop artifact."""
    return SourceUnit(name, host, hashlib.sha256(host.encode()).hexdigest())


def emit_loop(plan: LoopPlan, body: Sources, body_entry: str, cond: Sources | None,
              cond_entry: str | None, num_kernels: int) -> Sources:
    """The sources of a loop cluster: the kernel units of its body and condition
    (each distinct one once), their runners as units, and the loop runner."""
    units: dict[str, SourceUnit] = {}
    for sources in (body, cond):
        for unit in (sources.units if sources else ()):
            units.setdefault(unit.name, unit)
    units[body_entry] = runner_unit(body_entry, body.host)
    if cond is not None and cond_entry:
        units[cond_entry] = runner_unit(cond_entry, cond.host)
    device = "\n".join(s.device for s in (body, cond) if s is not None)
    texts = body.kernel_texts + (cond.kernel_texts if cond else ())
    return Sources("cpu", device, emit_loop_runner(plan, body_entry, cond_entry, num_kernels),
                   units=tuple(units.values()), kernel_texts=texts)
