"""The two sources a rewritten wheel's bytes come from: what they hash is what they hand out, and a file that
changes between two reads of the same bytes, or a read that goes backwards, is caught rather than copied."""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from pathlib import Path

import pytest

from g4build.wheelfile import sources
from g4build.wheelfile.sources import Snapshot, SourceChanged, Streamed


def _file(tmp_path: Path, size: int = 3 * sources.CHUNK + 12345) -> Path:
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(size))
    return path


def test_streamed_hands_out_and_hashes_every_byte_once(tmp_path: Path) -> None:
    path = _file(tmp_path)
    data = path.read_bytes()
    out = io.BytesIO()
    with Streamed.open(path) as src:
        head = src.read_at(10, 100)
        src.copy_to(out, 500, sources.CHUNK * 2)  # across chunk boundaries
        tail = src.read_at(len(data) - 7, 7)
        assert src.finish() == hashlib.sha256(data).hexdigest()
    assert head == data[10:110] and out.getvalue() == data[500:500 + sources.CHUNK * 2] and tail == data[-7:]


def test_streamed_refuses_to_go_back(tmp_path: Path) -> None:
    path = _file(tmp_path)
    with Streamed.open(path) as src:
        src.read_at(sources.CHUNK + 10, 10)
        with pytest.raises(SourceChanged, match="goes back"):
            src.read_at(sources.CHUNK + 15, 10)  # overlapping members would need this
        with pytest.raises(SourceChanged, match="ends at"):
            src.read_at(path.stat().st_size - 5, 10)


def test_a_random_read_that_the_pass_reads_otherwise_is_caught(tmp_path: Path) -> None:
    path = _file(tmp_path)
    with Streamed.open(path) as src:
        fh = src.file()
        fh.seek(sources.CHUNK + 100)
        fh.read(64)  # e.g. the zip directory, read before the copy
        with path.open("r+b") as w:  # the file changes under the reader (another process replaces bytes)
            w.seek(sources.CHUNK + 120)
            w.write(b"X" * 8)
        with pytest.raises(SourceChanged, match="other bytes when read before"):
            src.finish()
        with pytest.raises(SourceChanged, match="other bytes when read before"):
            src.finish()  # no digest comes out of a pass that saw two versions of the file


def test_no_random_read_once_the_pass_began(tmp_path: Path) -> None:
    path = _file(tmp_path)
    with Streamed.open(path) as src:
        fh = src.file()
        src.read_at(0, 4)
        with pytest.raises(SourceChanged, match="after its pass began"):
            fh.read(4)


def test_a_zipfile_reads_through_the_streamed_file(tmp_path: Path) -> None:
    path = tmp_path / "a.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("a.txt", b"alpha" * 1000)
        zf.writestr("b.txt", b"beta" * 1000)
    with Streamed.open(path) as src, zipfile.ZipFile(src.file()) as zf:
        assert zf.read("b.txt") == b"beta" * 1000
        assert src.finish() == hashlib.sha256(path.read_bytes()).hexdigest()


def test_snapshot_holds_what_it_hashed(tmp_path: Path) -> None:
    path = _file(tmp_path, 5000)
    snap = Snapshot.read(path)
    path.write_bytes(b"other")  # later changes on disk do not reach the snapshot
    out = io.BytesIO()
    snap.copy_to(out, 100, 50)
    assert snap.sha256 == hashlib.sha256(snap.data).hexdigest() and out.getvalue() == snap.data[100:150]
    assert snap.read_at(0, 10) == snap.data[:10]
    with pytest.raises(SourceChanged, match="runs past the end"):
        snap.copy_to(out, 4990, 20)
