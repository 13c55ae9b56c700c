"""Builds ``serving/host/disc_serving_host.cc`` against the TensorFlow pip wheel
(``make serving-host`` or ``python -m serving.build_host``).

The host links the wheel's ``libtensorflow_cc.so.2`` and
``libtensorflow_framework.so.2`` with TensorFlow's own compile flags
(``tf.sysconfig``: headers, ``-D_GLIBCXX_USE_CXX11_ABI``, C++17), as
``disc_tf/runtime/native_build.py`` builds the op library, and finds them
again through an rpath. The binary goes to
``serving/host/build/<key>/disc_serving_host``, where the key hashes the source,
the flags, the compiler and TensorFlow's version, so a build is reused until one
of them changes. Concurrent builds (pytest-xdist workers) wait on a file lock and
the binary is moved into place whole; builds of other keys are removed then.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator

HOST_DIR = pathlib.Path(__file__).resolve().parent / "host"
SOURCE = HOST_DIR / "disc_serving_host.cc"
BUILD_ROOT = HOST_DIR / "build"
BINARY_NAME = "disc_serving_host"


def compiler_command(source: pathlib.Path, output: pathlib.Path) -> list[str]:
    """The g++ command line that builds ``source`` into ``output``."""
    import tensorflow as tf

    tf_dir = pathlib.Path(tf.sysconfig.get_lib())
    cxx = os.environ.get("CXX", "g++")
    # gold reads libtensorflow_cc's 400k dynamic symbols in seconds, GNU ld in ~15 s
    linker = ["-fuse-ld=gold"] if shutil.which("ld.gold") else []
    return [cxx, "-std=c++17", "-O2", *tf.sysconfig.get_compile_flags(), str(source),
            "-o", str(output), *linker, f"-L{tf_dir}", "-l:libtensorflow_cc.so.2",
            "-l:libtensorflow_framework.so.2", f"-Wl,-rpath,{tf_dir}", "-ldl", "-pthread"]


def _compiler_version(cxx: str) -> str:
    out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False)
    return out.stdout


def build_key() -> str:
    """A hash of the source, the command line, the compiler and TensorFlow versions."""
    import tensorflow as tf

    command = compiler_command(SOURCE, pathlib.Path(BINARY_NAME))
    meta = {"command": command, "compiler": _compiler_version(command[0]),
            "tensorflow": tf.__version__}
    h = hashlib.sha256(json.dumps(meta, sort_keys=True).encode())
    h.update(SOURCE.read_bytes())
    return h.hexdigest()[:16]


@contextlib.contextmanager
def _lock(path: pathlib.Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def build_host(force: bool = False) -> pathlib.Path:
    """Returns the path of the host binary, building it unless an up-to-date one
    exists. Raises RuntimeError with the compiler's output if the build fails."""
    binary = BUILD_ROOT / build_key() / BINARY_NAME
    if binary.is_file() and not force:
        return binary
    with _lock(BUILD_ROOT / ".lock"):
        if binary.is_file() and not force:
            return binary  # another process built it while we waited
        binary.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".build-", dir=binary.parent) as tmp:
            out = pathlib.Path(tmp) / BINARY_NAME
            proc = subprocess.run(compiler_command(SOURCE, out), capture_output=True, text=True,
                                  check=False)
            if proc.returncode != 0:
                raise RuntimeError(f"building {SOURCE.name} failed:\n{proc.stdout}{proc.stderr}")
            os.replace(out, binary)
        for old in BUILD_ROOT.iterdir():  # builds of other sources or flags
            if old.is_dir() and old != binary.parent:
                shutil.rmtree(old, ignore_errors=True)
    return binary


def main() -> int:
    """Builds the host and prints its path."""
    print(build_host(force="--force" in sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
