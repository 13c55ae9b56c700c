"""x86-64 levels of the CPU kernels: every level for what travels, the host's for a
JIT compile, and each level's code path checked on this machine (``DISC_TF_ISA``)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from disc_tf.runtime import elf_check, isa
from tests import fresh_python
from tests.harness import compiled
from tests.reliability import models

REPO = pathlib.Path(__file__).resolve().parents[2]

V3 = {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave", "sse4_2"}
V4 = V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}


def test_level_of_cpu_flags():
    assert isa.level_of(V4) == "x86-64-v4"
    assert isa.level_of(V3 | {"avx512f"}) == "x86-64-v3"  # AVX-512F alone is not v4
    assert isa.level_of(V3 - {"fma"}) == "x86-64"
    assert isa.host_level() in isa.LEVELS


def test_resolve(monkeypatch):
    monkeypatch.delenv("DISC_TF_ISA", raising=False)
    assert isa.resolve(None, "portable") == isa.PORTABLE
    assert isa.resolve(None, "host") == (isa.host_level(),)
    assert isa.resolve("x86-64-v3", "host") == ("x86-64-v3",)
    assert isa.resolve(["x86-64-v3", "x86-64-v4"], "host") == ("x86-64-v4", "x86-64-v3",
                                                                 "x86-64")
    for bad in ("avx2", [], ["x86-64-v5"]):
        with pytest.raises(ValueError, match="expected 'host', 'portable' or levels"):
            isa.resolve(bad, "host")


def test_environment_overrides_the_default_capped_at_the_host(monkeypatch, caplog):
    monkeypatch.setenv("DISC_TF_ISA", "x86-64")
    assert isa.resolve(None, "portable") == ("x86-64",)
    monkeypatch.setenv("DISC_TF_ISA", "x86-64-v4")
    assert isa.resolve(None, "portable") == (isa._cap("x86-64-v4"),)
    monkeypatch.setenv("DISC_TF_ISA", "portable")
    assert isa.resolve(None, "host") == isa.PORTABLE
    monkeypatch.setenv("DISC_TF_ISA", "sse9")
    assert isa.resolve(None, "host") == (isa.host_level(),)
    assert "DISC_TF_ISA='sse9'" in caplog.text
    assert isa.resolve("portable", "host") == isa.PORTABLE  # an explicit choice wins


def test_compile_flags():
    assert isa.compile_flags(isa.PORTABLE) == []
    assert isa.compile_flags(("x86-64-v3",)) == ["-march=x86-64-v3", "-DDISC_CLONES="]
    (flag,) = isa.compile_flags(("x86-64-v4", "x86-64"))
    assert flag == '-DDISC_CLONES=__attribute__((target_clones("arch=x86-64-v4", "default")))'


_LEVEL_SCRIPT = """
import json, sys
import numpy as np, tensorflow as tf
import disc_tf
from disc_tf.runtime import native
from tests.harness import assert_matches_tf, compiled
from tests.runtime.test_isa import _exports, _few_rows, _model

fn = tf.function(_model, input_signature=[tf.TensorSpec([None, 24]), tf.TensorSpec([24])])
jitted = compiled(fn)
exports = _exports(jitted)
assert "disc_entry" in exports and not any(n.endswith(".resolver") for n in exports)
rng = np.random.default_rng(3)
for rows in (1, 7, 130):
    x = tf.constant(rng.standard_normal((rows, 24)), tf.float32)
    b = tf.constant(rng.standard_normal(24), tf.float32)
    assert_matches_tf(fn, jitted, [x, b], rtol=1e-4, atol=1e-5)
# Few rows, an odd depth and a partial last panel: the GEMM tiles that split k over
# partial sums, their remainder rows of B and their edge columns.
gemv = tf.function(_few_rows, input_signature=[tf.TensorSpec([None, 13])])
jitted = compiled(gemv)
for rows in (1, 2, 3, 5):
    x = tf.constant(rng.standard_normal((rows, 13)), tf.float32)
    assert_matches_tf(gemv, jitted, [x], rtol=1e-4, atol=1e-5)
assert disc_tf.stats()["fallbacks"] == 0
print("GEMM", native.load().py.gemm_isa())
"""


def _few_rows(x):
    w = tf.constant(np.linspace(-1, 1, 13 * 40, dtype=np.float32).reshape(13, 40))
    return tf.nn.relu(tf.matmul(x * 2.0, w) + 0.5)


def _model(x, b):
    """A loop kernel with a broadcast, a stitch kernel (layer norm), a reduction and
    a GEMM (the RAL's) with its epilogue: each kernel kind's vector code."""
    h = tf.nn.relu(x * 1.5 + b)
    mean = tf.reduce_mean(h, -1, keepdims=True)
    norm = (h - mean) * tf.math.rsqrt(tf.reduce_mean(tf.square(h - mean), -1, keepdims=True) + 1e-5)
    w = tf.constant(np.linspace(-1, 1, 24 * 24, dtype=np.float32).reshape(24, 24))
    return tf.nn.softmax(tf.matmul(norm, w)), tf.reduce_sum(tf.exp(-h * h), 0)


@pytest.mark.parametrize("level", isa.LEVELS)
def test_each_level_computes_what_tf_does(level, tmp_path):
    """The code path each machine takes, run here (capped at this host's level): the
    generated kernels built for that level alone, and the RAL's GEMM for it."""
    env = dict(os.environ, DISC_TF_ISA=level, PYTHONPATH=str(REPO),
               DISC_TF_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("DISC_TF_GEMM_ISA", None)
    proc = fresh_python.run(["-c", _LEVEL_SCRIPT], env=env, cwd=REPO,
                            timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    gemm = {"x86-64-v4": "avx512", "x86-64-v3": "avx2", "x86-64": "baseline"}[isa._cap(level)]
    assert f"GEMM {gemm}" in proc.stdout, proc.stdout


def _exports(jitted) -> set[str]:
    names: set[str] = set()
    for node in jitted.graph_def.node:
        if node.op == "DiscCluster":
            names |= elf_check.exported_functions(node.attr["artifact"].s)
    return names


def test_optimize_keeps_every_level_and_jit_the_hosts(tmp_path, monkeypatch):
    monkeypatch.delenv("DISC_TF_ISA", raising=False)
    fn = tf.function(lambda x: tf.nn.softmax(x * 2.0), input_signature=[tf.TensorSpec([None, 8])])
    exports = _exports(compiled(fn))  # a JIT compile: this host's level alone
    assert "disc_entry" in exports and not any(n.endswith(".resolver") for n in exports)
    module = tf.Module()
    module.f = fn
    tf.saved_model.save(module, str(tmp_path / "m"), signatures={"serving_default": fn})
    for choice, clones in (("portable", True), ("host", False)):
        out = tmp_path / choice
        disc_tf.optimize(str(tmp_path / "m"), str(out), quiet=True,
                         isa=None if choice == "portable" else choice)
        (node,) = models.disc_nodes(models.read_saved_model(out))
        exports = elf_check.exported_functions(node.attr["artifact"].s)
        assert any(n.endswith(".resolver") for n in exports) == clones, sorted(exports)


_HIDDEN_AVX512_SCRIPT = """
import ctypes, pathlib, subprocess, sys
import numpy as np, tensorflow as tf
import disc_tf
from disc_tf.runtime import native
from tests.harness import assert_matches_tf, compiled
from tests.runtime.test_isa import _exports, _model

features = np._core._multiarray_umath.__cpu_features__
print("CPUID", int(features["AVX2"]), int(features["AVX512F"]))
fn = tf.function(_model, input_signature=[tf.TensorSpec([None, 24]), tf.TensorSpec([24])])
jitted = compiled(fn)
rng = np.random.default_rng(5)
for rows in (1, 9, 130):
    x = tf.constant(rng.standard_normal((rows, 24)), tf.float32)
    b = tf.constant(rng.standard_normal(24), tf.float32)
    assert_matches_tf(fn, jitted, [x, b], rtol=1e-4, atol=1e-5)
assert disc_tf.stats()["fallbacks"] == 0
# Which clone each kernel's resolver picks, by its offset in the artifact's symbol table.
(node,) = [n for n in jitted.graph_def.node if n.op == "DiscCluster"]
path = pathlib.Path(sys.argv[1]) / "artifact.so"
path.write_bytes(node.attr["artifact"].s)
symbols = {}
for line in subprocess.run(["nm", str(path)], capture_output=True, text=True,
                           check=True).stdout.splitlines():
    parts = line.split()
    if len(parts) == 3:
        symbols[parts[2]] = int(parts[0], 16)
lib = ctypes.CDLL(str(path))
base = ctypes.cast(lib.disc_entry, ctypes.c_void_p).value - symbols["disc_entry"]
offsets = {offset: name for name, offset in symbols.items()}
for resolver in sorted(n for n in _exports(jitted) if n.endswith(".resolver")):
    pick = lib[resolver]
    pick.restype = ctypes.c_void_p
    print("CLONE", offsets.get(pick() - base, "unknown").rsplit(".", 1)[-1])
print("GEMM", native.load().py.gemm_isa())
"""


def _cpuid_faulting() -> bool:
    """Whether arch_prctl(ARCH_SET_CPUID) works here (asked in a child process)."""
    probe = ("import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
             "print(libc.syscall(158, 0x1012, 1))")  # SYS_arch_prctl, ARCH_SET_CPUID, on
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    return out.returncode == 0 and out.stdout.strip() == "0"


@pytest.mark.cpu_backend  # the CPU kernels' target_clones and the RAL's GEMM blocks
def test_a_cpu_without_avx512_takes_the_avx2_clones(tmp_path):
    """What an AVX2-only machine runs, without any cap: a process whose CPUID hides
    AVX-512 (bench/hide_avx512.py's shim, through Linux's CPUID faulting) loads a
    portable artifact, and every kernel's resolver picks its x86-64-v3 clone, the RAL
    picks its AVX2 GEMM block, and the answers are TF's."""
    if isa.host_level() == "x86-64":
        pytest.skip("the AVX2 clones need AVX2+FMA")
    if not _cpuid_faulting():
        pytest.skip("this kernel or hypervisor has no CPUID faulting to hide AVX-512 with")
    from bench import hide_avx512

    env = dict(os.environ, DISC_TF_ISA="portable", PYTHONPATH=str(REPO),
               DISC_TF_CACHE_DIR=str(tmp_path / "cache"),
               LD_PRELOAD=str(hide_avx512.build()))
    env.pop("DISC_TF_GEMM_ISA", None)
    proc = fresh_python.run(["-c", _HIDDEN_AVX512_SCRIPT, str(tmp_path)], env=env, cwd=REPO,
                            timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CPUID 1 0" in proc.stdout, proc.stdout
    clones = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("CLONE")]
    assert len(clones) >= 4 and set(clones) == {"arch_x86_64_v3"}, proc.stdout
    assert "GEMM avx2" in proc.stdout, proc.stdout


_ROWS_SCRIPT = """
import sys
import numpy as np, tensorflow as tf
import disc_tf
from tests.harness import assert_matches_tf, compiled
from tests.runtime.test_isa import _row_passes

fn = tf.function(_row_passes, input_signature=[tf.TensorSpec([None, None])])
jitted = compiled(fn)
rng = np.random.default_rng(11)
out = {}
for cols in (5, 16, 24, 31, 40, 252, 1030, 2100):
    x = tf.constant(rng.standard_normal((9, cols)) * 4, tf.float32)
    assert_matches_tf(fn, jitted, [x], rtol=1e-4, atol=1e-6)
    for i, y in enumerate(jitted(x)):
        out[f"{cols}_{i}"] = y.numpy()
assert disc_tf.stats()["fallbacks"] == 0
np.savez(sys.argv[1], **out)
"""


def _row_passes(x):
    """Row reductions of stitch kernels: a softmax (exp in its sum's pass) and a layer
    norm (a mean, then a variance)."""
    mean = tf.reduce_mean(x, -1, keepdims=True)
    var = tf.reduce_mean(tf.square(x - mean), -1, keepdims=True)
    return tf.nn.softmax(x * 0.125, axis=-1), (x - mean) * tf.math.rsqrt(var + 1e-5)


def test_row_passes_give_the_same_bits_on_avx2_and_avx512(tmp_path):
    """Stitch rows step sixteen columns at a time where every reduction has vector lanes:
    the x86-64-v4 build then calls libmvec's 16-lane expf, the v3 build its 8-lane one,
    and both fold into eight-lane accumulators. Their answers agree bit for bit, at rows
    that take the 16-, 8- and partial steps and DISC_REDUCE_BLOCK's blocks (an exp that
    differs in the v4 build alone fails this)."""
    if isa.host_level() != "x86-64-v4":
        pytest.skip("needs an AVX-512 CPU to run the x86-64-v4 build")
    outs = {}
    for level in ("x86-64-v4", "x86-64-v3"):
        env = dict(os.environ, DISC_TF_ISA=level, PYTHONPATH=str(REPO),
                   DISC_TF_CACHE_DIR=str(tmp_path / f"cache-{level}"))
        path = tmp_path / f"{level}.npz"
        proc = fresh_python.run(["-c", _ROWS_SCRIPT, str(path)], env=env, cwd=REPO, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        outs[level] = np.load(path)
    v4, v3 = outs["x86-64-v4"], outs["x86-64-v3"]
    assert sorted(v4.files) == sorted(v3.files) and len(v4.files) == 16
    for name in v4.files:
        np.testing.assert_array_equal(v4[name].view(np.uint32), v3[name].view(np.uint32),
                                      err_msg=name)
