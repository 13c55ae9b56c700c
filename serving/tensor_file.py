"""The tensor files of ``serving/host/disc_serving_host.cc``: a sequence of float32
tensors, each ``int32 rank, int64 dims[rank], float32 data[]`` (little-endian).
A request is one tensor per signature input, a response one per output, in the
order of their signature keys, sorted."""

from __future__ import annotations

import pathlib
import struct
from collections.abc import Sequence

import numpy as np

Message = list[np.ndarray]


def write(path: pathlib.Path, messages: Sequence[Sequence[np.ndarray]]) -> None:
    """Writes ``messages`` (each a list of arrays) as one tensor file."""
    with open(path, "wb") as f:
        for message in messages:
            for array in message:
                a = np.ascontiguousarray(array, dtype="<f4")
                f.write(struct.pack(f"<i{a.ndim}q", a.ndim, *a.shape))
                f.write(a.tobytes())


def read(path: pathlib.Path, per_message: int) -> list[Message]:
    """Reads a tensor file as messages of ``per_message`` arrays."""
    data = pathlib.Path(path).read_bytes()
    arrays, pos = [], 0
    while pos < len(data):
        (rank,) = struct.unpack_from("<i", data, pos)
        shape = struct.unpack_from(f"<{rank}q", data, pos + 4)
        pos += 4 + 8 * rank
        count = int(np.prod(shape, dtype=np.int64))
        arrays.append(np.frombuffer(data, "<f4", count, pos).reshape(shape))
        pos += 4 * count
    if len(arrays) % per_message:
        raise ValueError(f"{path} does not hold whole messages of {per_message} tensors")
    return [arrays[i:i + per_message] for i in range(0, len(arrays), per_message)]
