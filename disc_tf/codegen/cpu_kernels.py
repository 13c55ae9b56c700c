"""CPU kernel emitters: one C++ function family per planned kernel.

Loop kernels get a compute function over element values, a flat version and,
where an input may be broadcast, a strided version; stitch kernels run one row
per task with a pass per level of reductions; reduce kernels fold any dims;
library kernels are calls the host runner makes (see ``cpu.py``).
"""

from __future__ import annotations

from collections.abc import Callable

from disc_tf.codegen import cpu_gemm, cpu_reduce
from disc_tf.codegen.cpu_ops import (
    COMPUTE,
    STORAGE,
    expression,
    literal,
    op_cost,
)
from disc_tf.codegen.cpu_short_rows import SHORT_ROW, short_rows
from disc_tf.codegen.cpu_text import (
    CASCADED_COMBINERS,
    VECTOR_COMBINERS,
    accumulator_elem,
    comment,
    host_expr,
    product,
    rounds_once,
    sym,
)
from disc_tf.fusion.plan import Access, Buffer, FusionPlan, Kernel, KernelOp


class KernelEmitter:
    """Emits the C++ of one kernel and the host lines that launch it."""

    def __init__(self, kernel: Kernel, plan: FusionPlan) -> None:
        self.k = kernel
        self.plan = plan
        self.rank = len(kernel.dims)
        self.args = f"{kernel.name.capitalize()}Args"
        #: the library kernel this one is the epilogue of (runs inside its GEMM)
        self.epilogue_of = next((k.name for k in plan.kernels if k.epilogue == kernel.name), None)

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
        if kind == "host":
            return f"a.h{self.host_scalars.index(ref)}"
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
            if self.rank:
                lines.append(f"  int64_t in{i}_strides[{self.rank}];")
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
        return [(n, op) for n, op in enumerate(self.k.ops) if op.op == "concatenate"]

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
        head = f"static inline void {self.k.name}_compute({', '.join(params)}) {{"
        return "\n".join([head, *body, "}"])

    def _loop(self, index: dict[int, str], out_index: str,
              pointer: dict[int, str] | None = None) -> list[str]:
        """One element: loads, the compute call, stores. ``pointer``: inputs loaded
        through another pointer (a concatenation's part), or not at all (None)."""
        pointer = pointer or {}
        loads = []
        for i, a in enumerate(self.k.inputs):
            ct = COMPUTE[self.buf(a).elem]
            if i in pointer and pointer[i] is None:
                loads.append(f"({ct})0")  # a part not holding this element
            else:
                loads.append(f"({ct}){pointer.get(i, f'r{i}')}[{index[i]}]")
        lines = []
        outs = []
        for j, (_, b) in enumerate(self.k.outputs):
            elem = self.plan.buffers[b].elem
            lines.append(f"    {COMPUTE[elem]} o{j};")
            outs.append(f"o{j}")
        lines.append(f"    {self.k.name}_compute({', '.join(['a'] + loads + outs)});")
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
        lines = [f"DISC_CLONES static void {self.k.name}_flat(void* p, int64_t begin, int64_t end) {{"]
        lines += self._pointers("")
        lines.append("  for (int64_t i = begin; i < end; ++i) {")
        lines += self._loop({i: "i" for i in range(len(self.k.inputs))}, "i")
        lines += ["  }", "}"]
        return "\n".join(lines)

    def inner_index(self) -> tuple[dict[int, str], list[int], list[int], bool]:
        """How each input is indexed along the innermost dim ``c`` of a row.

        Identity reads are contiguous (``c``); broadcast reads have an innermost
        stride of 0 or 1, a template flag ``Bi`` each when there are at most three
        (so every case is a contiguous or constant loop the compiler vectorizes);
        transposed and windowed reads, and further broadcasts, use their stride.
        Returns (index per input, broadcast inputs, strided inputs, templated).
        """
        bcast = [i for i, acc in enumerate(self.k.inputs)
                 if not acc.is_identity and not acc.permuted]
        strided = [i for i, acc in enumerate(self.k.inputs) if acc.permuted]
        templated = len(bcast) <= 3
        if templated:
            index = {i: (f"B{i} ? c : 0" if i in bcast else "c") for i in range(len(self.k.inputs))}
        else:
            index = {i: (f"c * st{i}" if i in bcast else "c") for i in range(len(self.k.inputs))}
        index.update({i: f"c * st{i}" for i in strided})
        return index, bcast, strided, templated

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
        k = self.k.name
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
            if i in pointer:
                continue
            lines.append(
                f"    const {STORAGE[self.buf(acc).elem]}* __restrict r{i} = a.in{i} + off{i};"
            )
            if (not templated and i in bcast) or i in strided:
                lines.append(f"    const int64_t st{i} = a.in{i}_strides[{r - 1}];")
        for j, (_, b) in enumerate(self.k.outputs):
            lines.append(
                f"    {STORAGE[self.plan.buffers[b].elem]}* __restrict w{j} = a.out{j} + row * inner;"
            )
        if not inner:
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
        lines.append(f"DISC_CLONES static void {k}_bcast(void* p, int64_t begin, int64_t end) {{")
        lines.append(f"  const {self.args}& a = *static_cast<const {self.args}*>(p);")
        lines += self._rows_call("a", "begin", "end", "0", f"a.dims[{r - 1}]")
        lines.append("}")
        return "\n".join(lines)

    def _flag_call(self, fn: str, call_args: str) -> list[str]:
        """Lines calling ``fn`` (templated on the broadcast flags: through the switch)."""
        _, bcast, _, templated = self.inner_index()
        if not (templated and bcast):
            return [f"  {fn}({call_args});"]
        return self.flag_dispatch(fn, call_args, bcast)

    def _rows_call(self, a: str, begin: str, end: str, c0: str, c1: str) -> list[str]:
        """Lines calling a loop kernel's ``{k}_rows``."""
        return self._flag_call(f"{self.k.name}_rows", f"{a}, {begin}, {end}, {c0}, {c1}")

    @property
    def epilogue_struct(self) -> str:
        return f"{self.k.name.capitalize()}Epilogue"

    def epilogue(self) -> str:
        """The kernel as a GEMM epilogue: rows [i0, i1), columns [j0, j1) of product
        q of C, which are rows q * m + i of this kernel (C's shape is its own)."""
        k, e = self.k.name, self.epilogue_struct
        lines = [
            f"// {k} as the epilogue of the GEMM writing its input: one block of C.",
            f"struct {e} {{",
            f"  const {self.args}* args;",
            "  int64_t m;  // rows of C per product",
            "  int64_t t;  // rows of this kernel per row of C (1 unless it reads a view)",
            "};",
            "",
            f"DISC_CLONES static void {k}_epilogue(void* p, int64_t q, int64_t i0, int64_t i1,",
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

    def source(self) -> str:
        header = (
            f"// ---- {self.k.name}: {self.k.kind} fusion over "
            f"[{', '.join(sym(d, self.plan) for d in self.k.dims)}]\n"
            f"// TF ops: {comment(', '.join(self.k.tf_ops))}"
        )
        if self.k.kind == "library":
            return header + "\n// (a GEMM through ral->sgemm_batched; no generated code)"
        if self.k.kind == "stitch":
            parts = [header, self.struct(), self.stitch()]
            return "\n\n".join(parts + ([self.epilogue()] if self.epilogue_of else []))
        if self.k.kind == "reduce":
            return "\n\n".join([header, self.struct(), cpu_reduce.reduce_source(self)])
        parts = [header, self.struct(), self.compute(), self.flat()]
        if (self.k.needs_broadcast_version or self.epilogue_of) and self.rank:
            parts.append(self.broadcast())
        if self.epilogue_of:
            parts.append(self.epilogue())
        return "\n\n".join(parts)

    def _contiguous_part(self, i: int) -> bool:
        """A concatenation's part whose last dim runs along the kernel's, unexpanded
        and unsliced: its innermost stride is 1 (or 0 for size 1, where only
        column 0 is read)."""
        acc = self.k.inputs[i]
        return (acc.window is None and acc.dims is not None and acc.dims[-1] == self.rank - 1
                and acc.expand[-1] == "no")

    @staticmethod
    def _part_start(n: int, p: int) -> str:
        """C++: where part ``p`` of concatenation ``n`` starts along its dim."""
        return f"a.cat{n}[{p - 1}]" if p else "0"

    @staticmethod
    def _select(conditions: list[str], values: list[str]) -> str:
        """C++ taking ``values[p]`` for the first true ``conditions[p]``, else the last."""
        return " : ".join([f"{c} ? {v}" for c, v in zip(conditions, values)] + [values[-1]])

    def _row_part(self, lines: list[str], n: int, op: KernelOp,
                  index: dict[int, str]) -> dict[int, str | None]:
        """Lines choosing the part of concatenation ``n`` (along an outer dim) that
        holds this row: pointer ``q{n}`` and, unless every part is contiguous,
        innermost stride ``qs{n}``; sets the parts' ``index``. Returns the part
        inputs' pointers for ``_loop``: the first loads through ``q{n}``."""
        r, axis = self.rank, op.attrs["axis"]
        parts = [ref for _, ref in op.operands]
        ends = [f"at{axis} < a.cat{n}[{p}]" for p in range(len(parts) - 1)]
        lines.append(f"    // {comment(op.tf_node)}: the part holding this row")
        lines.append(f"    const int part{n} = {self._select(ends, [str(p) for p in range(len(parts))])};")
        chosen = [f"part{n} == {p}" for p in range(len(parts) - 1)]
        elem = STORAGE[self.buf(self.k.inputs[parts[0]]).elem]
        starts = [f"a.in{i} + off{i} - {self._part_start(n, p)} * a.in{i}_strides[{axis}]"
                  for p, i in enumerate(parts)]
        lines.append(f"    const {elem}* __restrict q{n} = {self._select(chosen, starts)};")
        contiguous = all(self._contiguous_part(i) for i in parts)
        if not contiguous:
            strides = [f"a.in{i}_strides[{r - 1}]" for i in parts]
            lines.append(f"    const int64_t qs{n} = {self._select(chosen, strides)};")
        index.update({i: "c" if contiguous else f"c * qs{n}" for i in parts})
        return {i: (f"q{n}" if p == 0 else None) for p, i in enumerate(parts)}

    def _row_offsets(self, lines: list[str], indent: str) -> None:
        """Offsets of every input at the start of ``row`` (dims before the last).

        An identity read starts at ``row * cols``; only the others walk the dims
        (a division per dim)."""
        r = self.rank
        dense = {i for i, acc in enumerate(self.k.inputs)
                 if acc.is_identity and acc.window is None and r}
        walk = [i for i in range(len(self.k.inputs)) if i not in dense]
        for i in range(len(self.k.inputs)):
            start = f"row * a.dims[{r - 1}]" if i in dense else "0"
            lines.append(f"{indent}int64_t off{i} = {start};")
        # the coordinate along each outer dim a concatenation runs along
        axes = sorted({op.attrs["axis"] for _, op in self.concats() if op.attrs["axis"] < r - 1})
        lines += [f"{indent}int64_t at{d} = 0;" for d in axes]
        if r > 1 and walk:
            lines.append(f"{indent}int64_t rem = row;")
            lines.append(f"{indent}for (int d = {r - 2}; d >= 0; --d) {{")
            lines.append(f"{indent}  const int64_t idx = rem % a.dims[d];")
            lines.append(f"{indent}  rem /= a.dims[d];")
            for i in walk:
                lines.append(f"{indent}  off{i} += idx * a.in{i}_strides[d];")
            lines += [f"{indent}  if (d == {d}) at{d} = idx;" for d in axes]
            lines.append(f"{indent}}}")

    def stitch_levels(self) -> tuple[dict[str, int], Callable[[list[str]], list[KernelOp]]]:
        """A stitch kernel's schedule: the pass after which each row value is ready
        (reductions and what is computed from them), and ``closure(values)``: the
        per-element ops computing ``values`` from inputs and ready row values."""
        k = self.k
        ops = {op.value: op for op in k.ops}
        ready: dict[str, int] = {}
        need: dict[str, int] = {}

        def level(v: str) -> int:
            return ready.get(v, need.get(v, 0))

        for op in k.ops:
            deps = [ref for kind, ref in op.operands if kind == "val"]
            if op.op == "reduce":
                ready[op.value] = max([level(d) for d in deps] or [0]) + 1
            elif op.row:
                ready[op.value] = max([ready[d] for d in deps if d in ready] or [0])
            else:
                need[op.value] = max([level(d) for d in deps] or [0])

        def closure(targets: list[str]) -> list[KernelOp]:
            wanted: set[str] = set()
            stack = [t for t in targets if t not in ready]
            while stack:
                v = stack.pop()
                if v in wanted:
                    continue
                wanted.add(v)
                stack.extend(ref for kind, ref in ops[v].operands
                             if kind == "val" and ref not in ready)
            return [op for op in k.ops if op.value in wanted]

        return ready, closure

    def stitch(self) -> str:
        """One task per row: a pass per level of reductions, then the outputs. Rows
        shorter than a vector go eight at a time across the lanes instead
        (``cpu_short_rows.py``), chosen per call unless the row length is a constant
        of a vector or more."""
        k, r = self.k, self.rank
        ready, closure = self.stitch_levels()
        names = {op.value: f"v{n}" for n, op in enumerate(k.ops)}
        index, bcast, strided, templated = self.inner_index()
        flags = [f"B{i}" for i in bcast] if templated else []

        def body(full_ops: list, indent: str, readers: tuple = (), guard: str = "") -> list[str]:
            out = []
            used = sorted({ref for op in list(full_ops) + list(readers)
                           for kind, ref in op.operands if kind == "in"})
            for i in used:
                ct = COMPUTE[self.buf(k.inputs[i]).elem]
                load = f"({ct})r{i}[{index[i]}]"
                if guard:  # a masked load: lanes past the row's end read nothing
                    load = f"{guard} ? {load} : ({ct})0"
                out.append(f"{indent}const {ct} x{i} = {load};")
            for op in full_ops:
                args = [self.ref(kind, ref, elem, names, "x")
                        for (kind, ref), elem in zip(op.operands, op.operand_elems)]
                expr = expression(op.op, args, op.elem, op.operand_elems, op.attrs)
                out.append(f"{indent}const {COMPUTE[op.elem]} {names[op.value]} = {expr};"
                           f"  // {comment(op.tf_node)}: {op.op}")
            return out

        head = f"template <{', '.join(f'bool {f}' for f in flags)}>\n" if flags else ""
        lines = [
            "// One row. Identity reads are contiguous; flag Bi: broadcast input i runs",
            "// along the row (else it is one value per row).",
            f"{head}static inline __attribute__((always_inline)) void {k.name}_row("
            f"const {self.args}& a, int64_t row) {{",
            f"  const int64_t cols = a.dims[{r - 1}];",
        ]
        self._row_offsets(lines, "  ")
        for i, acc in enumerate(k.inputs):
            lines.append(f"  const {STORAGE[self.buf(acc).elem]}* __restrict r{i} = a.in{i} + off{i};")
            if "st" in index[i]:
                lines.append(f"  const int64_t st{i} = a.in{i}_strides[{r - 1}];")
        passes = max([ready[op.value] for op in k.ops if op.op == "reduce"] or [0])
        full_outs = [(j, v) for j, (v, _) in enumerate(k.outputs) if v not in ready]
        cached = self._row_cache(passes, ready, closure, full_outs)
        for j, _ in full_outs:
            elem = self.plan.buffers[k.outputs[j][1]].elem
            lines.append(f"  {STORAGE[elem]}* __restrict w{j} = a.out{j} + row * cols;")
        emitted_rows: set[str] = set()
        for p in range(1, passes + 1):
            reduces = [op for op in k.ops if op.op == "reduce" and ready[op.value] == p]
            full = closure([ref for op in reduces for kind, ref in op.operands if kind == "val"])
            lines.append(f"  // pass {p}: {', '.join(comment(op.tf_node) for op in reduces)}")
            keep = []
            if cached is not None and p == passes:
                j, v, _ = cached
                keep = [f"w{j}[c] = {names[v]};  // kept for the final pass"]
            vector = {op.value for op in reduces
                      if accumulator_elem(op.elem, op.attrs["combiner"]) == "f32"
                      and op.attrs["combiner"] in VECTOR_COMBINERS}
            for op in reduces:
                ct = COMPUTE[accumulator_elem(op.elem, op.attrs["combiner"])]
                init = literal(op.attrs["init"], op.elem)
                if op.value in vector:  # eight float lanes in one vector register
                    lines.append(f"  disc_f32x8 acc_{names[op.value]} = disc_splat8({init});")
                else:
                    lines.append(f"  {ct} acc_{names[op.value]}[8];")
                    lines.append(f"  for (int l = 0; l < 8; ++l) acc_{names[op.value]}[l] = {init};")

            def fold(lane: str, indent: str, reduces: list = reduces, vector: set = vector,
                     guard: str = "") -> list[str]:
                out = []
                for op in reduces:
                    kind, ref = op.operands[0]
                    val = self.ref(kind, ref, op.elem, names, "x")
                    if lane == "l" and op.value in vector:  # combined after the lane loop
                        if guard:  # lanes past the row's end hold the combiner's identity
                            val = f"{guard} ? {val} : {literal(op.attrs['init'], op.elem)}"
                        out.append(f"{indent}lane_{names[op.value]}[l] = {val};")
                        continue
                    acc = f"acc_{names[op.value]}[{lane}]"
                    at = accumulator_elem(op.elem, op.attrs["combiner"])
                    comb = expression(op.attrs["combiner"], [acc, val], at, [at] * 2, {})
                    out.append(f"{indent}{acc} = {comb};")
                return out

            def lane_group(c0: str, last: bool, reduces: list = reduces, full: list = full,
                           vector: set = vector, keep: list = keep) -> list[str]:
                """Eight columns from c0 as eight independent lanes. In the last, partial
                group, lanes past the row's end load and store nothing (masked)."""
                out = [f"    float lane_{names[op.value]}[8];" for op in reduces if op.value in vector]
                if vector:  # the lanes are independent: one vector op each (vector expf too)
                    out.append("    #pragma omp simd")
                out.append("    for (int l = 0; l < 8; ++l) {")
                out.append(f"      const int64_t c = {c0} + l;")
                guard = "c < cols" if last else ""
                out += body(full, "      ", reduces, guard=guard)
                out += fold("l", "      ", guard=guard)
                out += [f"      {'if (c < cols) ' if last else ''}{x}" for x in keep]
                out.append("    }")
                for op in reduces:
                    if op.value in vector:
                        v = names[op.value]
                        comb = expression(op.attrs["combiner"], [f"acc_{v}", f"disc_load8(lane_{v})"],
                                          "f32", ["f32", "f32"], {})
                        out.append(f"    acc_{v} = {comb};")
                return out

            c0 = f"c{p}"  # groups of 8 lanes, then the tail
            lines.append(f"  int64_t {c0} = 0;")
            # sums and products over long rows: blocks of columns combined pairwise
            cascaded = [names[op.value] for op in reduces
                        if op.value in vector and op.attrs["combiner"] in CASCADED_COMBINERS]
            if cascaded:
                for op in reduces:
                    if names[op.value] in cascaded:
                        lam = cpu_reduce.combiner_lambda(op.attrs["combiner"], "f32", "disc_f32x8")
                        lines.append(f"  disc_cascade<disc_f32x8> blocks_{names[op.value]};")
                        lines.append(f"  const auto comb_{names[op.value]} = {lam};")
                lines.append("  for (;;) {  // blocks of DISC_REDUCE_BLOCK columns")
                lines.append(f"    const int64_t stop{p} = cols - {c0} > DISC_REDUCE_BLOCK ? "
                             f"{c0} + DISC_REDUCE_BLOCK : cols;")
                lines.append(f"    for (; {c0} + 8 <= stop{p}; {c0} += 8) {{")
                lines += ["  " + x for x in lane_group(c0, last=False)]
                lines.append("    }")
                lines.append(f"    if ({c0} + 8 > cols) break;  // the tail joins the last block")
                for v in cascaded:
                    init = literal(next(op for op in reduces if names[op.value] == v).attrs["init"], "f32")
                    lines.append(f"    blocks_{v}.push(acc_{v}, comb_{v});")
                    lines.append(f"    acc_{v} = disc_splat8({init});")
                lines.append("  }")
            else:
                lines.append(f"  for (; {c0} + 8 <= cols; {c0} += 8) {{")
                lines += lane_group(c0, last=False)
                lines.append("  }")
            if len(vector) == len(reduces):  # the tail as one more (partial) group
                lines.append(f"  if ({c0} < cols) {{")
                lines += lane_group(c0, last=True)
                lines.append("  }")
            else:
                lines += [f"  for (; {c0} < cols; ++{c0}) {{", f"    const int64_t c = {c0};"]
                lines += body(full, "    ", reduces) + fold("0", "    ")
                lines += ["    " + x for x in keep] + ["  }"]
            for op in reduces:
                v, ct = names[op.value], COMPUTE[op.elem]
                if v in cascaded:  # a long row's blocks, combined pairwise
                    init = literal(op.attrs["init"], "f32")
                    lines.append(f"  if (blocks_{v}.count) {{")
                    lines.append(f"    blocks_{v}.push(acc_{v}, comb_{v});")
                    lines.append(f"    acc_{v} = blocks_{v}.total(disc_splat8({init}), comb_{v});")
                    lines.append("  }")
                if op.value in vector:  # lanes combined as a tree of shuffles
                    comb = expression(op.attrs["combiner"], [f"acc_{v}", f"disc_swap8(acc_{v}, k)"],
                                      "f32", ["f32", "f32"], {})
                    lines.append(f"  for (int k = 4; k > 0; k /= 2) acc_{v} = {comb};")
                    lines.append(f"  {ct} {v} = acc_{v}[0];  // {comment(op.tf_node)}")
                else:  # lanes combined in the accumulator type
                    at = accumulator_elem(op.elem, op.attrs["combiner"])
                    lines.append(f"  {COMPUTE[at]} {v}_lanes = acc_{v}[0];")
                    comb = expression(op.attrs["combiner"], [f"{v}_lanes", f"acc_{v}[l]"], at, [at] * 2, {})
                    lines.append(f"  for (int l = 1; l < 8; ++l) {v}_lanes = {comb};")
                    lines.append(f"  {ct} {v} = ({ct}){v}_lanes;  // {comment(op.tf_node)}")
                if rounds_once(op.elem):  # accumulated in float, rounded once
                    lines.append(f"  {v} = disc_round_{op.elem}({v});")
                emitted_rows.add(op.value)
            for op in k.ops:
                if op.row and op.op != "reduce" and ready[op.value] == p:
                    args = [self.ref(kind, ref, elem, names, "x")
                            for (kind, ref), elem in zip(op.operands, op.operand_elems)]
                    expr = expression(op.op, args, op.elem, op.operand_elems, op.attrs)
                    lines.append(f"  const {COMPUTE[op.elem]} {names[op.value]} = {expr};"
                                 f"  // {comment(op.tf_node)}: {op.op} (per row)")
        if full_outs:
            lines.append("  // final pass: full-shape outputs")
            lines.append("  for (int64_t c = 0; c < cols; ++c) {")
            final = closure([v for _, v in full_outs])
            if cached is not None:
                j, v, shared = cached
                lines.append(f"    const float {names[v]} = w{j}[c];  // kept by pass {passes}")
                final = [op for op in final if op.value not in shared]
            lines += body(final, "    ")
            for j, v in full_outs:
                elem = self.plan.buffers[k.outputs[j][1]].elem
                lines.append(f"    w{j}[c] = ({STORAGE[elem]}){names[v]};")
            lines.append("  }")
        for j, (v, b) in enumerate(k.outputs):
            if v in ready:
                lines.append(f"  a.out{j}[row] = ({STORAGE[self.plan.buffers[b].elem]}){names[v]};")
        lines.append("}")
        lines.append("")
        tmpl = f"<{', '.join(flags)}>" if flags else ""
        short = self.plan.may_be_shorter_than(k, SHORT_ROW)  # not proven long
        if short:
            lines.append(short_rows(self, ready, closure))
            lines.append("")
        lines.append(f"{head}static inline __attribute__((always_inline)) void {k.name}_row_range("
                     f"const {self.args}& a, int64_t begin, int64_t end) {{")
        lines.append("  int64_t row = begin;")
        if short:
            lines.append(f"  if (a.dims[{r - 1}] < {SHORT_ROW})  // short rows: eight at a time, "
                         "one per lane")
            lines.append(f"    for (; row + 8 <= end; row += 8) {k.name}_rows8(a, row);")
        lines.append(f"  for (; row < end; ++row) {k.name}_row{tmpl}(a, row);")
        lines.append("}")
        lines.append("")
        lines.append(f"DISC_CLONES static void {k.name}_rows(void* p, int64_t begin, int64_t end) {{")
        lines.append(f"  const {self.args}& a = *static_cast<const {self.args}*>(p);")
        lines += self._row_range_call("a", "begin", "end")
        lines.append("}")
        return "\n".join(lines)

    def _row_range_call(self, a: str, begin: str, end: str) -> list[str]:
        """Lines calling a stitch kernel's ``{k}_row_range``."""
        return self._flag_call(f"{self.k.name}_row_range", f"{a}, {begin}, {end}")

    def _row_cache(self, passes: int, ready: dict, closure, full_outs: list) -> tuple | None:
        """The value the last reduction pass keeps in the output row for the final pass.

        When the final pass would recompute expensive per-element work of the last
        pass (softmax's ``exp(x - max)``), that pass stores the one value the final
        pass needs from it in the (f32) output row, and the final pass reads it back
        instead. Returns (output index, value, values not recomputed) or None.
        """
        if passes == 0 or len(full_outs) != 1:
            return None
        j, out_value = full_outs[0]
        if self.plan.buffers[self.k.outputs[j][1]].elem != "f32":
            return None
        last = [op for op in self.k.ops if op.op == "reduce" and ready[op.value] == passes]
        computed = {op.value for op in closure(
            [ref for op in last for kind, ref in op.operands if kind == "val"])}
        final = closure([out_value])
        shared = {op.value for op in final if op.value in computed}
        if sum(op_cost(op.op) for op in final if op.value in shared) < 20:
            return None  # cheap to recompute
        frontier = {ref for op in final if op.value not in shared
                    for kind, ref in op.operands if kind == "val" and ref in shared}
        if out_value in shared:
            frontier.add(out_value)
        ops = {op.value: op for op in self.k.ops}
        if len(frontier) != 1 or ops[next(iter(frontier))].elem != "f32":
            return None
        # An output written in place of an input (the buffer planner's choice) must
        # not be overwritten early when the final pass still reads that input.
        out_memory = self.plan.memory(self.k.outputs[j][1])
        aliased = {i for i, acc in enumerate(self.k.inputs)
                   if self.plan.memory(acc.buffer) == out_memory}
        if any(kind == "in" and ref in aliased for op in final if op.value not in shared
               for kind, ref in op.operands):
            return None
        return j, next(iter(frontier)), shared

    def library_launch(self, buffer_ptr: dict[str, str],
                       epilogue: KernelEmitter | None = None) -> list[str]:
        """Host-runner lines of a library kernel (``cpu_gemm.py``)."""
        return cpu_gemm.library_launch(self, buffer_ptr, epilogue)

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
                starts, steps, sliced = acc.window
                offset = " + ".join(f"{sym(st, plan)} * {product(b.dims[d + 1:], plan)}"
                                    for d, st in enumerate(starts)) or "0"
                lines.append(f"    k.in{i} = {buffer_ptr[b.name]} + ({offset});  // window")
            if not r:
                continue
            dims_map = acc.dims if acc.dims is not None else list(range(r))
            stride = "1"
            for bd in range(len(b.dims) - 1, -1, -1):
                size = sym(b.dims[bd], plan)
                if acc.window is None:
                    lines.append(f"    k.in{i}_strides[{dims_map[bd]}] = {size} == 1 ? 0 : {stride};")
                elif dims_map[bd] >= 0:  # -1: a size-1 dim along no kernel dim
                    _, steps, sliced = acc.window
                    lines.append(f"    k.in{i}_strides[{dims_map[bd]}] += {sym(sliced[bd], plan)} == 1"
                                 f" ? 0 : {stride} * {steps[bd]};")
                stride = f"{stride} * {size}" if stride != "1" else size
        for j, (_, bname) in enumerate(k.outputs):
            lines.append(f"    k.out{j} = {buffer_ptr[bname]};")
        for i, h in enumerate(self.host_scalars):
            lines.append(f"    k.h{i} = (double)({host_expr(h, plan)});")
        for n, op in self.concats():
            end = "0"
            for p, size in enumerate(op.attrs["sizes"]):
                end = f"{end} + {sym(size, plan)}" if end != "0" else sym(size, plan)
                lines.append(f"    k.cat{n}[{p}] = {end};")
        return lines

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
                         f" {k.name}_rows, &k);")
            lines += ["    }", "  }"]
            return lines
        if k.kind == "reduce":
            return lines + cpu_reduce.reduce_launch(self, cost)
        lines.append("    if (k.n > 0) {")
        if k.needs_broadcast_version and r:
            cond = " && ".join(flat_conds)
            lines.append(f"      if ({cond}) {{  // no input is broadcast in this call")
            lines.append(f"        ral->parallel_for(ral, k.n, {cost}, {k.name}_flat, &k);")
            lines.append("      } else {")
            lines.append(
                f"        ral->parallel_for(ral, k.n / k.dims[{r - 1}], {cost}.0 * k.dims[{r - 1}],"
                f" {k.name}_bcast, &k);"
            )
            lines.append("      }")
        else:
            lines.append(f"      ral->parallel_for(ral, k.n, {cost}, {k.name}_flat, &k);")
        lines += ["    }", "  }"]
        return lines


