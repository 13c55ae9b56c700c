"""Kernels whose results the RAL keeps across calls (RAL ABI 10, ``fold_begin``).

A loop kernel that reads cluster inputs only (batch norm's ``rsqrt(variance + eps) *
gamma`` and ``beta - mean * scale`` from four variables) computes the same results on
every call while those inputs hold the same values. The host runner asks the RAL
before launching it: when each input is a constant input of the call (a Const's or a
variable's value), the RAL hands back the results an earlier call computed from the
same input buffers (``cc/ral/folded_values.h``), and the launch is skipped.

Only the top-level runner folds (a loop step's inputs are not the cluster's), and only
kernels whose results are plain temporaries that no later buffer is written in place
of: the kept memory is read, never written, by the kernels after it.
"""

from __future__ import annotations

import dataclasses

from disc_tf.codegen.cpu_ops import ITEMSIZE, STORAGE
from disc_tf.codegen.cpu_text import product, sym
from disc_tf.fusion.plan import FusionPlan, Kernel


@dataclasses.dataclass(frozen=True)
class Fold:
    """One folded kernel: its name, its ``site`` in the artifact, the cluster inputs it
    reads (``args``), the dims its results depend on besides them (``key``, symbols),
    and its output buffers."""

    kernel: str
    site: int
    args: tuple[int, ...]
    key: tuple[int, ...]
    outputs: tuple[str, ...]

    @property
    def var(self) -> str:
        """The host runner's variable holding fold_begin's answer."""
        return f"fold{self.site}"


def _foldable(plan: FusionPlan, k: Kernel, written_over: set[str]) -> bool:
    if k.kind != "loop" or not k.inputs or k.host_scalars:
        return False
    for acc in k.inputs:
        if acc.window is not None or acc.gather is not None or acc.pad is not None or \
                acc.ids_for is not None:
            return False
        if plan.buffers[plan.root(acc.buffer)].role != "input":
            return False
    results = {plan.root(r) for r in plan.result_buffers}
    for _, bname in k.outputs:
        b = plan.buffers[bname]
        if b.role != "temp" or b.reuses or bname in written_over or bname in results:
            return False
    return True


def plan_folds(plan: FusionPlan, launched: list[int], base: int) -> dict[int, Fold]:
    """The folded kernels among those launched on their own (``launched``: kernel
    positions), by position; sites are ``base`` + position."""
    # Memory another buffer is later written in place of: a folded result must keep it.
    written_over = {b.reuses for b in plan.buffers.values() if b.reuses}
    folds: dict[int, Fold] = {}
    for n in launched:
        k = plan.kernels[n]
        if not _foldable(plan, k, written_over):
            continue
        args = tuple(plan.buffers[plan.root(a.buffer)].index for a in k.inputs)
        key = tuple(k.dims) + tuple(d for a in k.inputs for d in plan.buffers[a.buffer].dims)
        folds[n] = Fold(k.name, base + n, args, key, tuple(b for _, b in k.outputs))
    return folds


def begin_lines(plan: FusionPlan, fold: Fold, nbytes: dict[str, str]) -> list[str]:
    """Host-runner lines declaring the fold's outputs and asking the RAL for them."""
    st = {b: _storage(plan, b) for b in fold.outputs}
    lines = [f"  // {fold.kernel} reads only cluster inputs: with each a constant input of this",
             "  // call, the RAL keeps its results from the first call computing them from the",
             "  // same buffers (fold_begin; a host without it leaves the field null)"]
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


def temp_bytes(plan: FusionPlan, bname: str) -> str:
    """A temp's bytes as a host-runner expression."""
    b = plan.buffers[bname]
    return f"{product(b.dims, plan)} * {ITEMSIZE[b.elem]}"


def _storage(plan: FusionPlan, bname: str) -> str:
    return STORAGE[plan.buffers[bname].elem]
