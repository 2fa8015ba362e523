"""Apply patch files to a plain directory (not a git tree) with ``git apply``: zero fuzz, one by one.

Used on a scratch copy of just the files the patches touch, so a failure leaves nothing behind. A failing
patch is reported with its name, the file and the hunk git could not place.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from g4build import patchfile
from g4build.errors import BuildError, PatchConflictError

_FAILED_AT = re.compile(r"patch failed: (.+):(\d+)\s*$")


@dataclass(frozen=True, kw_only=True)
class PatchFile:
    label: str  # e.g. "gemma4-dflash/vllm-0.21.0/0001-x.patch", used in messages
    path: Path


def touched_paths(patch: bytes, *, where: str = "patch") -> set[str]:
    """Every path a git-format patch reads or writes (``a/``/``b/`` prefixes removed, /dev/null left out)."""
    return patchfile.touched_paths(patchfile.parse_patch(patch, where=where))


def hunk_number(patch: bytes, file: str, line: int) -> int | None:
    """Which hunk (1-based) of ``file`` in ``patch`` starts at old line ``line``."""
    for diff in patchfile.parse_patch(patch, where="patch"):
        if diff.path == file:
            for hunk in diff.hunks:
                if hunk.old_start == line:
                    return hunk.number
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
