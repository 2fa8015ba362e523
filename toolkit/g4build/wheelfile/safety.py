"""Checks against hostile wheels, shared by `validate` and `overlay`: what pip refuses or what is unsafe to
install (links, names Windows or case-insensitive file systems mangle, a WHEEL file that contradicts the
filename), size limits against zip bombs, and streaming sha256 of members (never a whole member in memory).
"""

from __future__ import annotations

import hashlib
import io
import re
import stat
import struct
import threading
import unicodedata
import zipfile
import zlib
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import BinaryIO

from g4build.errors import ValidationError
from g4build.wheelfile.wheelfile import RecordRow, WheelName, metadata_fields, record_hash_of
from g4build.wheelfile.zipdata import member_chunks

# Limits on what a wheel may inflate to. The registry's vLLM 0.21.0 wheel inflates 248 MB to 552 MB, its most
# compressible member over 1 MiB by 58:1; a zip bomb needs far more. Members under RATIO_FLOOR cannot hurt.
MAX_RATIO = 200
RATIO_FLOOR = 1 << 20
MAX_TOTAL = 8 << 30
LIMITS_TEXT = (f"limits: {MAX_RATIO}:1 per member over {RATIO_FLOOR >> 20} MiB, {MAX_TOTAL >> 30} GiB inflated "
               "in all")
CHUNK = 1 << 20
SIGNATURES = ("RECORD.jws", "RECORD.p7s")  # may sit beside RECORD without a row of their own
# Names Windows maps to devices whatever their extension ("con.py" opens the console), as folders too.
_DEVICES = frozenset({"CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$",
                      *(f"{p}{n}" for p in ("COM", "LPT") for n in (*"0123456789", "\u00b9", "\u00b2", "\u00b3"))})
_REFINED = re.compile(r"^(?:manylinux_\d+_\d+|musllinux_\d+_\d+|manylinux\d*)_(.+)$")
_WINDOWS_BAD = frozenset('<>:"|?*') | frozenset(chr(c) for c in range(32))


def inside(name: str) -> bool:
    """A member or RECORD path that stays inside the install folder (wheels use '/' only)."""
    parts = name.split("/")
    return not (name.startswith("/") or "\\" in name or ".." in parts or name[1:2] == ":")  # C:...


def _kind(info: zipfile.ZipInfo) -> str | None:
    """What a member is besides a file or folder (a symlink, a device...), from its Unix mode bits."""
    mode = info.external_attr >> 16
    fmt = stat.S_IFMT(mode)
    if fmt in (0, stat.S_IFREG, stat.S_IFDIR):
        return None
    return "a symlink" if fmt == stat.S_IFLNK else f"a special file (mode {oct(fmt)})"


def _windows_problem(part: str) -> str | None:
    if ":" in part:
        return "has ':' (an NTFS alternate data stream or a drive)"
    bad = sorted(c for c in set(part) if c in _WINDOWS_BAD)
    if bad:
        return f"has characters Windows forbids ({', '.join(repr(c) for c in bad)})"
    if part.endswith((".", " ")):
        return "ends with '.' or ' ' (Windows drops them, so it names another file)"
    if part.split(".", 1)[0].rstrip(" ").upper() in _DEVICES:
        return "is a Windows device name (writing it opens the device)"
    return None


def member_problems(infos: Iterable[zipfile.ZipInfo]) -> list[str]:
    """Members no installer should write: links, special files, names Windows or case-insensitive file systems
    mangle, a file and a folder of one name. Paths escaping the folder are check_record's ('unsafe path')."""
    problems: list[str] = []
    files: set[str] = set()
    folders: set[str] = set()
    verdicts: dict[str, str | None] = {}
    for info in infos:
        name = info.filename
        kind = _kind(info)
        if kind:
            problems.append(f"{name}: {kind} (pip would write its target as the file's contents; refused)")
        if not inside(name):
            continue
        raw_parts = name.rstrip("/").split("/") if info.is_dir() else name.split("/")
        if any(part in ("", ".") for part in raw_parts):
            # installers normalise 'a//b' and 'a/./b' to 'a/b': such a member silently lands on another one
            problems.append(f"{name}: empty or '.' path part (an installer writes it as "
                            f"{'/'.join(p for p in raw_parts if p not in ('', '.'))})")
        parts = [p for p in name.split("/") if p and p != "."]
        for part in parts:
            if part not in verdicts:  # a wheel repeats the same folder names thousands of times
                verdicts[part] = _windows_problem(part)
            why = verdicts[part]
            if why:
                problems.append(f"{name}: '{part}' {why}")
                break
        (folders if info.is_dir() else files).add("/".join(parts))
        folders.update("/".join(parts[:i]) for i in range(1, len(parts)))
    problems.extend(f"{p}: is both a file and a folder" for p in sorted(files & folders))
    spellings: dict[str, set[str]] = {}
    for path in files | folders:
        spellings.setdefault(unicodedata.normalize("NFC", path).casefold(), set()).add(path)
    problems.extend(f"{' and '.join(sorted(same))}: differ only in case (one overwrites the other on Windows "
                    "and macOS)" for same in sorted(sorted(s) for s in spellings.values() if len(s) > 1))
    return problems


def _platform_family(tag: str) -> str:
    """manylinux/musllinux platforms are refinements of linux_<arch>: vLLM renames its wheels that way."""
    interp, abi, plat = tag.split("-")
    refined = _REFINED.match(plat)
    return f"{interp}-{abi}-{'linux_' + refined[1] if refined else plat}"


def wheel_file_problems(raw: bytes | None, wheel: WheelName, dist_info: str) -> list[str]:
    """The dist-info WHEEL file: present, Wheel-Version 1.x (pip refuses 2+), tags that agree with the name."""
    if raw is None:
        return [f"{dist_info}/WHEEL is missing (pip refuses a wheel without it)"]
    fields = metadata_fields(raw)
    problems = []
    version = fields.get("wheel-version", "")
    if not re.fullmatch(r"1\.\d+", version):
        problems.append(f"{dist_info}/WHEEL: Wheel-Version '{version}', expected 1.x (pip refuses other majors)")
    text = raw.decode("utf-8", "replace")
    tags = sorted({line.partition(":")[2].strip() for line in text.splitlines() if line.lower().startswith("tag:")})
    shape_ok = all(t.count("-") == 2 for t in tags)
    if not tags or not shape_ok or {_platform_family(t) for t in tags} != {_platform_family(t) for t in wheel.tags}:
        problems.append(f"{dist_info}/WHEEL: Tag {', '.join(tags) or 'none'} disagrees with the filename's "
                        f"{', '.join(wheel.tags)}")
    return problems


def stored_twice(names: Iterable[str]) -> list[str]:
    """Member names stored more than once (one copy shadows the other), sorted."""
    return sorted(n for n, times in Counter(names).items() if times > 1)


def record_duplicates(rows: Iterable[RecordRow]) -> list[str]:
    seen: set[str] = set()
    twice: set[str] = set()
    for row in rows:
        (twice if row.path in seen else seen).add(row.path)
    return [f"{p}: listed twice in RECORD (an uninstall removes what the other row describes)" for p in sorted(twice)]


def check_limits(infos: Iterable[zipfile.ZipInfo], where: str) -> None:
    """Refuse a zip bomb from the central directory's sizes, before inflating anything. Those sizes bind: the
    reader stops at a member's stated size and a longer stream then fails its CRC."""
    total = 0
    for info in infos:
        if not info.filename:  # zipfile's own is_dir() cannot even look at it
            raise ValidationError(f"{where}: a member has an empty name", hint="this is no wheel a build backend makes")
        total += info.file_size
        if info.file_size > RATIO_FLOOR and info.file_size > MAX_RATIO * max(info.compress_size, 1):
            raise ValidationError(
                f"{where}: {info.filename} would inflate {info.compress_size} bytes to {info.file_size} "
                f"({info.file_size // max(info.compress_size, 1)}:1), a zip bomb ({LIMITS_TEXT})",
                hint="this is no wheel a build backend makes; get the wheel from its real source",
            )
    if total > MAX_TOTAL:
        raise ValidationError(f"{where}: members would inflate to {total} bytes in all, a zip bomb ({LIMITS_TEXT})",
                              hint="this is no wheel a build backend makes; get the wheel from its real source")


def stream_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, sink: BinaryIO | None = None) -> tuple[str, int]:
    """sha256 (RECORD form) and size of a member, inflated chunk by chunk; each chunk also goes to ``sink``.

    The bytes are read from the archive's data (``zipdata``): a local header that disagrees with the central
    directory, or a deflate stream longer or shorter than the sizes stated, is a BadZipFile, not a pass."""
    digest = hashlib.sha256()
    size = 0
    if zf.fp is None:
        raise zipfile.BadZipFile(f"{info.filename}: the archive is closed")
    for chunk in member_chunks(zf.fp, info):
        digest.update(chunk)
        size += len(chunk)
        if sink is not None:
            sink.write(chunk)
    return record_hash_of(digest.digest()), size


# What reading a damaged or hostile archive raises besides BadZipFile: zipfile refuses an unknown "version needed"
# or method (NotImplementedError), a name flagged UTF-8 that is not (UnicodeDecodeError, a ValueError), a header
# cut short (struct.error, EOFError); zlib its own errors. Readers turn each into a clear error of theirs.
ZIP_READ_ERRORS: tuple[type[Exception], ...] = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error,
                                                NotImplementedError, ValueError, struct.error, EOFError)
ZIP_OR_OS_ERRORS: tuple[type[Exception], ...] = (*ZIP_READ_ERRORS, OSError)  # also the file itself unreadable
MAX_METADATA = 64 << 20  # METADATA, RECORD, WHEEL, build-manifest.json: a vLLM wheel's RECORD is under 1 MB


def read_small(zf: zipfile.ZipFile, name: str, where: str, limit: int = MAX_METADATA) -> bytes:
    """A metadata member's bytes, read from the data (``zipdata``) and never past ``limit``, whatever the
    directory states: a RECORD inflating to a gigabyte is refused, not held."""
    info = zf.getinfo(name)
    if info.file_size > limit:
        raise ValidationError(f"{where}: {name} inflates to {info.file_size} bytes, over the {limit} a metadata "
                              "file may have", hint="this is no wheel a build backend makes")
    if zf.fp is None:
        raise zipfile.BadZipFile(f"{name}: the archive is closed")
    return b"".join(member_chunks(zf.fp, info))


@dataclass(frozen=True, kw_only=True)
class Hashed:
    name: str
    hash: str
    size: int
    error: str | None = None


def hash_members(data: bytes, infos: list[zipfile.ZipInfo], workers: int) -> list[Hashed]:
    """Every member of the wheel held in ``data`` hashed by streaming, spread over ``workers`` threads (zlib,
    crc32 and sha256 release the GIL): biggest first, each thread taking the next member when it is free, with
    a ZipFile of its own over the same bytes."""
    local = threading.local()
    readers: list[zipfile.ZipFile] = []

    def one(info: zipfile.ZipInfo) -> Hashed:
        zf = getattr(local, "zf", None)
        if zf is None:
            zf = local.zf = zipfile.ZipFile(io.BytesIO(data))
            readers.append(zf)
        try:
            digest, size = stream_member(zf, info)
        except ZIP_OR_OS_ERRORS as exc:
            return Hashed(name=info.filename, hash="", size=-1, error=f"unreadable: {exc}")
        return Hashed(name=info.filename, hash=digest, size=size)

    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(one, sorted(infos, key=lambda i: -i.compress_size)))
    finally:
        for zf in readers:
            zf.close()


def record_problems(hashed: Iterable[Hashed], rows: list[RecordRow], dist_info: str) -> list[str]:
    """Each member against its RECORD row (hash and size); members without a row and rows without a member."""
    listed = {r.path: r for r in rows}
    record_name = f"{dist_info}/RECORD"
    unlisted_ok = {record_name, *(f"{dist_info}/{s}" for s in SIGNATURES)}
    problems, seen = [], set()
    for h in sorted(hashed, key=lambda h: h.name):
        seen.add(h.name)
        row = listed.get(h.name)
        if h.error:
            problems.append(f"{h.name}: {h.error}")
        elif row is None:
            if h.name not in unlisted_ok:
                problems.append(f"extra (in wheel, not in RECORD): {h.name}")
        elif h.name != record_name and (row.hash != h.hash or row.size != str(h.size)):
            problems.append(f"{h.name}: RECORD says {row.hash or 'no hash'} size {row.size or '?'}, file has "
                            f"{h.hash} size {h.size}")
    problems.extend(f"missing (in RECORD, not in wheel): {p}" for p in sorted(listed) if p not in seen)
    return problems


def refuse(where: str, what: str, problems: list[str], hint: str) -> None:
    """Raise ValidationError naming the first problems (members included) when there are any."""
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise ValidationError(f"{where}: {what}: {shown}", hint=hint)
