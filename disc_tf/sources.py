"""What a backend's code generator hands its compiler: a typed pair of sources."""

from __future__ import annotations

import dataclasses

#: The line separating the two sources in ``Sources.text`` (dumps, ``inspect``).
HOST_MARKER = "// ==== host runner (C++; the lines above are the device code, for nvcc) ===="


@dataclasses.dataclass(frozen=True)
class Sources:
    """The generated sources of one cluster for one target.

    ``device``: the kernels (C++ for the CPU, where it is also the host runner; CUDA
    for nvcc); ``host``: the host runner when it is a separate C++ source (CUDA).
    """

    target: str
    device: str
    host: str = ""

    @property
    def text(self) -> str:
        """Both sources as one text (device, marker line, host) for people to read;
        the CPU's is its one source."""
        if not self.host:
            return self.device
        return self.device + "\n" + HOST_MARKER + "\n" + self.host
