"""A member's bytes read from the archive's data, not from what its central directory claims.

``zipfile`` takes a member's sizes and CRC from the central directory (its Zip64 extra field included) and
stops inflating at the size stated there: a directory that understates a member, or a local header that
disagrees with it, passes ``zipfile`` while an installer reading local headers or whole deflate streams (uv,
unzip) writes other bytes. Here each member's local header must agree with its directory entry (name, method,
CRC, sizes, Zip64 extra or data descriptor), its deflate stream must end exactly at its compressed size, and what
it inflates to must be exactly the size the directory states, with the CRC it states. Inflating stops as soon as
the output passes the stated size, so the zip-bomb limits that bound stated sizes bound this reading too.
"""

from __future__ import annotations

import struct
import zipfile
import zlib
from collections.abc import Iterator
from typing import IO

_LOCAL = struct.Struct("<4sHHHHHIIIHH")  # signature, version, flags, method, time, date, crc, csize, usize, n, x
_MAX32 = 0xFFFFFFFF
_DESCRIPTOR = 0x08
_UTF8 = 0x800
CHUNK = 1 << 20


def _zip64_local(extra: bytes, usize: int, csize: int) -> tuple[int, int]:
    """The sizes a local header's Zip64 extra field (id 1) gives for the fields set to 0xFFFFFFFF."""
    pos = 0
    while pos + 4 <= len(extra):
        kind, length = struct.unpack_from("<HH", extra, pos)
        body = extra[pos + 4:pos + 4 + length]
        if kind == 1:
            values = list(struct.unpack_from(f"<{len(body) // 8}Q", body)) if len(body) >= 8 else []
            if usize == _MAX32 and values:
                usize = values.pop(0)
            if csize == _MAX32 and values:
                csize = values.pop(0)
            return usize, csize
        pos += 4 + length
    return usize, csize


def data_start(fh: IO[bytes], info: zipfile.ZipInfo) -> int:
    """Check ``info``'s local header against its directory entry; return where its compressed bytes start."""
    where = info.filename
    if info.header_offset < 0:
        raise zipfile.BadZipFile(f"{where}: the central directory puts its header before the archive's start")
    fh.seek(info.header_offset)
    head = fh.read(_LOCAL.size)
    if len(head) != _LOCAL.size or head[:4] != b"PK\x03\x04":
        raise zipfile.BadZipFile(f"{where}: no local file header at offset {info.header_offset}")
    _, _, flags, method, _, _, crc, csize, usize, name_len, extra_len = _LOCAL.unpack(head)
    raw_name = fh.read(name_len)
    extra = fh.read(extra_len)
    if len(raw_name) != name_len or len(extra) != extra_len:
        raise zipfile.BadZipFile(f"{where}: local header cut short")
    name = raw_name.decode("utf-8" if flags & _UTF8 else "cp437", errors="replace")
    if name != info.orig_filename:
        raise zipfile.BadZipFile(f"{where}: the local header names {name!r}, the central directory "
                                 f"{info.orig_filename!r}: two tools would read two different members")
    if method != info.compress_type:
        raise zipfile.BadZipFile(f"{where}: compression method {method} in the local header, {info.compress_type} "
                                 "in the central directory")
    start: int = info.header_offset + _LOCAL.size + name_len + extra_len
    if flags & _DESCRIPTOR:  # sizes and CRC follow the data
        fh.seek(start + info.compress_size)
        tail = fh.read(24)
        if tail[:4] == b"PK\x07\x08":
            tail = tail[4:]
        big = any(v >= _MAX32 for v in (info.compress_size, info.file_size)) or b"\x01\x00" in extra[:2]
        fmt = "<IQQ" if big else "<III"
        if len(tail) < struct.calcsize(fmt):
            raise zipfile.BadZipFile(f"{where}: data descriptor cut short")
        crc, csize, usize = struct.unpack_from(fmt, tail)
    else:
        usize, csize = _zip64_local(extra, usize, csize)
    if (crc, csize, usize) != (info.CRC, info.compress_size, info.file_size):
        raise zipfile.BadZipFile(
            f"{where}: the local header says {csize} bytes compressed, {usize} inflated, CRC {crc:08x}; the central "
            f"directory {info.compress_size}, {info.file_size}, {info.CRC:08x}: the sizes must agree")
    return start


def _raw(fh: IO[bytes], start: int, count: int, where: str) -> Iterator[bytes]:
    fh.seek(start)
    while count:
        chunk = fh.read(min(CHUNK, count))
        if not chunk:
            raise zipfile.BadZipFile(f"{where}: the archive ends inside the member's data")
        count -= len(chunk)
        yield chunk


def _inflate(raw: Iterator[bytes], where: str, limit: int) -> Iterator[bytes]:
    """Raw deflate, never more than ``limit`` bytes and never more than CHUNK at once; the stream must end
    exactly where its compressed bytes do."""
    inflater = zlib.decompressobj(-15)
    produced = 0
    pending = b""
    for chunk in raw:
        if inflater.eof:
            raise zipfile.BadZipFile(f"{where}: bytes follow the end of the deflate stream within the member")
        pending = chunk
        while pending and not inflater.eof:
            try:
                out = inflater.decompress(pending, CHUNK)
            except zlib.error as exc:
                raise zipfile.BadZipFile(f"{where}: the deflate data is damaged ({exc})") from None
            pending = inflater.unconsumed_tail
            produced += len(out)
            if produced > limit:
                raise zipfile.BadZipFile(f"{where}: inflates past the {limit} bytes the central directory states")
            if out:
                yield out
        if inflater.unused_data or pending:
            raise zipfile.BadZipFile(f"{where}: bytes follow the end of the deflate stream within the member")
    if not inflater.eof:
        raise zipfile.BadZipFile(f"{where}: the deflate stream does not end within the member's compressed size")


def member_chunks(fh: IO[bytes], info: zipfile.ZipInfo) -> Iterator[bytes]:
    """A stored or deflated member's inflated bytes, read from the data and checked as the module says."""
    where = info.filename
    start = data_start(fh, info)
    raw = _raw(fh, start, info.compress_size, where)
    if info.compress_type == zipfile.ZIP_STORED:
        source = raw
    elif info.compress_type == zipfile.ZIP_DEFLATED:
        source = _inflate(raw, where, info.file_size)
    else:
        raise zipfile.BadZipFile(f"{where}: compression method {info.compress_type}; a wheel's members are "
                                 "stored or deflated")
    size, crc = 0, 0
    for chunk in source:
        size += len(chunk)
        crc = zlib.crc32(chunk, crc)
        yield chunk
    if size != info.file_size:
        raise zipfile.BadZipFile(f"{where}: the data holds {size} bytes, the central directory states "
                                 f"{info.file_size}")
    if crc != info.CRC:
        raise zipfile.BadZipFile(f"{where}: CRC {crc:08x} of the data, {info.CRC:08x} in the central directory")
