"""What an ELF shared library needs from the system: its machine and the symbol versions it binds to
(``.gnu.version_r``: ``GLIBC_2.17`` from ``libc.so.6``, ``GLIBCXX_3.4.29`` from ``libstdc++.so.6`` ...).

That is what a manylinux tag is justified by (PEP 600: a wheel tagged ``manylinux_2_X`` must run on any
distribution with glibc 2.X or newer), read as auditwheel reads it: through pyelftools, from the version-needs
section. pyelftools trusts the file's offsets and counts, so every one it would follow is held to our limits
first (file size, section count and sizes, entries, name lengths; a NOBITS table is refused), and no read runs
longer than ``MAX_RUN`` bytes: a hostile library is an :class:`ElfFormatError`, never a hang or a traceback.
"""

from __future__ import annotations

import io
import mmap
from dataclasses import dataclass, field
from typing import Any, BinaryIO, cast

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSegment
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection

from g4build.validate.manylinux import ForgedVersion, Policy, parse_need, policy

MACHINES = {"EM_X86_64": "x86_64", "EM_AARCH64": "aarch64", "EM_386": "i686", "EM_PPC": "ppc", "EM_PPC64": "ppc64",
            "EM_S390": "s390x"}
MAX_FILE = 8 << 30  # as a wheel's members in all (wheelfile.safety.MAX_TOTAL)
MAX_SECTIONS = 0xFF00  # SHN_LORESERVE: a shared library never needs extended section numbering
MAX_NEEDS_BYTES = 1 << 20  # .gnu.version_r: 16-byte entries; torch's is under 1 KiB
MAX_STRTAB = 256 << 20  # .dynstr: libtorch_cuda's is a few MiB
MAX_ENTRIES = 4096  # more version needs than any real library has: a loop or a lie
MAX_NAME = 256  # a library or version name ("GLIBCXX_3.4.30", "libstdc++.so.6")
MAX_RUN = 64 << 10  # bytes pyelftools may read after one seek (a string without its NUL stops here)


class ElfFormatError(ValueError):
    """The data is not a well-formed ELF file (or lies about its own offsets)."""


@dataclass(frozen=True, kw_only=True)
class ElfNeeds:
    machine: str  # x86_64, aarch64 ... ("machine-<n>" for one this module does not name)
    versions: dict[str, tuple[str, ...]] = field(default_factory=dict)  # library -> version names it binds to

    @property
    def names(self) -> set[str]:
        return {n for names in self.versions.values() for n in names}

    @property
    def glibc_needed(self) -> tuple[int, ...] | None:
        """The newest ``GLIBC_`` version a symbol is bound to (None: none). ForgedVersion for a forged one."""
        found = [v for n in self.names if (p := parse_need(n)) is not None and p[0] == "GLIBC" for v in (p[1],)]
        return max(found) if found else None

    def policy(self, arch: str | None = None) -> Policy:
        """The oldest manylinux glibc every versioned need allows (validate.manylinux) on its own machine."""
        return policy(self.names, arch or self.machine)

    def newest(self, prefix: str) -> str | None:
        """The newest numeric version name with ``prefix`` (``GLIBCXX_``, ``CXXABI_``)."""
        found = [(p[1], n) for n in self.names if n.startswith(prefix) and (p := parse_need(n)) is not None]
        return max(found)[1] if found else None

    def to_dict(self) -> dict[str, object]:
        try:
            glibc = self.glibc_needed
        except ForgedVersion:
            glibc = None
        return {"machine": self.machine, "glibc": ".".join(map(str, glibc)) if glibc else None,
                "glibcxx": self.newest("GLIBCXX_"), "needs": {k: list(v) for k, v in self.versions.items()}}


class _Bounded(io.RawIOBase):
    """A read-only view of the library that refuses any run of reads longer than MAX_RUN after one seek, so
    pyelftools' unbounded string reads (until a NUL) stop at our limit instead of the end of a 1 GiB file."""

    def __init__(self, data: bytes | mmap.mmap) -> None:
        super().__init__()
        self._data, self._pos, self._run = memoryview(data), 0, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._data)}[whence]
        self._pos, self._run = max(0, base + offset), 0
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        end = len(self._data) if size is None or size < 0 else min(len(self._data), self._pos + size)
        end = max(end, self._pos)
        self._run += end - self._pos
        if self._run > MAX_RUN:
            raise ElfFormatError(f"a string or record at offset {self._pos} runs past {MAX_RUN} bytes")
        chunk = bytes(self._data[self._pos:end])
        self._pos = end
        return chunk

    def close(self) -> None:
        self._data.release()
        super().close()


def _check_span(what: str, header: Any, size: int, limit: int) -> None:
    if header["sh_type"] == "SHT_NOBITS":
        raise ElfFormatError(f"{what} is declared NOBITS ({header['sh_size']} bytes that are not in the file)")
    off, length = header["sh_offset"], header["sh_size"]
    if length > limit or off + length > size:
        raise ElfFormatError(f"{what} claims bytes {off}..{off + length} (the file has {size}, the limit is "
                             f"{limit})")


def _name(strtab: Any, index: int, what: str) -> str:
    if index >= strtab["sh_size"]:
        raise ElfFormatError(f"{what} name at {index}, outside its string table of {strtab['sh_size']} bytes")
    name = strtab.get_string(index)
    if not isinstance(name, str) or len(name) > MAX_NAME or index + len(name) >= strtab["sh_size"]:
        raise ElfFormatError(f"{what} name at {index}: expected a string of at most {MAX_NAME} characters inside "
                             f"its table, found {len(name) if isinstance(name, str) else 'none'}")
    return name


def _needs(section: GNUVerNeedSection, size: int) -> dict[str, list[str]]:
    _check_span("the version-needs section", section.header, size, MAX_NEEDS_BYTES)
    strtab = section.stringtable
    _check_span("its string table", strtab.header, size, MAX_STRTAB)
    if section.num_versions() > MAX_ENTRIES:
        raise ElfFormatError(f"{section.num_versions()} version needs (at most {MAX_ENTRIES})")
    versions: dict[str, list[str]] = {}
    seen = 0
    for need, aux in section.iter_versions():
        if need["vn_cnt"] > MAX_ENTRIES:
            raise ElfFormatError(f"a version need with {need['vn_cnt']} entries (at most {MAX_ENTRIES})")
        names = versions.setdefault(_name(strtab, need["vn_file"], "a needed library's"), [])
        for entry in aux:
            seen += 1
            if seen > MAX_ENTRIES:  # a vn_next/vna_next of 0 repeats one entry as often as the count says
                raise ElfFormatError(f"more than {MAX_ENTRIES} version needs")
            names.append(_name(strtab, entry["vna_name"], "a version"))
    return versions


def _dynamic_names_needs(elf: ELFFile, size: int) -> bool:
    """Whether the PT_DYNAMIC segment has a DT_VERNEED entry (read within its own bytes and our limits)."""
    if elf.num_segments() > MAX_SECTIONS:
        raise ElfFormatError(f"{elf.num_segments()} program headers (at most {MAX_SECTIONS})")
    for segment in elf.iter_segments():
        if not isinstance(segment, DynamicSegment):
            continue
        if segment["p_offset"] + segment["p_filesz"] > size or segment["p_filesz"] > MAX_NEEDS_BYTES:
            raise ElfFormatError(f"the dynamic segment claims bytes {segment['p_offset']}.."
                                 f"{segment['p_offset'] + segment['p_filesz']} (the file has {size})")
        for seen, tag in enumerate(segment.iter_tags()):
            if seen > MAX_ENTRIES:
                raise ElfFormatError(f"more than {MAX_ENTRIES} dynamic entries")
            if tag.entry.d_tag == "DT_VERNEED":
                return True
    return False


def _read(data: bytes | mmap.mmap) -> ElfNeeds:
    size = len(data)
    if bytes(data[:4]) != b"\x7fELF":
        raise ElfFormatError("not an ELF file")
    if size > MAX_FILE:
        raise ElfFormatError(f"{size} bytes, over the {MAX_FILE} an ELF library may have")
    with _Bounded(data) as stream:
        elf = ELFFile(cast(BinaryIO, stream))  # a RawIOBase is the binary stream pyelftools reads
        count, offset, entry = elf.num_sections(), elf["e_shoff"], elf["e_shentsize"]
        if count > MAX_SECTIONS or offset + count * entry > size:
            raise ElfFormatError(f"a section table of {count} entries of {entry} bytes at {offset} (the file has "
                                 f"{size} bytes, at most {MAX_SECTIONS} sections)")
        versions: dict[str, list[str]] = {}
        for i in range(count):
            # headers only: building every section object would follow links of sections we never read
            header = elf._get_section_header(i)  # (pyelftools has no public form of it)
            if header["sh_type"] != "SHT_GNU_verneed":
                continue
            link = header["sh_link"]
            if not 0 < link < count:
                raise ElfFormatError(f"the version-needs section {i} links string table {link} of {count} sections")
            strtab = elf._get_section_header(link)
            _check_span(f"the version-needs string table (section {link})", strtab, size, MAX_STRTAB)
            if strtab["sh_type"] != "SHT_STRTAB":
                raise ElfFormatError(f"the version-needs section {i} links section {link} of type "
                                     f"{strtab['sh_type']}, expected a string table")
            section = elf.get_section(i)
            if not isinstance(section, GNUVerNeedSection):
                raise ElfFormatError(f"section {i} is not a version-needs section")
            for lib, names in _needs(section, size).items():
                versions.setdefault(lib, []).extend(names)
        if not versions and _dynamic_names_needs(elf, size):
            # the loader follows the dynamic section, not section headers: needs hidden from the one are still
            # bound through the other (a retyped or removed .gnu.version_r)
            raise ElfFormatError("the dynamic section names version needs (DT_VERNEED) that no version-needs "
                                 "section holds")
        machine = elf["e_machine"]
    return ElfNeeds(machine=MACHINES.get(machine, f"machine-{machine}") if isinstance(machine, str) else
                    f"machine-{machine}", versions={k: tuple(dict.fromkeys(v)) for k, v in versions.items()})


def read_elf_needs(data: bytes | mmap.mmap) -> ElfNeeds:
    """The machine and the version needs of an ELF file (``data``: its bytes, or an mmap of them)."""
    try:
        return _read(data)
    except ElfFormatError:
        raise
    except (ELFError, ValueError, OverflowError, IndexError, KeyError, AttributeError, TypeError, EOFError,
            MemoryError) as exc:  # pyelftools' own and what its construct parsing raises on cut-short data
        raise ElfFormatError(f"malformed ELF headers ({type(exc).__name__}: {str(exc)[:200]})") from None
