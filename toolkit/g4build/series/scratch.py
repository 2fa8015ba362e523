"""Apply patch files to a plain directory (not a git tree): the patch engine's scratch application.

Used on a scratch copy of just the files the patches touch. A patch that does not apply is reported with its
name and, per failing hunk, file, line and why (drift that needs fuzz, partly upstream, ...), as
`g4build patches check` reports it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from g4build.errors import PatchConflictError
from g4build.series import patchfile
from g4build.series.check import Scratch
from g4build.series.model import SeriesPatch
from g4build.util.safeload import read_patch


@dataclass(frozen=True, kw_only=True)
class PatchFile:
    label: str  # e.g. "gemma4-dflash/vllm-0.21.0/0001-x.patch", used in messages
    path: Path

    def read_bytes(self) -> bytes:
        """The patch's bytes, bounded (``safeload.read_patch``: no FIFO, device or oversized file)."""
        return read_patch(self.path)


def touched_paths(patch: bytes, *, where: str = "patch") -> set[str]:
    """Every path a git-format patch reads or writes (``a/``/``b/`` prefixes removed, /dev/null left out)."""
    return patchfile.touched_paths(patchfile.parse_patch(patch, where=where))


def apply_patches(directory: Path, patches: Sequence[PatchFile], *, target: str) -> None:
    """Apply ``patches`` in order to ``directory``; raise at the first that does not apply cleanly (zero fuzz).

    A failing patch leaves the folder as the patches before it left it.
    """
    scratch = Scratch(directory)
    for patch in patches:
        result = scratch.check(SeriesPatch(file=patch.label, subject="", path=patch.path), None)
        if result.status != "applies":
            raise PatchConflictError(
                f"patch {patch.label} does not apply to {target}: {result.detail}",
                hint="the files differ from the pinned release: check the version, or refresh the series "
                     "(`g4build patches refresh`)",
            )
