"""Placement of the kernels that are not loop fusions: data movement ("index"
kernels: slices, pads, iotas, gathers, scans, windows), convolutions (im2col and
a GEMM, Conv1D taps, grouped) and GEMMs ("library" kernels).

A mixin of the planner (``planner._Planner``): it places into the planner's
kernels and buffers, and reads values through its ``ValueAccess``.
"""

from __future__ import annotations

from disc_tf.fusion.dhlo_reader import DOp
from disc_tf.fusion.plan import Access, Buffer, KernelOp, gemm_form, strided_gemm
from disc_tf.fusion.symbols import ShapeError


class DataKernelPlacement:
    """Index, convolution and library kernels (mixed into the planner)."""

    def place_index(self, op: DOp) -> None:
        """A data-movement op (slice, concat, pad, iota, gather): its own "index"
        kernel reading dense operand buffers at computed positions."""
        target = self._new_kernel("index", self.a.shape_class(op.results[0]))
        kernel = self.kernels[target]
        name = op.name.split(".", 1)[1]
        tensors = op.operands
        attrs: dict = {}
        if name == "real_dynamic_slice":
            tensors = op.operands[:1]
            attrs = {"start": self.a.extents[op.operands[1]], "stride": self.a.extents[op.operands[3]]}
        elif name == "dynamic_pad":
            tensors = op.operands[:2]
            attrs = {"low": self.a.extents[op.operands[2]],
                     "interior": self.a.extents[op.operands[4]]}
        elif name == "dynamic_iota":
            tensors = []
            attrs = {"dim": op.int_attr("iota_dimension")}
        elif name == "concatenate":
            axis = op.int_attr("dimension")
            attrs = {"dim": axis, "sizes": [self.a.value_dims[v][axis] for v in op.operands]}
        elif name == "torch_index_select":
            attrs = {"dim": op.int_attr("dim"), "batch_dims": op.int_attr("batch_dims")}
        elif name == "custom_call" and "mirror_pad" in op.attrs["call_target_name"]:
            name = "mirror_pad"
            tensors = op.operands[:1]
            attrs = {"low": self.a.extents[op.operands[1]], "mode": op.attrs["disc.mode"].strip('"')}
        elif name == "reverse":
            attrs = {"dims": op.ints_attr("dimensions")}
        elif name == "dynamic_gather":
            name = "gather_nd"
            tensors = op.operands[:2]
            attrs = {"depth": self.a.symbols.constant_value(self.a.value_dims[op.operands[1]][-1])}
        elif name == "custom_call":
            name = "scan"
            attrs = {"axis": op.int_attr("disc.axis"),
                     "combiner": op.attrs["disc.combiner"].strip('"'),
                     "exclusive": op.attrs["disc.exclusive"] == "true",
                     "reverse": op.attrs["disc.reverse"] == "true"}
        elif name == "reduce_window":
            tensors = op.operands[:1]
            init = self.producer[op.operands[1]].const_value.item()
            attrs = {"window": op.ints_attr("window_dimensions"),
                     "strides": op.ints_attr("window_strides"), "combiner": op.reduce_kind,
                     "init": init}
        refs = []
        for i, v in enumerate(tensors):
            base, dims, _ = self.access.resolve(v)
            producer = self.producer.get(base)
            scalar_operand = name == "dynamic_pad" and i == 1
            if scalar_operand and producer is not None and producer.name == "stablehlo.constant" \
                    and producer.const_value.ndim == 0 and dims is None:
                refs.append(("const", producer.const_value.item()))
                continue
            if scalar_operand and base in self.a.host_values and dims is None:
                refs.append(("host", self.a.host_values[base]))
                continue
            refs.append(("in", self._dense_input(target, v)))
        kernel.ops.append(KernelOp(value=op.results[0], op=name, operands=refs,
                                   elem=op.result_types[0][0],
                                   operand_elems=[self.access.elem(v) for v in tensors],
                                   tf_node=op.tf_node, attrs=attrs))
        self.kernel_of[op.results[0]] = target

    def _dense_input(self, kernel: int, value: str) -> int:
        """Adds ``value`` as a dense (materialised if needed) input of ``kernel``."""
        base, dims, _ = self.access.resolve(value)
        if dims is not None:
            base = self._materialize(value)
        src = self._src(base)
        if src is not None:
            self.deps[kernel].add(src)
        self.kernels[kernel].inputs.append(Access(self.buffer_for_base(base)))
        return len(self.kernels[kernel].inputs) - 1

    def _temp(self, elem: str, dims: list[int]) -> str:
        name = f"{self.prefix}tmp{len([b for b in self.buffers.values() if b.role == 'temp'])}"
        self.buffers[name] = Buffer(name, elem, dims, "temp")
        return name

    def place_conv(self, op: DOp) -> None:
        """A convolution: grouped ones as an index kernel; others as im2col (an index
        kernel writing [N, OH, OW, kh*kw*C] patches, skipped for 1x1 stride-1 unpadded
        windows) and one GEMM with the filter viewed as [kh*kw*C, O]."""
        info = self.a.convs[op.results[0]]
        x, w = op.operands[0], op.operands[1]
        result = op.results[0]
        elem = op.result_types[0][0]
        out_dims = self.a.value_dims[result]
        xd, wd = self.a.value_dims[x], self.a.value_dims[w]
        const = self.a.symbols.constant_value
        kh, kw = const(wd[0]), const(wd[1])
        attrs = {"low": [info.pads[0], info.pads[2]], "sizes": [xd[3], wd[2]], "kh": kh, "kw": kw,
                 "strides": info.strides, "dilations": info.dilations, "groups": info.groups}
        if info.groups != 1:
            target = self._new_kernel("index", self.a.shape_class(result))
            refs = [("in", self._dense_input(target, v)) for v in (x, w)]
            self.kernels[target].ops.append(KernelOp(
                value=result, op="grouped_conv", operands=refs, elem=elem,
                operand_elems=[elem, elem], tf_node=op.tf_node, attrs=attrs))
            self.kernel_of[result] = target
            return
        direct = (kh, kw) == (1, 1) and info.strides == [1, 1] and all(
            const(p) == 0 for p in info.pads)
        # One row in and out: a height of 1 with no padding above or below it.
        one_row = kh == 1 and const(xd[1]) == 1 and const(info.pads[0]) == 0 \
            and const(info.pads[1]) == 0
        if self.options.conv_taps and not direct and elem == "f32" \
                and self.access.elem(x) == "f32" and self.access.elem(w) == "f32":
            if one_row and info.strides == [1, 1]:
                self._place_conv_taps(op, info, kw)
            else:
                self._place_conv_rows(op, info, kh, kw)
            return
        if direct:
            base, dims, _ = self.access.resolve(x)
            lhs = self._materialize(x) if dims is not None else base
        else:
            patch_dims = [out_dims[0], out_dims[1], out_dims[2], info.patch]
            k = self._new_kernel("index", tuple(self.a.symbols.find(d) for d in patch_dims))
            ref = ("in", self._dense_input(k, x))
            lhs = f"{result}.patches"
            self.kernels[k].ops.append(KernelOp(
                value=lhs, op="im2col", operands=[ref], elem=elem, operand_elems=[elem],
                tf_node=op.tf_node, attrs=attrs))
            self.kernel_of[lhs] = k
            self.buffer_of[lhs] = self._temp(elem, patch_dims)
        base, dims, _ = self.access.resolve(w)
        filt = self._materialize(w) if dims is not None else base
        view = f"{self.prefix}view{len([b for b in self.buffers.values() if b.role == 'alias'])}"
        self.buffers[view] = Buffer(view, elem, [info.patch, wd[3]], "alias",
                                    alias_of=self.buffer_for_base(filt))
        target = self._new_kernel("library", self.a.shape_class(result))
        for v, buf in ((lhs, self.buffer_for_base(lhs)), (filt, view)):
            src = self._src(v)
            if src is not None:
                self.deps[target].add(src)
            self.kernels[target].inputs.append(Access(buf))
        self.kernels[target].ops.append(KernelOp(
            value=result, op="dot_general", operands=[("in", 0), ("in", 1)], elem=elem,
            operand_elems=[elem, elem], tf_node=op.tf_node,
            attrs={"lhs_batch": [], "rhs_batch": [], "lhs_contract": [3], "rhs_contract": [0]}))
        self.kernel_of[result] = target

    def _place_conv_taps(self, op: DOp, info, kw: int) -> None:
        """A one-row convolution (Conv1D) with stride 1 without an im2col buffer (it was
        kw x the input): codegen makes it one GEMM over the input's overlapping windows,
        or with dilation ``kw`` GEMMs, one per filter tap, each adding x shifted by the
        tap to the result. The library kernel's op is ``conv_taps``."""
        self._place_conv_library(op, "conv_taps", {
            "kw": kw, "dilation": info.dilations[1], "pad_left": info.pads[2]})

    def _place_conv_rows(self, op: DOp, info, kh: int, kw: int) -> None:
        """A convolution without an im2col buffer (it was kh * kw x the output's
        pixels times the input channels): codegen makes it one GEMM per filter row
        (per filter tap when dilated along W), each over the overlapping windows of
        the (padded) input rows that the row reaches, adding into the result; the
        last one writes each block of C final. The library kernel's op is
        ``conv_rows``."""
        self._place_conv_library(op, "conv_rows", {
            "kh": kh, "kw": kw, "strides": list(info.strides),
            "dilations": list(info.dilations), "pad_top": info.pads[0],
            "pad_left": info.pads[2]})

    def _place_conv_library(self, op: DOp, name: str, attrs: dict) -> None:
        """The convolution ``op`` as a library kernel of op ``name`` reading its input
        and filter as dense buffers."""
        x, w = op.operands[0], op.operands[1]
        result = op.results[0]
        elem = op.result_types[0][0]
        target = self._new_kernel("library", self.a.shape_class(result))
        refs = [("in", self._dense_input(target, v)) for v in (x, w)]
        self.kernels[target].ops.append(KernelOp(
            value=result, op=name, operands=refs, elem=elem,
            operand_elems=[elem, elem], tf_node=op.tf_node, attrs=attrs))
        self.kernel_of[result] = target

    def place_library(self, op: DOp) -> None:
        """A dot_general: its own "library" kernel reading two dense buffers."""
        lhs, rhs = op.operands
        if gemm_form(len(self.a.value_dims[lhs]), len(self.a.value_dims[rhs]), op.dot_dims) is None:
            raise ShapeError(f"dot_general of {op.tf_node}: layout {op.dot_dims} is not a GEMM")
        target = self._new_kernel("library", self.a.shape_class(op.results[0]))
        # Operands read through a transpose of a dense buffer go to the GEMM as they
        # are stored (leading dims and two-level batch strides) instead of a copy.
        perms = [self.access.transpose_perm(v) for v in (lhs, rhs)]
        attrs = dict(op.dot_dims)
        if perms != [None, None]:
            identity = [list(range(len(self.a.value_dims[v]))) for v in (lhs, rhs)]
            form = strided_gemm(op.dot_dims, perms[0] or identity[0], perms[1] or identity[1])
            if form is not None:
                attrs["strided"] = form
            else:
                perms = [None, None]
        refs = []
        for v, perm in zip((lhs, rhs), perms):
            base, dims, _ = self.access.resolve(v)
            if dims is not None and perm is None:
                base = self._materialize(v)
            src = self._src(base)
            if src is not None:
                self.deps[target].add(src)
            self.kernels[target].inputs.append(Access(self.buffer_for_base(base)))
            refs.append(("in", len(self.kernels[target].inputs) - 1))
        self.kernels[target].ops.append(
            KernelOp(value=op.results[0], op="dot_general", operands=refs,
                     elem=op.result_types[0][0], operand_elems=[self.access.elem(lhs), self.access.elem(rhs)],
                     tf_node=op.tf_node, attrs=attrs)
        )
        self.kernel_of[op.results[0]] = target
