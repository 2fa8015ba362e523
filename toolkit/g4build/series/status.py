"""Which series a tree carries: commit trailers in a git tree, fingerprints in any tree."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from g4build.series.apply import TRAILER_PATCH, TRAILER_PIN, TRAILER_SERIES
from g4build.series.model import Series
from g4build.source import gittree

_SEP_FIELD = "\x1f"
_SEP_RECORD = "\x1e"


@dataclass(frozen=True, kw_only=True)
class SeriesCommit:
    commit: str
    subject: str
    series: str
    version: int | None
    patch: str | None
    pin: str | None


def trailers(body: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in body.splitlines():
        key, sep, value = line.partition(":")
        if sep and key in (TRAILER_SERIES, TRAILER_PATCH, TRAILER_PIN):
            found[key] = value.strip()
    return found


def log_records(tree: Path, *args: str) -> list[tuple[str, str]]:
    """``git log *args`` as (sha, message) pairs."""
    raw = gittree.out(["log", *args, f"--format=%H{_SEP_FIELD}%B{_SEP_RECORD}"], cwd=tree)
    records = []
    for record in raw.split(_SEP_RECORD):
        sha, _, body = record.strip().partition(_SEP_FIELD)
        if sha:
            records.append((sha, body))
    return records


def series_commits(tree: Path) -> list[SeriesCommit]:
    """Commits carrying a ``G4build-Series`` trailer, oldest first."""
    commits = []
    for sha, body in log_records(tree, "--reverse", f"--grep=^{TRAILER_SERIES}:"):
        t = trailers(body)
        if TRAILER_SERIES not in t:
            continue
        name, _, ver = t[TRAILER_SERIES].partition(" v")
        commits.append(SeriesCommit(
            commit=sha, subject=body.strip().splitlines()[0] if body.strip() else "", series=name.strip(),
            version=int(ver) if ver.strip().isdigit() else None, patch=t.get(TRAILER_PATCH), pin=t.get(TRAILER_PIN),
        ))
    return commits


FingerprintState = Literal["present", "partial", "absent", "none"]
_RANK: dict[FingerprintState, int] = {"none": 0, "absent": 1, "partial": 2, "present": 3}


def fingerprint_state(tree: Path, fingerprints: dict[str, tuple[str, ...]]) -> tuple[FingerprintState, list[str]]:
    """Whether every fingerprint text is in its file; the missing ones as ``path: text``."""
    if not fingerprints:
        return "none", []
    missing, total = [], 0
    for rel, texts in fingerprints.items():
        path = tree / rel
        content = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None
        for text in texts:
            total += 1
            if content is None or text not in content:
                missing.append(f"{rel}: {text}")
    if not missing:
        return "present", []
    return ("absent" if len(missing) == total else "partial"), missing


@dataclass(frozen=True, kw_only=True)
class CarriedSeries:
    name: str
    known_version: int | None  # the series' current version, None for a series the checkout does not know
    tree_version: int | None  # from the trailers (None when only fingerprints tell)
    pin: str | None
    state: str  # "current", "outdated", "unknown series", "fingerprints only"
    commits: tuple[SeriesCommit, ...]
    fingerprints: FingerprintState
    missing_fingerprints: tuple[str, ...]
    not_committed: tuple[str, ...] = ()  # the pin's patches without a commit (upstream when applied)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "version": self.tree_version, "current_version": self.known_version,
            "pin": self.pin, "state": self.state, "fingerprints": self.fingerprints,
            "missing_fingerprints": list(self.missing_fingerprints), "not_committed": list(self.not_committed),
            "patches": [{"file": c.patch, "subject": c.subject, "commit": c.commit} for c in self.commits],
        }


@dataclass(frozen=True, kw_only=True)
class TreeStatus:
    tree: str
    git: bool
    series: tuple[CarriedSeries, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"tree": self.tree, "git": self.git, "series": [s.to_dict() for s in self.series]}


def _state(series: Series | None, commits: Sequence[SeriesCommit], pin: str | None) -> tuple[str, tuple[str, ...]]:
    """The series' state in the tree, and the pin's patches it has no commit for (skipped as upstream)."""
    if series is None:
        return "unknown series", ()
    if {c.version for c in commits} != {series.version}:
        return "outdated", ()
    want = [p.file for p in series.patches_for(pin)] if pin else []
    have = [c.patch for c in commits]
    if pin and [f for f in want if f in have] != have:
        return "outdated", ()  # a commit names a patch the series no longer has, or the order changed
    return "current", tuple(f for f in want if f not in have)


def tree_status(tree: Path, stack: Sequence[Series], *, pin: str | None = None) -> TreeStatus:
    """Read which series ``tree`` carries. ``pin`` picks the fingerprints; else the trailers' pin, else any."""
    git = gittree.is_repo_top(tree)
    commits = series_commits(tree) if git else []
    by_name = {s.name: s for s in stack}
    names = list(dict.fromkeys([s.name for s in stack] + [c.series for c in commits]))
    result = []
    for name in names:
        mine = tuple(c for c in commits if c.series == name)
        series = by_name.get(name)
        use_pin = pin or next((c.pin for c in reversed(mine) if c.pin), None)
        fp_state: FingerprintState = "none"
        missing: list[str] = []
        if series is not None:
            for cand in [use_pin] if use_pin else list(series.pins):
                variant = series.variant(cand)
                state, miss = fingerprint_state(tree, variant.fingerprints if variant else {})
                if state == "present":
                    fp_state, missing, use_pin = state, miss, use_pin or cand
                    break
                if _RANK[state] > _RANK[fp_state]:
                    fp_state, missing = state, miss
        not_committed: tuple[str, ...] = ()
        if mine:
            state_text, not_committed = _state(series, mine, use_pin)
        elif fp_state in ("present", "partial"):
            state_text = "fingerprints only"
        else:
            continue
        result.append(CarriedSeries(
            name=name, known_version=series.version if series else None,
            tree_version=mine[-1].version if mine else None, pin=use_pin, state=state_text, commits=mine,
            fingerprints=fp_state, missing_fingerprints=tuple(missing), not_committed=not_committed,
        ))
    return TreeStatus(tree=str(tree), git=git, series=tuple(result))
