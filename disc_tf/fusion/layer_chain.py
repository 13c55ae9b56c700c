"""GEMMs each reading the last one's result, run block of rows by block of rows in
one launch (RAL ABI 12, ``sgemm_layers``): an MLP's layers, a transformer's
projection, feed-forward up and down.

Run layer by layer, each layer's result went to memory whole (at 2048 rows of an MLP
64-512-256-64, a 4 MiB C) and the next layer read it back, after a barrier; run by
blocks, a thread takes a block of rows through every layer, each layer's result still
in its cache (two threads, 2048 rows: 1.10-1.20x faster, ``bench/GEMM.md``, "Layers
by blocks"). A layer's C that nothing but its epilogue and the next layer reads lives
only in the thread's scratch, a block at a time (``c_in_scratch``).

A run is legal when its kernels are consecutive in launch order (GEMM, its epilogue,
GEMM, ...; nothing else runs between them, so running them earlier reorders nothing)
and:

* every GEMM is a plain one (``[m.., k] x [k, n]`` or ``[n, k]``, no batch dims, A not
  transposed, operands as stored), its B written before the run starts;
* each GEMM after the first reads, as its A, the last layer's result: its epilogue's
  output (or its C, without an epilogue) over C's dims;
* an epilogue reads C once, at its own index, over C's dims, and is C's only reader;
  anything else it reads is written before the run, or is an earlier layer's result
  read at its own index (the same rows: a residual);
* a result in memory another buffer of the run has (the buffer planner's in-place
  reuse) is written there row for row: the other laid out as it is, read only at its
  own index, by kernels up to the result's (each block reads its rows of the other
  before it overwrites them; a GEMM's B never).
"""

from __future__ import annotations

from collections.abc import Callable

from disc_tf.fusion.epilogue import first_writes, plain_gemm
from disc_tf.fusion.plan import Access, Buffer, Kernel, memory_of, root_of


def plan_layer_chains(order: list[Kernel], buffers: dict[str, Buffer],
                      same_dim: Callable[[int, int], bool]) -> None:
    """Sets ``layers`` on the first GEMM of every legal run of two or more (the later
    GEMMs, run in its launch), and ``c_in_scratch`` on each GEMM of a run whose C's
    memory no kernel outside its layer and the next one's GEMM touches."""
    shared = {name for k in order for name in k.shares_a}
    first_write = first_writes(order, buffers)
    readers: dict[str, set[str]] = {}
    for k in order:
        for a in k.inputs:
            readers.setdefault(root_of(buffers, a.buffer), set()).add(k.name)
    i = 0
    while i < len(order):
        run = _run_from(order, i, buffers, same_dim, shared, first_write, readers)
        if len(run) < 2:
            i += 1
            continue
        head = run[0][0]
        head.layers = [lib.name for lib, _ in run[1:]]
        _plan_scratch(run, order, buffers)
        i += sum(2 if e is not None else 1 for _, e in run)  # past the run's kernels


def _run_from(order: list[Kernel], i: int, buffers: dict[str, Buffer],
              same_dim: Callable[[int, int], bool], shared: set[str],
              first_write: dict[str, int],
              readers: dict[str, set[str]]) -> list[tuple[Kernel, Kernel | None]]:
    """The longest legal run of (GEMM, its epilogue or None) from ``order[i]``."""
    run: list[tuple[Kernel, Kernel | None]] = []
    pos = i
    while pos < len(order):
        lib = order[pos]
        e = order[pos + 1] if lib.epilogue and pos + 1 < len(order) else None
        if not _layer(lib, e, buffers, same_dim, shared):
            break
        if e is not None and readers.get(lib.outputs[0][1]) != {e.name}:
            break  # C read by another kernel too (a column epilogue on registers never
            # stores it)
        if run and not _follows(run, lib, e, buffers, same_dim, i, first_write):
            break
        run.append((lib, e))
        if not _memory_legal(run, buffers, same_dim):
            run.pop()
            break
        pos += 2 if e is not None else 1
    return run


def _plain_read(a: Access) -> bool:
    """Read as stored, at the kernel's own index."""
    return (a.is_identity and a.window is None and a.pad is None and a.part_of is None
            and a.gather is None)


def _same_dims(x: list[int], y: list[int], same_dim: Callable[[int, int], bool]) -> bool:
    return len(x) == len(y) and all(same_dim(a, b) for a, b in zip(x, y))


def _layer(lib: Kernel, e: Kernel | None, buffers: dict[str, Buffer],
           same_dim: Callable[[int, int], bool], shared: set[str]) -> bool:
    """Whether ``lib`` (with its epilogue ``e``, next in order) can be a layer."""
    if not plain_gemm(lib, buffers) or len(lib.outputs) != 1:
        return False
    attrs = lib.ops[0].attrs
    if ({"c_layout", "gathered_a"} & set(attrs) or lib.chain or lib.shares_a
            or lib.name in shared or lib.a_producer or lib.masked_by is not None
            or lib.layers):
        return False
    (_, c), = lib.outputs
    if buffers[c].elem != "f32" or buffers[c].alias_of:
        return False
    if lib.epilogue is None:
        return True
    if e is None or e.name != lib.epilogue or e.kind not in ("loop", "stitch"):
        return False
    reads = [a for a in e.inputs if root_of(buffers, a.buffer) == c]
    return (len(reads) == 1 and reads[0].buffer == c and _plain_read(reads[0])
            and _same_dims(e.dims, buffers[c].dims, same_dim))


def _result(lib: Kernel, e: Kernel | None) -> set[str]:
    """The buffers a layer's next one may read as its A: its epilogue's outputs, or C."""
    return {b for _, b in e.outputs} if e is not None else {lib.outputs[0][1]}


def _follows(run: list[tuple[Kernel, Kernel | None]], lib: Kernel, e: Kernel | None,
             buffers: dict[str, Buffer], same_dim: Callable[[int, int], bool], start: int,
             first_write: dict[str, int]) -> bool:
    """Whether GEMM ``lib`` (with epilogue ``e``) can follow ``run`` (which starts at
    position ``start`` of the order)."""
    last, last_e = run[-1]
    a, b = lib.inputs[0], lib.inputs[1]
    c_last = buffers[last.outputs[0][1]]
    if a.buffer not in _result(last, last_e) or not _same_dims(
            buffers[a.buffer].dims, c_last.dims, same_dim):
        return False
    if first_write.get(root_of(buffers, b.buffer), -1) >= start:
        return False  # B is made inside the run
    if e is None:
        return True
    made = {root_of(buffers, x) for k, ke in run for x in
            [k.outputs[0][1], *(o for _, o in (ke.outputs if ke else []))]}
    c = lib.outputs[0][1]
    for x in e.inputs:
        r = root_of(buffers, x.buffer)
        if r == c:
            continue
        if r in made:  # an earlier layer's result: the same rows, read where they lie
            if not (x.buffer == r and _plain_read(x)
                    and _same_dims(buffers[r].dims, e.dims, same_dim)):
                return False
            if any(r == k.outputs[0][1] and ke is not None for k, ke in run):
                return False  # a C only its own epilogue reads (maybe on registers)
        elif first_write.get(r, -1) >= start:
            return False
    return True


def _memory_legal(run: list[tuple[Kernel, Kernel | None]], buffers: dict[str, Buffer],
                  same_dim: Callable[[int, int], bool]) -> bool:
    """Whether each result of ``run`` in memory another buffer of the run has (the buffer
    planner's in-place reuse) is written there row for row: the other laid out as it is,
    read only at its own index (a GEMM's A rows, an epilogue's plain read), and only by
    the result's kernel and kernels before it, so that each block reads its rows of the
    other before it writes them (C and its epilogue's result, a residual's memory taking
    the layer norm after it)."""
    kernels = [k for pair in run for k in pair if k is not None]
    written = {o: at for at, k in enumerate(kernels) for _, o in k.outputs}
    for w, w_at in written.items():
        memory = memory_of(buffers, w)
        for at, k in enumerate(kernels):
            for x in k.inputs:
                name = x.buffer
                if name == w or memory_of(buffers, name) != memory or written.get(name, -1) > w_at:
                    continue  # a buffer written over w is checked as that one
                if (not _same_dims(buffers[name].dims, buffers[w].dims, same_dim) or at > w_at
                        or not _plain_read(x) or (k.kind == "library" and x is not k.inputs[0])):
                    return False  # read after w's writer, or not row for row
            for _, o in k.outputs:
                if o != w and memory_of(buffers, o) == memory and at == w_at:
                    return False  # two results of one kernel in one memory
    return True


def _plan_scratch(run: list[tuple[Kernel, Kernel | None]], order: list[Kernel],
                  buffers: dict[str, Buffer]) -> None:
    """``c_in_scratch`` on each layer whose C's memory only its GEMM, its epilogue and
    the next layer's GEMM touch (the last layer's only where its epilogue writes
    elsewhere): C a dense temp of its own, the epilogue's result (if in that memory)
    read by the next GEMM alone."""
    for p, (lib, e) in enumerate(run):
        if lib.c_in_scratch:
            continue
        (_, c), = lib.outputs
        buf = buffers[c]
        if buf.role != "temp" or buf.alias_of or buf.reuses:
            continue
        users = {lib.name} | ({e.name} if e else set())
        if p + 1 < len(run):
            users.add(run[p + 1][0].name)
        elif e is None or any(memory_of(buffers, o) == c for _, o in e.outputs):
            continue  # the last layer's result would be lost
        if any(memory_of(buffers, x) == c for k in order if k.name not in users
               for x in [a.buffer for a in k.inputs] + [o for _, o in k.outputs]):
            continue
        lib.c_in_scratch = True
