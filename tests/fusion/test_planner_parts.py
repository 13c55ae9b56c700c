"""The planner's parts on their own: the alias analysis (``value_access``), and the
memory plan (``memory_plan``: launch order, in-place reuse), with printable results."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from disc_tf.dhlo_bridge.lower import lower_cluster
from disc_tf.fusion.dhlo_reader import read_module
from disc_tf.fusion.memory_plan import launch_order, plan_reuse
from disc_tf.fusion.plan import Access, Buffer, Kernel
from disc_tf.fusion.shape_analysis import analyze
from disc_tf.fusion.symbols import SymbolTable, SymDef
from disc_tf.fusion.value_access import ValueAccess
from tests.stage_helpers import cluster_of, dyn


def test_value_access_follows_transposes_and_broadcasts_to_memory():
    spec = cluster_of(lambda x, b: tf.transpose(tf.exp(x)) + b, dyn(2), dyn(1))
    func = read_module(lower_cluster(spec).text)
    access = ValueAccess(func, analyze(func))
    transposes = [op for op in func.ops if op.name == "stablehlo.transpose"]
    (t,) = transposes
    base, dims, expand = access.resolve(t.results[0])
    assert base == t.operands[0] and dims == [1, 0] and expand == ["no", "no"]
    assert access.transpose_perm(t.results[0]) == [1, 0]
    text = access.describe()
    assert f"{t.results[0]} reads {t.operands[0]} dims [1, 0]" in text
    assert "%arg1" in text  # the bias, read through its broadcast
    assert access.elem(t.results[0]) == "f32"


def _kernel(name: str, kind: str, reads: list[str], writes: list[str]) -> Kernel:
    k = Kernel(name, kind, ["s0"], [], [], [])
    k.inputs = [Access(b) for b in reads]
    k.outputs = [(f"%{b}", b) for b in writes]
    return k


def test_launch_order_runs_each_kernel_after_what_it_reads_and_renames():
    kernels = [_kernel("a", "loop", ["t1"], ["out"]), _kernel("b", "loop", ["in"], ["t1"])]
    order = launch_order(kernels, [{1}, set()], prefix="p_")
    assert [k.outputs[0][1] for k in order] == ["t1", "out"]
    assert [k.name for k in order] == ["p_kernel0", "p_kernel1"]


def test_reuse_takes_a_dying_temp_of_proven_equal_size_only():
    symbols = SymbolTable()
    n = symbols.new(SymDef("arg", arg=(0, 0)))
    m = symbols.new(SymDef("arg", arg=(0, 1)))
    buffers = {name: Buffer(name, "f32", dims, role) for name, dims, role in (
        ("in", [n], "input"), ("t0", [n], "temp"), ("t1", [n], "temp"), ("t2", [m], "temp"),
        ("t3", [n], "temp"))}
    order = [_kernel("k0", "loop", ["in"], ["t0"]), _kernel("k1", "loop", ["t0"], ["t1"]),
             _kernel("k2", "loop", ["t1"], ["t2"]), _kernel("k3", "library", ["t2"], ["t3"])]
    plan_reuse(order, buffers, symbols)
    assert buffers["t1"].reuses == "t0"  # t0 dies in k1, same size class
    assert buffers["t2"].reuses is None  # [m] is not proven equal to [n]
    assert buffers["t3"].reuses is None  # a library kernel does not write in place


def test_kernels_the_same_but_for_names_count_once():
    """Two softmax layers give the same stitch kernel twice: the compile profile's
    distinct count sees one."""
    from disc_tf import pipeline
    from disc_tf.sources import Sources

    w1 = tf.constant(np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8))
    w2 = tf.constant(np.linspace(1, -1, 64, dtype=np.float32).reshape(8, 8))
    spec = cluster_of(lambda x: tf.nn.softmax(tf.nn.softmax(x @ w1) @ w2),
                      tf.TensorSpec([None, 8], tf.float32))
    fe = pipeline.front_end(spec, "cpu")
    assert len(fe.sources.kernel_texts) == fe.plan.num_kernels
    assert fe.sources.distinct_kernels < fe.plan.num_kernels
    same = Sources("cpu", "", kernel_texts=(
        "// a/Softmax\nvoid kernel3_flat(Kernel3Args& a) { a.out0[0] = 1; }",
        "// b/Softmax\nvoid kernel7_flat(Kernel7Args& a) { a.out0[0] = 1; }",
        "void spec_kernel1_flat(Spec_kernel1Args& a) { a.out0[0] = 2; }"))
    assert same.distinct_kernels == 2


def _gemm(name: str, a: str, b: str, c: str) -> Kernel:
    """A plain [m, k] x [k, n] library GEMM."""
    from disc_tf.fusion.plan import KernelOp

    k = _kernel(name, "library", [a, b], [c])
    k.ops = [KernelOp(f"%{c}", "dot_general", [("in", 0), ("in", 1)], "f32", ["f32", "f32"],
                      name, {"lhs_batch": [], "rhs_batch": [], "lhs_contract": [1],
                             "rhs_contract": [0]})]
    return k


def test_gemms_sharing_a_never_run_beside_an_epilogue_writing_over_what_they_read():
    """x @ r then x @ w with a norm of (C + r) written over r (r dies there): sharing
    one launch, the norm would write over rows of r that the first GEMM's other blocks
    still read as B. Without the write the two share it."""
    from disc_tf.fusion.epilogue import plan_shared_a

    def plan(in_place: bool) -> list[Kernel]:
        buffers = {name: Buffer(name, "f32", ["s0", "s0"], "temp") for name in
                   ("r", "y0", "c", "z")}
        buffers.update({name: Buffer(name, "f32", ["s0", "s0"], "input") for name in ("x", "w")})
        buffers["z"].reuses = "r" if in_place else None
        norm = _kernel("e", "stitch", ["c", "r"], ["z"])
        order = [_gemm("l0", "x", "r", "y0"), _gemm("l", "x", "w", "c"), norm]
        order[1].epilogue = "e"
        plan_shared_a(order, buffers, lambda a, b: a == b)
        return order

    assert plan(False)[1].shares_a == ["l0"]
    assert plan(True)[1].shares_a == []


def test_a_gemm_with_a_chain_shares_no_launch():
    """The shared-A launch runs the last GEMM's epilogue but no chain: a run whose last
    GEMM has one (attention's scores on the same A as another GEMM) shares nothing, so
    the chained GEMM still runs."""
    from disc_tf.fusion.epilogue import plan_shared_a

    buffers = {name: Buffer(name, "f32", ["s0", "s0"], "temp") for name in ("y0", "c", "p", "o")}
    buffers.update({name: Buffer(name, "f32", ["s0", "s0"], "input") for name in ("x", "w", "v")})
    order = [_gemm("l0", "x", "w", "y0"), _gemm("l", "x", "w", "c"),
             _kernel("e", "stitch", ["c"], ["p"]), _gemm("l2", "p", "v", "o")]
    order[1].epilogue, order[1].chain = "e", "l2"
    plan_shared_a(order, buffers, lambda a, b: a == b)
    assert order[1].shares_a == []
    order[1].chain = None
    plan_shared_a(order, buffers, lambda a, b: a == b)
    assert order[1].shares_a == ["l0"]
