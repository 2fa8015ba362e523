"""CUDA fatbins read straight from native libraries: which GPU archs a library carries as SASS or PTX.

nvcc embeds one fatbin *container* per translation unit: in ELF files in the ``.nv_fatbin`` section, in
Windows PE files in the ``.nv_fatb`` section. Relocatable device code (``-rdc=true``) sits in ``__nv_relfatbin``;
a linked library keeps it there beside its device-linked ``.nv_fatbin``, which alone is what the runtime loads
(the relocatable copy also holds the device runtime's objects, SASS for every arch, and PTX that is never
JIT-compiled), so that section is read only from an ELF file without ``.nv_fatbin`` (a relocatable object).
A container is a 16-byte header (magic ``0xBA55ED50``, version, header size, payload size) followed by
entries, each with its own header: kind (1 = PTX, 2 = ELF/SASS), header size, payload size, the target
arch (e.g. 120) and flags (arch-specific ``a`` / family ``f`` targets, LZ4 or zstd compression).
Only headers are read: compressed payloads are skipped, never inflated.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass

FATBIN_MAGIC = 0xBA55ED50
_CONTAINER = struct.Struct("<IHHQ")  # magic, version, header size, payload size
_ENTRY = struct.Struct("<HHIQIIHHII")  # kind, version, header size, payload size, compressed size, _, minor, major,
#                                         arch, name offset
_FLAGS_AT = 40  # u64 flags, after the name offset/length words

KIND_PTX = 1
KIND_ELF = 2
FLAG_ARCH_SPECIFIC = 0x100000  # sm_90a / compute_100a
FLAG_FAMILY = 0x200000  # sm_120f
FLAG_LZ4 = 0x2000
FLAG_ZSTD = 0x8000

ELF_LINKED = ".nv_fatbin"
ELF_RELOCATABLE = "__nv_relfatbin"
PE_SECTION_PREFIX = b".nv_fat"


class FatbinFormatError(ValueError):
    """A library or a fatbin container does not have the layout its headers announce."""


@dataclass(frozen=True, kw_only=True, order=True)
class Arch:
    """A GPU target: ``sm_120`` is (12, 0); ``suffix`` is ``a`` (this exact arch only), ``f`` (family) or ''."""

    major: int
    minor: int
    suffix: str = ""

    @property
    def number(self) -> int:
        return self.major * 10 + self.minor

    def sm(self) -> str:
        return f"sm_{self.number}{self.suffix}"

    @classmethod
    def parse(cls, text: str) -> Arch:
        """``sm120``, ``sm_120``, ``sm_120a``, ``compute_90``, ``120``, ``12.0``."""
        t = text.strip().lower()
        m = re.fullmatch(r"(\d+)\.(\d)([af]?)", t)
        if m:
            return cls(major=int(m[1]), minor=int(m[2]), suffix=m[3])
        m = re.fullmatch(r"(?:sm_?|compute_?)?(\d{2,3})([af]?)", t)
        if not m:
            raise ValueError(f"not a GPU arch: {text!r} (expected e.g. sm120, sm_120, 12.0)")
        number = int(m[1])
        return cls(major=number // 10, minor=number % 10, suffix=m[2])


@dataclass(frozen=True, kw_only=True)
class FatbinEntry:
    kind: str  # "sass" or "ptx"
    arch: Arch
    size: int
    compression: str | None  # "lz4", "zstd" or None

    @property
    def name(self) -> str:
        return self.arch.sm() if self.kind == "sass" else f"compute_{self.arch.number}{self.arch.suffix}"

    def runs_on(self, target: Arch) -> bool:
        """SASS runs on the same major arch at an equal or newer minor (exactly equal for ``a`` targets)."""
        if self.kind != "sass" or self.arch.major != target.major:
            return False
        return self.arch.minor == target.minor if self.arch.suffix == "a" else self.arch.minor <= target.minor

    def jits_for(self, target: Arch) -> bool:
        """PTX is JIT-compiled by the driver for any newer arch (``a``: same arch, ``f``: same family)."""
        if self.kind != "ptx":
            return False
        if self.arch.suffix == "a":
            return (self.arch.major, self.arch.minor) == (target.major, target.minor)
        if self.arch.suffix == "f":
            return self.arch.major == target.major and self.arch.minor <= target.minor
        return (self.arch.major, self.arch.minor) <= (target.major, target.minor)


@dataclass(frozen=True, kw_only=True)
class Fatbin:
    """One container (one translation unit's device code)."""

    entries: tuple[FatbinEntry, ...]


@dataclass(frozen=True, kw_only=True)
class ArchVerdict:
    target: Arch
    verdict: str  # "sass" (native code), "ptx-only" (JIT at load) or "none"
    detail: str

    @property
    def ok(self) -> bool:
        return self.verdict == "sass"


@dataclass(frozen=True, kw_only=True)
class LibraryArchs:
    fatbins: tuple[Fatbin, ...]

    @property
    def entries(self) -> tuple[FatbinEntry, ...]:
        return tuple(e for f in self.fatbins for e in f.entries)

    def names(self, kind: str) -> list[str]:
        found = {e.arch: e.name for e in self.entries if e.kind == kind}
        return [found[a] for a in sorted(found)]

    def verdict(self, target: Arch) -> ArchVerdict:
        total = len(self.fatbins)
        native = sum(1 for f in self.fatbins if any(e.runs_on(target) for e in f.entries))
        jit = sum(1 for f in self.fatbins if any(e.jits_for(target) for e in f.entries))
        want = target.sm()
        sass, ptx = ", ".join(self.names("sass")) or "none", ", ".join(self.names("ptx")) or "none"
        if native:
            return ArchVerdict(target=target, verdict="sass", detail=f"{want}: SASS in {native} of {total} fatbins")
        if jit:
            return ArchVerdict(
                target=target, verdict="ptx-only",
                detail=f"PTX-only for {want} (SASS {sass}; PTX {ptx}): the driver JIT-compiles it at load",
            )
        return ArchVerdict(
            target=target, verdict="none", detail=f"no code for {want} (SASS {sass}; PTX {ptx}): no kernel image",
        )


Span = tuple[int, int]  # (offset, size) of a section in the file


def parse_containers(raw: bytes, span: Span | None = None, where: str = "fatbin") -> list[Fatbin]:
    """Every container in ``raw[offset:offset+size]``; padding between containers is skipped."""
    start, limit = (0, len(raw)) if span is None else (span[0], span[0] + span[1])
    if start < 0 or limit > len(raw) or start > limit:
        raise FatbinFormatError(f"{where}: a fatbin section claims bytes {start}..{limit}, the file has {len(raw)}")
    magic = struct.pack("<I", FATBIN_MAGIC)
    found: list[Fatbin] = []
    pos = raw.find(magic, start, limit)
    while pos >= 0 and pos + _CONTAINER.size <= limit:
        _, _, header_size, payload = _CONTAINER.unpack_from(raw, pos)
        end = pos + header_size + payload
        if header_size < _CONTAINER.size or end > limit:
            raise FatbinFormatError(
                f"{where}: fatbin container at offset {pos} claims {payload} bytes, only {limit - pos} remain"
            )
        found.append(Fatbin(entries=tuple(_entries(raw, pos + header_size, end, where))))
        pos = raw.find(magic, end, limit)
    return found


def _entries(raw: bytes, pos: int, end: int, where: str) -> Iterator[FatbinEntry]:
    while pos + 16 <= end:
        kind, _, header_size, payload = struct.unpack_from("<HHIQ", raw, pos)
        if header_size < _FLAGS_AT + 8 or pos + header_size + payload > end:
            raise FatbinFormatError(f"{where}: malformed fatbin entry at offset {pos} (header {header_size} bytes)")
        fields = _ENTRY.unpack_from(raw, pos)
        arch_number = fields[8]
        (flags,) = struct.unpack_from("<Q", raw, pos + _FLAGS_AT)
        suffix = "a" if flags & FLAG_ARCH_SPECIFIC else "f" if flags & FLAG_FAMILY else ""
        compression = "zstd" if flags & FLAG_ZSTD else "lz4" if flags & FLAG_LZ4 else None
        if kind in (KIND_PTX, KIND_ELF):
            yield FatbinEntry(
                kind="ptx" if kind == KIND_PTX else "sass",
                arch=Arch(major=arch_number // 10, minor=arch_number % 10, suffix=suffix),
                size=payload,
                compression=compression,
            )
        pos += header_size + payload


def elf_sections(data: bytes, names: tuple[str, ...], where: str) -> list[Span]:
    """The named sections' contents of an ELF file (32/64-bit, little-endian).

    Every offset and count is checked against the file's real size before it is used: a header that claims a
    section table of 2^40 entries, or sections past the end, is a FatbinFormatError, and nothing is allocated
    for what the file does not hold."""
    if data[:4] != b"\x7fELF":
        raise FatbinFormatError(f"{where}: not an ELF file")
    if len(data) < 0x40:
        raise FatbinFormatError(f"{where}: ELF file of {len(data)} bytes, shorter than its own header")
    is64, little = data[4] == 2, data[5] == 1
    if not little:
        raise FatbinFormatError(f"{where}: big-endian ELF is not supported")
    if is64:
        shoff, = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
        sh = struct.Struct("<IIQQQQ")
    else:
        shoff, = struct.unpack_from("<I", data, 0x20)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x2E)
        sh = struct.Struct("<IIIIII")
    if shoff == 0:
        return []
    if shentsize < sh.size or shoff + sh.size > len(data):
        raise FatbinFormatError(f"{where}: ELF section table at offset {shoff} with {shentsize}-byte entries does "
                                f"not fit the file's {len(data)} bytes")
    if shnum == 0 or shstrndx == 0xFFFF:  # extended numbering lives in section 0
        _, _, _, _, _, size0 = sh.unpack_from(data, shoff)
        shnum = shnum or size0
    if shoff + shnum * shentsize > len(data):
        raise FatbinFormatError(f"{where}: ELF section table ({shnum} entries) runs past the end of the file")
    headers = [sh.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]
    if shstrndx >= len(headers):
        raise FatbinFormatError(f"{where}: ELF section-name table index {shstrndx} out of range")
    str_off, str_size = headers[shstrndx][4], headers[shstrndx][5]
    if str_off + str_size > len(data):
        raise FatbinFormatError(f"{where}: ELF section-name table runs past the end of the file")
    strtab = data[str_off:str_off + str_size]
    out = []
    nobits = 8
    for name_off, kind, _, _, off, size in headers:
        end = strtab.find(b"\0", name_off)
        name = strtab[name_off:end if end >= 0 else len(strtab)].decode("ascii", "replace")
        if name in names and kind != nobits:
            if off + size > len(data):
                raise FatbinFormatError(f"{where}: ELF section {name} claims bytes {off}..{off + size}, the file "
                                        f"has {len(data)}")
            out.append((off, size))
    return out


def pe_sections(data: bytes, where: str) -> list[Span]:
    """The ``.nv_fatb`` section(s) of a Windows PE file (DLL/PYD), each checked to lie inside the file."""
    if data[:2] != b"MZ":
        raise FatbinFormatError(f"{where}: not a PE file")
    if len(data) < 0x40:
        raise FatbinFormatError(f"{where}: PE file of {len(data)} bytes, shorter than its DOS header")
    (pe,) = struct.unpack_from("<I", data, 0x3C)
    if data[pe:pe + 4] != b"PE\0\0" or pe + 24 > len(data):
        raise FatbinFormatError(f"{where}: no PE signature at offset {pe}")
    _, nsections, _, _, _, opt_size, _ = struct.unpack_from("<HHIIIHH", data, pe + 4)
    table = pe + 24 + opt_size
    if table + 40 * nsections > len(data):
        raise FatbinFormatError(f"{where}: PE section table ({nsections} sections) runs past the end of the file")
    out = []
    for i in range(nsections):
        name, vsize, _, raw_size, raw_ptr = struct.unpack_from("<8sIIII", data, table + 40 * i)
        if name.startswith(PE_SECTION_PREFIX):
            size = min(vsize, raw_size) if vsize else raw_size
            if raw_ptr + size > len(data):
                raise FatbinFormatError(f"{where}: PE section {name.rstrip(bytes(1)).decode('ascii', 'replace')} "
                                        f"claims bytes {raw_ptr}..{raw_ptr + size}, the file has {len(data)}")
            out.append((raw_ptr, size))
    return out


def is_native(name: str) -> bool:
    """Library members whose fatbins are read: ``.so`` (also ``.so.N``), ``.pyd``, ``.dll``."""
    low = name.lower()
    return low.endswith((".so", ".pyd", ".dll")) or ".so." in low.rsplit("/", 1)[-1]


def library_archs(data: bytes, where: str) -> LibraryArchs:
    """All fatbin containers of an ELF or PE library (none for a library without CUDA code)."""
    if data[:4] == b"\x7fELF":
        sections = elf_sections(data, (ELF_LINKED,), where) or elf_sections(data, (ELF_RELOCATABLE,), where)
    elif data[:2] == b"MZ":
        sections = pe_sections(data, where)
    else:
        raise FatbinFormatError(f"{where}: neither ELF nor PE")
    fatbins: list[Fatbin] = []
    for section in sections:
        fatbins.extend(parse_containers(data, section, where))
    if sections and not fatbins:  # CUDA code was there (nvcc made the section) and is gone: emptied, zeroed
        raise FatbinFormatError(f"{where}: {len(sections)} fatbin section(s) of {sum(s for _, s in sections)} bytes "
                                "hold no fatbin container: no readable code for any GPU arch")
    return LibraryArchs(fatbins=tuple(fatbins))


def read_library_archs(data: bytes, where: str) -> LibraryArchs:
    """``library_archs``, with any short read of a header the checks above did not foresee a FatbinFormatError
    too: a library is upstream material and its reader never ends in a traceback."""
    try:
        return library_archs(data, where)
    except (struct.error, IndexError, OverflowError, MemoryError) as exc:
        raise FatbinFormatError(f"{where}: malformed library headers ({exc})") from exc
