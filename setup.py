"""pip install: the package, plus its native libraries built against the
installed TensorFlow (see disc_tf/runtime/native_build.py), plus
``disc_tf_autoload.pth``, which loads disc_tf after TensorFlow in any script
run with ``TF_DISC_ENABLE=1``."""

import importlib.util
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.editable_wheel import editable_wheel
except ImportError:  # setuptools without PEP 660 support
    editable_wheel = None

#: A .pth file at the top of a wheel lands in site-packages, where the
#: interpreter runs its import line at start-up.
PTH_FILE = "disc_tf_autoload.pth"
HERE = os.path.dirname(os.path.abspath(__file__))


class BuildPyWithNative(build_py):
    """Builds libdisc_tf_ops.so and _disc_py into the package."""

    def run(self) -> None:
        super().run()
        self.mkpath(self.build_lib)
        shutil.copyfile(os.path.join(HERE, PTH_FILE), os.path.join(self.build_lib, PTH_FILE))
        try:
            import tensorflow  # noqa: F401
        except ImportError:  # TensorFlow not importable in an isolated build env
            return
        # By path: importing the disc_tf package would load the libraries first.
        spec = importlib.util.spec_from_file_location(
            "disc_tf_native_build", os.path.join(HERE, "disc_tf", "runtime", "native_build.py"))
        native_build = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(native_build)
        native_build.build()


cmdclass = {"build_py": BuildPyWithNative}

if editable_wheel is not None:

    class _WithPth:
        """An editable-install strategy that also writes PTH_FILE into the wheel."""

        def __init__(self, inner):
            self._inner = inner

        def __call__(self, wheel, files, mapping):
            self._inner(wheel, files, mapping)
            with open(os.path.join(HERE, PTH_FILE), "rb") as f:
                wheel.writestr(PTH_FILE, f.read())

        def __enter__(self):
            self._inner.__enter__()
            return self

        def __exit__(self, *exc):
            return self._inner.__exit__(*exc)

    class EditableWheelWithPth(editable_wheel):
        """``pip install -e .``: the editable wheel carries PTH_FILE too."""

        def _select_strategy(self, *args, **kwargs):
            return _WithPth(super()._select_strategy(*args, **kwargs))

    cmdclass["editable_wheel"] = EditableWheelWithPth

setup(cmdclass=cmdclass)
