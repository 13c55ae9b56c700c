"""The fusion plan: printable data handed from the planner to codegen."""

from __future__ import annotations

import dataclasses

import numpy as np

from disc_tf.fusion.symbols import ShapeCheck, SymDef


@dataclasses.dataclass
class Buffer:
    """A tensor in memory: a cluster input/output, a temporary, a constant, or an
    alias (a reshape: the memory of buffer ``alias_of`` seen with other dims)."""

    name: str
    elem: str
    dims: list[int]  # symbols
    role: str  # "input" | "output" | "temp" | "const" | "alias" | "host"
    index: int = -1  # argument or result index for inputs/outputs
    const_value: np.ndarray | None = None
    alias_of: str | None = None
    #: for "host": each element as a host scalar (a small array computed from dims)
    host_elements: list | None = None
    #: for "temp": an earlier temp of the same proven byte size, dead before this one
    #: is written, whose memory this one reuses (the buffer planner's decision)
    reuses: str | None = None

    def __str__(self) -> str:
        where = f" #{self.index}" if self.index >= 0 else ""
        shape = ", ".join(f"s{d}" for d in self.dims)
        view = f" = view of {self.alias_of}" if self.alias_of else ""
        if self.host_elements is not None:
            view = " = [" + ", ".join(str(h) for h in self.host_elements) + "]"
        if self.reuses:
            view = f" (reuses the memory of {self.reuses})"
        return f"{self.role}{where} {self.name}: {self.elem}[{shape}]{view}"


@dataclasses.dataclass
class RowGather:
    """A gather of table rows read in place (``fusion/gathered_rows.py``): the
    kernel reads row ``ids[r]`` of the table where the gathered tensor's row r
    would be. ``ids``: the kernel input holding the ids; ``dims``: the gathered
    tensor's dims (symbols), whose strides the read walks as if it were in memory."""

    ids: int
    dims: list[int]
    tf_node: str


@dataclasses.dataclass
class PadRead:
    """A constant pad read in place (``fusion/padded_reads.py``): the kernel reads
    the padded tensor (``dims``, symbols) from the unpadded buffer, elements ``low``
    (symbols, per dim) before its start, and ``value`` outside it. Read through a
    slice of step 1, ``dims`` are the slice's and ``starts`` (symbols) where it starts
    in the padded tensor: the padding before it is then ``low - starts``."""

    low: list[int]
    dims: list[int]
    value: object
    tf_node: str
    starts: list[int] | None = None


@dataclasses.dataclass
class Access:
    """How a kernel reads a buffer: identity, or an index map (broadcast and/or
    transpose).

    ``dims[i]`` is the kernel dim that buffer dim i runs along; ``expand[i]`` is
    "no", "yes" or "maybe" (decided per call by the host runner). Dims that are
    not increasing mean a transposed read.
    """

    buffer: str
    dims: list[int] | None = None
    expand: list[str] | None = None
    #: a slice of the buffer read in place: (start symbol per buffer dim, constant
    #: step per buffer dim, sliced size symbol per buffer dim)
    window: tuple | None = None
    #: one part of a concatenation read in place: the concatenate op's value. The
    #: kernel's ``concatenate`` op reads the part holding each element (its index
    #: along the concatenated dim shifted by the parts before it).
    part_of: str | None = None
    #: the table of a row gather read in place: the read goes through the ids
    gather: RowGather | None = None
    #: the ids of the row gather read in place by input ``ids_for`` (not read per
    #: element: that input's row pointer is chosen by them)
    ids_for: int | None = None
    #: a constant pad read in place: the buffer is the unpadded tensor
    pad: PadRead | None = None

    @property
    def is_identity(self) -> bool:
        """True if the buffer is read at the kernel's own index (a gather's ids are
        read at the rows the gathered tensor's offsets give: not so)."""
        return self.dims is None and self.ids_for is None

    @property
    def permuted(self) -> bool:
        """True if buffer dims are read out of order (a transpose) or through a slice
        window: the innermost kernel dim may then have any stride."""
        return (self.window is not None or self.part_of is not None
                or self.gather is not None or self.ids_for is not None
                or self.pad is not None) or (
            self.dims is not None and any(a >= b for a, b in zip(self.dims, self.dims[1:])))

    def __str__(self) -> str:
        if self.gather is not None:
            return (f"rows of {self.buffer} by in{self.gather.ids} ({self.gather.tf_node}), "
                    f"dims={self.dims}, expand={self.expand}")
        if self.pad is not None:
            low = ", ".join(f"s{d}" for d in self.pad.low)
            if self.pad.starts is not None:
                low = ", ".join(f"s{d} - s{t}" for d, t in zip(self.pad.low, self.pad.starts))
            return (f"pad({self.buffer}, low=[{low}], value={self.pad.value}) "
                    f"({self.pad.tf_node}), dims={self.dims}, expand={self.expand}")
        if self.ids_for is not None:
            return f"ids {self.buffer} of in{self.ids_for}"
        if self.part_of is not None:
            inner = dataclasses.replace(self, part_of=None)
            if self.window is None and self.dims == sorted(self.dims) == list(
                    range(len(self.dims))) and set(self.expand) == {"no"}:
                inner = dataclasses.replace(inner, dims=None, expand=None)
            return f"part of {self.part_of}: {inner}"
        if self.window is not None:
            starts = ", ".join(f"s{s}" for s in self.window[0])
            return (f"window({self.buffer}, start=[{starts}], step={self.window[1]}, "
                    f"dims={self.dims}, expand={self.expand})")
        if self.is_identity:
            return self.buffer
        if self.permuted:
            return f"map({self.buffer}, dims={self.dims}, expand={self.expand})"
        return f"broadcast({self.buffer}, dims={self.dims}, expand={self.expand})"


@dataclasses.dataclass
class KernelOp:
    """One computation inside a kernel.

    Operands are ("in", k) for kernel input k, ("val", name) for an earlier
    op of the same kernel, ("const", scalar) for an inlined scalar constant, or
    ("host", HostScalar) for a value the host runner computes from dims.
    ``op == "reduce"`` folds its operand over the kernel's innermost dim
    (combiner and init in ``attrs``). ``row`` ops (reductions and what is
    computed from their results) run once per row of a stitch kernel.
    ``op == "concatenate"`` (loop kernels only) reads its operands, inputs that
    are the parts of a concatenation, at the part holding each element; its
    ``attrs``: ``axis`` (a kernel dim) and each part's ``sizes`` along it.
    """

    value: str
    op: str  # DHLO op name without dialect, e.g. "add"
    operands: list[tuple[str, object]]
    elem: str
    operand_elems: list[str]
    tf_node: str
    attrs: dict
    row: bool = False


@dataclasses.dataclass
class Kernel:
    """One generated kernel over the iteration space ``dims``.

    kinds: "loop" (elementwise), "stitch" (reductions over the innermost dim
    with their producers and consumers, one row per task), "reduce" (one
    reduction over any other dims, one output element per task; ``reduce_dims``),
    "library" (one ``dot_general`` done by the RAL's GEMM; inputs 0 and 1 are the
    lhs and rhs buffers, read as they are stored).
    """

    name: str
    kind: str
    dims: list[int]  # symbols (class representatives) of the iteration space
    inputs: list[Access]
    ops: list[KernelOp]
    outputs: list[tuple[str, str]]  # (value, buffer)
    reduce_dims: list[int] = dataclasses.field(default_factory=list)
    #: library kernels: the loop kernel run on each finished block of C inside the
    #: GEMM (``fusion/epilogue.py``) instead of being launched after it
    epilogue: str | None = None
    #: the epilogue needs blocks of whole rows of C (a row reduction, or rows of a
    #: view of C that split C's rows), so the GEMM is cut by rows only
    epilogue_full_rows: bool = False
    #: library kernels with a row-wise epilogue: the library kernel whose A is that
    #: epilogue's result, run on each block's rows right after it (attention's
    #: softmax(Q Kᵀ) · V) instead of being launched after this GEMM
    chain: str | None = None
    #: chained library kernels whose C (and the epilogue's result written in its place)
    #: nothing else reads: C lives only in per-block scratch, never in memory whole
    #: (attention's S x S scores and probabilities; ``plan_block_scratch``)
    c_in_scratch: bool = False
    #: library kernels with C in scratch: the input of the epilogue whose false elements
    #: make C's element there needless (a mask's select), so that each block computes
    #: C's columns up to its rows' last true one only (``fusion/masked_columns.py``)
    masked_by: int | None = None
    #: library kernels: the library kernels just before this one that read the same A
    #: (the Q and K projections beside V's) and run in this one's launch, row block by
    #: row block (``sgemm_shared_a``)
    shares_a: list[str] = dataclasses.field(default_factory=list)
    #: library kernels: the depthwise convolution (an index kernel with its epilogue) whose
    #: result is this GEMM's A, run on each task's rows into its scratch inside this
    #: launch (``fusion/produced_a.py``; ``sgemm_gathered_a``)
    a_producer: str | None = None
    #: library kernels: the GEMMs after this one, each reading the last one's result as
    #: its A, that run in this one's launch with their epilogues, every layer on a block
    #: of rows before the next block (an MLP; ``fusion/layer_chain.py``, ``sgemm_layers``)
    layers: list[str] = dataclasses.field(default_factory=list)

    @property
    def tf_ops(self) -> list[str]:
        """The TF nodes this kernel computes, in order, without repeats."""
        seen: list[str] = []
        for op in self.ops:
            if op.tf_node not in seen:
                seen.append(op.tf_node)
        return seen

    @property
    def host_scalars(self) -> list:
        """Distinct host-computed scalars the kernel's ops read, in first-use order."""
        seen: list = []
        for op in self.ops:
            for kind, ref in op.operands:
                if kind == "host" and ref not in seen:
                    seen.append(ref)
        return seen

    @property
    def needs_broadcast_version(self) -> bool:
        """True if some input may be broadcast at run time (speculation)."""
        return any(not a.is_identity for a in self.inputs)


@dataclasses.dataclass(frozen=True)
class GemmForm:
    """A ``dot_general`` as a row-major batched GEMM ``C[b] = op(A[b]) @ op(B[b])``.

    Each field is a list of dim positions whose product gives the value: of the
    lhs buffer (``batch``, ``m``, ``k``, ``lda``, ``stride_a``) or of the rhs
    buffer (``n``, ``ldb``, ``stride_b``).
    """

    batch: list
    m: list
    k: list
    n: list
    transpose_a: bool
    transpose_b: bool
    lda: list
    stride_a: list
    ldb: list
    stride_b: list


def gemm_form(lhs_rank: int, rhs_rank: int, dot_dims: dict) -> GemmForm | None:
    """The GEMM computing a dot_general, or None if its layout is not one.

    Supported: leading batch dims [0, nb) on both sides; one contracting dim;
    lhs [batch, m.., k] (several free dims flatten into m) or [batch, k, m];
    rhs [batch, k, n] or [batch, n, k].
    """
    nb = len(dot_dims["lhs_batch"])
    if dot_dims["lhs_batch"] != list(range(nb)) or dot_dims["rhs_batch"] != list(range(nb)):
        return None
    if len(dot_dims["lhs_contract"]) != 1 or len(dot_dims["rhs_contract"]) != 1:
        return None
    (lc,), (rc,) = dot_dims["lhs_contract"], dot_dims["rhs_contract"]
    if rhs_rank != nb + 2 or lhs_rank < nb + 2:
        return None
    if lc == lhs_rank - 1:
        ta, m, k, lda = False, list(range(nb, lhs_rank - 1)), [lc], [lc]
    elif lc == nb and lhs_rank == nb + 2:
        ta, m, k, lda = True, [nb + 1], [nb], [nb + 1]
    else:
        return None
    if rc == nb:
        tb, n, ldb = False, [nb + 1], [nb + 1]
    elif rc == nb + 1:
        tb, n, ldb = True, [nb], [nb + 1]
    else:
        return None
    return GemmForm(list(range(nb)), m, k, n, ta, tb, lda, list(range(nb, lhs_rank)), ldb,
                    [nb, nb + 1])


def strided_gemm(dot_dims: dict, lhs_perm: list[int], rhs_perm: list[int]) -> dict | None:
    """A dot_general whose operands are dense buffers read through transposes, as one
    two-level-batched GEMM over the buffers' own memory; None if it is not one.

    ``*_perm[i]``: the buffer dim holding the operand's logical dim i. The result holds
    buffer dims: ``batch`` ([(lhs dim, rhs dim)], at most 2), ``m``, ``k_lhs``, ``k_rhs``,
    ``n`` and whether A/B are read transposed (their contiguous dim, the buffer's last,
    must be one of the matrix dims).
    """
    if len(dot_dims["lhs_contract"]) != 1 or len(dot_dims["rhs_contract"]) != 1:
        return None
    batch = list(zip(dot_dims["lhs_batch"], dot_dims["rhs_batch"]))
    used_l = set(dot_dims["lhs_batch"]) | set(dot_dims["lhs_contract"])
    used_r = set(dot_dims["rhs_batch"]) | set(dot_dims["rhs_contract"])
    free_l = [i for i in range(len(lhs_perm)) if i not in used_l]
    free_r = [i for i in range(len(rhs_perm)) if i not in used_r]
    if len(batch) > 2 or len(free_l) != 1 or len(free_r) != 1:
        return None
    m, kl = lhs_perm[free_l[0]], lhs_perm[dot_dims["lhs_contract"][0]]
    n, kr = rhs_perm[free_r[0]], rhs_perm[dot_dims["rhs_contract"][0]]
    last_l, last_r = len(lhs_perm) - 1, len(rhs_perm) - 1
    if last_l not in (m, kl) or last_r not in (n, kr):
        return None
    return {"batch": [(lhs_perm[i], rhs_perm[j]) for i, j in batch], "m": m, "k_lhs": kl,
            "k_rhs": kr, "n": n, "transpose_a": m == last_l, "transpose_b": kr == last_r}


def depthwise_f32(kernel: Kernel, buffers: dict[str, Buffer]) -> bool:
    """True if ``kernel`` is a depthwise convolution of f32 input, filter and result
    (the CPU's register-blocked kernel, which can run a GEMM-style epilogue)."""
    if kernel.kind != "index" or len(kernel.ops) != 1 or kernel.ops[0].op != "grouped_conv":
        return False
    names = [a.buffer for a in kernel.inputs] + [b for _, b in kernel.outputs]
    return kernel.ops[0].elem == "f32" and all(buffers[n].elem == "f32" for n in names)


def root_of(buffers: dict[str, Buffer], name: str) -> str:
    """The buffer that owns the memory of ``name``: views and aliases followed."""
    while buffers[name].alias_of is not None:
        name = buffers[name].alias_of
    return name


def memory_of(buffers: dict[str, Buffer], name: str) -> str:
    """The allocation ``name`` lives in: its root, or the temp that root is written
    in place of (the buffer planner's ``reuses``)."""
    name = root_of(buffers, name)
    return buffers[name].reuses or name


@dataclasses.dataclass
class FusionPlan:
    """Everything codegen needs for one cluster."""

    cluster_name: str
    symbols: list[SymDef]
    checks: list[ShapeCheck]
    buffers: dict[str, Buffer]
    kernels: list[Kernel]
    arg_elems: list[str]
    arg_dims: list[tuple]  # per argument: static size or None per dim
    result_buffers: list[str]
    #: A plan with fewer kernels, valid when every broadcast symbol listed in
    #: ``speculated_symbols`` equals all its components in this call.
    speculative: FusionPlan | None = None
    speculated_symbols: list[int] = dataclasses.field(default_factory=list)
    #: The arguments that hold weights (a Const's or a variable's value: the cluster's
    #: ``constant_inputs``), whose derived values the runner may keep across calls
    #: (``codegen/cpu_fold.py``); None: not known, any argument may be one.
    constant_args: frozenset[int] | None = None

    @property
    def num_kernels(self) -> int:
        """Generated kernels, speculative versions included."""
        return len(self.kernels) + (len(self.speculative.kernels) if self.speculative else 0)

    @property
    def arg_ranks(self) -> list[int]:
        """Rank of each argument."""
        return [len(d) for d in self.arg_dims]

    def root(self, name: str) -> str:
        """The buffer that owns the memory of ``name`` (follows aliases)."""
        return root_of(self.buffers, name)

    def memory(self, name: str) -> str:
        """The allocation ``name`` lives in (its root, or what that reuses)."""
        return memory_of(self.buffers, name)

    def may_be_shorter_than(self, kernel: Kernel, width: int) -> bool:
        """True unless ``kernel``'s innermost dim is a constant of at least ``width``
        (a stitch kernel's short-row version is emitted only then)."""
        d = self.symbols[kernel.dims[-1]]
        return not (d.kind == "const" and d.value >= width)

    def describe(self) -> str:
        """Human-readable plan (what ``inspect`` and the dump dir show)."""
        lines = [f"fusion plan for {self.cluster_name}: {len(self.kernels)} kernel(s)"]
        lines.append("symbols:")
        lines.extend(f"  s{i} = {d}" for i, d in enumerate(self.symbols))
        lines.append("host checks:")
        lines.extend(f"  {c}" for c in self.checks)
        lines.append("buffers:")
        lines.extend(f"  {b}" for b in self.buffers.values())
        for k in self.kernels:
            dims = ", ".join(f"s{d}" for d in k.dims)
            spec = " (+ broadcast version chosen at run time)" if k.needs_broadcast_version else ""
            if k.kind == "stitch" and self.may_be_shorter_than(k, 8):  # one f32 vector
                spec += " (+ short-row version chosen at run time)"  # CUDA: a warp per row
            lines.append(f"kernel {k.name}: {k.kind} over [{dims}]{spec}")
            lines.append(f"  TF ops: {', '.join(k.tf_ops)}")
            lines.append(f"  reads: {', '.join(str(a) for a in k.inputs)}")
            lines.append(f"  writes: {', '.join(f'{v} -> {b}' for v, b in k.outputs)}")
            gathered = k.ops[0].attrs.get("gathered_a") if k.kind == "library" else None
            if gathered:
                lines.append(f"  A: rows of {gathered['table']} that {gathered['tf_node']} picks "
                             f"by {gathered['ids']}, copied by each task (no gathered buffer)")
            layout = k.ops[0].attrs.get("c_layout") if k.kind == "library" else None
            if layout:
                lines.append(f"  layout: C written into {k.outputs[0][1]} as "
                             f"{layout['tf_node']} laid it out (products along its dims "
                             f"{layout['batch']}, rows along dim {layout['m']})")
            if k.epilogue:
                where = ("the pixels of each task" if k.kind == "index"
                         else "each block of the GEMM's result")
                lines.append(f"  epilogue: {k.epilogue} runs on {where}")
            if k.shares_a:
                lines.append(f"  shares A: {', '.join(k.shares_a)} run in this launch, on "
                             "the same row blocks")
            if k.chain:
                lines.append(f"  chain: {k.chain} runs on the rows of each block after the "
                             "epilogue")
            if k.layers:
                lines.append(f"  layers: {', '.join(k.layers)} (with their epilogues) run in "
                             "this launch, each block of rows through every layer in turn")
            if k.c_in_scratch:
                lines.append("  C in scratch: each block of C in the thread's scratch, "
                             "never the whole of it")
            if k.a_producer:
                lines.append(f"  A: made by {k.a_producer} and its epilogue on each task's "
                             "rows, in the task's scratch (never the whole of it)")
            if k.masked_by is not None:
                lines.append(f"  masked columns: each block computes C up to its rows' last "
                             f"true in{k.masked_by} of {k.epilogue}, whose select takes its "
                             "other arm past it")
        if self.speculative is not None:
            cond = ", ".join(f"s{s} == {self.symbols[s]}" for s in self.speculated_symbols)
            lines.append(f"speculation: when {cond} (nothing broadcast in this call):")
            lines.extend("  " + line for line in self.speculative.describe().splitlines()[1:]
                         if not line.startswith(("symbols:", "  s", "host checks:", "  check")))
        return "\n".join(lines)
