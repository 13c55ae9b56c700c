"""``disc-tf inspect`` and ``disc-tf optimize`` on a small SavedModel.

The commands run as ``python -m disc_tf`` in a fresh process, as a user would
run them: nothing traced in the test process is visible there.
"""

from __future__ import annotations

import pathlib
import re
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from disc_tf import cli
from disc_tf.cluster import op_registry
from tests import fresh_python
from tests.harness import assert_same

REPO = pathlib.Path(__file__).resolve().parents[2]
RATIO = re.compile(r"^compiled compute ops: (\d+)/(\d+) \((\d+\.\d)%\)$", re.M)
TOTAL = re.compile(r"^serving path: (\d+) of (\d+) clusters compiled, [\d.]+% of serving "
                   r"compute ops \((\d+) of (\d+)\)$")

#: A same-shape float32 op the registry lacks (the first of these still missing).
_CANDIDATES = {
    "Cumsum": lambda x: tf.math.cumsum(x, axis=1),
    "Cumprod": lambda x: tf.math.cumprod(x, axis=1),
    "Atan": tf.atan,
    "Sin": tf.sin,
}
BARRIER_OP, barrier = next((op, fn) for op, fn in _CANDIDATES.items()
                           if op_registry.lookup(op) is None)


class _Model(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = tf.Variable(2.0)

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def inner(self, x):
        return barrier(x) * self.scale

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)] * 2)
    def f(self, x, y):
        z = tf.tanh(x * y + x)
        w = barrier(z)
        # The call keeps a function-call node in f's body.
        return {"out": tf.exp(w) * z + self.inner(y), "z": z}


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("cli") / "model"
    model = _Model()
    tf.saved_model.save(model, str(path), signatures={"serving_default": model.f})
    return path


def _disc_tf(*args: str) -> subprocess.CompletedProcess:
    return fresh_python.run(["-m", "disc_tf", *args], cwd=REPO,
                            timeout=120)


def _body_of_f(out: str) -> str:
    """The part of ``inspect`` output about the body of ``f``."""
    m = re.search(r"^body __inference_f_\d+ .*?(?=^body |\Z)", out, re.M | re.S)
    assert m, out
    return m.group(0)


def test_inspect_lists_clusters_reasons_and_ratio(saved_model) -> None:
    proc = _disc_tf("inspect", str(saved_model))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "not analysed" not in out, out
    f = _body_of_f(out)
    assert re.search(r"^  cluster disc_cluster_0: \d+ ops$", f, re.M)
    for line in ("op mul (Mul)", "op add (AddV2)", "op Tanh (Tanh)",
                 "input data x:0 float32[?,?]", "input data y:0 float32[?,?]",
                 "output Tanh:0 float32[?,?]"):
        assert line in f, f
    assert f"unsupported op {BARRIER_OP} (1): {BARRIER_OP}\n" in f
    assert re.search(r"non-compute ops \(\d+\): .*Placeholder x3.*StatefulPartitionedCall x1", f)
    # The barrier op stays out; the rest of f's compute ops lower.
    assert "front end: ok (" in f and "front end refused" not in f
    [(done, total, _)] = RATIO.findall(re.sub(r"^  ", "", f, flags=re.M))
    assert int(done) == int(total) - 1
    # The serving path's total line comes last.
    last = out.strip().splitlines()[-1]
    m = TOTAL.match(last)
    assert m and m.group(1) == m.group(2), last
    assert out.count(f"unsupported op {BARRIER_OP} (1)") == 2  # in f and in ``inner``
    assert "-- dhlo --" not in out


def test_inspect_until_codegen_shows_every_stage(saved_model) -> None:
    proc = _disc_tf("inspect", str(saved_model), "--until", "codegen")
    assert proc.returncode == 0, proc.stderr
    f = _body_of_f(proc.stdout)
    for marker in ("-- dhlo --", "stablehlo.tanh", "-- shape classes --", "# symbol classes",
                   "-- fusion plan --", "fusion plan for disc_cluster_0",
                   "-- generated source --"):
        assert marker in f, marker
    assert "stages failed" not in f


def test_inspect_in_process_until_fusion(saved_model, capsys) -> None:
    assert cli.main(["inspect", str(saved_model), "--until", "fusion"]) == 0
    out = capsys.readouterr().out
    assert "fusion plan for disc_cluster_0" in out
    assert "-- generated source --" not in out
    # the speculation branches: per-kernel versions and the no-broadcast plan
    assert "(+ broadcast version chosen at run time)" in out
    assert re.search(r"speculation: when s\d+ == broadcast\(s\d+, s\d+\)", out)


@pytest.mark.parametrize("command", ["inspect", "optimize"])
def test_rejects_what_is_not_a_saved_model(tmp_path, capsys, command) -> None:
    script = tmp_path / "model.py"
    script.write_text("print('not a model')\n")
    args = [command, str(script)] + ([str(tmp_path / "out")] if command == "optimize" else [])
    assert cli.main(args) == 2
    assert "is not a SavedModel directory" in capsys.readouterr().err
    assert cli.main(["inspect"]) == 2  # missing argument: usage error


def test_optimize_reports_each_cluster_and_output_matches(saved_model, tmp_path) -> None:
    out_dir = tmp_path / "optimized"
    proc = _disc_tf("optimize", str(saved_model), str(out_dir), "--target", "cpu")
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if "  disc_cluster_" in ln]
    for ln in lines:
        assert re.search(r"^__inference_\w+  disc_cluster_\d+  \d+ ops  front end \d+\.\d\ds, "
                         r"(C\+\+ \d+\.\d\ds \(\d+ units compiled, \d+ cached; slowest [\w ]+ "
                         r"\d+\.\d\ds\)|cache), \d+ KiB, "
                         r"\d+ kernels \(\d+ distinct\)$",
                         ln), ln
    assert sum(ln.startswith("__inference_f_") for ln in lines) == 2, proc.stdout
    n = len(lines)
    assert re.search(rf"^{n} of {n} clusters compiled, [\d.]+% of serving compute ops ",
                     proc.stdout, re.M), proc.stdout
    assert re.search(r"^compile profile: front end \d+\.\d\ds, C\+\+ \d+\.\d\ds \(\d+ of "
                     rf"{n} clusters from the cache(; kernel units: \d+ compiled, \d+ from the "
                     r"kernel cache)?\), \d+ KiB of code, \d+ kernels", proc.stdout,
                     re.M), proc.stdout
    assert f"[1/{n}] compiling disc_cluster_" in proc.stderr
    assert f"[{n}/{n}] compiling disc_cluster_" in proc.stderr

    original = tf.saved_model.load(str(saved_model))
    optimized = tf.saved_model.load(str(out_dir))
    rng = np.random.default_rng(7)
    for shape in [(1, 1), (0, 4), (3, 5), (1, 6), (5, 1)]:
        x = rng.standard_normal(shape).astype(np.float32)
        y = rng.standard_normal(shape).astype(np.float32)
        assert_same(original.f(x, y), optimized.f(x, y), tf.float32)
        sig_o, sig_n = original.signatures["serving_default"], optimized.signatures[
            "serving_default"]
        assert_same(sig_o(x=x, y=y), sig_n(x=x, y=y), tf.float32)
