"""Forward-port a fork's own changes onto a pin's upstream tree (how the Windows base is made).

The Windows fork users build from is upstream at some commit (``onto``) plus its Windows changes
(``onto..commit``: MSVC flags, winloop, gloo, split Marlin kernels, ...). When the fork has no release of the
pin's version, g4build takes exactly those changes and merges them, file by file with git's three-way merge,
onto the pin's upstream tree:

- a file the fork changed and the pin did not touch since ``onto`` takes the fork's version;
- a file both changed is merged (``git merge-file``); a clean merge is taken, a conflict stops the port;
- files in the base's ``keep_pin`` list keep the pin's version (the fork's change there is upstream drift, or
  g4build re-does it in its own ``patches/<os>-base/<pin>/`` fixups, applied afterwards);
- added and deleted files follow the same rule (a file the pin changed is never silently deleted).

Nothing here writes outside the tree it is given; the caller gives a scratch tree and keeps it only on
success, so a port is complete or absent. The fork's commits are fetched once into a bare cache repository
and reused offline.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from g4build.errors import BaseConflictError, ConfigError, SourceError
from g4build.fsutil import remove_tree
from g4build.pins.index import cache_lock, cache_root
from g4build.pins.model import Base, Pin
from g4build.source.base import fixup_patches
from g4build.source.gittree import git_exe
from g4build.source.merge import run_merge_file
from g4build.util import gitsafe
from g4build.util.gitsafe import is_vcs_name
from g4build.util.safeload import read_patch
from g4build.util.safetext import component_problem

# Module-level imports that do not exist on Windows: after a port, a vllm module that still has one at the top
# level will fail to import there.
_POSIX_ONLY = re.compile(r"^(?:import|from)\s+(fcntl|resource|termios|pwd|grp|uvloop)\b", re.M)


@dataclass(frozen=True, kw_only=True)
class PortReport:
    os: str
    remote: str
    commit: str
    onto: str
    taken: tuple[str, ...] = ()  # fork's version taken as is (the pin left the file as it was at onto)
    merged: tuple[str, ...] = ()  # both changed it; merged cleanly
    already: tuple[str, ...] = ()  # the pin already has the fork's content
    added: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    kept_pin: tuple[str, ...] = ()
    fixups: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


@dataclass
class _Conflict:
    path: str
    why: str


@dataclass
class _Plan:
    writes: dict[str, tuple[bytes, str]] = field(default_factory=dict)  # path -> (content, git mode)
    deletes: list[str] = field(default_factory=list)
    sorted_into: dict[str, list[str]] = field(default_factory=dict)
    conflicts: list[_Conflict] = field(default_factory=list)

    def note(self, kind: str, path: str) -> None:
        self.sorted_into.setdefault(kind, []).append(path)


# --- the fork's commits: a bare cache repository ----------------------------------------------------------------


# Neutral git: no password prompt (an unattended build must fail, not wait), no line-ending conversion.
_NEUTRAL = tuple(gitsafe.config_args())  # no hook or fsmonitor of any repository, no line-ending conversion


def _git(repo: Path, *args: str, check: bool = True, deadline: float | None = None,
         ) -> subprocess.CompletedProcess[bytes]:
    # a fetch into the bare cache g4build made: the user's config (proxies, mirrors) stays, no program of it runs
    try:
        return subprocess.run([git_exe(), *_NEUTRAL, "--git-dir", str(repo), *args], capture_output=True,
                              check=check, env=gitsafe.env(network=True),
                              timeout=gitsafe.left(deadline) if deadline is not None else None)
    except subprocess.TimeoutExpired:
        raise SourceError(f"git {args[0]} from the fork did not finish within G4BUILD_GIT_DEADLINE",
                          hint="the remote or the network is too slow or stalls: try again, use a mirror "
                               "(--remote), or raise G4BUILD_GIT_DEADLINE (seconds)") from None


def _has_commit(repo: Path, sha: str) -> bool:
    return _git(repo, "cat-file", "-e", f"{sha}^{{commit}}", check=False).returncode == 0


FORK_DEPTH = 200  # history fetched below the fork head: `onto` must be within it
# PORT_VERSION (bumped when the port's rules change) lives in source/base.py, with the digest it feeds


def fork_cache(remote: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", remote.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git"))[:40]
    return cache_root() / "forks" / f"{slug}-{hashlib.sha256(remote.encode()).hexdigest()[:10]}.git"


def ensure_fork_commits(remote: str, head: str, onto: str, *, cache_key: str | None = None) -> Path:
    """A bare repository holding the fork's ``head`` and ``onto`` (full shas), fetched from ``remote`` only when
    missing; ``onto`` must be an ancestor of ``head`` (else onto..head would carry more than the fork's work)."""
    repo = fork_cache(cache_key or remote)
    url = str(Path(remote).resolve()) if Path(remote).exists() else remote
    with cache_lock(repo):
        if not (repo / "HEAD").is_file():
            tmp = repo.with_name(repo.name + ".tmp")
            remove_tree(tmp)
            tmp.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run([git_exe(), *_NEUTRAL, "init", "-q", "--bare", "--template=", str(tmp)], check=True,
                           capture_output=True, env=gitsafe.env())
            os.replace(tmp, repo)
        if not (_has_commit(repo, head) and _has_commit(repo, onto)):
            # The fork head by sha (what GitHub serves) with enough history to hold `onto`; a server that refuses
            # unadvertised shas gets its branches and tags, as deep.
            tries = [["fetch", "-q", "--no-tags", f"--depth={FORK_DEPTH}", url, head],
                     ["fetch", "-q", f"--depth={FORK_DEPTH}", url, "+refs/heads/*:refs/fork/heads/*",
                      "+refs/tags/*:refs/fork/tags/*"]]
            last = "the remote has no such commit"
            deadline = gitsafe.network_deadline()
            for args in tries:
                proc = _git(repo, *args, check=False, deadline=deadline)
                if proc.returncode:
                    last = (proc.stderr.decode(errors="replace").strip().splitlines() or [last])[-1]
                if _has_commit(repo, head) and _has_commit(repo, onto):
                    break
            missing = [c for c in (head, onto) if not _has_commit(repo, c)]
            if missing:
                raise SourceError(
                    f"the fork {remote} did not give commit(s) {', '.join(missing)} (the head, and onto within "
                    f"{FORK_DEPTH} commits below it): {last}",
                    hint="check bases.<os>.commit/onto in patches/pins.yaml (onto must be the upstream commit the "
                         "fork's head sits on), or the network; a fetched fork is cached and then works offline",
                )
        if _git(repo, "merge-base", "--is-ancestor", onto, head, check=False).returncode:
            raise ConfigError(
                f"bases: onto {onto} is not an ancestor of the fork commit {head}; expected the upstream commit "
                "the fork's changes sit on",
                hint="set onto to `git merge-base <fork head> <upstream main>` in patches/pins.yaml",
            )
    return repo


# --- the merge -------------------------------------------------------------------------------------------------


def merge_file(ours: bytes, base: bytes, theirs: bytes) -> tuple[bytes, str | None]:
    """Three-way merge of one file: (result, None) or (ours, why it conflicts)."""
    if ours == base:
        return theirs, None
    if theirs == base or ours == theirs:
        return ours, None
    if b"\0" in ours or b"\0" in base or b"\0" in theirs:
        return ours, "binary file changed on both sides"
    rc, merged = run_merge_file(ours, base, theirs)
    return (merged, None) if rc == 0 else (ours, f"{rc} conflicting hunk(s)")


_FILE_MODES = {"100644", "100755", "000000"}


def _changes(repo: Path, onto: str, commit: str) -> list[tuple[str, str, str, str]]:
    """(status, path, old mode, new mode) for every entry the fork changed (``git diff --raw``, no renames)."""
    raw = _git(repo, "diff", "--raw", "-z", "--no-renames", "--no-abbrev", onto, commit).stdout.split(b"\0")
    items = [x.decode("utf-8", "surrogateescape") for x in raw if x]
    out = []
    for meta, path in zip(items[::2], items[1::2], strict=True):
        old_mode, new_mode, _old, _new, status = meta.lstrip(":").split(" ")
        _check_path(path, commit)
        out.append((status[0], path, old_mode, new_mode))
    return out


def _check_path(path: str, commit: str) -> None:
    """A path of the fork's commits names a file inside the tree and never VCS metadata: a hostile remote can
    serve trees with '..' or '.git' entries (git does not check fetched objects unless asked to)."""
    parts = path.split("/")
    why = next((w for w in (component_problem(p) for p in parts) if w), None)
    if why is None and any(is_vcs_name(p) for p in parts):
        why = "VCS metadata (.git and its spellings)"
    if why is not None or path.startswith("/"):
        raise SourceError(f"the fork's commit {commit[:12]} changes {path!r}, which has {why or 'an absolute path'}; "
                          "expected paths inside the tree", hint="nothing was written: check bases.<os>.remote and "
                          "commit in patches/pins.yaml (the fork is not the one you expect)")


def _blob(repo: Path, commit: str, path: str) -> bytes:
    return _git(repo, "cat-file", "blob", f"{commit}:{path}").stdout


def _is_executable(path: Path) -> bool:
    return bool(path.stat().st_mode & 0o111)


def _plan_port(repo: Path, base: Base, tree: Path) -> _Plan:
    assert base.onto
    plan = _Plan()
    keep = set(base.keep_pin)
    changes = _changes(repo, base.onto, base.commit)
    for status, path, old_mode, new_mode in changes:
        mine = tree / path
        if path in keep:
            plan.note("kept_pin", path)
            continue
        if not {old_mode, new_mode} <= _FILE_MODES:  # symlinks (120000) and submodules (160000)
            plan.conflicts.append(_Conflict(path, f"not a regular file in the fork (mode {old_mode} -> {new_mode})"))
            continue
        if mine.is_dir() or any((tree / parent).is_file() for parent in PurePosixPath(path).parents if parent.parts):
            plan.conflicts.append(_Conflict(path, "a file in the fork where the pin has a folder, or the reverse"))
            continue
        if status == "A":
            theirs = _blob(repo, base.commit, path)
            if not mine.exists():
                plan.writes[path] = (theirs, new_mode)
                plan.note("added", path)
            elif mine.read_bytes() == theirs:
                plan.note("already", path)
            else:
                plan.conflicts.append(_Conflict(path, "the fork adds it and the pin has a different file there"))
        elif status == "D":
            if not mine.exists():
                plan.note("already", path)
            elif mine.read_bytes() == _blob(repo, base.onto, path):
                plan.deletes.append(path)
                plan.note("deleted", path)
            else:
                plan.conflicts.append(_Conflict(path, "the fork deletes it and the pin changed it"))
        elif status == "M":
            if not mine.is_file():
                plan.conflicts.append(_Conflict(path, "the fork changes it and the pin no longer has it"))
                continue
            onto_data, fork_data = _blob(repo, base.onto, path), _blob(repo, base.commit, path)
            ours = mine.read_bytes()
            result, why = merge_file(ours, onto_data, fork_data)
            if why:
                plan.conflicts.append(_Conflict(path, why))
                continue
            kind = "taken" if ours == onto_data else "already" if result == ours else "merged"
            pin_mode = "100755" if _is_executable(mine) else "100644"
            mode = new_mode if new_mode != old_mode else pin_mode  # the fork's mode change, else the pin's
            if result != ours or mode != pin_mode:
                plan.writes[path] = (result, mode)
            plan.note(kind, path)
        else:
            plan.conflicts.append(_Conflict(path, f"unsupported change kind {status!r} (type change)"))
    by_case: dict[str, list[str]] = {}
    for _status, path, _old, _new in changes:
        by_case.setdefault(path.lower(), []).append(path)
    for paths in by_case.values():
        if len(paths) > 1:  # Foo.py -> foo.py: on a case-insensitive disk the add finds the file the delete removes
            plan.conflicts.append(_Conflict(" / ".join(paths), "a rename that only changes case (not portable)"))
    stale = sorted(keep - set(plan.sorted_into.get("kept_pin", [])))
    for path in stale:
        plan.note("stale_keep", path)
    return plan


def posix_only_imports(tree: Path) -> list[str]:
    """``vllm/`` modules that import a POSIX-only module at the top level (would fail to import on Windows)."""
    found = []
    for py in sorted((tree / "vllm").rglob("*.py")):
        match = _POSIX_ONLY.search(py.read_text(encoding="utf-8", errors="replace"))
        if match:
            found.append(f"{py.relative_to(tree).as_posix()} imports {match.group(1)} at the top level")
    return found


def _apply_fixups(tree: Path, patches: list[Path]) -> None:
    """``git apply`` each fixup in ``tree`` (which must be a git repository's top: paths are then tree-relative)."""
    for patch in patches:
        data = read_patch(patch)  # bounded; git reads these bytes on stdin, never the file itself
        for args in (["--check"], []):
            proc = subprocess.run([git_exe(), *_NEUTRAL, "apply", "--whitespace=nowarn", *args, "-"],
                                  cwd=tree, input=data, capture_output=True, check=False, env=gitsafe.env())
            if proc.returncode:
                raise BaseConflictError(
                    f"fixup {patch.parent.parent.name}/{patch.parent.name}/{patch.name} does not apply to the "
                    f"forward-ported tree: {proc.stderr.decode(errors='replace').strip()[-800:]}",
                    hint="refresh the fixup against the pin's version of the file (the file is in keep_pin)",
                )


def port_onto(tree: Path, pin: Pin, os_name: str, *, remote: str | None = None) -> PortReport:
    """Merge the fork's changes of ``pin.bases[os_name]`` into ``tree`` (the pin's upstream tree, a git
    repository's top with nothing else in it), then apply our fixups. Raises BaseConflictError on any conflict
    not covered by ``keep_pin``; the tree is then partly written and must be thrown away by the caller."""
    base = pin.bases[os_name]
    if not base.onto:
        raise SourceError(f"pins.{pin.name}.bases.{os_name} has no onto: it is a fork release used as it is")
    repo = ensure_fork_commits(remote or base.remote, base.commit, base.onto, cache_key=base.remote)
    plan = _plan_port(repo, base, tree)
    if plan.conflicts:
        listing = "; ".join(f"{c.path} ({c.why})" for c in plan.conflicts[:12])
        more = f" and {len(plan.conflicts) - 12} more" if len(plan.conflicts) > 12 else ""
        raise BaseConflictError(
            f"the {os_name} fork's changes ({base.commit[:12]} over {base.onto[:12]}) conflict with "
            f"{pin.name} in {len(plan.conflicts)} file(s): {listing}{more}",
            hint=f"pin a fork commit that is {pin.version} itself (bases.{os_name} without onto), or add the files "
                 f"to keep_pin and re-do the fork's change there in patches/{os_name}-base/{pin.name}/",
        )
    for path in plan.deletes:
        (tree / path).unlink()
        for parent in (tree / path).parents:  # no empty folders left behind (git would not have them)
            if parent == tree or any(parent.iterdir()):
                break
            parent.rmdir()
    for path, (data, mode) in plan.writes.items():
        dest = tree / path
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
        os.chmod(dest, 0o755 if mode == "100755" else 0o644)
    fixups = fixup_patches(os_name, pin)
    _apply_fixups(tree, fixups)
    stale = plan.sorted_into.get("stale_keep", [])
    warnings = [f"keep_pin lists {p}, which the fork does not change: drop it" for p in stale]
    if os_name == "windows":
        warnings += posix_only_imports(tree)
    got = {k: tuple(v) for k, v in plan.sorted_into.items()}
    return PortReport(os=os_name, remote=base.remote, commit=base.commit, onto=base.onto,
                      taken=got.get("taken", ()), merged=got.get("merged", ()), already=got.get("already", ()),
                      added=got.get("added", ()), deleted=got.get("deleted", ()), kept_pin=got.get("kept_pin", ()),
                      fixups=tuple(p.name for p in fixups), warnings=tuple(warnings))
