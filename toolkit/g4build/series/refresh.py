"""Writing series back from a tree: refresh a pin's patches from the series' commits (after a developer resolved
conflicts or edited them), or from a tree's uncommitted diff, and start a new series from such a diff.

Only the chosen pin's patch files change; the metadata is kept, the version goes up by one when anything
changed, other pins' variants are left alone. Every file is written atomically (temp file + rename).
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from g4build.errors import ConfigError, SourceError, UsageError
from g4build.fsutil import write_atomic
from g4build.series.apply import TRAILER_SERIES
from g4build.series.model import Series, load_series
from g4build.series.patchfile import parse_patch
from g4build.series.status import SeriesCommit, log_records, series_commits, trailers
from g4build.series.yamlfile import append_order, dump, set_pin_patches
from g4build.source import gittree
from g4build.util.yamlsafe import load_text

_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")
# Build and run leftovers that never belong in a patch, even in a tree without a .gitignore (an sdist's).
_NEVER = [":(exclude,glob)**/__pycache__/**", ":(exclude,glob)**/*.py[co]", ":(exclude,glob)**/*.so",
          ":(exclude,glob)build/**", ":(exclude,glob)**/*.egg-info/**"]


@dataclass(frozen=True, kw_only=True)
class NewPatch:
    file: str  # relative to the series folder
    subject: str
    data: bytes


@dataclass(frozen=True, kw_only=True)
class RefreshResult:
    series: str
    pin: str
    old_version: int | None  # None for a new series
    new_version: int
    changed: bool
    written: tuple[str, ...]
    removed: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"series": self.series, "pin": self.pin, "old_version": self.old_version,
                "new_version": self.new_version, "changed": self.changed, "written": list(self.written),
                "removed": list(self.removed)}


def slug(text: str) -> str:
    words = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return words[:50].rstrip("-") or "patch"


def _commit_diff(tree: Path, commit: str) -> bytes:
    return gittree.run_git([*gittree.diff_args(), f"{commit}^", commit, "--"], cwd=tree).stdout


def uncommitted_diff(tree: Path) -> bytes:
    """``git diff HEAD`` including untracked files, without touching the user's index (a private one is used)."""
    with tempfile.TemporaryDirectory(prefix="g4build-index-") as tmp:
        index = Path(tmp) / "index"
        env = {"GIT_INDEX_FILE": str(index)}
        gittree.run_git(["read-tree", "HEAD"], cwd=tree, env=env)
        gittree.run_git(["add", "-A", "--", ".", *_NEVER], cwd=tree, env=env)
        return gittree.run_git([*gittree.diff_args(), "--cached", "HEAD", "--"], cwd=tree, env=env).stdout


def patches_from_commits(tree: Path, series: Series, pin: str) -> list[NewPatch]:
    """The series' patches for ``pin`` as the tree's commits carry them now."""
    gittree.require_repo(tree)
    if gittree.dirty_paths(tree):
        raise SourceError(
            f"{tree} has uncommitted changes: refresh reads the series' commits only",
            hint="commit the changes into the series' commits (git commit --amend / git rebase -i), "
                 "or use --from-diff to take the uncommitted diff as the whole variant",
        )
    all_commits = series_commits(tree)
    mine = [c for c in all_commits if c.series == series.name]
    if not mine:
        raise SourceError(
            f"no commit in {tree} carries 'G4build-Series: {series.name} v…'",
            hint=f"apply it with `g4build patches apply`, or commit by hand with the trailer lines "
                 f"'G4build-Series: {series.name} v{series.version}' and 'G4build-Patch: {pin}/NNNN-name.patch'",
        )
    _refuse_untagged_between(tree, mine)
    result: list[NewPatch] = []
    for i, c in enumerate(mine, start=1):
        data = _commit_diff(tree, c.commit)
        if not data.strip():
            continue  # an emptied commit drops its patch
        result.append(NewPatch(file=_file_name(c, pin, i), subject=c.subject, data=data))
    names = [p.file for p in result]
    if len(set(names)) != len(names):
        raise ConfigError(f"two commits of {series.name} name the same patch file: {names}",
                          hint="give each commit its own G4build-Patch trailer")
    return result


def _file_name(c: SeriesCommit, pin: str, index: int) -> str:
    if c.patch:
        base = c.patch.rsplit("/", 1)[-1]
        return f"{pin}/{base}"
    return f"{pin}/{index:04d}-{slug(c.subject)}.patch"


def _refuse_untagged_between(tree: Path, mine: Sequence[SeriesCommit]) -> None:
    """A commit without trailers between the series' first and last commit would be silently lost."""
    for sha, body in log_records(tree, f"{mine[0].commit}..{mine[-1].commit}"):
        if TRAILER_SERIES not in trailers(body):
            raise SourceError(
                f"commit {sha[:12]} ({body.strip().splitlines()[0] if body.strip() else ''}) sits between the "
                "series' commits but carries no G4build-Series trailer; its change would be lost",
                hint="squash it into the series commit it belongs to (git rebase -i --autosquash)",
            )


def refresh(series: Series, pin: str, patches: Sequence[NewPatch]) -> RefreshResult:
    """Replace ``pin``'s patch files of ``series`` with ``patches``; bump the version when anything changed."""
    for p in patches:
        parse_patch(p.data, where=p.file)  # never write something the engine cannot read back
    old = series.patches_for(pin)
    same = [(p.file, p.subject, p.read_bytes()) for p in old] == [(p.file, p.subject, p.data) for p in patches]
    if same and series.variant(pin) is not None:
        return RefreshResult(series=series.name, pin=pin, old_version=series.version, new_version=series.version,
                             changed=False, written=(), removed=())
    meta_path = series.folder / "series.yaml"
    entries = [{"file": p.file, "subject": p.subject} for p in patches]
    meta_text = set_pin_patches(meta_path.read_text(encoding="utf-8"), pin, entries, series.version + 1,
                                source=str(meta_path))
    for p in patches:
        write_atomic(series.folder / p.file, p.data)
    still_used = {e.file for name, v in series.pins.items() if name != pin for e in v.patches}
    keep = {p.file for p in patches}
    removed = []
    for gone in old:
        if gone.file not in keep and gone.file not in still_used:
            gone.path.unlink(missing_ok=True)
            removed.append(gone.file)
    write_atomic(meta_path, meta_text.encode())
    load_series(series.folder)  # the result must load
    return RefreshResult(series=series.name, pin=pin, old_version=series.version, new_version=series.version + 1,
                         changed=True, written=tuple(p.file for p in patches), removed=tuple(removed))


def diff_patch(tree: Path, pin: str, subject: str) -> NewPatch:
    gittree.require_repo(tree)
    data = uncommitted_diff(tree)
    if not data.strip():
        raise UsageError(f"{tree} has no uncommitted changes: nothing to turn into a patch",
                         hint="edit the tree first; the diff against HEAD (untracked files included) is used")
    return NewPatch(file=f"{pin}/0001-{slug(subject)}.patch", subject=subject, data=data)


def new_series(
    root: Path, *, name: str, pin: str, patch: NewPatch, title: str, why: str = "", refs: Sequence[str] = (),
    python_only: bool | None = None,
) -> RefreshResult:
    """Create ``root/<name>`` with ``patch`` as the pin's only patch, and append the series to the order."""
    if not _NAME.fullmatch(name):
        raise UsageError(f"series name {name!r}: expected lower-case letters, digits, '.', '_' or '-'")
    folder = root / name
    if (folder / "series.yaml").exists():
        raise UsageError(f"series '{name}' already exists in {folder}",
                         hint=f"use `g4build patches refresh {name} --pin {pin} --tree … --from-diff`")
    diffs = parse_patch(patch.data, where=patch.file)
    if python_only is None:
        python_only = all(p.endswith(".py") for d in diffs for p in (d.old_path, d.new_path) if p)
    order_path = root / "series.yaml"
    order_text = order_path.read_text(encoding="utf-8") if order_path.is_file() else "order: []\n"
    order_data = load_text(order_text, str(order_path)) or {}
    if isinstance(order_data, dict) and name in (order_data.get("order") or []):
        raise UsageError(f"series '{name}' is already in {order_path}'s order but has no folder",
                         hint="remove it from the order first, or pick another name")
    meta = {
        "name": name, "version": 1, "title": title, "why": why, "refs": list(refs), "origin": "g4build",
        "bug": "", "forwarded": "no", "applied_upstream": None, "python_only": python_only,
        "pins": {pin: {"patches": [{"file": patch.file, "subject": patch.subject}], "fingerprints": {}, "note": ""}},
    }
    write_atomic(folder / patch.file, patch.data)
    write_atomic(folder / "series.yaml", dump(meta).encode())
    write_atomic(order_path, append_order(order_text, name, str(order_path)).encode())
    load_series(folder)
    return RefreshResult(series=name, pin=pin, old_version=None, new_version=1, changed=True,
                         written=(patch.file,), removed=())
