"""Kernels whose results the RAL keeps across calls (RAL ABI 10, ``fold_begin``).

A kernel that reads cluster inputs only (batch norm's ``rsqrt(variance + eps) * gamma``
and ``beta - mean * scale`` from four variables), or those and the results of such
kernels (a weight norm's ``g * v / ||v||``), computes the same results on every call
while those inputs hold the same values. The host runner asks the RAL
before launching it: when each input is a constant input of the call (a Const's or a
variable's value), the RAL hands back the results an earlier call computed from the
same input buffers (``cc/ral/folded_values.h``), and the launch is skipped.

Only the top-level runner folds (a loop step's inputs are not the cluster's), and only
kernels whose results are plain temporaries that no later buffer is written in place
of: the kept memory is read, never written, by the kernels after it.
"""

from __future__ import annotations

import dataclasses

from disc_tf.codegen.cpu_ops import STORAGE
from disc_tf.codegen.cpu_text import sym
from disc_tf.fusion.plan import FusionPlan, Kernel


@dataclasses.dataclass(frozen=True)
class Fold:
    """One folded kernel: its name, its ``site`` in the artifact, the cluster inputs its
    results are computed from (``args``: read by it or by the folded kernels it reads),
    the dims they depend on besides them (``key``, symbols), and its output buffers."""

    kernel: str
    site: int
    args: tuple[int, ...]
    key: tuple[int, ...]
    outputs: tuple[str, ...]

    @property
    def var(self) -> str:
        """The host runner's variable holding fold_begin's answer."""
        return f"fold{self.site}"


#: Kernel kinds a fold may skip: elementwise, row reductions and their producers and
#: consumers, other reductions (a weight norm's ``sqrt(sum(v * v))`` and its quotient).
FOLDABLE_KINDS = ("loop", "stitch", "reduce")


def _sources(plan: FusionPlan, k: Kernel, made: dict[str, Fold]) -> list[Fold | int] | None:
    """What ``k`` reads: a weight's input index (any input's where the plan does not know
    its weights), or the fold making a buffer; None if it reads anything else or reads
    it in a way the key would not cover."""
    if k.kind not in FOLDABLE_KINDS or not k.inputs or k.host_scalars:
        return None
    sources: list[Fold | int] = []
    for acc in k.inputs:
        if acc.window is not None or acc.gather is not None or acc.pad is not None or \
                acc.ids_for is not None:
            return None
        root = plan.root(acc.buffer)
        index = plan.buffers[root].index
        if plan.buffers[root].role == "input" and (plan.constant_args is None or
                                                   index in plan.constant_args):
            sources.append(index)
        elif root in made:
            sources.append(made[root])
        else:
            return None
    return sources


def plan_folds(plan: FusionPlan, launched: list[int], base: int) -> dict[int, Fold]:
    """The folded kernels among those launched on their own (``launched``: kernel
    positions), by position; sites are ``base`` + position.

    A kernel reading an earlier folded kernel's results folds too: its inputs are then
    those of that kernel (which fix the results it reads), and its key that kernel's key
    too (dims those results may depend on without showing them in their own)."""
    # Memory another buffer is later written in place of: a folded result must keep it.
    written_over = {b.reuses for b in plan.buffers.values() if b.reuses}
    results = {plan.root(r) for r in plan.result_buffers}
    folds: dict[int, Fold] = {}
    made: dict[str, Fold] = {}  # a folded kernel's output buffer -> its fold
    for n in launched:
        k = plan.kernels[n]
        sources = _sources(plan, k, made)
        outputs = [plan.buffers[b] for _, b in k.outputs]
        if sources is None or any(b.role != "temp" or b.reuses or b.name in written_over or
                                  b.name in results for b in outputs):
            continue
        args: list[int] = []
        key = list(k.dims) + [d for a in k.inputs for d in plan.buffers[a.buffer].dims]
        for src in sources:
            for i in ([src] if isinstance(src, int) else src.args):
                if i not in args:
                    args.append(i)
            if not isinstance(src, int):
                key += src.key
        fold = Fold(k.name, base + n, tuple(args), tuple(key), tuple(b.name for b in outputs))
        folds[n] = fold
        made.update({b: fold for b in fold.outputs})
    return folds


def begin_lines(plan: FusionPlan, fold: Fold, nbytes: dict[str, str]) -> list[str]:
    """Host-runner lines declaring the fold's outputs and asking the RAL for them."""
    st = {b: _storage(plan, b) for b in fold.outputs}
    lines = [f"  // {fold.kernel} is computed from cluster inputs only: with each a constant input",
             "  // of this call, the RAL keeps its results from the first call computing them from",
             "  // the same buffers (fold_begin; a host without it leaves the field null)"]
    lines += [f"  {st[b]}* {b} = nullptr;" for b in fold.outputs]
    lines.append(f"  int32_t {fold.var};")
    lines.append("  {")
    lines.append(f"    static const int32_t fold_inputs[] = {{{', '.join(map(str, fold.args))}}};")
    key = ", ".join(sym(s, plan) for s in fold.key) or "0"
    lines.append(f"    const int64_t fold_key[] = {{{key}}};")
    lines.append(f"    const int64_t fold_bytes[] = {{{', '.join(nbytes[b] for b in fold.outputs)}}};")
    lines.append(f"    void* fold_out[{len(fold.outputs)}] = {{}};")
    lines.append(f"    {fold.var} = ral->fold_begin == nullptr ? -1 : ral->fold_begin(ral, {fold.site}, "
                 f"fold_inputs, {len(fold.args)}, fold_key, {len(fold.key)}, fold_bytes, "
                 f"{len(fold.outputs)}, fold_out);")
    for i, b in enumerate(fold.outputs):
        lines.append(f"    if ({fold.var} >= 0) {b} = static_cast<{st[b]}*>(fold_out[{i}]);")
    lines.append("  }")
    return lines


def _storage(plan: FusionPlan, bname: str) -> str:
    return STORAGE[plan.buffers[bname].elem]
