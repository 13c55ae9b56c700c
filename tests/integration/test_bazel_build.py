"""The Bazel build of the serving library (slow: a cold build takes minutes).

Builds ``//cc:disc_tf_ops`` (what a model server links, alwayslink) and its
shared-object form with Bazel against the pip TensorFlow, offline, exactly as
``docs/serving.md`` says; then loads the shared object into TensorFlow in a
fresh process and checks that the DiscCluster op, its CPU kernel and the
graph pass are there.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
TARGETS = ["//cc:disc_tf_ops", "//cc:libdisc_tf_ops_bazel.so"]

_CHECK = textwrap.dedent(
    """
    import sys
    import tensorflow as tf
    from tensorflow.python.framework import kernels, op_def_registry
    lib = tf.load_op_library(sys.argv[1])
    assert op_def_registry.get("DiscCluster") is not None
    assert op_def_registry.get("DiscCall") is not None  # disc_tf.load's direct calls
    devices = {k.device_type for k in kernels.get_registered_kernels_for_op("DiscCluster").kernel}
    assert devices == {"CPU"}, devices
    attrs = {a.name for a in op_def_registry.get("DiscCluster").attr}
    assert {"artifact", "artifact_sha256", "fallback", "pending_key"} <= attrs, attrs
    print("OK")
    """
)


def test_the_bazel_build_names_every_cpu_source():
    # cc/BUILD names the library's files one by one (Bazel rejects an undeclared
    # inclusion), where the native build globs them: a file added to cc/kernels or cc/ral
    # must be added there too. The CPU build leaves out the CUDA runner.
    build = (REPO / "cc" / "BUILD").read_text()
    named = set(re.findall(r'"((?:kernels|ral)/[\w./%]+)"', build))
    isas = re.findall(r'\("(\w+)", \[', build)  # the GEMM blocks' rules, one per ISA
    named |= {n.replace("%s", isa) for n in named if "%s" in n for isa in isas}
    files = {f"{d}/{p.name}" for d in ("kernels", "ral") for p in (REPO / "cc" / d).iterdir()
             if p.suffix in (".cc", ".h") and "cuda" not in p.name and "gpu_" not in p.name}
    assert sorted(files - named) == [], "add them to cc/BUILD"


def _bazel() -> str:
    found = shutil.which("bazel")
    if found is None:
        pytest.fail("bazel is not installed (Debian: apt-get install bazel-bootstrap); "
                    "see docs/serving.md")
    return found


def _output_root() -> pathlib.Path:
    """Kept between runs, so only the first build is cold."""
    base = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache"))
    return base / "disc_tf_bazel"


@pytest.mark.slow
def test_bazel_builds_the_serving_library_offline():
    bazel = _bazel()
    env = dict(os.environ, DISC_TF_PYTHON_BIN=sys.executable, TF_CPP_MIN_LOG_LEVEL="3")
    startup = [bazel, f"--output_user_root={_output_root()}"]
    try:
        build = subprocess.run([*startup, "build", *TARGETS], cwd=REPO, env=env,
                               capture_output=True, text=True, timeout=3000)
        info = subprocess.run([*startup, "info", "-c", "opt", "bazel-bin"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=600)
    finally:  # no Bazel server left running after the test
        subprocess.run([*startup, "shutdown"], cwd=REPO, env=env, capture_output=True,
                       timeout=300)
    assert build.returncode == 0, build.stderr[-6000:]
    assert "Download from" not in build.stderr  # nothing was fetched
    assert info.returncode == 0, info.stderr[-3000:]
    bin_dir = pathlib.Path(info.stdout.strip())
    assert (bin_dir / "cc" / "libdisc_tf_ops.lo").is_file() or \
        (bin_dir / "cc" / "libdisc_tf_ops.a").is_file(), sorted(os.listdir(bin_dir / "cc"))
    shared = bin_dir / "cc" / "libdisc_tf_ops_bazel.so"
    assert shared.is_file()
    assert b"DiscClusterPass" in shared.read_bytes()  # the graph pass is linked in
    env.pop("TF_DISC_ENABLE", None)
    check = subprocess.run([sys.executable, "-c", _CHECK, str(shared)], env=env,
                           capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr[-3000:]
    assert check.stdout.strip().endswith("OK")
