"""Output paths the user names (``--out``, ``--dest``, ``--emit-script``, ``--github-output``, ``--venv``), checked
before any work: a file where a folder is expected (or on the way to it), a folder where a file is, a place that
cannot be written, or a venv that does not exist is a usage error (exit 2) that says what was expected and what to
do, never an OSError at the end of a long step. What fails only while it is written (a full disk, ``/dev/full``, a
link planted where a file is appended to) is the same usage error, by ``writing``."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from g4build.errors import UsageError


def _nearest(path: Path) -> Path | None:
    """``path`` or its nearest ancestor that is there (a dangling link counts as there)."""
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            return p
    return None


def _writable(folder: Path) -> bool:
    return os.access(folder, os.W_OK | os.X_OK)


def _folder_problem(path: Path) -> str | None:
    """Why ``path`` (absolute) cannot be a folder g4build creates or writes into, or None."""
    there = _nearest(path)
    if there is None:
        return None
    if not there.is_dir():
        what = "a dangling link" if not there.exists() else "a file"
        return f"found {what}" + ("" if there == path else f" ({there} is on the way)")
    if not _writable(there):
        return "it is not writable" if there == path else f"it cannot be made: {there} is not writable"
    return None


def output_folder(path: Path, option: str) -> Path:
    """A folder g4build creates (with its parents) or writes into."""
    path = Path(os.path.abspath(path.expanduser()))
    why = _folder_problem(path)
    if why:
        raise UsageError(f"{option} {path}: expected a folder g4build can create or write into; {why}",
                         hint=f"pass {option} another folder (or remove what is in the way)")
    return path


def output_file(path: Path, option: str) -> Path:
    """A file g4build writes (replaces, or appends to), in a folder it creates when missing."""
    path = Path(os.path.abspath(path.expanduser()))
    if path.is_dir():
        raise UsageError(f"{option} {path}: expected a file name, found a folder",
                         hint=f"pass {option} a file path inside it, e.g. {path / 'out.txt'}")
    why = _folder_problem(path.parent)
    if why:
        raise UsageError(f"{option} {path}: expected a file in a folder g4build can create or write into; the "
                         f"folder {path.parent}: {why}", hint=f"pass {option} another path")
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"{option} {path}: the file is not writable", hint=f"pass {option} another path")
    return path


@contextmanager
def writing(path: Path, option: str) -> Iterator[None]:
    """An OSError while ``path`` (named by ``option``) is written becomes a usage error saying so."""
    try:
        yield
    except OSError as exc:
        why = ("it is a link, and g4build writes only to the file itself" if exc.errno == errno.ELOOP
               else exc.strerror or str(exc))
        raise UsageError(f"{option} {path}: could not be written ({why})",
                         hint=f"pass {option} a file on a disk with room that you can write to") from exc


def existing_folder(path: Path, option: str, what: str) -> Path:
    """A folder that must exist already (``overlay --venv``)."""
    path = Path(os.path.abspath(path.expanduser()))
    if not path.is_dir():
        found = "a file" if path.exists() else "nothing"
        raise UsageError(f"{option} {path}: expected {what}, found {found} there",
                         hint=f"pass {option} the folder of an existing one")
    return path
