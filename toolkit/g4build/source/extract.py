"""Safe extraction of a source archive (a release sdist): every member checked before anything is written, and no
member of a VCS's metadata (a ``.git`` folder, file or link, in any spelling a file system folds to it) kept: the
tree's repository is always one g4build makes, so no hook, fsmonitor or include of the archive's can run."""

from __future__ import annotations

import gzip
import os
import posixpath
import re
import tarfile
import zlib
from pathlib import Path, PurePosixPath

from g4build.errors import SourceError, UnsafeArchiveError
from g4build.fsutil import remove_tree
from g4build.util.gitsafe import is_vcs_name
from g4build.util.safetext import component_problem

_MAX_MEMBER_BYTES = 512 << 20
_MAX_TOTAL_BYTES = 4 << 30
_UNSAFE_HINT = "nothing was extracted; a release sdist never has such members: get the archive again from the index"


def _escapes(rel: str) -> bool:
    """True when a relative POSIX path, once normalised, leaves its base."""
    n = posixpath.normpath(rel)
    return n == ".." or n.startswith("../") or n.startswith("/")


def is_vcs_member(name: str) -> bool:
    """True when an archive member is, or lies under, some VCS's metadata (``pkg/.git/config``, ``pkg/.GIT``)."""
    return any(is_vcs_name(part) for part in name.split("/"))


def check_tar_members(members: list[tarfile.TarInfo], where: str) -> None:
    """Refuse the whole archive if any member could land outside the destination."""
    total = 0
    for m in members:
        name = m.name
        p = PurePosixPath(name)
        if p.is_absolute() or re.match(r"^[A-Za-z]:", name):
            raise UnsafeArchiveError(
                f"{where}: member '{name}' has an absolute path; expected names inside the tree", hint=_UNSAFE_HINT
            )
        if "\\" in name:  # a Windows separator: on Windows it could climb or root the path
            raise UnsafeArchiveError(
                f"{where}: member '{name}' has a backslash; expected '/'-separated names", hint=_UNSAFE_HINT
            )
        if ".." in p.parts:
            raise UnsafeArchiveError(
                f"{where}: member '{name}' climbs out with '..'; refusing the archive", hint=_UNSAFE_HINT
            )
        for part in p.parts:
            why = component_problem(part) if part != "." else None
            if why:
                raise UnsafeArchiveError(f"{where}: member {name!r} has {why} in its name; refusing the archive",
                                         hint=_UNSAFE_HINT)
        if m.issym():
            if m.linkname.startswith("/") or _escapes(posixpath.join(str(p.parent), m.linkname)):
                raise UnsafeArchiveError(
                    f"{where}: symlink '{name}' -> '{m.linkname}' points outside the tree; refusing the archive",
                    hint=_UNSAFE_HINT,
                )
        elif m.islnk():
            if m.linkname.startswith("/") or _escapes(m.linkname):
                raise UnsafeArchiveError(
                    f"{where}: hardlink '{name}' -> '{m.linkname}' points outside the tree; refusing the archive",
                    hint=_UNSAFE_HINT,
                )
        elif not (m.isfile() or m.isdir()):
            raise UnsafeArchiveError(
                f"{where}: member '{name}' is a device or fifo; a source archive has none", hint=_UNSAFE_HINT
            )
        if m.size > _MAX_MEMBER_BYTES:
            raise UnsafeArchiveError(
                f"{where}: member '{name}' is {m.size} bytes, over the {_MAX_MEMBER_BYTES} limit", hint=_UNSAFE_HINT
            )
        total += m.size
    if total > _MAX_TOTAL_BYTES:
        raise UnsafeArchiveError(
            f"{where}: archive unpacks to {total} bytes, over the {_MAX_TOTAL_BYTES} limit", hint=_UNSAFE_HINT
        )


def _kept(members: list[tarfile.TarInfo]) -> list[tarfile.TarInfo]:
    """The members without VCS metadata, and without links into it (a link to a dropped member would dangle, or
    reach a ``.git`` by another name)."""
    out = []
    for m in members:
        if is_vcs_member(m.name):
            continue
        if (m.issym() or m.islnk()) and is_vcs_member(m.linkname):
            continue
        out.append(m)
    return out


_FILTER_ERRORS: tuple[type[Exception], ...] = (
    (tarfile.FilterError,) if hasattr(tarfile, "FilterError") else ()  # Python with extraction filters
)


def safe_extract_tar(archive: Path, dest: Path) -> Path:
    """Extract ``archive`` to ``dest`` (which must not exist) and return its single top folder.

    Every member is checked before anything is written; VCS metadata is left out; on any failure ``dest`` does
    not exist afterwards.
    """
    if dest.exists():
        raise SourceError(f"{dest} already exists; expected a fresh destination for extraction",
                          hint="remove it or extract somewhere else")
    tmp = dest.with_name(dest.name + ".extracting")
    remove_tree(tmp)
    try:
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            check_tar_members(members, archive.name)
            members = _kept(members)
            tmp.mkdir(parents=True)
            if hasattr(tarfile, "data_filter"):
                tar.extractall(tmp, members=members, filter="data")
            else:  # Python without extraction filters: members were checked above
                tar.extractall(tmp, members=members)
        tops = [p.name for p in tmp.iterdir()]
        single = len(tops) == 1 and (tmp / tops[0]).is_dir()
        os.replace(tmp, dest)
    except _FILTER_ERRORS as exc:  # the extraction filter's own check (e.g. a link chain the names hide)
        remove_tree(tmp)
        raise UnsafeArchiveError(f"{archive.name}: member refused by the extraction filter: {exc}",
                                 hint=_UNSAFE_HINT) from exc
    except (tarfile.TarError, EOFError, gzip.BadGzipFile, ValueError, zlib.error) as exc:
        remove_tree(tmp)
        raise UnsafeArchiveError(f"{archive.name}: not a readable tar archive: {exc}",
                                 hint="expected a .tar.gz sdist: delete the file and download it again") from exc
    except BaseException:
        remove_tree(tmp)
        raise
    return dest / tops[0] if single else dest
