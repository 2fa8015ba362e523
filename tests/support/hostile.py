"""Builders of hostile wheels, made in the test's tmp_path with zipfile: each differs from a sound wheel in one
way an attacker (or a broken tool) would choose, and RECORD is true for everything unless the case is about it."""

from __future__ import annotations

import base64
import hashlib
import stat
import zipfile
from pathlib import Path

from tests.support.wheelsfactory import PRISTINE, TAG, record_hash

SOUND_WHEEL_FILE = f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {TAG}\n".encode()
SYMLINK = (stat.S_IFLNK | 0o777) << 16


def hostile_wheel(
    out: Path, *, add: dict[str, bytes] | None = None, wheel_file: bytes | None = SOUND_WHEEL_FILE,
    attrs: dict[str, int] | None = None, extra_rows: list[str] | None = None, folders: tuple[str, ...] = (),
    version: str = "0.21.0",
) -> Path:
    """PRISTINE plus ``add``; ``wheel_file`` None leaves WHEEL out; ``attrs`` sets members' external_attr;
    ``extra_rows`` are appended to a RECORD that is otherwise true; ``folders`` become directory entries."""
    dist = f"vllm-{version}.dist-info"
    members = {k: v.encode() for k, v in PRISTINE.items()} | (add or {})
    members[f"{dist}/METADATA"] = f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n\nA test wheel.\n".encode()
    if wheel_file is not None:
        members[f"{dist}/WHEEL"] = wheel_file
    rows = [f"{p},{record_hash(d)},{len(d)}" for p, d in members.items()] + (extra_rows or [])
    members[f"{dist}/RECORD"] = ("\n".join([*rows, f"{dist}/RECORD,,"]) + "\n").encode()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"vllm-{version}-{TAG}.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for folder in folders:
            zf.writestr(zipfile.ZipInfo(folder.rstrip("/") + "/"), b"")
        for name, data in members.items():
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 2, 3, 4, 6))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (attrs or {}).get(name, 0o644 << 16)
            zf.writestr(info, data)
    return path


def tamper(wheel: Path, name: str, payload: bytes) -> None:
    """Append ``payload`` to member ``name`` in place, keeping every other member and RECORD as they are."""
    with zipfile.ZipFile(wheel) as zf:
        items = [(info, zf.read(info)) for info in zf.infolist()]
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for info, data in items:
            zf.writestr(info, data + payload if info.filename == name else data)


def zip_bomb(out: Path, name: str, size: int) -> Path:
    """A wheel (true RECORD) whose member ``name`` is ``size`` zero bytes: deflate packs them ~1000:1. Written in
    chunks, so making it never holds the inflated member."""
    dist = "vllm-0.21.0.dist-info"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"vllm-0.21.0-{TAG}.whl"
    digest = hashlib.sha256()
    chunk = b"\0" * (1 << 20)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        info = zipfile.ZipInfo(name)
        info.compress_type = zipfile.ZIP_DEFLATED
        with zf.open(info, "w", force_zip64=True) as member:
            for _ in range(size // len(chunk)):
                member.write(chunk)
                digest.update(chunk)
        row = f"{name},sha256={base64.urlsafe_b64encode(digest.digest()).rstrip(b'=').decode()},{size}"
        meta = b"Metadata-Version: 2.1\nName: vllm\nVersion: 0.21.0\n\n"
        zf.writestr(f"{dist}/METADATA", meta)
        zf.writestr(f"{dist}/WHEEL", SOUND_WHEEL_FILE)
        rows = [row, f"{dist}/METADATA,{record_hash(meta)},{len(meta)}",
                f"{dist}/WHEEL,{record_hash(SOUND_WHEEL_FILE)},{len(SOUND_WHEEL_FILE)}", f"{dist}/RECORD,,"]
        zf.writestr(f"{dist}/RECORD", "\n".join(rows) + "\n")
    return path
