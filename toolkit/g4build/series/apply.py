"""Applying the series stack to a git tree: all or nothing, one commit per needed patch.

The whole stack is checked first (on a scratch copy); then each needed patch becomes a commit whose message
carries trailers (``G4build-Series``, ``G4build-Patch``, ``G4build-Pin``) that ``status`` and ``refresh`` read
back. On any failure the tree is reset to the HEAD it had, so it is left byte-for-byte as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from g4build.errors import PatchConflictError
from g4build.series.check import StackReport, check_stack, conflict_error
from g4build.series.model import Series, SeriesPatch
from g4build.source import gittree

TRAILER_SERIES = "G4build-Series"
TRAILER_PATCH = "G4build-Patch"
TRAILER_PIN = "G4build-Pin"


def commit_message(series: Series, patch: SeriesPatch, pin: str) -> str:
    return (
        f"{patch.subject}\n\n"
        f"From patch series {series.name} v{series.version}: {series.title}\n\n"
        f"{TRAILER_SERIES}: {series.name} v{series.version}\n"
        f"{TRAILER_PATCH}: {patch.file}\n"
        f"{TRAILER_PIN}: {pin}\n"
    )


@dataclass(frozen=True, kw_only=True)
class AppliedPatch:
    series: str
    file: str
    commit: str


@dataclass(frozen=True, kw_only=True)
class ApplyResult:
    report: StackReport
    head_before: str
    head_after: str
    applied: tuple[AppliedPatch, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        data = self.report.to_dict()
        data["head_before"] = self.head_before
        data["head_after"] = self.head_after
        data["commits"] = [{"series": a.series, "file": a.file, "commit": a.commit} for a in self.applied]
        data["skipped"] = [{"series": s.name, "file": p.file, "detail": p.detail}
                           for s in self.report.series for p in s.patches if p.status == "upstream"]
        return data


def apply_stack(tree: Path, stack: Sequence[Series], *, pin: str, version: str) -> ApplyResult:
    """Commit every needed patch of ``stack`` onto the git tree ``tree``, or change nothing."""
    gittree.require_repo(tree)
    gittree.require_clean(tree)
    report = check_stack(tree, stack, variant_pin=pin, version=version)
    if not report.ok:
        raise conflict_error(report, tree_hint=str(tree))
    before = gittree.head(tree)
    untracked = gittree.untracked_paths(tree)
    env = gittree.identity_env(tree)
    applied: list[AppliedPatch] = []
    by_name = {s.name: s for s in stack}
    current = ""
    try:
        for sr in report.series:
            series = by_name[sr.name]
            patches = {p.file: p for p in series.patches_for(pin)}
            for pr in sr.patches:
                if pr.status != "applies":
                    continue
                patch = patches[pr.file]
                current = f"{patch.file} of {series.name}"
                # the bytes read bounded (and checked) are the bytes applied: git never opens the file itself
                gittree.run_git(["apply", "--index", "--whitespace=nowarn", "-"], cwd=tree, stdin=patch.read_bytes())
                gittree.run_git(["commit", "-q", "--no-verify", "-F", "-"], cwd=tree, env=env,
                                stdin=commit_message(series, patch, pin).encode())
                applied.append(AppliedPatch(series=series.name, file=patch.file, commit=gittree.head(tree)))
    except BaseException as exc:
        rollback(tree, before, untracked)
        if isinstance(exc, Exception):
            raise PatchConflictError(
                f"applying {current} failed after the check passed: {exc}; the tree was reset to {before[:12]}",
                hint="is something in the tree git-ignored or changed meanwhile? run `g4build patches check` again",
            ) from exc
        raise
    return ApplyResult(report=report, head_before=before, head_after=gittree.head(tree), applied=tuple(applied))


def rollback(tree: Path, commit: str, untracked: set[str]) -> None:
    """Put a tree that was clean at ``commit`` (plus the ``untracked`` files) back exactly as it was."""
    gittree.run_git(["reset", "-q", "--hard", commit], cwd=tree)
    for rel in sorted(gittree.untracked_paths(tree) - untracked):  # files a half-applied patch created
        path = tree / rel
        path.unlink(missing_ok=True)
        for parent in path.parents:  # and the folders it made for them
            if parent == tree or not parent.is_dir() or any(parent.iterdir()):
                break
            parent.rmdir()
