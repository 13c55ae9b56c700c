"""CPU kernel emitters: one C++ function family per planned kernel.

Loop kernels get a compute function over element values, a flat version and,
where an input may be broadcast, a strided version; stitch kernels run one row
per task with a pass per level of reductions (``cpu_stitch.py``); reduce kernels
fold any dims; library kernels are calls the host runner makes (see ``cpu.py``).
"""

from __future__ import annotations

import dataclasses

from disc_tf.codegen import cpu_conv, cpu_gemm, cpu_reduce
from disc_tf.codegen.cpu_ops import (
    COMPUTE,
    STORAGE,
    expression,
    literal,
    op_cost,
)
from disc_tf.codegen.cpu_stitch import StitchEmitter
from disc_tf.codegen.cpu_text import (
    comment,
    concat_end_lines,
    concat_ops,
    gathered_ids_check,
    host_expr,
    input_stride_lines,
    pad_read_lines,
    product,
    sym,
    window_offset,
)
from disc_tf.fusion.plan import Access, Buffer, FusionPlan, Kernel, KernelOp


class KernelEmitter(StitchEmitter):
    """Emits the C++ of one kernel and the host lines that launch it."""

    def __init__(self, kernel: Kernel, plan: FusionPlan) -> None:
        self.k = kernel
        self.plan = plan
        self.rank = len(kernel.dims)
        #: prefix of the generated functions and structs; the CPU backend names each
        #: distinct kernel's code by its content (``cpu_units.py``)
        self.fn = kernel.name
        #: the library kernel this one is the epilogue of (runs inside its GEMM)
        self.epilogue_of = next((k.name for k in plan.kernels if k.epilogue == kernel.name), None)

    @property
    def args(self) -> str:
        """The name of the kernel's argument struct."""
        return f"{self.fn.capitalize()}Args"

    def buf(self, access: Access) -> Buffer:
        return self.plan.buffers[access.buffer]

    @property
    def host_scalars(self) -> list:
        """Distinct host-computed scalars the kernel's ops read, in first-use order."""
        return self.k.host_scalars

    def ref(self, kind: str, ref: object, elem: str, names: dict[str, str], inputs: str) -> str:
        """The C++ expression of one operand reference."""
        if kind == "in":
            return f"{inputs}{ref}"
        if kind == "val":
            return names[ref]
        if kind == "host":  # in the op's compute type: an integer mean divides as integers
            return f"({COMPUTE[elem]})a.h{self.host_scalars.index(ref)}"
        return literal(ref, elem)

    def struct(self) -> str:
        lines = [f"struct {self.args} {{", "  int64_t n;  // elements"]
        if self.k.kind == "reduce":
            lines += cpu_reduce.struct_fields(self)
        if self.rank:
            lines.append(f"  int64_t dims[{self.rank}];")
        for i, a in enumerate(self.k.inputs):
            b = self.buf(a)
            lines.append(f"  const {STORAGE[b.elem]}* in{i};  // {a}")
            if self.rank and a.ids_for is None:
                lines.append(f"  int64_t in{i}_strides[{self.rank}];")
            if a.pad is not None:
                lines.append(f"  int64_t in{i}_lo[{self.rank}], in{i}_size[{self.rank}], "
                             f"in{i}_pdim[{self.rank}];  // per dim: padding before, "
                             "unpadded and padded sizes")
            if a.gather is not None:
                lines.append(f"  int64_t in{i}_depth;  // elements per table row (the gathered "
                             "tensor's last dim)")
        for j, (value, bname) in enumerate(self.k.outputs):
            elem = self.plan.buffers[bname].elem
            lines.append(f"  {STORAGE[elem]}* out{j};  // {bname} ({value})")
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

    def compute(self) -> str:
        params = [f"const {self.args}& a"]
        params += [f"{COMPUTE[self.buf(a).elem]} in{i}" for i, a in enumerate(self.k.inputs)]
        params += [
            f"{COMPUTE[self.plan.buffers[b].elem]}& out{j}" for j, (_, b) in enumerate(self.k.outputs)
        ]
        names: dict[str, str] = {}
        body = []
        for n, op in enumerate(self.k.ops):
            args = [self.ref(kind, ref, elem, names, "in")
                    for (kind, ref), elem in zip(op.operands, op.operand_elems)]
            var = f"v{n}"
            names[op.value] = var
            if op.op == "concatenate":  # the row loop loads the part holding the element
                expr = args[0]
            else:
                expr = expression(op.op, args, op.elem, op.operand_elems, op.attrs)
            body.append(
                f"  const {COMPUTE[op.elem]} {var} = {expr};  // {comment(op.tf_node)}: {op.op}"
            )
        for j, (value, _) in enumerate(self.k.outputs):
            body.append(f"  out{j} = {names[value]};")
        head = f"static inline void {self.fn}_compute({', '.join(params)}) {{"
        return "\n".join([head, *body, "}"])

    def _loop(self, index: dict[int, str], out_index: str,
              pointer: dict[int, str] | None = None, load: dict[int, str] | None = None) -> list[str]:
        """One element: loads, the compute call, stores. ``pointer``: inputs loaded
        through another pointer (a concatenation's part), or not at all (None);
        ``load``: inputs loaded by the given expression (a pad's segments)."""
        pointer = pointer or {}
        loads = []
        for i, a in enumerate(self.k.inputs):
            ct = COMPUTE[self.buf(a).elem]
            if load and i in load:
                loads.append(load[i])
            elif i in pointer and pointer[i] is None:
                loads.append(f"({ct})0")  # a part not holding this element
            else:
                loads.append(self._load(i, ct, index[i], pointer.get(i, f"r{i}")))
        lines = []
        outs = []
        for j, (_, b) in enumerate(self.k.outputs):
            elem = self.plan.buffers[b].elem
            lines.append(f"    {COMPUTE[elem]} o{j};")
            outs.append(f"o{j}")
        lines.append(f"    {self.fn}_compute({', '.join(['a'] + loads + outs)});")
        for j, (_, b) in enumerate(self.k.outputs):
            elem = self.plan.buffers[b].elem
            lines.append(f"    w{j}[{out_index}] = ({STORAGE[elem]})o{j};")
        return lines

    def _pointers(self, offset: str) -> list[str]:
        lines = [f"  const {self.args}& a = *static_cast<const {self.args}*>(p);"]
        for i, acc in enumerate(self.k.inputs):
            off = offset.format(i=i)
            lines.append(f"  const {STORAGE[self.buf(acc).elem]}* __restrict r{i} = a.in{i}{off};")
        for j, (_, b) in enumerate(self.k.outputs):
            lines.append(f"  {STORAGE[self.plan.buffers[b].elem]}* __restrict w{j} = a.out{j};")
        return lines

    def flat(self) -> str:
        """Flat version: elements [begin, end), every input read at the output's index.
        ``omp simd`` as in the row loop: without it GCC left loops of many inputs scalar
        (MobileNetV2's batch-norm parameters, 24 inputs and 12 outputs a loop: one scalar
        sqrt and division per element)."""
        lines = [f"DISC_CLONES DISC_ENTRY void {self.fn}_flat(void* p, int64_t begin, int64_t end) {{"]
        lines += self._pointers("")
        lines.append("  #pragma omp simd")
        lines.append("  for (int64_t i = begin; i < end; ++i) {")
        lines += self._loop({i: "i" for i in range(len(self.k.inputs))}, "i")
        lines += ["  }", "}"]
        return "\n".join(lines)

    def inner_index(self) -> tuple[dict[int, str], list[int], list[int], bool]:
        """How each input is indexed along the innermost dim ``c`` of a row.

        Identity reads are contiguous (``c``); broadcast reads have an innermost
        stride of 0 or 1: known from static dims (a bias of 768 runs along the row),
        else a template flag ``Bi`` each when there are at most three (so every case
        is a contiguous or constant loop the compiler vectorizes); transposed and
        windowed reads, and further broadcasts, use their stride. Returns (index per
        input, broadcast inputs decided per call, strided inputs, templated).
        """
        static = {i: self._static_row_read(acc) for i, acc in enumerate(self.k.inputs)}
        static = {i: read for i, read in static.items() if read is not None}
        # a table row a gather picks is contiguous (its ids are not read per element), so
        # is the row of a pad read in place (``_load`` reads it)
        static.update({i: "0" if acc.ids_for is not None else "c" for i, acc in enumerate(self.k.inputs)
                       if acc.gather or acc.pad or acc.ids_for is not None})
        bcast = [i for i, acc in enumerate(self.k.inputs)
                 if not acc.is_identity and not acc.permuted and i not in static]
        strided = [i for i, acc in enumerate(self.k.inputs) if acc.permuted and i not in static]
        templated = len(bcast) <= 3
        if templated:
            index = {i: (f"B{i} ? c : 0" if i in bcast else "c") for i in range(len(self.k.inputs))}
        else:
            index = {i: (f"c * st{i}" if i in bcast else "c") for i in range(len(self.k.inputs))}
        index.update(static)
        index.update({i: f"c * st{i}" for i in strided})
        return index, bcast, strided, templated

    def _static_row_read(self, acc: Access) -> str | None:
        """``c`` or ``0`` if a broadcast read's innermost stride (1 or 0) follows from
        static dims; None if it is known only per call."""
        if acc.is_identity or acc.permuted or acc.window is not None or not self.rank:
            return None
        b, last = self.buf(acc), self.rank - 1
        dims_map = acc.dims if acc.dims is not None else list(range(self.rank))
        along = [bd for bd in range(len(b.dims)) if dims_map[bd] == last]
        if not along:
            return "0"  # no dim of the input runs along the row: one value per row
        if along != [len(b.dims) - 1]:
            return None
        d = self.plan.symbols[b.dims[-1]]
        if d.kind != "const":
            return None
        return "0" if d.value == 1 else "c"

    def flag_dispatch(self, fn: str, call_args: str, bcast: list[int]) -> list[str]:
        """A switch calling the instance of template ``fn`` for this call's broadcasts."""
        r = self.rank
        mask = " | ".join(f"(a.in{i}_strides[{r - 1}] != 0) << {n}" for n, i in enumerate(bcast))
        lines = [f"  switch ({mask}) {{"]
        for m in range(1 << len(bcast)):
            args = ", ".join("true" if m >> n & 1 else "false" for n in range(len(bcast)))
            lines.append(f"    case {m}: {fn}<{args}>({call_args}); break;")
        lines.append("  }")
        return lines

    def broadcast(self) -> str:
        """Row-wise version: ``{k}_rows`` over rows [begin, end), columns [c0, c1)
        (the host's broadcast version takes whole rows; a GEMM epilogue, a block)."""
        r = self.rank
        k = self.fn
        index, bcast, strided, templated = self.inner_index()
        flags = [f"B{i}" for i in bcast]
        head = (f"template <{', '.join(f'bool {f}' for f in flags)}>\n" if templated and flags
                else "")
        lines = [
            "// Rows [begin, end) of the innermost dim, columns [c0, c1); inputs read",
            "// through strides (0 = broadcast). Flag Bi: input i runs along the row.",
            f"{head}static inline __attribute__((always_inline)) void {k}_rows(",
            f"    const {self.args}& a, int64_t begin, int64_t end, int64_t c0, int64_t c1) {{",
            f"  const int64_t inner = a.dims[{r - 1}];",
            "  for (int64_t row = begin; row < end; ++row) {",
        ]
        self._row_offsets(lines, "    ")
        outer = [(n, op) for n, op in self.concats() if op.attrs["axis"] < r - 1]
        inner = [(n, op) for n, op in self.concats() if op.attrs["axis"] == r - 1]
        pointer: dict[int, str | None] = {}
        for n, op in outer:  # one part holds the whole row: its pointer, chosen per row
            pointer.update(self._row_part(lines, n, op, index))
        for i, acc in enumerate(self.k.inputs):
            if acc.ids_for is not None:
                pointer[i] = None  # read once per row, by the gather's row pointer
            if i in pointer:
                continue
            if acc.gather is not None:
                lines.append(f"    // {comment(acc.gather.tf_node)}: the table row its id picks")
            lines.append(f"    const {STORAGE[self.buf(acc).elem]}* __restrict r{i} = "
                         f"a.in{i} + {self._row_start(i)};")
            if (not templated and i in bcast) or i in strided:
                lines.append(f"    const int64_t st{i} = a.in{i}_strides[{r - 1}];")
        for j, (_, b) in enumerate(self.k.outputs):
            lines.append(
                f"    {STORAGE[self.plan.buffers[b].elem]}* __restrict w{j} = a.out{j} + row * inner;"
            )
        padded = [i for i, acc in enumerate(self.k.inputs) if acc.pad is not None]
        if not inner and padded:
            lines += self._pad_segments(padded[0], index, pointer)
        elif not inner:
            if not strided:  # contiguous or broadcast reads: no peeling, no cost-model veto
                lines.append("    #pragma omp simd")
            lines.append("    for (int64_t c = c0; c < c1; ++c) {")
            lines += ["  " + x for x in self._loop(index, "c", pointer)]
            lines.append("    }")
        else:  # one column segment per part of the innermost concatenation
            (n, op), = inner
            parts = [ref for _, ref in op.operands]
            lines.append(f"    // {comment(op.tf_node)}: one segment of columns per part")
            for p, i in enumerate(parts):
                start = self._part_start(n, p)
                lines.append(f"    for (int64_t c = {start} > c0 ? {start} : c0, "
                             f"e = a.cat{n}[{p}] < c1 ? a.cat{n}[{p}] : c1; c < e; ++c) {{")
                seg = dict(pointer)  # the op reads its first operand: load part i there
                seg.update({j: None for j in parts[1:]})
                seg[parts[0]] = f"r{i}"
                seg_index = dict(index)
                shifted = f"c - {start}" if p else "c"
                seg_index[parts[0]] = (shifted if self._contiguous_part(i)
                                       else f"({shifted}) * st{i}")
                lines += ["  " + x for x in self._loop(seg_index, "c", seg)]
                lines.append("    }")
        lines += ["  }", "}", ""]
        lines.append(f"DISC_CLONES DISC_ENTRY void {k}_bcast(void* p, int64_t begin, int64_t end) {{")
        lines.append(f"  const {self.args}& a = *static_cast<const {self.args}*>(p);")
        lines += self._rows_call("a", "begin", "end", "0", f"a.dims[{r - 1}]")
        lines.append("}")
        return "\n".join(lines)

    def _pad_segments(self, i: int, index: dict[int, str], pointer: dict) -> list[str]:
        """The row's columns [c0, c1) as three plain loops around the columns of pad
        read ``i`` inside the unpadded tensor: the constant before and after them, its
        elements among them (so each loop vectorizes as a dense one)."""
        acc, r = self.k.inputs[i], self.rank
        ct = COMPUTE[self.buf(acc).elem]
        outside = f"({ct}){literal(acc.pad.value, self.buf(acc).elem)}"
        inside = f"({ct})r{i}[c - a.in{i}_lo[{r - 1}]]"
        lines = [f"    // {comment(acc.pad.tf_node)}: the constant, the tensor's columns, the constant",
                 f"    const int64_t e0 = clo{i} < c0 ? c0 : clo{i} > c1 ? c1 : clo{i};",
                 f"    const int64_t e1 = chi{i} < e0 ? e0 : chi{i} > c1 ? c1 : chi{i};"]
        for begin, end, value in (("c0", "e0", outside), ("e0", "e1", inside), ("e1", "c1", outside)):
            lines.append(f"    for (int64_t c = {begin}; c < {end}; ++c) {{")
            lines += ["  " + x for x in self._loop(index, "c", pointer, {i: value})]
            lines.append("    }")
        return lines

    def _flag_call(self, fn: str, call_args: str) -> list[str]:
        """Lines calling ``fn`` (templated on the broadcast flags: through the switch)."""
        _, bcast, _, templated = self.inner_index()
        if not (templated and bcast):
            return [f"  {fn}({call_args});"]
        return self.flag_dispatch(fn, call_args, bcast)

    def _rows_call(self, a: str, begin: str, end: str, c0: str, c1: str) -> list[str]:
        """Lines calling a loop kernel's ``{k}_rows``."""
        return self._flag_call(f"{self.fn}_rows", f"{a}, {begin}, {end}, {c0}, {c1}")

    @property
    def epilogue_struct(self) -> str:
        return f"{self.fn.capitalize()}Epilogue"

    def epilogue(self) -> str:
        """The kernel as a GEMM epilogue: rows [i0, i1), columns [j0, j1) of product
        q of C, which are rows q * m + i of this kernel (C's shape is its own)."""
        k, e = self.fn, self.epilogue_struct
        lines = [
            f"// {k} as the epilogue of the GEMM writing its input: one block of C.",
            f"struct {e} {{",
            f"  const {self.args}* args;",
            "  int64_t m;  // rows of C per product",
            "  int64_t t;  // rows of this kernel per row of C (1 unless it reads a view)",
            "};",
            "",
            f"DISC_CLONES DISC_ENTRY void {k}_epilogue(void* p, int64_t q, int64_t i0, int64_t i1,",
            "                                     int64_t j0, int64_t j1) {",
            f"  const {e}& e = *static_cast<const {e}*>(p);",
            f"  const {self.args}& a = *e.args;",
        ]
        begin, end = "(q * e.m + i0) * e.t", "(q * e.m + i1) * e.t"
        if self.k.kind == "stitch":  # blocks of whole rows (full_rows): j0 = 0, j1 = n
            lines += ["  (void)j0;", "  (void)j1;"]
            lines += self._row_range_call("a", begin, end)
        else:  # t > 1 comes with whole rows, so columns [0, n) are rows of t x inner
            lines.append(f"  const int64_t c0 = e.t == 1 ? j0 : 0, "
                         f"c1 = e.t == 1 ? j1 : a.dims[{self.rank - 1}];")
            lines += self._rows_call("a", begin, end, "c0", "c1")
        lines.append("}")
        return "\n".join(lines)

    def cost(self) -> int:
        return max(1, sum(op_cost(op.op) for op in self.k.ops))

    @property
    def rows_only(self) -> bool:
        """True if an input is read in place through rows the host cannot flatten (a
        gather's table rows, a pad): the kernel has no flat version."""
        return any(a.gather is not None or a.pad is not None for a in self.k.inputs)

    def source(self) -> str:
        header = (
            f"// ---- {self.k.name}: {self.k.kind} fusion over "
            f"[{', '.join(sym(d, self.plan) for d in self.k.dims)}]\n"
            f"// TF ops: {comment(', '.join(self.k.tf_ops))}"
        )
        if self.k.kind == "library":
            return header + "\n// (a GEMM through the RAL; no generated code)"
        if self.k.kind == "stitch":
            parts = [header, self.struct(), self.stitch()]
            return "\n\n".join(parts + ([self.epilogue()] if self.epilogue_of else []))
        if self.k.kind == "reduce":
            return "\n\n".join([header, self.struct(), cpu_reduce.reduce_source(self)])
        parts = [header, self.struct(), self.compute()] + ([] if self.rows_only else [self.flat()])
        if (self.k.needs_broadcast_version or self.epilogue_of) and self.rank:
            parts.append(self.broadcast())
        if self.epilogue_of:
            parts.append(self.epilogue())
        return "\n\n".join(parts)

    def library_launch(self, buffer_ptr: dict[str, str],
                       epilogue: KernelEmitter | None = None,
                       chain: KernelEmitter | None = None,
                       shares: list[KernelEmitter] | None = None,
                       producer: tuple[KernelEmitter, KernelEmitter] | None = None) -> list[str]:
        """Host-runner lines of a library kernel (``cpu_gemm.py``, convolutions
        ``cpu_conv.py``); ``producer``: the depthwise convolution and its epilogue
        making its A per task (``fusion/produced_a.py``)."""
        if producer is not None:
            return cpu_gemm.produced_launch(self, buffer_ptr, epilogue, producer)
        if shares:
            return cpu_gemm.shared_a_launch(self, buffer_ptr, shares, epilogue)
        op = self.k.ops[0].op
        if op == "conv_taps":
            return cpu_conv.conv_taps_launch(self, buffer_ptr, epilogue)
        if op == "conv_rows":
            return cpu_conv.conv_rows_launch(self, buffer_ptr, epilogue)
        return cpu_gemm.library_launch(self, buffer_ptr, epilogue, chain)

    def launch(self, buffer_ptr: dict[str, str]) -> list[str]:
        """Host-runner lines that fill the args and launch the kernel."""
        plan, k = self.plan, self.k
        if k.kind == "library":
            return self.library_launch(buffer_ptr)
        lines = [f"  {{  // {k.name}: {comment(', '.join(k.tf_ops))}"]
        lines += self.launch_args(buffer_ptr)
        flat_conds = []
        for acc in k.inputs:
            if acc.permuted:
                flat_conds.append("false")  # a transposed read is never flat
            elif not acc.is_identity:
                flat_conds.append(f"{product(self.buf(acc).dims, plan)} == k.n")
        return lines + self._launch_lines(flat_conds)

    def launch_args(self, buffer_ptr: dict[str, str]) -> list[str]:
        """Host-runner lines declaring ``k``, the kernel's args, and filling them."""
        plan, k, r = self.plan, self.k, self.rank
        lines = [f"    {self.args} k{{}};", f"    k.n = {product(k.dims, plan)};"]
        for d, s in enumerate(k.dims):
            lines.append(f"    k.dims[{d}] = {sym(s, plan)};")
        for i, acc in enumerate(k.inputs):
            b = self.buf(acc)
            if acc.window is None:
                lines.append(f"    k.in{i} = {buffer_ptr[b.name]};")
            else:  # a slice read in place: start offset, strides times steps
                lines.append(f"    k.in{i} = {buffer_ptr[b.name]} + ({window_offset(acc, b, plan)});"
                             "  // window")
            if acc.gather is not None:  # strides of the gathered tensor it stands for
                lines += input_stride_lines(i, acc, dataclasses.replace(b, dims=acc.gather.dims),
                                            r, plan)
                lines += [f"    k.in{i}_depth = {sym(b.dims[1], plan)};"]
            elif r and acc.ids_for is None:
                lines += input_stride_lines(i, acc, b, r, plan)
            if acc.pad is not None:
                lines += pad_read_lines(i, acc, b, r, plan)
        for j, (_, bname) in enumerate(k.outputs):
            lines.append(f"    k.out{j} = {buffer_ptr[bname]};")
        for i, h in enumerate(self.host_scalars):
            lines.append(f"    k.h{i} = (double)({host_expr(h, plan)});")
        for acc in k.inputs:
            if acc.gather is not None:
                lines += gathered_ids_check(acc, self.buf(acc), self.buf(k.inputs[acc.gather.ids]),
                                            plan)
        return lines + concat_end_lines(k, plan)

    def _launch_lines(self, flat_conds: list[str]) -> list[str]:
        """The parallel_for launching the kernel on filled args ``k``; closes the scope."""
        plan, k, r = self.plan, self.k, self.rank
        lines: list[str] = []
        cost = self.cost()
        if k.kind == "stitch":
            rows = product(k.dims[:-1], plan)
            lines.append(f"    const int64_t rows = {rows};")
            lines.append("    if (rows > 0) {")
            lines.append(f"      ral->parallel_for(ral, rows, {cost}.0 * k.dims[{r - 1}] + 1.0,"
                         f" {self.fn}_rows, &k);")
            lines += ["    }", "  }"]
            return lines
        if k.kind == "reduce":
            return lines + cpu_reduce.reduce_launch(self, cost)
        lines.append("    if (k.n > 0) {")
        if self.rows_only:  # table rows or a pad read in place: never the flat version
            lines.append(
                f"      ral->parallel_for(ral, k.n / k.dims[{r - 1}], {cost}.0 * k.dims[{r - 1}],"
                f" {self.fn}_bcast, &k);"
            )
        elif k.needs_broadcast_version and r:
            cond = " && ".join(flat_conds)
            lines.append(f"      if ({cond}) {{  // no input is broadcast in this call")
            lines.append(f"        ral->parallel_for(ral, k.n, {cost}, {self.fn}_flat, &k);")
            lines.append("      } else {")
            lines.append(
                f"        ral->parallel_for(ral, k.n / k.dims[{r - 1}], {cost}.0 * k.dims[{r - 1}],"
                f" {self.fn}_bcast, &k);"
            )
            lines.append("      }")
        else:
            lines.append(f"      ral->parallel_for(ral, k.n, {cost}, {self.fn}_flat, &k);")
        lines += ["    }", "  }"]
        return lines


