"""CUDA backend without a GPU: emitted sources compile with nvcc for sm_80 and
sm_90, artifacts carry the device code, and the host runner (run by a mock
host that records instead of launching) picks kernels and checks shapes."""

from __future__ import annotations

import copy
import ctypes
import os
import pathlib
import shutil
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from disc_tf import cli, pipeline
from disc_tf.codegen.cuda import emit_cuda
from disc_tf.codegen.cuda_ops import CudaCodegenError
from disc_tf.runtime import cuda_compiler
from disc_tf.runtime.compiler import CompileError
from disc_tf.runtime.target import resolve_target
from disc_tf.saved_model import optimize_saved_model
from tests.stage_helpers import cluster_of, dyn

REPO = pathlib.Path(__file__).resolve().parents[2]
try:
    _nvcc_root = pathlib.Path(os.path.realpath(cuda_compiler.nvcc())).parents[1]
    HAVE_NVCC = True
except CompileError:
    _nvcc_root, HAVE_NVCC = pathlib.Path("/nonexistent"), False
#: CUDA headers (cuda.h) for compiling the CUDA RAL: next to nvcc, else the default toolkit.
CUDA_INCLUDE = next((d for d in (_nvcc_root / "include", pathlib.Path("/usr/local/cuda/include"))
                     if (d / "cuda.h").is_file()), pathlib.Path("/nonexistent"))
pytestmark = pytest.mark.skipif(not HAVE_NVCC, reason="nvcc (CUDA toolkit) not installed")

F32, F16, I32, I64 = 1, 19, 3, 9  # TF dtype enums, as the mock host takes them


def layer_norm(x, g, b):
    mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
    return (x - mean) * tf.math.rsqrt(var + 1e-5) * g + b


CLUSTERS = {
    "layer_norm": (layer_norm, dyn(2), dyn(1), dyn(1)),
    "softmax": (lambda x: tf.nn.softmax(x), dyn(3)),
    "bias_gelu": (lambda x, b: tf.nn.gelu(x + b, approximate=False), dyn(2), dyn(1)),
    "matmul_bias": (lambda x, w, b: tf.nn.relu(tf.matmul(x, w) + b), dyn(2), dyn(2), dyn(1)),
    "broadcast": (lambda x, y: x * y + 1.0, dyn(3), dyn(3)),
    "column_reduce": (lambda x: tf.reduce_max(x * 2.0, axis=0), dyn(2)),
    "row_sum": (lambda x: tf.reduce_sum(x, axis=-1), dyn(2)),
    "column_sum": (lambda x: tf.reduce_sum(x, axis=0), dyn(2)),
    "row_prod": (lambda x: tf.reduce_prod(x, axis=-1), dyn(2)),
    "inner_sum": (lambda x: tf.reduce_sum(x, axis=[1, 2]), dyn(3)),
    "argmax_last": (lambda x: tf.argmax(x, axis=-1, output_type=tf.int32), dyn(2)),
    "argmin_first": (lambda x: tf.argmin(x, axis=0, output_type=tf.int32), dyn(2)),
    "window_scale": (lambda x: x[1:] * 2.0, dyn(2)),
    # the start value of an integer ArgMax is INT64_MIN: nvcc must see it
    "argmax_i64": (lambda x: tf.argmax(x, axis=-1, output_type=tf.int32), dyn(2, tf.int64)),
}


@pytest.fixture(scope="module")
def built():
    """name -> (front end, artifact) for every cluster of CLUSTERS (compiled once)."""
    out = {}
    for name, (fn, *specs) in CLUSTERS.items():
        fe = pipeline.front_end(cluster_of(fn, *specs), "cuda")
        out[name] = (fe, cuda_compiler.build(fe.sources, name, fe.plan.num_kernels))
    return out


@pytest.fixture(scope="module")
def mock_host(tmp_path_factory) -> pathlib.Path:
    """The GPU-less host (cuda_mock_host.cc) built once."""
    exe = tmp_path_factory.mktemp("mock") / "cuda_mock_host"
    subprocess.run(["g++", "-std=c++17", "-O1", f"-I{REPO / 'cc' / 'ral'}",
                    str(pathlib.Path(__file__).with_name("cuda_mock_host.cc")), "-o", str(exe),
                    "-ldl"], check=True)
    return exe


def _pair(sources) -> tuple[str, str]:
    """(device, host runner) sources of a CUDA front end."""
    assert sources.target == "cuda" and sources.host
    return sources.device, sources.host


def run_mock(mock_host: pathlib.Path, artifact: bytes, tmp_path: pathlib.Path, *inputs: str) -> str:
    so = tmp_path / "artifact.so"
    so.write_bytes(artifact)
    proc = subprocess.run([str(mock_host), str(so), *inputs], capture_output=True, text=True,
                          check=True)
    return proc.stdout


@pytest.mark.parametrize("name", sorted(CLUSTERS))
def test_artifact_carries_sass_for_sm80_and_sm90(built, name):
    fe, art = built[name]
    entries = cuda_compiler.fatbin_entries(cuda_compiler.embedded_fatbin(art.data))
    assert ("sass", 80) in entries and ("sass", 90) in entries and ("ptx", 90) in entries
    device, host = _pair(fe.sources)
    assert "__global__" in device and "__global__" not in host
    assert "cuda_runtime" not in host and '#include "disc_ral_cuda.h"' in host


def test_stitch_kernels_have_warp_and_block_row_versions(built):
    for name in ("layer_norm", "softmax"):
        device, _ = _pair(built[name][0].sources)
        assert "kernel0_warp_rows" in device and "kernel0_block_rows" in device
        assert "disc_shfl_xor" in device and "__syncthreads()" in device
    softmax, _ = _pair(built["softmax"][0].sources)
    assert softmax.count("expf(") == 2  # pass 2 and the output pass


def test_bias_gelu_is_one_loop_kernel_with_vector_version(built):
    fe, _ = built["bias_gelu"]
    device, host = _pair(fe.sources)
    assert "erfcf(" in device
    assert "kernel0_vec" in device and "kernel0_bcast_rows" in device and "disc_vec<float, 4>" in device
    assert "disc_aligned(" in host


def test_artifact_exports_and_is_refused_by_a_cpu_host(built, tmp_path):
    fe, art = built["softmax"]
    so = tmp_path / "a.so"
    so.write_bytes(art.data)
    lib = ctypes.CDLL(str(so))
    lib.disc_target.restype = ctypes.c_char_p
    assert lib.disc_target() == b"cuda"
    lib.disc_cuda_fatbin_size.restype = ctypes.c_uint64
    assert lib.disc_cuda_fatbin_size() == len(cuda_compiler.embedded_fatbin(art.data))
    lib.disc_cuda_function_name.restype = ctypes.c_char_p
    names = [lib.disc_cuda_function_name(i) for i in range(lib.disc_cuda_num_functions())]
    assert names == [b"kernel0_warp_rows", b"kernel0_block_rows", b"kernel0_block_rows_cached"]
    assert lib.disc_num_kernels() == fe.plan.num_kernels
    with pytest.raises(AttributeError):
        lib.disc_entry  # noqa: B018 - the CPU loader resolves this and so refuses the artifact


def test_mock_host_picks_warp_or_block_rows_from_row_length(built, mock_host, tmp_path):
    art = built["softmax"][1].data
    short = run_mock(mock_host, art, tmp_path, f"{F32}:1000x3x100")
    assert "alloc_output 0 [1000,3,100]" in short
    assert "launch kernel0_warp_rows grid=375 block=256" in short and short.endswith("rc 0\n")
    few = run_mock(mock_host, art, tmp_path, f"{F32}:4x3x100")  # under WARP_ROWS_MIN rows
    assert "launch kernel0_block_rows_cached grid=12 block=256" in few
    long = run_mock(mock_host, art, tmp_path, f"{F32}:2x1x5000")
    assert "launch kernel0_block_rows_cached grid=2 block=256" in long
    huge = run_mock(mock_host, art, tmp_path, f"{F32}:2x1x20000")
    assert "launch kernel0_block_rows grid=2 block=256" in huge


@pytest.mark.parametrize("name,shape,launches", [
    # adjacent reduced elements: thread (under a warp's worth), warp (many outputs),
    # block (few outputs), split (few outputs over many elements, partials combined)
    ("inner_sum", "5x3x7", ["reduce_thread grid=1"]),
    ("inner_sum", "3000x4x10", ["reduce_warp grid=375"]),
    ("inner_sum", "5x20x30", ["reduce_block grid=5"]),
    ("inner_sum", "2x300x200", ["reduce_split grid=16", "reduce_partials grid=2"]),
    ("argmax_last", "3000x10", ["reduce_thread grid=12"]),
    ("argmax_last", "3000x40", ["reduce_warp grid=375"]),
    ("argmax_last", "5x200", ["reduce_warp grid=1"]),
    ("argmax_last", "5x3000", ["reduce_block grid=5"]),
    # strided reduced elements: thread (many outputs), warp (short), block (few, long)
    ("argmin_first", "40x3000", ["reduce_thread grid=12"]),
    ("argmin_first", "100x50", ["reduce_warp grid=7"]),
    ("argmin_first", "3000x5", ["reduce_block grid=5"]),
    ("argmax_i64", "3000x40", ["reduce_warp grid=375"]),
])
def test_mock_host_picks_reduce_versions(built, mock_host, tmp_path, name, shape, launches):
    dtype = I64 if name.endswith("_i64") else F32
    out = run_mock(mock_host, built[name][1].data, tmp_path, f"{dtype}:{shape}")
    got = [line.split(" block=")[0].split("_", 1)[1] for line in out.splitlines()
           if line.startswith("launch kernel")]
    assert got == launches, out


def test_mock_host_broadcast_vector_and_flat_versions(built, mock_host, tmp_path):
    art = built["broadcast"][1].data
    out = run_mock(mock_host, art, tmp_path, f"{F32}:2x3x4", f"{F32}:1x3x1")
    assert "launch kernel0_bcast grid=1" in out and "alloc_output 0 [2,3,4]" in out
    rows = run_mock(mock_host, art, tmp_path, f"{F32}:100x3x300", f"{F32}:1x1x300")
    assert "launch kernel0_bcast_rows grid=300 block=256" in rows
    few = run_mock(mock_host, art, tmp_path, f"{F32}:2x3x300", f"{F32}:1x1x300")
    assert "launch kernel0_bcast grid=8 block=256" in few  # 6 rows: per element
    # [4, 64] read as one run by both inputs: rows of 256 instead of a strided element each
    merged = run_mock(mock_host, art, tmp_path, f"{F32}:300x4x64", f"{F32}:1x4x64")
    assert "launch kernel0_bcast_rows grid=300 block=256" in merged
    # a window of a contiguous buffer: every dim merges into one row, which runs per
    # element, not in one block
    window = run_mock(mock_host, built["window_scale"][1].data, tmp_path, f"{F32}:4097x4096")
    assert "launch kernel0_bcast grid=65535 block=256" in window, window
    assert "launch kernel0_vec" in run_mock(mock_host, art, tmp_path, f"{F32}:2x3x4", f"{F32}:2x3x4")
    assert "launch kernel0_flat" in run_mock(mock_host, art, tmp_path, f"{F32}:2x3x5",
                                                  f"{F32}:2x3x5")
    bad = run_mock(mock_host, art, tmp_path, f"{F32}:2x3x4", f"{F32}:2x5x4")
    assert "error 3 TF op 'mul': Incompatible shapes: [2,3,4] vs. [2,5,4]" in bad
    assert bad.endswith("rc 1\n") and "launch" not in bad
    wrong_dtype = run_mock(mock_host, art, tmp_path, f"{F16}:2x3x4", f"{F32}:2x3x4")
    assert "expected rank 3 f32" in wrong_dtype


def test_mock_host_matmul_is_one_gemm_then_the_epilogue(built, mock_host, tmp_path):
    art = built["matmul_bias"][1].data
    out = run_mock(mock_host, art, tmp_path, f"{F32}:5x7", f"{F32}:7x3", f"{F32}:3")
    # dtype batch m n k lda stride_a ta ldb stride_b tb ldc stride_c
    assert "gemm dtype=1 1 5 3 7 7 35 0 3 21 0 3 15" in out
    assert out.index("gemm") < out.index("launch ")
    bad = run_mock(mock_host, art, tmp_path, f"{F32}:5x7", f"{F32}:6x3", f"{F32}:3")
    assert "Matrix size-incompatible" in bad and "gemm" not in bad


def test_unsupported_plan_features_raise_a_compile_error(built):
    fe, _ = built["softmax"]
    plan = copy.deepcopy(fe.plan)
    plan.kernels[0].kind = "scatter"
    with pytest.raises(CudaCodegenError, match="kind 'scatter'") as info:
        emit_cuda(plan, ["x"], ["y"])
    assert isinstance(info.value, CompileError)  # the optimizer keeps the cluster as TF ops
    plan = copy.deepcopy(fe.plan)
    next(iter(plan.buffers.values())).role = "mapped"  # a role the backend does not know
    with pytest.raises(CudaCodegenError, match="role 'mapped'"):
        emit_cuda(plan, ["x"], ["y"])


def test_bf16_plan_compiles(built, tmp_path):
    """The front end has no bf16 yet: the f32 layer-norm plan retyped to bf16."""
    plan = copy.deepcopy(built["layer_norm"][0].plan)
    for p in [plan] + ([plan.speculative] if plan.speculative else []):
        for b in p.buffers.values():
            b.elem = "bf16"
        for k in p.kernels:
            for op in k.ops:
                op.elem = "bf16"
                op.operand_elems = ["bf16"] * len(op.operand_elems)
    plan.arg_elems = ["bf16"] * len(plan.arg_elems)
    device, host = _pair(emit_cuda(plan, ["x", "g", "b"], ["y"]))
    assert "__nv_bfloat16" in device and "disc_round_bf16(" in device and "DISC_BF16" in host
    cuda_compiler.compile_fatbin(device, tmp_path)


def test_f16_rounds_after_every_op():
    fe = pipeline.front_end(cluster_of(lambda x: tf.exp(x) * x, dyn(1, tf.float16)), "cuda")
    device, _ = _pair(fe.sources)
    assert device.count("disc_round_f16(") >= 3 and "__half2float(" in device


@pytest.mark.skipif(not (CUDA_INCLUDE / "cuda.h").is_file(), reason="no CUDA headers")
def test_cuda_ral_implementation_compiles(tmp_path):
    subprocess.run(["g++", "-std=c++17", "-O1", "-Wall", "-Werror", "-fPIC", "-c",
                    f"-I{REPO / 'cc' / 'ral'}", f"-I{CUDA_INCLUDE}",
                    str(REPO / "cc" / "ral_cuda" / "disc_ral_cuda_impl.cc"),
                    "-o", str(tmp_path / "impl.o")], check=True)


def test_auto_target_is_cpu_without_a_gpu_and_names_are_checked(monkeypatch):
    monkeypatch.delenv("DISC_TF_TARGET", raising=False)
    if not tf.config.list_physical_devices("GPU"):
        assert resolve_target("auto") == "cpu"
    assert resolve_target("cuda") == "cuda"
    with pytest.raises(ValueError, match="unknown target"):
        resolve_target("rocm")
    monkeypatch.setenv("DISC_TF_TARGET", "cuda-emu")  # what "auto" stands for, everywhere
    assert resolve_target("auto") == "cuda-emu" and resolve_target("cpu") == "cpu"
    monkeypatch.setenv("DISC_TF_TARGET", "tpu")
    with pytest.raises(ValueError, match="DISC_TF_TARGET='tpu' is not a target"):
        resolve_target("auto")


class Block(tf.Module):
    """Layer norm then softmax then bias+GELU: one cluster."""

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def __call__(self, x):
        h = layer_norm(x, 1.5, 0.25)
        return tf.nn.gelu(tf.nn.softmax(h) + 0.1, approximate=False)


@pytest.mark.fallback
def test_saved_model_for_cuda_carries_device_code_and_falls_back_on_cpu(tmp_path, monkeypatch,
                                                                        capsys):
    monkeypatch.setenv("DISC_TF_DUMP_DIR", str(tmp_path / "dump"))
    module = Block()
    tf.saved_model.save(module, str(tmp_path / "orig"))
    # strict=False: a cluster the CUDA backend refuses (an "index" kernel) is the case here
    report = optimize_saved_model(str(tmp_path / "orig"), str(tmp_path / "out"), target="cuda",
                                  strict=False)
    assert report.compiled and len(report.compiled) == len(report.clusters)
    dumped = sorted((tmp_path / "dump").glob("*/kernels.cu"))
    assert dumped and all((d.parent / "host_runner.cc").is_file() for d in dumped)
    from tests.reliability.models import disc_nodes, read_saved_model

    nodes = disc_nodes(read_saved_model(tmp_path / "out"))
    assert nodes
    for n in nodes:
        entries = cuda_compiler.fatbin_entries(cuda_compiler.embedded_fatbin(n.attr["artifact"].s))
        assert ("sass", 80) in entries and ("sass", 90) in entries
    # A CPU-only DiscCluster kernel refuses the CUDA artifact and runs the original ops.
    x = np.random.default_rng(0).standard_normal((3, 7)).astype(np.float32)
    loaded = tf.saved_model.load(str(tmp_path / "out"))
    np.testing.assert_allclose(loaded(x).numpy(), module(x).numpy(), rtol=1e-5, atol=1e-6)
    # inspect shows the emitted CUDA kernels
    assert cli.main(["inspect", str(tmp_path / "orig"), "--target", "cuda", "--show-kernels"]) == 0
    shown = capsys.readouterr().out
    assert "__global__" in shown and "_warp_rows" in shown and "erfcf(" in shown
    shutil.rmtree(tmp_path / "dump")


MORE_CLUSTERS = {
    "layer_norm_f16": (layer_norm, dyn(3, tf.float16), dyn(1, tf.float16), dyn(1, tf.float16)),
    "bias_gelu_f16": (lambda x, b: tf.nn.gelu(x + b, approximate=False), dyn(2, tf.float16),
                      dyn(1, tf.float16)),
    "ints_and_bools": (lambda x, y: tf.cast(x > y, tf.int64) + tf.cast(tf.logical_not(x < 0), tf.int64),
                       dyn(2, tf.int32), dyn(2, tf.int32)),
    "reduce_all_dims": (lambda x: tf.reduce_sum(x * x), dyn(3)),
    "transpose": (lambda x: tf.transpose(x, [1, 0, 2]) * 2.0 + 1.0, dyn(3)),
    "attention_scores": (lambda q, k: tf.nn.softmax(tf.matmul(q, k, transpose_b=True) * 0.125),
                         dyn(3), dyn(3)),
    "rms_norm": (lambda x: x * tf.math.rsqrt(tf.reduce_mean(x * x, axis=-1, keepdims=True) + 1e-6),
                 dyn(2)),
    "any": (lambda x: tf.reduce_any(x > 0, axis=-1), dyn(2)),
    "constants_f32": (lambda x: x * tf.constant([1.0, 2.0, 3.0]) + tf.constant([0.5, 0.25, 0.125]),
                      tf.TensorSpec([None, 3])),
    "constants_f16": (lambda x: x * tf.constant([1.0, 2.0, 3.0], tf.float16),
                      tf.TensorSpec([None, 3], tf.float16)),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MORE_CLUSTERS))
def test_more_clusters_compile_for_sm80_and_sm90(name, tmp_path):
    fn, *specs = MORE_CLUSTERS[name]
    fe = pipeline.front_end(cluster_of(fn, *specs), "cuda")
    art = cuda_compiler.build(fe.sources, name, fe.plan.num_kernels)
    entries = cuda_compiler.fatbin_entries(cuda_compiler.embedded_fatbin(art.data))
    assert ("sass", 80) in entries and ("sass", 90) in entries


@pytest.mark.slow
def test_random_programs_compile_for_cuda():
    """Random registry-op programs (the fuzzer's generator) emit and compile for CUDA."""
    from hypothesis import HealthCheck, given, settings

    from disc_tf.cluster.graph_view import view_of_graph_def
    from disc_tf.optimizer import carve_clusters
    from tests.fuzz.graph_gen import programs

    @settings(max_examples=int(os.environ.get("DISC_TF_CUDA_EXAMPLES", "30")),
              deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.filter_too_much])
    @given(programs(moves=False))  # data movement is CPU-only (index kernels) for now
    def check(program):
        fn = tf.function(program.function(), input_signature=program.signature(), autograph=False)
        concrete = fn.get_concrete_function()
        view = view_of_graph_def(concrete.graph.as_graph_def(), concrete.graph.as_graph_def().library)
        protected = frozenset(t.op.name for t in list(concrete.inputs) + list(concrete.outputs))
        fetched = frozenset(t.name for n in protected if n in view.nodes for t in view.nodes[n].outputs)
        _, specs = carve_clusters(view, fetched, protected, set(view.nodes), 1)
        for spec in specs:
            fe = pipeline.front_end(spec, "cuda")
            cuda_compiler.build(fe.sources, spec.name, fe.plan.num_kernels)

    check()


@pytest.mark.slow
@pytest.mark.parametrize("workload", ["bert_small", "bert_base", "keras_encoder",
                                      "recommender_tower", "fastspeech_conv", "gpt2_decoder",
                                      "mobilenet_v2", "feature_normalizer", "gelu_bias_stream",
                                      "swish_layer_stack"])
def test_bench_models_optimize_for_cuda(workload, tmp_path):
    """Every bench model (bench/workloads.py) optimizes for CUDA with no refusal: each
    cluster compiles with nvcc (strict: a refused cluster is an error)."""
    from bench.workloads import WORKLOADS

    WORKLOADS[workload].save(tmp_path / "orig")
    report = optimize_saved_model(str(tmp_path / "orig"), str(tmp_path / "out"), target="cuda",
                                  strict=True)
    assert report.compiled and all(c.error is None for c in report.clusters)
    assert {c.target for c in report.compiled} == {"cuda"}


def test_op_library_has_the_gpu_kernel_where_cuda_headers_exist():
    """The GPU DiscCluster kernel is built against CUDA headers alone (the driver and
    cuBLAS load with dlopen), so this CPU TensorFlow registers it too, unused."""
    from disc_tf.runtime import native, native_build
    from disc_tf.runtime.target import _gpu_kernel_registered

    native.load()
    assert _gpu_kernel_registered() == bool(native_build.cuda_include_dir())


def test_a_loop_cluster_builds_for_sm80_and_sm90(tmp_path):
    """A While with a TensorArray compiles whole for CUDA: body and condition in one
    fatbin (their symbols prefixed by their step), their runners and the loop runner
    linked into one artifact whose function list is the body's, then the condition's."""
    from disc_tf.cluster.graph_view import view_of_graph_def
    from disc_tf.cluster.loops import find_loops

    @tf.function(input_signature=[tf.TensorSpec([None, None, 8], tf.float32)])
    def scan(x):
        ta = tf.TensorArray(tf.float32, size=tf.shape(x)[0])
        xs = tf.TensorArray(tf.float32, size=tf.shape(x)[0]).unstack(x)

        def body(i, h, ta):
            h = tf.tanh(xs.read(i) * 0.5 + h)
            return i + 1, h, ta.write(i, h)

        _, h, ta = tf.while_loop(lambda i, h, ta: i < tf.shape(x)[0], body,
                                 [0, tf.zeros_like(x[0]), ta])
        return ta.stack() + tf.reduce_sum(h)

    concrete = scan.get_concrete_function()
    graph_def = concrete.graph.as_graph_def()
    view = view_of_graph_def(graph_def, graph_def.library, concrete.graph)
    refused: dict[str, str] = {}
    fetched = frozenset(t.name for t in concrete.outputs)
    (loop,) = find_loops(view, graph_def.library, fetched, set(), refused)
    fe = pipeline.loop_front_end(loop, "cuda")
    art = cuda_compiler.build(fe.sources, "scan_loop", fe.num_kernels)
    entries = cuda_compiler.fatbin_entries(cuda_compiler.embedded_fatbin(art.data))
    assert ("sass", 80) in entries and ("sass", 90) in entries
    so = tmp_path / "loop.so"
    so.write_bytes(art.data)
    lib = ctypes.CDLL(str(so))
    lib.disc_cuda_function_name.restype = ctypes.c_char_p
    names = [lib.disc_cuda_function_name(i).decode() for i in range(lib.disc_cuda_num_functions())]
    body = [n for n in names if "_body_" in n]
    assert body and names[:len(body)] == body and all("_cond_" in n for n in names[len(body):])
    assert hasattr(lib, "disc_cuda_entry") and not hasattr(lib, "disc_entry")


def test_a_kernel_with_too_many_parameters_is_refused():
    """A launch takes at most 4 KiB of parameters: a loop kernel reading a 100-way
    concatenation in place would need more, so the cluster is refused (it stays TF
    ops), never launched with a truncated struct."""
    from disc_tf.codegen.cuda import MAX_PARAM_BYTES

    fn = lambda *xs: tf.concat(list(xs), axis=1) * 2.0  # noqa: E731
    spec = cluster_of(fn, *[dyn(4)] * 100)
    with pytest.raises(CudaCodegenError, match=f"at most {MAX_PARAM_BYTES}"):
        pipeline.front_end(spec, "cuda")
    assert pipeline.front_end(cluster_of(fn, *[dyn(4)] * 4), "cuda").plan.kernels
