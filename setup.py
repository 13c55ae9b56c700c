"""pip install: the package, plus its native libraries built against the
installed TensorFlow (see disc_tf/runtime/native_build.py)."""

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithNative(build_py):
    """Builds libdisc_tf_ops.so and _disc_py into the package."""

    def run(self) -> None:
        super().run()
        try:
            from disc_tf.runtime import native_build
        except ImportError:  # TensorFlow not importable in an isolated build env
            return
        native_build.ensure_built()


setup(cmdclass={"build_py": BuildPyWithNative})
