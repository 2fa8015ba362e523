"""Wheel names, tags, METADATA and RECORD handling; the raw zip writer keeps compressed bytes as they are."""

from __future__ import annotations

import contextlib
import hashlib
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version
from tests.support.wheelsfactory import build_wheel, member_raw

from g4build.errors import ValidationError
from g4build.wheelfile.sources import Snapshot, Streamed
from g4build.wheelfile.wheelfile import (
    RecordRow,
    WheelName,
    extend_local_label,
    format_record,
    metadata_fields,
    parse_record,
    set_metadata_version,
    tags_fit_target,
)
from g4build.wheelfile.zipraw import RawZipWriter


def test_wheel_name_and_new_version() -> None:
    w = WheelName.parse("vllm-0.21.0+cu132-cp312-cp312-win_amd64.whl")
    assert (w.project, str(w.version), w.tags) == ("vllm", "0.21.0+cu132", ("cp312-cp312-win_amd64",))
    assert w.with_version("0.21.0+cu132.g4.abc") == "vllm-0.21.0+cu132.g4.abc-cp312-cp312-win_amd64.whl"
    with pytest.raises(ValidationError, match="not a valid wheel filename"):
        WheelName.parse("vllm-latest.whl")


@pytest.mark.parametrize(
    ("tag", "fits"),
    [("cp38-abi3-manylinux_2_24_x86_64", True), ("cp312-cp312-win_amd64", True), ("cp311-cp311-linux_x86_64", True),
     ("py3-none-any", False), ("cp312-cp312-macosx_11_0_arm64", False), ("cp38-abi3-manylinux_2_28_aarch64", False)],
)
def test_tags_fit_target(tag: str, fits: bool) -> None:
    assert tags_fit_target((tag,))[0] is fits


def test_local_label_extension() -> None:
    assert extend_local_label(Version("0.21.0+cu132"), "abc123") == "0.21.0+cu132.g4.abc123"
    assert extend_local_label(Version("0.21.0"), "abc123") == "0.21.0+g4.abc123"


def test_metadata_version_replaced_and_body_kept() -> None:
    raw = b"Metadata-Version: 2.1\r\nName: vllm\r\nVersion: 0.21.0\r\n\r\nVersion: in the body stays\r\n"
    new = set_metadata_version(raw, "0.21.0+g4.x")
    assert new == raw.replace(b"Version: 0.21.0\r", b"Version: 0.21.0+g4.x\r", 1)
    assert metadata_fields(new)["version"] == "0.21.0+g4.x"


def test_record_round_trip_with_quoting() -> None:
    rows = [RecordRow(path="a,b.py", hash="sha256=x", size="3"), RecordRow(path="d/RECORD", hash="", size="")]
    assert parse_record(format_record(rows), "t") == rows
    with pytest.raises(ValidationError, match="expected 3 fields"):
        parse_record(b"a,b\n", "t")


@pytest.mark.parametrize("kind", ["snapshot", "streamed"])
def test_raw_copy_keeps_compressed_bytes(tmp_path: Path, kind: str) -> None:
    src = build_wheel(tmp_path / "in", {"vllm/__init__.py": "x = 1\n" * 500, "vllm/big.bin": bytes(range(256)) * 9000})
    out = tmp_path / "out.zip"
    with contextlib.ExitStack() as stack:
        source: Snapshot | Streamed = Snapshot.read(src) if kind == "snapshot" else stack.enter_context(
            Streamed.open(src))
        zf = stack.enter_context(zipfile.ZipFile(source.file()))
        fh = stack.enter_context(out.open("wb"))
        writer = RawZipWriter(fh)
        for info in sorted(zf.infolist(), key=lambda i: i.header_offset):
            writer.copy_raw(source, info, "renamed/" + info.filename if info.filename.endswith("big.bin") else None)
        writer.write("vllm/new.py", b"NEW = 1\n", date_time=(2024, 1, 2, 3, 4, 6))
        writer.close()
        if isinstance(source, Streamed):
            assert source.finish() == hashlib.sha256(src.read_bytes()).hexdigest()
    with zipfile.ZipFile(out) as zf:
        assert zf.testzip() is None
        assert zf.read("renamed/vllm/big.bin") == bytes(range(256)) * 9000
        assert zf.read("vllm/new.py") == b"NEW = 1\n"
        assert zf.getinfo("vllm/new.py").date_time == (2024, 1, 2, 3, 4, 6)
    assert member_raw(out, "vllm/__init__.py") == member_raw(src, "vllm/__init__.py")
    assert member_raw(out, "renamed/vllm/big.bin") == member_raw(src, "vllm/big.bin")
