"""Scores a mask selects away are never computed: attention's causal (and padding) masks.

Keras' masked softmax reads the scores C = Q Kᵀ only through ``select(mask, C, -1e9)``:
where the mask is false the select takes its other arm, whatever C holds there. So a
block of C's rows needs only the columns up to the last true mask element on those
rows. With C in per-block scratch (``plan_block_scratch``) the RAL asks the generated
code for that count per block (``sgemm_scratch_c_cols``, ABI 9) and computes only
those columns; under a causal mask, rows [i0, i1) need i1 of them, so short blocks
compute about half of the S x S product. The chained P V GEMM then stops at the last
column of P that is not zero on the block's rows (``cpu_gemm``), which a causal mask
also halves.

``masked_input`` finds the mask: the epilogue E (a stitch kernel over C's own dims)
reads C once, and what it computes from C alone (a scale) reaches the rest of E only
as the true arm of ``select``s whose predicate is one input of E, a boolean buffer read
in place or broadcast (no transpose, window, gather or pad: the generated count walks
it by E's strides).
"""

from __future__ import annotations

from disc_tf.fusion.plan import Buffer, Kernel


def masked_input(lib: Kernel, e: Kernel, buffers: dict[str, Buffer]) -> int | None:
    """Index of the input of ``lib``'s epilogue ``e`` whose false elements make the
    element of ``lib``'s C at the same index needless, or None (module docstring)."""
    (_, c_name), = lib.outputs
    if e.kind != "stitch" or list(e.dims) != list(buffers[c_name].dims) or len(e.dims) < 2:
        return None
    reads = [i for i, a in enumerate(e.inputs) if a.buffer == c_name]
    if len(reads) != 1 or not e.inputs[reads[0]].is_identity:
        return None
    # values computed from C alone (a scale) until a select on the mask takes them
    derived = {("in", reads[0])}
    mask = None
    for op in e.ops:
        if not any(ref in derived for ref in op.operands):
            continue
        if op.row:
            return None  # a reduction over C's values: every column counts
        if op.op == "select" and len(op.operands) == 3 and op.operands[1] in derived:
            pred, _, on_false = op.operands
            if pred in derived or on_false in derived or pred[0] != "in":
                return None
            if mask is not None and mask != pred[1]:
                return None  # two masks: one count could not serve both
            mask = pred[1]
            continue
        derived.add(("val", op.value))
    if any(("val", value) in derived for value, _ in e.outputs):
        return None  # a value computed from C is a result of its own
    if mask is None:
        return None
    a = e.inputs[mask]
    if buffers[a.buffer].elem != "i1" or a.permuted or a.ids_for is not None:
        return None
    return mask
