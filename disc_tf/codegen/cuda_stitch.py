"""CUDA device code of the kernels that reduce: stitch kernels (a reduction over the
innermost dim with its producers and consumers, one warp or one block per row,
partials meeting through warp shuffles and shared memory, the row cached in
shared memory between passes when it fits) and reduce kernels (any other dims:
thread-per-output, block-per-output and split versions).
"""

from __future__ import annotations

from disc_tf.codegen.cpu_text import (
    CASCADED_COMBINERS,
    accumulator_elem,
    comment,
    product,
    rounds_once,
)
from disc_tf.codegen.cuda_config import (
    BLOCK,
    ITEMSIZE_COMPUTE,
    MAX_GRID,
    ROW_CACHE_BYTES,
    SPLIT_REDUCE_BLOCKS,
    SPLIT_REDUCE_CHUNK,
    SPLIT_REDUCE_MIN,
    THREAD_REDUCE_MIN,
    WARP_ROW_MAX,
    WARP_ROWS_MIN,
)
from disc_tf.codegen.cuda_ops import (
    COMPUTE,
    STORAGE,
    CudaCodegenError,
    cuda_expression,
    cuda_literal,
    dims_offset,
    load,
    store,
)
from disc_tf.fusion.plan import KernelOp
from disc_tf.ops.elementwise import arg_reduce_start


class CudaReductionEmitter:
    """Stitch and reduce kernels (mixed into ``CudaKernelEmitter``)."""

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
            lines.append("    const int64_t idx = disc_divmod(rem, a.dims[d]);")
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
        # the product of the outer dims (not a.n / cols: a row may be empty)
        rows = " * ".join(f"a.dims[{d}]" for d in range(self.rank - 1)) or "1"
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

    def arg_reduce(self) -> str:
        """ArgMax/ArgMin over one dim, one thread per output: the position of the first
        extreme value (the CPU kernel's rule)."""
        k = self.k
        (op,) = k.ops
        (axis,) = k.reduce_dims
        kept = [d for d in range(self.rank) if d != axis]
        in_elem, out_elem = self.buf(k.inputs[0]).elem, self.out_elem(0)
        vt, st = COMPUTE[in_elem], STORAGE[in_elem]
        better = ">" if op.attrs["direction"] == "max" else "<"
        base = ["    int64_t rem = o;", "    int64_t base = 0;", *dims_offset(kept, "    ")]
        thread = self.function("reduce_thread")
        warp, block = self.function("reduce_warp"), self.function("reduce_block")
        better_pair = f"pv {better} best || (pv == best && pa < at)"
        start = arg_reduce_start(in_elem, op.attrs["direction"])
        group = [
            f"// {comment(op.tf_node)}: arg{op.attrs['direction']} along dim {axis}, GROUP threads",
            "// per output (a warp or a block), thread t folding elements t, t + GROUP, ...;",
            "// the best of theirs, ties to the lowest position. TF's rule: from the type's",
            "// extreme value at position 0 (-1 here until the reduction ends), to strictly",
            "// better elements only (so a NaN never counts).",
            "template <int GROUP>",
            f"DISC_DEV int64_t {k.name}_arg_group(const {self.args}& a, int64_t o, int tid, "
            f"{vt}* smem_v, int64_t* smem_i) {{",
            f"  const {st}* __restrict__ r0 = static_cast<const {st}*>(a.in0);",
            *[x[2:] for x in base],
            f"  const int64_t stride = a.in0_strides[{axis}];",
            f"  {vt} best = {start};",
            "  int64_t at = -1;  // no element counted yet",
            "  for (int64_t q = tid; q < a.reduced; q += GROUP) {",
            f"    const {vt} v = {load('r0[base + q * stride]', in_elem)};",
            f"    if (v {better} best) {{ best = v; at = q; }}",
            "  }",
            "  for (int m = 16; m > 0; m >>= 1) {",
            f"    const {vt} pv = disc_shfl_xor(best, m);",
            "    const int64_t pa = disc_shfl_xor(at, m);",
            f"    if ({better_pair}) {{ best = pv; at = pa; }}",
            "  }",
            "  if (GROUP > 32) {  // across the warps of the block, through shared memory",
            "    if ((tid & 31) == 0) { smem_v[tid >> 5] = best; smem_i[tid >> 5] = at; }",
            "    __syncthreads();",
            "    best = smem_v[0];",
            "    at = smem_i[0];",
            "    for (int w = 1; w < GROUP / 32; ++w) {",
            f"      const {vt} pv = smem_v[w];",
            "      const int64_t pa = smem_i[w];",
            f"      if ({better_pair}) {{ best = pv; at = pa; }}",
            "    }",
            "    __syncthreads();",
            "  }",
            "  return at < 0 ? 0 : at;",
            "}",
            "",
            "// One warp per output (many outputs, or short reduced dims).",
            f'extern "C" __global__ void __launch_bounds__({BLOCK}) {warp}(const {self.args} a) {{',
            f"  {STORAGE[out_elem]}* __restrict__ w0 = static_cast<{STORAGE[out_elem]}*>(a.out0);",
            "  const int64_t warps = ((int64_t)gridDim.x * blockDim.x) >> 5;",
            "  for (int64_t o = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; "
            "o < a.outputs; o += warps) {",
            f"    const int64_t at = {k.name}_arg_group<32>(a, o, threadIdx.x & 31, nullptr, nullptr);",
            f"    if ((threadIdx.x & 31) == 0) w0[o] = {store('at', out_elem)};",
            "  }",
            "}",
            "",
            "// One block per output (few outputs over many elements).",
            f'extern "C" __global__ void __launch_bounds__({BLOCK}) {block}(const {self.args} a) {{',
            f"  {STORAGE[out_elem]}* __restrict__ w0 = static_cast<{STORAGE[out_elem]}*>(a.out0);",
            f"  __shared__ {vt} smem_v[{BLOCK // 32}];  // each warp's best",
            f"  __shared__ int64_t smem_i[{BLOCK // 32}];",
            "  for (int64_t o = blockIdx.x; o < a.outputs; o += gridDim.x) {",
            f"    const int64_t at = {k.name}_arg_group<{BLOCK}>(a, o, threadIdx.x, smem_v, smem_i);",
            f"    if (threadIdx.x == 0) w0[o] = {store('at', out_elem)};",
            "  }",
            "}",
            "",
        ]
        return "\n".join(group + [
            f"// {comment(op.tf_node)}: arg{op.attrs['direction']} along dim {axis}, one thread per output",
            f'extern "C" __global__ void __launch_bounds__({BLOCK}) {thread}(const {self.args} a) {{',
            f"  const {st}* __restrict__ r0 = static_cast<const {st}*>(a.in0);",
            f"  {STORAGE[out_elem]}* __restrict__ w0 = static_cast<{STORAGE[out_elem]}*>(a.out0);",
            "  for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < a.outputs;"
            " o += (int64_t)gridDim.x * blockDim.x) {",
            *base,
            f"    {vt} best = {start};  // TF's rule, as above",
            "    int64_t at = 0;",
            "    for (int64_t q = 0; q < a.reduced; ++q) {",
            f"      const {vt} v = {load(f'r0[base + q * a.in0_strides[{axis}]]', in_elem)};",
            f"      if (v {better} best) {{ best = v; at = q; }}",
            "    }",
            f"    w0[o] = {store('at', out_elem)};",
            "  }",
            "}",
        ])

    def generic_reduce(self) -> str:
        """One reduction over ``reduce_dims``: thread-, warp- and block-per-output and split
        (several blocks per output, then their partials combined) versions."""
        k, r = self.k, self.rank
        if len(k.ops) == 1 and k.ops[0].op == "arg_reduce" and len(k.outputs) == 1:
            return self.arg_reduce()
        if len(k.ops) != 1 or k.ops[0].op != "reduce" or len(k.outputs) != 1:
            raise CudaCodegenError(f"CUDA codegen: reduce kernel {k.name} is not a single reduction")
        (op,) = k.ops
        kept = [d for d in range(r) if d not in k.reduce_dims]
        in_elem, out_elem = self.buf(k.inputs[0]).elem, self.out_elem(0)
        acc_elem = accumulator_elem(op.elem, op.attrs["combiner"])
        ct = COMPUTE[acc_elem]
        comb = cuda_expression(op.attrs["combiner"], ["acc", "x"], acc_elem, [acc_elem] * 2, {})
        cascaded = op.attrs["combiner"] in CASCADED_COMBINERS
        base = ["  int64_t rem = o;", "  int64_t base = 0;", *dims_offset(kept, "  ")]
        if len(k.reduce_dims) == 1:  # q indexes the one reduced dim: no division
            offset = [f"    const int64_t off = base + q * a.in0_strides[{k.reduce_dims[0]}];"]
        else:  # one run (the host found the dims' strides chained), else per dim
            offset = ["    int64_t off = base + q * a.reduced_stride;",
                      "    if (a.reduced_stride == 0) {",
                      "      int64_t rq = q;", "      off = base;",
                      *dims_offset(k.reduce_dims, "      ", rem="rq", off="off"), "    }"]
        fold = [f"    const {ct} x = {load('r0[off]', in_elem)};", f"    acc = {comb};",
                *self._block_end(["acc"] if cascaded else [], [op])]
        st = STORAGE[in_elem]
        head = [f"  const {st}* __restrict__ r0 = static_cast<const {st}*>(a.in0);",
                f"  {STORAGE[out_elem]}* __restrict__ w0 = static_cast<{STORAGE[out_elem]}*>(a.out0);"]
        thread, block = self.function("reduce_thread"), self.function("reduce_block")
        lines = [
            f"// {comment(op.tf_node)}: reduce dims {k.reduce_dims} of {r} by {op.attrs['combiner']}",
            f"DISC_DEV {ct} {k.name}_fold(const {self.args}& a, int64_t o, int64_t q0, int64_t end, "
            "int64_t step) {",
            *head[:1], *base, *self._accumulator(op, "acc", cascaded),
            *(["  int filled = 0;  // this thread's elements in its current block"] if cascaded else []),
            "  for (int64_t q = q0; q < end; q += step) {", *offset, *fold, "  }",
            *(self._cascade_total("acc", op) if cascaded else []),
            "  return acc;", "}", "",
            "// One thread per output: adjacent threads read adjacent kept elements.",
            f'extern "C" __global__ void __launch_bounds__({BLOCK}) {thread}(const {self.args} a) {{',
            *head[1:],
            "  for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < a.outputs;"
            " o += (int64_t)gridDim.x * blockDim.x)",
            f"    w0[o] = {store(f'{k.name}_fold(a, o, 0, a.reduced, 1)', out_elem)};",
            "}", "",
            "// One block per output, for few outputs over many elements.",
            f'extern "C" __global__ void __launch_bounds__({BLOCK}) {block}(const {self.args} a) {{',
            *head[1:],
            f"  __shared__ double smem[{BLOCK // 32}];  // one partial result per warp",
            "  const int tid = threadIdx.x;",
            "  for (int64_t o = blockIdx.x; o < a.outputs; o += gridDim.x) {",
            f"    {ct} acc = {k.name}_fold(a, o, tid, a.reduced, {BLOCK});",
        ]
        group = ["  " + x.replace("GROUP", str(BLOCK)) for x in self._group_reduce(op, "acc")]
        lines += group
        lines += [f"    if (tid == 0) w0[o] = {store('acc', out_elem)};", "  }", "}", ""]
        warp = self.function("reduce_warp")
        lines += [
            "// One warp per output, for contiguous reduced elements (many outputs, or fewer",
            "// elements than a block): lanes read adjacent ones (a thread each would not coalesce).",
            f'extern "C" __global__ void __launch_bounds__({BLOCK}) {warp}(const {self.args} a) {{',
            *head[1:],
            f"  __shared__ double smem[{BLOCK // 32}];  // unused: a group is one warp",
            "  const int tid = threadIdx.x & 31;",
            "  const int64_t warps = ((int64_t)gridDim.x * blockDim.x) >> 5;",
            "  for (int64_t o = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; "
            "o < a.outputs; o += warps) {",
            f"    {ct} acc = {k.name}_fold(a, o, tid, a.reduced, 32);",
            *["  " + x.replace("GROUP", "32") for x in self._group_reduce(op, "acc")],
            f"    if (tid == 0) w0[o] = {store('acc', out_elem)};",
            "  }",
            "}",
            "",
        ]
        split, partials = self.function("reduce_split"), self.function("reduce_partials")
        comb_parts = cuda_expression(op.attrs["combiner"], ["acc", "part[s]"], acc_elem,
                                     [acc_elem] * 2, {})
        lines += [
            "// Few outputs over very many elements: a.splits blocks per output, each folding",
            "// one contiguous range of the reduced elements into a.partial (then",
            f"// {partials} combines each output's partials in a fixed order: deterministic).",
            f'extern "C" __global__ void __launch_bounds__({BLOCK}) {split}(const {self.args} a) {{',
            f"  {ct}* __restrict__ partial = static_cast<{ct}*>(a.partial);",
            f"  __shared__ double smem[{BLOCK // 32}];  // one partial result per warp",
            "  const int tid = threadIdx.x;",
            "  const int64_t chunk = (a.reduced + a.splits - 1) / a.splits;",
            "  for (int64_t b = blockIdx.x; b < a.outputs * a.splits; b += gridDim.x) {",
            "    const int64_t o = b / a.splits, begin = (b % a.splits) * chunk;",
            "    const int64_t end = begin + chunk < a.reduced ? begin + chunk : a.reduced;",
            f"    {ct} acc = {k.name}_fold(a, o, begin + tid, end, {BLOCK});",
            *group,
            "    if (tid == 0) partial[b] = acc;",
            "  }",
            "}",
            "",
            "// One block per output: thread t combines partials t, t + block, ... and the",
            "// block combines the threads' results in a fixed tree (deterministic).",
            f'extern "C" __global__ void __launch_bounds__({BLOCK}) {partials}(const {self.args} a) {{',
            *head[1:],
            f"  __shared__ double smem[{BLOCK // 32}];  // one partial result per warp",
            "  const int tid = threadIdx.x;",
            "  for (int64_t o = blockIdx.x; o < a.outputs; o += gridDim.x) {",
            f"    const {ct}* part = static_cast<const {ct}*>(a.partial) + o * a.splits;",
            f"    {ct} acc = {cuda_literal(op.attrs['init'], acc_elem)};",
            f"    for (int64_t s = tid; s < a.splits; s += {BLOCK}) acc = {comb_parts};",
            *group,
            f"    if (tid == 0) w0[o] = {store('acc', out_elem)};",
            "  }",
            "}",
        ]
        return "\n".join(lines)

    def stitch_launch(self) -> list[str]:
        """Host-runner lines after the args of a stitch kernel: the warp-per-row,
        cached block-per-row or block-per-row version, by row count and length."""
        plan, k, r = self.plan, self.k, self.rank
        # rows from the dims, not k.n / cols: empty rows (cols == 0) still get their
        # reductions' initial values
        rows = product(k.dims[:-1], plan) if r > 1 else "1"
        lines = [f"    const int64_t cols = k.dims[{r - 1}];", f"    const int64_t rows = {rows};",
                 "    if (rows > 0) {"]
        few_rows = f" && rows >= {WARP_ROWS_MIN}" if WARP_ROWS_MIN else ""
        lines.append(f"      if (cols <= {WARP_ROW_MAX}{few_rows}) {{  // one warp per row")
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

    def reduce_launch(self) -> list[str]:
        """Host-runner lines after the args of a reduce kernel: the thread, warp, block
        or split version, by output count, reduced count and the reduced elements'
        layout (adjacent in memory or not)."""
        plan, k, r = self.plan, self.k, self.rank
        kept = [s for d, s in enumerate(k.dims) if d not in k.reduce_dims]
        reduced = [s for d, s in enumerate(k.dims) if d in k.reduce_dims]
        lines = [f"    k.reduced = {product(reduced, plan)};", f"    k.outputs = {product(kept, plan)};"]
        rd = k.reduce_dims
        if len(rd) > 1 and rd == list(range(rd[0], rd[-1] + 1)):  # adjacent dims
            chain = " && ".join(f"k.in0_strides[{d}] == k.in0_strides[{d + 1}] * k.dims[{d + 1}]"
                                for d in rd[:-1])
            lines.append(f"    if ({chain}) k.reduced_stride = k.in0_strides[{rd[-1]}];"
                         "  // one run: no per-element division")
        # reduced elements adjacent in memory: a thread per output would not coalesce
        contiguous = f"k.in0_strides[{r - 1}] == 1" if r - 1 in k.reduce_dims else "false"
        arg = k.ops[-1].op == "arg_reduce"
        lines += ["    if (k.outputs > 0) {", f"      const bool contiguous = {contiguous};"]
        thread_cond = (f"k.reduced < 32 || (!contiguous && k.outputs >= {THREAD_REDUCE_MIN})"
                       if arg else f"contiguous ? k.reduced < 32 : (k.outputs >= "
                       f"{THREAD_REDUCE_MIN} || k.reduced < {BLOCK})")
        lines.append(f"      if ({thread_cond}) {{  // one thread per output")
        lines.append(self._launch("reduce_thread", f"disc_grid(k.outputs, {BLOCK}, {MAX_GRID})",
                                  "        "))
        warp_cond = f"k.outputs >= {THREAD_REDUCE_MIN} || k.reduced < {BLOCK}"
        lines.append(f"      }} else if ({warp_cond if arg else f'contiguous && ({warp_cond})'}) "
                     "{  // one warp per output")
        lines.append(self._launch("reduce_warp", f"disc_grid(k.outputs, {BLOCK // 32}, {MAX_GRID})",
                                  "        "))
        if arg:  # no split version
            lines.append("      } else {  // one block per output")
            lines.append(self._launch("reduce_block", f"disc_grid(k.outputs, 1, {MAX_GRID})",
                                      "        "))
            return lines + ["      }", "    }", "  }"]
        lines.append(f"      }} else if (k.reduced >= {SPLIT_REDUCE_MIN} && k.outputs < "
                     f"{SPLIT_REDUCE_BLOCKS}) {{  // few outputs, many elements: split")
        acc = accumulator_elem(k.ops[0].elem, k.ops[0].attrs["combiner"])
        chunks = f"(k.reduced + {SPLIT_REDUCE_CHUNK - 1}) / {SPLIT_REDUCE_CHUNK}"
        lines.append(f"        k.splits = {chunks} < {SPLIT_REDUCE_BLOCKS} / k.outputs ? {chunks} "
                     f": {SPLIT_REDUCE_BLOCKS} / k.outputs;")
        lines.append(f"        k.partial = ral->alloc_temp(ral, k.outputs * k.splits * "
                     f"(int64_t)sizeof({COMPUTE[acc]}));")
        lines.append("        if (k.partial == nullptr) return 1;")
        lines.append(self._launch("reduce_split", f"disc_grid(k.outputs * k.splits, 1, {MAX_GRID})",
                                  "        "))
        lines.append(self._launch("reduce_partials", f"disc_grid(k.outputs, 1, {MAX_GRID})",
                                  "        "))
        lines.append("        ral->free_temp(ral, k.partial);  // stream-ordered")
        lines.append("      } else {")
        lines.append(self._launch("reduce_block", f"disc_grid(k.outputs, 1, {MAX_GRID})",
                                  "        "))
        lines += ["      }", "    }", "  }"]
        return lines
