"""Three-way merge of one file for `patches port`: a patch whose context moved on the new tree.

base = the file as the old pin has it before the patch, ours = the new pin's file (with the patches ported before
it), theirs = the old pin's file with the patch applied. git's file merge takes the patch's change over to the new
file where the two sides' changes do not overlap; where they do, each conflicting region is reported with its
lines on both trees, so a developer can go straight to it.
"""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from g4build.errors import SourceError
from g4build.source.gittree import git_exe
from g4build.util import gitsafe

# Long markers: a source line that happens to start with seven '<' must never read as one.
_SIZE = 17
_OURS, _BASE, _SEP, _THEIRS = "<" * _SIZE, "|" * _SIZE, "=" * _SIZE, ">" * _SIZE


@dataclass(frozen=True, kw_only=True)
class MergeConflict:
    ours_line: int  # 1-based, in the new pin's file (0: not found there)
    ours_count: int
    base_line: int  # 1-based, in the old pin's file before the patch (0: not found there)
    base_count: int


@dataclass(frozen=True, kw_only=True)
class FileMerge:
    path: str
    result: bytes | None  # the merged file (None: absent); ours where it conflicts
    conflicts: tuple[MergeConflict, ...] = ()
    why: str = ""  # a conflict of the whole file (missing, added on both sides, binary)

    @property
    def ok(self) -> bool:
        return not self.conflicts and not self.why


def merge_three(path: str, *, base: bytes | None, ours: bytes | None, theirs: bytes | None,
                ours_name: str, base_name: str) -> FileMerge:
    """Merge the patch's change to ``path`` (base -> theirs) into ``ours``."""
    if theirs == base or ours == theirs:
        return FileMerge(path=path, result=ours)
    if ours == base:
        return FileMerge(path=path, result=theirs)
    if ours is None:
        return FileMerge(path=path, result=None, why=f"{ours_name} has no such file ({base_name} has it)")
    if base is None:
        return FileMerge(path=path, result=ours,
                         why=f"the patch adds it, and {ours_name} already has a different file there")
    if theirs is None:
        return FileMerge(path=path, result=ours, why=f"the patch deletes it, and {ours_name}'s copy differs from "
                                                     f"{base_name}'s")
    if b"\0" in ours or b"\0" in base or b"\0" in theirs:
        return FileMerge(path=path, result=ours, why="a binary file changed on both sides")
    rc, merged = run_merge_file(ours, base, theirs, diff3=True, marker_size=_SIZE)
    if rc == 0:
        return FileMerge(path=path, result=merged)
    return FileMerge(path=path, result=ours, conflicts=conflict_regions(merged, ours=ours, base=base))


def run_merge_file(ours: bytes, base: bytes, theirs: bytes, *, diff3: bool = False,
                   marker_size: int | None = None) -> tuple[int, bytes]:
    """``git merge-file -p`` on three texts: (0, merged) or (number of conflicts, text with markers)."""
    with tempfile.TemporaryDirectory(prefix="g4build-merge-") as tmp:
        names = []
        for name, data in (("ours", ours), ("base", base), ("theirs", theirs)):
            (Path(tmp) / name).write_bytes(data)
            names.append(str(Path(tmp) / name))
        options = [*(["--diff3"] if diff3 else []), *([f"--marker-size={marker_size}"] if marker_size else [])]
        proc = subprocess.run([git_exe(), *gitsafe.config_args(), "merge-file", "-p", "-q", *options,
                               "-L", "ours", "-L", "base", "-L", "theirs", *names],
                              capture_output=True, check=False, cwd=tmp, env=gitsafe.env())
    if 0 <= proc.returncode < 128:
        return proc.returncode, proc.stdout
    raise SourceError(f"git merge-file failed: {proc.stderr.decode(errors='replace').strip()}")


def conflict_regions(merged: bytes, *, ours: bytes, base: bytes) -> tuple[MergeConflict, ...]:
    """Each conflict of a ``--diff3`` merge output, located by its ours and base sections in the two files (an empty
    section by the clean lines just before the conflict). A section found more than once is taken where the clean
    lines since the previous conflict put it."""
    ours_lines = ours.splitlines(keepends=True)
    base_lines = base.splitlines(keepends=True)
    found: list[MergeConflict] = []
    section: str | None = None
    mine: list[bytes] = []
    old: list[bytes] = []
    before: list[bytes] = []  # the last clean lines of the merge output
    clean = 0  # clean lines since the previous conflict
    end_ours = end_base = 0  # where the previous conflict ended in each file
    for line in merged.splitlines(keepends=True):
        text = line.decode("utf-8", errors="replace")
        if text.startswith(_OURS + " "):
            section, mine, old = "ours", [], []
        elif section and text.startswith(_BASE + " "):
            section = "base"
        elif section and text.rstrip("\r\n") == _SEP:
            section = "theirs"
        elif section and text.startswith(_THEIRS + " "):
            o = _locate(ours_lines, mine, before, end_ours + clean)
            b = _locate(base_lines, old, before, end_base + clean)
            end_ours = o + len(mine) if o >= 0 else end_ours + clean + len(mine)
            end_base = b + len(old) if b >= 0 else end_base + clean + len(old)
            found.append(MergeConflict(ours_line=o + 1, ours_count=len(mine), base_line=b + 1, base_count=len(old)))
            section, before, clean = None, [], 0
        elif section == "ours":
            mine.append(line)
        elif section == "base":
            old.append(line)
        elif section is None:
            before = [*before[-2:], line]
            clean += 1
    return tuple(found)


def _locate(lines: list[bytes], block: list[bytes], before: list[bytes], estimate: int) -> int:
    """Where ``block`` starts in ``lines``, the place nearest ``estimate`` where it is found more than once; an
    empty block where ``before`` ends; -1: not found."""
    if block:
        return _find(lines, block, estimate)
    at = _find(lines, before, estimate - len(before))
    return at + len(before) if at >= 0 else -1


def _find(lines: list[bytes], block: list[bytes], estimate: int) -> int:
    """Index of ``block`` in ``lines`` nearest ``estimate`` (-1: not there, or an empty block)."""
    if not block:
        return -1
    # the merge may end a file's last line without its newline: compare without line ends
    want = [b.rstrip(b"\r\n") for b in block]
    bare = [b.rstrip(b"\r\n") for b in lines]
    hits = [i for i in range(len(bare) - len(want) + 1) if bare[i:i + len(want)] == want]
    return min(hits, key=lambda i: (abs(i - estimate), i)) if hits else -1


def describe(conflict: MergeConflict, *, ours_name: str, base_name: str) -> str:
    def span(line: int, count: int, name: str) -> str:
        if line <= 0:
            return f"{name} (not located)"
        return f"{name} line {line}" if count <= 1 else f"{name} lines {line}-{line + count - 1}"

    ours = span(conflict.ours_line, conflict.ours_count, ours_name)
    base = span(conflict.base_line, conflict.base_count, base_name)
    if conflict.ours_count == 0:
        ours = f"{ours_name} removed lines or adds some before {ours[len(ours_name) + 1:]}"
    else:
        ours += " changed"
    where = (f"the patch adds lines before {base}" if conflict.base_count == 0 else f"the patch changes {base}")
    return f"three-way merge conflict: {ours} where {where}"
