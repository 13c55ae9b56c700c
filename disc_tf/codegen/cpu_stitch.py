"""C++ of stitch kernels: one row per task, a pass per level of reductions over the
row (their producers computed in the pass that needs them, their consumers in
the next), concatenated parts read segment by segment, and the row cached
between passes when it is short enough.
"""

from __future__ import annotations

from collections.abc import Callable

from disc_tf.codegen import cpu_reduce
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
    rounds_once,
)
from disc_tf.fusion.plan import Access, KernelOp


def _last_dim_only(acc: Access, rank: int) -> bool:
    """True when ``acc`` reads a plain buffer whose every dim runs along the kernel's
    last (or a scalar): each row of the kernel starts at its offset 0. Only for
    kernels of rank 3 or more (two or more divisions a row): a rank-2 kernel divides
    once a row, and without it the recommender's stream measured 2-3% slower on the
    AVX2 path (three in-process A/Bs; the generated loops looked alike)."""
    return (rank >= 3 and acc.dims is not None and all(d == rank - 1 for d in acc.dims)
            and acc.window is None and acc.part_of is None and acc.gather is None
            and acc.ids_for is None and acc.pad is None)


def element(ptr: str, index: str, elem: str, ct: str) -> str:
    """C++ reading element ``index`` of ``ptr`` as compute type ``ct``. A bool is read as
    its byte (TF stores 0 or 1): GCC finds no vector type for a load of C++ bool, so a
    loop reading one stayed scalar (a masked softmax's mask: every expf a scalar call)."""
    if elem == "i1":
        return f"(((const unsigned char*){ptr})[{index}] != 0)"
    return f"({ct}){ptr}[{index}]"


class StitchEmitter:
    """Stitch kernels (mixed into ``KernelEmitter``)."""

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

    def _row_start(self, i: int) -> str:
        """C++: where input ``i``'s row starts in its buffer (after ``_row_offsets``).
        A gather read in place starts at the table row the id at its offset picks."""
        acc = self.k.inputs[i]
        if acc.pad is not None:  # a row of the padding reads nothing
            return f"(ok{i} ? off{i} : 0)"
        g = acc.gather
        if g is None:
            return f"off{i}"
        # a table of no columns: rows of no elements (a stitch kernel still runs them)
        return (f"(a.in{i}_depth ? (int64_t)a.in{g.ids}[off{i} / a.in{i}_depth] * a.in{i}_depth"
                " : 0)")

    def _load(self, i: int, ct: str, index: str, ptr: str = "") -> str:
        """C++ loading input ``i`` at column ``c`` (``index`` into its row ``ptr``). A
        pad read in place (loop kernels only) reads the columns inside the tensor, the
        constant elsewhere: in a concatenation's segments (a row's own columns run as
        ``_pad_segments``)."""
        acc = self.k.inputs[i]
        ptr = ptr or f"r{i}"
        elem = self.buf(acc).elem
        if acc.pad is None:
            return element(ptr, index, elem, ct)
        value = literal(acc.pad.value, elem)
        inside = element(ptr, f"c - a.in{i}_lo[{self.rank - 1}]", elem, ct)
        return f"(c >= clo{i} && c < chi{i} ? {inside} : ({ct}){value})"

    def _row_offsets(self, lines: list[str], indent: str) -> None:
        """Offsets of every input at the start of ``row`` (dims before the last).

        An identity read starts at ``row * cols``, a read along the last dim alone
        (a per-channel scale) at 0; only the others walk the dims (a division per
        dim: a 96-column row of MobileNetV2's batch norm spent longer there than on
        its columns)."""
        r = self.rank
        dense = {i for i, acc in enumerate(self.k.inputs)
                 if acc.is_identity and acc.window is None and r}
        ids = {i for i, acc in enumerate(self.k.inputs) if acc.ids_for is not None}
        fixed = {i for i, acc in enumerate(self.k.inputs) if _last_dim_only(acc, r)}
        walk = [i for i in range(len(self.k.inputs)) if i not in dense | ids | fixed]
        padded = [i for i, acc in enumerate(self.k.inputs) if acc.pad is not None]
        for i in sorted(set(range(len(self.k.inputs))) - ids):
            start = f"row * a.dims[{r - 1}]" if i in dense else "0"
            lines.append(f"{indent}int64_t off{i} = {start};")
        lines += [f"{indent}bool ok{i} = true;  // the row lies inside the unpadded tensor"
                  for i in padded]
        # the coordinate along each outer dim a concatenation runs along
        axes = sorted({op.attrs["axis"] for _, op in self.concats() if op.attrs["axis"] < r - 1})
        lines += [f"{indent}int64_t at{d} = 0;" for d in axes]
        if r > 1 and walk:
            lines.append(f"{indent}int64_t rem = row;")
            lines.append(f"{indent}for (int d = {r - 2}; d >= 0; --d) {{")
            lines.append(f"{indent}  const int64_t idx = rem % a.dims[d];")
            lines.append(f"{indent}  rem /= a.dims[d];")
            for i in walk:
                if i not in padded:
                    lines.append(f"{indent}  off{i} += idx * a.in{i}_strides[d];")
                    continue
                lines.append(f"{indent}  {{  // the coordinate in the unpadded tensor")
                lines.append(f"{indent}    const int64_t t = (a.in{i}_pdim[d] == 1 ? 0 : idx) "
                             f"- a.in{i}_lo[d];")
                lines.append(f"{indent}    ok{i} = ok{i} && (uint64_t)t < (uint64_t)a.in{i}_size[d];")
                lines.append(f"{indent}    off{i} += t * a.in{i}_strides[d];")
                lines.append(f"{indent}  }}")
            lines += [f"{indent}  if (d == {d}) at{d} = idx;" for d in axes]
            lines.append(f"{indent}}}")
        for i in padded:  # the row's columns inside the tensor: [clo, chi)
            lines.append(f"{indent}const int64_t clo{i} = ok{i} ? a.in{i}_lo[{r - 1}] : 0;")
            lines.append(f"{indent}const int64_t chi{i} = ok{i} ? clo{i} + a.in{i}_size[{r - 1}] : 0;")

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

        def used_inputs(full_ops: list, readers: tuple = ()) -> list[int]:
            return sorted({ref for op in list(full_ops) + list(readers)
                           for kind, ref in op.operands if kind == "in"})

        def body(full_ops: list, indent: str, readers: tuple = (), guard: str = "",
                 widened: tuple = ()) -> list[str]:
            """``widened``: bool inputs already read into 32-bit lanes m<i>[l]."""
            out = []
            for i in used_inputs(full_ops, readers):
                ct = COMPUTE[self.buf(k.inputs[i]).elem]
                if i in widened:
                    out.append(f"{indent}const {ct} x{i} = m{i}[l] != 0;")
                    continue
                load = element(f"r{i}", index[i], self.buf(k.inputs[i]).elem, ct)
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
            f"{head}static inline __attribute__((always_inline)) void {self.fn}_row("
            f"const {self.args}& a, int64_t row) {{",
            f"  const int64_t cols = a.dims[{r - 1}];",
        ]
        self._row_offsets(lines, "  ")
        for i, acc in enumerate(k.inputs):
            if acc.ids_for is not None:
                continue  # read once per row, for the gather's row start
            lines.append(f"  const {STORAGE[self.buf(acc).elem]}* __restrict r{i} = "
                         f"a.in{i} + {self._row_start(i)};")
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
                           vector: set = vector, keep: list = keep, width: int = 8) -> list[str]:
                """``width`` (8 or 16) columns from c0 as independent lanes, folded into the
                eight-lane accumulators eight at a time. In the last, partial group, lanes
                past the row's end load and store nothing (masked)."""
                out = [f"    float lane_{names[op.value]}[{width}];"
                       for op in reduces if op.value in vector]
                guard = "c < cols" if last else ""
                # bool inputs widened to 32-bit lanes first: their byte loads inside the
                # vector loop made GCC vectorize it in 8-byte pieces (a masked softmax:
                # 8.2 ns per element against 1.8-2.1)
                widened = tuple(i for i in used_inputs(full, reduces)
                                if self.buf(k.inputs[i]).elem == "i1") if vector else ()
                for i in widened:
                    load = f"((const unsigned char*)r{i})[{index[i]}]"
                    out += [f"    int32_t m{i}[{width}];",
                            f"    for (int l = 0; l < {width}; ++l) {{",
                            f"      const int64_t c = {c0} + l;",
                            f"      m{i}[l] = {f'{guard} ? {load} : 0' if guard else load};",
                            "    }"]
                if vector:  # the lanes are independent: one vector op each (vector expf too)
                    out.append("    #pragma omp simd")
                out.append(f"    for (int l = 0; l < {width}; ++l) {{")
                out.append(f"      const int64_t c = {c0} + l;")
                out += body(full, "      ", reduces, guard=guard, widened=widened)
                out += fold("l", "      ", guard=guard)
                out += [f"      {'if (c < cols) ' if last else ''}{x}" for x in keep]
                out.append("    }")
                for half in range(0, width, 8):  # columns in order, as eight at a time would
                    for op in reduces:
                        if op.value in vector:
                            v = names[op.value]
                            lane = f"disc_load8(lane_{v} + {half})" if half else f"disc_load8(lane_{v})"
                            comb = expression(op.attrs["combiner"], [f"acc_{v}", lane],
                                              "f32", ["f32", "f32"], {})
                            out.append(f"    acc_{v} = {comb};")
                return out

            def groups(c0: str, stop: str, indent: str, reduces: list = reduces,
                       vector: set = vector) -> list[str]:
                """The whole groups of columns up to ``stop``: sixteen at a time where every
                reduction has vector lanes (the AVX-512 build then calls 16-lane vector
                math, bit for bit the 8-lane functions' results, at nearly twice the
                elements per call), then eight; the same sums in the same order."""
                out = []
                if vector and len(vector) == len(reduces):
                    out.append(f"{indent}for (; {c0} + 16 <= {stop}; {c0} += 16) {{")
                    out += [indent[2:] + x for x in lane_group(c0, last=False, width=16)]
                    out.append(f"{indent}}}")
                out.append(f"{indent}for (; {c0} + 8 <= {stop}; {c0} += 8) {{")
                out += [indent[2:] + x for x in lane_group(c0, last=False)]
                out.append(f"{indent}}}")
                return out

            c0 = f"c{p}"  # groups of 16 and 8 lanes (groups()), then the tail
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
                lines += groups(c0, f"stop{p}", "    ")
                lines.append(f"    if ({c0} + 8 > cols) break;  // the tail joins the last block")
                for v in cascaded:
                    init = literal(next(op for op in reduces if names[op.value] == v).attrs["init"], "f32")
                    lines.append(f"    blocks_{v}.push(acc_{v}, comb_{v});")
                    lines.append(f"    acc_{v} = disc_splat8({init});")
                lines.append("  }")
            else:
                lines += groups(c0, "cols", "  ")
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
        lines.append(f"{head}static inline __attribute__((always_inline)) void {self.fn}_row_range("
                     f"const {self.args}& a, int64_t begin, int64_t end) {{")
        lines.append("  int64_t row = begin;")
        if short:
            lines.append(f"  if (a.dims[{r - 1}] < {SHORT_ROW})  // short rows: eight at a time, "
                         "one per lane")
            lines.append(f"    for (; row + 8 <= end; row += 8) {self.fn}_rows8(a, row);")
        lines.append(f"  for (; row < end; ++row) {self.fn}_row{tmpl}(a, row);")
        lines.append("}")
        lines.append("")
        lines.append(f"DISC_CLONES DISC_ENTRY void {self.fn}_rows(void* p, int64_t begin, int64_t end) {{")
        lines.append(f"  const {self.args}& a = *static_cast<const {self.args}*>(p);")
        lines += self._row_range_call("a", "begin", "end")
        lines.append("}")
        return "\n".join(lines)

    def _row_range_call(self, a: str, begin: str, end: str) -> list[str]:
        """Lines calling a stitch kernel's ``{k}_row_range``."""
        return self._flag_call(f"{self.fn}_row_range", f"{a}, {begin}, {end}")

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
