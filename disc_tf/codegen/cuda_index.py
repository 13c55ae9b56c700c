"""CUDA emitter of "index" kernels: data movement computed from output coordinates
(slice, concatenate, pad, mirror pad, iota, reverse, gather, im2col, reduce-window),
a scan along one axis and a depthwise convolution.

The per-element code is the CPU emitter's (``cpu_index.IndexKernelEmitter.body``:
it reads the typed pointers, dims, strides and host parameters of the argument
struct, which are the same here); what differs is the loop around it -- one
thread per output element in a grid-stride loop -- and an out-of-range gather
index, which gives 0 as TensorFlow's GPU kernels do (they report no error: that
would need the host to wait for the GPU).

The argument struct declares its pointers with ``DISC_IN(T)`` / ``DISC_OUT(T)``:
typed in device code, ``void`` in the host runner, which sees no CUDA types.
"""

from __future__ import annotations

from disc_tf.codegen.cpu_index import IndexKernelEmitter
from disc_tf.codegen.cpu_text import accumulator_elem, comment, product, rounds_once, sym
from disc_tf.codegen.cuda_config import BLOCK, MAX_GRID
from disc_tf.codegen.cuda_ops import (
    COMPUTE,
    STORAGE,
    CudaCodegenError,
    check_elem,
    cuda_expression,
    cuda_literal,
    dims_offset,
    store,
)
from disc_tf.fusion.plan import FusionPlan, Kernel


class CudaIndexEmitter(IndexKernelEmitter):
    """The device code of one index kernel and the host lines that launch it."""

    def __init__(self, kernel: Kernel, plan: FusionPlan, functions: list[str]) -> None:
        if len(kernel.ops) != 1 or len(kernel.outputs) != 1:
            raise CudaCodegenError(f"CUDA codegen: index kernel {kernel.name} has "
                                   f"{len(kernel.ops)} ops and {len(kernel.outputs)} outputs")
        super().__init__(kernel, plan)
        self.functions = functions
        for a in kernel.inputs:
            check_elem(self.buf(a).elem, f"kernel {kernel.name} input {a.buffer}")
        for _, b in kernel.outputs:
            check_elem(plan.buffers[b].elem, f"kernel {kernel.name} output {b}")
        if any(a.window is not None for a in kernel.inputs):
            raise CudaCodegenError(f"CUDA codegen: kernel {kernel.name} reads a slice in place")
        self.name = f"{kernel.name}_index"
        functions.append(self.name)

    @staticmethod
    def record_bad_index(idx: str) -> str:
        return f"(void){idx}; /* out of range: 0, as TF's GPU kernels give */"

    @property
    def out_elem(self) -> str:
        (_, bname), = self.k.outputs
        return self.plan.buffers[bname].elem

    def struct(self) -> str:
        """The argument struct (the same text in device and host code)."""
        lines = [f"struct {self.args} {{", "  int64_t n;  // output elements",
                 f"  int64_t dims[{max(self.rank, 1)}];  // output dims"]
        for i, acc in enumerate(self.k.inputs):
            b = self.buf(acc)
            n = max(len(b.dims), 1)
            lines.append(f"  DISC_IN({STORAGE[b.elem]}) in{i};  // {acc}")
            lines.append(f"  int64_t in{i}_dims[{n}];")
            lines.append(f"  int64_t in{i}_strides[{n}];")
        (value, bname), = self.k.outputs
        lines.append(f"  DISC_OUT({STORAGE[self.out_elem]}) out0;  // {bname} ({value})")
        lines.append(f"  int64_t p[{max(len(self.params), 1)}];  // host-computed parameters")
        if self.op.op == "scan":
            lines.append("  int64_t lines;  // lines along the scanned axis (a thread each)")
        for i, h in enumerate(self.host_scalars):
            lines.append(f"  double h{i};  // {h}, computed by the host")
        lines.append("};")
        return "\n".join(lines)

    def _header(self, title: str) -> str:
        return (f"// ---- {self.k.name}: {title} over "
                f"[{', '.join(sym(d, self.plan) for d in self.k.dims)}]\n"
                f"// TF ops: {comment(', '.join(self.k.tf_ops))}")

    def _kernel(self, loop_over: str, body: list[str]) -> str:
        return "\n".join([
            f'extern "C" __global__ void __launch_bounds__({BLOCK}) {self.name}(const {self.args} a) {{',
            f"  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < {loop_over};"
            " t += (int64_t)gridDim.x * blockDim.x) {",
            *("    " + x for x in body),
            "  }",
            "}",
        ])

    def _elementwise(self) -> str:
        """One thread per output element: its coordinates, then the op's CPU body."""
        r = self.rank
        body = [f"int64_t c[{max(r, 1)}] = {{0}};", "int64_t rem = t;"]
        for d in range(r - 1, 0, -1):
            body.append(f"c[{d}] = disc_divmod(rem, a.dims[{d}]);")
        body.append("c[0] = rem;" if r else "(void)rem;")
        try:
            body += self.body()
        except ValueError as e:
            raise CudaCodegenError(f"CUDA codegen: {e}") from e
        body.append(f"a.out0[t] = {store('v', self.out_elem)};  "
                    f"// {comment(self.op.tf_node)}: {self.op.op}")
        return self._kernel("a.n", body)

    def _scan(self) -> str:
        """One thread per line along the scanned axis, folded in order (float sums with
        Neumaier's compensation, halves in float, float products in double)."""
        op = self.op
        axis, combiner = op.attrs["axis"], op.attrs["combiner"]
        acc_elem = accumulator_elem(op.elem, combiner)
        ct = COMPUTE[acc_elem]
        compensated = combiner == "add" and acc_elem == "f32"
        comb = ("disc_neumaier_add(acc, err, v)" if compensated else
                cuda_expression(combiner, ["acc", "v"], acc_elem, [acc_elem] * 2, {}))
        value = "acc + err" if compensated else "acc"
        if rounds_once(op.elem):
            value = f"({ct})disc_round_{op.elem}((float)({value}))"
        body = [f"const int64_t n = a.dims[{axis}];", f"const int64_t step = a.in0_strides[{axis}];",
                "int64_t rem = t;", "int64_t base = 0;"]
        body += dims_offset([d for d in range(self.rank) if d != axis], "")
        index = "n - 1 - q" if op.attrs["reverse"] else "q"
        identity = cuda_literal(0 if combiner == "add" else 1, acc_elem)
        write = f"a.out0[off] = {store(f'({value})', self.out_elem)};"
        body += [f"{ct} acc = {identity};",
                 *(["float err = 0.0f;  // what the adds have rounded off"] if compensated else []),
                 "for (int64_t q = 0; q < n; ++q) {",
                 f"  const int64_t off = base + ({index}) * step;",
                 f"  const {ct} v = ({ct})a.in0[off];",
                 *([f"  {write}", f"  acc = {comb};"] if op.attrs["exclusive"]
                   else [f"  acc = {comb};", f"  {write}"]),
                 "}"]
        return self._kernel("a.lines", body)

    def _grouped_conv(self) -> str:
        """A depthwise convolution, one thread per output element (n, oh, ow, channel)."""
        attrs = self.op.attrs
        sh, sw, dh, dw = self._window_steps()
        ct = COMPUTE[accumulator_elem(self.op.elem)]
        body = [
            "int64_t rem = t;",
            "const int64_t co = disc_divmod(rem, a.dims[3]);",
            "const int64_t ow = disc_divmod(rem, a.dims[2]);",
            "const int64_t oh = disc_divmod(rem, a.dims[1]);",
            "const int64_t nb = rem;",
            f"const int64_t ci = co / (a.in1_dims[3] / {attrs['groups']});  // its input channel",
            f"{ct} acc = 0;",
            f"for (int64_t ky = 0; ky < {attrs['kh']}; ++ky) {{",
            f"  const int64_t ih = oh * {sh} - {self._p('low', 0)} + ky * {dh};",
            "  if (ih < 0 || ih >= a.in0_dims[1]) continue;",
            f"  for (int64_t kx = 0; kx < {attrs['kw']}; ++kx) {{",
            f"    const int64_t iw = ow * {sw} - {self._p('low', 1)} + kx * {dw};",
            "    if (iw < 0 || iw >= a.in0_dims[2]) continue;",
            f"    acc += ({ct})a.in0[nb * a.in0_strides[0] + ih * a.in0_strides[1] + "
            "iw * a.in0_strides[2] + ci] *",
            f"           ({ct})a.in1[ky * a.in1_strides[0] + kx * a.in1_strides[1] + co];",
            "  }",
            "}",
            f"a.out0[t] = {store('acc', self.out_elem)};  // {comment(self.op.tf_node)}",
        ]
        return self._kernel("a.n", body)

    def device_source(self) -> str:
        """All device code of the kernel."""
        if self.op.op == "scan":
            attrs = self.op.attrs
            text, title = self._scan(), f"scan ({attrs['combiner']}) along dim {attrs['axis']}"
        elif self.op.op == "grouped_conv":
            text, title = self._grouped_conv(), "depthwise convolution"
        else:
            text, title = self._elementwise(), f"index kernel ({self.op.op})"
        return "\n\n".join([self._header(title), self.struct(), text])

    def launch(self, ptr: dict[str, str]) -> list[str]:
        """Host-runner lines that fill the args and launch the kernel (nothing to do
        for an empty output)."""
        plan, k = self.plan, self.k
        lines = [f"  {{  // {k.name}: {comment(', '.join(k.tf_ops))}", f"    {self.args} k{{}};",
                 f"    k.n = {product(k.dims, plan) if k.dims else '1'};", *self.fill_args(ptr)]
        work = "k.n"
        if self.op.op == "scan":
            axis = self.op.attrs["axis"]
            lines.append(f"    k.lines = k.dims[{axis}] > 0 ? k.n / k.dims[{axis}] : 0;")
            work = "k.lines"
        lines += ["    void* params[] = {&k};",
                  f"    if ({work} > 0 && cu->launch(cu, {self.functions.index(self.name)} "
                  f"/* {self.name} */, disc_grid({work}, {BLOCK}, {MAX_GRID}), {BLOCK}, 0, params)) "
                  "return 1;",
                  "  }"]
        return lines
