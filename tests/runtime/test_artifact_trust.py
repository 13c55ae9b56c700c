"""The trust policy for artifacts embedded in SavedModels (``disc_tf/trust.py``).

The attack: replace a DiscCluster node's artifact with another shared object
whose constructor writes a file, and set ``artifact_sha256`` to its hash. Every
loader (``tf.saved_model.load``, a TF1 Session, ``disc_tf.load``, the
``TF_DISC_ENABLE`` graph pass) and every policy must run none of its code, and
still answer as TF does: rebuilt on this host, or TF's own ops.

Each case runs in a fresh process that stands for another host: its own empty
artifact cache and its own user secret, so that only Ed25519 signatures by keys
it trusts can vouch for what the model carries. The default suite runs one case
of each kind (rebuild, fallback policy, forced fallback, graph pass, signed);
``-m slow`` adds the other keys, policies and the background rebuild.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from disc_tf import trust
from tests import fresh_python
from tests.reliability import models as reliability_models

REPO = pathlib.Path(__file__).resolve().parents[2]

EVIL_SOURCE = r"""
#include <cstdio>
#include <cstdlib>
// Runs inside dlopen: the attack succeeds if this file appears.
__attribute__((constructor)) static void planted() {
  const char* path = std::getenv("DISC_TEST_MARKER");
  if (path == nullptr) return;
  if (FILE* f = std::fopen(path, "w")) { std::fputs("ran\n", f); std::fclose(f); }
}
extern "C" int disc_abi_version(void) { return 1; }
"""

# The child: loads a model with each loader, compares with TF at random shapes,
# and prints the op library's counters and whether the planted code ran.
CHILD = r"""
import json, os, sys
import numpy as np
import tensorflow as tf
import disc_tf
from disc_tf.enable import wait_for_compilations

model_dir, orig_dir, loaders = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
reference = tf.saved_model.load(orig_dir)
rng = np.random.default_rng(0)
feeds = [tuple(rng.standard_normal((n, 8)).astype(np.float32) for _ in range(2))
         for n in (1, 7, 130)]
want = [reference(x, y).numpy() for x, y in feeds]
disc_tf.reset_stats()
errors = {}
first = None

def check(name, outs):
    errors[name] = max(float(np.max(np.abs(o - w))) for o, w in zip(outs, want))

for loader in loaders:
    if loader == "saved_model":
        m = tf.saved_model.load(model_dir)
        check(loader, [m(x, y).numpy() for x, y in feeds])
    elif loader == "disc_load":
        m = disc_tf.load(model_dir)
        check(loader, [m(x, y).numpy() for x, y in feeds])
    elif loader == "session":
        with tf.Graph().as_default() as g, tf.compat.v1.Session(graph=g) as sess:
            mg = tf.compat.v1.saved_model.loader.load(sess, ["serve"], model_dir)
            sig = mg.signature_def["serving_default"]
            ins = [sig.inputs[k].name for k in sorted(sig.inputs)]
            out = next(iter(sig.outputs.values())).name
            check(loader, [sess.run(out, dict(zip(ins, f))) for f in feeds])
    elif loader == "async":  # the default compile mode: calls run TF ops while it builds
        m = tf.saved_model.load(model_dir)
        m(*feeds[0])
        assert wait_for_compilations(300)
        first = disc_tf.stats()
        disc_tf.reset_stats()
        check(loader, [m(x, y).numpy() for x, y in feeds])
print("RESULT " + json.dumps({"stats": disc_tf.stats(), "errors": errors, "first": first,
                              "ran": os.path.exists(os.environ["DISC_TEST_MARKER"])}))
"""

LOADERS = "saved_model,session,disc_load"


def _make_original(path: pathlib.Path) -> None:
    """Plain TF: two elementwise inputs and a variable, one cluster."""

    class OneCluster(tf.Module):
        def __init__(self) -> None:
            self.w = tf.Variable(np.linspace(-1.0, 1.0, 8).astype(np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32)] * 2)
        def __call__(self, x, y):
            return tf.tanh(x * self.w + y) * tf.sigmoid(x) - 0.5 * y

    tf.saved_model.save(OneCluster(), str(path))


def plant_artifact(src: pathlib.Path, dst: pathlib.Path, evil: bytes, signer=None) -> None:
    """``src`` with every artifact replaced by ``evil`` and its sha256 updated; the
    signatures stay those of the replaced bytes, plus ``signer``'s over ``evil``."""
    import shutil

    shutil.copytree(src, dst)
    sm = saved_model_pb2.SavedModel.FromString((src / "saved_model.pb").read_bytes())
    nodes = reliability_models.disc_nodes(sm)
    assert nodes
    sha = hashlib.sha256(evil).hexdigest()
    for n in nodes:
        n.attr["artifact"].s = evil
        n.attr["artifact_sha256"].s = sha.encode()
        if signer is not None:
            n.attr["artifact_signatures"].list.s.append(
                trust.ed25519_signature(signer, sha).encode())
    (dst / "saved_model.pb").write_bytes(sm.SerializeToString())
    (dst / "fingerprint.pb").unlink(missing_ok=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, pathlib.Path]:
    import disc_tf

    root = tmp_path_factory.mktemp("trust")
    _make_original(root / "orig")
    trust.generate_key(root / "vendor.pem", root / "vendor.pub")
    trust.generate_key(root / "attacker.pem", root / "attacker.pub")
    disc_tf.optimize(str(root / "orig"), str(root / "signed"), signing_key=root / "vendor.pem",
                     strict=True, quiet=True)
    (root / "evil.cc").write_text(EVIL_SOURCE)
    subprocess.run(["g++", "-shared", "-fPIC", str(root / "evil.cc"), "-o", str(root / "evil.so")],
                   check=True)
    evil = (root / "evil.so").read_bytes()
    attacker = trust.load_signing_key(root / "attacker.pem")
    plant_artifact(root / "signed", root / "planted", evil)
    plant_artifact(root / "signed", root / "planted_signed", evil, signer=attacker)
    host = root / "host"  # the other host's private state, shared by the cases
    host.mkdir(mode=0o700)
    return {"root": root, "orig": root / "orig", "signed": root / "signed",
            "planted": root / "planted", "planted_signed": root / "planted_signed",
            "vendor": root / "vendor.pub", "attacker": root / "attacker.pub", "host": host}


def _run(models: dict[str, pathlib.Path], model: str, loaders: str = LOADERS,
         **env: str) -> dict:
    marker = models["root"] / f"ran-{os.getpid()}-{model}-{len(env)}"
    marker.unlink(missing_ok=True)
    host = models["host"]
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("DISC_TF_TRUSTED_KEYS", "DISC_TF_ARTIFACTS", "TF_DISC_ENABLE",
                             "DISC_TF_FORCE_FALLBACK", "DISC_TF_TARGET")}
    full_env.update({"PYTHONPATH": str(REPO), "DISC_TEST_MARKER": str(marker),
                     "DISC_TF_CACHE_DIR": str(host / "cache"),
                     "DISC_TF_CACHE_KEY_FILE": str(host / "secret.key"),
                     "DISC_TF_COMPILE_MODE": "sync", **env})
    proc = fresh_python.run(["-c", CHILD, str(models[model]), str(models["orig"]),
                            loaders], env=full_env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    result["stderr"] = proc.stderr
    assert not marker.exists() and not result["ran"], "the planted artifact's code ran"
    for loader, err in result["errors"].items():
        assert err < 1e-4, (loader, err)
    assert set(result["errors"]) == set(loaders.split(","))
    return result


# ---- the attack, under every policy and loader


@pytest.mark.parametrize("keys", ["none", pytest.param("vendor", marks=pytest.mark.slow)])
def test_planted_artifact_is_rebuilt_not_loaded(models, keys):
    """Default policy: the cluster is compiled here and runs compiled (strict: no
    call may run TF's ops), the planted code never runs."""
    env = {"DISC_TF_STRICT": "1"}
    if keys == "vendor":
        env["DISC_TF_TRUSTED_KEYS"] = str(models["vendor"])
    r = _run(models, "planted", **env)
    assert r["stats"]["untrusted"] >= 1 and r["stats"]["rebuilds"] >= 1, r["stats"]
    assert r["stats"]["fallbacks"] == 0 and r["stats"]["clusters"] >= 1, r["stats"]
    assert "compiling the cluster on this host instead" in r["stderr"]


@pytest.mark.slow  # a fresh process of ~15 s; the default suite keeps one of each kind
def test_planted_artifact_signed_by_an_untrusted_key(models):
    r = _run(models, "planted_signed", DISC_TF_STRICT="1",
             DISC_TF_TRUSTED_KEYS=str(models["vendor"]))
    assert r["stats"]["rebuilds"] >= 1 and r["stats"]["fallbacks"] == 0, r["stats"]
    assert "is not trusted here" in r["stderr"]


@pytest.mark.slow  # a fresh process of ~15 s; the default suite keeps one of each kind
def test_planted_artifact_under_the_rebuild_policy(models):
    r = _run(models, "planted_signed", DISC_TF_STRICT="1", DISC_TF_ARTIFACTS="rebuild",
             DISC_TF_TRUSTED_KEYS=f"{models['vendor']}:{models['attacker']}")
    assert r["stats"]["rebuilds"] >= 1 and r["stats"]["fallbacks"] == 0, r["stats"]


def test_planted_artifact_under_the_fallback_policy(models):
    r = _run(models, "planted", DISC_TF_ARTIFACTS="fallback", DISC_TF_STRICT="0")
    assert r["stats"]["untrusted"] >= 1 and r["stats"]["rebuilds"] == 0, r["stats"]
    assert r["stats"]["fallbacks"] > 0 and r["stats"]["clusters"] == 0, r["stats"]


def test_planted_artifact_with_force_fallback(models):
    r = _run(models, "planted_signed", DISC_TF_FORCE_FALLBACK="1", DISC_TF_STRICT="0",
             DISC_TF_TRUSTED_KEYS=str(models["attacker"]))
    assert r["stats"]["clusters"] == 0 and r["stats"]["rebuilds"] == 0, r["stats"]
    assert r["stats"]["fallbacks"] > 0, r["stats"]


def test_planted_artifact_with_the_graph_pass_on(models):
    r = _run(models, "planted", "saved_model,session", TF_DISC_ENABLE="1", DISC_TF_STRICT="1")
    assert r["stats"]["rebuilds"] >= 1 and r["stats"]["fallbacks"] == 0, r["stats"]


@pytest.mark.slow  # a fresh process of ~15 s; the default suite keeps one of each kind
def test_planted_artifact_rebuilt_in_the_background(models):
    r = _run(models, "planted", "async", DISC_TF_COMPILE_MODE="async", DISC_TF_STRICT="0")
    assert r["first"]["rebuilds"] == 1 and r["first"]["untrusted"] == 1, r["first"]
    assert r["stats"]["fallbacks"] == 0, r["stats"]  # every call after the build: compiled


# ---- signed models


def test_signed_model_loads_with_zero_compiles_where_its_key_is_trusted(models):
    r = _run(models, "signed", DISC_TF_STRICT="1", DISC_TF_TRUSTED_KEYS=str(models["vendor"]))
    s = r["stats"]
    assert s["compilations"] == 0 and s["rebuilds"] == 0 and s["untrusted"] == 0, s
    assert s["clusters"] >= 1 and s["fallbacks"] == 0, s


@pytest.mark.slow  # a fresh process of ~15 s; the default suite keeps one of each kind
def test_signed_model_is_rebuilt_where_its_key_is_not_trusted(models):
    r = _run(models, "signed", DISC_TF_STRICT="1")
    assert r["stats"]["untrusted"] >= 1 and r["stats"]["rebuilds"] >= 1, r["stats"]
    assert r["stats"]["fallbacks"] == 0, r["stats"]


# ---- the checks themselves, in this process


def test_signatures_verify_only_for_their_bytes_and_keys(models, tmp_path):
    sha = hashlib.sha256(b"artifact").hexdigest()
    other = hashlib.sha256(b"other").hexdigest()
    vendor = trust.load_signing_key(models["root"] / "vendor.pem")
    attacker = trust.load_signing_key(models["root"] / "attacker.pem")
    trust.configure("trusted", [models["vendor"]])
    try:
        assert trust.check(sha, [trust.local_signature(sha)])[0]
        assert not trust.check(other, [trust.local_signature(sha)])[0]
        assert trust.check(sha, [trust.ed25519_signature(vendor, sha)])[0]
        ok, why = trust.check(sha, [trust.ed25519_signature(attacker, sha)])
        assert not ok and "is not trusted here" in why
        forged = trust.ed25519_signature(vendor, other).replace(
            trust.key_id(attacker.public_key()), trust.key_id(vendor.public_key()))
        assert not trust.check(sha, [forged])[0]
        assert not trust.check(sha, [])[0]
        assert not trust.check(sha, ["ed25519:xyz:00", "local:zz", "nonsense"])[0]
        trust.configure("rebuild")
        assert trust.policy() == "rebuild"
        assert not trust.check(sha, [trust.ed25519_signature(vendor, sha)])[0]
        assert trust.check(sha, [trust.local_signature(sha)])[0]
    finally:
        trust.configure("trusted", [])
    with pytest.raises(ValueError, match="not one of"):
        trust.configure("anything")
    bad = tmp_path / "bad.pub"
    bad.write_text("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
    with pytest.raises(ValueError, match="not a PEM Ed25519 public key"):
        trust.configure(None, [bad])


def test_keygen_writes_a_pair_the_host_accepts(tmp_path):
    from disc_tf import cli

    private, public = tmp_path / "k.pem", tmp_path / "k.pub"
    assert cli.main(["keygen", str(private), str(public)]) == 0
    assert private.stat().st_mode & 0o077 == 0
    key = trust.load_signing_key(private)
    sha = hashlib.sha256(b"x").hexdigest()
    try:
        trust.configure("trusted", [public])
        assert trust.check(sha, [trust.ed25519_signature(key, sha)])[0]
    finally:
        trust.configure("trusted", [])
    assert cli.main(["keygen", str(private), str(public)]) == 1  # never overwrites a key
