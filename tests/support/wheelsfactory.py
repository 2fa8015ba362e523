"""Real test material for the validate and overlay tests: small wheels with true RECORDs, git-made patches,
and a project folder (patches/pins.yaml + series) that G4BUILD_HOME points at."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import signal
import struct
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import g4build
from g4build.data import patches_dir
from tests.support.yamltext import yaml_text

PIN = "vllm-0.21.0"
TAG = "cp38-abi3-manylinux_2_24_x86_64"

PRISTINE = {
    "vllm/__init__.py": "from vllm.version import __version__\n",
    "vllm/version.py": "__version__ = '0.21.0'\n",
    "vllm/spec/dflash.py": "".join(f"def step_{i}(x):\n    return x + {i}\n\n\n" for i in range(40)),
    "vllm/spec/utils.py": "LIMIT = 8\n\n\ndef clamp(n):\n    return min(n, LIMIT)\n",
    "vllm/obsolete.py": "OLD = True\n",
}


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(
    out: Path, files: dict[str, str | bytes] | None = None, *, name: str = "vllm", version: str = "0.21.0",
    tag: str = TAG, extra_members: dict[str, bytes] | None = None, record_override: dict[str, str] | None = None,
) -> Path:
    """A wheel made the way build backends make one: members, dist-info (METADATA, WHEEL, top_level), RECORD."""
    files = dict(PRISTINE if files is None else files)
    dist = f"{name}-{version}.dist-info"
    members: dict[str, bytes] = {k: v.encode() if isinstance(v, str) else v for k, v in files.items()}
    members[f"{dist}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nA test wheel.\n".encode()
    members[f"{dist}/WHEEL"] = f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {tag}\n".encode()
    members[f"{dist}/top_level.txt"] = f"{name}\n".encode()
    rows = [f"{p},{record_hash(d)},{len(d)}" for p, d in members.items()]
    for path, row in (record_override or {}).items():
        rows = [r for r in rows if not r.startswith(path + ",")] + ([row] if row else [])
    rows.append(f"{dist}/RECORD,,")
    members[f"{dist}/RECORD"] = ("\n".join(rows) + "\n").encode()
    members.update(extra_members or {})
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for member, data in members.items():
            zf.writestr(member, data)
    return path


def git_patch(before: dict[str, str], after: dict[str, str | None], work: Path) -> bytes:
    """A git-format patch from ``before`` to ``after`` (None deletes a file), made by real git."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    def git(*args: str) -> bytes:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=work,
                              check=True, capture_output=True).stdout

    git("init", "-q")
    for rel, text in before.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    git("add", "-A")
    git("commit", "-qm", "base")
    for rel, new in after.items():
        if new is None:
            (work / rel).unlink()
        else:
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / rel).write_text(new)
    git("add", "-A")
    return git("diff", "--cached", "--no-color")


@dataclass
class SeriesSpec:
    name: str
    patches: list[bytes]
    python_only: bool = True
    fingerprints: dict[str, list[str]] = field(default_factory=dict)
    version: int = 1


def make_project(root: Path, series: list[SeriesSpec], *, pins_text: str | None = None) -> Path:
    """A g4build project folder: the real pins.yaml (or ``pins_text``) and the given series, in order."""
    patches = root / "patches"
    patches.mkdir(parents=True, exist_ok=True)
    if pins_text is None:
        pins_text = (patches_dir() / "pins.yaml").read_text()
    (patches / "pins.yaml").write_text(pins_text)
    (patches / "series.yaml").write_text(yaml_text({"order": [s.name for s in series]}))
    for s in series:
        folder = patches / s.name / PIN
        folder.mkdir(parents=True, exist_ok=True)
        entries = []
        for i, data in enumerate(s.patches, start=1):
            (folder / f"{i:04d}-change.patch").write_bytes(data)
            entries.append({"file": f"{PIN}/{i:04d}-change.patch", "subject": f"change {i}"})
        meta = {"name": s.name, "version": s.version, "title": s.name, "python_only": s.python_only,
                "pins": {PIN: {"patches": entries, "fingerprints": s.fingerprints}}}
        (patches / s.name / "series.yaml").write_text(yaml_text(meta))
    return root


def member_raw(wheel: Path, name: str) -> bytes:
    """A member's compressed bytes exactly as stored."""
    with zipfile.ZipFile(wheel) as zf, wheel.open("rb") as fh:
        info = zf.getinfo(name)
        fh.seek(info.header_offset + 26)
        n, m = int.from_bytes(fh.read(2), "little"), int.from_bytes(fh.read(2), "little")
        fh.seek(info.header_offset + 30 + n + m)
        return fh.read(info.compress_size)


DFLASH_NEW = PRISTINE["vllm/spec/dflash.py"].replace("return x + 7\n", "return x + 7  # G4 fix: step 7\n")
UTILS_NEW = PRISTINE["vllm/spec/utils.py"].replace("LIMIT = 8", "LIMIT = 16  # G4 limit")


@pytest.fixture
def series_specs(tmp_path: Path) -> list[SeriesSpec]:
    first = git_patch(PRISTINE, {"vllm/spec/dflash.py": DFLASH_NEW, "vllm/spec/added.py": "ADDED = 1\n",
                                 "vllm/obsolete.py": None}, tmp_path / "g1")
    second = git_patch({**PRISTINE, "vllm/spec/dflash.py": DFLASH_NEW}, {"vllm/spec/utils.py": UTILS_NEW},
                       tmp_path / "g2")
    return [
        SeriesSpec(name="alpha", patches=[first], fingerprints={"vllm/spec/dflash.py": ["G4 fix: step 7"]}),
        SeriesSpec(name="beta", patches=[second], fingerprints={"vllm/spec/utils.py": ["LIMIT = 16"]}),
    ]


@pytest.fixture
def project(tmp_path: Path, series_specs: list[SeriesSpec], monkeypatch: pytest.MonkeyPatch) -> Path:
    root = make_project(tmp_path / "project", series_specs)
    monkeypatch.setenv("G4BUILD_HOME", str(root))
    return root


@pytest.fixture
def small_wheel(tmp_path: Path) -> Path:
    return build_wheel(tmp_path / "in")


def run_g4build(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real CLI in a subprocess (this checkout's package first on the path)."""
    toolkit = str(Path(g4build.__file__).resolve().parents[1])
    full = {**os.environ, **(env or {})}
    full["PYTHONPATH"] = os.pathsep.join(p for p in (toolkit, full.get("PYTHONPATH")) if p)
    full["COLUMNS"] = "200"
    return subprocess.run([sys.executable, "-m", "g4build", *args], capture_output=True, text=True, env=full,
                          check=False, preexec_fn=_default_sigint if os.name == "posix" else None)


def _default_sigint() -> None:
    """In the child before exec: SIGINT back to its default, so the CLI gets Python's KeyboardInterrupt for it.
    A test run started as a background job inherits SIGINT ignored, and an ignored SIGINT stays ignored across
    exec: the Ctrl-C tests (G4BUILD_FAULT=...:SIGINT) would then see no interrupt at all."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# Fatbin containers laid out as nvcc writes them (see g4build.validate.fatbin), and minimal ELF / PE files.
def entry(kind: int, arch: int, payload: bytes, flags: int = 0x11, header: int = 64) -> bytes:
    head = struct.pack("<HHIQIIHHIIIQQQ", kind, 0x0101, header, len(payload), 0, 64, 8, 1, arch, 0, 0, flags, 0, 0)
    return head + b"\0" * (header - len(head)) + payload


def container(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def elf(sections: dict[str, bytes]) -> bytes:
    """A minimal little-endian ELF64 file with the given sections (and a section-name table)."""
    names = b"\0" + b"".join(n.encode() + b"\0" for n in [*sections, ".shstrtab"])
    blobs, offset = [], 64
    headers = [b"\0" * 64]
    for name, data in [*sections.items(), (".shstrtab", names)]:
        name_off = names.index(name.encode() + b"\0")
        headers.append(struct.pack("<IIQQQQIIQQ", name_off, 1, 0, 0, offset, len(data), 0, 0, 8, 0))
        blobs.append(data)
        offset += len(data)
    shoff = offset
    ident = b"\x7fELF" + bytes([2, 1, 1]) + b"\0" * 9
    head = ident + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, len(headers),
                               len(headers) - 1)
    return head + b"".join(blobs) + b"".join(headers)


def pe(sections: dict[bytes, bytes]) -> bytes:
    """A minimal PE32+ image: DOS stub, COFF header, empty optional header, section table, raw data."""
    table_at = 0x40 + 24
    data_at = table_at + 40 * len(sections)
    table, blobs = b"", b""
    for name, data in sections.items():
        table += struct.pack("<8sIIIIIIHHI", name, len(data), 0x1000, len(data), data_at + len(blobs), 0, 0, 0, 0, 0)
        blobs += data
    dos = b"MZ" + b"\0" * 58 + struct.pack("<I", 0x40)
    coff = b"PE\0\0" + struct.pack("<HHIIIHH", 0x8664, len(sections), 0, 0, 0, 0, 0x2022)
    return dos + coff + table + blobs
