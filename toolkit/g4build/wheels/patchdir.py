"""Apply patch files to a plain directory (not a git tree) with ``git apply``: zero fuzz, one by one.

Used on a scratch copy of just the files the patches touch, so a failure leaves nothing behind. A failing
patch is reported with its name, the file and the hunk git could not place.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from g4build.errors import BuildError, PatchConflictError, UnsafeArchiveError

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,(\d+))? @@")
_FAILED_AT = re.compile(r"patch failed: (.+):(\d+)\s*$")
_PATH_LINES = ("--- ", "+++ ", "rename from ", "rename to ", "copy from ", "copy to ")


@dataclass(frozen=True, kw_only=True)
class PatchFile:
    label: str  # e.g. "gemma4-dflash/vllm-0.21.0/0001-x.patch", used in messages
    path: Path


def _clean(raw: str, *, strip: bool) -> str | None:
    raw = raw.split("\t", 1)[0].strip()
    if raw.startswith('"') and raw.endswith('"'):
        raw = raw[1:-1].encode().decode("unicode_escape").encode("latin-1").decode("utf-8")
    if raw == "/dev/null":
        return None
    if strip:
        if not raw.startswith(("a/", "b/")):
            return None
        raw = raw[2:]
    rel = PurePosixPath(raw)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise UnsafeArchiveError(f"patch path {raw!r} leaves the tree", hint="fix the patch file")
    return str(rel)


def _scan(patch: bytes) -> Iterator[tuple[str, str]]:
    """Yield ("header", line) for lines outside hunk bodies and ("hunk", line) for each hunk header."""
    old_left = new_left = 0
    for line in patch.decode("utf-8", "replace").splitlines():
        if old_left > 0 or new_left > 0:
            tag = line[:1]
            if tag in (" ", ""):
                old_left, new_left = old_left - 1, new_left - 1
            elif tag == "-":
                old_left -= 1
            elif tag == "+":
                new_left -= 1
            continue
        m = _HUNK.match(line)
        if m:
            old_left = int(m[2]) if m[2] is not None else 1
            new_left = int(m[3]) if m[3] is not None else 1
            yield "hunk", line
        else:
            yield "header", line


def touched_paths(patch: bytes) -> set[str]:
    """Every path a git-format patch reads or writes (``a/``/``b/`` prefixes removed, /dev/null left out)."""
    found: set[str] = set()
    for kind, line in _scan(patch):
        for head in _PATH_LINES:
            if kind == "header" and line.startswith(head):
                path = _clean(line[len(head):], strip=head in ("--- ", "+++ "))
                if path:
                    found.add(path)
    return found


def hunk_number(patch: bytes, file: str, line: int) -> int | None:
    """Which hunk (1-based) of ``file`` in ``patch`` starts at old line ``line``."""
    old = current = None
    count = 0
    for kind, text in _scan(patch):
        if kind == "header" and text.startswith("--- "):
            old = _clean(text[4:], strip=True)
        elif kind == "header" and text.startswith("+++ "):
            current, count = _clean(text[4:], strip=True) or old, 0
        elif kind == "hunk" and current == file:
            count += 1
            m = _HUNK.match(text)
            if m and int(m[1]) == line:
                return count
    return None


def _git(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    # Outside a repository git apply works on plain files relative to cwd; the ceiling stops it from
    # finding an enclosing repository (which would make paths relative to that repository's top).
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(cwd.resolve().parent)}
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False, env=env)
    except FileNotFoundError as exc:
        raise BuildError("git is not on PATH; it applies the patches", hint="install git") from exc


def apply_patches(directory: Path, patches: Sequence[PatchFile], *, target: str) -> None:
    """Apply ``patches`` in order to ``directory``; raise at the first that does not apply cleanly.

    git apply checks every hunk of a patch before it writes anything, and never fuzzes: a failing patch
    leaves the folder as the patches before it left it.
    """
    for patch in patches:
        done = _git(["apply", "--whitespace=nowarn", str(patch.path.resolve())], directory)
        if done.returncode != 0:
            raise _conflict(patch, done.stderr, target)


def _conflict(patch: PatchFile, stderr: str, target: str) -> PatchConflictError:
    lines = [ln.removeprefix("error: ").strip() for ln in stderr.splitlines() if ln.strip()]
    where = ""
    for ln in lines:
        m = _FAILED_AT.search(ln)
        if m:
            hunk = hunk_number(patch.path.read_bytes(), m[1], int(m[2]))
            where = f": hunk {hunk} at {m[1]}:{m[2]}" if hunk else f": at {m[1]}:{m[2]}"
            break
    return PatchConflictError(
        f"patch {patch.label} does not apply to {target}{where} ({'; '.join(lines) or 'git apply failed'})",
        hint="the files differ from the pinned release: check the version, or refresh the series "
             "(`g4build patches refresh`)",
    )
