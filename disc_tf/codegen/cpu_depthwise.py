"""C++ of an f32 depthwise convolution with one output per input channel: one task
per output pixel, each block of channels in vector registers over the window taps
inside the input (found once per pixel), the sums those of the generic kernel
(``IndexKernelEmitter._grouped_conv_generic``) term for term.

A pixel whose whole window lies inside the input (every pixel but the border ones)
takes the block with the window's size built in, so its taps unroll. An epilogue
(``fusion/epilogue.py``) runs on every ``EPILOGUE_CHUNK_FLOATS`` of output as soon as they
are written, while they are still in L1.
"""

from __future__ import annotations

#: Output channels a task accumulates at once (in registers).
CHANNEL_BLOCK = 64

#: Floats of output an epilogue follows the convolution by (32 KiB: within L1). The
#: epilogue once ran after a whole task, a quarter of MobileNetV2's 4 x 112 x 112 x 32
#: output, which had left L2 by then.
EPILOGUE_CHUNK_FLOATS = 8192

#: A block of ``V`` x ``NV`` channels of one output pixel (V = ``disc_f32x16`` or
#: ``disc_f32x8``): the sums over the window taps it is given (``KH`` x ``KW`` when
#: they are positive, unrolled, else ``kys`` x ``kxs``; input and filter steps between
#: them) in registers, in the generic kernel's order of terms. Sixteen lanes are one
#: AVX-512 register, two AVX2 ones, four SSE ones: GCC splits a vector wider than the
#: clone's ISA. The unrolled taps made MobileNetV2's stream 1.10x (1.07-1.11) faster on
#: the AVX2 path and tied on AVX-512 (one process, 7 rounds), for 2x the compile time of
#: a depthwise unit (0.67 -> 1.37 s).
DEPTHWISE_BLOCK = r"""#ifndef DISC_DEPTHWISE_BLOCK
#define DISC_DEPTHWISE_BLOCK
typedef float disc_f32x16 __attribute__((vector_size(64)));
// acc[v] += the tap's NV vectors of input (r) times its weights (w)
template <typename V, int NV>
static inline __attribute__((always_inline)) void disc_depthwise_tap(V* acc, const float* r,
                                                                     const float* w) {
  constexpr int L = sizeof(V) / sizeof(float);
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    V xv, wv;
    __builtin_memcpy(&xv, r + L * v, sizeof xv);
    __builtin_memcpy(&wv, w + L * v, sizeof wv);
    acc[v] += xv * wv;
  }
}
template <typename V, int NV, int KH, int KW>
static inline __attribute__((always_inline)) void disc_depthwise_block(
    const float* x, int64_t x_ky, int64_t x_kx, const float* f, int64_t f_ky, int64_t f_kx,
    int64_t kys, int64_t kxs, float* out) {
  constexpr int L = sizeof(V) / sizeof(float);
  V acc[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) acc[v] = V{};
  if constexpr (KH > 0 && KW > 0) {  // the whole window: its taps unrolled
#pragma GCC unroll 16
    for (int ky = 0; ky < KH; ++ky) {
#pragma GCC unroll 16
      for (int kx = 0; kx < KW; ++kx) {
        disc_depthwise_tap<V, NV>(acc, x + ky * x_ky + kx * x_kx, f + ky * f_ky + kx * f_kx);
      }
    }
  } else {
    for (int64_t ky = 0; ky < kys; ++ky) {
      for (int64_t kx = 0; kx < kxs; ++kx) {
        disc_depthwise_tap<V, NV>(acc, x + ky * x_ky + kx * x_kx, f + ky * f_ky + kx * f_kx);
      }
    }
  }
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) __builtin_memcpy(out + L * v, &acc[v], sizeof acc[v]);
}
#endif  // DISC_DEPTHWISE_BLOCK
"""


def _channel_blocks(indent: str, kh: int, kw: int) -> list[str]:
    """Lines running every vector block of a pixel's channels (from ``c0``), the
    window ``kh`` x ``kw`` built in (0 x 0: the taps ``kys`` x ``kxs``)."""
    vectors = CHANNEL_BLOCK // 16

    def call(v: str) -> str:
        return (f"disc_depthwise_block<{v}, {kh}, {kw}>(x + c0, x_ky, x_kx, f + c0, f_ky, "
                "f_kx, kys, kxs, w + c0);")

    return [
        f"{indent}for (; c0 + {CHANNEL_BLOCK} <= channels; c0 += {CHANNEL_BLOCK}) {{",
        f"{indent}  {call(f'disc_f32x16, {vectors}')}",
        f"{indent}}}",
        f"{indent}switch ((channels - c0) / 16) {{",
        *[f"{indent}  case {v}: {call(f'disc_f32x16, {v}')} break;"
          for v in range(vectors - 1, 0, -1)],
        f"{indent}  default: break;",
        f"{indent}}}",
        f"{indent}c0 += (channels - c0) / 16 * 16;",
        f"{indent}if (c0 + 8 <= channels) {{",
        f"{indent}  {call('disc_f32x8, 1')}",
        f"{indent}  c0 += 8;",
        f"{indent}}}",
    ]


def depthwise_source(fn: str, args: str, kh: int, kw: int, steps: tuple[int, int, int, int],
                     low: tuple[str, str], groups: int) -> list[str]:
    """Lines of ``{fn}_index`` (arguments ``args``): a ``kh`` x ``kw`` window at
    ``steps`` (stride and dilation along H, then W), the padding before ``low`` (C++
    expressions), ``groups`` input channels."""
    sh, sw, dh, dw = steps
    return [
        DEPTHWISE_BLOCK,
        f"DISC_CLONES DISC_ENTRY void {fn}_index(void* p, int64_t begin, int64_t end) {{",
        f"  const {args}& a = *static_cast<const {args}*>(p);",
        "  const int64_t channels = a.dims[3], out_h = a.dims[1], out_w = a.dims[2];",
        "  const int64_t in_h = a.in0_dims[1], in_w = a.in0_dims[2];",
        f"  const int64_t multiplier = a.in1_dims[3] / {groups};  // outputs per input channel",
        "  // input and filter steps between window taps",
        f"  const int64_t x_ky = {dh} * a.in0_strides[1], x_kx = {dw} * a.in0_strides[2];",
        "  const int64_t f_ky = a.in1_strides[0], f_kx = a.in1_strides[1];",
        "  // pixels [done, row) are written and not yet given to the epilogue",
        f"  const int64_t chunk = channels > 0 && channels < {EPILOGUE_CHUNK_FLOATS} ? "
        f"{EPILOGUE_CHUNK_FLOATS} / channels : 1;",
        "  int64_t done = begin;",
        "  int64_t ow = begin % out_w, oh = begin / out_w % out_h, n = begin / (out_w * out_h);",
        "  for (int64_t row = begin; row < end; ++row) {",
        "    float* __restrict w = a.out0 + row * channels;",
        f"    const int64_t ih0 = oh * {sh} - {low[0]};",
        f"    const int64_t iw0 = ow * {sw} - {low[1]};",
        "    // the taps whose input pixel lies inside the input: [ky0, ky1) x [kx0, kx1)",
        f"    int64_t ky0 = 0, ky1 = {kh}, kx0 = 0, kx1 = {kw};",
        f"    while (ky0 < ky1 && ih0 + ky0 * {dh} < 0) ++ky0;",
        f"    while (ky1 > ky0 && ih0 + (ky1 - 1) * {dh} >= in_h) --ky1;",
        f"    while (kx0 < kx1 && iw0 + kx0 * {dw} < 0) ++kx0;",
        f"    while (kx1 > kx0 && iw0 + (kx1 - 1) * {dw} >= in_w) --kx1;",
        "    const int64_t kys = ky1 - ky0, kxs = kys > 0 ? kx1 - kx0 : 0;",
        "    const float* x = a.in0 + n * a.in0_strides[0];",
        "    if (kxs > 0) {",
        f"      x += (ih0 + ky0 * {dh}) * a.in0_strides[1] + (iw0 + kx0 * {dw}) * a.in0_strides[2];",
        "    }",
        "    const float* f = a.in1 + ky0 * f_ky + kx0 * f_kx;",
        "    int64_t c0 = 0;",
        f"    if (multiplier == 1 && kys == {kh} && kxs == {kw}) {{  // the whole window",
        *_channel_blocks("      ", kh, kw),
        "    } else if (multiplier == 1) {",
        *_channel_blocks("      ", 0, 0),
        "    }",
        "    for (; c0 < channels; ++c0) {  // the last channels, or every one with a multiplier",
        "      const int64_t ci = multiplier == 1 ? c0 : c0 / multiplier;",
        "      float acc = 0;",
        "      for (int64_t ky = 0; ky < kys; ++ky) {",
        "        for (int64_t kx = 0; kx < kxs; ++kx) {",
        "          acc += x[ky * x_ky + kx * x_kx + ci] * f[ky * f_ky + kx * f_kx + c0];",
        "        }",
        "      }",
        "      w[c0] = acc;",
        "    }",
        "    if (++ow == out_w) {",
        "      ow = 0;",
        "      if (++oh == out_h) {",
        "        oh = 0;",
        "        ++n;",
        "      }",
        "    }",
        "    if (a.epilogue != nullptr && row + 1 - done >= chunk) {",
        "      a.epilogue(a.closure, 0, done, row + 1, 0, channels);",
        "      done = row + 1;",
        "    }",
        "  }",
        "  if (a.epilogue != nullptr && done < end) a.epilogue(a.closure, 0, done, end, 0, channels);",
        "}",
    ]
