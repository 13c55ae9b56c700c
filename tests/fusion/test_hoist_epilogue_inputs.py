"""``hoist_epilogue_inputs``: the kernels a GEMM's one reader still needs from between the
GEMM and it move to just before the GEMM when none of them needs the GEMM (GPT-2's causal
mask, computed for every layer after the first layer's scores GEMM), so the reader can
run as the GEMM's epilogue; kernels that need the GEMM, or that it does not need, stay."""

from __future__ import annotations

from disc_tf.fusion.epilogue import hoist_epilogue_inputs
from disc_tf.fusion.plan import Access, Buffer, Kernel, KernelOp


def _kernel(name: str, kind: str, reads: list[str], writes: list[str],
            op: str = "add") -> Kernel:
    ops = [KernelOp(f"%{name}", op, [("in", 0)], "f32", ["f32"], name, {})]
    return Kernel(name, kind, [0], [Access(r) for r in reads], ops,
                  [(f"%{name}_{w}", w) for w in writes])


def _buffers(*names: str) -> dict[str, Buffer]:
    return {n: Buffer(n, "f32", [0], "input" if n.startswith("arg") else "temp")
            for n in names}


def test_the_readers_inputs_move_before_the_gemm():
    buffers = _buffers("arg0", "arg1", "c", "m0", "mask", "p", "other")
    order = [
        _kernel("gemm", "library", ["arg0", "arg0"], ["c"], op="dot_general"),
        _kernel("range", "index", [], ["m0"]),
        _kernel("unrelated", "loop", ["arg1"], ["other"]),
        _kernel("mask", "loop", ["m0"], ["mask"]),
        _kernel("softmax", "stitch", ["c", "mask", "other"], ["p"]),
    ]
    names = [k.name for k in hoist_epilogue_inputs(order, buffers)]
    # everything the softmax reads but C, and what that needs, now precedes the GEMM
    assert names == ["range", "unrelated", "mask", "gemm", "softmax"]


def test_a_kernel_that_needs_the_gemm_stays_after_it():
    buffers = _buffers("arg0", "c", "d", "p")
    order = [
        _kernel("gemm", "library", ["arg0", "arg0"], ["c"], op="dot_general"),
        _kernel("after", "loop", ["c"], ["d"]),  # reads C: a second reader, nothing moves
        _kernel("softmax", "stitch", ["c", "d"], ["p"]),
    ]
    assert [k.name for k in hoist_epilogue_inputs(order, buffers)] == [
        "gemm", "after", "softmax"]


def test_needed_kernels_move_with_what_they_need_in_their_order():
    buffers = _buffers("arg0", "c", "x", "y", "p")
    order = [
        _kernel("gemm", "library", ["arg0", "arg0"], ["c"], op="dot_general"),
        _kernel("late", "loop", ["arg0"], ["x"]),
        _kernel("needs_x", "loop", ["x"], ["y"]),
        _kernel("softmax", "stitch", ["c", "y"], ["p"]),
    ]
    assert [k.name for k in hoist_epilogue_inputs(order, buffers)] == [
        "late", "needs_x", "gemm", "softmax"]


def test_gemms_keep_their_order():
    """A reader needing another GEMM (BERT's bias add after the Q, K and V projections,
    which share A in one launch) leaves the order as planned."""
    buffers = _buffers("arg0", "c", "q", "p")
    order = [
        _kernel("gemm", "library", ["arg0", "arg0"], ["c"], op="dot_general"),
        _kernel("other_gemm", "library", ["arg0", "arg0"], ["q"], op="dot_general"),
        _kernel("bias", "loop", ["c", "q"], ["p"]),
    ]
    assert [k.name for k in hoist_epilogue_inputs(order, buffers)] == [
        "gemm", "other_gemm", "bias"]
