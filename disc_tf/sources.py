"""What a backend's code generator hands its compiler: a typed pair of sources."""

from __future__ import annotations

import dataclasses
import re

#: The line separating the two sources in ``Sources.text`` (dumps, ``inspect``).
HOST_MARKER = "// ==== host runner (C++; the lines above are the kernels) ===="


@dataclasses.dataclass(frozen=True)
class SourceUnit:
    """One translation unit compiled on its own (a CPU kernel unit)."""

    name: str
    text: str
    #: hash of what its object code depends on (the text less its comments): the same
    #: kernel from another cluster or model has the same key, whatever its comments say
    content_key: str


@dataclasses.dataclass(frozen=True)
class Sources:
    """The generated sources of one cluster for one target.

    ``device``: the kernels (CUDA for nvcc; for the CPU, every kernel unit in one text,
    to read); ``host``: the host runner (C++); ``units``: the CPU's kernel units,
    compiled one by one and linked with the host runner.
    """

    target: str
    device: str
    host: str = ""
    units: tuple[SourceUnit, ...] = ()
    #: each kernel's own code (its functions), for the compile profile
    kernel_texts: tuple[str, ...] = ()
    #: CUDA: the ``__global__`` functions, in the order the host runner's launches index
    #: them, and the ``__device__`` globals (constant tensors) the runner looks up
    functions: tuple[str, ...] = ()
    device_globals: tuple[str, ...] = ()

    @property
    def size_bytes(self) -> int:
        """Bytes of generated code (both sources)."""
        return len(self.device.encode()) + len(self.host.encode())

    @property
    def distinct_kernels(self) -> int:
        """Kernels whose code differs other than in names and comments (the layers of
        a transformer give the same kernels under other names)."""
        return len({_unnamed(t) for t in self.kernel_texts})

    @property
    def text(self) -> str:
        """Both sources as one text (device, marker line, host) for people to read;
        the CPU's is its one source."""
        if not self.host:
            return self.device
        return self.device + "\n" + HOST_MARKER + "\n" + self.host


_KERNEL_NAME = re.compile(r"\b(?:spec_|Spec_)?[Kk]ernel\d+")
#: A ``//`` comment of generated code (to its line's end).
COMMENT = re.compile(r"//[^\n]*")


def _unnamed(text: str) -> str:
    """A kernel's code with its name and comments (TF op names) taken out."""
    return _KERNEL_NAME.sub("K", COMMENT.sub("", text))
