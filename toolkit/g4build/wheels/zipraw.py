"""A zip writer that copies members' compressed bytes as they are (no recompression).

``zipfile`` can only re-compress; rewriting a 250 MB wheel that way costs half a minute. Here an unchanged
member's local header is rewritten (name, sizes, CRC from the central directory) and its compressed data is
copied byte for byte; new or changed members are deflated. Zip64 records are written when sizes or offsets
need them.
"""

from __future__ import annotations

import os
import struct
import zipfile
import zlib
from typing import BinaryIO

_LOCAL = struct.Struct("<IHHHHHIIIHH")
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_EOCD = struct.Struct("<IHHHHIIH")
_EOCD64 = struct.Struct("<IQHHIIQQQQ")
_LOCATOR64 = struct.Struct("<IIQI")
_MAX32 = 0xFFFFFFFF
_UTF8 = 0x800
CHUNK = 1 << 20


def data_offset(fh: BinaryIO, info: zipfile.ZipInfo) -> int:
    """Where a member's compressed bytes start (after its local header, whose lengths may differ)."""
    fh.seek(info.header_offset)
    header = fh.read(_LOCAL.size)
    if len(header) != _LOCAL.size or header[:4] != b"PK\x03\x04":
        raise zipfile.BadZipFile(f"{info.filename}: no local header at offset {info.header_offset}")
    lengths: tuple[int, int] = struct.unpack_from("<HH", header, 26)
    start: int = info.header_offset + _LOCAL.size + sum(lengths)
    return start


def _dos_time(date_time: tuple[int, int, int, int, int, int]) -> tuple[int, int]:
    y, mo, d, h, mi, s = date_time
    y = max(1980, y)
    return (h << 11) | (mi << 5) | (s // 2), ((y - 1980) << 9) | (mo << 5) | d


def _kernel_copy(src: BinaryIO, out: BinaryIO, start: int, count: int) -> bool:
    """Copy ``count`` bytes at ``start`` of ``src`` to the end of ``out`` inside the kernel, where it can."""
    copy = getattr(os, "copy_file_range", None)
    if copy is None:
        return False
    out.flush()
    src_fd, out_fd = src.fileno(), out.fileno()
    done = 0
    try:
        while done < count:
            n = copy(src_fd, out_fd, count - done, start + done)
            if n == 0:
                raise zipfile.BadZipFile("truncated member data")
            done += n
    except OSError:
        if done:
            raise
        return False  # e.g. across file systems on old kernels: fall back to read/write
    finally:
        out.seek(0, os.SEEK_END)  # the buffered writer's position is stale after a kernel copy
    return True


class RawZipWriter:
    """Write members one by one to ``out``; ``close()`` writes the central directory."""

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._central: list[bytes] = []

    def _entry(
        self, name: str, *, method: int, crc: int, csize: int, usize: int,
        date_time: tuple[int, int, int, int, int, int], external_attr: int, create: int,
    ) -> None:
        encoded = name.encode("utf-8")
        flags = 0 if encoded.isascii() else _UTF8
        offset = self._out.tell()
        big = csize >= _MAX32 or usize >= _MAX32
        local_extra = struct.pack("<HHQQ", 1, 16, usize, csize) if big else b""
        dtime, ddate = _dos_time(date_time)
        need = 45 if big or offset >= _MAX32 else 20
        self._out.write(_LOCAL.pack(
            0x04034B50, need, flags, method, dtime, ddate, crc,
            _MAX32 if big else csize, _MAX32 if big else usize, len(encoded), len(local_extra),
        ) + encoded + local_extra)
        extra64 = b"".join(
            struct.pack("<Q", v) for v in (usize, csize, offset) if v >= _MAX32
        )
        central_extra = struct.pack("<HH", 1, len(extra64)) + extra64 if extra64 else b""
        self._central.append(_CENTRAL.pack(
            0x02014B50, create, need, flags, method, dtime, ddate, crc,
            min(csize, _MAX32), min(usize, _MAX32), len(encoded), len(central_extra), 0, 0, 0,
            external_attr, min(offset, _MAX32),
        ) + encoded + central_extra)

    def copy_raw(self, src: BinaryIO, info: zipfile.ZipInfo, name: str | None = None) -> None:
        """Copy ``info``'s compressed bytes from ``src`` unchanged, optionally under a new name."""
        start = data_offset(src, info)
        self._entry(
            name or info.filename, method=info.compress_type, crc=info.CRC, csize=info.compress_size,
            usize=info.file_size, date_time=info.date_time, external_attr=info.external_attr,
            create=(info.create_system << 8) | info.create_version,
        )
        left = info.compress_size
        if left >= CHUNK and _kernel_copy(src, self._out, start, left):
            return
        src.seek(start)
        while left:
            chunk = src.read(min(CHUNK, left))
            if not chunk:
                raise zipfile.BadZipFile(f"{info.filename}: truncated member data")
            self._out.write(chunk)
            left -= len(chunk)

    def write(
        self, name: str, data: bytes, *, date_time: tuple[int, int, int, int, int, int],
        external_attr: int = 0o644 << 16,
    ) -> None:
        """Add a new member, deflated."""
        packer = zlib.compressobj(6, zlib.DEFLATED, -15)
        compressed = packer.compress(data) + packer.flush()
        self._entry(
            name, method=zipfile.ZIP_DEFLATED, crc=zlib.crc32(data), csize=len(compressed), usize=len(data),
            date_time=date_time, external_attr=external_attr, create=(3 << 8) | 20,
        )
        self._out.write(compressed)

    def close(self) -> None:
        start = self._out.tell()
        for record in self._central:
            self._out.write(record)
        size = self._out.tell() - start
        count = len(self._central)
        if count >= 0xFFFF or start >= _MAX32 or size >= _MAX32:
            eocd64_at = self._out.tell()
            self._out.write(_EOCD64.pack(0x06064B50, 44, 45, 45, 0, 0, count, count, size, start))
            self._out.write(_LOCATOR64.pack(0x07064B50, 0, eocd64_at, 1))
        self._out.write(_EOCD.pack(
            0x06054B50, 0, 0, min(count, 0xFFFF), min(count, 0xFFFF), min(size, _MAX32), min(start, _MAX32), 0,
        ))
