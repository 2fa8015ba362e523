"""Apply image layers (tar streams) onto a root folder, safely.

Layers are applied in order with OCI whiteouts (``.wh.<name>`` hides a lower entry, ``.wh..wh..opq`` hides a
directory's lower contents). Nothing is ever written outside the root:

- member names that are absolute, carry a drive letter, or climb out with ``..`` are skipped;
- every path is resolved *inside* the root, like a chroot: symlinks met on the way are followed with their
  targets read against the root (an absolute target starts at the root, ``..`` stops at the root), and the
  host never follows a link on our behalf (files are opened with ``O_NOFOLLOW`` after the old entry is gone);
- symlinks whose relative target climbs above the root, and hardlinks to absolute or ``..`` names, are skipped;
  a skipped symlink still replaces what lower layers had at its path, and a later member whose path goes
  through it is skipped too (writing it into a real folder there would make up a file the image does not have);
- devices and fifos are skipped; member count, member size and total size are bounded, and so are the size of
  each file written and the bytes written in all (a gzip bomb is refused at its tar header, before any write).

Only regular files accepted by ``select`` are written (an image is gigabytes; we need its Python files);
directories, symlinks and whiteouts are always applied so paths resolve as they do in the image.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tarfile
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from g4build.errors import UnsafeArchiveError

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
_MAX_LINK_HOPS = 40
_CHUNK = 1 << 20
_DRIVE = re.compile(r"^[A-Za-z]:")


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Bounds on what an image may unpack to (decompressed sizes, read from each member's tar header)."""

    max_members: int = 5_000_000
    max_member_bytes: int = 16 << 30  # any member, written or not
    max_total_bytes: int = 128 << 30  # all regular members of all layers
    max_file_bytes: int = 64 << 20  # one file written to disk (a selected Python file); none comes near it
    max_written_bytes: int = 2 << 30  # all files written to disk


@dataclass(frozen=True, kw_only=True)
class Skipped:
    layer: str
    name: str
    reason: str
    unsafe: bool  # True: the entry tried to leave the root (a warning worth showing)


@dataclass(frozen=True, kw_only=True)
class ApplyReport:
    layers: int
    files: int
    bytes: int
    skipped: tuple[Skipped, ...]

    @property
    def unsafe(self) -> tuple[Skipped, ...]:
        return tuple(s for s in self.skipped if s.unsafe)


@dataclass(kw_only=True)
class _State:
    root: Path
    limits: Limits
    select: Callable[[str], bool]
    members: int = 0
    total: int = 0
    files: int = 0
    written: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    # Root-relative paths where a skipped symlink sits: the image has a link there, we have nothing.
    dead_links: set[str] = field(default_factory=set)


class _Through(Exception):
    """A member's path goes through a symlink that was skipped."""

    def __init__(self, link: str) -> None:
        super().__init__(link)
        self.link = link


def clean_member_name(name: str) -> str | None:
    """The root-relative POSIX path of a member name, or None when the name is absolute or climbs out."""
    if name.startswith("/") or _DRIVE.match(name) or (os.sep == "\\" and "\\" in name):
        return None
    parts: list[str] = []
    for part in name.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            return None
        parts.append(part)
    return "/".join(parts)


def resolve_in_root(root: Path, rel: str, *, follow_final: bool = False) -> str:
    """Resolve ``rel`` inside ``root`` the way a chroot would; return a root-relative path without links.

    Symlinks on the way are read with ``os.readlink`` and their targets interpreted against ``root``; ``..``
    never goes above ``root``. The final component is followed only with ``follow_final``.
    """
    pending = deque(p for p in rel.split("/") if p not in ("", "."))
    current: list[str] = []
    hops = 0
    while pending:
        part = pending.popleft()
        if part == "..":
            if current:
                current.pop()
            continue
        candidate = [*current, part]
        host = root.joinpath(*candidate)
        if (pending or follow_final) and host.is_symlink():
            hops += 1
            if hops > _MAX_LINK_HOPS:
                raise UnsafeArchiveError(
                    f"too many symlink hops resolving '{rel}' in the image (a link loop)",
                    hint="the image's filesystem has a symlink cycle on this path",
                )
            target = os.readlink(host)
            if target.startswith("/"):
                current = []
            pending.extendleft(reversed([p for p in target.split("/") if p not in ("", ".")]))
            continue
        current = candidate
    return "/".join(current)


def _symlink_stays_inside(rel: str, target: str) -> bool:
    if target.startswith("/"):
        return True  # absolute targets are read against the image root
    depth = len(rel.split("/")) - 1
    for part in target.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return False
        elif part not in ("", "."):
            depth += 1
    return True


def _remove(host: Path) -> None:
    st = host.lstat()
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(host)  # rmtree never follows symlinks
    else:
        host.unlink()


def _exists(host: Path) -> bool:
    try:
        host.lstat()
    except FileNotFoundError:
        return False
    return True


def _place(st: _State, rel: str) -> Path | None:
    """Host path for the root-relative ``rel`` with its parents resolved and created inside the root."""
    parent, _, name = rel.rpartition("/")
    resolved_parent = resolve_in_root(st.root, parent, follow_final=True) if parent else ""
    host_parent = st.root
    parts = resolved_parent.split("/") if resolved_parent else []
    for i, part in enumerate(parts):
        if st.dead_links and "/".join(parts[:i + 1]) in st.dead_links:
            raise _Through("/".join(parts[:i + 1]))
        host_parent = host_parent / part
        if not _exists(host_parent):
            host_parent.mkdir(mode=0o755)
        elif not host_parent.is_dir() or host_parent.is_symlink():
            return None
    return host_parent / name


class _Layer:
    def __init__(self, st: _State, label: str) -> None:
        self.st = st
        self.label = label
        self.touched: set[str] = set()  # paths this layer created (and their parents): lower layers only lose

    def skip(self, name: str, reason: str, *, unsafe: bool) -> None:
        self.st.skipped.append(Skipped(layer=self.label, name=name, reason=reason, unsafe=unsafe))

    def touch(self, host: Path) -> None:
        rel = host.relative_to(self.st.root).as_posix()
        self.st.dead_links.discard(rel)  # a real entry now replaces the skipped link
        parts = rel.split("/")
        for i in range(1, len(parts) + 1):
            self.touched.add("/".join(parts[:i]))

    def apply(self, tar: tarfile.TarFile) -> None:
        for member in tar:
            self.st.members += 1
            if self.st.members > self.st.limits.max_members:
                raise UnsafeArchiveError(
                    f"layer {self.label}: more than {self.st.limits.max_members} members; refusing the image"
                )
            try:
                self.member(tar, member)
            except _Through as through:
                self.skip(member.name, f"its path goes through the symlink '{through.link}', which was skipped; "
                          "the image has no such file there", unsafe=True)
            except OSError as exc:  # e.g. a name this host's filesystem cannot hold
                self.skip(member.name, f"cannot be written here: {exc.strerror or exc}", unsafe=False)

    def member(self, tar: tarfile.TarFile, m: tarfile.TarInfo) -> None:
        rel = clean_member_name(m.name)
        if rel is None:
            self.skip(m.name, "absolute name or '..' leaves the image root", unsafe=True)
            return
        if not rel:
            return  # the root itself
        base = rel.rpartition("/")[2]
        if base == OPAQUE:
            self.opaque(rel.rpartition("/")[0])
            return
        if base.startswith(WHITEOUT):
            self.whiteout(rel, base[len(WHITEOUT):])
            return
        if m.isdir():
            self.directory(rel, m)
        elif m.isfile():
            self.regular(tar, rel, m)
        elif m.issym():
            self.symlink(rel, m)
        elif m.islnk():
            self.hardlink(rel, m)
        else:
            self.skip(m.name, "device, fifo or other special file", unsafe=False)

    def opaque(self, dir_rel: str) -> None:
        host = self.st.root / resolve_in_root(self.st.root, dir_rel, follow_final=True) if dir_rel else self.st.root
        if not host.is_dir() or host.is_symlink():
            return
        for child in list(host.iterdir()):
            if child.relative_to(self.st.root).as_posix() not in self.touched:
                _remove(child)
        self._forget_links_under(host, keep_touched=True)
        self.touch(host)

    def _forget_links_under(self, host: Path, *, keep_touched: bool = False) -> None:
        """Skipped links at or below ``host`` are gone from the image (whiteout, opaque folder)."""
        rel = host.relative_to(self.st.root).as_posix()
        prefix = "" if rel == "." else rel + "/"
        for link in list(self.st.dead_links):
            if (link == rel or link.startswith(prefix)) and not (keep_touched and link in self.touched):
                self.st.dead_links.discard(link)

    def whiteout(self, rel: str, hidden: str) -> None:
        if hidden in ("", ".", ".."):  # ".wh.." / ".wh..." would name the folder itself or its parent
            self.skip(rel, "whiteout of '.' or '..' would reach outside its folder", unsafe=True)
            return
        if hidden.startswith(WHITEOUT):
            return  # other aufs metadata (.wh..wh.plnk and friends)
        parent = rel.rpartition("/")[0]
        resolved = resolve_in_root(self.st.root, parent, follow_final=True) if parent else ""
        target = self.st.root.joinpath(*(resolved.split("/") if resolved else []), hidden)
        if target.relative_to(self.st.root).as_posix() in self.touched:
            return  # a whiteout hides lower layers only, never an entry of its own layer
        if _exists(target):
            _remove(target)
        self._forget_links_under(target)

    def directory(self, rel: str, m: tarfile.TarInfo) -> None:
        host = _place(self.st, rel)
        if host is None:
            self.skip(m.name, "a parent is not a directory", unsafe=False)
            return
        if _exists(host) and (host.is_symlink() or not host.is_dir()):
            _remove(host)
        if not _exists(host):
            host.mkdir()
        host.chmod((m.mode & 0o755) | 0o700)
        self.touch(host)

    def regular(self, tar: tarfile.TarFile, rel: str, m: tarfile.TarInfo) -> None:
        limits = self.st.limits
        if m.size > limits.max_member_bytes:
            raise UnsafeArchiveError(
                f"layer {self.label}: '{m.name}' is {m.size} bytes, over the {limits.max_member_bytes} limit",
                hint="refusing the image; raise the limit only for an image you trust",
            )
        self.st.total += m.size
        if self.st.total > limits.max_total_bytes:
            raise UnsafeArchiveError(
                f"layer {self.label}: the image unpacks to over {limits.max_total_bytes} bytes; refusing it",
            )
        host = _place(self.st, rel)
        if host is None:
            self.skip(m.name, "a parent is not a directory", unsafe=False)
            return
        if _exists(host):
            _remove(host)
        self.st.dead_links.discard(host.relative_to(self.st.root).as_posix())  # a file replaces a skipped link
        if not self.st.select(rel):
            return
        # Bounded before a byte is written: a small gzip layer can declare a file of gigabytes.
        if m.size > limits.max_file_bytes:
            raise UnsafeArchiveError(
                f"layer {self.label}: '{m.name}' is {m.size} bytes decompressed, over the {limits.max_file_bytes}"
                " byte limit for one extracted file; refusing the image (a source file is never that large)",
                hint="check where the image comes from; nothing was written",
            )
        if self.st.written + m.size > limits.max_written_bytes:
            raise UnsafeArchiveError(
                f"layer {self.label}: extracting '{m.name}' would write over {limits.max_written_bytes} bytes "
                "in all; refusing the image",
                hint="check where the image comes from; nothing was written",
            )
        self.st.written += m.size
        src = tar.extractfile(m)
        if src is None:
            return
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
        fd = os.open(host, flags, (m.mode & 0o755) | 0o600)
        with os.fdopen(fd, "wb") as out:
            left = m.size
            while left > 0:
                chunk = src.read(min(_CHUNK, left))
                if not chunk:
                    break
                out.write(chunk)
                left -= len(chunk)
        self.st.files += 1
        self.touch(host)

    def symlink(self, rel: str, m: tarfile.TarInfo) -> None:
        if not _symlink_stays_inside(rel, m.linkname):
            self.skip(m.name, f"symlink to '{m.linkname}' points above the image root", unsafe=True)
            host = _place(self.st, rel)
            if host is not None:
                if _exists(host):
                    _remove(host)  # in the image the link replaces what lower layers had here
                self._forget_links_under(host)
                self.st.dead_links.add(host.relative_to(self.st.root).as_posix())
            return
        host = _place(self.st, rel)
        if host is None:
            self.skip(m.name, "a parent is not a directory", unsafe=False)
            return
        if _exists(host):
            _remove(host)
        os.symlink(m.linkname, host)
        self.touch(host)

    def hardlink(self, rel: str, m: tarfile.TarInfo) -> None:
        target_rel = clean_member_name(m.linkname)
        if not target_rel:
            self.skip(m.name, f"hardlink to '{m.linkname}' leaves the image root", unsafe=True)
            return
        source = self.st.root / resolve_in_root(self.st.root, target_rel)
        if not _exists(source) or source.is_dir():
            self.skip(m.name, f"hardlink target '{m.linkname}' was not extracted", unsafe=False)
            return
        host = _place(self.st, rel)
        if host is None:
            self.skip(m.name, "a parent is not a directory", unsafe=False)
            return
        if _exists(host):
            if host == source:
                return
            _remove(host)
        try:
            os.link(source, host, follow_symlinks=False)
        except OSError:
            if source.is_symlink():
                os.symlink(os.readlink(source), host)
            else:
                shutil.copyfile(source, host, follow_symlinks=False)
        self.touch(host)


def apply_layers(
    layers: Iterable[tuple[str, IO[bytes]]],
    root: Path,
    *,
    select: Callable[[str], bool] | None = None,
    limits: Limits | None = None,
) -> ApplyReport:
    """Apply ``(label, uncompressed tar stream)`` pairs to ``root`` in order; return what was done and skipped.

    Each stream is read once, front to back (``tarfile`` stream mode), so a layer never needs to be on disk.
    """
    st = _State(root=root, limits=limits or Limits(), select=select or (lambda _rel: True))
    root.mkdir(parents=True, exist_ok=True)
    count = 0
    for label, stream in layers:
        count += 1
        try:
            with tarfile.open(fileobj=stream, mode="r|") as tar:
                _Layer(st, label).apply(tar)
        except tarfile.TarError as exc:
            raise UnsafeArchiveError(f"layer {label} is not a readable tar stream: {exc}") from exc
    return ApplyReport(layers=count, files=st.files, bytes=st.total, skipped=tuple(st.skipped))


def drain(stream: IO[bytes]) -> None:
    """Read a stream to its end (so a digest computed while reading covers every byte)."""
    while stream.read(_CHUNK):
        pass


__all__ = [
    "ApplyReport",
    "Limits",
    "Skipped",
    "apply_layers",
    "clean_member_name",
    "drain",
    "resolve_in_root",
]
