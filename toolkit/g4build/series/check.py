"""Checking the series stack against a source tree (applying it lives in ``series.apply``).

Check (quilt-style): each patch is tried forward with zero fuzz on a scratch copy of the touched files, with
every earlier patch of the stack already applied there. A patch that does not apply forward but reverse-applies
is ``upstream``; one that would apply only with reduced context is drift and reported as a ``conflict``.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from g4build.errors import PatchConflictError, SourceError
from g4build.series.model import Series, SeriesPatch
from g4build.series.patchfile import FileDiff, parse_patch, touched_paths
from g4build.source import gittree

PatchStatus = Literal["applies", "merged", "upstream", "conflict"]  # merged: `patches port` only
SeriesStatus = Literal["needed", "upstream", "partial", "conflict"]

_CHECKING = re.compile(r"^Checking patch (.+)\.\.\.$")
_OFFSET = re.compile(r"^Hunk #(\d+) succeeded at (\d+) \(offset (-?\d+) lines?\)\.$")


@dataclass(frozen=True, kw_only=True)
class HunkOffset:
    file: str
    hunk: int
    line: int
    offset: int

    def describe(self) -> str:
        return f"{self.file} hunk #{self.hunk} at line {self.line} (offset {self.offset:+d})"


@dataclass(frozen=True, kw_only=True)
class HunkProblem:
    file: str
    hunk: int  # 0 when the whole file section fails (missing file, new file already there, binary)
    line: int  # where the patch expects the hunk in the original file
    why: str

    def describe(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"hunk #{self.hunk} at {where}: {self.why}" if self.hunk else f"{where}: {self.why}"


@dataclass(frozen=True, kw_only=True)
class PatchResult:
    file: str  # relative to the series folder, e.g. "vllm-0.21.0/0001-x.patch"
    subject: str
    status: PatchStatus
    detail: str
    offsets: tuple[HunkOffset, ...] = ()
    problems: tuple[HunkProblem, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"file": self.file, "status": self.status, "detail": self.detail}
        if self.offsets:
            data["offsets"] = [{"file": o.file, "hunk": o.hunk, "line": o.line, "offset": o.offset}
                               for o in self.offsets]
        if self.problems:
            data["hunks"] = [{"file": p.file, "hunk": p.hunk, "line": p.line, "why": p.why} for p in self.problems]
        return data


@dataclass(frozen=True, kw_only=True)
class SeriesResult:
    name: str
    version: int
    status: SeriesStatus
    note: str
    patches: tuple[PatchResult, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "status": self.status, "note": self.note,
                "patches": [p.to_dict() for p in self.patches]}


@dataclass(frozen=True, kw_only=True)
class StackReport:
    target: Literal["pin", "release"]
    name: str  # the pin name, or the release version
    version: str  # the upstream version checked against (Applied-Upstream compares with it)
    variant_pin: str  # whose patch variants were used
    tree: str
    series: tuple[SeriesResult, ...]
    sdist_sha256: str | None = None  # for a release check: the verified sdist's sha256

    @property
    def ok(self) -> bool:
        return all(s.status != "conflict" for s in self.series)

    def conflicts(self) -> list[tuple[SeriesResult, PatchResult]]:
        return [(s, p) for s in self.series for p in s.patches if p.status == "conflict"] + [
            (s, PatchResult(file="-", subject="", status="conflict", detail=s.note))
            for s in self.series if s.status == "conflict" and not s.patches
        ]

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {self.target: self.name}
        if self.target == "release":
            data["base_pin"] = self.variant_pin
        if self.sdist_sha256:
            data["sdist_sha256"] = self.sdist_sha256
        data["tree"] = self.tree
        data["ok"] = self.ok
        data["series"] = [s.to_dict() for s in self.series]
        return data


def series_status(results: Sequence[PatchResult]) -> SeriesStatus:
    kinds = {r.status for r in results}
    if "conflict" in kinds:
        return "conflict"
    if kinds <= {"upstream"}:
        return "upstream"
    return "needed" if kinds == {"applies"} else "partial"


def _why(stderr: str) -> str:
    text = stderr.lower()
    if "no such file" in text or "does not exist" in text:
        return "file missing"
    if "already exists" in text:
        return "file already exists"
    if "patch does not apply" in text or "while searching for" in text:
        return "context does not match"
    lines = [ln.removeprefix("error: ") for ln in stderr.splitlines() if ln.startswith("error:")]
    return lines[-1] if lines else (stderr.strip() or "does not apply")


class Scratch:
    """A private copy of the files a stack touches, where patches are tried and applied cumulatively."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        # Keep git from finding a repository above the scratch folder.
        self.env = {"GIT_CEILING_DIRECTORIES": str(folder.parent)}

    @classmethod
    def of(cls, tree: Path, folder: Path, paths: set[str], commit: str | None = None) -> Scratch:
        """Copy ``paths`` from the tree's files, or from ``commit`` of the tree's git history."""
        folder.mkdir()
        if commit is not None:
            _copy_from_commit(tree, commit, folder, paths)
            return cls(folder)
        for rel in sorted(paths):
            src = tree / rel
            if src.is_file():
                dst = folder / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
        return cls(folder)

    def fork(self) -> Scratch:
        """An independent copy of this scratch state (small: only the touched files)."""
        n = len(list(self.folder.parent.iterdir()))
        dest = self.folder.parent / f"fork-{n}"
        shutil.copytree(self.folder, dest, symlinks=True)
        return Scratch(dest)

    def pops_in_reverse(self, patches: Sequence[SeriesPatch]) -> bool:
        """True when the files already carry all of ``patches``: they reverse-apply from last to first."""
        trial = self.fork()
        for p in reversed(patches):
            text = "".join(d.text() for d in parse_patch(p.read_bytes(), where=str(p.path)))
            if not trial._apply(text, "-R")[0]:
                return False
        return True

    def apply(self, patch: str) -> tuple[bool, str]:
        """Apply ``patch`` (text) here with zero fuzz (offsets allowed); (applied, git's output)."""
        return self._apply(patch)

    def _apply(self, patch: str, *extra: str) -> tuple[bool, str]:
        proc = gittree.run_git(
            ["apply", "--whitespace=nowarn", *extra, "-"], cwd=self.folder, stdin=patch.encode(
                "utf-8", errors="surrogateescape"), env=self.env, check=False,
        )
        return proc.returncode == 0, (proc.stdout + proc.stderr).decode(errors="replace")

    def check(self, patch: SeriesPatch, upstream_note: str | None) -> PatchResult:
        data = patch.read_bytes()
        diffs = parse_patch(data, where=str(patch.path))
        text = "".join(d.text() for d in diffs)
        if upstream_note is not None:
            back, _ = self._apply(text, "--check", "-R")
            detail = upstream_note + (
                "" if back else "; note: it does not reverse-apply either, check the Applied-Upstream metadata")
            return PatchResult(file=patch.file, subject=patch.subject, status="upstream", detail=detail)
        ok, log = self._apply(text, "--check", "-v")
        if ok:
            self._apply(text)
            offsets = _offsets(log)
            detail = "applies cleanly" if not offsets else "applies with offsets: " + "; ".join(
                o.describe() for o in offsets)
            return PatchResult(file=patch.file, subject=patch.subject, status="applies", detail=detail,
                               offsets=offsets)
        back, _ = self._apply(text, "--check", "-R")
        if back:
            return PatchResult(file=patch.file, subject=patch.subject, status="upstream",
                               detail="already in the tree (reverse-applies cleanly)")
        problems = self._diagnose(diffs, log)
        return PatchResult(file=patch.file, subject=patch.subject, status="conflict",
                           detail="; ".join(p.describe() for p in problems), problems=problems)

    def _diagnose(self, diffs: Sequence[FileDiff], whole_log: str) -> tuple[HunkProblem, ...]:
        problems: list[HunkProblem] = []
        for d in diffs:
            if not d.splittable:
                ok, log = self._apply(d.text(), "--check")
                if not ok:
                    problems.append(HunkProblem(file=d.path, hunk=0, line=0, why=_why(log)))
                continue
            for h in d.hunks:
                piece = d.hunk_patch(h)
                ok, log = self._apply(piece, "--check")
                if ok:
                    continue
                if self._apply(piece, "--check", "-R")[0]:
                    why = "already present (reverse-applies): partly upstream"
                elif (ctx := self._reduced_context(piece)) is not None:
                    why = f"needs fuzz: drift (applies only with context reduced to {ctx} line(s))"
                else:
                    why = _why(log)
                problems.append(HunkProblem(file=d.path, hunk=h.number, line=h.old_start, why=why))
        if not problems:  # each piece applies alone, but not together (overlapping hunks)
            problems.append(HunkProblem(file=diffs[0].path, hunk=0, line=0,
                                        why="hunks apply one by one but not together: " + _why(whole_log)))
        return tuple(problems)

    def _reduced_context(self, piece: str) -> int | None:
        for ctx in (2, 1):
            if self._apply(piece, "--check", f"-C{ctx}")[0]:
                return ctx
        return None


def _offsets(log: str) -> tuple[HunkOffset, ...]:
    current = "?"
    found = []
    for line in log.splitlines():
        if m := _CHECKING.match(line):
            current = m.group(1)
        elif (m := _OFFSET.match(line)) and int(m.group(3)) != 0:
            found.append(HunkOffset(file=current, hunk=int(m.group(1)), line=int(m.group(2)),
                                    offset=int(m.group(3))))
    return tuple(found)


def _copy_from_commit(tree: Path, commit: str, folder: Path, paths: set[str]) -> None:
    if not paths:
        return
    listing = gittree.run_git(["ls-tree", "-z", commit, "--", *sorted(paths)], cwd=tree).stdout
    for entry in listing.split(b"\0"):
        if not entry:
            continue
        meta, _, rel = entry.decode(errors="surrogateescape").partition("\t")
        mode, kind, sha = meta.split()
        if kind != "blob":
            continue
        dst = folder / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(gittree.run_git(["cat-file", "blob", sha], cwd=tree).stdout)
        if mode == "100755":
            dst.chmod(0o755)


@contextmanager
def scratch_for(tree: Path, patches: Sequence[SeriesPatch], commit: str | None = None) -> Iterator[Scratch]:
    paths: set[str] = set()
    for p in patches:
        paths |= touched_paths(parse_patch(p.read_bytes(), where=str(p.path)))
    with tempfile.TemporaryDirectory(prefix="g4build-check-") as tmp:
        yield Scratch.of(tree, Path(tmp) / "tree", paths, commit)


def check_stack(
    tree: Path, stack: Sequence[Series], *, variant_pin: str, version: str,
    target: Literal["pin", "release"] = "pin", name: str | None = None, at_commit: str | None = None,
) -> StackReport:
    """Check every series (in order) against ``tree`` using the patch variants of ``variant_pin``.

    ``at_commit``: check the files as that commit of the (git) tree has them, not the work tree's.
    """
    if not tree.is_dir():
        raise SourceError(f"{tree} is not a folder; expected a vLLM source tree", hint="pass --tree PATH")
    all_patches = [p for s in stack for p in s.patches_for(variant_pin)]
    results: list[SeriesResult] = []
    earlier_conflict = False
    with scratch_for(tree, all_patches, at_commit) as scratch:
        for s in stack:
            variant = s.variant(variant_pin)
            upstream_note = (f"Applied-Upstream {s.applied_upstream} <= {version}"
                             if s.upstream_in(version) else None)
            if variant is None:
                if upstream_note:
                    results.append(SeriesResult(name=s.name, version=s.version, status="upstream",
                                                note=upstream_note, patches=()))
                else:
                    known = ", ".join(sorted(s.pins)) or "none"
                    results.append(SeriesResult(
                        name=s.name, version=s.version, status="conflict", patches=(),
                        note=f"no patch variant for {variant_pin} (variants: {known}); "
                             f"write one with `g4build patches refresh {s.name} --pin {variant_pin} --tree …`",
                    ))
                    earlier_conflict = True
                continue
            if not variant.patches:
                results.append(SeriesResult(name=s.name, version=s.version, status="upstream", patches=(),
                                            note=variant.note or upstream_note or "no patches needed for this pin"))
                continue
            trial = scratch.fork()
            checked = [trial.check(p, upstream_note) for p in variant.patches]
            if any(r.status == "conflict" for r in checked) and scratch.pops_in_reverse(variant.patches):
                # e.g. a tree that already carries the series, where a later patch rewrote an earlier one's lines
                checked = [PatchResult(file=p.file, subject=p.subject, status="upstream",
                                       detail="already in the tree (the series reverse-applies from its last patch)")
                           for p in variant.patches]
            else:
                scratch = trial
            for i, r in enumerate(checked):
                if r.status == "conflict" and earlier_conflict:
                    checked[i] = dataclasses.replace(
                        r, detail=r.detail + " (checked after an earlier conflict: may depend on it)")
                earlier_conflict = earlier_conflict or r.status == "conflict"
            results.append(SeriesResult(name=s.name, version=s.version, status=series_status(checked),
                                        note=variant.note, patches=tuple(checked)))
    return StackReport(target=target, name=name or variant_pin, version=version, variant_pin=variant_pin,
                       tree=str(tree) if at_commit is None else f"{tree}@{at_commit[:12]}", series=tuple(results))


def conflict_error(report: StackReport, *, tree_hint: str) -> PatchConflictError:
    items = report.conflicts()
    series, patch = items[0]
    more = f" (and {len(items) - 1} more)" if len(items) > 1 else ""
    earlier = [s.name for s in report.series[: [s.name for s in report.series].index(series.name)]]
    prepare = f"`g4build patches apply --pin {report.variant_pin} --tree T" + "".join(
        f" --series {n}" for n in earlier) + "`, port it by hand, then " if earlier else "port it in a tree T, then "
    what = (f"patch {patch.file} of {series.name} does not apply" if series.patches
            else f"series {series.name} cannot apply")  # no variant for the pin: nothing to name but the series
    return PatchConflictError(
        f"{what} to {report.name} ({tree_hint}): {patch.detail}{more}",
        hint=f"{prepare}`g4build patches refresh {series.name} --pin {report.variant_pin} --tree T --from-diff` "
             "(or commit each patch with its G4build-* trailers and refresh without --from-diff)",
    )
