"""The native build: an explicit step. Its stamp describes the sources the outputs
were built from; importing disc_tf never builds, warns about a stale build and
names the build command when there is none; a host without a compiler serves
optimized models; two environments never share (or rebuild) one build."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from disc_tf.runtime import native, native_build
from tests import fresh_python

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_source_edited_during_the_build_leaves_the_outputs_stale(tmp_path, monkeypatch):
    source, header = tmp_path / "op.cc", tmp_path / "edited.h"
    source.write_text('#include "edited.h"\n')
    header.write_text("// before\n")
    monkeypatch.setattr(native_build, "REPO_ROOT", tmp_path)
    config = dataclasses.replace(native_build.make_config(), ops_sources=(source,),
                                 py_sources=(), headers=(header,))
    before = config.stamp()

    def fake_compiler(cmd: list[str]) -> None:
        header.write_text("// edited while the compiler ran\n")
        out = pathlib.Path(cmd[cmd.index("-o") + 1])
        out.write_bytes(b"\x7fELF")

    monkeypatch.setattr(native_build, "_run", fake_compiler)
    out_dir = tmp_path / "native"
    out_dir.mkdir()
    native_build._build(config, out_dir)
    assert native_build.read_stamp(out_dir)["inputs"] == before
    assert not native_build.is_up_to_date(config, out_dir)  # the next build runs
    installed = native_build.include_dir(out_dir) / native_build.RAL_HEADER_NAME
    assert installed.read_bytes() == (
        native_build.CC_DIR / "ral" / native_build.RAL_HEADER_NAME).read_bytes()


def _copy_of_the_build(tmp_path: pathlib.Path) -> pathlib.Path:
    """This environment's build, copied under a directory of the same tag."""
    built = native.load().native_dir
    copy = tmp_path / built.name
    shutil.copytree(built, copy)
    return copy


def test_missing_libraries_raise_one_error_naming_the_build_command(tmp_path):
    with pytest.raises(native_build.NativeLibraryError,
                       match=r"not built .*python -m disc_tf\.runtime\.native_build"):
        native_build.check_built(tmp_path / native_build.env_tag())


def test_a_build_older_than_the_sources_warns_and_is_used(tmp_path):
    copy = _copy_of_the_build(tmp_path)
    assert native_build.check_built(copy) == []
    stamp = native_build.read_stamp(copy)
    (copy / native_build.STAMP_NAME).write_text(json.dumps(dict(stamp, sources="0" * 64)))
    (warning,) = native_build.check_built(copy)
    assert "other sources" in warning and "using them" in warning
    assert "python -m disc_tf.runtime.native_build" in warning
    (copy / native_build.STAMP_NAME).unlink()
    (warning,) = native_build.check_built(copy)
    assert "missing or unreadable" in warning


def test_a_build_for_another_tensorflow_is_refused(tmp_path):
    copy = _copy_of_the_build(tmp_path)
    stamp = native_build.read_stamp(copy)
    (copy / native_build.STAMP_NAME).write_text(json.dumps(dict(stamp, tf_version="2.0.0")))
    with pytest.raises(native_build.NativeLibraryError, match="built for tf_version '2.0.0'"):
        native_build.check_built(copy)


def test_environments_get_their_own_build_and_share_no_paths():
    assert native_build.native_dir("2.21.0") != native_build.native_dir("2.20.0")
    assert native_build.native_dir().name == native_build.env_tag(tf.__version__)
    config = native_build.make_config()
    elsewhere = dataclasses.replace(
        config,
        tf_compile_flags=tuple(f.replace("site-packages", "other-venv") for f in
                               config.tf_compile_flags),
        tf_link_flags=tuple(f.replace("site-packages", "other-venv") for f in
                            config.tf_link_flags),
        py_includes=("/elsewhere/include",))
    assert elsewhere.tf_compile_flags != config.tf_compile_flags
    assert elsewhere.stamp() == config.stamp()  # a second venv does not rebuild


_SERVE = """
import json, sys
import numpy as np
import tensorflow as tf
import disc_tf
model = tf.saved_model.load(sys.argv[1])
x = np.load(sys.argv[2])
np.testing.assert_allclose(model(x).numpy(), np.load(sys.argv[3]), rtol=1e-5, atol=1e-6)
print("STATS", json.dumps(disc_tf.stats()))
"""


def test_a_host_without_a_compiler_imports_and_serves_an_optimized_model(tmp_path):
    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
        def __call__(self, x):
            return tf.nn.softmax(tf.tanh(x) * 2.0 + 1.0)

    model = Model()
    tf.saved_model.save(model, str(tmp_path / "orig"))
    disc_tf.optimize(str(tmp_path / "orig"), str(tmp_path / "opt"), target="cpu")
    x = np.random.default_rng(0).standard_normal((5, 9)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", model(x).numpy())
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("DISC_TF_CXX", "CXX")}
    env.update(PATH=str(empty), PYTHONPATH=str(REPO), DISC_TF_CACHE_DIR=str(tmp_path / "cache"))
    assert shutil.which("g++", path=env["PATH"]) is None
    proc = fresh_python.run(["-c", textwrap.dedent(_SERVE), str(tmp_path / "opt"),
                            str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
                            env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "native_build" not in proc.stderr  # no stale-build warning, no build
    stats = json.loads(proc.stdout.split("STATS ", 1)[1])
    assert stats["compilations"] == 0 and stats["fallbacks"] == 0 and stats["clusters"] >= 1
