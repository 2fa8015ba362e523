"""A venv overlay's journal (.g4build-overlay/record.json) is read bounded and typed: nesting 200k deep, a FIFO,
/dev/zero, a sparse huge file or values of the wrong type are a ValidationError (exit 10) saying how to recover,
never a RecursionError, a hang or a MemoryError, and nothing in the venv is changed."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from tests.support.hangs import within

from g4build.errors import ValidationError
from g4build.overlay.venv import undo_venv
from g4build.overlay.venvjournal import (
    JOURNAL_MAX_BYTES,
    RECORD_JSON,
    STATE,
    Entry,
    Journal,
    read_journal,
    write_journal,
)

FILE: dict[str, Any] = {"path": "vllm/x.py", "kind": "file", "before": "a" * 64, "link": None, "after": "b" * 64}
GOOD: dict[str, Any] = {"version": 2, "status": "done", "pin": "vllm-0.21.0", "digest": "d1",
                        "site_packages": "lib/site-packages", "files": [FILE], "created_dirs": []}


@pytest.fixture
def venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("G4BUILD_CACHE", str(tmp_path / "cache"))  # where the venv's lock file lives
    folder = tmp_path / "venv"
    (folder / STATE).mkdir(parents=True)
    return folder


def _tree(folder: Path) -> dict[str, bytes | str]:
    return {p.relative_to(folder).as_posix(): (p.read_bytes() if p.is_file() and not p.is_symlink() else "other")
            for p in sorted(folder.rglob("*"))}


def _with(files: object = None, **changes: object) -> bytes:
    data = {**GOOD, **changes}
    if files is not None:
        data["files"] = files
    return json.dumps(data).encode()


HOSTILE = {
    "nested 200k deep": b'{"version": 2, "files": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
    "nested past the bound": b'{"version": 2, "files": ' + b"[" * 100 + b"]" * 100 + b"}",
    "a list": b"[]",
    "files a mapping": _with(files={"a": 1}),
    "a file entry a string": _with(files=["vllm/x.py"]),
    "before a number": _with(files=[{**FILE, "before": 7}]),
    "after not a sha256": _with(files=[{**FILE, "after": "zz"}]),
    "link a list": _with(files=[{**FILE, "kind": "link", "link": ["x"]}]),
    "status a number": _with(status=3),
    "created_dirs a string": _with(created_dirs="vllm"),
    "an older record with a number for its RECORD": json.dumps({**GOOD, "version": 1, "record": 5}).encode(),
    "a 40-digit number": b'{"version": 2, "pin": ' + b"9" * 40 + b"}",
    "NaN": b'{"version": NaN}',
    "not UTF-8": b'{"version": "\xff"}',
}


@pytest.mark.parametrize("content", HOSTILE.values(), ids=list(HOSTILE))
def test_a_journal_that_is_not_one_g4build_writes_is_a_clear_error(venv: Path, content: bytes) -> None:
    (venv / STATE / RECORD_JSON).write_bytes(content)
    before = _tree(venv)
    with pytest.raises(ValidationError) as caught:
        undo_venv(venv)
    assert str(venv / STATE / RECORD_JSON) in caught.value.message and "pip install --force-reinstall" in str(
        caught.value.hint)
    assert _tree(venv) == before


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "sparse"])
def test_a_journal_that_is_no_small_regular_file_is_refused_unread(venv: Path, kind: str) -> None:
    record = venv / STATE / RECORD_JSON
    if kind == "fifo":
        os.mkfifo(record)
    elif kind == "dev-zero":
        record.symlink_to("/dev/zero")
    else:
        with open(record, "wb") as fh:
            fh.truncate(JOURNAL_MAX_BYTES + (1 << 20))  # sparse: refused by its size before a byte is read
    with pytest.raises(ValidationError) as caught:
        within(lambda: read_journal(venv / STATE), fifos=[record])
    found = {"fifo": "FIFO", "dev-zero": "/dev/zero", "sparse": "more than the"}[kind]
    assert found in caught.value.message and caught.value.hint and "--force-reinstall" in caught.value.hint


def test_a_journal_g4build_wrote_reads_back(venv: Path) -> None:
    journal = Journal(status="overlaying", pin="vllm-0.21.0", digest="d1", site_packages="lib/site-packages",
                      files=[Entry(path="vllm/x.py", kind="file", before="a" * 64, link=None, after="b" * 64),
                             Entry(path="vllm/l.py", kind="link", before=None, link="x.py", after="c" * 64),
                             Entry(path="vllm/new.py", kind="absent", before=None, link=None, after=None)],
                      created_dirs=["vllm/sub"])
    write_journal(venv / STATE, journal)
    assert read_journal(venv / STATE) == journal
    (venv / STATE / RECORD_JSON).write_bytes(b"\xef\xbb\xbf" + _with())  # a BOM is no reason to refuse it
    assert read_journal(venv / STATE).files[0].after == "b" * 64
