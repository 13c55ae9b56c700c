"""Signatures on compiled artifacts and the host's trust policy.

A DiscCluster node carries native code; loading it runs it. The op library
loads an embedded artifact only when one of the node's ``artifact_signatures``
vouches for it (``cc/kernels/artifact_trust.h`` checks them, in every loader):

* ``local:<hmac>``: HMAC-SHA256 under this user's private secret (the artifact
  cache's key file). Every artifact this user's compiler builds carries one, so
  what a user optimizes loads for that user without any key set up.
* ``ed25519:<key id>:<signature>``: by a key the host trusts
  (``$DISC_TF_TRUSTED_KEYS``, or ``trusted_keys`` of :func:`configure` and
  ``disc_tf.load``); ``optimize(..., signing_key=...)`` adds it.

Both sign :func:`message`, the artifact's SHA-256: they vouch that the key
holder's compiler built those bytes. The policy
(``$DISC_TF_ARTIFACTS``) picks what a node whose artifact nothing vouches for
does: ``trusted`` (default) rebuilds the cluster on this host; ``rebuild``
does the same and counts no Ed25519 signature (only this user's own artifacts
load); ``fallback`` runs TF's ops. See ``docs/serving.md``.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import hmac
import os
import pathlib
from collections.abc import Sequence

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

POLICIES = ("trusted", "rebuild", "fallback")
POLICY_VAR = "DISC_TF_ARTIFACTS"
KEYS_VAR = "DISC_TF_TRUSTED_KEYS"

#: A signing key: an Ed25519 private key, or the path of its PEM file.
SigningKey = ed25519.Ed25519PrivateKey | str | os.PathLike


def message(sha256: str) -> bytes:
    """What a signature signs: the artifact's hash."""
    return f"disc_tf artifact v1\n{sha256.lower()}\n".encode()


def key_id(public_key: ed25519.Ed25519PublicKey) -> str:
    """The 16-hex-digit id of a public key (a hash of its raw bytes)."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def local_signature(sha256: str) -> str:
    """The ``local:`` signature: an HMAC under this user's cache secret."""
    from disc_tf.runtime import cache

    mac = hmac.new(cache._hmac_secret(),  # noqa: SLF001 - the cache's secret
                    message(sha256), hashlib.sha256)
    return "local:" + mac.hexdigest()


def load_signing_key(key: SigningKey) -> ed25519.Ed25519PrivateKey:
    """``key`` itself, or the Ed25519 private key in the PEM file it names."""
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return key
    loaded = serialization.load_pem_private_key(pathlib.Path(key).read_bytes(), password=None)
    if not isinstance(loaded, ed25519.Ed25519PrivateKey):
        raise ValueError(f"{key} is not an Ed25519 private key")
    return loaded


def ed25519_signature(key: ed25519.Ed25519PrivateKey, sha256: str) -> str:
    """The ``ed25519:`` signature of an artifact by ``key``."""
    sig = key.sign(message(sha256))
    return f"ed25519:{key_id(key.public_key())}:{sig.hex()}"


def signatures(sha256: str,
               signing_key: ed25519.Ed25519PrivateKey | None = None) -> tuple[str, ...]:
    """The signatures a node built here carries: this user's, and ``signing_key``'s."""
    sigs = [local_signature(sha256)]
    if signing_key is not None:
        sigs.append(ed25519_signature(signing_key, sha256))
    return tuple(sigs)


def generate_key(private_path: str | os.PathLike, public_path: str | os.PathLike) -> str:
    """Writes a new Ed25519 key pair as PEM files (the private one 0600); returns its id."""
    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private)
    pathlib.Path(public_path).write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return key_id(key.public_key())


@functools.cache
def _ops_lib() -> ctypes.CDLL:
    from disc_tf.runtime import native

    # RTLD_NOLOAD: the copy TensorFlow loaded, whose policy the op reads.
    lib = ctypes.CDLL(str(native.load().ops_lib_path), mode=os.RTLD_NOLOAD | os.RTLD_LOCAL)
    lib.disc_trust_configure.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                         ctypes.c_int64]
    lib.disc_trust_configure.restype = ctypes.c_int32
    lib.disc_trust_check.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_int64]
    lib.disc_trust_check.restype = ctypes.c_int32
    lib.disc_trust_policy.restype = ctypes.c_char_p
    return lib


def configure(policy: str | None = None,
              trusted_keys: Sequence[str | os.PathLike] | None = None) -> None:
    """Sets this process's artifact policy and trusted public keys (PEM files),
    overriding ``$DISC_TF_ARTIFACTS`` / ``$DISC_TF_TRUSTED_KEYS``; None keeps one.

    Applies to DiscCluster nodes instantiated from now on.
    """
    if policy is not None and policy not in POLICIES:
        raise ValueError(f"artifact policy {policy!r} is not one of {POLICIES}")
    keys = None if trusted_keys is None else ":".join(os.fspath(k) for k in trusted_keys)
    error = ctypes.create_string_buffer(512)
    rc = _ops_lib().disc_trust_configure(policy.encode() if policy else None,
                                         keys.encode() if keys is not None else None,
                                         error, len(error))
    if rc != 0:
        raise ValueError(error.value.decode(errors="replace"))


def policy() -> str:
    """The policy in force: 'trusted', 'rebuild' or 'fallback'."""
    return _ops_lib().disc_trust_policy().decode()


def check(sha256: str, sigs: Sequence[str]) -> tuple[bool, str]:
    """Whether the op library would load this embedded artifact, and why (not)."""
    reason = ctypes.create_string_buffer(1024)
    ok = _ops_lib().disc_trust_check(sha256.encode(), "\n".join(sigs).encode(), reason,
                                     len(reason))
    return bool(ok), reason.value.decode(errors="replace")
