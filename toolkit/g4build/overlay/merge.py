"""Laying the series over files that are not the pin's: a three-way merge, file by file, before refusing.

A wheel built from a fork (the Windows fork's ``vllm-0.21.0+cu132-cp312-cp312-win_amd64.whl``) carries the
fork's Python files, not the pin's. Where the fork changed a file near a series hunk, the stack does not apply
with zero fuzz. Each file is then handled alone: its hunks are tried with zero fuzz on the wheel's copy
(``applied``); where they do not apply, git's three-way file merge runs with base = the pin's pristine file
(from its sha256-verified sdist), ours = the wheel's file, theirs = the pin's file with the series applied
(``merged``; ``already`` when the wheel's file is the patched one). A result counts only when it holds every
fingerprint the series name for the file and, for a merged Python file, compiles. Any conflict refuses the
overlay, naming each such file and why, before anything is written.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from g4build.errors import G4BuildError, PatchConflictError
from g4build.series.check import Scratch
from g4build.series.patchfile import FileDiff, parse_patch
from g4build.series.scratch import PatchFile, apply_patches
from g4build.source.merge import merge_three

FileHow = Literal["applied", "merged", "already", "conflict"]
# the pin's own copies of these paths (a path its release lacks is left out)
Pristine = Callable[[Sequence[str]], dict[str, bytes]]


@dataclass(frozen=True, kw_only=True)
class FileOutcome:
    path: str
    how: FileHow
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "how": self.how, "detail": self.detail}


APPLIED = "the series' hunks apply with zero fuzz"


def diffs_by_file(patches: Sequence[PatchFile]) -> dict[str, list[tuple[str, FileDiff]]]:
    """Each touched path with its file sections, in stack order, labelled by their patch."""
    out: dict[str, list[tuple[str, FileDiff]]] = {}
    for patch in patches:
        for diff in parse_patch(patch.read_bytes(), where=str(patch.path)):
            out.setdefault(diff.path, []).append((patch.label, diff))
    return out


def _apply_alone(path: str, data: bytes | None, diffs: list[tuple[str, FileDiff]]) -> tuple[bool, bytes | None, str]:
    """``data`` (None: absent) with this file's sections applied in order, zero fuzz: (applied, result, why not)."""
    with tempfile.TemporaryDirectory(prefix="g4build-file-") as tmp:
        folder = Path(tmp) / "tree"
        target = folder / path
        target.parent.mkdir(parents=True)
        if data is not None:
            target.write_bytes(data)
        scratch = Scratch(folder)
        for label, diff in diffs:
            ok, _log = scratch.apply(diff.text())
            if not ok:
                return False, None, f"{label} does not apply with zero fuzz"
        return True, (target.read_bytes() if target.is_file() else None), ""


def _three_way(path: str, ours: bytes | None, base: bytes | None, theirs: bytes | None,
               pin: str) -> tuple[FileHow, bytes | None, str]:
    if ours is not None and ours == theirs:
        return "already", ours, "the wheel's file already is the pin's patched file"
    merge = merge_three(path, base=base, ours=ours, theirs=theirs, ours_name="the wheel", base_name=pin)
    if merge.why:
        return "conflict", ours, merge.why
    if merge.conflicts:
        return "conflict", ours, (f"a three-way merge with {pin}'s own file conflicts: {len(merge.conflicts)} "
                                  "conflicting hunk(s)")
    return "merged", merge.result, f"three-way merged with {pin}'s own file (base) and its patched file"


def _problem(path: str, data: bytes | None, how: FileHow, fingerprints: Sequence[tuple[str, str]]) -> str | None:
    """Why a result does not count: a missing fingerprint, or a merged Python file that does not compile."""
    text = data.decode("utf-8", errors="replace") if data is not None else ""
    missing = [f"{series}: {fp!r}" for series, fp in fingerprints if fp not in text]
    if missing:
        return f"the {how} result lacks the series' fingerprint(s) " + ", ".join(missing)
    if how == "merged" and path.endswith(".py") and data is not None:
        try:
            compile(data, path, "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as exc:
            line = getattr(exc, "lineno", None)
            return f"the merged file is not valid Python ({'line ' + str(line) + ': ' if line else ''}{exc})"
    return None


def merge_over(
    read: Mapping[str, bytes], patches: Sequence[PatchFile], *, pin: str, pristine: Pristine,
    fingerprints: Mapping[str, Sequence[tuple[str, str]]], first: PatchConflictError, target: str,
) -> tuple[dict[str, bytes | None], tuple[FileOutcome, ...]]:
    """The changed files (None: removed) and one outcome per touched file; raises PatchConflictError naming every
    file that neither applies nor merges (``first``: the stack's own zero-fuzz failure, quoted first)."""
    by_file = diffs_by_file(patches)
    renames = sorted(p for p, diffs in by_file.items() for _l, d in diffs
                     if d.old_path and d.new_path and d.old_path != d.new_path)
    try:
        base = pristine(sorted(by_file))
    except G4BuildError as exc:  # the sdist could not be had: say why it was needed, keep the kind of failure
        raise type(exc)(f"{first.message}; a three-way merge needs {pin}'s own files, which could not be read: "
                        f"{exc.message}", hint=exc.hint) from exc
    theirs = _patched(base, patches, pin)
    files: dict[str, bytes | None] = {}
    outcomes: list[FileOutcome] = []
    for path, diffs in sorted(by_file.items()):
        ours = read.get(path)
        applied, result, why = _apply_alone(path, ours, diffs)
        how: FileHow = "applied"
        detail = APPLIED
        if path in renames:
            how, result, detail = "conflict", ours, "renamed by the series: a rename is not merged"
        elif not applied:
            how, result, merged = _three_way(path, ours, base.get(path), theirs.get(path), pin)
            detail = f"{why}; {merged}"
        if how != "conflict" and (problem := _problem(path, result, how, fingerprints.get(path, ()))):
            how, detail = "conflict", f"{detail}, but {problem}"
        outcomes.append(FileOutcome(path=path, how=how, detail=detail))
        if how != "conflict" and result != ours:
            files[path] = result
    conflicts = [o for o in outcomes if o.how == "conflict"]
    if conflicts:
        raise PatchConflictError(
            f"{first.message}; a three-way merge with {pin}'s own files settles it only where the changes do not "
            f"overlap, and {len(conflicts)} file(s) of {target} are left (nothing was written): "
            + "; ".join(f"{o.path}: {o.detail}" for o in conflicts),
            hint="the wheel's files differ from the pin's where the series change them (a fork's wheel?): overlay "
                 "the pin's release wheel, or carry that change into the series by hand (`g4build patches refresh`)",
        )
    return files, tuple(outcomes)


def _patched(base: Mapping[str, bytes], patches: Sequence[PatchFile], pin: str) -> dict[str, bytes]:
    """The pin's files with the whole stack applied (it applies there: that is what the series are checked on)."""
    with tempfile.TemporaryDirectory(prefix="g4build-theirs-") as tmp:
        folder = Path(tmp) / "tree"
        folder.mkdir()
        for rel, data in base.items():
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_bytes(data)
        apply_patches(folder, patches, target=f"{pin}'s own files")
        return {rel: p.read_bytes() for rel in diffs_by_file(patches) if (p := folder / rel).is_file()}
