"""The CPU backend's kernel units: each distinct kernel's code once, named by its content.

The layers of a transformer give the same kernels under other names. Every kernel
is emitted under a placeholder name; kernels whose code is then the same but for
comments (the TF ops they fuse) share one unit, whose functions and structs are
named ``<kind>_<hash of the code>``. The same kernel in another cluster or model
gets the same name and code, so its object file comes from the kernel cache
(``runtime/cpu_build.py``). Each unit is its own translation unit; the host runner
includes its ``interface`` (the argument structs and entry point declarations).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re

from disc_tf.sources import COMMENT

#: The name every kernel is emitted under before its content names it.
PLACEHOLDER = "disc_kfn"

_STRUCT = re.compile(r"^struct \w+ \{\n.*?^\};$", re.M | re.S)
_ENTRY = re.compile(r"^(?:DISC_CLONES )?DISC_ENTRY void (\w+)\(([^)]*)\)", re.M)
_HASH_CHARS = 10


def code_key(code: str) -> str:
    """The code without its comments (kept whole if it holds a string literal, where
    ``//`` need not start a comment): what its object file depends on."""
    return code if '"' in code else COMMENT.sub("", code)


@dataclasses.dataclass(frozen=True)
class KernelUnit:
    """One distinct kernel's code, and the planned kernels that run it."""

    name: str
    kernels: tuple[str, ...]
    code: str

    @property
    def interface(self) -> str:
        """What the host runner needs of the unit: its argument structs and the
        declarations of its entry points."""
        structs = [m.group(0) for m in _STRUCT.finditer(self.code)]
        decls = [f"DISC_ENTRY void {fn}({' '.join(params.split())});"
                 for fn, params in _ENTRY.findall(self.code)]
        return "\n".join([f"// {self.name}: {', '.join(self.kernels)}", *structs, *decls])


def _named(text: str, name: str) -> str:
    return text.replace(PLACEHOLDER, name).replace(PLACEHOLDER.capitalize(), name.capitalize())


def share(emitters: list, texts: list[str]) -> list[KernelUnit]:
    """The units of ``emitters`` (whose ``texts`` were emitted under ``PLACEHOLDER``),
    in first-use order; renames each emitter (``fn``) to its unit's name, so that its
    launch lines call the shared code. Emitters without code (library calls) are in
    no unit."""
    units: dict[str, tuple[str, list[str], str]] = {}  # name -> (key, kernels, code)
    for em, text in zip(emitters, texts):
        if "DISC_ENTRY" not in text:
            continue
        key = code_key(text)
        digest = hashlib.sha256(key.encode()).hexdigest()
        size = _HASH_CHARS
        name = f"{em.k.kind}_{digest[:size]}"
        while name in units and units[name][0] != key:  # a clash of short hashes
            size += 2
            name = f"{em.k.kind}_{digest[:size]}"
        em.fn = name
        if name in units:
            units[name][1].append(em.k.name)
        else:
            units[name] = (key, [em.k.name], _named(text, name))
    return [KernelUnit(name, tuple(kernels), code) for name, (_, kernels, code) in units.items()]
