"""The CUDA emulator (``cc/cuda_emu``) keeps a GPU's semantics: warp collectives in
lock step with CUDA's lane rules, barriers that catch divergence, the driver's launch
checks, per-block shared memory, and a cuBLAS stand-in with cuBLAS's column-major
conventions behind the same row-major mapping the CUDA RAL uses."""

from __future__ import annotations

import ctypes
import subprocess

import numpy as np
import pytest

from disc_tf.runtime import compiler, cuda_emu_build

HERE = __import__("pathlib").Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def emu(tmp_path_factory) -> ctypes.CDLL:
    so = tmp_path_factory.mktemp("emu") / "selftest.so"
    pre = cuda_emu_build.prebuilt_dir()
    assert pre is not None
    emulator = cuda_emu_build.header_dirs()["emu"] / "cuda_emulator.h"
    subprocess.run([compiler.resolve(compiler.cxx()), *cuda_emu_build.FLAGS,
                    "-include", str(emulator), "-shared",
                    *cuda_emu_build.device_includes(), str(HERE / "emu_selftest.cc"),
                    str(pre / "emu_runtime.o"), "-o", str(so)], check=True)
    lib = ctypes.CDLL(str(so))
    i32, i64, ptr = ctypes.c_int, ctypes.c_long, ctypes.c_void_p
    lib.emu_row_major_gemm.argtypes = [i32, i64, i64, i64, i64, ptr, i64, i64, i32, ptr, i64,
                                       i64, i32, ptr, i64, i64]
    lib.emu_row_major_gemm_tf32.argtypes = [*lib.emu_row_major_gemm.argtypes, i32]
    lib.emu_zero_gemm_output.argtypes = [i32, i64, i64, i64, ptr, i64, i64]
    return lib


def _ptr(a: np.ndarray):
    return a.ctypes.data_as(ctypes.c_void_p)


def _err():
    return ctypes.create_string_buffer(1024)


@pytest.mark.parametrize("width", [32, 16, 8])
def test_shuffles_follow_cuda_lane_rules(emu, width):
    out, err = np.full((64, 4), -1, np.int32), _err()
    assert emu.emu_shuffles(_ptr(out), width, err, 1024) == 0, err.value
    for t in range(64):
        w, lane = divmod(t, 32)
        group = lane // width * width
        xor = lane ^ 3 if (lane ^ 3) < group + width else lane
        down = lane + 3 if lane % width + 3 < width else lane
        up = lane - 3 if lane % width >= 3 else lane
        idx = group + 5 % width
        assert out[t].tolist() == [w * 32 + s for s in (xor, down, up, idx)], t


def test_votes_and_independent_half_warp_collectives(emu):
    out, err = np.full(128, -1, np.int32), _err()
    assert emu.emu_votes(_ptr(out), err, 1024) == 0, err.value
    for w in range(2):
        ballot = sum(1 << lane for lane in range(32) if (w * 32 + lane) % 3 == 0)
        assert out[3 * w] == np.int32(np.uint32(ballot).view(np.int32))
        assert out[3 * w + 1] == (w == 1)  # thread 40 is in warp 1
        assert out[3 * w + 2] == (w == 0)  # threads 48.. are in warp 1
    assert out[64:].tolist() == [t // 32 * 32 + ((t % 32) ^ 8) for t in range(64)]


@pytest.mark.parametrize("case,message", [
    ("emu_divergent_sync", "__syncthreads"),
    ("emu_exited_lane", "exited"),
    ("emu_mismatched", "__ballot_sync"),
])
def test_divergence_is_an_error_not_a_hang(emu, case, message):
    out, err = np.zeros(64, np.int32), _err()
    assert getattr(emu, case)(_ptr(out), err, 1024) == 1
    assert message in err.value.decode()


def test_integer_division_by_zero_is_an_error_not_a_crash(emu):
    out, err = np.zeros(32, np.int32), _err()
    assert emu.emu_divide_by_zero(_ptr(out), 5, err, 1024) == 1
    assert "integer division by zero" in err.value.decode()
    assert emu.emu_divide_by_zero(_ptr(out), 40, err, 1024) == 0  # no zero divisor: runs
    assert out.tolist() == [100 // (40 - t) for t in range(32)]
    assert emu.emu_division_overflow(_ptr(out), -(2**31), err, 1024) == 1
    assert "most negative value by -1" in err.value.decode()


@pytest.mark.parametrize("grid,block,shared,message", [
    (0, 32, 0, "invalid launch configuration"), (1, 2048, 0, "invalid launch configuration"),
    (1, 32, 64 * 1024, "dynamic shared memory")])
def test_launch_limits_are_the_drivers(emu, grid, block, shared, message):
    out, err = np.zeros(4096, np.int32), _err()
    assert emu.emu_dynamic_shared(_ptr(out), grid, block, shared, err, 1024) == 1
    assert message in err.value.decode()


def test_dynamic_shared_memory_is_per_block_and_starts_as_nan(emu):
    out, err = np.zeros(3 * 96, np.int32), _err()
    assert emu.emu_dynamic_shared(_ptr(out), 3, 96, 96 * 4, err, 1024) == 0, err.value
    assert out.tolist() == [1000 + 95 - t for _ in range(3) for t in range(96)]


def test_block_reduction_through_shared_memory_and_shuffles(emu):
    data = np.random.default_rng(0).integers(-100, 100, size=5 * 256 + 5).astype(np.int32)
    want = data[:5 * 256].reshape(5, 256).sum(axis=1)
    err = _err()
    assert emu.emu_block_sums(_ptr(data), 5, err, 1024) == 0, err.value
    assert data[5 * 256:].tolist() == want.tolist()


DTYPES = {1: np.float32, 19: np.float16}


@pytest.mark.parametrize("dtype", [1, 19])
@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_row_major_gemm_maps_onto_column_major_cublas(emu, dtype, ta, tb):
    """Padded leading dims and batch strides: every index convention is exercised."""
    rng = np.random.default_rng(ta * 2 + tb)
    batch, m, n, k, pad = 3, 5, 4, 7, 2
    a_rows, a_cols = (k, m) if ta else (m, k)
    b_rows, b_cols = (n, k) if tb else (k, n)
    nt = DTYPES[dtype]
    a = rng.standard_normal((batch, a_rows, a_cols + pad)).astype(nt)
    b = rng.standard_normal((batch, b_rows, b_cols + pad)).astype(nt)
    c = np.full((batch, m, n + pad), 7, nt)
    rc = emu.emu_row_major_gemm(
        dtype, batch, m, n, k, _ptr(a), a_cols + pad, a_rows * (a_cols + pad), ta,
        _ptr(b), b_cols + pad, b_rows * (b_cols + pad), tb, _ptr(c), n + pad, m * (n + pad))
    assert rc == 0
    opa = a[..., :a_cols].astype(np.float32)
    opb = b[..., :b_cols].astype(np.float32)
    want = (opa.transpose(0, 2, 1) if ta else opa) @ (opb.transpose(0, 2, 1) if tb else opb)
    tol = 1e-5 if dtype == 1 else 3e-3
    np.testing.assert_allclose(c[..., :n].astype(np.float32), want, rtol=tol, atol=tol)
    assert (c[..., n:] == 7).all()  # padding columns untouched


def _tf32(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to TF32 (10 mantissa bits, ties away from zero)."""
    bits = x.astype(np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


@pytest.mark.parametrize("dtype", [1, 19])
def test_tf32_gemms_round_float_operands_only(emu, dtype):
    """With TF32 allowed (TF's default on a GPU) float operands are rounded to TF32 as
    tensor cores take them; f16 GEMMs keep their compute type."""
    rng = np.random.default_rng(3)
    m, n, k = 6, 5, 64
    nt = DTYPES[dtype]
    a = (1 + rng.random((m, k)) * 1e-3).astype(nt)  # mantissa bits TF32 drops
    b = rng.standard_normal((k, n)).astype(nt)
    outs = {}
    for allow in (0, 1):
        c = np.zeros((m, n), nt)
        assert emu.emu_row_major_gemm_tf32(dtype, 1, m, n, k, _ptr(a), k, 0, 0, _ptr(b), n, 0, 0,
                                           _ptr(c), n, 0, allow) == 0
        outs[allow] = c.astype(np.float64)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    if dtype == 1:
        rounded = _tf32(a).astype(np.float64) @ _tf32(b).astype(np.float64)
        np.testing.assert_allclose(outs[0], exact, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(outs[1], rounded, rtol=1e-5, atol=1e-5)
        assert np.abs(outs[1] - exact).max() > 20 * np.abs(outs[0] - exact).max()
    else:
        np.testing.assert_array_equal(outs[1], outs[0])


# (batch, m, n, ldc, stride_c, offset of C in its tensor, contiguous runs to zero)
K0_LAYOUTS = {
    "dense": (6, 5, 4, 4, 20, 0, 1),
    "padded_rows": (3, 5, 4, 6, 30, 0, 3 * 5),
    "one_matrix_padded_rows": (1, 5, 4, 6, 0, 0, 5),
    # einsum acbe,aecd->abcd: the [b x d] matrices of batch c interleave in [a, b, c, d]
    # (here the window of a = 1, c = 0..1, in a [3, 5, 2, 4] tensor): no gaps, one run
    "interleaved": (2, 5, 4, 8, 4, 40, 1),
    "interleaved_with_gaps": (2, 5, 4, 12, 4, 8, 2 * 5),
    "one_row_each": (3, 1, 4, 4, 8, 0, 3),
    "one_row_each_adjacent": (3, 1, 4, 9, 4, 0, 1),
    "dense_rows": (3, 2, 4, 4, 10, 2, 3),
    "overlapping_matrices": (3, 4, 4, 4, 8, 0, 3),  # stride_c < m * n: their union
}


@pytest.mark.parametrize("dtype", [1, 19])  # float32, float16
@pytest.mark.parametrize("layout", K0_LAYOUTS)
def test_k0_gemm_zeroes_only_its_window(emu, layout, dtype):
    """A k == 0 product zeroes exactly C's elements, in as few memsets as its layout
    allows. C is a window of a larger tensor when a GEMM writes its reader's layout;
    zeroing batch * stride_c elements from C's start cleared what is not C and ran past
    the tensor's end (heap corruption under the cuda-emu einsum tests)."""
    batch, m, n, ldc, sc, offset, runs = K0_LAYOUTS[layout]
    q, i, j = np.meshgrid(np.arange(batch), np.arange(m), np.arange(n), indexing="ij")
    inside = (offset + q * sc + i * ldc + j).ravel()
    buf = np.full(inside.max() + 9, 7.0, DTYPES[dtype])  # a tail past C's last element
    c = ctypes.c_void_p(buf.ctypes.data + offset * buf.itemsize)
    assert emu.emu_zero_gemm_output(dtype, batch, m, n, c, ldc, sc) == runs
    expected = np.full_like(buf, 7.0)
    expected[inside] = 0.0
    np.testing.assert_array_equal(buf, expected)


def test_cublas_stand_in_rejects_what_cublas_rejects(emu):
    a = np.zeros((4, 4), np.float32)
    # lda smaller than a row: cuBLAS's CUBLAS_STATUS_INVALID_VALUE (7), via the mapping
    assert emu.emu_row_major_gemm(1, 1, 4, 4, 4, _ptr(a), 4, 0, 0, _ptr(a), 4, 0, 0,
                                  _ptr(a), 4, 0) == 0
    assert emu.emu_row_major_gemm(1, 1, 4, 4, 4, _ptr(a), 2, 0, 0, _ptr(a), 4, 0, 0,
                                  _ptr(a), 4, 0) == 7
    assert emu.emu_row_major_gemm(3, 1, 4, 4, 4, _ptr(a), 4, 0, 0, _ptr(a), 4, 0, 0,
                                  _ptr(a), 4, 0) == -1  # int32: no GEMM dtype


def test_index_divmod_is_exact_in_both_widths(tmp_path):
    """``disc_divmod`` (the device prelude's index split) divides in 32 bits when both
    operands fit and in 64 bits otherwise: both give the exact quotient and remainder."""
    from disc_tf.codegen.cuda_ops import DEVICE_PRELUDE

    src = tmp_path / "divmod.cc"
    src.write_text(DEVICE_PRELUDE + '\nextern "C" int64_t divmod(int64_t* rem, int64_t dim) '
                   "{ return disc_divmod(*rem, dim); }\n")
    so = tmp_path / "divmod.so"
    subprocess.run([compiler.resolve(compiler.cxx()), *cuda_emu_build.FLAGS, "-include",
                    str(cuda_emu_build.header_dirs()["emu"] / "cuda_emulator.h"), "-shared",
                    *cuda_emu_build.device_includes(), str(src), "-o", str(so)], check=True)
    lib = ctypes.CDLL(str(so))
    lib.divmod.restype = ctypes.c_int64
    lib.divmod.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_int64]
    for rem, dim in [(10, 3), (0, 7), (2**32 - 1, 2**32 - 1), (2**32 - 1, 10), (2**32, 10),
                     (2**32 + 5, 7), (2**40 + 12345, 2**33 + 1), (5, 2**32), (2**62 + 3, 3)]:
        r = ctypes.c_int64(rem)
        assert (lib.divmod(ctypes.byref(r), dim), r.value) == (rem % dim, rem // dim), (rem, dim)
