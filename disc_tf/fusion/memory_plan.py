"""Memory planning of a fusion plan: the launch order of its kernels and the
temporaries that take over the memory of another (in-place reuse).

Works on the planner's kernels and buffers; its result is each buffer's
``reuses`` (printed by ``FusionPlan.describe``) and the kernels' order.
"""

from __future__ import annotations

from disc_tf.fusion.plan import Access, Buffer, Kernel, root_of
from disc_tf.fusion.symbols import SymbolTable

#: Kernel kinds that read each input element at the index they write it
#: (after any earlier reads of the row), so an output may take over the memory
#: of an identity-read input that dies there.
IN_PLACE_KINDS = ("loop", "stitch")


def launch_order(kernels: list[Kernel], deps: list[set[int]], prefix: str = "") -> list[Kernel]:
    """Kernels in an order where each runs after the kernels it reads (``deps[k]``),
    renamed ``<prefix>kernel<i>`` in that order."""
    done: set[int] = set()
    order: list[Kernel] = []
    while len(order) < len(kernels):
        for k in range(len(kernels)):
            if k not in done and deps[k] <= done:
                done.add(k)
                order.append(kernels[k])
                break
    for i, kernel in enumerate(order):
        kernel.name = f"{prefix}kernel{i}"
    return order


def size_key(b: Buffer, symbols: SymbolTable) -> tuple:
    """Equal keys: proven equal byte sizes (same element type, same constant factor,
    same dim classes)."""
    const = symbols.constant_value
    factor = 1
    for d in b.dims:
        factor *= const(d) if const(d) is not None else 1
    return (b.elem, factor, tuple(sorted(symbols.find(d) for d in b.dims if const(d) is None)))


def last_uses(order: list[Kernel], buffers: dict[str, Buffer]) -> dict[str, int]:
    """Root buffer -> position in ``order`` of the last kernel reading it."""
    last_use: dict[str, int] = {}
    for n, k in enumerate(order):
        for a in k.inputs:
            last_use[root_of(buffers, a.buffer)] = n
    return last_use


def plan_reuse(order: list[Kernel], buffers: dict[str, Buffer], symbols: SymbolTable,
               keep: frozenset[str] = frozenset()) -> None:
    """In-place reuse: a kernel's temp output takes over the memory of a temp
    input of proven equal byte size (``size_key``) that the kernel reads at its own
    index and that no later kernel reads. No buffer lives longer than its last
    reader, so the peak is at most what freeing every temp after its last reader
    gives (TF's own policy), and one allocation serves both. The temps in ``keep``
    give their memory to no one (a GEMM's C meant for per-block scratch)."""
    def root(name: str) -> str:
        return root_of(buffers, name)

    last_use = last_uses(order, buffers)

    owner: dict[str, str] = {}  # a temp -> the allocation it lives in
    for n, k in enumerate(order):
        if k.kind not in IN_PLACE_KINDS:
            continue
        reads: dict[str, list[Access]] = {}
        for a in k.inputs:
            reads.setdefault(root(a.buffer), []).append(a)
        donors = [name for name, accs in reads.items()
                  if buffers[name].role == "temp" and last_use[name] == n and name not in keep
                  and len(accs) == 1 and accs[0].is_identity and accs[0].window is None]
        for _, out in k.outputs:
            b = buffers[out]
            if b.role != "temp" or b.reuses:
                continue
            for d in donors:
                if size_key(buffers[d], symbols) == size_key(b, symbols):
                    b.reuses = owner.get(d, d)
                    owner[out] = b.reuses
                    donors.remove(d)
                    break
