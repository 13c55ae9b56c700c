"""CUDA kernel emitters: the device functions of one planned kernel and the
host-runner lines that launch them.

* loop: a grid-stride flat version, a 4-wide version (aligned vector loads and
  stores) and, where an input may be broadcast or is transposed, strided
  versions (per element, or one block per row for long rows); the host
  runner picks one per call;
* stitch (``cuda_stitch.py``; reductions over the innermost dim with their producers and
  consumers: softmax, layer norm): a warp-per-row and a block-per-row version,
  picked per call from the row length; partial results meet through warp
  shuffles and, across the warps of a block, shared memory; a block-per-row
  version also keeps the row's inputs in shared memory between passes when
  they fit in 48 KiB;
* reduce (any other dims, e.g. a column reduce): thread-per-output (adjacent
  threads read adjacent columns) and block-per-output versions;
* library: a GEMM queued on the stream through ``cu->gemm_batched``.

Argument structs hold ``void`` pointers so that the host compiler (which sees
no CUDA headers) and nvcc lay them out identically.
"""

from __future__ import annotations

from disc_tf.codegen.cpu_text import (
    comment,
    concat_end_lines,
    concat_ops,
    host_expr,
    input_stride_lines,
    product,
    strided_gemm_exprs,
    sym,
    window_offset,
)
from disc_tf.codegen.cuda_config import (
    BCAST_ROWS_MIN,
    BLOCK,
    KINDS,
    MAX_GRID,
    ROWS_MIN_INNER,
    VEC,
)
from disc_tf.codegen.cuda_ops import (
    COMPUTE,
    ITEMSIZE,
    RAL_DTYPE,
    STORAGE,
    CudaCodegenError,
    check_elem,
    cuda_expression,
    cuda_literal,
    load,
    store,
)
from disc_tf.codegen.cuda_stitch import CudaReductionEmitter
from disc_tf.fusion.plan import Access, Buffer, FusionPlan, Kernel, KernelOp, gemm_form


class CudaKernelEmitter(CudaReductionEmitter):
    """Emits the device code of one kernel and the host lines that launch it.

    ``functions`` (shared by all emitters of a cluster) collects the names of
    ``__global__`` functions; a launch refers to one by its index there.
    """

    def __init__(self, kernel: Kernel, plan: FusionPlan, functions: list[str]) -> None:
        if kernel.kind not in KINDS:
            raise CudaCodegenError(
                f"CUDA codegen: kernel {kernel.name} has kind {kernel.kind!r}; supported: "
                f"{', '.join(KINDS)}")
        if kernel.kind != "loop" and any(a.part_of is not None for a in kernel.inputs):
            raise CudaCodegenError(f"CUDA codegen: {kernel.kind} kernel {kernel.name} reads a "
                                   "concatenation in place")
        self.k = kernel
        self.plan = plan
        self.rank = len(kernel.dims)
        self.args = f"{kernel.name.capitalize()}Args"
        self.functions = functions
        for a in kernel.inputs:
            check_elem(self.buf(a).elem, f"kernel {kernel.name} input {a.buffer}")
        for _, b in kernel.outputs:
            check_elem(plan.buffers[b].elem, f"kernel {kernel.name} output {b}")
        if kernel.kind == "stitch" and not self.rank:
            raise CudaCodegenError(f"CUDA codegen: stitch kernel {kernel.name} has rank 0")

    # ---- shared pieces -------------------------------------------------

    @property
    def strided_versions(self) -> bool:
        """True if a loop kernel has versions reading inputs through strides (some
        input may be broadcast, is transposed or is a slice read in place)."""
        return bool(self.rank) and (self.k.needs_broadcast_version or any(
            a.window is not None or a.part_of is not None for a in self.k.inputs))

    def buf(self, access: Access) -> Buffer:
        """The buffer an access reads."""
        return self.plan.buffers[access.buffer]

    def out_elem(self, j: int) -> str:
        """Element type of output j."""
        return self.plan.buffers[self.k.outputs[j][1]].elem

    def function(self, suffix: str) -> str:
        """Registers and returns the name of a ``__global__`` function."""
        name = f"{self.k.name}_{suffix}"
        self.functions.append(name)
        return name

    def index_of(self, suffix: str) -> int:
        """Index of a registered ``__global__`` function (what ``launch`` takes)."""
        return self.functions.index(f"{self.k.name}_{suffix}")

    @property
    def host_scalars(self) -> list:
        """Distinct host-computed scalars the kernel's ops read, in first-use order."""
        return self.k.host_scalars

    def ref(self, kind: str, ref: object, elem: str, names: dict[str, str], inputs: str) -> str:
        """The device expression of one operand reference."""
        if kind == "in":
            return f"{inputs}{ref}"
        if kind == "val":
            return names[ref]
        if kind == "host":
            return f"({COMPUTE[elem]})a.h{self.host_scalars.index(ref)}"
        if kind == "const":
            return cuda_literal(ref, elem)
        raise CudaCodegenError(f"CUDA codegen: kernel {self.k.name}: operand kind {kind!r}")

    def op_line(self, op: KernelOp, var: str, names: dict[str, str], inputs: str,
                indent: str) -> str:
        """One line defining ``var`` as the value of ``op``."""
        args = [self.ref(kind, ref, elem, names, inputs)
                for (kind, ref), elem in zip(op.operands, op.operand_elems)]
        expr = cuda_expression(op.op, args, op.elem, op.operand_elems, op.attrs)
        return f"{indent}const {COMPUTE[op.elem]} {var} = {expr};  // {comment(op.tf_node)}: {op.op}"

    def struct(self) -> str:
        """The argument struct (the same text in device and host code)."""
        lines = [f"struct {self.args} {{", "  int64_t n;  // elements"]
        if self.k.kind == "reduce":
            lines.append("  int64_t reduced;  // elements folded into each output")
            lines.append("  int64_t outputs;")
            lines.append("  void* partial;  // split reductions: outputs x splits partial results")
            lines.append("  int64_t splits;")
            if len(self.k.reduce_dims) > 1:
                lines.append("  int64_t reduced_stride;  // reduced dims laid out as one run: its "
                             "stride (else 0)")
        if self.rank:
            lines.append(f"  int64_t dims[{self.rank}];")
        for i, a in enumerate(self.k.inputs):
            lines.append(f"  const void* in{i};  // {self.buf(a).elem}: {a}")
            if self.rank:
                lines.append(f"  int64_t in{i}_strides[{self.rank}];")
        for j, (value, bname) in enumerate(self.k.outputs):
            lines.append(f"  void* out{j};  // {self.out_elem(j)}: {bname} ({value})")
        for i, h in enumerate(self.host_scalars):
            lines.append(f"  double h{i};  // {h}, computed by the host")
        for n, op in self.concats():
            lines.append(f"  int64_t cat{n}[{len(op.operands)}];  // {comment(op.tf_node)}: "
                         f"where each part ends along dim {op.attrs['axis']}")
        lines.append("};")
        return "\n".join(lines)

    def concats(self) -> list[tuple[int, KernelOp]]:
        """The kernel's concatenations read in place: (op position, op)."""
        return concat_ops(self.k)

    def pointers(self, indent: str = "  ") -> list[str]:
        """Typed input (r*) and output (w*) pointers from the argument struct."""
        lines = []
        for i, acc in enumerate(self.k.inputs):
            st = STORAGE[self.buf(acc).elem]
            lines.append(f"{indent}const {st}* __restrict__ r{i} = static_cast<const {st}*>(a.in{i});")
        for j in range(len(self.k.outputs)):
            st = STORAGE[self.out_elem(j)]
            lines.append(f"{indent}{st}* __restrict__ w{j} = static_cast<{st}*>(a.out{j});")
        return lines

    # ---- loop kernels --------------------------------------------------

    def compute(self) -> str:
        """The per-element compute function of a loop kernel."""
        params = [f"const {self.args}& a"]
        params += [f"{COMPUTE[self.buf(a).elem]} in{i}" for i, a in enumerate(self.k.inputs)]
        params += [f"{COMPUTE[self.out_elem(j)]}& out{j}" for j in range(len(self.k.outputs))]
        names: dict[str, str] = {}
        body = []
        for n, op in enumerate(self.k.ops):
            if op.op == "concatenate":  # the caller loads the part holding the element there
                kind, ref = op.operands[0]
                first = self.ref(kind, ref, op.elem, names, "in")
                body.append(f"  const {COMPUTE[op.elem]} v{n} = {first};  "
                            f"// {comment(op.tf_node)}: concatenate")
            else:
                body.append(self.op_line(op, f"v{n}", names, "in", "  "))
            names[op.value] = f"v{n}"
        body += [f"  out{j} = {names[v]};" for j, (v, _) in enumerate(self.k.outputs)]
        return "\n".join([f"DISC_DEV void {self.k.name}_compute({', '.join(params)}) {{", *body, "}"])

    def _apply(self, loads: list[str], stores: list[str], indent: str) -> list[str]:
        """Calls the compute function on ``loads``; writes output j through ``stores[j]``
        (a format string taking the stored value)."""
        lines = [f"{indent}{COMPUTE[self.out_elem(j)]} o{j};" for j in range(len(self.k.outputs))]
        outs = [f"o{j}" for j in range(len(self.k.outputs))]
        lines.append(f"{indent}{self.k.name}_compute({', '.join(['a', *loads, *outs])});")
        lines += [indent + s.format(store(f"o{j}", self.out_elem(j))) + ";" for j, s in enumerate(stores)]
        return lines

    @staticmethod
    def _grid_stride(limit: str) -> str:
        return (f"  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < {limit};"
                " i += (int64_t)gridDim.x * blockDim.x) {")

    def flat(self) -> str:
        """Grid-stride version reading every input at the output index."""
        name = self.function("flat")
        lines = [f'extern "C" __global__ void __launch_bounds__({BLOCK}) {name}(const {self.args} a) {{']
        lines += self.pointers()
        lines.append(self._grid_stride("a.n"))
        loads = [load(f"r{i}[i]", self.buf(acc).elem) for i, acc in enumerate(self.k.inputs)]
        lines += self._apply(loads, [f"w{j}[i] = {{}}" for j in range(len(self.k.outputs))], "    ")
        lines += ["  }", "}"]
        return "\n".join(lines)

    def vectorized(self) -> str:
        """VEC elements per thread through aligned vector loads and stores."""
        name = self.function("vec")
        lines = [f'extern "C" __global__ void __launch_bounds__({BLOCK}) {name}(const {self.args} a) {{']
        lines += self.pointers()
        lines.append(self._grid_stride(f"a.n / {VEC}"))
        for i, acc in enumerate(self.k.inputs):
            st = STORAGE[self.buf(acc).elem]
            lines.append(f"    const disc_vec<{st}, {VEC}> x{i} = "
                         f"reinterpret_cast<const disc_vec<{st}, {VEC}>*>(r{i})[i];")
        for j in range(len(self.k.outputs)):
            lines.append(f"    disc_vec<{STORAGE[self.out_elem(j)]}, {VEC}> y{j};")
        lines.append("#pragma unroll")
        lines.append(f"    for (int l = 0; l < {VEC}; ++l) {{")
        loads = [load(f"x{i}.v[l]", self.buf(acc).elem) for i, acc in enumerate(self.k.inputs)]
        lines += self._apply(loads, [f"y{j}.v[l] = {{}}" for j in range(len(self.k.outputs))], "      ")
        lines.append("    }")
        for j in range(len(self.k.outputs)):
            st = STORAGE[self.out_elem(j)]
            lines.append(f"    reinterpret_cast<disc_vec<{st}, {VEC}>*>(w{j})[i] = y{j};")
        lines += ["  }", "}"]
        return "\n".join(lines)

    def _concat_strided(self, name: str) -> str:
        """The strided version of a kernel reading concatenations in place: each element
        finds the part holding it and loads that part (at its index shifted by the parts
        before it) into the slot of the concatenation's first operand."""
        r, k = self.rank, self.k
        part_of: dict[int, tuple[int, int]] = {}  # input -> (concat position, part index)
        for n, op in self.concats():
            for q, (_, ref) in enumerate(op.operands):
                part_of[ref] = (n, q)
        lines = [f'extern "C" __global__ void __launch_bounds__({BLOCK}) {name}(const {self.args} a) {{']
        lines += self.pointers()
        lines.append(self._grid_stride("a.n"))
        lines.append(f"    int64_t c[{r}];")
        lines.append("    int64_t rem = i;")
        lines.append(f"    for (int d = {r - 1}; d >= 0; --d) {{")
        lines.append("      c[d] = disc_divmod(rem, a.dims[d]);")
        lines.append("    }")
        for n, op in self.concats():
            ax, parts = op.attrs["axis"], len(op.operands)
            lines.append(f"    int p{n} = 0;  // {comment(op.tf_node)}: the part holding c[{ax}]")
            lines.append(f"    while (p{n} < {parts - 1} && c[{ax}] >= a.cat{n}[p{n}]) ++p{n};")
            lines.append(f"    const int64_t s{n} = p{n} ? a.cat{n}[p{n} - 1] : 0;")
        for i in range(len(k.inputs)):
            terms = []
            for d in range(r):
                coord = f"c[{d}]"
                if i in part_of:
                    n, _ = part_of[i]
                    if d == self.k.ops[n].attrs["axis"]:
                        coord = f"(c[{d}] - s{n})"
                terms.append(f"{coord} * a.in{i}_strides[{d}]")
            lines.append(f"    const int64_t off{i} = {' + '.join(terms)};")
        loads = []
        for i, acc in enumerate(k.inputs):
            elem = self.buf(acc).elem
            if i not in part_of:
                loads.append(load(f"r{i}[off{i}]", elem))
            elif part_of[i][1] == 0:  # the first part's slot: whichever part holds it
                n, _ = part_of[i]
                refs = [ref for _, ref in k.ops[n].operands]
                expr = load(f"r{refs[-1]}[off{refs[-1]}]", elem)
                for q in range(len(refs) - 2, -1, -1):
                    expr = f"(p{n} == {q} ? {load(f'r{refs[q]}[off{refs[q]}]', elem)} : {expr})"
                loads.append(expr)
            else:
                loads.append(f"({COMPUTE[elem]})0")  # read through the first part's slot
        lines += self._apply(loads, [f"w{j}[i] = {{}}" for j in range(len(k.outputs))], "    ")
        lines += ["  }", "}"]
        return "\n".join(lines)

    def strided(self) -> str:
        """Every input read through per-dim strides (0 = broadcast along that dim)."""
        name = self.function("bcast")
        if self.concats():
            return self._concat_strided(name)
        n_in = len(self.k.inputs)
        lines = [f'extern "C" __global__ void __launch_bounds__({BLOCK}) {name}(const {self.args} a) {{']
        lines += self.pointers()
        lines.append(self._grid_stride("a.n"))
        lines.append("    int64_t rem = i;")
        lines += [f"    int64_t off{i} = 0;" for i in range(n_in)]
        lines.append(f"    for (int d = {self.rank - 1}; d >= 0 && rem != 0; --d) {{  // rem 0: "
                     "the outer coordinates are 0")
        lines.append("      const int64_t idx = disc_divmod(rem, a.dims[d]);")
        lines += [f"      off{i} += idx * a.in{i}_strides[d];" for i in range(n_in)]
        lines.append("    }")
        loads = [load(f"r{i}[off{i}]", self.buf(acc).elem) for i, acc in enumerate(self.k.inputs)]
        lines += self._apply(loads, [f"w{j}[i] = {{}}" for j in range(len(self.k.outputs))], "    ")
        lines += ["  }", "}"]
        return "\n".join(lines)

    def strided_rows(self) -> str:
        """Like ``strided``, one block per row of the innermost dim: the row's
        offsets are computed once, threads run along the row."""
        name = self.function("bcast_rows")
        r, n_in = self.rank, len(self.k.inputs)
        lines = [f'extern "C" __global__ void __launch_bounds__({BLOCK}) {name}(const {self.args} a) {{']
        lines += self.pointers()
        lines.append(f"  const int64_t inner = a.dims[{r - 1}];")
        lines.append("  const int64_t rows = a.n / inner;")
        lines.append("  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {")
        lines.append("    int64_t rem = row;")
        lines += [f"    int64_t off{i} = 0;" for i in range(n_in)]
        if r > 1:
            lines.append(f"    for (int d = {r - 2}; d >= 0; --d) {{")
            lines.append("      const int64_t idx = disc_divmod(rem, a.dims[d]);")
            lines += [f"      off{i} += idx * a.in{i}_strides[d];" for i in range(n_in)]
            lines.append("    }")
        lines += [f"    const int64_t st{i} = a.in{i}_strides[{r - 1}];" for i in range(n_in)]
        lines.append("    for (int64_t c = threadIdx.x; c < inner; c += blockDim.x) {")
        loads = [load(f"r{i}[off{i} + c * st{i}]", self.buf(acc).elem)
                 for i, acc in enumerate(self.k.inputs)]
        lines += self._apply(loads, [f"w{j}[row * inner + c] = {{}}" for j in range(len(self.k.outputs))],
                             "      ")
        lines += ["    }", "  }", "}"]
        return "\n".join(lines)

    # ---- stitch kernels ------------------------------------------------

    # ---- reduce kernels ------------------------------------------------

    # ---- device source -------------------------------------------------

    def device_source(self) -> str:
        """All device code of the kernel (registers its ``__global__`` functions)."""
        header = (
            f"// ---- {self.k.name}: {self.k.kind} fusion over "
            f"[{', '.join(sym(d, self.plan) for d in self.k.dims)}]\n"
            f"// TF ops: {comment(', '.join(self.k.tf_ops))}"
        )
        if self.k.kind == "library":
            self._gemm_form()
            return header + "\n// (a GEMM queued through cu->gemm_batched; no device code)"
        if self.k.kind == "stitch":
            return "\n\n".join([header, self.struct(), self.stitch()])
        if self.k.kind == "reduce":
            return "\n\n".join([header, self.struct(), self.generic_reduce()])
        parts = [header, self.struct(), self.compute(), self.flat(), self.vectorized()]
        if self.strided_versions:
            parts.append(self.strided())
            if not self.concats():
                parts.append(self.strided_rows())
        return "\n\n".join(parts)

    # ---- host launches -------------------------------------------------

    def _gemm_form(self):
        (op,) = self.k.ops
        if op.op != "dot_general" or len(self.k.inputs) != 2:
            raise CudaCodegenError(f"CUDA codegen: library kernel {self.k.name} is not a dot_general")
        lhs, rhs = (self.buf(a) for a in self.k.inputs)
        if "strided" in op.attrs:
            return op.attrs["strided"]
        if not (lhs.elem == rhs.elem == self.out_elem(0)) or lhs.elem not in ("f32", "f16", "bf16"):
            raise CudaCodegenError(f"CUDA codegen: GEMM {self.k.name} on {lhs.elem} x {rhs.elem}")
        form = gemm_form(len(lhs.dims), len(rhs.dims), op.attrs)
        if form is None:
            raise CudaCodegenError(f"CUDA codegen: dot_general {op.attrs} is not a GEMM")
        return form

    def strided_launch(self, ptr: dict[str, str], f: dict) -> list[str]:
        """A GEMM reading transposed operands in place, a two-level batch (outer x
        inner) as cuBLAS strided batches: one call when the levels collapse into one
        stride, else one call per index of the smaller level (each cuBLAS call costs
        microseconds of host time: attention over 8 sequences of 4 heads made 8 calls
        per product)."""
        plan, k = self.plan, self.k
        lhs, rhs = (self.buf(a) for a in k.inputs)
        if not (lhs.elem == rhs.elem == self.out_elem(0)) or lhs.elem not in ("f32", "f16", "bf16"):
            raise CudaCodegenError(f"CUDA codegen: GEMM {k.name} on {lhs.elem} x {rhs.elem}")
        (_, out_name), = k.outputs
        size = ITEMSIZE[lhs.elem]
        g = strided_gemm_exprs(f, lhs, rhs, plan)
        sa, sb = g["sa"], g["sb"]

        def call(indent: str, batch: str, level: str) -> list[str]:
            """One gemm_batched of ``batch`` products, at index ``q`` of ``level`` ("inner",
            "outer", or "" for both levels as one batch), batched over the other level."""
            offsets = {"outer": ("sa_outer", "sb_outer", "inner * m * n"),
                       "inner": ("sa_inner", "sb_inner", "m * n")}.get(level)
            a, b, c = ((f"{base} + q * {st} * {size}" for base, st in zip(("a0", "b0", "c0"), offsets))
                       if offsets else ("a0", "b0", "c0"))
            stride, c_stride = ("outer", "inner * m * n") if level == "inner" else ("inner", "m * n")
            return [f"{indent}if (cu->gemm_batched(cu, {RAL_DTYPE[lhs.elem]}, {batch}, m, n, kk, "
                    f"{a}, {g['lda']}, sa_{stride}, {int(f['transpose_a'])},",
                    f"{indent}                     {b}, {g['ldb']}, sb_{stride}, "
                    f"{int(f['transpose_b'])}, {c}, n, {c_stride})) return 1;"]

        return [
            f"  {{  // {k.name}: library GEMM for {comment(k.ops[0].tf_node)}, operands in place",
            *g["lines"],
            "    if (outer > 0 && inner > 0 && m > 0 && n > 0) {",
            f"      const char* const a0 = static_cast<const char*>({ptr[lhs.name]});",
            f"      const char* const b0 = static_cast<const char*>({ptr[rhs.name]});",
            f"      char* const c0 = static_cast<char*>({ptr[out_name]});",
            f"      const int64_t sa_outer = {sa[0]}, sa_inner = {sa[1]};",
            f"      const int64_t sb_outer = {sb[0]}, sb_inner = {sb[1]};",
            "      if (outer == 1 || (sa_outer == inner * sa_inner && sb_outer == inner * sb_inner)) {",
            "        // one batch of outer * inner products",
            *call("        ", "outer * inner", ""),
            "      } else if (inner <= outer) {  // a call per inner index, batched over outer",
            "        for (int64_t q = 0; q < inner; ++q) {",
            *call("          ", "outer", "inner"),
            "        }",
            "      } else {  // a call per outer index, batched over inner",
            "        for (int64_t q = 0; q < outer; ++q) {",
            *call("          ", "inner", "outer"),
            "        }",
            "      }",
            "    }",
            "  }",
        ]

    def library_launch(self, ptr: dict[str, str]) -> list[str]:
        """Host-runner lines of a library kernel: one batched GEMM on the stream."""
        plan, k = self.plan, self.k
        form = self._gemm_form()
        if isinstance(form, dict):
            return self.strided_launch(ptr, form)
        lhs, rhs = (self.buf(a) for a in k.inputs)
        (_, out_name), = k.outputs

        def of(buf: Buffer, positions: list[int]) -> str:
            return product([buf.dims[p] for p in positions], plan)

        return [
            f"  {{  // {k.name}: library GEMM for {comment(k.ops[0].tf_node)}",
            f"    const int64_t batch = {of(lhs, form.batch)};",
            f"    const int64_t m = {of(lhs, form.m)};",
            f"    const int64_t n = {of(rhs, form.n)};",
            f"    const int64_t kk = {of(lhs, form.k)};",
            "    if (batch > 0 && m > 0 && n > 0) {",
            f"      if (cu->gemm_batched(cu, {RAL_DTYPE[lhs.elem]}, batch, m, n, kk, "
            f"{ptr[lhs.name]}, {of(lhs, form.lda)}, {of(lhs, form.stride_a)}, {int(form.transpose_a)},",
            f"                            {ptr[rhs.name]}, {of(rhs, form.ldb)}, "
            f"{of(rhs, form.stride_b)}, {int(form.transpose_b)},",
            f"                            {ptr[out_name]}, n, m * n)) return 1;",
            "    }",
            "  }",
        ]

    def _launch(self, suffix: str, grid: str, indent: str, shared: str = "0") -> str:
        return (f"{indent}if (cu->launch(cu, {self.index_of(suffix)} /* {self.k.name}_{suffix} */, "
                f"{grid}, {BLOCK}, {shared}, params)) return 1;")

    def launch(self, ptr: dict[str, str]) -> list[str]:
        """Host-runner lines that fill the args and launch the kernel."""
        plan, k, r = self.plan, self.k, self.rank
        if k.kind == "library":
            return self.library_launch(ptr)
        lines = [f"  {{  // {k.name}: {comment(', '.join(k.tf_ops))}", f"    {self.args} k{{}};",
                 f"    k.n = {product(k.dims, plan)};"]
        lines += [f"    k.dims[{d}] = {sym(s, plan)};" for d, s in enumerate(k.dims)]
        flat_conds, aligned = [], [f"k.n % {VEC} == 0"]
        for i, acc in enumerate(k.inputs):
            b = self.buf(acc)
            if acc.window is None:
                lines.append(f"    k.in{i} = {ptr[b.name]};")
            else:  # a slice read in place: its first element, strides times steps
                lines.append(f"    k.in{i} = static_cast<const char*>({ptr[b.name]}) + "
                             f"({window_offset(acc, b, plan)}) * {ITEMSIZE[b.elem]};  // window")
            aligned.append(f"disc_aligned(k.in{i}, {VEC * ITEMSIZE[b.elem]})")
            if not r:
                continue
            lines += input_stride_lines(i, acc, b, r, plan)
            if acc.permuted:
                flat_conds.append("false")
            elif not acc.is_identity:
                flat_conds.append(f"{product(b.dims, plan)} == k.n")
        for j, (_, bname) in enumerate(k.outputs):
            lines.append(f"    k.out{j} = {ptr[bname]};")
            aligned.append(f"disc_aligned(k.out{j}, {VEC * ITEMSIZE[self.out_elem(j)]})")
        for i, h in enumerate(self.host_scalars):
            lines.append(f"    k.h{i} = (double)({host_expr(h, plan)});")
        lines += concat_end_lines(k, plan)
        lines.append("    void* params[] = {&k};")
        if k.kind == "stitch":
            return lines + self.stitch_launch()
        if k.kind == "reduce":
            return lines + self.reduce_launch()
        grid = f"disc_grid(k.n, {BLOCK}, {MAX_GRID})"
        vec_grid = f"disc_grid(k.n / {VEC}, {BLOCK}, {MAX_GRID})"
        lines.append("    if (k.n > 0) {")
        flat = " && ".join(flat_conds) if self.strided_versions else "true"
        lines.append(f"      if ({flat}) {{  // nothing broadcast or transposed in this call")
        lines.append(f"        if ({' && '.join(aligned)}) {{")
        lines.append(self._launch("vec", vec_grid, "          "))
        lines.append("        } else {")
        lines.append(self._launch("flat", grid, "          "))
        lines.append("        }")
        if self.strided_versions and self.concats():
            lines.append("      } else {  // concatenations read in place: per element")
            lines.append(self._launch("bcast", grid, "        "))
        elif self.strided_versions:
            inner = f"k.dims[{r - 1}]"
            strides = ", ".join(f"k.in{i}_strides" for i in range(len(k.inputs)))
            lines += ["      } else {  // strided: first merge the dims every input reads as one run",
                      f"        int64_t* strides[] = {{{strides}}};",
                      f"        disc_collapse_dims({r}, k.dims, {len(k.inputs)}, strides);",
                      f"        if ({inner} >= {ROWS_MIN_INNER} && k.n / {inner} >= {BCAST_ROWS_MIN}) "
                      "{  // one block per row",
                      self._launch("bcast_rows", f"disc_grid(k.n / {inner}, 1, {MAX_GRID})",
                                   "          "),
                      "        } else {",
                      self._launch("bcast", grid, "          "),
                      "        }"]
        lines += ["      }", "    }", "  }"]
        return lines
