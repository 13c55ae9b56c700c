"""CUDA kernel emitters: the device functions of one planned kernel and the
host-runner lines that launch them.

* loop: a grid-stride flat version, a 4-wide version (aligned vector loads and
  stores) and, where an input may be broadcast or is transposed, strided
  versions (per element, or one block per row for long rows); the host
  runner picks one per call;
* stitch (reductions over the innermost dim with their producers and
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
    CASCADED_COMBINERS,
    accumulator_elem,
    comment,
    host_expr,
    product,
    rounds_once,
    strided_gemm_exprs,
    sym,
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
from disc_tf.fusion.plan import Access, Buffer, FusionPlan, Kernel, KernelOp, gemm_form

#: Kernel kinds this backend generates.
KINDS = ("loop", "stitch", "reduce", "library")
#: Threads per block of every launch.
BLOCK = 256
#: Most blocks of a grid-stride launch.
MAX_GRID = 65535
#: Rows up to this length run one warp per row, longer ones one block per row.
WARP_ROW_MAX = 1024
#: Reduce kernels with at least this many outputs run one thread per output.
THREAD_REDUCE_MIN = 2048
#: Broadcasting loop kernels run one block per row from this row length on.
ROWS_MIN_INNER = 128
#: Most dynamic shared memory a stitch kernel uses to cache its row (the
#: default limit of every GPU since sm_20, no opt-in needed).
ROW_CACHE_BYTES = 48 * 1024
#: Bytes of each compute type (row caches hold compute-type values).
ITEMSIZE_COMPUTE = {"float": 4, "int32_t": 4, "int64_t": 8, "bool": 1}
#: Elements per thread of the vectorized loop version.
VEC = 4


class CudaKernelEmitter:
    """Emits the device code of one kernel and the host lines that launch it.

    ``functions`` (shared by all emitters of a cluster) collects the names of
    ``__global__`` functions; a launch refers to one by its index there.
    """

    def __init__(self, kernel: Kernel, plan: FusionPlan, functions: list[str]) -> None:
        if kernel.kind not in KINDS:
            raise CudaCodegenError(
                f"CUDA codegen: kernel {kernel.name} has kind {kernel.kind!r}; supported: "
                f"{', '.join(KINDS)}")
        if any(a.window is not None for a in kernel.inputs):
            raise CudaCodegenError(f"CUDA codegen: kernel {kernel.name} reads a slice in place")
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
        lines.append("};")
        return "\n".join(lines)

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

    def strided(self) -> str:
        """Every input read through per-dim strides (0 = broadcast along that dim)."""
        name = self.function("bcast")
        n_in = len(self.k.inputs)
        lines = [f'extern "C" __global__ void __launch_bounds__({BLOCK}) {name}(const {self.args} a) {{']
        lines += self.pointers()
        lines.append(self._grid_stride("a.n"))
        lines.append("    int64_t rem = i;")
        lines += [f"    int64_t off{i} = 0;" for i in range(n_in)]
        lines.append(f"    for (int d = {self.rank - 1}; d >= 0; --d) {{")
        lines.append("      const int64_t idx = rem % a.dims[d];")
        lines.append("      rem /= a.dims[d];")
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
            lines.append("      const int64_t idx = rem % a.dims[d];")
            lines.append("      rem /= a.dims[d];")
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

    def _levels(self) -> dict[str, int]:
        """Pass after which each per-row value is known (reductions and what is
        computed from them); full-shape values are absent."""
        ready: dict[str, int] = {}
        full: dict[str, int] = {}
        for op in self.k.ops:
            deps = [ref for kind, ref in op.operands if kind == "val"]
            level = max([ready.get(d, full.get(d, 0)) for d in deps] or [0])
            if op.op == "reduce":
                if op.operands[0][0] not in ("in", "val"):
                    raise CudaCodegenError(f"CUDA codegen: reduce {op.value} of a constant")
                ready[op.value] = level + 1
            elif op.row:
                ready[op.value] = max([ready[d] for d in deps if d in ready] or [0])
            else:
                full[op.value] = level
        return ready

    def _full_ops(self, targets: list[str], ready: dict[str, int]) -> list[KernelOp]:
        """The full-shape ops (in plan order) that ``targets`` need per element."""
        ops = {op.value: op for op in self.k.ops}
        wanted: set[str] = set()
        stack = [t for t in targets if t not in ready]
        while stack:
            v = stack.pop()
            if v not in wanted:
                wanted.add(v)
                stack += [ref for kind, ref in ops[v].operands if kind == "val" and ref not in ready]
        return [op for op in self.k.ops if op.value in wanted]

    def _pass_ops(self) -> list[tuple[list[KernelOp], list[KernelOp]]]:
        """(full-shape ops, reductions) of each pass over the row, the output pass last."""
        ready = self._levels()
        passes = max([ready[op.value] for op in self.k.ops if op.op == "reduce"] or [0])
        out = []
        for p in range(1, passes + 1):
            reduces = [op for op in self.k.ops if op.op == "reduce" and ready[op.value] == p]
            out.append((self._full_ops([ref for op in reduces for kind, ref in op.operands
                                        if kind == "val"], ready), reduces))
        full_outs = [v for v, _ in self.k.outputs if v not in ready]
        out.append((self._full_ops(full_outs, ready), []))
        return out

    def _cached_inputs(self) -> dict[int, int]:
        """Input -> byte offset (per column) of its row cache, for every input that
        more than one pass reads; larger compute types first, so slices are aligned."""
        reads: dict[int, int] = {}
        for ops, reduces in self._pass_ops():
            for i in {ref for op in ops + reduces for kind, ref in op.operands if kind == "in"}:
                reads[i] = reads.get(i, 0) + 1
        used = {i for i, n in reads.items() if n > 1}
        size = {i: ITEMSIZE_COMPUTE[COMPUTE[self.buf(self.k.inputs[i]).elem]] for i in used}
        offsets, at = {}, 0
        for i in sorted(used, key=lambda i: (-size[i], i)):
            offsets[i] = at
            at += size[i]
        return offsets

    def _element(self, ops: list[KernelOp], extra: list[KernelOp], names: dict[str, str],
                 indent: str, loaded: set[int]) -> list[str]:
        """Loads the inputs that ``ops`` and ``extra`` read at column c, then computes ``ops``.

        The first pass that reads an input fills its row cache (when CACHE); later
        passes read the cache. Each thread reads back only the columns it wrote.
        """
        used = sorted({ref for op in ops + extra for kind, ref in op.operands if kind == "in"})
        cached = self._cached_inputs()
        lines = []
        for i in used:
            elem = self.buf(self.k.inputs[i]).elem
            from_memory = load(f"r{i}[c * st{i}]", elem)
            if i not in cached:
                lines.append(f"{indent}const {COMPUTE[elem]} x{i} = {from_memory};")
            elif i in loaded:
                lines.append(f"{indent}const {COMPUTE[elem]} x{i} = CACHE ? cache{i}[c] : {from_memory};")
            else:
                lines.append(f"{indent}const {COMPUTE[elem]} x{i} = {from_memory};")
                lines.append(f"{indent}if (CACHE) cache{i}[c] = x{i};")
                loaded.add(i)
        lines += [self.op_line(op, names[op.value], names, "x", indent) for op in ops]
        return lines

    def _group_reduce(self, op: KernelOp, var: str) -> list[str]:
        """All-reduce of ``var`` (in the accumulator type) over the GROUP threads of a row."""
        acc = accumulator_elem(op.elem, op.attrs["combiner"])  # halves accumulate in float
        ct = COMPUTE[acc]
        comb = cuda_expression(op.attrs["combiner"], [var, "peer"], acc, [acc] * 2, {})
        lines = [
            f"  for (int m = 16; m > 0; m >>= 1) {{ const {ct} peer = disc_shfl_xor({var}, m); "
            f"{var} = {comb}; }}",
            "  if (GROUP > 32) {  // across the warps of the block, through shared memory",
            f"    {ct}* part = reinterpret_cast<{ct}*>(smem);",
            f"    if ((tid & 31) == 0) part[tid >> 5] = {var};",
            "    __syncthreads();",
            f"    {var} = part[0];",
            f"    for (int w = 1; w < GROUP / 32; ++w) {{ const {ct} peer = part[w]; {var} = {comb}; }}",
            "    __syncthreads();",
            "  }",
        ]
        return lines

    def _accumulator(self, op: KernelOp, var: str, cascaded: bool) -> list[str]:
        """Declares a thread's accumulator ``var`` of reduce ``op`` (and, for a long
        sum or product, the cascade ``blocks_{var}`` with its combiner ``comb_{var}``)."""
        at = accumulator_elem(op.elem, op.attrs["combiner"])
        lines = [f"  {COMPUTE[at]} {var} = {cuda_literal(op.attrs['init'], at)};"]
        if cascaded:
            body = cuda_expression(op.attrs["combiner"], ["x", "y"], at, [at] * 2, {})
            lines += [f"  disc_cascade<{COMPUTE[at]}> blocks_{var};",
                      f"  const auto comb_{var} = []({COMPUTE[at]} x, {COMPUTE[at]} y) "
                      f"{{ return {body}; }};"]
        return lines

    @staticmethod
    def _block_end(accs: list[str], ops: list[KernelOp], filled: str = "filled") -> list[str]:
        """Inside a thread's fold: every DISC_THREAD_BLOCK elements (counted by
        ``filled``), ``accs`` go to their cascades."""
        if not accs:
            return []
        lines = [f"    if (++{filled} == DISC_THREAD_BLOCK) {{  // a full block: into the cascade"]
        for var, op in zip(accs, ops):
            at = accumulator_elem(op.elem, op.attrs["combiner"])
            lines += [f"      blocks_{var}.push({var}, comb_{var});",
                      f"      {var} = {cuda_literal(op.attrs['init'], at)};"]
        return lines + [f"      {filled} = 0;", "    }"]

    @staticmethod
    def _cascade_total(var: str, op: KernelOp) -> list[str]:
        """After a thread's fold: ``var`` becomes the combination of all its blocks."""
        at = accumulator_elem(op.elem, op.attrs["combiner"])
        return [f"  if (blocks_{var}.count) {{",
                f"    blocks_{var}.push({var}, comb_{var});",
                f"    {var} = blocks_{var}.total({cuda_literal(op.attrs['init'], at)}, comb_{var});",
                "  }"]

    def stitch_row(self) -> str:
        """The row function: a pass per level of reductions, then the outputs."""
        k, r = self.k, self.rank
        ready = self._levels()
        names = {op.value: f"v{n}" for n, op in enumerate(k.ops)}
        lines = [
            "// One row, computed by GROUP threads (a warp, or a whole block). With CACHE,",
            "// the inputs of the row are kept in shared memory (`cache`) after the first",
            "// pass that reads them.",
            "template <int GROUP, bool CACHE>",
            f"DISC_DEV void {k.name}_row(const {self.args}& a, int64_t row, int tid, "
            "unsigned char* smem, unsigned char* cache) {",
            f"  const int64_t cols = a.dims[{r - 1}];",
            "  int64_t rem = row;",
        ]
        for i, at in self._cached_inputs().items():
            ct = COMPUTE[self.buf(k.inputs[i]).elem]
            lines.append(f"  {ct}* const cache{i} = CACHE ? reinterpret_cast<{ct}*>(cache + cols * {at})"
                         " : nullptr;")
        lines += [f"  int64_t off{i} = 0;" for i in range(len(k.inputs))]
        if r > 1:
            lines.append(f"  for (int d = {r - 2}; d >= 0; --d) {{")
            lines.append("    const int64_t idx = rem % a.dims[d];")
            lines.append("    rem /= a.dims[d];")
            lines += [f"    off{i} += idx * a.in{i}_strides[d];" for i in range(len(k.inputs))]
            lines.append("  }")
        for i, acc in enumerate(k.inputs):
            st = STORAGE[self.buf(acc).elem]
            lines.append(f"  const {st}* __restrict__ r{i} = static_cast<const {st}*>(a.in{i}) + off{i};")
            lines.append(f"  const int64_t st{i} = a.in{i}_strides[{r - 1}];")
        passes = max([ready[op.value] for op in k.ops if op.op == "reduce"] or [0])
        loaded: set[int] = set()
        for p in range(1, passes + 1):
            reduces = [op for op in k.ops if op.op == "reduce" and ready[op.value] == p]
            full = self._full_ops([ref for op in reduces for kind, ref in op.operands if kind == "val"],
                                  ready)
            lines.append(f"  // pass {p}: {comment(', '.join(op.tf_node for op in reduces))}")
            cascaded = [op for op in reduces if op.attrs["combiner"] in CASCADED_COMBINERS]
            for op in reduces:
                lines += self._accumulator(op, f"acc_{names[op.value]}", op in cascaded)
            if cascaded:
                lines.append(f"  int filled{p} = 0;  // this thread's elements in its current block")
            lines.append("  for (int64_t c = tid; c < cols; c += GROUP) {")
            lines += self._element(full, reduces, names, "    ", loaded)
            for op in reduces:
                kind, ref = op.operands[0]
                val = self.ref(kind, ref, op.elem, names, "x")
                acc = accumulator_elem(op.elem, op.attrs["combiner"])
                comb = cuda_expression(op.attrs["combiner"], [f"acc_{names[op.value]}", val], acc,
                                       [acc] * 2, {})
                lines.append(f"    acc_{names[op.value]} = {comb};")
            lines += self._block_end([f"acc_{names[op.value]}" for op in cascaded], cascaded,
                                     f"filled{p}")
            lines.append("  }")
            for op in reduces:
                v = names[op.value]
                lines += self._cascade_total(f"acc_{v}", op) if op in cascaded else []
                lines += self._group_reduce(op, f"acc_{v}")
                value = f"({COMPUTE[op.elem]})acc_{v}"
                if rounds_once(op.elem):  # accumulated in float, rounded once
                    value = f"disc_round_{op.elem}({value})"
                lines.append(f"  const {COMPUTE[op.elem]} {v} = {value};")
            for op in k.ops:
                if op.row and op.op != "reduce" and ready[op.value] == p:
                    lines.append(self.op_line(op, names[op.value], names, "x", "  ") + " (per row)")
        full_outs = [(j, v) for j, (v, _) in enumerate(k.outputs) if v not in ready]
        if full_outs:
            lines.append("  // final pass: full-shape outputs")
            for j, _ in full_outs:
                st = STORAGE[self.out_elem(j)]
                lines.append(f"  {st}* __restrict__ w{j} = static_cast<{st}*>(a.out{j}) + row * cols;")
            lines.append("  for (int64_t c = tid; c < cols; c += GROUP) {")
            lines += self._element(self._full_ops([v for _, v in full_outs], ready), [], names, "    ",
                                   loaded)
            lines += [f"    w{j}[c] = {store(names[v], self.out_elem(j))};" for j, v in full_outs]
            lines.append("  }")
        row_outs = [(j, v) for j, (v, _) in enumerate(k.outputs) if v in ready]
        if row_outs:
            lines.append("  if (tid == 0) {")
            for j, v in row_outs:
                st = STORAGE[self.out_elem(j)]
                lines.append(f"    static_cast<{st}*>(a.out{j})[row] = {store(names[v], self.out_elem(j))};")
            lines.append("  }")
        lines.append("}")
        return "\n".join(lines)

    def stitch(self) -> str:
        """Row function plus its warp-per-row and block-per-row launches."""
        warp, block = self.function("warp_rows"), self.function("block_rows")
        rows = f"a.n / a.dims[{self.rank - 1}]"
        name = self.k.name
        lines = [
            self.stitch_row(),
            "",
            f"// One warp per row ({BLOCK // 32} rows per block).",
            f'extern "C" __global__ void __launch_bounds__({BLOCK}) {warp}(const {self.args} a) {{',
            "  __shared__ double smem[1];  // unused by warps",
            f"  const int64_t rows = {rows};",
            "  const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);",
            "  for (int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);"
            " row < rows; row += warps)",
            f"    {name}_row<32, false>(a, row, threadIdx.x & 31, "
            "reinterpret_cast<unsigned char*>(smem), nullptr);",
            "}",
        ]
        versions = [(block, False)]
        if self._cached_inputs():  # some input is read by more than one pass
            versions.append((self.function("block_rows_cached"), True))
        for fn, cached in versions:
            lines += [
                "",
                "// One block per row" + ("; the row's inputs cached in dynamic shared memory."
                                          if cached else "."),
                f'extern "C" __global__ void __launch_bounds__({BLOCK}) {fn}(const {self.args} a) {{',
                f"  __shared__ double smem[{BLOCK // 32}];  // one partial result per warp",
            ]
            if cached:
                lines.append("  DISC_DYNAMIC_SMEM(row_cache);")
            cache = "reinterpret_cast<unsigned char*>(row_cache)" if cached else "nullptr"
            lines += [
                f"  const int64_t rows = {rows};",
                "  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x)",
                f"    {name}_row<{BLOCK}, {'true' if cached else 'false'}>(a, row, threadIdx.x, "
                f"reinterpret_cast<unsigned char*>(smem), {cache});",
                "}",
            ]
        return "\n".join(lines)

    # ---- reduce kernels ------------------------------------------------

    def generic_reduce(self) -> str:
        """One reduction over ``reduce_dims``: thread- and block-per-output versions."""
        k, r = self.k, self.rank
        if len(k.ops) != 1 or k.ops[0].op != "reduce" or len(k.outputs) != 1:
            raise CudaCodegenError(f"CUDA codegen: reduce kernel {k.name} is not a single reduction")
        (op,) = k.ops
        kept = [d for d in range(r) if d not in k.reduce_dims]
        in_elem, out_elem = self.buf(k.inputs[0]).elem, self.out_elem(0)
        acc_elem = accumulator_elem(op.elem, op.attrs["combiner"])
        ct = COMPUTE[acc_elem]
        comb = cuda_expression(op.attrs["combiner"], ["acc", "x"], acc_elem, [acc_elem] * 2, {})
        cascaded = op.attrs["combiner"] in CASCADED_COMBINERS
        base = ["  int64_t rem = o;", "  int64_t base = 0;"]
        for d in reversed(kept):
            base += [f"  base += (rem % a.dims[{d}]) * a.in0_strides[{d}];", f"  rem /= a.dims[{d}];"]
        offset = ["    int64_t rq = q;", "    int64_t off = base;"]
        for d in reversed(k.reduce_dims):
            offset += [f"    off += (rq % a.dims[{d}]) * a.in0_strides[{d}];", f"    rq /= a.dims[{d}];"]
        fold = [f"    const {ct} x = {load('r0[off]', in_elem)};", f"    acc = {comb};",
                *self._block_end(["acc"] if cascaded else [], [op])]
        st = STORAGE[in_elem]
        head = [f"  const {st}* __restrict__ r0 = static_cast<const {st}*>(a.in0);",
                f"  {STORAGE[out_elem]}* __restrict__ w0 = static_cast<{STORAGE[out_elem]}*>(a.out0);"]
        thread, block = self.function("reduce_thread"), self.function("reduce_block")
        lines = [
            f"// {comment(op.tf_node)}: reduce dims {k.reduce_dims} of {r} by {op.attrs['combiner']}",
            f"DISC_DEV {ct} {k.name}_fold(const {self.args}& a, int64_t o, int64_t q0, int64_t step) {{",
            *head[:1], *base, *self._accumulator(op, "acc", cascaded),
            *(["  int filled = 0;  // this thread's elements in its current block"] if cascaded else []),
            "  for (int64_t q = q0; q < a.reduced; q += step) {", *offset, *fold, "  }",
            *(self._cascade_total("acc", op) if cascaded else []),
            "  return acc;", "}", "",
            "// One thread per output: adjacent threads read adjacent kept elements.",
            f'extern "C" __global__ void __launch_bounds__({BLOCK}) {thread}(const {self.args} a) {{',
            *head[1:],
            "  for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < a.outputs;"
            " o += (int64_t)gridDim.x * blockDim.x)",
            f"    w0[o] = {store(f'{k.name}_fold(a, o, 0, 1)', out_elem)};",
            "}", "",
            "// One block per output, for few outputs over many elements.",
            f'extern "C" __global__ void __launch_bounds__({BLOCK}) {block}(const {self.args} a) {{',
            *head[1:],
            f"  __shared__ double smem[{BLOCK // 32}];  // one partial result per warp",
            "  const int tid = threadIdx.x;",
            "  for (int64_t o = blockIdx.x; o < a.outputs; o += gridDim.x) {",
            f"    {ct} acc = {k.name}_fold(a, o, tid, {BLOCK});",
        ]
        lines += ["  " + x for x in self._group_reduce(op, "acc")]
        lines = [x.replace("GROUP", str(BLOCK)) for x in lines]
        lines += [f"    if (tid == 0) w0[o] = {store('acc', out_elem)};", "  }", "}"]
        return "\n".join(lines)

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
        if self.k.needs_broadcast_version and self.rank:
            parts += [self.strided(), self.strided_rows()]
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
        """A GEMM reading transposed operands in place: one strided-batched GEMM per
        outer batch index (the inner batch is cuBLAS's own)."""
        plan, k = self.plan, self.k
        lhs, rhs = (self.buf(a) for a in k.inputs)
        if not (lhs.elem == rhs.elem == self.out_elem(0)) or lhs.elem not in ("f32", "f16", "bf16"):
            raise CudaCodegenError(f"CUDA codegen: GEMM {k.name} on {lhs.elem} x {rhs.elem}")
        (_, out_name), = k.outputs
        size = ITEMSIZE[lhs.elem]
        g = strided_gemm_exprs(f, lhs, rhs, plan)
        sa, sb = g["sa"], g["sb"]
        return [
            f"  {{  // {k.name}: library GEMM for {comment(k.ops[0].tf_node)}, operands in place",
            *g["lines"],
            "    for (int64_t qo = 0; qo < outer && inner > 0 && m > 0 && n > 0; ++qo) {",
            f"      const char* a = static_cast<const char*>({ptr[lhs.name]}) + qo * ({sa[0]}) * {size};",
            f"      const char* b = static_cast<const char*>({ptr[rhs.name]}) + qo * ({sb[0]}) * {size};",
            f"      char* c = static_cast<char*>({ptr[out_name]}) + qo * inner * m * n * {size};",
            f"      if (cu->gemm_batched(cu, {RAL_DTYPE[lhs.elem]}, inner, m, n, kk, a, {g['lda']}, "
            f"{sa[1]}, {int(f['transpose_a'])},",
            f"                            b, {g['ldb']}, {sb[1]}, {int(f['transpose_b'])}, c, n, m * n)) "
            "return 1;",
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
            lines.append(f"    k.in{i} = {ptr[b.name]};")
            aligned.append(f"disc_aligned(k.in{i}, {VEC * ITEMSIZE[b.elem]})")
            if not r:
                continue
            dims_map = acc.dims if acc.dims is not None else list(range(r))
            stride = "1"
            for bd in range(len(b.dims) - 1, -1, -1):
                size = sym(b.dims[bd], plan)
                lines.append(f"    k.in{i}_strides[{dims_map[bd]}] = {size} == 1 ? 0 : {stride};")
                stride = f"{stride} * {size}" if stride != "1" else size
            if acc.permuted:
                flat_conds.append("false")
            elif not acc.is_identity:
                flat_conds.append(f"{product(b.dims, plan)} == k.n")
        for j, (_, bname) in enumerate(k.outputs):
            lines.append(f"    k.out{j} = {ptr[bname]};")
            aligned.append(f"disc_aligned(k.out{j}, {VEC * ITEMSIZE[self.out_elem(j)]})")
        for i, h in enumerate(self.host_scalars):
            lines.append(f"    k.h{i} = (double)({host_expr(h, plan)});")
        lines.append("    void* params[] = {&k};")
        if k.kind == "stitch":
            lines.append(f"    const int64_t cols = k.dims[{r - 1}];")
            lines.append("    const int64_t rows = cols > 0 ? k.n / cols : 0;")
            lines.append("    if (rows > 0) {")
            lines.append(f"      if (cols <= {WARP_ROW_MAX}) {{  // one warp per row")
            lines.append(self._launch("warp_rows", f"disc_grid(rows, {BLOCK // 32}, {MAX_GRID})",
                                      "        "))
            per_col = sum(ITEMSIZE_COMPUTE[COMPUTE[self.buf(k.inputs[i]).elem]]
                          for i in self._cached_inputs())
            if per_col:
                lines.append(f"      }} else if (cols * {per_col} <= {ROW_CACHE_BYTES}) {{"
                             "  // one block per row, row cached in shared memory")
                lines.append(self._launch("block_rows_cached", f"disc_grid(rows, 1, {MAX_GRID})",
                                          "        ", f"(uint32_t)(cols * {per_col})"))
            lines.append("      } else {  // one block per row")
            lines.append(self._launch("block_rows", f"disc_grid(rows, 1, {MAX_GRID})", "        "))
            lines += ["      }", "    }", "  }"]
            return lines
        if k.kind == "reduce":
            kept = [s for d, s in enumerate(k.dims) if d not in k.reduce_dims]
            reduced = [s for d, s in enumerate(k.dims) if d in k.reduce_dims]
            lines.append(f"    k.reduced = {product(reduced, plan)};")
            lines.append(f"    k.outputs = {product(kept, plan)};")
            lines.append("    if (k.outputs > 0) {")
            lines.append(f"      if (k.outputs >= {THREAD_REDUCE_MIN} || k.reduced < {BLOCK}) {{")
            lines.append(self._launch("reduce_thread", f"disc_grid(k.outputs, {BLOCK}, {MAX_GRID})",
                                      "        "))
            lines.append("      } else {")
            lines.append(self._launch("reduce_block", f"disc_grid(k.outputs, 1, {MAX_GRID})",
                                      "        "))
            lines += ["      }", "    }", "  }"]
            return lines
        grid = f"disc_grid(k.n, {BLOCK}, {MAX_GRID})"
        vec_grid = f"disc_grid(k.n / {VEC}, {BLOCK}, {MAX_GRID})"
        lines.append("    if (k.n > 0) {")
        flat = " && ".join(flat_conds) if (k.needs_broadcast_version and r) else "true"
        lines.append(f"      if ({flat}) {{  // nothing broadcast or transposed in this call")
        lines.append(f"        if ({' && '.join(aligned)}) {{")
        lines.append(self._launch("vec", vec_grid, "          "))
        lines.append("        } else {")
        lines.append(self._launch("flat", grid, "          "))
        lines.append("        }")
        if k.needs_broadcast_version and r:
            inner = f"k.dims[{r - 1}]"
            lines.append(f"      }} else if ({inner} >= {ROWS_MIN_INNER}) {{  // one block per row")
            lines.append(self._launch("bcast_rows", f"disc_grid(k.n / {inner}, 1, {MAX_GRID})",
                                      "        "))
            lines.append("      } else {")
            lines.append(self._launch("bcast", grid, "        "))
        lines += ["      }", "    }", "  }"]
        return lines
