"""The few git operations the patch engine runs on a source tree, behind one small interface."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from g4build.errors import SourceError
from g4build.util import gitsafe

_IDENTITY = {"name": "g4build", "email": "g4build@localhost"}


def git_exe() -> str:
    exe = shutil.which("git")
    if not exe:
        raise SourceError("git is not on PATH: the patch engine needs it", hint="install git (>= 2.25)")
    return exe


def run_git(
    args: list[str], *, cwd: Path, stdin: bytes | None = None, env: dict[str, str] | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[bytes]:
    """Run git hardened (``util.gitsafe``: no hook, fsmonitor, system or global config: the trees are upstream
    material); raise SourceError (with git's message) when ``check`` and it fails."""
    proc = subprocess.run(
        [git_exe(), *gitsafe.config_args(), *args], cwd=cwd, input=stdin, capture_output=True,
        env=gitsafe.env({**os.environ, **(env or {})}), check=False,
    )
    if check and proc.returncode != 0:
        msg = proc.stderr.decode(errors="replace").strip() or proc.stdout.decode(errors="replace").strip()
        raise SourceError(f"git {' '.join(args[:2])} failed in {cwd}: {msg}")
    return proc


def out(args: list[str], *, cwd: Path) -> str:
    return run_git(args, cwd=cwd).stdout.decode(errors="replace").strip()


def is_repo_top(tree: Path) -> bool:
    """True when ``tree`` is the top folder of a git work tree (not a folder inside some other repository)."""
    proc = run_git(["rev-parse", "--show-toplevel"], cwd=tree, check=False)
    if proc.returncode != 0:
        return False
    return Path(proc.stdout.decode().strip()).resolve() == tree.resolve()


def require_repo(tree: Path) -> None:
    if not tree.is_dir():
        raise SourceError(f"{tree} is not a folder", hint="pass --tree with a vLLM source tree")
    if not is_repo_top(tree):
        raise SourceError(
            f"{tree} is not a git repository (its top folder): applying needs git to commit and to roll back",
            hint="`g4build source fetch` makes git trees; or run `git init && git add -A && git commit -m base` there",
        )
    if run_git(["rev-parse", "--verify", "-q", "HEAD"], cwd=tree, check=False).returncode != 0:
        raise SourceError(f"{tree} has no commit yet", hint="commit the pristine tree first (git add -A; git commit)")


def dirty_paths(tree: Path) -> list[str]:
    """Tracked paths with staged or unstaged changes; empty for a clean tree.

    Untracked files (a ``__pycache__`` from running the tree, say) do not count: patches are checked against
    them like any other file, and a rollback leaves them where they were.
    """
    # --no-renames: with -z a staged rename adds a second, unprefixed field that would read as a cut path
    raw = run_git(["status", "--porcelain=v1", "-z", "--untracked-files=no", "--no-renames"], cwd=tree).stdout
    return [entry.decode(errors="replace")[3:] for entry in raw.split(b"\0") if entry]


def untracked_paths(tree: Path) -> set[str]:
    raw = run_git(["ls-files", "-z", "--others", "--exclude-standard"], cwd=tree).stdout
    return {entry.decode(errors="surrogateescape") for entry in raw.split(b"\0") if entry}


def require_clean(tree: Path) -> None:
    dirty = dirty_paths(tree)
    if dirty:
        shown = ", ".join(dirty[:5]) + (f" and {len(dirty) - 5} more" if len(dirty) > 5 else "")
        raise SourceError(
            f"{tree} has uncommitted changes ({shown}); expected a clean tree",
            hint="commit or stash them (git stash) first; `g4build patches new` turns a diff into a series",
        )


def head(tree: Path) -> str:
    return out(["rev-parse", "HEAD"], cwd=tree)


def identity_env(tree: Path) -> dict[str, str]:
    """Author/committer for our commits: the user's own when configured, else a neutral g4build one.

    Commits run without the user's global config (``run_git``), so the user's name and address are read here,
    read only (``git config --get`` runs no program), and passed on as the environment."""
    user = {}
    for key, names in (("user.name", ("GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME")),
                       ("user.email", ("GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL"))):
        proc = subprocess.run([git_exe(), "config", "--get", key], cwd=tree, capture_output=True, check=False,
                              env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
        value = proc.stdout.decode(errors="replace").strip()
        if proc.returncode == 0 and value and "\n" not in value:
            user.update(dict.fromkeys(names, value))
    if len(user) == 4:
        return user
    return {
        "GIT_AUTHOR_NAME": _IDENTITY["name"], "GIT_AUTHOR_EMAIL": _IDENTITY["email"],
        "GIT_COMMITTER_NAME": _IDENTITY["name"], "GIT_COMMITTER_EMAIL": _IDENTITY["email"],
    }


def diff_args() -> list[str]:
    """Options that make ``git diff`` write our patch format whatever the user's diff settings are."""
    return ["diff", "--no-color", "--no-ext-diff", "--no-textconv", "--no-renames", "--binary",
            "--src-prefix=a/", "--dst-prefix=b/"]


def pristine_commit(tree: Path) -> str:
    """The first commit of a g4build source tree: the upstream source as fetched, before any patch."""
    roots = out(["rev-list", "--max-parents=0", "HEAD"], cwd=tree).split()
    if len(roots) != 1:
        raise SourceError(f"{tree} has {len(roots)} root commits; expected the one of the fetched source")
    return roots[0]
