"""Reading git-format patch files: the files a patch touches and its hunks, one by one.

The engine needs two things git does not print directly: which paths a patch touches (so a check can run on a
scratch copy of just those files) and each hunk as a patch of its own (so a failing patch can be explained
hunk by hunk). Bytes are kept as they are (``surrogateescape``), so a split hunk applies exactly like the whole.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from g4build.errors import ConfigError

_REGENERATE = "the file was edited by hand or cut: regenerate it with `g4build patches refresh`"
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass(frozen=True, kw_only=True)
class Hunk:
    number: int  # 1-based within its file
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    lines: tuple[str, ...]  # the "@@" line and its body, line endings kept


@dataclass(frozen=True, kw_only=True)
class FileDiff:
    old_path: str | None  # None for a new file
    new_path: str | None  # None for a deleted file
    header: tuple[str, ...]  # from "diff --git" up to the first hunk
    hunks: tuple[Hunk, ...]
    binary: bool

    @property
    def path(self) -> str:
        """The path a reader knows the file by (the new one, or the old one for a deletion)."""
        return self.new_path or self.old_path or "?"

    @property
    def splittable(self) -> bool:
        """True when each hunk can be checked alone (a plain edit of an existing text file)."""
        return not self.binary and self.old_path is not None and self.new_path is not None and bool(self.hunks)

    def text(self) -> str:
        return "".join(self.header) + "".join("".join(h.lines) for h in self.hunks)

    def hunk_patch(self, hunk: Hunk) -> str:
        """This file's header plus one hunk: a patch of its own."""
        return "".join(self.header) + "".join(hunk.lines)


def decode(data: bytes) -> str:
    return data.decode("utf-8", errors="surrogateescape")


def encode(text: str) -> bytes:
    return text.encode("utf-8", errors="surrogateescape")


def _strip_prefix(raw: str) -> str | None:
    raw = raw.rstrip("\r\n").split("\t", 1)[0]
    if raw.startswith('"') and raw.endswith('"'):
        raw = raw[1:-1]
    if raw == "/dev/null":
        return None
    if raw.startswith(("a/", "b/")):
        return raw[2:]
    return raw


def _safe(path: str | None, where: str) -> str | None:
    if path is None:
        return None
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or not pure.parts:
        raise ConfigError(f"{where}: patch path {path!r} leaves the tree (absolute or '..')", hint=_REGENERATE)
    return path


def _git_header_paths(line: str) -> tuple[str | None, str | None]:
    # "diff --git a/x b/x": only used when no ---/+++ lines follow (mode change, binary, pure rename)
    rest = line.rstrip("\r\n")[len("diff --git ") :]
    if rest.startswith("a/") and " b/" in rest:
        old, new = rest[2:].split(" b/", 1)
        return old, new
    return None, None


def parse_patch(data: bytes, *, where: str) -> tuple[FileDiff, ...]:
    """Split a git-format patch into its file sections. Text before the first ``diff --git`` is ignored."""
    lines = decode(data).splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.startswith("diff --git ")]
    if not starts:
        raise ConfigError(f"{where}: not a git-format patch (no 'diff --git' line)", hint="write it with `git diff`")
    result = []
    for k, start in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(lines)
        result.append(_parse_section(lines[start:end], where))
    return tuple(result)


def _parse_section(lines: list[str], where: str) -> FileDiff:
    header: list[str] = []
    i = 0
    old_git, new_git = _git_header_paths(lines[0])
    old: str | None = old_git
    new: str | None = new_git
    binary = False
    is_new = is_deleted = False
    while i < len(lines) and not lines[i].startswith("@@"):
        line = lines[i]
        if line.startswith("--- "):
            old = _strip_prefix(line[4:])
        elif line.startswith("+++ "):
            new = _strip_prefix(line[4:])
        elif line.startswith("new file mode"):
            is_new = True
        elif line.startswith("deleted file mode"):
            is_deleted = True
        elif line.startswith("rename from "):
            old = line[len("rename from ") :].rstrip("\r\n")
        elif line.startswith("rename to "):
            new = line[len("rename to ") :].rstrip("\r\n")
        elif line.startswith(("GIT binary patch", "Binary files ")):
            binary = True
        header.append(line)
        i += 1
    if is_new:
        old = None
    if is_deleted:
        new = None
    hunks: list[Hunk] = []
    while i < len(lines):
        m = _HUNK.match(lines[i])
        if not m:
            break  # trailing text after the last hunk (e.g. a format-patch signature)
        old_count = int(m.group(2)) if m.group(2) is not None else 1
        new_count = int(m.group(4)) if m.group(4) is not None else 1
        body = [lines[i]]
        i += 1
        need_old, need_new = old_count, new_count
        while i < len(lines) and (need_old > 0 or need_new > 0 or lines[i].startswith("\\")):
            line = lines[i]
            tag = line[:1]
            if tag == " " or line in ("\n", "\r\n"):
                need_old -= 1
                need_new -= 1
            elif tag == "-":
                need_old -= 1
            elif tag == "+":
                need_new -= 1
            elif tag != "\\":
                raise ConfigError(f"{where}: malformed hunk in {new or old}: unexpected line {line.rstrip()!r}",
                                  hint=_REGENERATE)
            body.append(line)
            i += 1
        if need_old > 0 or need_new > 0:
            raise ConfigError(f"{where}: hunk {len(hunks) + 1} of {new or old} is cut short", hint=_REGENERATE)
        hunks.append(Hunk(
            number=len(hunks) + 1, old_start=int(m.group(1)), old_count=old_count,
            new_start=int(m.group(3)), new_count=new_count, lines=tuple(body),
        ))
    return FileDiff(
        old_path=_safe(old, where), new_path=_safe(new, where), header=tuple(header), hunks=tuple(hunks),
        binary=binary,
    )


def touched_paths(diffs: tuple[FileDiff, ...]) -> set[str]:
    """Every path a patch reads or writes."""
    return {p for d in diffs for p in (d.old_path, d.new_path) if p is not None}
