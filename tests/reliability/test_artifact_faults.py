"""An optimized SavedModel whose DiscCluster artifacts are damaged: the op runs its
fallback (the original ops), the outputs stay correct and nothing crashes."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import disc_tf
from tests import fresh_python
from tests.harness import assert_same
from tests.reliability import models

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def optimized(tmp_path_factory):
    root = tmp_path_factory.mktemp("artifact_faults")
    model, orig = models.save_original(root)
    report, _ = models.optimize(orig, root / "opt")
    assert len(report.compiled) == 1, report
    return model, root


@pytest.mark.fallback
def test_wrong_sha_in_the_node_runs_the_fallback(optimized, tmp_path) -> None:
    model, root = optimized
    bad = tmp_path / "wrong_sha"
    models.rewrite_artifacts(root / "opt", bad, lambda art, sha: (art, "0" * 64))
    loaded = tf.saved_model.load(str(bad))
    disc_tf.reset_stats()
    rng = np.random.default_rng(11)
    for calls, rows in enumerate((3, 0, 17, 1), start=1):
        x, y = models.inputs(rng, rows)
        assert_same(model(x, y), loaded(x, y), tf.float32)
        assert disc_tf.stats()["fallbacks"] == calls
    stats = disc_tf.stats()
    assert stats["clusters"] == 0 and stats["kernels"] == 0

    # The intact model, loaded next in the same process, runs compiled.
    good = tf.saved_model.load(str(root / "opt"))
    disc_tf.reset_stats()
    x, y = models.inputs(rng, 6)
    assert_same(model(x, y), good(x, y), tf.float32)
    assert disc_tf.stats()["fallbacks"] == 0


# Serves each damaged model in one fresh process (a crash must not take pytest down)
# and compares with the outputs of the original model. A line on stderr opens each
# case, so each case's warnings can be counted.
_SERVE = textwrap.dedent("""
    import json, sys, traceback
    import numpy as np
    import tensorflow as tf
    import disc_tf
    data = np.load(sys.argv[1])
    n = len([k for k in data.files if k.startswith("x")])
    for case, path in zip(sys.argv[2::2], sys.argv[3::2]):
        print("CASE", case, file=sys.stderr, flush=True)
        try:
            model = tf.saved_model.load(path)
            disc_tf.reset_stats()
            for i in range(n):
                got = model(data[f"x{i}"], data[f"y{i}"]).numpy()
                np.testing.assert_allclose(got, data[f"out{i}"], rtol=1e-5, atol=1e-6)
            print("STATS", case, json.dumps(disc_tf.stats()), flush=True)
        except Exception:
            print("ERROR", case, json.dumps(traceback.format_exc()), flush=True)
""")


def _with_sha(data: bytes) -> tuple[bytes, str]:
    return data, hashlib.sha256(data).hexdigest()


DAMAGE = {
    "garbage": lambda art, sha: _with_sha(b"\x00garbage, not an ELF file" * 37),
    "elf_header_only": lambda art, sha: _with_sha(art[:64]),
    "empty": lambda art, sha: _with_sha(b""),
    "truncated_elf": lambda art, sha: _with_sha(art[: len(art) // 3]),
}

# dlopen maps PT_LOAD segments that lie past the end of a truncated file, and the
# first touch of such a page is a SIGBUS: the loader checks the ELF headers
# against the size before dlopen ("truncated_elf" guards that).
ROWS = (2, 0, 31)


@pytest.fixture(scope="module")
def served(optimized, tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict, dict]:
    """Every damaged copy of the model served by one fresh process: the process, and
    per case its stats line (or error) and its part of stderr."""
    model, root = optimized
    tmp = tmp_path_factory.mktemp("damaged")
    rng = np.random.default_rng(12)
    arrays = {}
    for i, n in enumerate(ROWS):
        x, y = models.inputs(rng, n)
        arrays[f"x{i}"], arrays[f"y{i}"], arrays[f"out{i}"] = x, y, model(x, y).numpy()
    np.savez(tmp / "data.npz", **arrays)
    cases = []
    for case, damage in DAMAGE.items():
        models.rewrite_artifacts(root / "opt", tmp / case, damage)
        cases += [case, str(tmp / case)]
    env = dict(os.environ, PYTHONPATH=str(REPO), DISC_TF_CACHE_DIR=str(tmp / "cache"),
               DISC_TF_STRICT="0")  # a module fixture: the fallback mark's env is not set yet
    env.pop("DISC_TF_FORCE_FALLBACK", None)
    proc = fresh_python.run(["-c", _SERVE, str(tmp / "data.npz"), *cases],
                            env=env, timeout=300)
    results = {}
    for line in proc.stdout.splitlines():
        kind, _, rest = line.partition(" ")
        if kind in ("STATS", "ERROR"):
            case, _, payload = rest.partition(" ")
            results[case] = (kind, json.loads(payload))
    logs, case = {}, None
    for line in proc.stderr.splitlines():
        if line.startswith("CASE "):
            case = line[len("CASE "):]
            logs[case] = []
        elif case is not None:
            logs[case].append(line)
    return proc, results, {c: "\n".join(lines) for c, lines in logs.items()}


@pytest.mark.fallback
@pytest.mark.parametrize("case", list(DAMAGE))
def test_corrupt_bytes_with_matching_sha_fall_back_without_crashing(served, case):
    proc, results, logs = served
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-4000:]}"
    kind, stats = results[case]
    assert kind == "STATS", stats
    assert stats["fallbacks"] == len(ROWS), stats
    assert stats["clusters"] == 0 and stats["kernels"] == 0, stats
    # One warning for the damaged artifact, not one per call (an empty artifact means
    # "none": the op falls back silently).
    warnings = 0 if case == "empty" else 1
    assert logs[case].count("falling back") == warnings, logs[case][-4000:]
