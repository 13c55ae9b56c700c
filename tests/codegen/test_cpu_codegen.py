"""Generated C++: readable, named, with input checks; one kernel per plan entry."""

from __future__ import annotations

import re

import tensorflow as tf

from disc_tf import pipeline
from tests.stage_helpers import cluster_of, dyn


def _source(fn, *specs) -> str:
    return pipeline.front_end(cluster_of(fn, *specs)).source


def _unit(src: str, kind: str) -> str:
    """The content name of the (only) kernel unit of ``kind`` in ``src``."""
    (name,) = set(re.findall(rf"\b{kind}_[0-9a-f]{{10}}\b", src))
    return name


def test_source_names_tf_ops_buffers_and_checks_inputs():
    src = _source(lambda x, b: tf.nn.relu(x + b) * 2.0, dyn(2), dyn(1))
    assert "// TF ops: add, Relu, mul" in src
    k = _unit(src, "loop")
    assert f"DISC_ENTRY void {k}_flat" in src
    assert f"{k}_bcast" in src  # b may broadcast: speculated version chosen per call
    assert "Incompatible shapes" in src
    assert "expected rank 2 f32" in src and "expected rank 1 f32" in src
    assert 'extern "C" int32_t disc_entry(disc_ral* ral)' in src
    assert src.count("#include") == 6  # kernels and host runner: the C library and disc_ral.h
    assert "tensorflow" not in src.lower().replace("tensorflow's", "")


def test_no_broadcast_version_when_shapes_are_proven_equal():
    src = _source(lambda x: tf.exp(x) * x, dyn(4))
    k = _unit(src, "loop")
    assert f"{k}_flat" in src and f"{k}_bcast" not in src


def test_f16_rounds_after_every_op():
    src = _source(lambda x: tf.exp(x) * x, dyn(1, tf.float16))
    assert src.count("disc_round_f16(") >= 3  # exp, multiply, plus the helper itself


def test_small_constant_powers_are_multiplies():
    src = _source(lambda x: tf.pow(x, 3.0) + tf.pow(x, 2.0) - tf.pow(x, 1.5), dyn(2))
    assert src.count("powf(") == 1 + src.count("float powf(")  # only x ** 1.5 calls it


def test_softmax_keeps_exp_for_the_final_pass():
    src = _source(lambda x: tf.nn.softmax(x * 0.5, axis=-1), dyn(3))
    k = _unit(src, "stitch")
    row = src[src.index(f"{k}_row("):src.index(f"{k}_rows8")]
    # the 16- and 8-lane loops and the tail; not the final pass
    assert row.count("expf(") == 3
    assert "kept for the final pass" in row
    assert "r0[c]" in row and "st0" not in row  # contiguous rows, no stride


def test_stitch_kernel_chooses_short_row_version_per_call():
    """Rows shorter than a vector run eight at a time, one per lane, from tiles."""
    src = _source(lambda x: tf.nn.softmax(x), dyn(2))
    k = _unit(src, "stitch")
    assert f"{k}_rows8" in src
    assert re.search(rf"if \(a\.dims\[1\] < 8\).*\n.*{k}_rows8", src)
    assert "t0[c][l]" in src  # the input tile, read across lanes


def test_concatenation_read_in_place_by_a_loop_kernel():
    src = _source(lambda x, y: tf.concat([x, tf.transpose(y)], 1) + 1.0, dyn(2), dyn(2))
    assert "one segment of columns per part" in src
    assert "int64_t cat0[2];" in src
    assert "// TF ops: concat, add" in src


def test_no_short_row_version_for_rows_proven_long():
    src = _source(lambda x: tf.nn.softmax(x), tf.TensorSpec([None, 64], tf.float32))
    k = _unit(src, "stitch")
    assert f"{k}_rows8" not in src and f"{k}_row(" in src


def test_every_libm_function_an_expression_calls_is_declared():
    """Generated code declares the libm functions it uses instead of including <math.h>:
    every one any elementwise expression can emit must be declared."""
    from disc_tf.codegen.cpu_ops import MATH
    from disc_tf.ops import elementwise

    called = set()
    for op in sorted(elementwise.names()):
        for elem in ("f32", "f16", "bf16"):
            for args in (["a"], ["a", "b"], ["a", "b", "c"]):
                try:
                    text = elementwise.expression(op, args, elem, [elem] * len(args), {})
                except (KeyError, ValueError, TypeError, IndexError):
                    continue  # another arity, or attributes this walk does not give
                called |= set(re.findall(r"\b([a-z][a-z0-9_]*f)\(", text))
    # the prelude's own wrappers (disc_expf, disc_sigmoidf: exp on libmvec's fast path)
    # are defined in MATH; what their bodies call must be declared too
    wrappers = {f for f in called if f.startswith("disc_")}
    assert all(f"float {f}(float x) {{" in MATH for f in wrappers), wrappers
    for f in wrappers:
        body = MATH.split(f"float {f}(float x) {{", 1)[1].split("\n}", 1)[0]
        called |= set(re.findall(r"\b([a-z][a-z0-9_]*f)\(", body))
    called -= wrappers
    assert {"expf", "tanhf", "erff", "powf", "fabsf", "fmodf"} <= called, called
    missing = {f for f in called
               if not re.search(rf"^float {f}\(float(, float)?\) noexcept;$", MATH, re.M)}
    assert not missing, missing


def _vectorizer_report(unit_text: str, tmp_path, march: str = "x86-64-v3") -> str:
    """GCC's vectorizer notes on ``unit_text`` compiled with the product's flags for one
    ISA level alone (AVX2 unless ``march`` says otherwise); the object is unit.o."""
    import subprocess

    from disc_tf.runtime import compiler, cpu_build, native

    src = tmp_path / "unit.cc"
    src.write_text(unit_text)
    cmd = [compiler.cxx(), *cpu_build.COMPILE_FLAGS, f"-I{native.ral_include_dir()}",
           f"-march={march}", "-DDISC_CLONES=", "-fopt-info-vec-optimized",
           "-fopt-info-vec-missed", "-c", str(src), "-o", str(tmp_path / "unit.o")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stderr


def _flat_loop(lines: list[str]) -> int:
    """The index of the ``for`` line of a loop unit's flat version."""
    flat = next(i for i, line in enumerate(lines) if "DISC_ENTRY void" in line and "_flat(" in line)
    return next(i for i in range(flat, len(lines))
                if "for (int64_t i = begin; i < end; ++i)" in lines[i])


def _loop_vectorized(report: str, lines: list[str], loop: int) -> list[str]:
    """GCC's notes that the loop whose ``for`` is ``lines[loop]`` was vectorized 8 float
    lanes at a time (under ``omp simd`` GCC names a line of the loop's body): empty if
    none says so."""
    end = next(i for i in range(loop, len(lines)) if lines[i] == "  }")
    return [x for x in report.splitlines()
            if re.search(r"unit\.cc:(\d+):\d+: optimized: loop vectorized using 32 byte", x)
            and loop < int(re.search(r"unit\.cc:(\d+):", x).group(1)) <= end + 1]


def test_fused_selects_and_clamps_vectorize(tmp_path):
    """A Select whose arm computes (and Maximum/Minimum around a log) is no control flow
    to the vectorizer: the fused loop runs 8 lanes at a time, not one element."""
    fe = pipeline.front_end(cluster_of(
        lambda x, m, f: tf.where(x >= 0.0,
                                 (tf.minimum(tf.maximum(tf.math.log(tf.abs(x) + 1.0), 0.0),
                                             12.0) - m) * 0.5, f),
        dyn(2), dyn(1), dyn(1)))
    (unit,) = [u for u in fe.sources.units if "SelectV2" in u.text and "Log" in u.text]
    lines = unit.text.splitlines()
    loop = _flat_loop(lines)
    assert _loop_vectorized(_vectorizer_report(unit.text, tmp_path), lines, loop)


def test_flat_loop_of_many_inputs_vectorizes(tmp_path):
    """Inference batch norms' parameters from their variables (Keras' rsqrt(var + eps) *
    gamma and beta - mean * that), six of them in one loop of 24 inputs and 12 outputs,
    as MobileNetV2's last stage fuses them: the flat version runs 8 lanes at a time.
    Left to GCC's cost model it stayed scalar, one sqrt and division per element."""
    def bn_params(eps, *vs):  # one epsilon op joins the six into one cluster
        eps = tf.abs(eps) + 1e-3
        outs = []
        for g, b, mu, var in zip(vs[0::4], vs[1::4], vs[2::4], vs[3::4]):
            scale = tf.math.rsqrt(var + eps) * g
            outs += [scale, b - mu * scale]
        return outs

    fe = pipeline.front_end(cluster_of(bn_params, *[tf.TensorSpec([960], tf.float32)] * 25))
    (unit,) = [u for u in fe.sources.units if "Rsqrt" in u.text]
    lines = unit.text.splitlines()
    loop = _flat_loop(lines)
    assert unit.text.count("/ sqrtf(") == 6, unit.text  # one loop of the six
    assert _loop_vectorized(_vectorizer_report(unit.text, tmp_path), lines, loop)


def test_masked_softmax_exp_loop_vectorizes_whole(tmp_path):
    """Keras' masked softmax (select(mask, x, -1e9), softmax) vectorizes its exp loop 8
    float lanes at a time in every instance of the row (mask along the row or one per
    row): the bool mask's bytes are widened to 32-bit lanes before the loop. Read as
    bytes inside it, GCC vectorized the loop in 8-byte pieces (7-9 ns per element
    against 2); read as C++ bool, one instance stayed scalar."""
    def masked_softmax(x, m):
        return tf.nn.softmax(tf.where(m, x, -1e9), axis=-1)

    fe = pipeline.front_end(cluster_of(masked_softmax, dyn(3),
                                       tf.TensorSpec([None, None, None], tf.bool)))
    (unit,) = [u for u in fe.sources.units if "Softmax" in u.text]
    lines = unit.text.splitlines()
    # the first row version's exp loops: sixteen columns a step, then eight
    exps = [i for i, line in enumerate(lines) if "= disc_expf(" in line][:2]
    loops = [max(i for i in range(e) if re.search(r"for \(int l = 0; l < (8|16); \+\+l\)",
                                                 lines[i])) for e in exps]
    assert [lines[i].strip() for i in loops] == ["for (int l = 0; l < 16; ++l) {",
                                                 "for (int l = 0; l < 8; ++l) {"]
    notes = _vectorizer_report(unit.text, tmp_path).splitlines()
    for loop in loops:
        report = [x for x in notes
                  if re.search(rf"unit\.cc:({loop + 1}|{loop + 2}):\d+: (optimized|missed): "
                               r"(loop vectorized|couldn't vectorize loop)", x)]
        assert report and all("loop vectorized using 32 byte vectors" in x for x in report), \
            report


def test_softmax_exp_runs_sixteen_lanes_on_avx512(tmp_path):
    """The AVX-512 build of a softmax row calls libmvec's 16-lane expf on the sixteen-column
    steps (GCC keeps a loop of eight lanes at 256 bits, and its 8-lane AVX2 expf); AVX2
    builds call the 8-lane one. (The two give the same bits for every float:
    tests/runtime/test_libmvec_bits.py.)"""
    import subprocess

    fe = pipeline.front_end(cluster_of(lambda x: tf.nn.softmax(x * 0.125, axis=-1), dyn(3)))
    (unit,) = [u for u in fe.sources.units if "Softmax" in u.text]
    wanted = {"x86-64-v4": "_ZGVeN16v_expf", "x86-64-v3": "_ZGVdN8v_expf"}
    for march, symbol in wanted.items():
        notes = _vectorizer_report(unit.text, tmp_path, march=march)
        assert "loop vectorized" in notes
        undefined = subprocess.run(["nm", "-u", str(tmp_path / "unit.o")], capture_output=True,
                                   text=True, check=True).stdout
        assert symbol in undefined, (march, undefined)


def test_kernels_reading_only_weights_ask_the_ral_for_kept_results():
    """Batch norm's scale and offset (from the variables gamma, beta, mean and var) are
    kernels of their own that ask fold_begin first; the kernel reading x runs on every
    call, and so does one reading a placeholder that is not a weight (shift). A kept
    result is never freed by the runner."""
    gamma, beta, mean, var = (tf.Variable(tf.ones([8]) * v) for v in (1.5, 0.5, 0.1, 2.0))

    def bn(x, shift):
        return tf.nn.batch_normalization(x, mean, var, beta, gamma, 1e-3) + tf.exp(shift)

    src = _source(bn, dyn(2), dyn(1))
    inputs = dict(re.findall(r"arg(\d+)=([\w/]+):0", src.split("// Inputs:")[1].splitlines()[0]))
    weights = {i for i, name in inputs.items() if name not in ("x", "shift")}
    assert len(weights) == 4, inputs
    folds = re.findall(r"static const int32_t fold_inputs\[\] = \{([0-9, ]+)\};", src)
    assert folds, src
    for args in folds:
        assert set(args.split(", ")) <= weights, (args, inputs)
    sites = re.findall(r"(fold\d+) = ral->fold_begin == nullptr \? -1 : ral->fold_begin\(ral, (\d+),",
                       src)
    assert len(sites) == len(folds)
    for var, site in sites:
        assert f"if ({var} == 0) ral->fold_done(ral, {site});" in src
        assert re.search(rf"\bif \({var} < 0\) {{ ral->free_temp\(ral, \w+\);", src), var


def test_epilogues_of_column_steps_go_to_the_ral_as_steps():
    """A GEMM's bias and clip (columns and constants only) is described to the RAL as
    disc_column_epilogue steps, in TF's order with each operand's side, with the
    generated epilogue kept for a host without ABI 11, and a residual as a step reading
    x at C's index; an epilogue that subtracts C from a column, or a sigmoid, is not."""
    w = tf.Variable(tf.ones([8, 8]))
    b = tf.Variable(tf.ones([8]))

    src = _source(lambda x: tf.clip_by_value(tf.matmul(x, w) - b, -1.0, 0.5), dyn(2))
    steps = re.findall(r"col\.step\[(\d)\] = disc_column_step\{(\w+), (\d), (\S+), (\S+)\};", src)
    assert [(s[1], s[2]) for s in steps] == [
        ("DISC_COLUMN_SUB", "1"), ("DISC_CONSTANT_MIN", "1"), ("DISC_CONSTANT_MAX", "1")], steps
    assert steps[0][3].startswith("k.in") and steps[1][4] == "0x1.0000000000000p-1f", steps
    assert "ral->abi_version >= 11 && ral->column_epilogue != nullptr" in src
    assert re.search(r"\(on_registers \? ral->column_epilogue : loop_[0-9a-f]{10}_epilogue\)", src)

    src = _source(lambda x: tf.maximum(0.0, tf.matmul(x, w) * 2.0), dyn(2))
    steps = re.findall(r"disc_column_step\{(\w+), (\d),", src)
    assert steps == [("DISC_CONSTANT_MUL", "1"), ("DISC_CONSTANT_MAX", "0")], steps

    src = _source(lambda x: tf.nn.relu(tf.matmul(x, w) + b + x), dyn(2))  # a residual
    steps = re.findall(r"disc_column_step\{(\w+), (\d), (\S+),", src)
    assert [s[0] for s in steps] == ["DISC_COLUMN_ADD", "DISC_MATRIX_ADD", "DISC_CONSTANT_MAX"]
    assert steps[1][2].startswith("k.in") and steps[1][2] != steps[0][2], steps

    for fn in (lambda x: b - tf.matmul(x, w), lambda x: tf.sigmoid(tf.matmul(x, w))):
        src = _source(fn, dyn(2))
        assert "_epilogue(void* p" in src  # fused into the GEMM all the same
        assert "disc_column_step" not in src
