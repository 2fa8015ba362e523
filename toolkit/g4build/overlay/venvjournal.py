"""The journal of a venv overlay and the file moves it guards, so a kill at any point can be finished or undone.

The journal (``<venv>/.g4build-overlay/record.json``) is written and fsync'd before the first installed file
changes. Its ``status`` says where a run stood: ``overlaying`` (files may be half patched), ``done`` (the overlay
is complete) or ``undoing`` (files may be half restored). The next overlay or undo that finds ``overlaying`` or
``undoing`` restores every file from the backup, which is right for both. Every temporary file lives in the
state folder (``tmp/``), so nothing stray is left next to the installed files.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from g4build.errors import LockTimeoutError, PatchConflictError, ValidationError
from g4build.overlay.wheel import safe_member
from g4build.pins.index import cache_lock, cache_root, lock_timeout
from g4build.util.safeload import read_json

STATE = ".g4build-overlay"
RECORD_JSON = "record.json"
SIBLING_TMP = ".g4build-tmp"  # the suffix older g4build used next to installed files; still swept up
JOURNAL_MAX_BYTES = 64 << 20  # a journal lists the files one overlay touches: a few hundred entries
_SHA256 = re.compile(r"[0-9a-f]{64}", re.ASCII)


@contextmanager
def venv_lock(venv: Path) -> Iterator[None]:
    """One g4build overlay or undo per venv at a time.

    On POSIX the lock is a flock on the venv folder itself, so two runs meet there whatever cache each uses
    (``G4BUILD_CACHE``), and no lock file is left in the venv (an undo must leave it exactly as it was). The
    cache's lock file (keyed by the venv's real path) is held as well: it is the only lock on Windows, which
    cannot open a folder.
    """
    key = hashlib.sha256(str(venv.resolve()).encode()).hexdigest()[:24]
    with _folder_lock(venv), cache_lock(cache_root() / "locks" / f"venv-{key}"):
        yield


@contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    if os.name == "nt":
        yield
        return
    import fcntl

    timeout = lock_timeout()
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockTimeoutError(
                        f"{folder}: expected to get this venv's lock within {timeout:g} s, found it still held by "
                        "another g4build run",
                        hint="wait for the other g4build run on this venv to finish, then run the command again "
                             "(G4BUILD_LOCK_TIMEOUT sets how long to wait)",
                    ) from None
                time.sleep(0.1)
        yield
    finally:
        os.close(fd)  # releases the flock


def fsync_dir(folder: Path) -> None:
    if os.name == "nt":  # Windows cannot open a folder to fsync it; its renames are journaled by NTFS
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    with path.open("rb+") as fh:
        os.fsync(fh.fileno())


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One installed file the overlay changes: how it was (``kind``: file, link or absent) and how it ends."""

    path: str  # relative to site-packages, as POSIX
    kind: str
    before: str | None  # sha256 of the file's bytes (through a link), None when absent or dangling
    link: str | None  # the link's target when ``kind == "link"``
    after: str | None  # sha256 the overlay writes, None when the overlay deletes the file

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "kind": self.kind, "before": self.before, "link": self.link, "after": self.after}


@dataclass(kw_only=True)
class Journal:
    status: str
    pin: str
    digest: str
    site_packages: str  # relative to the venv
    files: list[Entry]
    created_dirs: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"version": 2, "status": self.status, "pin": self.pin, "digest": self.digest,
                "site_packages": self.site_packages, "files": [e.to_dict() for e in self.files],
                "created_dirs": self.created_dirs}


def write_journal(state: Path, journal: Journal) -> None:
    """Replace the journal atomically and durably (write, fsync, rename, fsync the folder)."""
    tmp = state / (RECORD_JSON + ".tmp")
    with tmp.open("wb") as fh:
        fh.write(json.dumps(journal.to_dict(), indent=2).encode())
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, state / RECORD_JSON)
    fsync_dir(state)


def _hash_or_none(value: Any, key: str) -> str | None:
    if value is None or (isinstance(value, str) and _SHA256.fullmatch(value)):
        return value
    raise ValueError(f"{key}: expected a sha256 or null, found {value!r:.40}")


def _text(value: Any, key: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{key}: expected text, found {type(value).__name__}")
    return value


def _entry(f: Any) -> Entry:
    if not isinstance(f, dict):
        raise ValueError(f"a file entry: expected a mapping, found {type(f).__name__}")
    link = f["link"]
    if link is not None and not isinstance(link, str):
        raise ValueError(f"link: expected text or null, found {type(link).__name__}")
    return Entry(path=safe_member(_text(f["path"], "path")), kind=_text(f["kind"], "kind"),
                 before=_hash_or_none(f["before"], "before"), link=link, after=_hash_or_none(f["after"], "after"))


def _list(value: Any, key: str) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"{key}: expected a list, found {type(value).__name__}")
    return value


def read_journal(state: Path) -> Journal:
    """The journal in ``state``, read bounded (a FIFO, a device, 64 MiB or deeper nesting than a journal has are
    refused, never a hang or a RecursionError) and typed; else ValidationError saying how to recover."""
    path = state / RECORD_JSON
    hint = ("reinstall vLLM into the venv (pip install --force-reinstall --no-deps vllm==…), then remove "
            f"{state}")
    try:
        raw = read_json(path, JOURNAL_MAX_BYTES, "the journal g4build writes", error=ValidationError)
    except ValidationError as exc:
        raise ValidationError(exc.message, hint=hint) from None
    try:
        if not isinstance(raw, dict):
            raise ValueError(f"expected a mapping, found {type(raw).__name__}")
        if raw.get("version") != 2:
            return _from_v1(raw)
        files = [_entry(f) for f in _list(raw["files"], "files")]
        if any(e.kind not in ("file", "link", "absent") for e in files):
            raise ValueError("unknown file kind")
        return Journal(status=_text(raw["status"], "status"), pin=_text(raw["pin"], "pin"),
                       digest=_text(raw["digest"], "digest"),
                       site_packages=_text(raw["site_packages"], "site_packages"), files=files,
                       created_dirs=[safe_member(_text(d, "created_dirs")) for d in
                                     _list(raw.get("created_dirs", []), "created_dirs")])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValidationError(
            f"{path}: expected the journal g4build writes (JSON with status and files), found something else ({exc})",
            hint=hint,
        ) from None


def _from_v1(raw: dict[str, Any]) -> Journal:
    """A record of an older g4build (a finished overlay; RECORD backed up beside the files, its new hash unknown)."""
    files = []
    for f in _list(raw["files"], "files"):
        before = _hash_or_none(f["before"], "before")
        files.append(Entry(path=safe_member(_text(f["path"], "path")), kind="absent" if before is None else "file",
                           before=before, link=None, after=_hash_or_none(f["after"], "after")))
    files.append(Entry(path=safe_member(_text(raw["record"], "record")), kind="file", before=None, link=None,
                       after=None))
    return Journal(status="done", pin=_text(raw["pin"], "pin"), digest=_text(raw["digest"], "digest"),
                   site_packages=_text(raw["site_packages"], "site_packages"), files=files,
                   created_dirs=[safe_member(_text(d, "created_dirs")) for d in
                                 _list(raw.get("created_dirs", []), "created_dirs")])


def describe(path: Path) -> Entry:
    """How ``path`` is now, as an Entry's ``kind``/``before`` (``after`` left empty)."""
    if path.is_symlink():
        return Entry(path="", kind="link", before=sha(path) if path.is_file() else None, link=os.readlink(path),
                     after=None)
    if path.is_file():
        return Entry(path="", kind="file", before=sha(path), link=None, after=None)
    return Entry(path="", kind="absent", before=None, link=None, after=None)


def _put(state: Path, target: Path, make: Any) -> None:
    """Make the new file in the state folder with ``make(tmp)``, then rename it over ``target``."""
    tmp_dir = state / "tmp"
    tmp_dir.mkdir(exist_ok=True)
    tmp = tmp_dir / "next"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    make(tmp)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp, target)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        # site-packages on another file system than the state folder: stage beside the target instead
        beside = target.with_name(target.name + SIBLING_TMP)
        shutil.move(str(tmp), beside)
        os.replace(beside, target)


def write_file(state: Path, target: Path, data: bytes) -> None:
    """Replace ``target`` by a regular file holding ``data`` (a symlink is replaced, its target left alone)."""
    mode = target.stat().st_mode & 0o7777 if target.is_file() else None

    def make(tmp: Path) -> None:
        with tmp.open("wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)

    _put(state, target, make)


def restore(state: Path, site: Path, entry: Entry) -> None:
    """Put one file back as the backup and the journal say it was: bytes, mode and times, or the symlink."""
    target = site / entry.path
    (target.with_name(target.name + SIBLING_TMP)).unlink(missing_ok=True)
    if entry.kind == "absent":
        if target.is_symlink() or target.is_file():
            target.unlink()
        return
    if entry.kind == "link":
        assert entry.link is not None
        link = entry.link
        _put(state, target, lambda tmp: os.symlink(link, tmp))
        return
    saved = state / "backup" / entry.path
    if entry.before is not None and (not saved.is_file() or sha(saved) != entry.before):
        raise ValidationError(f"the backup of {entry.path} in {state / 'backup'} is missing or was changed; "
                              "refusing to restore it",
                              hint="reinstall vLLM into the venv (pip install --force-reinstall --no-deps vllm==…)")

    def make(tmp: Path) -> None:
        shutil.copy2(saved, tmp)
        fsync_file(tmp)

    _put(state, target, make)


def edited_since(site: Path, journal: Journal) -> list[str]:
    """The files that no longer hold what the overlay wrote (a user's edit, a reinstall), each with why."""
    found = []
    for entry in journal.files:
        if entry.after is None and entry.kind == "file" and entry.before is None:
            continue  # an older record's RECORD entry: its new hash was never recorded
        path = site / entry.path
        if entry.after is None:
            if path.is_symlink() or path.exists():
                found.append(f"{entry.path} (the overlay removed it; it exists again)")
        elif path.is_symlink() or not path.is_file():
            what = "a symlink" if path.is_symlink() else "none"
            found.append(f"{entry.path} (the overlay wrote a file; found {what})")
        elif (now := sha(path)) != entry.after:
            found.append(f"{entry.path} (sha256 {now[:12]}…, the overlay wrote {entry.after[:12]}…)")
    return found


def refuse_edits(site: Path, journal: Journal, venv: Path) -> None:
    edited = edited_since(site, journal)
    if edited:
        raise PatchConflictError(
            f"{len(edited)} file(s) in {site} changed after the overlay, and undo would discard that: "
            + "; ".join(edited),
            hint="keep a copy of your changes, then run `g4build overlay --venv "
                 f"{venv} --undo --force` to restore the files as they were before the overlay",
        )
