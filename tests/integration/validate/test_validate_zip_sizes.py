"""Sizes are read from the data: a wheel whose central directory (its Zip64 extra field, or its 32-bit fields)
states a member size other than the one its local header and deflate stream hold is refused by `validate` and
`overlay`, even when RECORD was written to agree with the directory's lie (as ``zipfile`` reads it, the member
is cut at the stated size and the CRC was computed for the cut). Archives are forged byte by byte here."""

from __future__ import annotations

import random
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.support.wheelsfactory import PRISTINE, TAG, record_hash, run_g4build

from g4build.errors import ValidationError
from g4build.validate.wheel import ValidateOptions, validate_wheel

TARGET = "vllm/spec/dflash.py"
DIST = "vllm-0.21.0.dist-info"


@dataclass
class Sizes:
    crc: int
    csize: int
    usize: int
    zip64: bool = False  # the 32-bit fields hold 0xFFFFFFFF and the Zip64 extra holds the sizes
    name: str | None = None


def _forge(path: Path, members: list[tuple[str, bytes, int, Sizes, Sizes]]) -> Path:
    """(name, stored bytes, method, what the local header says, what the central directory says) each."""
    out, central = bytearray(), bytearray()
    for name, data, method, local, cent in members:
        offset = len(out)
        for sizes, is_local in ((local, True), (cent, False)):
            encoded = (sizes.name or name).encode()
            extra = (struct.pack("<HH", 1, 16 if is_local else 24) + struct.pack("<QQ", sizes.usize, sizes.csize)
                     + (b"" if is_local else struct.pack("<Q", offset))) if sizes.zip64 else b""
            c32 = 0xFFFFFFFF if sizes.zip64 else sizes.csize
            u32 = 0xFFFFFFFF if sizes.zip64 else sizes.usize
            if is_local:
                out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 0, method, 0, 0x21, sizes.crc, c32, u32,
                                   len(encoded), len(extra)) + encoded + extra + data
            else:
                central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 0x0314, 45, 0, method, 0, 0x21, sizes.crc,
                                       c32, u32, len(encoded), len(extra), 0, 0, 0, 0o644 << 16,
                                       0xFFFFFFFF if sizes.zip64 else offset) + encoded + extra
    start = len(out)
    out += central
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(central), start, 0)
    path.write_bytes(bytes(out))
    return path


def _deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(6, zlib.DEFLATED, -15)
    return packer.compress(data) + packer.flush()


def _wheel(out: Path, target_local: Sizes | None, target_central: Sizes | None, record_as: bytes | None,
           payload: bytes | None = None) -> Path:
    """A wheel of PRISTINE; TARGET's headers say what the arguments say and RECORD lists ``record_as`` for it."""
    files = {k: v.encode() for k, v in PRISTINE.items()}
    files[f"{DIST}/METADATA"] = b"Metadata-Version: 2.1\nName: vllm\nVersion: 0.21.0\n\n"
    files[f"{DIST}/WHEEL"] = f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {TAG}\n".encode()
    rows = [f"{p},{record_hash(record_as if p == TARGET and record_as is not None else d)},"
            f"{len(record_as if p == TARGET and record_as is not None else d)}" for p, d in files.items()]
    files[f"{DIST}/RECORD"] = ("\n".join([*rows, f"{DIST}/RECORD,,"]) + "\n").encode()
    members = []
    for name, data in files.items():
        packed = payload if name == TARGET and payload is not None else _deflate(data)
        true = Sizes(crc=zlib.crc32(data), csize=len(packed), usize=len(data))
        local = target_local if name == TARGET and target_local else true
        central = target_central if name == TARGET and target_central else true
        members.append((name, packed, zipfile.ZIP_DEFLATED, local, central))
    out.mkdir(parents=True, exist_ok=True)
    return _forge(out / f"vllm-0.21.0-{TAG}.whl", members)


REAL = PRISTINE[TARGET].encode()
CUT = REAL[:100]  # what zipfile yields when a directory states 100 bytes


def _lies() -> dict[str, tuple[Sizes | None, Sizes | None, bytes | None]]:
    packed = len(_deflate(REAL))
    true = Sizes(crc=zlib.crc32(REAL), csize=packed, usize=len(REAL))
    cut = Sizes(crc=zlib.crc32(CUT), csize=packed, usize=len(CUT))
    return {
        "zip64 central extra understates, local header true": (true, Sizes(**{**cut.__dict__, "zip64": True}), CUT),
        "32-bit central size understates, local header true": (true, cut, CUT),
        "both headers understate the deflate stream": (cut, cut, CUT),
        "both zip64 extras understate the deflate stream": (Sizes(**{**cut.__dict__, "zip64": True}),
                                                             Sizes(**{**cut.__dict__, "zip64": True}), CUT),
        "zip64 central extra overstates": (true, Sizes(**{**true.__dict__, "usize": 1 << 40, "zip64": True}),
                                           None),
        "local header names another member": (Sizes(**{**true.__dict__, "name": "vllm/spec/evil.py"}), true, None),
    }


@pytest.mark.parametrize("case", sorted(_lies()))
def test_a_size_lie_is_refused_by_validate(tmp_path: Path, case: str) -> None:
    local, central, record_as = _lies()[case]
    wheel = _wheel(tmp_path, local, central, record_as)
    try:
        report = validate_wheel(wheel, ValidateOptions())
    except ValidationError as exc:  # refused before reading (an overstated size reads as a zip bomb)
        assert TARGET in exc.message
        return
    failed = {c.name: c.detail for c in report.failures()}
    assert failed, f"{case}: passed validation"
    assert TARGET in " ".join(failed.values()), failed


def test_the_forger_makes_sound_wheels(tmp_path: Path) -> None:
    """Without a lie the forged wheel passes: the failures above are the lies'."""
    wheel = _wheel(tmp_path, None, None, None)
    report = validate_wheel(wheel, ValidateOptions())
    assert report.ok, report.failures()


def test_a_deflate_stream_shorter_than_its_compressed_size_is_refused(tmp_path: Path) -> None:
    """Bytes hidden after the end of the deflate stream, inside the stated compressed size."""
    packed = _deflate(REAL) + b"hidden payload"
    sizes = Sizes(crc=zlib.crc32(REAL), csize=len(packed), usize=len(REAL))
    wheel = _wheel(tmp_path, sizes, sizes, None, payload=packed)
    failed = {c.name: c.detail for c in validate_wheel(wheel, ValidateOptions()).failures()}
    assert "bytes follow the end of the deflate stream" in " ".join(failed.values())


def test_cli_validate_and_overlay_refuse_a_zip64_lie(tmp_path: Path) -> None:
    local, central, record_as = _lies()["zip64 central extra understates, local header true"]
    wheel = _wheel(tmp_path / "in", local, central, record_as)
    done = run_g4build("validate", str(wheel))
    assert done.returncode == 10 and "Traceback" not in done.stderr, done.stderr
    over = run_g4build("overlay", str(wheel), "--pin", "vllm-0.21.0", "--out", str(tmp_path / "out"))
    assert over.returncode == 10, over.stderr
    assert TARGET in over.stderr and not (tmp_path / "out").exists()


def test_metadata_is_read_no_further_than_its_limit(tmp_path: Path) -> None:
    from g4build.wheelfile.safety import read_small

    wheel = _wheel(tmp_path, None, None, None)
    with zipfile.ZipFile(wheel) as zf:
        assert read_small(zf, f"{DIST}/METADATA", wheel.name).startswith(b"Metadata-Version")
        with pytest.raises(ValidationError, match="over the 10 a metadata file may have"):
            read_small(zf, f"{DIST}/RECORD", wheel.name, limit=10)


def _mutations(good: bytes, seed: int, count: int) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(len(data) - 4)
            kind = rng.random()
            if kind < 0.6:
                data[pos] = rng.randrange(256)
            elif kind < 0.8:
                struct.pack_into("<I", data, pos, rng.choice([0, 0xFFFFFFFF, rng.randrange(2**32)]))
            else:
                struct.pack_into("<H", data, pos, rng.choice([0, 0xFFFF, 1, rng.randrange(65536)]))
        out.append(bytes(data))
    return out


def test_damaged_archives_are_clear_errors_never_tracebacks(tmp_path: Path) -> None:
    """Bytes flipped and header fields overwritten at random (seeded): every outcome is a report or a G4BuildError
    (an empty member name, a header offset before the start, an unknown 'version needed', a name flagged UTF-8
    that is not, damaged deflate data were each a traceback before)."""
    from g4build.errors import G4BuildError

    good = _wheel(tmp_path / "good", None, None, None).read_bytes()
    path = tmp_path / f"vllm-0.21.0-{TAG}.whl"
    escaped: dict[str, int] = {}
    for data in _mutations(good, seed=3, count=400):
        path.write_bytes(data)
        try:
            validate_wheel(path, ValidateOptions())
        except G4BuildError:
            pass
        except Exception as exc:
            escaped[type(exc).__name__] = escaped.get(type(exc).__name__, 0) + 1
    assert escaped == {}
