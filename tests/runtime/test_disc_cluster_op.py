"""Tests of the DiscCluster op with a hand-written cluster artifact."""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import subprocess
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from disc_tf import trust
from disc_tf.runtime import native
from tests import fresh_python

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

# out = a + b for two float32 inputs of the same shape (any rank).
ADD_SOURCE = textwrap.dedent(
    r"""
    #include <stdio.h>
    #include "disc_ral.h"

    #ifndef DISC_SALT
    #define DISC_SALT 0
    #endif

    typedef struct { const float* a; const float* b; float* out; } AddArgs;

    static void add_range(void* closure, int64_t begin, int64_t end) {
      AddArgs* args = (AddArgs*)closure;
      for (int64_t i = begin; i < end; ++i) {
        args->out[i] = args->a[i] + args->b[i];
      }
    }

    extern "C" {
    int32_t disc_abi_version(void) { return DISC_RAL_ABI_VERSION; }
    int32_t disc_num_kernels(void) { return 1 + DISC_SALT; }

    int32_t disc_entry(disc_ral* ral) {
      if (ral->num_inputs != 2 || ral->num_outputs != 1) {
        ral->set_error(ral, DISC_INTERNAL, "expected 2 inputs and 1 output");
        return 1;
      }
      if (ral->input_dtype(ral, 0) != DISC_F32 ||
          ral->input_dtype(ral, 1) != DISC_F32) {
        ral->set_error(ral, DISC_INVALID_ARGUMENT, "expected float32 inputs");
        return 1;
      }
      int32_t rank = ral->input_rank(ral, 0);
      if (ral->input_rank(ral, 1) != rank) {
        ral->set_error(ral, DISC_INVALID_ARGUMENT, "rank mismatch");
        return 1;
      }
      const int64_t* da = ral->input_dims(ral, 0);
      const int64_t* db = ral->input_dims(ral, 1);
      int64_t n = 1;
      for (int32_t d = 0; d < rank; ++d) {
        if (da[d] != db[d]) {
          char msg[160];
          snprintf(msg, sizeof msg, "shape mismatch at axis %d: %lld vs %lld",
                   d, (long long)da[d], (long long)db[d]);
          ral->set_error(ral, DISC_INVALID_ARGUMENT, msg);
          return 1;
        }
        n *= da[d];
      }
      float* out = (float*)ral->alloc_output(ral, 0, rank, da);
      if (out == NULL && n > 0) return 1;
      void* scratch = ral->alloc_temp(ral, 256);
      if (scratch == NULL || ((uintptr_t)scratch % 64) != 0) {
        ral->set_error(ral, DISC_INTERNAL, "bad scratch allocation");
        return 1;
      }
      ral->free_temp(ral, scratch);
      (void)ral->alloc_temp(ral, 0);  /* released at the end of the call */
      AddArgs args = {(const float*)ral->input_data(ral, 0),
                      (const float*)ral->input_data(ral, 1), out};
      ral->parallel_for(ral, n, 2.0, add_range, &args);
      return 0;
    }
    }  /* extern "C" */
    """
)

SPEC = tf.TensorSpec([None, None], tf.float32)


@pytest.fixture(scope="module")
def nat() -> native.Native:
    return native.load()


def _compile_artifact(out_dir: pathlib.Path, salt: int = 0) -> tuple[bytes, str]:
    src = out_dir / f"add_{salt}.cc"
    so = out_dir / f"add_{salt}.so"
    src.write_text(ADD_SOURCE)
    subprocess.run(
        ["g++", "-O2", "-shared", "-fPIC", f"-DDISC_SALT={salt}",
         f"-I{native.ral_include_dir()}", str(src), "-o", str(so)],
        check=True,
    )
    data = so.read_bytes()
    return data, hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def artifact(
    nat: native.Native, tmp_path_factory: pytest.TempPathFactory
) -> tuple[bytes, str]:
    return _compile_artifact(tmp_path_factory.mktemp("artifact"))


def _fallback_fn() -> tf.types.experimental.ConcreteFunction:
    @tf.function
    def original_add(a, b):
        return a + b

    return original_add.get_concrete_function(SPEC, SPEC)


def _make_cluster_fn(
    nat: native.Native, art: bytes, sha: str, name: str
) -> tf.types.experimental.PolymorphicFunction:
    fallback = _fallback_fn()

    @tf.function(input_signature=[SPEC, SPEC])
    def run(a, b):
        (out,) = nat.ops.disc_cluster(
            inputs=[a, b],
            Tout=[tf.float32],
            output_shapes=[tf.TensorShape([None, None])],
            artifact=art,
            artifact_sha256=sha,
            artifact_signatures=[trust.local_signature(sha)],
            fallback=fallback,
            cluster_name=name,
            num_kernels=1,
        )
        return out

    return run


def _rand(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


SHAPES = [(0, 0), (0, 5), (7, 0), (1, 1), (3, 17), (64, 33), (257, 129), (700, 301)]


def test_outputs_match_numpy(nat: native.Native, artifact: tuple[bytes, str]) -> None:
    fn = _make_cluster_fn(nat, *artifact, name="add_ok")
    rng = np.random.default_rng(0)
    nat.py.reset_stats()
    for shape in SHAPES:
        a, b = _rand(rng, shape), _rand(rng, shape)
        out = fn(a, b).numpy()
        assert out.shape == shape
        np.testing.assert_array_equal(out, a + b)
    assert nat.py.stats()["fallbacks"] == 0


def test_static_output_shape(nat: native.Native, artifact: tuple[bytes, str]) -> None:
    fn = _make_cluster_fn(nat, *artifact, name="add_shape")
    out = fn.get_concrete_function().structured_outputs
    assert out.shape.as_list() == [None, None]
    assert out.dtype == tf.float32


def test_shape_mismatch_is_invalid_argument(
    nat: native.Native, artifact: tuple[bytes, str]
) -> None:
    fn = _make_cluster_fn(nat, *artifact, name="add_mismatch")
    rng = np.random.default_rng(1)
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        fn(_rand(rng, (4, 5)), _rand(rng, (4, 6)))
    assert "DiscCluster 'add_mismatch'" in info.value.message
    assert "shape mismatch at axis 1" in info.value.message
    a, b = _rand(rng, (4, 6)), _rand(rng, (4, 6))
    np.testing.assert_array_equal(fn(a, b).numpy(), a + b)


@pytest.mark.parametrize(
    "case", ["wrong_sha", "empty_artifact", "not_a_shared_object"]
)
@pytest.mark.fallback
def test_fallback(
    nat: native.Native,
    artifact: tuple[bytes, str],
    case: str,
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DISC_TF_CACHE_DIR", str(tmp_path))
    art, sha = artifact
    if case == "wrong_sha":
        sha = "0" * 64
    elif case == "empty_artifact":
        art, sha = b"", ""
    else:
        art = b"definitely not an ELF file"
        sha = hashlib.sha256(art).hexdigest()
    fn = _make_cluster_fn(nat, art, sha, name=f"add_{case}")
    rng = np.random.default_rng(2)
    nat.py.reset_stats()
    for i, shape in enumerate([(3, 4), (0, 2), (50, 60)]):
        a, b = _rand(rng, shape), _rand(rng, shape)
        np.testing.assert_allclose(fn(a, b).numpy(), a + b)
        assert nat.py.stats()["fallbacks"] == i + 1
    stats = nat.py.stats()
    assert stats["clusters"] == 0 and stats["kernels"] == 0


def test_cluster_stats_counted_once_per_artifact(
    nat: native.Native, artifact: tuple[bytes, str]
) -> None:
    nat.py.reset_stats()
    rng = np.random.default_rng(3)
    a, b = _rand(rng, (2, 3)), _rand(rng, (2, 3))
    for name in ["add_stats_1", "add_stats_2"]:
        fn = _make_cluster_fn(nat, *artifact, name=name)
        for _ in range(3):
            np.testing.assert_array_equal(fn(a, b).numpy(), a + b)
    stats = nat.py.stats()
    assert stats["clusters"] == 1
    assert stats["kernels"] == 1
    assert stats["fallbacks"] == 0


def test_stats_python_api(nat: native.Native) -> None:
    nat.py.reset_stats()
    assert nat.py.note_cluster("f" * 64, 3) is True
    assert nat.py.note_cluster("f" * 64, 3) is False
    nat.py.add_stat("compilations", 2)
    nat.py.add_stat("cache_hits", 5)
    # temp_kept_bytes is a level (scratch kernels alive in this process keep), not a count
    kept = nat.py.stats()["temp_kept_bytes"]
    assert kept >= 0
    assert nat.py.stats() == {
        "clusters": 1, "compilations": 2, "cache_hits": 5, "fallbacks": 0, "kernels": 3,
        "peak_temp_bytes": 0, "packed_weights": 0, "untrusted": 0, "rebuilds": 0,
        "pool_wakes": 0, "resident_weight_gemms": 0, "masked_elements": 0,
        "temp_reuses": 0, "temp_kept_bytes": kept, "folded_reuses": 0,
        "register_epilogues": 0, "layer_blocks": 0,
    }
    with pytest.raises(KeyError):
        nat.py.add_stat("no_such_counter", 1)
    nat.py.reset_stats()
    after = nat.py.stats()
    assert after.pop("temp_kept_bytes") == kept  # reset leaves the level
    assert set(after.values()) == {0}
    assert nat.py.note_cluster("f" * 64, 3) is True  # counted again after reset
    nat.py.reset_stats()


def test_load_through_an_unnamed_file(
    nat: native.Native,
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without memfd the artifact is loaded from an O_TMPFILE file: it never has a
    name, so nothing can be swapped in between the write and the dlopen."""
    # A distinct artifact, so this process has not loaded it yet.
    art, sha = _compile_artifact(tmp_path, salt=7)
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setenv("DISC_TF_NO_MEMFD", "1")
    nat.py.reset_stats()
    fn = _make_cluster_fn(nat, art, sha, name="add_file")
    rng = np.random.default_rng(4)
    a, b = _rand(rng, (5, 9)), _rand(rng, (5, 9))
    np.testing.assert_array_equal(fn(a, b).numpy(), a + b)
    assert list(tmp.iterdir()) == []  # loaded, and no name was ever visible
    stats = nat.py.stats()
    assert stats["fallbacks"] == 0 and stats["clusters"] == 1


_LOAD_SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import tensorflow as tf
    from disc_tf.runtime import native
    nat = native.load()
    nat.py.reset_stats()
    m = tf.saved_model.load(sys.argv[1])
    rng = np.random.default_rng(5)
    for shape in [(3, 4), (0, 7), (128, 65)]:
        a = rng.standard_normal(shape).astype(np.float32)
        b = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(m.add(a, b).numpy(), a + b)
    s = nat.py.stats()
    print("STATS", s["clusters"], s["kernels"], s["fallbacks"])
    """
)


@pytest.mark.fallback
def test_saved_model_roundtrip(
    nat: native.Native, artifact: tuple[bytes, str], tmp_path: pathlib.Path
) -> None:
    module = tf.Module()
    module.add = _make_cluster_fn(nat, *artifact, name="add_saved")
    export_dir = tmp_path / "saved"
    tf.saved_model.save(module, str(export_dir))

    script = tmp_path / "load.py"
    script.write_text(_LOAD_SCRIPT)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(REPO_ROOT), env.get("PYTHONPATH", "")] if p
    )
    env["DISC_TF_CACHE_DIR"] = str(tmp_path / "cache")
    env.pop("DISC_TF_FORCE_FALLBACK", None)
    for force, expected in [(False, "STATS 1 1 0"), (True, "STATS 0 0 3")]:
        if force:
            env["DISC_TF_FORCE_FALLBACK"] = "1"
        proc = fresh_python.run(
            [str(script), str(export_dir)],
            env=env, timeout=300
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert expected in proc.stdout, proc.stdout


@pytest.mark.fallback
def test_load_failure_warns_once(
    nat: native.Native,
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("DISC_TF_CACHE_DIR", str(tmp_path))
    art = b"another broken artifact"
    sha = hashlib.sha256(art).hexdigest()
    rng = np.random.default_rng(6)
    a, b = _rand(rng, (2, 2)), _rand(rng, (2, 2))
    for _ in range(2):  # two functions => two kernels for one cluster artifact
        fn = _make_cluster_fn(nat, art, sha, name="add_warn_once")
        np.testing.assert_allclose(fn(a, b).numpy(), a + b)
    err = capfd.readouterr().err
    assert err.count("DiscCluster 'add_warn_once': falling back") == 1, err
