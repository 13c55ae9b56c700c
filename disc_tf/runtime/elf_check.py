"""Checks that bytes are a loadable artifact before anyone ``dlopen``s them.

A shared object whose segments lie past its end loads with ``dlopen`` and then
dies with SIGBUS on first touch; one without the entry points loads and is
useless. Both are refused here, from the ELF headers alone (no loading): every
program and section header lies inside the file, and the dynamic symbol table
exports the functions the runtime calls for the artifact's target. The
``DiscCluster`` op repeats the same checks in C++ (``artifact_loader.cc``).
"""

from __future__ import annotations

import struct

#: Functions an artifact of each target exports (C linkage).
REQUIRED_SYMBOLS = {
    "cpu": ("disc_abi_version", "disc_num_kernels", "disc_entry"),
    "cuda": ("disc_abi_version", "disc_num_kernels", "disc_cuda_entry"),
    "cuda-emu": ("disc_abi_version", "disc_num_kernels", "disc_entry", "disc_cuda_entry"),
}

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_PHDR = struct.Struct("<IIQQQQQQ")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
_PT_LOAD, _ET_REL, _ET_DYN, _SHT_DYNSYM = 1, 1, 3, 11


def _within(data: bytes, offset: int, length: int) -> bool:
    return 0 <= offset <= len(data) and 0 <= length <= len(data) - offset


def _header(data: bytes) -> tuple:
    """The ELF header fields of ``data``; ValueError unless it is 64-bit little-endian ELF."""
    if len(data) < _EHDR.size or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    return _EHDR.unpack_from(data)


def _sections(data: bytes, shoff: int, shentsize: int, shnum: int) -> list[tuple]:
    """The section headers; ValueError unless they and every section lie inside ``data``."""
    if shnum == 0 or shentsize != _SHDR.size or not _within(data, shoff, shnum * _SHDR.size):
        raise ValueError("section headers are missing or lie outside the file")
    sections = [_SHDR.unpack_from(data, shoff + i * _SHDR.size) for i in range(shnum)]
    for _, sh_type, _, _, offset, length, _, _, _, _ in sections:
        if sh_type != 8 and not _within(data, offset, length):  # 8: SHT_NOBITS (.bss)
            raise ValueError("a section lies outside the file (truncated?)")
    return sections


def exported_functions(data: bytes) -> set[str]:
    """Names of the functions ``data`` (a 64-bit little-endian ELF shared object)
    defines and exports. Raises ValueError naming what is wrong with it."""
    (_, e_type, _, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum,
     _) = _header(data)
    if e_type != _ET_DYN:
        raise ValueError("not a shared object")
    if phentsize != _PHDR.size or not _within(data, phoff, phnum * _PHDR.size):
        raise ValueError("program headers lie outside the file")
    for i in range(phnum):
        p_type, _, p_offset, _, _, p_filesz, _, _ = _PHDR.unpack_from(data, phoff + i * _PHDR.size)
        if p_type == _PT_LOAD and not _within(data, p_offset, p_filesz):
            raise ValueError("a loadable segment lies outside the file (truncated?)")
    sections = _sections(data, shoff, shentsize, shnum)
    names: set[str] = set()
    for _, sh_type, _, _, offset, length, link, _, _, entsize in sections:
        if sh_type != _SHT_DYNSYM:
            continue
        if entsize != _SYM.size or link >= shnum:
            raise ValueError("malformed dynamic symbol table")
        str_off, str_len = sections[link][4], sections[link][5]
        for at in range(offset, offset + length - _SYM.size + 1, _SYM.size):
            st_name, st_info, _, st_shndx, _, _ = _SYM.unpack_from(data, at)
            if st_shndx == 0 or st_info >> 4 not in (1, 2) or st_info & 0xF != 2:
                continue  # undefined, local, or not a function
            if st_name >= str_len:
                raise ValueError("a symbol name lies outside its string table")
            end = data.find(b"\0", str_off + st_name, str_off + str_len)
            names.add(data[str_off + st_name:end if end >= 0 else str_off + str_len].decode(
                "ascii", "replace"))
    return names


def artifact_problem(data: bytes, target: str) -> str | None:
    """Why ``data`` is not a loadable artifact of ``target`` (None if it is)."""
    try:
        exported = exported_functions(data)
    except ValueError as e:
        return str(e)
    missing = [s for s in REQUIRED_SYMBOLS.get(target, REQUIRED_SYMBOLS["cpu"]) if s not in exported]
    return f"does not export {', '.join(missing)}" if missing else None


def object_problem(data: bytes) -> str | None:
    """Why ``data`` is not a relocatable 64-bit ELF object (a kernel unit's compiled
    code, linked into an artifact) whose sections lie inside it; None if it is."""
    try:
        (_, e_type, _, _, _, _, shoff, _, _, _, _, shentsize, shnum, _) = _header(data)
        if e_type != _ET_REL:
            return "not a relocatable object"
        _sections(data, shoff, shentsize, shnum)
    except ValueError as e:
        return str(e)
    return None
