"""The reading pass of validation: one streaming pass over a wheel's members.

Every member is inflated once, chunk by chunk (in threads: zlib and sha256 release the GIL), and hashed for
RECORD; native libraries are spooled to a scratch file and mapped for their fatbin headers (never held whole
in memory); only the few files the series fingerprints need are kept. Sizes are limited before anything is
inflated (safety.check_limits), so a zip bomb is refused instead of filling memory or disk.
"""

from __future__ import annotations

import io
import mmap
import os
import tempfile
import threading
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from g4build.series.model import Series, load_all
from g4build.validate import cudatools
from g4build.validate.elf import ElfFormatError, ElfNeeds, read_elf_needs
from g4build.validate.fatbin import FatbinFormatError, LibraryArchs, is_native, read_library_archs
from g4build.wheelfile.manifestfile import MANIFEST_NAME, loads
from g4build.wheelfile.safety import (
    ZIP_OR_OS_ERRORS,
    check_limits,
    member_problems,
    read_small,
    stored_twice,
    stream_member,
)

# FlashAttention 4's CuteDSL files in a vLLM wheel: kept as text so validation can read their imports
FA4_CUTE = "vllm/vllm_flash_attn/cute/"


def is_fa4_cute(name: str) -> bool:
    return name.startswith(FA4_CUTE) and name.endswith(".py")


@dataclass(frozen=True, kw_only=True)
class Member:
    name: str
    hash: str
    size: int
    error: str | None = None  # the member could not be read (CRC, inflate)
    fatbin_error: str | None = None  # a native library whose fatbin headers are malformed
    fatbins: LibraryArchs | None = None
    cuobjdump: dict[str, int] | None = None
    cuobjdump_error: str | None = None  # cuobjdump could not list the library
    text: bytes | None = None
    elf: ElfNeeds | None = None  # an ELF library's machine and glibc symbol versions (the wheel's tags)
    elf_error: str | None = None


@dataclass(frozen=True, kw_only=True)
class Contents:
    dist_info: str | None
    metadata: bytes | None
    record: bytes | None
    manifest: dict[str, Any] | None
    members: dict[str, Member]
    duplicates: tuple[str, ...] = ()  # member names stored more than once (one would shadow the other)
    wheel_file: bytes | None = None  # the dist-info WHEEL file
    unsafe: tuple[str, ...] = ()  # safety.member_problems: links, names Windows or case-insensitive FS mangle
    series: tuple[Series, ...] = ()  # this checkout's series, read once when the wheel has a manifest


def dist_info_of(names: list[str]) -> str | None:
    tops = sorted({n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info") and "/" in n})
    return tops[0] if len(tops) == 1 else None


def fingerprint_paths(manifest: dict[str, Any] | None, series: tuple[Series, ...]) -> set[str]:
    if not manifest:
        return set()
    pin = manifest.get("pin")
    pin_name = str(pin.get("name", "")) if isinstance(pin, dict) else ""
    wanted = {str(s.get("name")) for s in manifest["series"]}
    paths: set[str] = set()
    for s in series:
        variant = s.variant(pin_name)
        if s.name in wanted and variant is not None:
            paths.update(variant.fingerprints)
    return paths


def read_wheel(path: Path, *, keep: set[str], cuobjdump: Path | None, workers: int | None = None) -> Contents:
    """One pass over every member: sha256 + size, fatbin headers, and the bytes of ``keep`` + dist-info."""
    with zipfile.ZipFile(path) as zf:
        check_limits(zf.infolist(), path.name)
        unsafe = member_problems(zf.infolist())
        infos = [i for i in zf.infolist() if not i.is_dir()]
        names = [i.filename for i in infos]
        dist = dist_info_of(names)
        small = {n: read_small(zf, n, path.name) for n in names if dist and n.startswith(dist + "/") and
                 n.rsplit("/", 1)[-1] in ("METADATA", "RECORD", "WHEEL", MANIFEST_NAME)}
    manifest = None
    if dist and f"{dist}/{MANIFEST_NAME}" in small:
        manifest = loads(small[f"{dist}/{MANIFEST_NAME}"], path.name)
    series = tuple(load_all()) if manifest else ()  # read once: the checks of the series use them too
    keep = keep | fingerprint_paths(manifest, series) | {n for n in names if is_fa4_cute(n)}
    local = threading.local()
    tmp = tempfile.TemporaryDirectory(prefix="g4build-validate-")

    def one(info: zipfile.ZipInfo) -> Member:
        zf = getattr(local, "zf", None)
        if zf is None:
            zf = local.zf = zipfile.ZipFile(path)
        native = is_native(info.filename)
        spool = Path(tmp.name) / f"{threading.get_ident()}-{os.path.basename(info.filename)}"
        try:
            with spool.open("w+b") if native else io.BytesIO() as sink:
                digest, size = stream_member(zf, info, sink if native or info.filename in keep else None)
                text = sink.getvalue() if isinstance(sink, io.BytesIO) and info.filename in keep else None
                member = Member(name=info.filename, hash=digest, size=size, text=text)
                if not native:
                    return member
                if size < 4:  # an emptied library: nothing to load, no code for any arch
                    return _not_a_library(member, f"{size} bytes")
                sink.flush()
                with mmap.mmap(sink.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                    return _library(member, mapped, spool)
        except ZIP_OR_OS_ERRORS as exc:
            return Member(name=info.filename, hash="", size=-1, error=f"unreadable: {exc}")
        finally:
            spool.unlink(missing_ok=True)

    def _not_a_library(member: Member, found: str) -> Member:
        return Member(name=member.name, hash=member.hash, size=member.size, text=member.text,
                      fatbin_error=f"{member.name}: expected an ELF or PE library (its name says native code), "
                                   f"found {found}: it holds no readable code for any GPU arch")

    def _library(member: Member, data: mmap.mmap, spool: Path) -> Member:
        if data[:4] != b"\x7fELF" and data[:2] != b"MZ":
            return _not_a_library(member, f"{member.size} bytes starting {bytes(data[:4])!r}")
        # the ELF needs are read whatever the fatbin reader says: a library it refuses still binds glibc
        # versions, and the tags check must see them (fail closed: never "0 ELF" for an unread library)
        elf, elf_error = None, None
        if data[:4] == b"\x7fELF":
            try:
                elf = read_elf_needs(data)
            except ElfFormatError as exc:
                elf_error = str(exc)
        try:
            archs = read_library_archs(cast(bytes, data), member.name)  # mmap reads like bytes: find, slices
        except FatbinFormatError as exc:
            return Member(name=member.name, hash=member.hash, size=member.size, text=member.text,
                          fatbin_error=str(exc), elf=elf, elf_error=elf_error)
        listed, failed = None, None
        if archs.fatbins and cuobjdump:
            try:
                listed = cudatools.list_archs(cuobjdump, spool)
            except cudatools.CuobjdumpFailed as exc:
                failed = str(exc)
        return Member(name=member.name, hash=member.hash, size=member.size, text=member.text,
                       fatbins=archs, cuobjdump=listed, cuobjdump_error=failed, elf=elf, elf_error=elf_error)

    try:
        with ThreadPoolExecutor(max_workers=workers or min(8, os.cpu_count() or 2)) as pool:
            # biggest first, so the long ones do not start last
            ordered = sorted(infos, key=lambda i: -i.compress_size)
            members = {m.name: m for m in pool.map(one, ordered)}
    finally:
        tmp.cleanup()
    return Contents(
        dist_info=dist,
        metadata=small.get(f"{dist}/METADATA"),
        record=small.get(f"{dist}/RECORD"),
        manifest=manifest,
        members=members,
        duplicates=tuple(stored_twice(names)),
        wheel_file=small.get(f"{dist}/WHEEL"),
        unsafe=tuple(unsafe),
        series=series,
    )
