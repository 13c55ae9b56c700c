"""CPU emitter of "index" kernels: data movement computed from output coordinates.

One op per kernel (slice, concatenate, pad, iota, gather). Each task is a row of
the output (every dim but the last); the coordinates ``c[]`` of an element give
the position read in each input, whose dims and strides the host runner passes
along with the op's host-computed parameters (slice starts, pad widths, ...).
A gather records an out-of-range index in ``bad``; the host runner turns it into
TF's InvalidArgument after the launch.
"""

from __future__ import annotations

import math

from disc_tf.codegen import cpu_index_rows as index_rows
from disc_tf.codegen.cpu_depthwise import CHANNEL_BLOCK, depthwise_source
from disc_tf.codegen.cpu_gemm import epilogue_closure
from disc_tf.codegen.cpu_kernels import KernelEmitter
from disc_tf.codegen.cpu_ops import COMPUTE, STORAGE, literal
from disc_tf.codegen.cpu_text import (
    accumulator_elem,
    bad_index_lines,
    comment,
    host_expr,
    product,
    rounds_once,
    sym,
)
from disc_tf.fusion.plan import FusionPlan, Kernel, depthwise_f32


class IndexKernelEmitter(KernelEmitter):
    """Emits an "index" kernel and the host lines that launch it."""

    def __init__(self, kernel: Kernel, plan: FusionPlan) -> None:
        super().__init__(kernel, plan)
        (self.op,) = kernel.ops
        self.params: list[int] = []  # symbols passed in a.p[]
        self.offsets: dict[str, int] = {}
        for key in ("start", "stride", "low", "interior", "sizes"):
            if key in self.op.attrs:
                self.offsets[key] = len(self.params)
                self.params.extend(self.op.attrs[key])

    @property
    def _fast_depthwise(self) -> bool:
        """A depthwise convolution of f32 (``_grouped_conv_source``'s register blocks),
        which can run an epilogue (``fusion/epilogue.py``)."""
        return depthwise_f32(self.k, self.plan.buffers)

    def _p(self, key: str, d: int) -> str:
        return f"a.p[{self.offsets[key] + d}]"

    def _rank(self, i: int) -> int:
        return len(self.buf(self.k.inputs[i]).dims)

    def struct(self) -> str:
        r = max(self.rank, 1)
        lines = [f"struct {self.args} {{", f"  int64_t dims[{r}];  // output dims"]
        for i, acc in enumerate(self.k.inputs):
            b = self.buf(acc)
            n = max(len(b.dims), 1)
            lines.append(f"  const {STORAGE[b.elem]}* in{i};  // {acc}")
            lines.append(f"  int64_t in{i}_dims[{n}];")
            lines.append(f"  int64_t in{i}_strides[{n}];")
        (value, bname), = self.k.outputs
        lines.append(f"  {STORAGE[self.plan.buffers[bname].elem]}* out0;  // {bname} ({value})")
        lines.append(f"  int64_t p[{max(len(self.params), 1)}];  // host-computed parameters")
        for i, h in enumerate(self.host_scalars):
            lines.append(f"  double h{i};  // {h}, computed by the host")
        lines.append("  int64_t* bad;  // an out-of-range index, if one is seen")
        if self._fast_depthwise:
            lines.append("  // the kernel run on each task's pixels once they are written, or null")
            lines.append("  void (*epilogue)(void*, int64_t, int64_t, int64_t, int64_t, int64_t);")
            lines.append("  void* closure;")
        lines.append("};")
        return "\n".join(lines)

    @staticmethod
    def record_bad_index(idx: str) -> str:
        """The statement noting out-of-range gather index ``idx`` (the host runner turns
        it into TF's InvalidArgument after the launch)."""
        return f"__atomic_store_n(a.bad, {idx}, __ATOMIC_RELAXED);"

    def _operand(self, n: int) -> str:
        kind, ref = self.op.operands[n]
        if kind == "in":
            return f"({COMPUTE[self.op.elem]})a.in{ref}[0]"
        if kind == "host":
            return f"({COMPUTE[self.op.elem]})a.h{self.host_scalars.index(ref)}"
        return literal(ref, self.op.elem)

    def _offset(self, i: int, coord: list[str]) -> str:
        terms = [f"({c}) * a.in{i}_strides[{d}]" for d, c in enumerate(coord)]
        return " + ".join(terms) or "0"

    def body(self) -> list[str]:
        """C++ statements computing ``v`` (the element at coordinates ``c``)."""
        op, r = self.op, self.rank
        ct = COMPUTE[op.elem]
        name = op.op
        if name == "real_dynamic_slice":
            coord = [f"{self._p('start', d)} + c[{d}] * {self._p('stride', d)}" for d in range(r)]
            return [f"const {ct} v = ({ct})a.in0[{self._offset(0, coord)}];"]
        if name == "dynamic_iota":
            return [f"const {ct} v = ({ct})c[{op.attrs['dim']}];"]
        if name == "dynamic_pad":
            lines = ["bool inside = true;", "int64_t off = 0;"]
            for d in range(r):
                lines.append(f"{{ int64_t t = c[{d}] - {self._p('low', d)};")
                lines.append(f"  const int64_t step = {self._p('interior', d)} + 1;")
                lines.append("  if (step != 1) { inside = inside && t >= 0 && t % step == 0; t /= step; }")
                lines.append(f"  inside = inside && t >= 0 && t < a.in0_dims[{d}];")
                lines.append(f"  off += t * a.in0_strides[{d}]; }}")
            lines.append(f"const {ct} v = inside ? ({ct})a.in0[off] : {self._operand(1)};")
            return lines
        if name == "concatenate":
            axis = op.attrs["dim"]
            lines = [f"{ct} v;", f"int64_t pos = c[{axis}];"]
            for i in range(len(op.operands)):
                coord = [("pos" if d == axis else f"c[{d}]") for d in range(r)]
                kind, ref = op.operands[i]
                read = (f"({ct})a.in{ref}[{self._offset(ref, coord)}]" if kind == "in"
                        else self._operand(i))
                size = self._p("sizes", i)
                lines.append(f"if (pos < {size}) {{ v = {read}; }} else {{ pos -= {size};")
            lines.append(f"v = ({ct})0;" + " }" * len(op.operands))
            return lines
        if name == "torch_index_select":
            axis = op.attrs["dim"]
            icoord, pcoord = self._gather_coords()
            return [
                f"int64_t idx = (int64_t)a.in1[{self._offset(1, icoord)}];",
                f"{ct} v = ({ct})0;",
                f"if (idx < 0 || idx >= a.in0_dims[{axis}]) {{",
                f"  {self.record_bad_index('idx')}",
                "} else {",
                f"  v = ({ct})a.in0[{self._offset(0, pcoord)}];",
                "}",
            ]
        if name == "reverse":
            return [f"const {ct} v = ({ct})a.in0[{self._offset(0, self._reversed_coord())}];"]
        if name == "mirror_pad":
            shift = 0 if op.attrs["mode"] == "REFLECT" else 1
            lines = ["int64_t off = 0;"]
            for d in range(r):
                lines.append(f"{{ int64_t t = c[{d}] - {self._p('low', d)};")
                lines.append(f"  const int64_t n = a.in0_dims[{d}];")
                lines.append(f"  if (t < 0) t = -t - {shift};")
                lines.append(f"  else if (t >= n) t = 2 * n - 2 + {shift} - t;")
                lines.append(f"  off += t * a.in0_strides[{d}]; }}")
            lines.append(f"const {ct} v = ({ct})a.in0[off];")
            return lines
        if name == "gather_nd":
            depth = op.attrs["depth"]
            ri, rp = self._rank(1), self._rank(0)
            q = ri - 1
            lines = ["int64_t off = 0;", f"{ct} v = ({ct})0;", "bool ok = true;"]
            ibase = " + ".join(f"c[{j}] * a.in1_strides[{j}]" for j in range(q)) or "0"
            lines.append(f"const int64_t ibase = {ibase};")
            for k in range(depth):
                lines.append(f"{{ const int64_t idx = (int64_t)a.in1[ibase + {k} * a.in1_strides[{q}]];")
                lines.append(f"  if (idx < 0 || idx >= a.in0_dims[{k}]) {{ ok = false; "
                             f"{self.record_bad_index('idx')} }}")
                lines.append(f"  off += idx * a.in0_strides[{k}]; }}")
            for j in range(rp - depth):
                lines.append(f"off += c[{q + j}] * a.in0_strides[{depth + j}];")
            lines.append(f"if (ok) v = ({ct})a.in0[off];")
            return lines
        if name == "im2col":
            return self._im2col(ct)
        if name == "reduce_window":
            return self._reduce_window(ct)
        raise ValueError(f"{self.k.name}: no index emitter for {name}")

    def _entry_head(self) -> list[str]:
        """The first lines of the kernel's entry: its signature (a task range of rows)
        and its argument struct."""
        return [f"DISC_CLONES DISC_ENTRY void {self.fn}_index(void* p, int64_t begin, "
                "int64_t end) {",
                f"  const {self.args}& a = *static_cast<const {self.args}*>(p);"]

    def _output_storage(self) -> str:
        """The C++ storage type of the kernel's one output."""
        (_, bname), = self.k.outputs
        return STORAGE[self.plan.buffers[bname].elem]

    def _dims_text(self) -> str:
        """The kernel's dims as C++ (symbols' literals or host variables), for titles."""
        return ", ".join(sym(d, self.plan) for d in self.k.dims)

    def _row_head(self, setup: tuple[str, ...] = ()) -> list[str]:
        """The entry (``inner``: the row length, then the ``setup`` lines) and one task
        per output row (every dim but the last): the row's coordinates ``c`` and ``w``,
        its first output element; the caller's lines go on inside the row loop, which
        they close."""
        r = self.rank
        lines = [*self._entry_head(),
                 f"  const int64_t inner = {f'a.dims[{r - 1}]' if r else '1'};", *setup,
                 "  for (int64_t row = begin; row < end; ++row) {",
                 f"    int64_t c[{max(r, 1)}] = {{0}};",
                 "    int64_t rem = row;"]
        for d in range(r - 2, -1, -1):
            lines += [f"    c[{d}] = rem % a.dims[{d}];", f"    rem /= a.dims[{d}];"]
        return lines + ["    (void)rem;",
                        f"    {self._output_storage()}* __restrict w = a.out0 + row * inner;"]

    @staticmethod
    def _taps_inside(dims: int) -> str:
        """C++ condition: operand coordinates ``t0`` .. ``t<dims - 1>`` are all inside it."""
        return " && ".join(f"t{d} >= 0 && t{d} < a.in0_dims[{d}]" for d in range(dims))

    def _gather_coords(self) -> tuple[list[str], list[str]]:
        """A gather's (ids, operand) coordinates of output element ``c``; the operand's
        along the gathered dim is ``idx``, the id read at the ids' coordinates."""
        axis, batch = self.op.attrs["dim"], self.op.attrs["batch_dims"]
        ri, rp = self._rank(1), self._rank(0)
        icoord = [f"c[{j}]" if j < batch else f"c[{axis + j - batch}]" for j in range(ri)]
        pcoord = [f"c[{d}]" if d < axis else "idx" if d == axis else
                  f"c[{d - 1 + ri - batch}]" for d in range(rp)]
        return icoord, pcoord

    def _reversed_coord(self) -> list[str]:
        """A reverse's operand coordinates of output element ``c``."""
        flipped = set(self.op.attrs["dims"])
        return [f"a.in0_dims[{d}] - 1 - c[{d}]" if d in flipped else f"c[{d}]"
                for d in range(self.rank)]

    def _window_steps(self) -> tuple[int, int, int, int]:
        """(stride, stride, dilation, dilation) over height and width of a convolution's
        window (the im2col and depthwise kernels, CPU and CUDA)."""
        (sh, sw), (dh, dw) = self.op.attrs["strides"], self.op.attrs["dilations"]
        return sh, sw, dh, dw

    def _input_pixel(self, at: str) -> list[str]:
        """``ih``/``iw`` of window tap (ky, kx) for output pixel c[1], c[2], and ``inside``."""
        sh, sw, dh, dw = self._window_steps()
        return [
            f"const int64_t ih = c[1] * {sh} - {self._p('low', 0)} + ky * {dh};",
            f"const int64_t iw = c[2] * {sw} - {self._p('low', 1)} + kx * {dw};",
            f"const bool {at} = ih >= 0 && ih < a.in0_dims[1] && iw >= 0 && iw < a.in0_dims[2];",
        ]

    def _im2col(self, ct: str) -> list[str]:
        """Patch element c[3] = (ky * kw + kx) * C + ci of output pixel (c[0], c[1], c[2])."""
        kw = self.op.attrs["kw"]
        channels = self._p("sizes", 0)
        return [
            f"const int64_t ci = c[3] % {channels};",
            f"const int64_t kx = (c[3] / {channels}) % {kw};",
            f"const int64_t ky = c[3] / ({channels} * {kw});",
            *self._input_pixel("inside"),
            f"const {ct} v = inside ? ({ct})a.in0[c[0] * a.in0_strides[0] + ih * a.in0_strides[1]"
            " + iw * a.in0_strides[2] + ci] : 0;",
        ]

    def _window_coord(self, d: int) -> str:
        """Operand coordinate along dim ``d`` of window tap w<d> of output element c
        (less the padding before the operand, when a pad is read in place: ``low``)."""
        k, s = self.op.attrs["window"][d], self.op.attrs["strides"][d]
        coord = f"c[{d}] * {s}" + (f" + w{d}" if k > 1 else "")
        return coord + (f" - {self._p('low', d)}" if "low" in self.op.attrs else "")

    def _reduce_window(self, ct: str) -> list[str]:
        """Folds the window of output element c: the operand is pre-padded, or a pad is
        read in place (``low``; ``fusion/padded_reads.py``), whose taps outside the
        operand hold the fold's start value and are skipped."""
        from disc_tf.codegen.cpu_ops import expression

        attrs = self.op.attrs
        padded = "low" in attrs
        lines = [f"{ct} v = {literal(attrs['init'], self.op.elem)};"]
        indent = ""
        loops = [d for d, size in enumerate(attrs["window"]) if size > 1]
        for d in loops:
            lines.append(f"{indent}for (int64_t w{d} = 0; w{d} < {attrs['window'][d]}; ++w{d}) {{")
            indent += "  "
        coord = [self._window_coord(d) for d in range(len(attrs["window"]))]
        if padded:
            for d, c in enumerate(coord):
                lines.append(f"{indent}const int64_t t{d} = {c};")
            lines.append(f"{indent}if (!({self._taps_inside(len(coord))})) continue;")
            coord = [f"t{d}" for d in range(len(coord))]
        read = f"({ct})a.in0[{self._offset(0, coord)}]"
        acc = accumulator_elem(self.op.elem)  # halves accumulate in float
        comb = expression(attrs["combiner"], ["v", read], acc, [acc] * 2, {})
        lines.append(f"{indent}v = {comb};")
        for _ in loops:
            indent = indent[:-2]
            lines.append(f"{indent}}}")
        if acc != self.op.elem:
            lines.append(f"v = disc_round_{self.op.elem}(v);")
        return lines

    def _scan_source(self) -> str:
        """One task per line along the scanned axis, folded in order.

        A float sum carries its rounding error along (Neumaier's compensated
        summation: every prefix is as accurate as a pairwise sum, where a plain
        float running sum stops growing once it is large); half types accumulate
        in float and round each output once; float products accumulate in double.
        """
        from disc_tf.codegen.cpu_ops import expression

        k, op = self.k, self.op
        axis = op.attrs["axis"]
        combiner = op.attrs["combiner"]
        acc_elem = accumulator_elem(op.elem, combiner)
        ct = COMPUTE[acc_elem]
        st = self._output_storage()
        identity = literal(0 if combiner == "add" else 1, acc_elem)
        compensated = combiner == "add" and acc_elem == "f32"
        if compensated:
            comb = "disc_neumaier_add(acc, err, v)"
        else:
            comb = expression(combiner, ["acc", "v"], acc_elem, [acc_elem] * 2, {})
        value = "acc + err" if compensated else "acc"
        if rounds_once(op.elem):
            value = f"disc_round_{op.elem}((float)({value}))"
        lines = [
            *self._entry_head(),
            f"  const int64_t n = a.dims[{axis}];",
            f"  const int64_t step = a.in0_strides[{axis}];",
            "  for (int64_t t = begin; t < end; ++t) {",
            "    int64_t rem = t;",
            "    int64_t base = 0;",
        ]
        for d in reversed([d for d in range(self.rank) if d != axis]):
            lines.append(f"    base += (rem % a.dims[{d}]) * a.in0_strides[{d}];")
            lines.append(f"    rem /= a.dims[{d}];")
        index = "n - 1 - q" if op.attrs["reverse"] else "q"
        lines += [
            f"    {ct} acc = {identity};",
            *(["    float err = 0.0f;  // the rounding error acc has dropped so far"] if compensated else []),
            "    for (int64_t q = 0; q < n; ++q) {",
            f"      const int64_t off = base + ({index}) * step;",
            f"      const {ct} v = ({ct})a.in0[off];",
        ]
        if op.attrs["exclusive"]:
            lines += [f"      a.out0[off] = ({st})({value});", f"      acc = {comb};"]
        else:
            lines += [f"      acc = {comb};", f"      a.out0[off] = ({st})({value});"]
        lines += ["    }", "  }", "}"]
        header = (f"// ---- {k.name}: scan ({op.attrs['combiner']}) along dim {axis}\n"
                  f"// TF ops: {comment(', '.join(k.tf_ops))}")
        return "\n\n".join([header, self.struct(), "\n".join(lines)])

    def _im2col_source(self) -> str:
        """One task per output pixel: for each window tap, the pixel's C input channels
        are copied as one contiguous run (zeros where the tap falls in the padding)."""
        op = self.op
        attrs = op.attrs
        sh, sw, dh, dw = self._window_steps()
        st = self._output_storage()
        lines = [
            *self._entry_head(),
            f"  const int64_t channels = {self._p('sizes', 0)};",
            "  for (int64_t row = begin; row < end; ++row) {",
            "    const int64_t ow = row % a.dims[2];",
            "    const int64_t oh = (row / a.dims[2]) % a.dims[1];",
            "    const int64_t n = row / (a.dims[2] * a.dims[1]);",
            f"    {st}* __restrict w = a.out0 + row * a.dims[3];",
            f"    for (int64_t ky = 0; ky < {attrs['kh']}; ++ky) {{",
            f"      const int64_t ih = oh * {sh} - {self._p('low', 0)} + ky * {dh};",
            f"      for (int64_t kx = 0; kx < {attrs['kw']}; ++kx, w += channels) {{",
            f"        const int64_t iw = ow * {sw} - {self._p('low', 1)} + kx * {dw};",
            "        if (ih < 0 || ih >= a.in0_dims[1] || iw < 0 || iw >= a.in0_dims[2]) {",
            f"          for (int64_t ci = 0; ci < channels; ++ci) w[ci] = ({st})0;",
            "          continue;",
            "        }",
            "        const auto* __restrict r = a.in0 + n * a.in0_strides[0] + "
            "ih * a.in0_strides[1] + iw * a.in0_strides[2];",
            "        for (int64_t ci = 0; ci < channels; ++ci) w[ci] = r[ci];",
            "      }",
            "    }",
            "  }",
            "}",
        ]
        return self._unit(f"im2col patches of {comment(op.tf_node)}", lines)

    def _grouped_conv_source(self) -> str:
        """A depthwise convolution, one task per output pixel (tasks in a row of the
        output step through it without dividing): f32 with one output per input
        channel in vector registers (``cpu_depthwise``), other types and channel
        multipliers by ``_grouped_conv_generic``."""
        op = self.op
        if not self._fast_depthwise:
            return self._grouped_conv_generic()
        attrs = op.attrs
        lines = depthwise_source(self.fn, self.args, attrs["kh"], attrs["kw"],
                                 self._window_steps(),
                                 (self._p("low", 0), self._p("low", 1)), attrs["groups"])
        return self._unit(f"depthwise convolution {comment(op.tf_node)}", lines)

    def _grouped_conv_generic(self) -> str:
        """A depthwise convolution of any element type (feature groups of one input
        channel, ``M`` outputs each), one task per output pixel: for each window tap
        inside the input, the pixel's channels multiply the tap's weights as
        contiguous runs (vectorised), accumulated over the taps in blocks of
        ``CHANNEL_BLOCK`` channels."""
        op = self.op
        attrs = op.attrs
        sh, sw, dh, dw = self._window_steps()
        st = self._output_storage()
        ct = COMPUTE[op.elem]
        block = CHANNEL_BLOCK
        lines = [
            *self._entry_head(),
            "  const int64_t channels = a.dims[3];",
            f"  const int64_t multiplier = a.in1_dims[3] / {attrs['groups']};  // outputs per input channel",
            "  for (int64_t row = begin; row < end; ++row) {",
            "    const int64_t ow = row % a.dims[2];",
            "    const int64_t oh = (row / a.dims[2]) % a.dims[1];",
            "    const int64_t n = row / (a.dims[2] * a.dims[1]);",
            f"    {st}* __restrict w = a.out0 + row * channels;",
            f"    for (int64_t c0 = 0; c0 < channels; c0 += {block}) {{",
            f"      const int64_t cn = channels - c0 < {block} ? channels - c0 : {block};",
            f"      {ct} acc[{block}] = {{0}};",
            f"      for (int64_t ky = 0; ky < {attrs['kh']}; ++ky) {{",
            f"        const int64_t ih = oh * {sh} - {self._p('low', 0)} + ky * {dh};",
            "        if (ih < 0 || ih >= a.in0_dims[1]) continue;",
            f"        for (int64_t kx = 0; kx < {attrs['kw']}; ++kx) {{",
            f"          const int64_t iw = ow * {sw} - {self._p('low', 1)} + kx * {dw};",
            "          if (iw < 0 || iw >= a.in0_dims[2]) continue;",
            "          const auto* __restrict r = a.in0 + n * a.in0_strides[0] + "
            "ih * a.in0_strides[1] + iw * a.in0_strides[2];",
            "          const auto* __restrict f = a.in1 + ky * a.in1_strides[0] + "
            "kx * a.in1_strides[1] + c0;",
            "          if (multiplier == 1) {",
            "            r += c0;",
            "#pragma omp simd",
            f"            for (int64_t j = 0; j < cn; ++j) acc[j] += ({ct})r[j] * ({ct})f[j];",
            "          } else {",
            "            for (int64_t j = 0; j < cn; ++j)",
            f"              acc[j] += ({ct})r[(c0 + j) / multiplier] * ({ct})f[j];",
            "          }",
            "        }",
            "      }",
            f"      for (int64_t j = 0; j < cn; ++j) w[c0 + j] = ({st})acc[j];",
            "    }",
            "  }",
            "}",
        ]
        return self._unit(f"depthwise convolution {comment(op.tf_node)}", lines)

    def _unit(self, title: str, lines: list[str]) -> str:
        """A kernel's text: a header naming it and its TF ops, its struct, ``lines``."""
        header = (f"// ---- {self.k.name}: {title}\n"
                  f"// TF ops: {comment(', '.join(self.k.tf_ops))}")
        return "\n\n".join([header, self.struct(), "\n".join(lines)])

    def source(self) -> str:
        if self.op.op == "im2col":
            return self._im2col_source()
        if self.op.op == "grouped_conv":
            return self._grouped_conv_source()
        if self.op.op == "scan":
            return self._scan_source()
        if index_rows.channel_windows(self):
            return index_rows.channel_window_source(self)
        if index_rows.pad_rows(self):
            return index_rows.pad_rows_source(self)
        if index_rows.row_copies(self):
            return index_rows.row_copy_source(self)
        k, r = self.k, self.rank
        header = (f"// ---- {k.name}: index kernel ({self.op.op}) over [{self._dims_text()}]\n"
                  f"// TF ops: {comment(', '.join(k.tf_ops))}")
        st = self._output_storage()
        lines = self._row_head()
        lines.append("    for (int64_t col = 0; col < inner; ++col) {")
        lines.append(f"      c[{max(r - 1, 0)}] = col;" if r else "      (void)col;")
        lines += [f"      {x}" for x in self.body()]
        lines.append(f"      w[col] = ({st})v;  // {comment(self.op.tf_node)}: {self.op.op}")
        lines += ["    }", "  }", "}"]
        return "\n\n".join([header, self.struct(), "\n".join(lines)])

    def fill_args(self, buffer_ptr: dict[str, str]) -> list[str]:
        """Host lines setting the fields of ``k`` (the argument struct) but ``bad``."""
        plan, k = self.plan, self.k
        lines = [f"    k.dims[{d}] = {sym(s, plan)};" for d, s in enumerate(k.dims)]
        for i, acc in enumerate(k.inputs):
            b = self.buf(acc)
            lines.append(f"    k.in{i} = {buffer_ptr[b.name]};")
            stride = "1"
            for d in range(len(b.dims) - 1, -1, -1):
                size = sym(b.dims[d], plan)
                lines.append(f"    k.in{i}_dims[{d}] = {size};")
                lines.append(f"    k.in{i}_strides[{d}] = {stride};")
                stride = f"{stride} * {size}" if stride != "1" else size
        (_, bname), = k.outputs
        lines.append(f"    k.out0 = {buffer_ptr[bname]};")
        for j, s in enumerate(self.params):
            lines.append(f"    k.p[{j}] = {sym(s, plan)};")
        for i, h in enumerate(self.host_scalars):
            lines.append(f"    k.h{i} = (double)({host_expr(h, plan)});")
        return lines

    def launch(self, buffer_ptr: dict[str, str],
               epilogue: KernelEmitter | None = None) -> list[str]:
        """Host lines launching the kernel; a depthwise convolution with an
        ``epilogue`` runs it on each task's pixels (its args in an enclosing block)."""
        plan, k, r = self.plan, self.k, self.rank
        outer: list[str] = []  # the epilogue's args and closure, in an enclosing block
        hook: list[str] = []  # the kernel's fields naming them
        if epilogue is not None:
            epi, fn, closure = epilogue_closure(epilogue, buffer_ptr, "1", sym(k.dims[-1], plan))
            outer = [f"  {{  // {epilogue.k.name} ({comment(', '.join(epilogue.k.tf_ops))}) on "
                     f"the pixels of each task of {k.name}", *epi]
            hook = [f"    k.epilogue = &{fn};", f"    k.closure = {closure};"]
        lines = [*outer, f"  {{  // {k.name}: {comment(', '.join(k.tf_ops))}",
                 f"    {self.args} k{{}};", *hook,
                 "    int64_t bad = INT64_MIN;", "    k.bad = &bad;", *self.fill_args(buffer_ptr)]
        rows = product(k.dims[:-1], plan) if r else "1"
        inner = sym(k.dims[-1], plan) if r else "1"
        if self.op.op == "scan":
            axis = self.op.attrs["axis"]
            rows = product([s for d, s in enumerate(k.dims) if d != axis], plan)
            inner = sym(k.dims[axis], plan)
        cost = f"4.0 * {inner} + 1.0"
        if self.op.op == "grouped_conv":  # a multiply-add per channel and window tap
            cost = f"{2 * self.op.attrs['kh'] * self.op.attrs['kw']}.0 * {inner} + 1.0"
        if self.op.op == "reduce_window":  # a read and a fold per element and window tap
            cost = f"{2 * math.prod(self.op.attrs['window'])}.0 * {inner} + 1.0"
        lines.append(f"    const int64_t rows = {rows};")
        lines.append(f"    if (rows > 0 && {inner} > 0) {{")
        lines.append(f"      ral->parallel_for(ral, rows, {cost}, {self.fn}_index, &k);")
        lines.append("    }")
        if self.op.op in ("torch_index_select", "gather_nd"):
            axis = self.op.attrs.get("dim", 0)
            lines.append("    if (bad != INT64_MIN) {")
            lines += bad_index_lines(self.op.tf_node, "bad", f"k.in0_dims[{axis}]", "      ")
            lines.append("    }")
        lines.append("  }")
        if outer:
            lines.append("  }")
        return lines
