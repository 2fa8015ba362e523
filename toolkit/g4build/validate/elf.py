"""What an ELF shared library needs from the system: its machine and the symbol versions it binds to
(``.gnu.version_r``: ``GLIBC_2.17`` from ``libc.so.6``, ``GLIBCXX_3.4.29`` from ``libstdc++.so.6`` ...).

That is what a manylinux tag is justified by (PEP 600: a wheel tagged ``manylinux_2_X`` must run on any
distribution with glibc 2.X or newer), read the way auditwheel reads it: the version-needs section, not the
symbol table. Pure and bounded: every offset is checked against the data, so a hostile library is refused with
:class:`ElfFormatError` instead of reading out of range or looping.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

SHT_GNU_VERNEED = 0x6FFFFFFE
MACHINES = {62: "x86_64", 183: "aarch64", 3: "i686", 20: "ppc", 21: "ppc64", 22: "s390x"}
MAX_ENTRIES = 4096  # more version needs than any real library has: a loop or a lie
GLIBC = re.compile(r"GLIBC_([0-9]+)\.([0-9]+)(?:\.[0-9]+)?", re.ASCII)


class ElfFormatError(ValueError):
    """The data is not a well-formed ELF file (or lies about its own offsets)."""


@dataclass(frozen=True, kw_only=True)
class ElfNeeds:
    machine: str  # x86_64, aarch64 ... ("machine-<n>" for one this module does not name)
    versions: dict[str, tuple[str, ...]] = field(default_factory=dict)  # library -> version names it binds to

    @property
    def glibc(self) -> tuple[int, int] | None:
        """The newest glibc version any symbol is bound to (None: no GLIBC_ version at all)."""
        found = [(int(m[1]), int(m[2])) for names in self.versions.values() for n in names
                 if (m := GLIBC.fullmatch(n))]
        return max(found) if found else None

    def newest(self, prefix: str) -> str | None:
        """The newest version name with ``prefix`` (``GLIBCXX_``, ``CXXABI_``), compared numerically."""
        def key(name: str) -> tuple[int, ...]:
            return tuple(int(p) for p in re.findall(r"[0-9]+", name[len(prefix):], re.ASCII))
        names = [n for ns in self.versions.values() for n in ns if n.startswith(prefix)]
        return max(names, key=key) if names else None

    def to_dict(self) -> dict[str, object]:
        glibc = self.glibc
        return {"machine": self.machine, "glibc": f"{glibc[0]}.{glibc[1]}" if glibc else None,
                "glibcxx": self.newest("GLIBCXX_"), "needs": {k: list(v) for k, v in self.versions.items()}}


def _unpack(fmt: str, data: bytes, offset: int, what: str) -> tuple[int, ...]:
    size = struct.calcsize(fmt)
    if offset < 0 or offset + size > len(data):
        raise ElfFormatError(f"{what} at offset {offset} runs past the end ({len(data)} bytes)")
    return struct.unpack_from(fmt, data, offset)


def _string(data: bytes, table: tuple[int, int], index: int) -> str:
    start, size = table
    if index < 0 or index >= size:
        raise ElfFormatError(f"string index {index} outside its table of {size} bytes")
    end = data.find(b"\0", start + index, start + size)
    if end < 0:
        raise ElfFormatError("a string runs past the end of its table")
    return bytes(data[start + index:end]).decode("ascii", errors="replace")


def read_elf_needs(data: bytes) -> ElfNeeds:
    """The machine and the version needs of an ELF file (``data``: its bytes, or an mmap of them)."""
    if bytes(data[:4]) != b"\x7fELF" or len(data) < 64:
        raise ElfFormatError("not an ELF file")
    klass, order = data[4], data[5]
    if klass not in (1, 2) or order not in (1, 2):
        raise ElfFormatError(f"unknown ELF class {klass} or byte order {order}")
    e = "<" if order == 1 else ">"
    if klass == 2:
        (_, machine, _, _, _, shoff, _, _, _, _, shentsize, shnum, _) = _unpack(e + "HHIQQQIHHHHHH", data, 16, "header")
        sh_fmt = e + "IIQQQQIIQQ"
    else:
        (_, machine, _, _, _, shoff, _, _, _, _, shentsize, shnum, _) = _unpack(e + "HHIIIIIHHHHHH", data, 16, "header")
        sh_fmt = e + "IIIIIIIIII"
    if shnum and shentsize < struct.calcsize(sh_fmt):
        raise ElfFormatError(f"section header entries of {shentsize} bytes are too small")
    sections = []
    for i in range(shnum):
        _, sh_type, _, _, off, size, link, info, _, _ = _unpack(sh_fmt, data, shoff + i * shentsize, "section header")
        if off + size > len(data) and sh_type != 8:  # 8: SHT_NOBITS occupies no bytes in the file
            raise ElfFormatError(f"section {i} ({off}+{size}) runs past the end ({len(data)} bytes)")
        sections.append((sh_type, off, size, link, info))
    versions: dict[str, list[str]] = {}
    for sh_type, off, size, link, count in sections:
        if sh_type != SHT_GNU_VERNEED:
            continue
        if link >= len(sections) or count > MAX_ENTRIES:
            raise ElfFormatError(f"version needs name string table {link} of {len(sections)}, {count} entries")
        strtab = (sections[link][1], sections[link][2])
        at, seen = off, 0
        for _ in range(count):
            _, cnt, file_name, aux, nxt = _unpack(e + "HHIII", data, at, "version need")
            if at + 16 > off + size or cnt > MAX_ENTRIES:
                raise ElfFormatError("a version need lies outside its section")
            names = versions.setdefault(_string(data, strtab, file_name), [])
            vat = at + aux
            for _ in range(cnt):
                _, _, _, vname, vnext = _unpack(e + "IHHII", data, vat, "version need entry")
                names.append(_string(data, strtab, vname))
                seen += 1
                if seen > MAX_ENTRIES:
                    raise ElfFormatError(f"more than {MAX_ENTRIES} version needs")
                if not vnext:
                    break
                vat += vnext
            if not nxt:
                break
            at += nxt
    return ElfNeeds(machine=MACHINES.get(machine, f"machine-{machine}"),
                    versions={k: tuple(dict.fromkeys(v)) for k, v in versions.items()})
