"""libmvec's 16-lane AVX-512 expf gives the bits of its 8-lane AVX2 expf: stitch rows call
the first from the x86-64-v4 clone and the second from the v3 one (``cpu_stitch.py``), and
both must give the same answers. A C program calls the two vector functions on float bit
patterns: every 257th one in the default suite, all 2^32 with ``-m slow`` (about 80 s)."""

from __future__ import annotations

import subprocess

import pytest

from disc_tf.runtime import compiler, isa

SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
__m256 _ZGVdN8v_expf(__m256);
__m512 _ZGVeN16v_expf(__m512);
int main(int argc, char** argv) {
  const uint64_t step = strtoull(argv[1], 0, 10);
  uint64_t compared = 0, differ = 0;
  float in[16], wide[16], narrow[16];
  for (uint64_t u = 0; u < (1ull << 32); u += 16 * step) {
    for (int i = 0; i < 16; ++i) {
      const uint32_t bits = (uint32_t)(u + (uint64_t)i * step);
      memcpy(&in[i], &bits, 4);
    }
    _mm512_storeu_ps(wide, _ZGVeN16v_expf(_mm512_loadu_ps(in)));
    _mm256_storeu_ps(narrow, _ZGVdN8v_expf(_mm256_loadu_ps(in)));
    _mm256_storeu_ps(narrow + 8, _ZGVdN8v_expf(_mm256_loadu_ps(in + 8)));
    for (int i = 0; i < 16; ++i) {
      if (in[i] != in[i]) continue;  // NaN in, NaN out: payloads may differ
      ++compared;
      if (memcmp(&wide[i], &narrow[i], 4) != 0) {
        if (differ++ < 5) printf("differ at 0x%08x\n", *(const uint32_t*)&in[i]);
      }
    }
  }
  printf("compared %llu differ %llu\n", (unsigned long long)compared, (unsigned long long)differ);
  return differ != 0;
}
"""


def _check(tmp_path, step: int) -> str:
    if isa.host_level() != "x86-64-v4":
        pytest.skip("needs an AVX-512 CPU to call the 16-lane expf")
    src = tmp_path / "expf_bits.c"
    src.write_text(SOURCE)
    exe = tmp_path / "expf_bits"
    subprocess.run([compiler.cxx(), "-x", "c", "-O2", "-mavx512f", "-mavx2", "-mfma", str(src),
                    "-o", str(exe), "-lmvec", "-lm"], check=True, capture_output=True, timeout=120)
    proc = subprocess.run([str(exe), str(step)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:]
    return proc.stdout


def test_expf_sixteen_lanes_match_eight_on_a_sample(tmp_path):
    out = _check(tmp_path, 257)
    compared = int(out.split("compared ")[1].split()[0])
    assert compared > 16_000_000 and " differ 0" in out, out


@pytest.mark.slow
def test_expf_sixteen_lanes_match_eight_on_every_float(tmp_path):
    out = _check(tmp_path, 1)
    assert " differ 0" in out and "compared 4278190082" in out, out
