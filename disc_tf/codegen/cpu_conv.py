"""Host-runner lines of convolutions as GEMMs through the RAL, without an im2col
buffer: a Conv1D over the input's overlapping windows (or, for kernel widths that
are multiples of 3, the RAL's Winograd F(2, 3) or F(4, 3)); a dilated one per tap; a Conv2D
per filter row or over windows each GEMM task gathers (RAL ``sgemm_gathered_a``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from disc_tf.codegen.cpu_gemm import epilogue_closure
from disc_tf.codegen.cpu_text import comment, sym
from disc_tf.fusion.plan import Buffer

if TYPE_CHECKING:
    from disc_tf.codegen.cpu_kernels import KernelEmitter


def conv_taps_launch(em: KernelEmitter, buffer_ptr: dict[str, str],
                     epilogue: KernelEmitter | None = None) -> list[str]:
    """A stride-1 Conv1D (NHWC with H = 1): without dilation one GEMM over the
    input's overlapping windows (``conv_windows_launch``, with the fused
    ``epilogue`` if any), else one per tap."""
    if em.k.ops[0].attrs["dilation"] == 1:
        return conv_windows_launch(em, buffer_ptr, epilogue)
    if epilogue is not None:
        raise ValueError(f"{em.k.name}: a dilated Conv1D takes no epilogue")
    return conv_per_tap_launch(em, buffer_ptr)


def _conv_heading(em: KernelEmitter, buffer_ptr: dict[str, str],
                  epilogue: KernelEmitter | None, how: str, where: str,
                  rows: str, registers: bool = False) -> tuple[str, list[str], str, str, int]:
    """A convolution launch's title comment (the conv done ``how``, the epilogue on
    each ``where``), and its epilogue's closure lines, function, closure argument and
    full-rows flag (``rows`` of C per product; null and none without one). With
    ``registers``, an epilogue of column steps may run on C's registers (every launch
    path then calls the RAL's column_epilogue, as an epilogue where not on registers)."""
    k, op = em.k, em.k.ops[0]
    title = f"  {{  // {k.name}: {comment(op.tf_node)} as {how} (no im2col buffer)"
    if epilogue is None:
        return title, [], "nullptr", "nullptr", 0
    title += f", {epilogue.k.name} ({comment(', '.join(epilogue.k.tf_ops))}) on each {where}"
    epi, fn, closure = epilogue_closure(epilogue, buffer_ptr, rows, "co",
                                        k if registers else None)
    return title, epi, fn, closure, int(k.epilogue_full_rows)


def _conv_dims(em: KernelEmitter) -> tuple[Buffer, Buffer, str, dict, list[str]]:
    """A conv_taps kernel's input, filter, output name and attrs, and the host lines
    naming its sizes (batch, width, ci, co, ow, pad)."""
    plan, k = em.plan, em.k
    (op,) = k.ops
    x, w = (em.buf(a) for a in k.inputs)
    (_, out_name), = k.outputs
    out = plan.buffers[out_name]
    a = op.attrs
    return x, w, out_name, a, [
        f"    const int64_t batch = {sym(x.dims[0], plan)}, width = {sym(x.dims[2], plan)};",
        f"    const int64_t ci = {sym(x.dims[3], plan)}, co = {sym(w.dims[3], plan)};",
        f"    const int64_t ow = {sym(out.dims[2], plan)}, pad = {sym(a['pad_left'], plan)};",
    ]


def conv_windows_launch(em: KernelEmitter, buffer_ptr: dict[str, str],
                        epilogue: KernelEmitter | None = None) -> list[str]:
    """A stride-1, undilated Conv1D as one GEMM with k = kw * ci: the window of
    output column c is the kw * ci floats of the (padded) input from column c, so
    the windows of consecutive outputs overlap, ci floats apart (lda = ci), and A
    is the input itself, read in place. With padding, only the output columns
    whose windows reach into it (at most kw - 1 at each end) read a copy of their
    windows with the zero columns, one window per row, both ends in one more GEMM
    (each GEMM reads all of B: two edge GEMMs of a kernel-9 256 -> 1024 filter took
    as long as a tenth of the main one); the columns between read x in place, so no
    padded copy of the input is made (it was the peak's extra tensor). Each GEMM
    covers whole rows of C and reads B once, so a consumer runs on each finished
    block of C (``epilogue``, told its rows' place in C; the edges' rows once copied
    into C). A kernel width that is a multiple of 3 asks the RAL for Winograd F(2, 3) or
    F(4, 3) first (``conv1d_winograd``, RAL ABI 6), which may decline."""
    x, w, out_name, a, dims = _conv_dims(em)
    xp, wp, cp = buffer_ptr[x.name], buffer_ptr[w.name], buffer_ptr[out_name]
    title, epi, fn, closure, full_rows = _conv_heading(
        em, buffer_ptr, epilogue, "GEMMs over overlapping windows of the input", "block",
        "ow")
    winograd = []
    if a["kw"] % 3 == 0:  # the RAL's Winograd first; it may decline
        winograd = [
            "    // Winograd F(2, 3) or F(4, 3) over groups of three taps, 2/3 or 1/2 of the",
            "    // multiply-adds (the RAL picks, and keeps the filter's transforms); where it",
            "    // declines, the GEMMs below.",
            "    const bool winograd = batch > 0 && ow > 0 && co > 0 &&",
            f"        ral->conv1d_winograd(ral, batch, width, ci, co, kw, pad, ow, {xp}, {wp}, "
            f"{cp},",
            f"                             {fn}, {closure}, {full_rows}) != 0;",
        ]
    # a GEMM over output columns [r0, r1) of each image sees its rows shifted by r0
    shifted = "&ConvPart::run, &shift" if epilogue is not None else "nullptr, nullptr"
    return [
        title,
        *dims,
        f"    const int64_t kw = {a['kw']}, kdim = kw * ci;",
        *epi,
        "    // x as one row of the Conv2D windows (oh = kh = 1)",
        "    ConvWindows win{};",
        f"    win.x = {xp};",
        "    win.height = 1; win.width = width; win.ci = ci; win.oh = 1; win.ow = ow;",
        "    win.pad_left = pad; win.kw = kw;",
        "    const int64_t oh = 1, kh = 1;",
        "    // Output columns [lo, hi) have their whole window inside x; those before and",
        "    // after read a copy of their windows with the zero padding around x.",
        "    const int64_t lo = win.col_lo(), hi = win.col_hi(), right = ow - hi;",
        "    // C[n, r0:r1, :] = windows of output columns r0.. (rows lda = ci apart) * w.",
        "    auto columns = [&](int64_t r0, int64_t r1, const float* windows, int64_t stride) {",
        f"      ConvPart shift{{{fn}, {closure}, 1, 1, 0, r0}};",
        f"      ral->sgemm_epilogue(ral, batch, 1, r1 - r0, co, kdim, windows, ci, stride, 0, 0, "
        f"{wp},",
        f"                          co, 0, 0, 0, {cp} + r0 * co, co, ow * co, 0, {shifted}, "
        f"{full_rows}, 0);",
        "    };",
        *winograd,
        f"    if ({'!winograd && ' if winograd else ''}batch > 0 && ow > 0 && co > 0) {{",
        f"      if (hi > lo) columns(lo, hi, {xp} + (lo - pad) * ci, width * ci);",
        *_edge_columns_lines(wp, cp, fn, closure),
        "    }",
        "  }",
    ]


def conv_per_tap_launch(em: KernelEmitter, buffer_ptr: dict[str, str]) -> list[str]:
    """A stride-1 dilated Conv1D (NHWC with H = 1) as one GEMM per filter tap j: output
    columns whose input column ``ow + j * dilation - pad_left`` exists get
    x[n, 0, that column, :] @ w[0, j], added to the result (the first tap writes,
    and zeroes the columns it does not reach)."""
    k, op = em.k, em.k.ops[0]
    x, w, out_name, a, dims = _conv_dims(em)
    c_ptr = buffer_ptr[out_name]
    return [
        f"  {{  // {k.name}: {comment(op.tf_node)} as {a['kw']} GEMMs, one per filter tap"
        " (no im2col buffer)",
        *dims,
        f"    for (int64_t j = 0; j < {a['kw']}; ++j) {{",
        f"      const int64_t shift = j * {a['dilation']} - pad;  // input column of output 0",
        "      const int64_t lo = shift < 0 ? -shift : 0;",
        "      const int64_t hi = width - shift < ow ? width - shift : ow;",
        "      if (j == 0) {  // the columns the first tap does not write start at zero",
        "        for (int64_t n = 0; n < batch; ++n) {",
        "          for (int64_t c = 0; c < ow; ++c) {",
        "            if (c >= lo && c < hi) continue;",
        f"            for (int64_t o = 0; o < co; ++o) {c_ptr}[(n * ow + c) * co + o] = 0.0f;",
        "          }",
        "        }",
        "      }",
        "      if (hi > lo && batch > 0 && co > 0) {",
        f"        ral->sgemm_epilogue(ral, batch, 1, hi - lo, co, ci,"
        f" {buffer_ptr[x.name]} + (lo + shift) * ci, ci, width * ci, 0, 0,",
        f"                            {buffer_ptr[w.name]} + j * ci * co, co, 0, 0, 0,",
        f"                            {c_ptr} + lo * co, co, ow * co, 0, nullptr, nullptr, 0,"
        " j > 0);",
        "      }",
        "    }",
        "  }",
    ]


#: conv_rows runs one GEMM over all of the filter whose tasks gather their rows'
#: windows (bench/conv_paths.py, "windows" against "im2col", AVX-512) where the GEMMs per
#: filter row lose: below this many output columns a product of them has too few rows
#: to reuse a filter row that is not in cache, and ...
PATCH_MAX_COLUMNS = 24
#: ... a filter row of at least this many floats (256 KiB) is not (0.87x at 14
#: columns and 768 x 256 floats a row; 1.15x and more from 28 columns or 48 KiB rows),
PATCH_MIN_ROW_FLOATS = 65536
#: or each GEMM would be shallower than this (kw * ci): a 3x3 stem over RGB, depth 9,
#: lost as three GEMMs (0.83x) and ties gathered (1.06x); the 7x7 stem's 21 wins (1.5x).
PATCH_MAX_DEPTH = 16


def conv_rows_launch(em: KernelEmitter, buffer_ptr: dict[str, str],
                     epilogue: KernelEmitter | None = None) -> list[str]:
    """A convolution (groups 1, NHWC, filter [kh, kw, ci, co]) without an im2col
    buffer: one GEMM per filter row i. Output row r of image b, as a product of the
    GEMM, is C[b, r] (ow x co) += A (ow x kw * ci) * w[i] (kw * ci x co), where row c
    of A is the kw * ci floats of input row r * sh + i * dh from column c * sw: the
    windows of consecutive outputs overlap, sw * ci floats apart (lda), so A is the
    input itself, read in place. Dilated along W, a window is not contiguous: one GEMM
    per tap (i, j) then, with depth ci. Padding is read in place too (the edge columns
    copy their windows; ``_in_place_rows_lines``), or, dilated along W, from a copy of x
    with the zero rows and columns around it. The first GEMM writes C, the others add
    to it, and the last one runs the ``epilogue`` on each block it finishes. Narrow
    outputs with big filter rows, and shallow filter rows, run one GEMM over all of the
    filter instead (see ``PATCH_MAX_COLUMNS``), each of its tasks gathering its rows'
    windows into scratch (RAL ``sgemm_gathered_a``): no im2col buffer either."""
    plan, k = em.plan, em.k
    (op,) = k.ops
    a = op.attrs
    x, w = (em.buf(acc) for acc in k.inputs)
    (_, out_name), = k.outputs
    out = plan.buffers[out_name]
    xp, wp, cp = buffer_ptr[x.name], buffer_ptr[w.name], buffer_ptr[out_name]
    (sh, sw), (dh, dw) = a["strides"], a["dilations"]
    kh, kw = a["kh"], a["kw"]
    per_tap = dw != 1 and kw > 1
    count = kh * kw if per_tap else kh
    title, epi, fn, closure, full_rows = _conv_heading(
        em, buffer_ptr, epilogue,
        f"{count} GEMM{'s' if count > 1 else ''} over overlapping windows of the input rows",
        "block of the last", "product_rows", registers=True)
    return [
        title,
        f"    const int64_t batch = {sym(x.dims[0], plan)}, height = {sym(x.dims[1], plan)}, "
        f"width = {sym(x.dims[2], plan)};",
        f"    const int64_t ci = {sym(x.dims[3], plan)}, co = {sym(w.dims[3], plan)};",
        f"    const int64_t oh = {sym(out.dims[1], plan)}, ow = {sym(out.dims[2], plan)};",
        f"    const int64_t kh = {kh}, kw = {kw};",
        "    ConvWindows win{};",
        f"    win.x = {xp};",
        "    win.height = height; win.width = width; win.ci = ci; win.oh = oh; win.ow = ow;",
        f"    win.pad_top = {sym(a['pad_top'], plan)}; win.pad_left = {sym(a['pad_left'], plan)};",
        f"    win.sh = {sh}; win.sw = {sw}; win.dh = {dh}; win.dw = {dw}; win.kh = kh; win.kw = kw;",
        f"    win.taps = {'kw' if per_tap else '1'};  // GEMMs per filter row",
        "    win.groups = kh * win.taps;  // GEMMs, each adding to C",
        f"    win.depth = {'ci' if per_tap else 'kw * ci'};  // of each GEMM",
        "    // input rows and columns the windows span",
        "    win.rows = (oh - 1) * win.sh + (kh - 1) * win.dh + 1;",
        "    win.cols = (ow - 1) * win.sw + (kw - 1) * win.dw + 1;",
        f"    const bool patches = (ow < {PATCH_MAX_COLUMNS} && kw * ci * co >= "
        f"{PATCH_MIN_ROW_FLOATS}) || kw * ci < {PATCH_MAX_DEPTH};",
        "    const int64_t product_rows = patches ? batch * oh * ow : ow;  // rows of C per product",
        *epi,
        "    if (batch > 0 && oh > 0 && ow > 0 && co > 0 && patches) {",
        "      // one GEMM over the windows, all of the filter at once; each task gathers",
        "      // its rows' windows into scratch of its own (no im2col buffer)",
        "      ral->sgemm_gathered_a(ral, batch * oh * ow, co, kh * kw * ci, "
        "&ConvWindows::window_rows, &win,",
        f"                            {wp}, co, {cp}, co, {fn}, {closure}, {full_rows});",
        "    } else if (batch > 0 && oh > 0 && ow > 0 && co > 0) {",
        *(_padded_rows_lines(wp, cp, fn, closure, full_rows) if per_tap
          else _in_place_rows_lines(wp, cp, fn, closure, full_rows)),
        "    }",
        "  }",
    ]


def _padded_rows_lines(wp: str, cp: str, fn: str, closure: str, full_rows: int) -> list[str]:
    """conv_rows per tap (dilated along W): every GEMM reads x, or a copy of x with its
    zero border where the windows reach into the padding."""
    return [
        "      win.image = win.x;",
        "      win.row_pitch = win.width * win.ci;",
        "      win.image_pitch = win.height * win.width * win.ci;",
        "      if (win.pad_top != 0 || win.pad_left != 0 || win.rows > height || win.cols > width) {",
        "        // windows reach into the padding: copy x with its zero border",
        "        win.padded = static_cast<float*>(ral->alloc_temp(ral, batch * win.rows * win.cols"
        " * ci * sizeof(float)));",
        "        if (!win.padded && ci != 0) return 1;",
        "        ral->parallel_for(ral, batch * win.rows, 1.0 * win.cols * ci + 1.0, "
        "&ConvWindows::pad_rows, &win);",
        "        win.image = win.padded;",
        "        win.row_pitch = win.cols * ci;",
        "        win.image_pitch = win.rows * win.cols * ci;",
        "      }",
        "      for (int64_t g = 0; g < win.groups; ++g) {",
        "        const int64_t i = g / win.taps, j = g % win.taps;  // its first filter tap",
        "        const bool last = g == win.groups - 1;",
        "        ral->sgemm_epilogue(ral, batch, oh, ow, co, win.depth,",
        "                            win.image + i * win.dh * win.row_pitch + j * win.dw * ci, "
        "win.sw * ci,",
        "                            win.image_pitch, win.sh * win.row_pitch, 0,",
        f"                            {wp} + (i * kw + j) * ci * co, co, 0, 0, 0,",
        f"                            {cp}, co, oh * ow * co, ow * co,",
        f"                            last ? {fn} : nullptr, last ? {closure} : nullptr, "
        f"{full_rows}, g > 0);",
        "      }",
        "      if (win.padded) ral->free_temp(ral, win.padded);",
    ]


def _in_place_rows_lines(wp: str, cp: str, fn: str, closure: str,
                         full_rows: int) -> list[str]:
    """conv_rows undilated along W, reading x in place: filter row i's GEMM covers the
    output rows whose input row lies in x and the columns whose window does; the edge
    columns read a copy of their windows (zeros in the padding), all of them in one GEMM
    over the whole filter whose rows are then placed into C; no padded copy of x is
    made. The last filter row's GEMM runs the epilogue on its blocks, the edges' placing
    on theirs, and the host on the middle of the rows the last filter row does not
    reach."""
    has_epilogue = fn != "nullptr"
    part = "&ConvPart::run" if has_epilogue else "nullptr"
    return [
        "      // output columns [lo, hi) have every filter row's window inside x",
        "      const int64_t lo = win.col_lo(), hi = win.col_hi(), right = ow - hi;",
        "      if (hi > lo) {",
        "        // the middle of the rows filter row 0 does not reach starts at zero",
        "        const int64_t r0 = win.row_lo(0), r1 = win.row_hi(0);",
        "        for (int64_t n = 0; n < batch; ++n) {",
        "          for (int64_t r = 0; r < oh; ++r) {",
        "            if (r >= r0 && r < r1) continue;",
        f"            __builtin_memset({cp} + ((n * oh + r) * ow + lo) * co, 0, "
        "(hi - lo) * co * sizeof(float));",
        "          }",
        "        }",
        "        for (int64_t i = 0; i < kh; ++i) {",
        "          const int64_t first = win.row_lo(i), rows = win.row_hi(i) - first;",
        "          if (rows <= 0) continue;",
        "          const bool last = i == kh - 1;",
        f"          ConvPart part{{{fn}, {closure}, oh, rows, first, lo}};",
        "          ral->sgemm_epilogue(ral, batch, rows, hi - lo, co, win.depth,",
        "                              win.x + ((first * win.sh + i * win.dh - win.pad_top) * "
        "width + lo * win.sw - win.pad_left) * ci,",
        "                              win.sw * ci, height * width * ci, win.sh * width * ci, 0,",
        f"                              {wp} + i * kw * ci * co, co, 0, 0, 0,",
        f"                              {cp} + (first * ow + lo) * co, co, oh * ow * co, "
        "ow * co,",
        f"                              last ? {part} : nullptr, last ? &part : nullptr, "
        f"{full_rows}, i > 0);",
        "        }",
        *([
            "        // the middle of the rows the last filter row does not reach is final now",
            "        const int64_t e0 = win.row_lo(kh - 1), e1 = win.row_hi(kh - 1);",
            "        for (int64_t n = 0; n < batch; ++n) {",
            "          for (int64_t r = 0; r < oh; ++r) {",
            f"            if (r < e0 || r >= e1) {fn}({closure}, n * oh + r, lo, hi, 0, co);",
            "          }",
            "        }",
        ] if has_epilogue else []),
        "      }",
        *_edge_columns_lines(wp, cp, fn, closure),
    ]


def _edge_columns_lines(wp: str, cp: str, fn: str, closure: str) -> list[str]:
    """The output columns [0, lo) and [hi, ow) of every output row (``win``, ``lo``,
    ``hi``, ``right`` = ow - hi, ``batch``, ``oh``, ``kh``, ``kw``, ``ci``, ``co`` in
    scope): their windows copied with the zeros around x, one GEMM over all of the
    filter for both sides and every row, its rows placed into C with the epilogue
    (``fn``) run on them. Shared by the Conv1D and Conv2D windowed GEMMs."""
    return [
        "      const int64_t ne = lo + right;",
        "      if (ne > 0) {",
        "        // The edge columns: their windows copied with the zeros around x, and one",
        "        // GEMM over all of the filter for both sides and every row (a GEMM per row",
        "        // would read all of B for a row or two), into rows placed into C.",
        "        const int64_t edge_k = kh * kw * ci;  // floats of a window",
        "        win.edge_lo = lo; win.edge_hi = hi;",
        f"        win.c = {cp}; win.co = co; win.epilogue = {fn}; win.closure = {closure};",
        "        win.edges = static_cast<float*>(ral->alloc_temp(ral, batch * oh * ne * edge_k * "
        "sizeof(float)));",
        "        win.edge_rows = static_cast<float*>(ral->alloc_temp(ral, batch * oh * ne * co * "
        "sizeof(float)));",
        "        if ((!win.edges && edge_k != 0) || !win.edge_rows) return 1;",
        "        ral->parallel_for(ral, batch * oh, 1.0 * ne * edge_k + 1.0, "
        "&ConvWindows::gather_edges, &win);",
        "        ral->sgemm_epilogue(ral, 1, 1, batch * oh * ne, co, edge_k, win.edges, edge_k, 0, 0, 0,",
        f"                            {wp}, co, 0, 0, 0, win.edge_rows, co, 0, 0, nullptr, "
        "nullptr, 0, 0);",
        "        ral->parallel_for(ral, batch * oh, 2.0 * ne * co + 1.0, &ConvWindows::place_edges, "
        "&win);",
        "        ral->free_temp(ral, win.edge_rows);",
        "        if (win.edges) ral->free_temp(ral, win.edges);",
        "      }",
    ]


#: Host-runner support of ``conv_rows_launch`` and ``conv_windows_launch`` (a Conv1D is
#: one row of it): the input as its GEMMs read it, the ranges of rows and columns whose
#: windows lie inside it, and the parallel copies made of it (a padded input, the edge
#: columns' windows) or of its windows per GEMM task.
CONV_WINDOWS_SUPPORT = r"""
#ifndef DISC_CONV_WINDOWS
#define DISC_CONV_WINDOWS
struct ConvWindows {
  const float* x = nullptr;        // the input, [batch, height, width, ci]
  float* padded = nullptr;         // x between zero rows and columns, or null
  float* edges = nullptr;          // windows of the edge columns [0, edge_lo) and
                                   // [edge_hi, ow) of every output row
  float* edge_rows = nullptr;      // their rows of C, as one GEMM writes them
  float* c = nullptr;              // the conv's result, [batch, oh, ow, co]
  int64_t co = 0;
  disc_gemm_epilogue_fn epilogue = nullptr;  // run on the edges' rows once in C
  void* closure = nullptr;
  const float* image = nullptr;    // what the GEMMs read: x or padded
  int64_t row_pitch = 0, image_pitch = 0;
  int64_t height = 0, width = 0, ci = 0, oh = 0, ow = 0, pad_top = 0, pad_left = 0;
  int64_t sh = 1, sw = 1, dh = 1, dw = 1, kh = 1, kw = 1, rows = 0, cols = 0;
  int64_t taps = 1, groups = 1, depth = 0;  // GEMMs per filter row, in all; depth of each
  int64_t edge_lo = 0, edge_hi = 0;

  // The outputs [first(before, step, count), last(...)) of `count`, output o reading
  // input o * step - before (+ span - 1 for its window's last tap) of `size`: those
  // whose windows lie inside the input.
  static int64_t first(int64_t before, int64_t step, int64_t count) {
    const int64_t o = before <= 0 ? 0 : (before + step - 1) / step;
    return o < count ? o : count;
  }
  static int64_t last(int64_t before, int64_t step, int64_t count, int64_t size,
                      int64_t span) {
    const int64_t lo = first(before, step, count), room = size - span + before;
    const int64_t hi = room < 0 ? 0 : room / step + 1;
    return hi < lo ? lo : hi > count ? count : hi;
  }
  // Output columns [col_lo(), col_hi()) have their whole window inside x's columns.
  int64_t col_lo() const { return first(pad_left, sw, ow); }
  int64_t col_hi() const { return last(pad_left, sw, ow, width, (kw - 1) * dw + 1); }
  // Output rows [row_lo(i), row_hi(i)) read an input row inside x with filter row i.
  int64_t row_lo(int64_t i) const { return first(pad_top - i * dh, sh, oh); }
  int64_t row_hi(int64_t i) const { return last(pad_top - i * dh, sh, oh, height, 1); }

  // The ci floats of pixel (row, col) of image n of x into dst, zeros outside x.
  void copy_pixel(float* dst, int64_t n, int64_t row, int64_t col) const {
    if (row < 0 || row >= height || col < 0 || col >= width) {
      __builtin_memset(dst, 0, ci * sizeof(float));
    } else {
      __builtin_memcpy(dst, x + ((n * height + row) * width + col) * ci, ci * sizeof(float));
    }
  }

  // The window of output pixel (r, c) of image n into dst: kh * kw * ci floats in the
  // filter's order, zeros where they fall in the padding.
  void copy_window(float* dst, int64_t n, int64_t r, int64_t c) const {
    for (int64_t i = 0; i < kh; ++i) {
      const int64_t row = r * sh + i * dh - pad_top;
      const int64_t col0 = c * sw - pad_left;
      if (dw == 1 && row >= 0 && row < height && col0 >= 0 && col0 + kw <= width) {
        // the filter row's window lies in the input: kw * ci consecutive floats
        __builtin_memcpy(dst, x + ((n * height + row) * width + col0) * ci,
                         kw * ci * sizeof(float));
        dst += kw * ci;
        continue;
      }
      for (int64_t j = 0; j < kw; ++j, dst += ci) copy_pixel(dst, n, row, col0 + j * dw);
    }
  }

  // Rows [begin, end) of the padded input, row u = image * rows + r.
  static void pad_rows(void* p, int64_t begin, int64_t end) {
    const ConvWindows& w = *static_cast<const ConvWindows*>(p);
    for (int64_t u = begin; u < end; ++u) {
      const int64_t n = u / w.rows, row = u % w.rows - w.pad_top;
      float* dst = w.padded + u * w.cols * w.ci;
      for (int64_t q = 0; q < w.cols; ++q, dst += w.ci) w.copy_pixel(dst, n, row, q - w.pad_left);
    }
  }

  // The windows of output pixels [i0, i1) (pixel i = (image * oh + r) * ow + c) into
  // dst, one after another: sgemm_gathered_a's rows of A.
  static void window_rows(void* p, int64_t i0, int64_t i1, float* dst) {
    const ConvWindows& w = *static_cast<const ConvWindows*>(p);
    const int64_t window = w.kh * w.kw * w.ci;
    int64_t c = i0 % w.ow, r = i0 / w.ow % w.oh, n = i0 / (w.ow * w.oh);
    for (int64_t i = i0; i < i1; ++i, dst += window) {
      w.copy_window(dst, n, r, c);
      if (++c == w.ow) {  // the next output row, or image
        c = 0;
        if (++r == w.oh) {
          r = 0;
          ++n;
        }
      }
    }
  }

  // The edge columns' windows of output rows [begin, end), row u = image * oh + r:
  // edge e of a row is output column e before edge_lo, edge_hi + e - edge_lo after.
  int64_t edge_column(int64_t e) const { return e < edge_lo ? e : edge_hi + e - edge_lo; }
  static void gather_edges(void* p, int64_t begin, int64_t end) {
    const ConvWindows& w = *static_cast<const ConvWindows*>(p);
    const int64_t window = w.kh * w.kw * w.ci, ne = w.edge_lo + w.ow - w.edge_hi;
    for (int64_t u = begin; u < end; ++u) {
      for (int64_t e = 0; e < ne; ++e)
        w.copy_window(w.edges + (u * ne + e) * window, u / w.oh, u % w.oh, w.edge_column(e));
    }
  }

  // The edges' rows of output rows [begin, end) into C, then the epilogue on them.
  static void place_edges(void* p, int64_t begin, int64_t end) {
    const ConvWindows& w = *static_cast<const ConvWindows*>(p);
    const int64_t ne = w.edge_lo + w.ow - w.edge_hi;
    for (int64_t u = begin; u < end; ++u) {
      for (int64_t e = 0; e < ne; ++e) {
        __builtin_memcpy(w.c + (u * w.ow + w.edge_column(e)) * w.co,
                         w.edge_rows + (u * ne + e) * w.co, w.co * sizeof(float));
      }
      if (w.epilogue == nullptr) continue;
      if (w.edge_lo > 0) w.epilogue(w.closure, u, 0, w.edge_lo, 0, w.co);
      if (w.edge_hi < w.ow) w.epilogue(w.closure, u, w.edge_hi, w.ow, 0, w.co);
    }
  }
};

// An epilogue seeing the products and rows of a GEMM over part of a conv's C: the
// GEMM's product q is image q / rows, output row first_row + q % rows, and its row i
// is output column first_col + i.
struct ConvPart {
  disc_gemm_epilogue_fn fn;
  void* closure;
  int64_t oh, rows, first_row, first_col;
  static void run(void* p, int64_t q, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    const ConvPart& h = *static_cast<const ConvPart*>(p);
    h.fn(h.closure, q / h.rows * h.oh + h.first_row + q % h.rows, h.first_col + i0,
         h.first_col + i1, j0, j1);
  }
};
#endif  // DISC_CONV_WINDOWS
"""
