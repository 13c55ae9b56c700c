"""How the RAL runs a GEMM's blocks on threads: its own polling workers
(cc/ral/spin_pool.h) or TF's intra-op pool (DISC_TF_TASK_POOL=tf), and how each
ISA's block cuts a prepacked product (cc/ral/gemm_split.h: 48-row blocks on AVX2,
whole rows for tall or small products on AVX-512). Results against TF at
random shapes; the split each launch took is read from its launch profile."""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from disc_tf.runtime import isa
from tests import fresh_python

#: The RAL's CPU GEMM blocks and pool (cuda-emu runs GEMMs in its own cuBLAS).
pytestmark = pytest.mark.cpu_backend

REPO = pathlib.Path(__file__).resolve().parents[2]


_SCRIPT = """
import concurrent.futures, pathlib, sys
import numpy as np, tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(2)  # a caller and one worker
import disc_tf

rng = np.random.default_rng(0)
def var(*shape):
    return tf.Variable((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32))

class Model(tf.Module):
    def __init__(self):
        self.w1, self.b1 = var(64, 512), var(512)
        self.w2 = var(256, 256)
        self.w3, self.b3 = var(1024, 768), var(768)
        self.w4 = var(512, 768)
        self.wq, self.wk, self.wv = var(128, 128), var(128, 128), var(128, 128)
        self.w5, self.w6 = var(768, 768), var(768, 768)

    @tf.function(input_signature=[tf.TensorSpec([None, 64])])
    def dense(self, x):  # a loop epilogue (bias + ReLU)
        return tf.nn.relu(tf.matmul(x, self.w1) + self.b1)

    @tf.function(input_signature=[tf.TensorSpec([None, 64])])
    def dense_few(self, x):  # the same product (another cluster), first called with few rows
        return tf.nn.relu(tf.matmul(x, self.w1) - self.b1)

    @tf.function(input_signature=[tf.TensorSpec([None, 256])])
    def softmax(self, x):  # a row-wise epilogue: whole rows per block
        return tf.nn.softmax(tf.matmul(x, self.w2) * 0.5, axis=-1)

    @tf.function(input_signature=[tf.TensorSpec([None, 1024])])
    def wide(self, x):  # packed B of 786 K floats: over the row blocks' bound
        return tf.matmul(x, self.w3) + self.b3

    @tf.function(input_signature=[tf.TensorSpec([None, 512])])
    def mid(self, x):  # packed B of 393 K floats: within the bound, not small
        return tf.nn.relu(tf.matmul(x, self.w4))

    @tf.function(input_signature=[tf.TensorSpec([None, 128])])
    def qkv(self, x):  # three products of one A: one launch
        return tf.matmul(x, self.wq) * tf.matmul(x, self.wk) + tf.matmul(x, self.wv)

    @tf.function(input_signature=[tf.TensorSpec([None, 256])])
    def softmax_few(self, x):  # the softmax's product, first called with few rows
        return tf.nn.softmax(tf.matmul(x, self.w2) * 0.25, axis=-1)

    @tf.function(input_signature=[tf.TensorSpec([None, 128])])
    def qkv_few(self, x):  # the three products, first called with few rows
        return tf.matmul(x, self.wq) * tf.matmul(x, self.wk) - tf.matmul(x, self.wv)

    @tf.function(input_signature=[tf.TensorSpec([None, 1024])])
    def softmax_wide(self, x):  # a row-wise epilogue on a B over the row blocks' bound
        return tf.nn.softmax(tf.matmul(x, self.w3) * 0.25, axis=-1)

    @tf.function(input_signature=[tf.TensorSpec([None, 768])])
    def qkv_wide(self, x):  # three products of one A, 1.77 M floats of B together
        return tf.matmul(x, self.w5) * tf.matmul(x, self.w6) + tf.matmul(x, self.w6)

model = Model()
fns = ["dense", "dense_few", "softmax", "wide", "mid", "qkv", "softmax_few", "qkv_few",
       "softmax_wide", "qkv_wide"]
first = {"dense": 1000, "dense_few": 90, "softmax": 300, "wide": 200, "mid": 100, "qkv": 500,
         "softmax_few": 40, "qkv_few": 30, "softmax_wide": 300, "qkv_wide": 200}
jitted = {}
for name in fns:  # the first call's sizes are the profile's
    tf_fn = getattr(model, name)
    j = disc_tf.jit(tf_fn)
    assert j.report.compiled, (name, j.report)
    k = tf_fn.input_signature[0].shape[1]
    x = rng.standard_normal((first[name], k)).astype(np.float32)
    np.testing.assert_allclose(j(x).numpy(), tf_fn(x).numpy(), rtol=1e-4, atol=1e-4)
    jitted[name] = (tf_fn, j, k)

def check(name, m, seed):
    tf_fn, j, k = jitted[name]
    x = np.random.default_rng(seed).standard_normal((m, k)).astype(np.float32)
    np.testing.assert_allclose(j(x).numpy(), tf_fn(x).numpy(), rtol=1e-4, atol=1e-4)

# row counts around the block sizes; then many callers at once on the shared workers
sizes = [1, 5, 95, 96, 97, 191, 383, 1031, 2048]
for name in fns:
    for i, m in enumerate(sizes):
        check(name, m, i)
with concurrent.futures.ThreadPoolExecutor(6) as pool:
    jobs = [pool.submit(check, fns[i % len(fns)], int(m), i)
            for i, m in enumerate(np.random.default_rng(1).integers(1, 1500, 40))]
    for job in jobs:
        job.result()
assert disc_tf.stats()["fallbacks"] == 0
names = [p.read_text().strip() for p in pathlib.Path("/proc/self/task").glob("*/comm")]
print("WORKERS", names.count("disc_tf_worker"))
print("OK")
"""


def _run(tmp_path: pathlib.Path, gemm_isa: str = "avx2",
         **env: str) -> tuple[int, list[list[str]]]:
    """Runs the script on the GEMM block of ``gemm_isa``; returns its worker-thread
    count and launch-profile rows."""
    profile = tmp_path / "profile.txt"
    full = dict(os.environ, DISC_TF_GEMM_ISA=gemm_isa, DISC_TF_PROFILE=str(profile),
                PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2", **env)
    for unset in ("DISC_TF_TASK_POOL", "DISC_TF_SPIN_US"):
        if unset not in env:
            full.pop(unset, None)
    proc = fresh_python.run(["-c", _SCRIPT], env=full, timeout=600)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
    workers = int(next(line.split()[1] for line in proc.stdout.splitlines()
                       if line.startswith("WORKERS")))
    rows = [line.split() for line in profile.read_text().splitlines()[2:]]
    return workers, [r for r in rows if len(r) > 2 and r[2] == "gemm"]


def _blocks(rows: list[list[str]], sizes: str) -> str:
    """The ``blocks=RxC`` (and ``then rows``, for an epilogue after the product) of the
    GEMM launch whose first call had ``sizes`` (whether its epilogue ran on registers
    is not the split's business)."""
    row = next(r for r in rows if sizes in " ".join(r))
    start = next(i for i, w in enumerate(row) if w.startswith("blocks="))
    return " ".join(row[start:]).removesuffix(" on registers")


#: The launches every rule shares B's columns for, its row-wise epilogue after them.
_THEN_ROWS = {
    # fewer than 48 rows per thread: the threads share the columns (2 blocks of 128; Q, K
    # and V in 3 chunks of 128), the epilogue follows
    "m=40 n=256 k=256": "blocks=1x2 then rows",
    "shared A: 3 products m=30 k=128 n=384": "blocks=1x3 then rows",
    # a B over the row blocks' bound: a row cut would have each thread read all of B, so
    # columns (4 blocks wanted), the epilogue after; Q, K and V in 18 chunks of 128
    "m=300 n=768 k=1024": "blocks=1x4 then rows",
    "shared A: 3 products m=200 k=768 n=2304": "blocks=1x18 then rows",
}

#: Each rule's split of the script's first calls (launch sizes -> blocks=RxC), with why:
#: the AVX2 block on a core with 512 KiB of L2 ("avx2", measured on Zen 3), with 2 MiB
#: ("avx2_big_l2", Sapphire Rapids), and the AVX-512 block ("tall").
EXPECTED_BLOCKS = {
    "avx2": {
        # bias + ReLU at 1000 rows: 2 * ceil(1000 / 96) = 22 blocks of 42-48 rows (the
        # 167 6-row tiles shared, the last of 4 rows)
        "m=1000 n=512 k=64": "blocks=22x1",
        "m=90 n=512 k=64": "blocks=1x2",  # fewer than 2 blocks of 48 rows: columns
        "m=300 n=256 k=256": "blocks=8x1",  # softmax: whole rows
        "m=200 n=768 k=1024": "blocks=1x4",  # B over the bound: columns
        "m=100 n=768 k=512": "blocks=4x1",  # 2 * ceil(100 / 96) blocks of 25 -> 30 rows
        "shared A: 3 products m=500 k=128 n=384": "blocks=12x1",
        **_THEN_ROWS,
    },
    "avx2_big_l2": {
        "m=1000 n=512 k=64": "blocks=2x1",  # B in L2: one block of whole rows per thread
        "m=90 n=512 k=64": "blocks=1x2",  # fewer than 2 x 48 rows: columns
        "m=300 n=256 k=256": "blocks=2x1",  # softmax: whole rows, one block per thread
        "m=200 n=768 k=1024": "blocks=1x4",
        "m=100 n=768 k=512": "blocks=1x4",  # B of 393 K floats leaves L2's share: columns
        "shared A: 3 products m=500 k=128 n=384": "blocks=2x1",
        **_THEN_ROWS,
    },
    "tall": {
        "m=1000 n=512 k=64": "blocks=4x1",  # 2 blocks per thread: 250 -> 252 rows
        # B of 32 K floats: whole rows; 2 blocks wanted (2.9 M multiply-adds), 45 -> 48
        "m=90 n=512 k=64": "blocks=2x1",
        "m=300 n=256 k=256": "blocks=4x1",  # softmax: whole rows
        "m=200 n=768 k=1024": "blocks=1x4",  # B over the bound: columns
        "m=100 n=768 k=512": "blocks=1x4",  # B of 393 K floats, 100 < 768 / 2 rows: columns
        "shared A: 3 products m=500 k=128 n=384": "blocks=4x1",
        **_THEN_ROWS,
    },
}


def _assert_blocks(rows: list[list[str]], rule: str) -> None:
    for sizes, blocks in EXPECTED_BLOCKS[rule].items():
        assert _blocks(rows, sizes) == blocks, (rule, sizes)


@pytest.mark.skipif(isa.host_level() == "x86-64", reason="the AVX2 block needs AVX2+FMA")
@pytest.mark.parametrize("pool", ["spin", "sleep", "tf"])
def test_gemm_blocks_on_each_pool_match_tf(tmp_path, pool):
    """Every pool setting gives TF's answers, from one caller and from six at once;
    the RAL's own workers run unless DISC_TF_TASK_POOL=tf asks for TF's pool, and
    prepacked products of many rows are cut into row blocks of about 48 rows when
    their packed B is small, else columns first (the AVX2 block on a core with 512 KiB
    of L2)."""
    env = {"spin": {}, "sleep": {"DISC_TF_SPIN_US": "0"},
           "tf": {"DISC_TF_TASK_POOL": "tf"}}[pool]
    workers, rows = _run(tmp_path, DISC_TF_L2_BYTES=str(512 << 10), **env)
    assert workers == (0 if pool == "tf" else 1)
    _assert_blocks(rows, "avx2")


@pytest.mark.skipif(isa.host_level() == "x86-64", reason="the AVX2 block needs AVX2+FMA")
def test_avx2_block_with_a_big_l2_cuts_one_row_block_per_thread_of_a_small_b(tmp_path):
    """With 2 MiB of L2 (Sapphire Rapids) the AVX2 block gives each thread one block of
    whole rows where packed B is at most 256 K floats and there are at least 48 rows per
    thread; columns first otherwise (48-row blocks lost there: with a larger B, which
    comes from a slower L3 for every block, and inside a model with a small one)."""
    workers, rows = _run(tmp_path, DISC_TF_L2_BYTES=str(2 << 20))
    assert workers == 1
    _assert_blocks(rows, "avx2_big_l2")


@pytest.mark.skipif(isa.host_level() != "x86-64-v4", reason="the AVX-512 block needs AVX-512")
def test_avx512_cuts_tall_or_small_products_by_rows(tmp_path):
    """On AVX-512 a prepacked product with B within the bound is cut into whole rows,
    up to two blocks per thread, when it has at least 48 rows and either n / 2 rows
    or a B of at most 256 K floats; else columns first, as many blocks per thread."""
    workers, rows = _run(tmp_path, gemm_isa="avx512")
    assert workers == 1
    _assert_blocks(rows, "tall")


#: A process with a caller and one RAL worker, and ``dense``: a product they share.
_DENSE_PRELUDE = """
import json, os, pathlib, time
import numpy as np, tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(2)  # a caller and one worker
import disc_tf

rng = np.random.default_rng(0)
w = tf.Variable((rng.standard_normal((256, 256)) / 16).astype(np.float32))

@tf.function(input_signature=[tf.TensorSpec([None, 256])])
def dense(x):  # its product runs on the caller and the worker
    return tf.nn.relu(tf.matmul(x, w))
"""

_WAKE_SCRIPT = _DENSE_PRELUDE + """
@tf.function(input_signature=[tf.TensorSpec([None, 256])])
def affine(x):  # no product, and too small a loop for the pool
    return x * 2.0 + 1.0

def wakes(j, fn, rows):
    x = rng.standard_normal((rows, 256)).astype(np.float32)
    np.testing.assert_allclose(j(x).numpy(), fn(x).numpy(), rtol=1e-4, atol=1e-4)
    disc_tf.reset_stats()
    for _ in range(10):
        time.sleep(0.02)  # a worker polls for 200 us after its last job, then sleeps
        np.testing.assert_allclose(j(x).numpy(), fn(x).numpy(), rtol=1e-4, atol=1e-4)
    return disc_tf.stats()["pool_wakes"]

jd, ja = disc_tf.jit(dense, strict=True), disc_tf.jit(affine, strict=True)
# dense at 512 rows runs tasks on the worker; at 1 row (a 1 x 256 x 256 product) none
print("WAKES", wakes(jd, dense, 512), wakes(ja, affine, 2), wakes(jd, dense, 1),
      wakes(jd, dense, 600))
"""


@pytest.mark.parametrize("spin_us", ["200", "0"])
def test_a_call_wakes_the_sleeping_worker_when_a_call_as_large_used_it(tmp_path, spin_us):
    """A call of a cluster as large (in input elements) as one that ran tasks on the
    RAL's worker wakes it as the call starts, so that the worker polls by the first
    launch (a sleeping one took 50-100 us to wake, more than a small product); a
    smaller call, which runs every launch on its own thread, and a cluster that never
    used it wake nothing, and with DISC_TF_SPIN_US=0 (workers never poll) no call
    wakes one."""
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2",
               DISC_TF_SPIN_US=spin_us)
    env.pop("DISC_TF_TASK_POOL", None)
    proc = fresh_python.run(["-c", _WAKE_SCRIPT], env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("WAKES"))
    gemm_wakes, loop_wakes, one_row_wakes, larger_wakes = map(int, line.split()[1:])
    assert loop_wakes == 0
    assert one_row_wakes == 0
    if spin_us == "0":
        assert gemm_wakes == larger_wakes == 0
    else:  # 10 calls, each 20 ms after the last: the worker slept before (nearly) every one
        assert 5 <= gemm_wakes <= 10, gemm_wakes
        assert 5 <= larger_wakes <= 10, larger_wakes


_PIN_SCRIPT = _DENSE_PRELUDE + """
j = disc_tf.jit(dense, strict=True)
x = rng.standard_normal((512, 256)).astype(np.float32)
np.testing.assert_allclose(j(x).numpy(), dense(x).numpy(), rtol=1e-4, atol=1e-4)
for task in pathlib.Path("/proc/self/task").iterdir():
    if (task / "comm").read_text().strip() == "disc_tf_worker":
        print("WORKER", json.dumps(sorted(os.sched_getaffinity(int(task.name)))))
print("PROCESS", json.dumps(sorted(os.sched_getaffinity(0))))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning a worker needs two CPUs")
@pytest.mark.parametrize("pin", ["1", "0"])
def test_the_worker_runs_on_a_cpu_of_its_own_unless_told_not_to(pin):
    """The RAL's worker is pinned to one CPU of the process's (a worker free to move
    shared a core with its caller for milliseconds after each idle gap); with
    DISC_TF_PIN_WORKERS=0 it may run on any."""
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2",
               DISC_TF_PIN_WORKERS=pin)
    env.pop("DISC_TF_TASK_POOL", None)
    proc = fresh_python.run(["-c", _PIN_SCRIPT], env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    workers = [json.loads(x.split(" ", 1)[1]) for x in lines if x.startswith("WORKER ")]
    allowed = json.loads(next(x for x in lines if x.startswith("PROCESS")).split(" ", 1)[1])
    assert len(workers) == 1
    if pin == "1":
        assert len(workers[0]) == 1 and workers[0][0] in allowed
    else:
        assert workers[0] == allowed


_CHUNK_SCRIPT = """
import numpy as np, tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(2)  # a caller and one worker
import disc_tf

rng = np.random.default_rng(5)
# variables: packed once, as a model's weights are
w_pw = tf.Variable((rng.standard_normal((1, 1, 8, 96)) / 3).astype(np.float32))
w_sm = tf.Variable((rng.standard_normal((8, 96)) / 3).astype(np.float32))
scale = rng.uniform(0.5, 1.5, 96).astype(np.float32)

@tf.function(input_signature=[tf.TensorSpec([None, None, None, 8])])
def pointwise(x):  # an elementwise epilogue (MobileNetV2's 1 x 1 conv, batch norm, ReLU6)
    return tf.nn.relu6(tf.nn.conv2d(x, w_pw, 1, "SAME") * scale + 0.25)

@tf.function(input_signature=[tf.TensorSpec([None, 8])])
def softmax(x):  # a row-wise epilogue
    return tf.nn.softmax(tf.matmul(x, w_sm) * 0.5, axis=-1)

# first calls of 6000 rows: blocks of 1500 (AVX-512 block) or 3000 (AVX2 block) rows
for fn, shapes in ((pointwise, [(2, 60, 50, 8), (1, 7, 5, 8), (3, 41, 57, 8)]),
                   (softmax, [(6000, 8), (250, 8), (7100, 8)])):
    j = disc_tf.jit(fn, min_cluster_size=1, strict=True)
    for shape in shapes:
        x = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(j(x).numpy(), fn(x).numpy(), rtol=1e-4, atol=1e-5)
print("OK")
"""


@pytest.mark.parametrize("gemm_isa,l2_bytes,blocks,chunk_rows", [
    # C chunks of a quarter of L2 (in 6-row tiles of 96 columns) where a block's C is
    # over half of it: 8 K floats, 85 rows (84); 128 K floats, 1365 rows (1362)
    ("avx512", 128 * 1024, "4x1", 84),
    ("avx2", 2 << 20, "2x1", 1362),
])
def test_a_tall_block_of_a_small_b_runs_its_epilogue_by_rows_that_stay_in_l2(
        tmp_path, gemm_isa, l2_bytes, blocks, chunk_rows):
    """A block whose C would leave half of L2 before its epilogue reads it, while B's
    chunk is small, runs the GEMM and the epilogue on as many 6-row tiles as fit a
    quarter of L2, one chunk after another: an elementwise epilogue on each chunk's
    columns, a row-wise one on whole rows. The profile says so, and the answers are
    TF's at shapes whose blocks end in a short chunk."""
    if isa.host_level() == "x86-64" or (gemm_isa == "avx512"
                                        and isa.host_level() != "x86-64-v4"):
        pytest.skip(f"the {gemm_isa} block needs its ISA")
    profile = tmp_path / "profile.txt"
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2",
               DISC_TF_GEMM_ISA=gemm_isa, DISC_TF_L2_BYTES=str(l2_bytes),
               DISC_TF_PROFILE=str(profile),
               # the batch norm and ReLU6 as a pass, as any epilogue not of column steps
               # runs (on registers they need no chunks: test_register_epilogue.py)
               DISC_TF_REGISTER_EPILOGUE="0")
    for unset in ("DISC_TF_TASK_POOL", "DISC_TF_SPIN_US"):
        env.pop(unset, None)
    proc = fresh_python.run(["-c", _CHUNK_SCRIPT], env=env, timeout=600)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
    text = profile.read_text()
    assert text.count(f"prepacked blocks={blocks} epilogue by {chunk_rows} rows") == 2, text
