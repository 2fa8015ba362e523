"""A zip writer that copies members' compressed bytes as they are (no recompression).

``zipfile`` can only re-compress; rewriting a 250 MB wheel that way costs half a minute. Here members that
keep their name are copied as one byte range with their local headers (a run of neighbours at once); a
renamed member gets a new local header and its compressed bytes copied; new or changed members are deflated.
The central directory is written anew, with Zip64 records where sizes or offsets need them. The bytes copied
come from a ``ByteSource`` (``sources``: a snapshot in memory, or a pass that hashes what it copies), in file
order.
"""

from __future__ import annotations

import struct
import zipfile
import zlib
from collections.abc import Sequence
from typing import BinaryIO, Protocol

_LOCAL = struct.Struct("<IHHHHHIIIHH")
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_EOCD = struct.Struct("<IHHHHIIH")
_EOCD64 = struct.Struct("<IQHHIIQQQQ")
_LOCATOR64 = struct.Struct("<IIQI")
_MAX32 = 0xFFFFFFFF
_UTF8 = 0x800
DateTime = tuple[int, int, int, int, int, int]


class ByteSource(Protocol):
    """Where copied bytes come from; calls come in file order (a streamed source goes forward only)."""

    def read_at(self, offset: int, count: int) -> bytes: ...

    def copy_to(self, out: BinaryIO, offset: int, count: int) -> None: ...


def data_offset(src: ByteSource, info: zipfile.ZipInfo) -> int:
    """Where a member's compressed bytes start (after its local header, whose lengths may differ)."""
    header = src.read_at(info.header_offset, _LOCAL.size)
    if len(header) != _LOCAL.size or header[:4] != b"PK\x03\x04":
        raise zipfile.BadZipFile(f"{info.filename}: no local header at offset {info.header_offset}")
    lengths: tuple[int, int] = struct.unpack_from("<HH", header, 26)
    start: int = info.header_offset + _LOCAL.size + sum(lengths)
    return start


def _dos_time(date_time: DateTime) -> tuple[int, int]:
    y, mo, d, h, mi, s = date_time
    y = max(1980, y)
    return (h << 11) | (mi << 5) | (s // 2), ((y - 1980) << 9) | (mo << 5) | d


def _encoded_name(info: zipfile.ZipInfo) -> bytes:
    """The name's bytes as stored (zipfile decodes names without the UTF-8 flag as cp437)."""
    return info.filename.encode("utf-8" if info.flag_bits & _UTF8 else "cp437")


class RawZipWriter:
    """Write members one by one to ``out``; ``close()`` writes the central directory."""

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._central: list[bytes] = []

    def _central_record(
        self, encoded: bytes, *, flags: int, method: int, crc: int, csize: int, usize: int, date_time: DateTime,
        external_attr: int, create: int, offset: int,
    ) -> None:
        extra64 = b"".join(struct.pack("<Q", v) for v in (usize, csize, offset) if v >= _MAX32)
        extra = struct.pack("<HH", 1, len(extra64)) + extra64 if extra64 else b""
        dtime, ddate = _dos_time(date_time)
        need = 45 if extra64 else 20
        self._central.append(_CENTRAL.pack(
            0x02014B50, create, need, flags, method, dtime, ddate, crc, min(csize, _MAX32), min(usize, _MAX32),
            len(encoded), len(extra), 0, 0, 0, external_attr, min(offset, _MAX32),
        ) + encoded + extra)

    def _local(
        self, name: str, *, method: int, crc: int, csize: int, usize: int, date_time: DateTime, external_attr: int,
        create: int,
    ) -> None:
        encoded = name.encode("utf-8")
        flags = 0 if encoded.isascii() else _UTF8
        offset = self._out.tell()
        big = csize >= _MAX32 or usize >= _MAX32
        extra = struct.pack("<HHQQ", 1, 16, usize, csize) if big else b""
        dtime, ddate = _dos_time(date_time)
        self._out.write(_LOCAL.pack(
            0x04034B50, 45 if big else 20, flags, method, dtime, ddate, crc,
            _MAX32 if big else csize, _MAX32 if big else usize, len(encoded), len(extra),
        ) + encoded + extra)
        self._central_record(encoded, flags=flags, method=method, crc=crc, csize=csize, usize=usize,
                             date_time=date_time, external_attr=external_attr, create=create, offset=offset)

    def copy_verbatim(self, src: ByteSource, run: Sequence[zipfile.ZipInfo], end: int) -> None:
        """Copy neighbouring members (headers, data, descriptors) as one range ending at ``end``."""
        start = run[0].header_offset
        shift = self._out.tell() - start
        for info in run:
            self._central_record(
                _encoded_name(info), flags=info.flag_bits, method=info.compress_type, crc=info.CRC,
                csize=info.compress_size, usize=info.file_size, date_time=info.date_time,
                external_attr=info.external_attr, create=(info.create_system << 8) | info.create_version,
                offset=info.header_offset + shift,
            )
        src.copy_to(self._out, start, end - start)

    def copy_raw(self, src: ByteSource, info: zipfile.ZipInfo, name: str | None = None) -> None:
        """Copy ``info``'s compressed bytes from ``src`` unchanged under a new local header (and name)."""
        start = data_offset(src, info)
        self._local(
            name or info.filename, method=info.compress_type, crc=info.CRC, csize=info.compress_size,
            usize=info.file_size, date_time=info.date_time, external_attr=info.external_attr,
            create=(info.create_system << 8) | info.create_version,
        )
        src.copy_to(self._out, start, info.compress_size)

    def write(self, name: str, data: bytes, *, date_time: DateTime, external_attr: int = 0o644 << 16) -> None:
        """Add a new member, deflated."""
        packer = zlib.compressobj(6, zlib.DEFLATED, -15)
        compressed = packer.compress(data) + packer.flush()
        self._local(
            name, method=zipfile.ZIP_DEFLATED, crc=zlib.crc32(data), csize=len(compressed), usize=len(data),
            date_time=date_time, external_attr=external_attr, create=(3 << 8) | 20,
        )
        self._out.write(compressed)

    def close(self) -> None:
        start = self._out.tell()
        self._out.write(b"".join(self._central))
        size = self._out.tell() - start
        count = len(self._central)
        if count >= 0xFFFF or start >= _MAX32 or size >= _MAX32:
            eocd64_at = self._out.tell()
            self._out.write(_EOCD64.pack(0x06064B50, 44, 45, 45, 0, 0, count, count, size, start))
            self._out.write(_LOCATOR64.pack(0x07064B50, 0, eocd64_at, 1))
        self._out.write(_EOCD.pack(
            0x06054B50, 0, 0, min(count, 0xFFFF), min(count, 0xFFFF), min(size, _MAX32), min(start, _MAX32), 0,
        ))
