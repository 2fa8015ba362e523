"""Source acquisition: a pin's vLLM tree from the release sdist, the upstream git remote, or a local path.

Every route ends in a verified git work tree whose first commit is the pristine upstream source, so patch
series apply with git. Trees and downloads live in the cache (``pins.index.cache_root()``), keyed by pin and
source, guarded by a file lock, and are complete or absent: work happens in a temporary sibling that is
renamed into place only once it is whole.
"""

from __future__ import annotations

import json
import os
import re
import tarfile
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import git

from g4build.errors import IntegrityError, SourceError, UnsafeArchiveError, UsageError
from g4build.fsutil import remove_tree
from g4build.pins.baseroutes import no_base_routes
from g4build.pins.index import Fetched, ProgressHook, cache_lock, cache_root, fetch_verified
from g4build.pins.model import GitRef, Pin
from g4build.source import forkport, gittree
from g4build.source.base import base_digest
from g4build.source.extract import check_tar_members, is_vcs_member, safe_extract_tar
from g4build.util import gitsafe

MARKER = "g4build-source.json"  # kept inside .git/, so it never shows in the work tree
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "g4build",
    "GIT_AUTHOR_EMAIL": "g4build@localhost",
    "GIT_COMMITTER_NAME": "g4build",
    "GIT_COMMITTER_EMAIL": "g4build@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
}


@dataclass(frozen=True, kw_only=True)
class SourceResult:
    pin: str
    path: Path
    source: str  # "sdist", "git" or "path"
    verified: str  # "sha256:<hex>" or "commit:<sha>"
    cached: bool
    port: dict[str, Any] | None = None  # what a forward-ported OS base took from the fork (forkport.PortReport)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"] = str(self.path)
        return d


def pristine_files(pin: Pin, paths: Iterable[str], progress: ProgressHook | None = None) -> dict[str, bytes]:
    """The pin's own copies of ``paths`` (tree-relative, e.g. ``vllm/envs.py``), read from its sha256-verified sdist
    (cached; fetched from the index when missing). A path the release does not have is left out."""
    got = fetch_verified("vllm", pin.sdist.file, pin.sdist.sha256, cache_dir=cache_root() / "sdists", progress=progress)
    wanted = set(paths)
    found: dict[str, bytes] = {}
    try:
        with tarfile.open(got.path) as tar:
            members = tar.getmembers()
            check_tar_members(members, got.path.name)
            for member in members:
                top, _, rel = member.name.partition("/")
                if rel in wanted and member.isfile() and top and rel not in found and not is_vcs_member(rel):
                    data = tar.extractfile(member)
                    if data is not None:
                        found[rel] = data.read()
    except tarfile.TarError as exc:
        raise UnsafeArchiveError(f"{got.path.name}: not a readable tar archive: {exc}",
                                 hint="expected a .tar.gz sdist: delete the file and download it again") from exc
    return found


def release_tree(
    version: str, pins: Iterable[Pin], workdir: Path, *,
    progress: Callable[[str], AbstractContextManager[ProgressHook | None]] | None = None,
    fetched: Callable[[str, Fetched], None] | None = None,
) -> tuple[Path, str]:
    """An unpinned release's source (``patches check --release``): vllm-<version>.tar.gz downloaded (or taken from
    the cache) verified against the sha256 the index publishes, and extracted under ``workdir``; returns the tree
    and that sha256. When a pin names the same file, the index's sha256 must also equal the pin's.

    ``progress(filename)`` is entered around the download and gives its progress hook; ``fetched(filename, got)`` is
    told once the file is verified, before it is extracted.
    """
    filename = f"vllm-{version}.tar.gz"
    with progress(filename) if progress is not None else nullcontext(None) as hook:
        got = fetch_verified("vllm", filename, None, cache_dir=cache_root() / "sdists", progress=hook)
    for p in pins:
        if p.sdist.file == filename and p.sdist.sha256 != got.sha256:
            raise IntegrityError(
                f"{filename}: the index publishes sha256 {got.sha256}, pin {p.name} records {p.sdist.sha256}",
                hint="the pin or the mirror is wrong; check patches/pins.yaml and your index-url",
            )
    if fetched is not None:
        fetched(filename, got)
    return safe_extract_tar(got.path, workdir / "src"), got.sha256


# --- helpers ---------------------------------------------------------------------------------------------


def trees_root() -> Path:
    return cache_root() / "trees"


def _read_marker(tree: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((tree / ".git" / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_marker(tree: Path, data: dict[str, Any]) -> None:
    (tree / ".git" / MARKER).write_text(json.dumps(data, indent=2) + "\n")


def _init_repo(tree: Path) -> git.Repo:
    """A fresh repository of g4build's own (the extracted tree carries none: ``extract``), whose files are stored
    and checked out byte for byte whatever the user's git config says (Git for Windows defaults to
    core.autocrlf=true, which would make patched files look changed). Its git runs hardened (``util.gitsafe``)."""
    if (tree / ".git").exists() or (tree / ".git").is_symlink():
        raise SourceError(f"{tree} already holds a .git; expected a tree without one (extracted trees keep none)",
                          hint="remove the folder; g4build makes it again from the cached download")
    tree.mkdir(parents=True, exist_ok=True)
    gittree.run_git(["init", "-q", "--template="], cwd=tree)
    gittree.run_git(["config", "core.autocrlf", "false"], cwd=tree)
    gittree.run_git(["config", "core.safecrlf", "false"], cwd=tree)
    repo = git.Repo(tree)
    # network fetches keep the user's config (proxies, mirrors) but never a hook or an fsmonitor
    repo.git.set_persistent_git_options(c=gitsafe.config_args()[1::2])
    return repo


def _commit_tree(tree: Path, message: str) -> str:
    if not (tree / ".git").is_dir():
        _init_repo(tree)
    gittree.run_git(["add", "-A", "-f"], cwd=tree)  # sdists carry generated files a .gitignore would hide
    gittree.run_git(["commit", "-q", "--no-gpg-sign", "--no-verify", "-m", message], cwd=tree, env=_GIT_ENV)
    return gittree.head(tree)


def read_version_file(tree: Path) -> tuple[str | None, str | None]:
    """(version, commit id) from ``vllm/_version.py`` as written by setuptools-scm."""
    try:
        text = (tree / "vllm" / "_version.py").read_text()
    except OSError:
        return None, None
    ver = re.search(r"^__version__\s*=\s*version\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    cid = re.search(r"^__commit_id__\s*=\s*commit_id\s*=\s*['\"]g?([0-9a-f]+)['\"]", text, re.M)
    return (ver.group(1) if ver else None), (cid.group(1) if cid else None)


# --- routes ----------------------------------------------------------------------------------------------


def _from_sdist(pin: Pin, dest: Path, progress: ProgressHook | None, *, os_name: str | None = None,
                fork_remote: str | None = None) -> SourceResult:
    """The pin's sdist as a one-commit git tree; with ``os_name``, the fork's changes of that OS base are
    forward-ported onto it first (the commit is then the base, so patches and status work as usual)."""
    port_key = base_digest(pin, os_name) if os_name else None
    marker = _read_marker(dest)
    if (marker and marker.get("sha256") == pin.sdist.sha256 and marker.get("pin") == pin.name
            and marker.get("os_base") == port_key):
        report = marker.get("port")
        return SourceResult(pin=pin.name, path=dest, source="sdist", verified=f"sha256:{pin.sdist.sha256}",
                            cached=True, port=report if isinstance(report, dict) else None)
    if dest.exists():
        if marker and marker.get("pin") == pin.name and marker.get("sha256") == pin.sdist.sha256:
            have = "the upstream tree" if not marker.get("os_base") else "another OS base (changed fork or fixups)"
            want = f"the {os_name} base" if os_name else "the upstream tree"
            raise SourceError(f"{dest} holds {pin.name} as {have}; expected {want}",
                              hint="remove that folder (it is rebuilt from the cached sdist) or pass another --dest")
        raise SourceError(
            f"{dest} exists but is not a g4build tree of {pin.name}",
            hint="pass another --dest or remove that folder",
        )
    got = fetch_verified("vllm", pin.sdist.file, pin.sdist.sha256, cache_dir=cache_root() / "sdists", progress=progress)
    work = dest.with_name(dest.name + ".tmp")
    remove_tree(work)
    try:
        top = safe_extract_tar(got.path, work)
        version, commit_id = read_version_file(top)
        if version != pin.version:
            raise SourceError(
                f"{pin.sdist.file}: expected vllm/_version.py to say version {pin.version} (the pin), "
                f"found {version!r}",
                hint=f"the sdist is not the pinned release: check {pin.name} in patches/pins.yaml",
            )
        if commit_id and not commit_id.startswith(pin.upstream.commit[: len(commit_id)]):
            raise SourceError(
                f"{pin.sdist.file}: expected vllm/_version.py to name commit {pin.upstream.commit} (the pin), "
                f"found {commit_id}",
                hint=f"correct upstream.commit of {pin.name} in patches/pins.yaml",
            )
        report = None
        message = f"upstream vllm {pin.version}"
        if os_name:
            _init_repo(top)  # fixups are applied with git apply, which needs the tree to be a repository top
            report = forkport.port_onto(top, pin, os_name, remote=fork_remote).to_dict()
            base = pin.bases[os_name]
            message += f" + {os_name} fork {base.commit} (forward-ported from {base.onto})"
        commit = _commit_tree(top, message)
        _write_marker(top, {"pin": pin.name, "source": "sdist", "sha256": pin.sdist.sha256, "base": commit,
                            "os_base": port_key, "port": report})
        os.replace(top, dest)
    finally:
        remove_tree(work)
    return SourceResult(pin=pin.name, path=dest, source="sdist", verified=f"sha256:{pin.sdist.sha256}", cached=False,
                        port=report)


def _resolve_git(repo: git.Repo, pin: Pin) -> str:
    """Fetch as little as possible and return the full sha of the pinned commit."""
    commit = pin.upstream.commit
    attempts: list[list[str]] = []
    if len(commit) == 40:
        attempts.append(["--depth", "1", "origin", commit])
    attempts.append(["--depth", "1", "origin", f"+refs/tags/v{pin.version}:refs/tags/v{pin.version}"])
    attempts.append(["origin", "+refs/heads/*:refs/remotes/origin/*", "+refs/tags/*:refs/tags/*"])
    deadline = gitsafe.network_deadline()
    for args in attempts:
        if time.monotonic() >= deadline:
            raise SourceError(f"fetching {pin.upstream.remote} did not finish within G4BUILD_GIT_DEADLINE",
                              hint="the remote or the network is too slow or stalls: try again, pass --remote with a "
                                   "mirror, or raise G4BUILD_GIT_DEADLINE (seconds)")
        try:
            repo.git.fetch("-q", *args, kill_after_timeout=gitsafe.left(deadline))
        except git.GitCommandError:
            continue
        for ref in (commit, f"v{pin.version}"):
            try:
                sha = str(repo.git.rev_parse("--verify", "-q", f"{ref}^{{commit}}"))
            except git.GitCommandError:
                continue
            if pin.upstream.matches(sha):
                return sha
    raise SourceError(
        f"the remote {pin.upstream.remote} has no commit starting with {commit} (tried tag v{pin.version})",
        hint="check the pin's upstream.commit or pass --remote with a mirror that has it",
    )


def _from_git(pin: Pin, dest: Path, remote: str | None) -> SourceResult:
    marker = _read_marker(dest)
    if marker and marker.get("pin") == pin.name and pin.upstream.matches(str(marker.get("base", ""))):
        return SourceResult(pin=pin.name, path=dest, source="git", verified=f"commit:{marker['base']}", cached=True)
    if dest.exists():
        raise SourceError(f"{dest} exists but is not a g4build tree of {pin.name}", hint="pass another --dest")
    url = remote or pin.upstream.remote
    work = dest.with_name(dest.name + ".tmp")
    remove_tree(work)
    try:
        repo = _init_repo(work)
        repo.create_remote("origin", str(Path(url).resolve()) if Path(url).exists() else url)
        try:
            sha = _resolve_git(repo, pin)
        except git.GitCommandError as exc:
            raise SourceError(f"git could not reach {url}: {exc.stderr.strip()}",
                              hint="check the URL or path, or pass --remote with a reachable mirror") from exc
        repo.git.checkout("-q", "--detach", sha)
        _write_marker(work, {"pin": pin.name, "source": "git", "remote": url, "base": sha})
        os.replace(work, dest)
    finally:
        remove_tree(work)
    return SourceResult(pin=pin.name, path=dest, source="git", verified=f"commit:{sha}", cached=False)


def _pinned_base(repo: git.Repo, pin: Pin) -> str:
    """``commit:<sha>`` when HEAD is the pinned commit, or it plus only g4build series commits; else what HEAD is.

    Upstream commits on top of the pin are a different source, however few: they are not accepted.
    """
    try:
        commits = list(repo.iter_commits("HEAD", max_count=200, first_parent=True))
    except (git.GitCommandError, ValueError):
        return "no commit"
    for on_top, c in enumerate(commits):
        if pin.upstream.matches(c.hexsha):
            return f"commit:{c.hexsha}" + (f" (+{on_top} g4build series commit(s))" if on_top else "")
        if "G4build-Series:" not in str(c.message):
            break
    head = commits[0].hexsha[:12] if commits else "?"
    return f"HEAD {head} is neither the pinned commit nor g4build series commits on top of it"


def verify_tree(pin: Pin, tree: Path) -> str:
    """Check an existing checkout against the pin; return what was verified."""
    if not tree.is_dir():
        raise SourceError(f"{tree} is not a directory; expected a vLLM checkout of {pin.name}",
                          hint="pass --from with the path of an existing checkout, or --from sdist / git")
    marker = _read_marker(tree)
    if marker and marker.get("pin") == pin.name:
        if marker.get("source") != "sdist":
            return f"commit:{marker['base']}"
        port = marker.get("port") if isinstance(marker.get("port"), dict) else None
        extra = f" + {port['os']} base {marker.get('os_base')}" if port else ""  # not the bare upstream tree
        return f"sha256:{marker['sha256']}{extra}"
    if (tree / ".git").exists():
        found_git = _pinned_base(git.Repo(tree), pin)
        if found_git.startswith("commit:"):
            return found_git
    version, commit_id = read_version_file(tree)
    if version == pin.version and commit_id and pin.upstream.commit.startswith(commit_id[: len(pin.upstream.commit)]):
        return f"commit:{commit_id} (vllm/_version.py)"
    found = f"version {version}, commit {commit_id}" if version else "no vllm/_version.py"
    if (tree / ".git").exists():
        found += f"; git: {found_git}"
    raise SourceError(
        f"{tree} is not {pin.name}: expected version {pin.version} at commit {pin.upstream.commit}, found {found}",
        hint="fetch the pinned source with `g4build source fetch --pin " + pin.name + "`",
    )


def fetch_source(
    pin: Pin,
    how: str = "sdist",
    *,
    dest: Path | None = None,
    remote: str | None = None,
    os_name: str | None = None,
    progress: ProgressHook | None = None,
) -> SourceResult:
    """Acquire the pin's source by ``how``: "sdist", "git" or a filesystem path to an existing checkout.

    ``os_name`` asks for that OS's base tree instead (``pins.<pin>.bases.<os>``): a fork release is cloned as
    it is; a fork with ``onto`` is forward-ported onto the pin's sdist (``remote`` is then a mirror of the fork).
    """
    if os_name is not None:
        return _fetch_base(pin, how, os_name, dest=dest, remote=remote, progress=progress)
    if remote is not None and how != "git":
        raise UsageError(f"--remote is for --from git; found --from {how}",
                         hint="drop --remote, or pass --from git to clone from that remote")
    if how not in ("sdist", "git"):
        if dest is not None:
            raise UsageError(f"--dest has no effect with an existing checkout (--from {how})",
                             hint="drop --dest: the checkout is used where it is")
        path = Path(how).expanduser().resolve()
        return SourceResult(pin=pin.name, path=path, source="path", verified=verify_tree(pin, path), cached=True)
    dest = (dest or trees_root() / pin.name / how).expanduser().resolve()
    with cache_lock(dest):
        if how == "sdist":
            return _from_sdist(pin, dest, progress)
        return _from_git(pin, dest, remote)


def _fetch_base(pin: Pin, how: str, os_name: str, *, dest: Path | None, remote: str | None,
                progress: ProgressHook | None) -> SourceResult:
    base = pin.bases.get(os_name)
    if base is None:
        raise UsageError(f"pin {pin.name} names no {os_name} base (patches/pins.yaml: pins.{pin.name}.bases): "
                         "there is no verified fork tree to fetch for that OS",
                         hint=no_base_routes(pin, os_name))
    if base.onto:
        if how != "sdist":
            raise UsageError(f"the {os_name} base of {pin.name} is forward-ported onto the pin's sdist; "
                             f"found --from {how}", hint="drop --from (the sdist is the default)")
        dest = (dest or trees_root() / pin.name / f"sdist-{os_name}").expanduser().resolve()
        with cache_lock(dest):
            return _from_sdist(pin, dest, progress, os_name=os_name, fork_remote=remote)
    if how not in ("sdist", "git"):
        raise UsageError(f"--from {how}: the {os_name} base is cloned from its fork", hint="drop --from")
    fork_pin = replace(pin, upstream=GitRef(remote=base.remote, commit=base.commit), bases={})
    dest = (dest or trees_root() / pin.name / f"git-{os_name}").expanduser().resolve()
    with cache_lock(dest):
        return _from_git(fork_pin, dest, remote)
