"""Builds the native part of disc_tf (an explicit step: ``make``, ``pip install``
or ``python -m disc_tf.runtime.native_build``; importing disc_tf never builds).

Outputs, all in ``disc_tf/_native/<environment tag>/`` (``cpython-311-tf2.21.0``:
the Python ABI and TensorFlow version they are built for, so that two virtual
environments sharing one checkout never rebuild each other's library):

* ``libdisc_tf_ops.so``: the DiscCluster op, its kernel, the TensorFlow-backed
  runtime abstraction layer, the artifact loader and the runtime counters
  (sources ``cc/ral/*.cc`` and ``cc/kernels/*.cc``);
* ``_disc_py<EXT_SUFFIX>``: a pybind11 module (``cc/python/disc_py.cc``)
  linked against ``libdisc_tf_ops.so`` (rpath ``$ORIGIN``) so both share the
  same counters;
* ``include/disc_ral.h``: the header generated cluster code compiles against;
* ``build.stamp`` (JSON): a hash of every input (sources, headers, flags,
  compiler, TensorFlow version; no paths of the environment), by which the build
  is skipped while it matches, and the hash of the sources alone, which
  ``check_built`` compares at import (a mismatch warns; it does not build).

The build is safe to run from several processes at once: it holds an
``fcntl`` lock on ``disc_tf/_native/.build.lock``, compiles into a temporary
directory and moves finished files into place with ``os.replace``.

Run ``python -m disc_tf.runtime.native_build`` to build by hand.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

logger = logging.getLogger("disc_tf.runtime")

PACKAGE_DIR = pathlib.Path(__file__).resolve().parent.parent
REPO_ROOT = PACKAGE_DIR.parent
CC_DIR = REPO_ROOT / "cc"
NATIVE_ROOT = PACKAGE_DIR / "_native"

OPS_LIB_NAME = "libdisc_tf_ops.so"
PY_MODULE_NAME = "_disc_py"
RAL_HEADER_NAME = "disc_ral.h"
STAMP_NAME = "build.stamp"
LOCK_NAME = ".build.lock"

_BASE_CXXFLAGS = ["-std=c++17", "-shared", "-fPIC", "-O2", "-w"]

#: Sources built for one ISA only (extra flags); the runtime checks the CPU
#: before calling into them. Their objects are linked last so that the
#: linker keeps the baseline copy of any inline function they share.
ISA_SOURCES = {
    "gemm_kernel_avx2.cc": ("-O3", "-mavx2", "-mfma"),
    "gemm_kernel_avx512.cc": ("-O3", "-mavx2", "-mfma", "-mavx512f", "-mavx512cd",
                              "-mavx512bw", "-mavx512dq", "-mavx512vl"),
}

#: Sources built with extra flags for every ISA: the Winograd transforms' loops over
#: channels are `omp simd` (GCC 12 left F(4, 3)'s and F(6, 3)'s scalar even at -O3: "no
#: vectype" for their loads).
SOURCE_FLAGS = {
    "conv_winograd.cc": ("-O3", "-fopenmp-simd"),
}


REBUILD_HINT = ("python -m disc_tf.runtime.native_build (or `make native` in a checkout, "
                "or `pip install .`)")


class NativeLibraryError(ImportError):
    """The native libraries for this environment are missing or unusable."""


def env_tag(tf_version: str | None = None) -> str:
    """What the native libraries are built for: Python ABI and TensorFlow version."""
    if tf_version is None:
        import tensorflow as tf

        tf_version = tf.__version__
    return f"{sys.implementation.cache_tag}-tf{tf_version}"


def native_dir(tf_version: str | None = None) -> pathlib.Path:
    """Directory of this environment's native libraries."""
    return NATIVE_ROOT / env_tag(tf_version)


def py_module_filename() -> str:
    """File name of the pybind11 module for this interpreter."""
    return PY_MODULE_NAME + (sysconfig.get_config_var("EXT_SUFFIX") or ".so")


def ops_lib_path(out_dir: pathlib.Path) -> pathlib.Path:
    """Path of the built op library."""
    return out_dir / OPS_LIB_NAME


def py_module_path(out_dir: pathlib.Path) -> pathlib.Path:
    """Path of the built pybind11 module."""
    return out_dir / py_module_filename()


def include_dir(out_dir: pathlib.Path) -> pathlib.Path:
    """Directory holding the installed copy of ``disc_ral.h``."""
    return out_dir / "include"


@dataclass(frozen=True)
class BuildConfig:
    """Everything that determines the build outputs."""

    cxx: str
    tf_compile_flags: tuple[str, ...]
    tf_link_flags: tuple[str, ...]
    tf_version: str
    py_includes: tuple[str, ...]
    ops_sources: tuple[pathlib.Path, ...]
    py_sources: tuple[pathlib.Path, ...]
    headers: tuple[pathlib.Path, ...]
    #: CUDA headers (cuda.h) the GPU DiscCluster kernel is built against; "" builds
    #: the op library without it
    cuda_include: str = ""

    def stamp(self) -> str:
        """A hash of all sources, flags and tool versions (no paths of the
        environment: two venvs with one TensorFlow version share the build)."""
        h = hashlib.sha256()
        meta = {
            "cxx": self.cxx,
            "cxx_version": _compiler_version(self.cxx),
            "base_flags": _BASE_CXXFLAGS,
            "isa_flags": ISA_SOURCES,
            "source_flags": SOURCE_FLAGS,
            "tf_compile_flags": _without_paths(self.tf_compile_flags),
            "tf_link_flags": _without_paths(self.tf_link_flags),
            "tf_version": self.tf_version,
            "ext_suffix": py_module_filename(),
            "gpu_kernel": bool(self.cuda_include),
        }
        h.update(json.dumps(meta, sort_keys=True).encode())
        h.update(self.sources_hash().encode())
        return h.hexdigest()

    def sources_hash(self) -> str:
        """A hash of the sources and headers alone."""
        return sources_hash(self.ops_sources + self.py_sources + self.headers)


def sources_hash(paths: Sequence[pathlib.Path]) -> str:
    """A hash of ``paths`` (names relative to the checkout, and contents)."""
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(b"\0" + str(path.relative_to(REPO_ROOT)).encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()


def _without_paths(flags: Sequence[str]) -> list[str]:
    """Compiler or linker flags without the include and library directories."""
    return [f for f in flags if not f.startswith(("-I", "-L", "-Wl,-rpath"))]


def _compiler_version(cxx: str) -> str:
    try:
        out = subprocess.run(
            [cxx, "--version"], capture_output=True, text=True, check=False
        )
    except OSError as e:
        return f"unavailable: {e}"
    return out.stdout.strip()


def _sources(pattern_dirs: Sequence[pathlib.Path], suffix: str) -> list[pathlib.Path]:
    files: list[pathlib.Path] = []
    for d in pattern_dirs:
        if d.is_dir():
            files.extend(sorted(d.glob(f"*{suffix}")))
    return files


_OPS_DIRS = (CC_DIR / "ral", CC_DIR / "kernels", CC_DIR / "ral_cuda")
_PY_DIRS = (CC_DIR / "python",)
#: Sources of the GPU DiscCluster kernel, built only against CUDA headers.
GPU_SOURCES = frozenset({"gpu_runner.cc", "disc_ral_cuda_impl.cc"})


def cuda_include_dir() -> str:
    """The directory holding ``cuda.h`` for the GPU kernel ("" if none, or if
    ``$DISC_TF_GPU_KERNEL=0``): ``$DISC_TF_CUDA_INCLUDE``, else next to nvcc, else
    ``/usr/local/cuda/include``. Only headers are needed: the CUDA driver and
    cuBLAS are loaded with dlopen when a GPU kernel first runs."""
    if os.environ.get("DISC_TF_GPU_KERNEL", "1") == "0":
        return ""
    candidates = [os.environ.get("DISC_TF_CUDA_INCLUDE", "")]
    nvcc = shutil.which(os.environ.get("DISC_TF_NVCC", "") or "nvcc")
    if nvcc:
        candidates.append(str(pathlib.Path(os.path.realpath(nvcc)).parents[1] / "include"))
    candidates.append("/usr/local/cuda/include")
    return next((c for c in candidates if c and (pathlib.Path(c) / "cuda.h").is_file()), "")


def checkout_sources() -> list[pathlib.Path]:
    """The native sources and headers of this checkout (none in an installed package)."""
    dirs = [*_OPS_DIRS, *_PY_DIRS]
    return _sources(dirs, ".cc") + _sources(dirs, ".h")


def make_config() -> BuildConfig:
    """Collects sources and compiler flags (imports TensorFlow and pybind11)."""
    import pybind11
    import tensorflow as tf

    ops_dirs, py_dirs = list(_OPS_DIRS), list(_PY_DIRS)
    cuda_include = cuda_include_dir()
    ops_sources = [p for p in _sources(ops_dirs, ".cc") if cuda_include or p.name not in GPU_SOURCES]
    py_includes = [pybind11.get_include(), sysconfig.get_paths()["include"]]
    plat_include = sysconfig.get_paths().get("platinclude")
    if plat_include and plat_include not in py_includes:
        py_includes.append(plat_include)
    return BuildConfig(
        cxx=os.environ.get("CXX", "g++"),
        tf_compile_flags=tuple(tf.sysconfig.get_compile_flags()),
        tf_link_flags=tuple(tf.sysconfig.get_link_flags()),
        tf_version=tf.__version__,
        py_includes=tuple(py_includes),
        ops_sources=tuple(ops_sources),
        py_sources=tuple(_sources(py_dirs, ".cc")),
        headers=tuple(_sources(ops_dirs + py_dirs, ".h")),
        cuda_include=cuda_include,
    )


def read_stamp(out_dir: pathlib.Path) -> dict:
    """The stamp of the build in ``out_dir`` (empty if missing or unreadable)."""
    try:
        stamp = json.loads((out_dir / STAMP_NAME).read_text())
    except (OSError, ValueError):
        return {}
    return stamp if isinstance(stamp, dict) else {}


def _outputs_exist(out_dir: pathlib.Path) -> bool:
    return (
        ops_lib_path(out_dir).is_file()
        and py_module_path(out_dir).is_file()
        and (include_dir(out_dir) / RAL_HEADER_NAME).is_file()
    )


def is_up_to_date(config: BuildConfig, out_dir: pathlib.Path) -> bool:
    """True if the outputs exist and were built from exactly these inputs."""
    return _outputs_exist(out_dir) and read_stamp(out_dir).get("inputs") == config.stamp()


def check_built(out_dir: pathlib.Path) -> list[str]:
    """Checks, without building, that ``out_dir`` holds libraries this process can
    load. Raises NativeLibraryError (naming the command that builds them) if they
    are missing or were built for another Python or TensorFlow; returns warnings
    for a build that is only older than the checkout's sources (it is used)."""
    if not _outputs_exist(out_dir):
        raise NativeLibraryError(
            f"disc_tf: the native libraries for this environment ({out_dir.name}) are not "
            f"built in {out_dir}; build them with: {REBUILD_HINT}")
    stamp = read_stamp(out_dir)
    for key, want in (("ext_suffix", py_module_filename()),
                      ("tf_version", out_dir.name.rsplit("-tf", 1)[-1])):
        if key in stamp and stamp[key] != want:
            raise NativeLibraryError(
                f"disc_tf: the native libraries in {out_dir} were built for {key} "
                f"{stamp[key]!r}, this environment has {want!r}; rebuild with: {REBUILD_HINT}")
    sources = checkout_sources()
    if not sources:
        return []  # an installed package: no sources to compare with
    if not stamp:
        return [f"disc_tf: {out_dir / STAMP_NAME} is missing or unreadable; using the native "
                f"libraries as they are (rebuild with: {REBUILD_HINT})"]
    if stamp.get("sources") != sources_hash(sources):
        return [f"disc_tf: the native libraries in {out_dir} were built from other sources "
                f"than the checkout's {CC_DIR}; using them as they are (rebuild with: "
                f"{REBUILD_HINT})"]
    return []


@contextlib.contextmanager
def _build_lock(native_dir: pathlib.Path) -> Iterator[None]:
    native_dir.mkdir(parents=True, exist_ok=True)
    with open(native_dir / LOCK_NAME, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _run(cmd: list[str]) -> None:
    logger.debug("running: %s", " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(
            f"native build command failed (exit {proc.returncode}):\n"
            f"{' '.join(cmd)}\n{proc.stdout}{proc.stderr}"
        )


ISA_SOURCES_OBJ = frozenset(pathlib.Path(n).stem + ".o" for n in ISA_SOURCES)


def _compile_flags(config: BuildConfig) -> list[str]:
    gpu = (["-DDISC_TF_GPU", f"-I{CC_DIR / 'ral'}", f"-I{config.cuda_include}"]
           if config.cuda_include else [])
    return [*_BASE_CXXFLAGS, f"-I{REPO_ROOT}", *gpu, *config.tf_compile_flags]


def _build(config: BuildConfig, native_dir: pathlib.Path) -> None:
    if not config.ops_sources:
        raise RuntimeError(f"no native sources found under {CC_DIR}")
    # What the outputs are built from, read before compiling: a source edited
    # while the build runs then leaves a stamp that no longer matches it (so the
    # next build runs again), never fresh-looking outputs of the old source.
    stamp = json.dumps({"inputs": config.stamp(), "sources": config.sources_hash(),
                        "tf_version": config.tf_version, "ext_suffix": py_module_filename()},
                       sort_keys=True)
    header = (CC_DIR / "ral" / RAL_HEADER_NAME).read_bytes()
    cflags = _compile_flags(config)
    py_cflags = cflags + [f"-I{p}" for p in config.py_includes]
    with tempfile.TemporaryDirectory(prefix=".build-", dir=native_dir) as tmp:
        tmp_dir = pathlib.Path(tmp)
        jobs: list[tuple[pathlib.Path, list[str]]] = []
        ops_objs: list[pathlib.Path] = []
        py_objs: list[pathlib.Path] = []
        for i, src in enumerate(config.ops_sources + config.py_sources):
            obj = tmp_dir / f"{i:02d}_{src.stem}.o"
            is_py = src in config.py_sources
            flags = py_cflags if is_py else [*cflags, *SOURCE_FLAGS.get(src.name, ()),
                                             *ISA_SOURCES.get(src.name, ())]
            jobs.append((obj, [config.cxx, *flags, "-c", str(src), "-o", str(obj)]))
            (py_objs if is_py else ops_objs).append(obj)
        ops_objs.sort(key=lambda o: o.name.split("_", 1)[1] in ISA_SOURCES_OBJ)
        workers = max(1, min(len(jobs), os.cpu_count() or 2))
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            for fut in [pool.submit(_run, cmd) for _, cmd in jobs]:
                fut.result()

        ops_out = tmp_dir / OPS_LIB_NAME
        _run([
            config.cxx, *_BASE_CXXFLAGS, *map(str, ops_objs), "-o", str(ops_out),
            *config.tf_link_flags, f"-Wl,-soname,{OPS_LIB_NAME}", "-ldl",
        ])
        py_out = tmp_dir / py_module_filename()
        _run([
            config.cxx, *_BASE_CXXFLAGS, *map(str, py_objs), "-o", str(py_out),
            str(ops_out), "-Wl,-rpath,$ORIGIN", *config.tf_link_flags,
        ])
        inc_tmp = tmp_dir / "include"
        inc_tmp.mkdir()
        (inc_tmp / RAL_HEADER_NAME).write_bytes(header)
        stamp_tmp = tmp_dir / STAMP_NAME
        stamp_tmp.write_text(stamp + "\n")

        # Move into place; the stamp goes last so an interrupted build is
        # never mistaken for a finished one.
        os.replace(ops_out, ops_lib_path(native_dir))
        os.replace(py_out, py_module_path(native_dir))
        include_dir(native_dir).mkdir(exist_ok=True)
        os.replace(inc_tmp / RAL_HEADER_NAME, include_dir(native_dir) / RAL_HEADER_NAME)
        os.replace(stamp_tmp, native_dir / STAMP_NAME)


def build(force: bool = False, out_dir: pathlib.Path | None = None) -> bool:
    """Builds the native outputs (into this environment's ``native_dir()`` unless
    ``out_dir`` is given) unless they are up to date.

    Returns True if a build ran. Raises RuntimeError if compiling fails or, for
    an installation without sources, if the prebuilt outputs are missing.
    """
    out_dir = out_dir or native_dir()
    if not (CC_DIR / "ral" / RAL_HEADER_NAME).is_file():
        if _outputs_exist(out_dir):
            return False  # installed package without sources: use prebuilt
        raise RuntimeError(
            f"disc_tf native sources not found under {CC_DIR} and no prebuilt "
            f"libraries in {out_dir}"
        )
    config = make_config()
    if not force and is_up_to_date(config, out_dir):
        return False
    with _build_lock(out_dir):
        if not force and is_up_to_date(config, out_dir):
            return False  # another process built it while we waited
        start = time.monotonic()
        logger.info("building disc_tf native libraries in %s", out_dir)
        _build(config, out_dir)
        logger.info("built disc_tf native libraries in %.1fs", time.monotonic() - start)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    start = time.monotonic()
    built = build(force=args.force)
    elapsed = time.monotonic() - start
    out_dir = native_dir()
    if built:
        print(f"built {ops_lib_path(out_dir)} and {py_module_path(out_dir)} in {elapsed:.1f}s")
    else:
        print(f"up to date: {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
