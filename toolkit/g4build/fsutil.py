"""Files and trees that are complete or absent.

Removing trees the way Windows needs: git marks its object files read-only, and shutil.rmtree cannot delete a
read-only file there, so a plain ``rmtree(..., ignore_errors=True)`` leaves half a tree behind. Writing a file
whole (``write_atomic``) and building a folder in a claimed staging folder (``staging_dir``)."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def _retry_writable(func: Callable[[str], Any], path: str, _exc: object) -> None:
    """On a failed delete: clear the read-only bit and try once more; a second failure is left to the caller."""
    try:
        os.chmod(path, stat.S_IWRITE | stat.S_IREAD | (stat.S_IEXEC if os.path.isdir(path) else 0))
        func(path)
    except OSError:
        pass


def umasked(mode: int) -> int:
    """``mode`` as the process's umask lets a new file have it (0755 -> 0755 under umask 022)."""
    mask = os.umask(0)
    os.umask(mask)
    return mode & ~mask


def write_atomic(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Write ``data`` to ``path`` whole or not at all: a temporary file of its own beside it (two writers never
    share one, and no planted file or link is opened), renamed over it; removed again on any failure or
    interrupt. A link at ``path`` is replaced, never written through, and nothing else's mode changes: ``mode``
    (exact bits; mkstemp's 0600 when None) is set on the temporary file before the rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        if mode is not None and os.name != "nt":
            os.chmod(tmp, mode)
        try:
            kind = os.lstat(path).st_mode
        except FileNotFoundError:
            kind = stat.S_IFREG
        if not (stat.S_ISREG(kind) or stat.S_ISLNK(kind)):  # a device, a FIFO, a folder: not a file to replace
            raise FileExistsError(errno.EEXIST, "expected a file (or nothing) there, found something else", str(path))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def remove_tree(path: str | Path) -> bool:
    """Delete ``path`` (a folder or a file) if it exists, read-only files included; True when it is gone."""
    target = Path(path)
    if target.is_symlink() or target.is_file():
        try:
            target.unlink()
        except PermissionError:
            os.chmod(target, stat.S_IWRITE | stat.S_IREAD)
            target.unlink()
        return True
    if not target.exists():
        return True
    if sys.version_info >= (3, 12):
        shutil.rmtree(target, onexc=_retry_writable)
    else:
        shutil.rmtree(target, onerror=_retry_writable)
    return not target.exists()


# Staging folders: outputs are written into a fresh hidden folder beside their destination (one file system, so
# a rename publishes them whole) and renamed into place only once complete. A kill leaves the folder behind;
# the next run removes it. A live one is told apart by its lock (flock, released by the kernel when its process
# dies), never by its age. The folder is created under a claim name that sweeps do not take for a staging folder,
# locked, and only then renamed to its staging name: a concurrent sweep never sees it unlocked.
STAGING_PREFIX = ".g4build-"
STAGING_SUFFIX = ".part"
CLAIM_SUFFIX = ".claim"
# A claim is renamed microseconds after its creation; one older than this whose lock is free was left by a kill.
CLAIM_GRACE_S = 60.0


def _lock(path: Path) -> int | None:
    """An fd holding an exclusive lock on folder ``path``; None when another process holds it (or no flock)."""
    try:
        import fcntl
    except ImportError:  # Windows: no flock; leftovers are only named there
        return None
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


@contextmanager
def staging_dir(folder: Path) -> Iterator[Path]:
    """A new, locked, unpredictably named folder in ``folder`` (mkdtemp: never an existing path or a planted
    link), removed on exit whatever happened; what is to stay must be renamed out of it first."""
    claim = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, suffix=CLAIM_SUFFIX, dir=folder))
    path = claim.with_name(claim.name[: -len(CLAIM_SUFFIX)] + STAGING_SUFFIX)
    fd: int | None = None
    try:
        fd = _lock(claim)
        if os.path.lexists(path):  # the name came from mkdtemp's random part: something planted it
            raise FileExistsError(errno.EEXIST, "a staging name is taken", str(path))
        os.rename(claim, path)  # the lock stays with the folder: sweepable only now, and already locked
    except BaseException:
        remove_tree(claim)
        if fd is not None:
            os.close(fd)
        raise
    try:
        yield path
    finally:
        remove_tree(path)
        if fd is not None:
            os.close(fd)


def _claim_is_young(entry: Path) -> bool:
    try:
        return time.time() - entry.lstat().st_mtime < CLAIM_GRACE_S
    except OSError:
        return True  # gone meanwhile


def sweep_staging(folder: Path) -> tuple[list[Path], list[Path]]:
    """Staging folders that killed runs left in ``folder``: (removed, left because they could not be claimed:
    another run is using them, or there is no flock on this system). A claim (a staging folder being created) is
    left alone while it is young: its run locks and renames it at once."""
    removed: list[Path] = []
    kept: list[Path] = []
    if not folder.is_dir():
        return removed, kept
    for entry in sorted(folder.iterdir()):
        name = entry.name
        if not name.startswith(STAGING_PREFIX):
            continue
        if name.endswith(CLAIM_SUFFIX):
            if _claim_is_young(entry):
                continue
        elif not name.endswith(STAGING_SUFFIX):
            continue
        if entry.is_symlink() or not entry.is_dir():
            continue  # not one of ours: ours are real folders
        try:
            fd = _lock(entry)
        except OSError:
            continue  # gone meanwhile (its run finished)
        if fd is None:
            kept.append(entry)
            continue
        try:
            (removed if remove_tree(entry) else kept).append(entry)
        finally:
            os.close(fd)
    return removed, kept
