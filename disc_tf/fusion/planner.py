"""Fusion planning: loop fusion decided by proven shape equality.

Every elementwise op joins the most recent kernel whose iteration space is in
the same symbolic shape class, unless that would create a cycle between
kernels. Broadcasts are never kernels: a proven non-expanding broadcast is an
alias, any other becomes an index map on the consumer's read (its expansion
decided per call when unproven). A transpose is an index map too (a read
through permuted strides). A reshape is a view: the result aliases a dense
buffer of its operand with new dims; a cluster result that is a view or an
index map is copied into its own buffer. Scalar constants are inlined.

The planner is three parts: ``value_access`` (how each read reaches memory: the alias
analysis), this module and ``place_data`` (which kernel computes each value, in which order
kernels depend on each other), and ``memory_plan`` (launch order, in-place reuse); later
passes fold kernels into others (epilogues, gathers, producers of a GEMM's A).
"""

from __future__ import annotations

import dataclasses
import logging

from disc_tf.fusion.dce import NOT_COMPUTE, eliminate_dead_code, forward_copies
from disc_tf.fusion.dhlo_reader import DFunc, DOp
from disc_tf.fusion.epilogue import (
    hoist_epilogue_inputs,
    plan_block_scratch,
    plan_chains,
    plan_epilogues,
    plan_shared_a,
)
from disc_tf.fusion.gathered_a import plan_gathered_a
from disc_tf.fusion.gemm_layout import plan_result_layouts, plan_transposed_products
from disc_tf.fusion.layer_chain import plan_layer_chains
from disc_tf.fusion.memory_plan import launch_order, plan_reuse
from disc_tf.fusion.padded_reads import plan_reads_in_place
from disc_tf.fusion.place_data import DataKernelPlacement
from disc_tf.fusion.plan import Access, Buffer, FusionPlan, Kernel, KernelOp
from disc_tf.fusion.produced_a import plan_produced_a
from disc_tf.fusion.scratch_c import plan_epilogue_scratch, scratch_candidates
from disc_tf.fusion.shape_analysis import ShapeAnalysis, analyze, speculate_no_broadcast
from disc_tf.fusion.symbols import ShapeError
from disc_tf.fusion.value_access import ValueAccess

log = logging.getLogger("disc_tf.fusion")

#: Data-movement ops planned as "index" kernels of their own.
_INDEX_OPS = {"stablehlo.real_dynamic_slice", "stablehlo.concatenate", "stablehlo.dynamic_pad",
              "stablehlo.dynamic_iota", "stablehlo.torch_index_select", "stablehlo.reduce_window",
              "stablehlo.custom_call", "stablehlo.dynamic_gather", "stablehlo.reverse"}

#: Index kernels that check their operands (out-of-range indices) and so run even
#: when only their result's shape is read.
_CHECKING = frozenset({"torch_index_select", "gather_nd"})


@dataclasses.dataclass(frozen=True)
class PlanOptions:
    """Fusions a backend has emitters for (the CPU backend has all of them)."""

    #: a column reduction may absorb the loop kernel computing its operand
    input_fusion: bool = True
    #: a GEMM's consumer may run on each block of C inside it
    gemm_epilogues: bool = True
    #: a GEMM reading a row-wise epilogue's result may run on each block's rows inside
    #: the first GEMM too (attention's softmax(Q Kᵀ) · V; needs ``gemm_epilogues``)
    gemm_chains: bool = True
    #: a GEMM whose C only its epilogue (and chain) read keeps C a block at a time in scratch
    scratch_c: bool = True
    #: GEMMs each reading the last one's result run as one launch, block of rows by block
    #: of rows through every layer (an MLP; needs ``gemm_epilogues``)
    gemm_layers: bool = True
    #: consecutive GEMMs reading one A run as one launch (Q, K, V projections)
    shared_a_gemms: bool = True
    #: an f32 convolution is one library kernel of GEMMs over the input's overlapping
    #: windows rather than im2col + GEMM: a stride-1 Conv1D ``conv_taps`` (one GEMM, or
    #: one per filter tap when dilated), any other ``conv_rows`` (one GEMM per filter row)
    conv_taps: bool = True
    #: a concatenation is read in place by the loop kernel of its consumers
    concat_maps: bool = True
    #: a GEMM writes its result in the layout of the transposing copy reading it (attention's context)
    gemm_layouts: bool = True
    #: a GEMM's A is made per task in its scratch (``sgemm_gathered_a``): the rows of a table a
    #: gather picks (``gathered_a``), a depthwise convolution's pixels (``produced_a``)
    gathered_a: bool = True
    #: loop and stitch kernels read gathered rows and constant pads in place (``padded_reads``)
    reads_in_place: bool = True

    @classmethod
    def none(cls) -> PlanOptions:
        """No optional fusion: plain loop, stitch, reduce and library kernels."""
        return cls(input_fusion=False, gemm_epilogues=False, gemm_chains=False,
                   scratch_c=False, gemm_layers=False, shared_a_gemms=False, conv_taps=False,
                   concat_maps=False, gemm_layouts=False, gathered_a=False, reads_in_place=False)


class _Planner(DataKernelPlacement):
    """Places every op of one function into kernels (see the module docstring)."""

    def __init__(self, func: DFunc, analysis: ShapeAnalysis, cluster_name: str,
                 prefix: str = "", options: PlanOptions = PlanOptions()) -> None:
        self.prefix, self.options = prefix, options
        self.func, self.a = func, analysis
        self.cluster_name = cluster_name
        self.access = ValueAccess(func, analysis)
        self.producer: dict[str, DOp] = self.access.producer
        self.buffers: dict[str, Buffer] = {}
        self.buffer_of: dict[str, str] = {}  # value -> buffer name
        self.kernel_of: dict[str, int] = {}  # value -> kernel index
        self.kernels: list[Kernel] = []
        self.deps: list[set[int]] = []  # kernels each kernel reads directly
        self.row_values: set[str] = set()  # values computed once per stitch-kernel row
        self.view_base: dict[str, str] = {}  # reshape result -> value whose memory it views
        self.users: dict[str, list[DOp]] = {}  # value -> the ops reading it
        for op in func.ops:
            for v in op.operands:
                self.users.setdefault(v, []).append(op)

    def _src(self, base: str) -> int | None:
        """The kernel writing the memory of ``base`` (through views), if any."""
        while base in self.view_base:
            base = self.view_base[base]
        return self.kernel_of.get(base)

    def buffer_for_base(self, base: str) -> str:
        """The buffer holding ``base`` (an argument, a constant or a kernel value)."""
        if base in self.buffer_of:
            return self.buffer_of[base]
        op = self.producer.get(base)
        if base in self.a.host_arrays:
            name = f"{self.prefix}host{len([b for b in self.buffers.values() if b.role == 'host'])}"
            self.buffers[name] = Buffer(name, op.result_types[0][0], self.a.value_dims[base], "host",
                                        host_elements=list(self.a.host_arrays[base]))
        elif op is not None and op.name == "stablehlo.constant":
            name = f"{self.prefix}const{len([b for b in self.buffers.values() if b.role == 'const'])}"
            elem, _ = op.result_types[0]
            self.buffers[name] = Buffer(
                name, elem, self.a.value_dims[base], "const", const_value=op.const_value
            )
        else:
            name = self._temp(self.producer[base].elem_of(base), self.a.value_dims[base])
        self.buffer_of[base] = name
        return name

    def _is_row_read(self, kernel: int, base: str, dims: list[int] | None,
                     expand: list[str] | None) -> bool:
        """A read of one of ``kernel``'s row values that stays within its row.

        Row values have the kernel's leading dims, optionally followed by a
        size-1 dim (keep_dims). The read must map leading dims onto leading
        dims unexpanded; a trailing 1 may map anywhere after them.
        """
        if base not in self.row_values or self.kernel_of.get(base) != kernel:
            return False
        lead = len(self.kernels[kernel].dims) - 1
        bdims = self.a.value_dims[base]
        if dims is None:
            dims, expand = list(range(len(bdims))), ["no"] * len(bdims)
        for i, (d, e) in enumerate(zip(dims, expand)):
            if i < lead:
                if d != i or e != "no":
                    return False
            elif self.a.symbols.constant_value(bdims[i]) != 1:
                return False
        return len(bdims) >= lead

    def operand_ref(self, kernel: int, value: str) -> tuple[str, object]:
        base, dims, expand = self.access.resolve(value)
        op = self.producer.get(base)
        if op is not None and op.name == "stablehlo.constant" and op.const_value.ndim == 0:
            return ("const", op.const_value.item())
        if base in self.a.host_values:
            return ("host", self.a.host_values[base])
        window = self.access.window_of(value)
        if window is None and self.kernel_of.get(base) == kernel and (
            dims is None or self._is_row_read(kernel, base, dims, expand)
        ):
            return ("val", base)
        access = Access(self.buffer_for_base(base), dims, expand, window)
        k = self.kernels[kernel]
        for i, existing in enumerate(k.inputs):
            if existing.part_of is None and (
                    existing.buffer, existing.dims, existing.expand, existing.window) == (
                    access.buffer, access.dims, access.expand, access.window):
                return ("in", i)
        k.inputs.append(access)
        return ("in", len(k.inputs) - 1)

    def legal_kernel(self, kernel: int, op: DOp) -> bool:
        """May ``op`` join ``kernel`` without a cycle or an in-kernel broadcast?"""
        for operand in op.operands:
            base, dims, expand = self.access.resolve(operand)
            src = self._src(base)
            if src is None:
                continue
            if src == kernel and self.access.window_of(operand) is not None:
                return False  # a window is read from memory the kernel would still write
            if base in self.view_base:
                # A view is read from memory: never in the kernel that writes it.
                if src == kernel or self._reaches(src, kernel):
                    return False
                continue
            if src == kernel:
                if dims is not None and not self._is_row_read(kernel, base, dims, expand):
                    return False
                if dims is None and base in self.row_values:
                    return False  # a row value read at full shape: not the same space
            elif self._reaches(src, kernel):
                return False
        return True

    def _row_kernel(self, op: DOp) -> int | None:
        """The stitch kernel ``op`` can join as a once-per-row op, if any."""
        target = None
        for operand in op.operands:
            base, dims, expand = self.access.resolve(operand)
            producer = self.producer.get(base)
            if producer is not None and producer.name == "stablehlo.constant":
                if producer.const_value.ndim == 0:
                    continue
                return None
            if base in self.a.host_values:
                continue
            k = self.kernel_of.get(base)
            if k is None or not self._is_row_read(k, base, dims, expand) or target not in (None, k):
                return None
            target = k
        if target is not None:
            lead = self.kernels[target].dims[:-1]
            shape = self.a.shape_class(op.results[0])
            row_shaped = list(shape[:len(lead)]) == lead and (
                len(shape) == len(lead)
                or len(shape) == len(lead) + 1 and self.a.symbols.constant_value(shape[-1]) == 1)
            if not row_shaped:
                return None
        return target

    def _reaches(self, reader: int, kernel: int) -> bool:
        """True if ``reader`` (transitively) reads what ``kernel`` writes."""
        stack, seen = [reader], set()
        while stack:
            k = stack.pop()
            if k == kernel:
                return True
            if k not in seen:
                seen.add(k)
                stack.extend(self.deps[k])
        return False

    def _new_kernel(self, kind: str, dims: tuple) -> int:
        self.kernels.append(Kernel(f"kernel{len(self.kernels)}", kind, list(dims), [], [], []))
        self.deps.append(set())
        return len(self.kernels) - 1

    def _latest(self, dims: tuple, op: DOp) -> int | None:
        """The latest loop/stitch kernel over ``dims``, if ``op`` may join it."""
        for idx in range(len(self.kernels) - 1, -1, -1):
            k = self.kernels[idx]
            if tuple(k.dims) == dims and k.kind not in ("reduce", "library", "index"):
                return idx if self.legal_kernel(idx, op) else None
        return None

    def _concat_in_place(self, op: DOp) -> bool:
        """May a concatenation be read in place by a loop kernel? Its parts must be tensors
        in memory of the result's element type (not host scalars, inlined constants)."""
        if not self.options.concat_maps or not self.a.value_dims[op.results[0]]:
            return False
        for v in op.operands:
            base, _, _ = self.access.resolve(v)
            producer = self.producer.get(base)
            if base in self.a.host_values or self.access.elem(v) != op.result_types[0][0] or (
                    producer is not None and producer.name == "stablehlo.constant"
                    and producer.const_value.ndim == 0):
                return False
        return True

    def _concat_ops(self, kernel: int) -> list[KernelOp]:
        return [o for o in self.kernels[kernel].ops if o.op == "concatenate"]

    def place_concat(self, op: DOp) -> None:
        """A concatenation as an index map: a ``concatenate`` op of a loop kernel
        reading each part where it lies, so no concatenated copy is written unless
        another kernel reads it. At most one concatenation along the innermost dim
        per kernel (its rows are cut into one column segment per part)."""
        shape = self.a.shape_class(op.results[0])
        axis = op.int_attr("dimension")
        target = self._latest(shape, op)
        if target is not None:
            kernel = self.kernels[target]
            inner_taken = any(o.attrs["axis"] == len(shape) - 1 for o in self._concat_ops(target))
            if kernel.kind != "loop" or (axis == len(shape) - 1 and inner_taken) or any(
                    self._src(self.access.resolve(v)[0]) == target for v in op.operands):
                target = None  # a part computed by that kernel would be read shifted
        if target is None:
            target = self._new_kernel("loop", shape)
        kernel = self.kernels[target]
        rank = len(shape)
        refs = []
        for v in op.operands:
            base, dims, expand = self.access.resolve(v)
            if dims is None:
                dims, expand = list(range(rank)), ["no"] * rank
            kernel.inputs.append(Access(self.buffer_for_base(base), dims, expand,
                                        self.access.window_of(v), part_of=op.results[0]))
            refs.append(("in", len(kernel.inputs) - 1))
            src = self._src(base)
            if src is not None:
                self.deps[target].add(src)
        kernel.ops.append(KernelOp(
            value=op.results[0], op="concatenate", operands=refs, elem=op.result_types[0][0],
            operand_elems=[self.access.elem(v) for v in op.operands], tf_node=op.tf_node,
            attrs={"axis": axis, "sizes": [self.a.value_dims[v][axis] for v in op.operands]}))
        self.kernel_of[op.results[0]] = target

    def place(self, op: DOp) -> None:
        if op.name == "stablehlo.concatenate" and self._concat_in_place(op):
            self.place_concat(op)
            return
        if op.name == "stablehlo.dynamic_conv":
            self.place_conv(op)
            return
        if op.name in _INDEX_OPS:
            self.place_index(op)
            return
        if op.name == "stablehlo.reduce":
            self.place_reduce(op)
            return
        if op.name == "stablehlo.dot_general":
            self.place_library(op)
            return
        shape = self.a.shape_class(op.results[0])
        row = False
        target = self._row_kernel(op)
        if target is not None:
            row = True
        else:
            target = self._latest(shape, op)
        if target is None:
            target = self._new_kernel("loop", shape)
        self._append(target, op, op.operands, row)
        if row:
            self.row_values.add(op.results[0])

    def place_arg_reduce(self, op: DOp) -> None:
        """ArgMax/ArgMin: a "reduce" kernel folding (value, position) pairs; only the
        index result is used (the iota operand is the kernel's own loop counter)."""
        operand = op.operands[0]
        target = self._new_kernel("reduce", self.a.shape_class(operand))
        self.kernels[target].reduce_dims = list(op.reduce_dims)
        init = self.producer[op.operands[2]].const_value.item()
        ref = self.operand_ref(target, operand)
        if ref[0] != "in":
            raise ShapeError(f"ArgMax/ArgMin {op.tf_node} of a constant is not supported")
        src = self._src(self.access.resolve(operand)[0])
        if src is not None:
            self.deps[target].add(src)
        self.kernels[target].ops.append(KernelOp(
            value=op.results[1], op="arg_reduce", operands=[ref],
            elem=op.result_types[1][0], operand_elems=[self.access.elem(operand)], tf_node=op.tf_node,
            attrs={"direction": op.reduce_kind[3:], "init": init}))
        self.kernel_of[op.results[1]] = target

    def place_reduce(self, op: DOp) -> None:
        if len(op.results) == 2:
            self.place_arg_reduce(op)
            return
        operand = op.operands[0]
        shape = self.a.shape_class(operand)
        rank = len(shape)
        init = self.producer[op.operands[1]].const_value.item()
        attrs = {"combiner": op.reduce_kind, "init": init}
        if op.reduce_dims == [rank - 1]:
            target = self._latest(shape, op)
            if target is not None and self._concat_ops(target):
                target = None  # stitch kernels have no emitter for concatenations
            if target is None:
                target = self._new_kernel("stitch", shape)
            self.kernels[target].kind = "stitch"
            self._append(target, op, [operand], True, attrs)
            self.row_values.add(op.results[0])
        else:
            target = self._input_fusion(op)
            if target is not None:
                # The producers run inside the reduction, at each element it folds.
                self.kernels[target].kind = "reduce"
                self.kernels[target].reduce_dims = list(op.reduce_dims)
                self._append(target, op, [operand], False, attrs)
                return
            target = self._new_kernel("reduce", shape)
            self.kernels[target].reduce_dims = list(op.reduce_dims)
            self._append(target, op, [operand], False, attrs)
            if self.kernels[target].ops[-1].operands[0][0] != "in":
                raise ShapeError(f"reduction {op.tf_node} of a constant is not supported")

    def _input_fusion(self, op: DOp) -> int | None:
        """The loop kernel computing a (non-row) reduction's operand, if the reduction
        may absorb it: same iteration space, and nothing it computes is read by any
        other op or returned (so no full-shape value needs memory any more)."""
        operand = op.operands[0]
        base, dims, _ = self.access.resolve(operand)
        k = self.kernel_of.get(base)
        if not self.options.input_fusion or dims is not None or k is None or base in self.view_base:
            return None
        kernel = self.kernels[k]
        if kernel.kind != "loop" or tuple(kernel.dims) != self.a.shape_class(operand) or \
                self._concat_ops(k):
            return None
        values = {o.value for o in kernel.ops}

        def stays_inside(v: str) -> bool:
            """Every read of ``v`` is by an op of the kernel or the reduction (through
            broadcasts and transposes, which are index maps, not ops)."""
            if v in self.func.returns:
                return False
            for user in self.users.get(v, []):
                if user.name.startswith("shape.") or user is op:
                    continue  # shape queries read dims only
                if user.name in ("stablehlo.dynamic_broadcast_in_dim", "stablehlo.transpose"):
                    if not stays_inside(user.results[0]):
                        return False
                elif not (user.results and user.results[0] in values):
                    return False
            return True

        return k if all(stays_inside(v) for v in values) else None

    def _materialize(self, value: str, buffer: str | None = None) -> str:
        """A loop kernel writing ``value`` (read through an index map or a view)
        densely into a new temp or into ``buffer``; returns the new value's name."""
        dense = f"{value}.dense" if buffer is None else f"{value}.{buffer}"
        if dense in self.kernel_of:
            return dense
        k = self._new_kernel("loop", self.a.shape_class(value))
        ref = self.operand_ref(k, value)
        src = self._src(self.access.resolve(value)[0])
        if src is not None:
            self.deps[k].add(src)
        elem = self.access.elem(value)
        self.kernels[k].ops.append(KernelOp(value=dense, op="convert", operands=[ref], elem=elem,
                                            operand_elems=[elem],
                                            tf_node=self.producer[value].tf_node, attrs={}))
        self.kernel_of[dense] = k
        if buffer is None:
            buffer = self._temp(elem, self.a.value_dims[value])
        self.buffer_of[dense] = buffer
        return dense

    def place_view(self, op: DOp) -> None:
        """A reshape: an alias of a dense buffer holding its operand."""
        result, operand = op.results[0], op.operands[0]
        base, dims, _ = self.access.resolve(operand)
        if base in self.a.host_values:
            raise ShapeError(f"reshape of a host-computed scalar ({op.tf_node})")
        if dims is not None:
            base = self._materialize(operand)
        root = self.buffer_for_base(base)
        name = f"{self.prefix}view{len([b for b in self.buffers.values() if b.role == 'alias'])}"
        self.buffers[name] = Buffer(name, op.result_types[0][0], self.a.value_dims[result],
                                    "alias", alias_of=root)
        self.buffer_of[result] = name
        self.view_base[result] = base

    def _append(self, target: int, op: DOp, operands: list[str], row: bool,
                attrs: dict | None = None) -> None:
        refs = [self.operand_ref(target, v) for v in operands]
        for v in operands:
            src = self._src(self.access.resolve(v)[0])
            if src is not None and src != target:
                self.deps[target].add(src)
        self.kernels[target].ops.append(KernelOp(
            value=op.results[0], op=op.name.split(".", 1)[1], operands=refs,
            elem=op.result_types[0][0], operand_elems=[self.access.elem(v) for v in operands],
            tf_node=op.tf_node, attrs=attrs if attrs is not None else op.attrs, row=row))
        self.kernel_of[op.results[0]] = target

    def run(self) -> FusionPlan:
        for i, (elem, _) in enumerate(self.func.args):
            name = f"arg{i}"
            self.buffers[name] = Buffer(name, elem, self.a.value_dims[f"%arg{i}"], "input", i)
            self.buffer_of[f"%arg{i}"] = name
        copies: list[tuple[int, str]] = []
        for i, value in enumerate(self.func.returns):
            base, dims, _ = self.access.resolve(value)
            op = self.producer.get(base)
            if dims is not None or (op is not None and op.name == "stablehlo.dynamic_reshape") or (
                    base in self.a.host_values or base in self.a.host_arrays):
                # An index map or a view of other memory: outputs own theirs.
                name = f"result{i}"
                self.buffers[name] = Buffer(name, self.access.elem(value), self.a.value_dims[value],
                                            "output", i)
                copies.append((i, value))
                continue
            if base not in self.producer or base in self.buffer_of:
                raise ShapeError(f"result {i} is not computed by the cluster")
            op = self.producer[base]
            if op.name in NOT_COMPUTE:
                raise ShapeError(f"result {i} is a constant")
            name = f"result{i}"
            self.buffers[name] = Buffer(name, op.elem_of(base), self.a.value_dims[base],
                                        "output", i)
            self.buffer_of[base] = name
        # An ArgMax's iota is the reduce kernel's loop counter, never a tensor.
        iotas = {op.operands[1] for op in self.func.ops
                 if op.name == "stablehlo.reduce" and len(op.results) == 2}
        used_elsewhere = {v for op in self.func.ops for i, v in enumerate(op.operands)
                          if not (op.name == "stablehlo.reduce" and len(op.results) == 2 and i == 1)}
        for op in self.func.ops:
            if op.results and op.results[0] in iotas - used_elsewhere - set(self.func.returns):
                continue
            if self.access.unit_reshape_map(op) is not None:
                continue  # a slice's shrink/new axes: read in place through the window
            if op.name == "stablehlo.dynamic_reshape":
                self.place_view(op)
            elif op.results and op.results[0] in self.a.host_values:
                continue  # computed by the host runner, read by kernels as a value
            elif self.access.window_slice(op):
                continue  # read in place by its consumers
            elif op.name.startswith(("stablehlo.", "chlo.")) and op.name not in NOT_COMPUTE:
                self.place(op)
        for i, value in copies:
            self._materialize(value, f"result{i}")
        # A value read only for its shape (``tf.shape(tf.pad(x))``) needs no kernel,
        # but a gather checks its indices as TF's kernel does: it still runs, into a temp.
        written = {self.kernel_of.get(v) for v in self.buffer_of}
        for k, kernel in enumerate(self.kernels):
            if k not in written and kernel.kind == "index" and kernel.ops[0].op in _CHECKING:
                value = kernel.ops[0].value
                self.buffer_of[value] = self._temp(kernel.ops[0].elem, self.a.value_dims[value])
        # A value leaves its kernel if another kernel reads it or it is a result.
        for value, buf in self.buffer_of.items():
            k = self.kernel_of.get(value)
            if k is not None:
                self.kernels[k].outputs.append((value, buf))
        order = [k for k in launch_order(self.kernels, self.deps, self.prefix) if k.outputs]
        find = self.a.symbols.find

        def same_dim(a: int, b: int) -> bool:
            return find(a) == find(b)

        if self.options.gemm_layouts:
            results = {f"result{i}" for i in range(len(self.func.returns))}
            order = plan_result_layouts(order, self.buffers, results, same_dim)
            plan_transposed_products(order, self.buffers, results)
        if self.options.gemm_epilogues:
            order = hoist_epilogue_inputs(order, self.buffers)
        if self.options.gathered_a:
            order = plan_gathered_a(order, self.buffers)
        if self.options.reads_in_place:
            order = plan_reads_in_place(order, self.buffers, self.a.symbols.constant_value)
        for i, kernel in enumerate(order):  # numbered again without the unread ones
            kernel.name = f"{self.prefix}kernel{i}"
        keep = scratch_candidates(order, self.buffers, self.a.symbols, self.options.scratch_c)
        plan_reuse(order, self.buffers, self.a.symbols, keep)
        if self.options.gemm_epilogues:
            plan_epilogues(order, self.buffers, same_dim, self.a.symbols.constant_value)
            if self.options.gemm_chains:
                plan_chains(order, self.buffers, same_dim)
                if self.options.scratch_c:
                    plan_block_scratch(order, self.buffers)
        if self.options.shared_a_gemms:
            plan_shared_a(order, self.buffers, same_dim)
        plan_epilogue_scratch(order, self.buffers, keep)
        if self.options.gathered_a and self.options.gemm_epilogues:
            plan_produced_a(order, self.buffers)
        if self.options.gemm_layers and self.options.gemm_epilogues:
            plan_layer_chains(order, self.buffers, same_dim)
        return FusionPlan(
            cluster_name=self.cluster_name,
            symbols=self.a.symbols.defs,
            checks=self.a.checks,
            buffers=self.buffers,
            kernels=order,
            arg_elems=[e for e, _ in self.func.args],
            arg_dims=[tuple(d) for _, d in self.func.args],
            result_buffers=[f"result{i}" for i in range(len(self.func.returns))],
        )


def plan_fusion(func: DFunc, cluster_name: str,
                options: PlanOptions = PlanOptions()) -> tuple[FusionPlan, ShapeAnalysis]:
    """Analyses shapes of ``func`` and plans its kernels.

    When assuming "no unknown dim is broadcast" lets fewer kernels do the work,
    the plan also carries that speculative plan; the host runner checks the
    assumption per call and runs whichever plan holds. ``options``: the fusions
    the backend can emit (``disc_tf.backends``: each backend's ``plan_options``).
    """
    func = eliminate_dead_code(forward_copies(func))
    analysis = analyze(func)
    plan = _Planner(func, analysis, cluster_name, options=options).run()
    speculation = speculate_no_broadcast(analysis)
    if speculation is not None:
        spec_analysis, symbols = speculation
        spec_plan = _Planner(func, spec_analysis, cluster_name, prefix="spec_",
                             options=options).run()
        if len(spec_plan.kernels) < len(plan.kernels):
            plan.speculative = spec_plan
            plan.speculated_symbols = symbols
    log.debug("%s", plan.describe())
    return plan, analysis
