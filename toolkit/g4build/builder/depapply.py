"""Build series on real trees: check (commit, pristine files, zero fuzz), apply, patched dependency copies.

A dependency's series are never applied to the prefetched clone itself (other pins and builds share it): a
copy named after the pristine clone and the series (name, version, patch bytes) is made once, patched with one
commit per patch, and reused by every build with the same series, so its path (and with it every compile
command) stays the same from build to build, which a compiler cache needs. The CMake initial cache written by
``g4build prefetch`` is then pointed at that copy.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from g4build.builder.deps import CMakeDep, default_cache, find_deps, prefetch, unset_line
from g4build.errors import BuildError, PatchConflictError, SourceError, UsageError
from g4build.fsutil import remove_tree, write_atomic
from g4build.pins.index import cache_lock
from g4build.pins.model import Pin
from g4build.series.apply import apply_stack
from g4build.series.check import StackReport, check_stack, conflict_error
from g4build.series.deps import BuildSeries, patched_copy_key
from g4build.source import gittree

PATCHED_STAMP = ".g4build-patched"
PREFETCH_STAMP = ".g4build-prefetched"
CommitState = Literal["matches", "differs", "not-git", "not-recorded"]


@dataclass(frozen=True, kw_only=True)
class DepCheck:
    series: BuildSeries
    pin: str
    tree: str
    commit: str | None  # the tree's pristine commit (its first), when it is a git tree
    commit_state: CommitState
    changed: tuple[str, ...]  # "path: expected sha256 X, found Y" for touched files that are not the recorded ones
    report: StackReport

    @property
    def ok(self) -> bool:
        return self.commit_state != "differs" and not self.changed and self.report.ok

    @property
    def applied(self) -> bool:
        """True when the tree already carries the whole series (every patch reverse-applies)."""
        return bool(self.report.series) and self.report.series[0].status == "upstream"

    def to_dict(self) -> dict[str, Any]:
        v = self.series.variant(self.pin)
        return {
            "series": self.series.name, "version": self.series.version, "project": self.series.project,
            "pin": self.pin, "tree": self.tree, "ok": self.ok,
            "commit": {"expected": v.commit if v else None, "found": self.commit, "state": self.commit_state},
            "changed_files": list(self.changed),
            "status": self.report.series[0].status if self.report.series else "conflict",
            "patches": [p.to_dict() for s in self.report.series for p in s.patches],
        }


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _pristine_bytes(tree: Path, rel: str, commit: str | None) -> bytes | None:
    if commit is not None:
        proc = gittree.run_git(["show", f"{commit}:{rel}"], cwd=tree, check=False)
        return proc.stdout if proc.returncode == 0 else None
    path = tree / rel
    return path.read_bytes() if path.is_file() else None


def check_dependency(tree: Path, build: BuildSeries, pin: Pin, *, check_commit: bool = True) -> DepCheck:
    """Check ``build``'s variant for ``pin`` against ``tree`` (a dependency's copy, or the vLLM tree)."""
    variant = build.variant(pin.name)
    if variant is None or not build.applies_to(pin.name):
        raise SourceError(f"build series {build.name} has no patches for pin {pin.name}",
                          hint="`g4build deps list` shows the pins each build series covers")
    if not tree.is_dir():
        raise SourceError(f"{tree} is not a folder: expected a {build.project} source tree")
    commit: str | None = None
    if gittree.is_repo_top(tree):
        commit = gittree.pristine_commit(tree)
    if not build.is_dependency or variant.commit is None or not check_commit:
        state: CommitState = "not-recorded"
    elif commit is None:
        state = "not-git"
    else:
        state = "matches" if commit == variant.commit else "differs"
    changed = []
    for rel, want in sorted(variant.files.items()):
        data = _pristine_bytes(tree, rel, commit)
        found = _sha(data) if data is not None else "missing"
        if found != want:
            changed.append(f"{rel}: expected sha256 {want[:12]}…, found {found[:12]}{'' if data is None else '…'}")
    report = check_stack(tree, [build.series], variant_pin=pin.name, version=pin.version, name=pin.name)
    return DepCheck(series=build, pin=pin.name, tree=str(tree), commit=commit, commit_state=state,
                    changed=tuple(changed), report=report)


def require_ok(check: DepCheck) -> None:
    """Raise the error a build stops with when ``check`` found drift (commit, changed file, conflict)."""
    b, v = check.series, check.series.variant(check.pin)
    if check.commit_state == "differs":
        raise PatchConflictError(
            f"build series {b.name} v{b.version} is written for {b.project} {v.commit if v else '?'}, "
            f"the tree {check.tree} is {check.commit}",
            hint=f"port the series to that commit (a variant under patches/deps/{b.name}/) or build the pin it names")
    if check.changed:
        raise PatchConflictError(
            f"build series {b.name} v{b.version}: {b.project} files changed since the series was written "
            f"({'; '.join(check.changed)}) in {check.tree}",
            hint=f"check the series against the new text, then record the new sha256 under pins.{check.pin}.files")
    if not check.report.ok:
        raise conflict_error(check.report, tree_hint=check.tree)


def _commit_all(tree: Path, message: str) -> None:
    for nested in sorted(tree.rglob(".git"), reverse=True):  # leftovers of submodules: plain files from now on
        if nested.is_dir() and not nested.is_symlink():
            remove_tree(nested)
        else:
            nested.unlink()
    gittree.run_git(["init", "-q"], cwd=tree)
    gittree.run_git(["add", "-A", "-f", "."], cwd=tree)
    gittree.run_git(["commit", "-q", "--no-verify", "-m", message], cwd=tree, env=gittree.identity_env(tree))


def apply_build_series(tree: Path, build: BuildSeries, pin: Pin, *, check_commit: bool = True) -> DepCheck:
    """Apply one build series to a git tree (one commit per patch, all or nothing); a tree that already carries
    it is left as it is. Returns the check made before. ``check_commit=False``: the caller has verified what the
    tree is (a patched copy made here from the prefetched clone of the declared commit)."""
    check = check_dependency(tree, build, pin, check_commit=check_commit)
    require_ok(check)
    if not check.applied:
        apply_stack(tree, [build.series], pin=pin.name, version=pin.version)
    return check


def patched_dependency(pristine: Path, build: Sequence[BuildSeries], pin: Pin) -> Path:
    """A patched copy of the prefetched ``pristine`` clone beside it, made once per series content."""
    dest = pristine.with_name(f"{pristine.name}.g4-{patched_copy_key(pristine.name, build, pin.name)}")
    with cache_lock(dest):
        stamp = dest / PATCHED_STAMP
        if stamp.is_file():
            return dest
        if not (pristine / PREFETCH_STAMP).is_file():
            raise BuildError(f"{pristine} is not a finished prefetched copy (no {PREFETCH_STAMP})",
                             hint="run `g4build prefetch --tree SRC` first")
        tmp = dest.with_name(dest.name + ".tmp")
        remove_tree(tmp)
        try:
            shutil.copytree(pristine, tmp, symlinks=True)
            (tmp / PREFETCH_STAMP).unlink()
            if not gittree.is_repo_top(tmp):  # a copy carried as files (an offline machine): check them, then
                for b in build:  # make the git tree that applying (one commit per patch) and rolling back need
                    require_ok(check_dependency(tmp, b, pin))
                _commit_all(tmp, f"{pristine.name} as prefetched (files, not a git clone)")
            for b in build:
                apply_build_series(tmp, b, pin, check_commit=False)
            record = {"pristine": pristine.name, "pin": pin.name, "series": [b.record(pin.name) for b in build],
                      "head": gittree.head(tmp)}
            (tmp / PATCHED_STAMP).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        except BaseException:
            remove_tree(tmp)
            raise
        remove_tree(dest)
        tmp.rename(dest)
        return dest


def read_patched_record(copy: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((copy / PATCHED_STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def point_cache_at(text: str, dep: CMakeDep, path: Path, label: str) -> str:
    """The ``cmake -C`` file ``text`` with ``dep``'s variables naming ``path`` instead of what they named, and
    its developer-mode override unset (a file an older g4build wrote may still set it)."""
    out = text
    for name in dep.unset_vars:  # a stale line setting it becomes the unset, in its place
        stale = rf'^set\({re.escape(name)} "[^"\n]*" CACHE PATH "[^"\n]*"\)$'
        if unset_line(name) not in out.splitlines():
            out, n = re.subn(stale, unset_line(name), out, count=1, flags=re.MULTILINE)
            if n == 0:
                out = out.rstrip("\n") + "\n" + unset_line(name) + "\n"
        out = re.sub(stale + r"\n?", "", out, flags=re.MULTILINE)
    for name in dep.cache_vars:
        pattern = re.compile(rf'^set\({re.escape(name)} "[^"\n]*" CACHE PATH "[^"\n]*"\)$', re.MULTILINE)
        line = f'set({name} "{path.as_posix()}" CACHE PATH "{label}")'
        out, n = pattern.subn(line.replace("\\", "\\\\"), out)  # a literal replacement: escape backslashes
        if n != 1:
            raise BuildError(f"the CMake initial cache names {name} {n} times: expected once (written by "
                             f"`g4build prefetch --tree SRC --write FILE`)",
                             hint="run the prefetch step again, then this one")
    return out


def apply_for_pin(tree: Path, chosen: Sequence[BuildSeries], pin: Pin, *, cache: Path | None = None,
                  write: Path | None = None,
                  status: Callable[[str], AbstractContextManager[Any]] | None = None) -> list[dict[str, Any]]:
    """Apply ``chosen`` build series for ``pin`` (``g4build deps apply``): vLLM's own to ``tree``, a dependency's to a
    patched copy of its prefetched clone (in ``cache``, default ``default_cache()``), which the initial cache file
    ``write`` (from ``g4build prefetch --write``) is then pointed at, replaced atomically. Returns one record per
    series with the path it was applied to. ``status(text)`` is entered around each prefetch and each patching (a
    progress display)."""
    def step(text: str) -> AbstractContextManager[Any]:
        return status(text) if status is not None else nullcontext()

    cache = cache or default_cache()
    rows: list[dict[str, Any]] = []
    text = write.read_text(encoding="utf-8") if write is not None else None
    deps = {d.name: d for d in find_deps(tree)}
    for b in chosen:
        if not b.is_dependency:
            check = apply_build_series(tree, b, pin)
            rows.append({**b.record(pin.name), "path": str(tree), "already_applied": check.applied})
            continue
        dep = deps.get(b.project)
        v = b.variant(pin.name)
        if dep is None:
            raise UsageError(f"build series {b.name} patches {b.project}, which {tree}'s CMake does not declare",
                             hint=f"known: {', '.join(sorted(deps)) or 'none'}")
        if v is None or v.commit != dep.tag:
            raise UsageError(
                f"build series {b.name} v{b.version} is written for {b.project} {v.commit if v else '?'}, "
                f"{dep.declared_in} declares {dep.tag}",
                hint=f"port it: a variant for that commit under patches/deps/{b.name}/")
        with step(f"prefetch {dep.name} @ {dep.tag}"):
            pristine = prefetch(dep, cache)
        with step(f"patch {dep.name}: {b.name} v{b.version}"):
            copy = patched_dependency(pristine, [b], pin)
        rows.append({**b.record(pin.name), "path": str(copy)})
        if text is not None:
            text = point_cache_at(text, dep, copy, f"g4build deps: {b.name} v{b.version}")
    if write is not None and text is not None:
        write_atomic(write, text.encode("utf-8"))
    return rows
