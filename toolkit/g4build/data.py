"""Where g4build's data lives (patches/, recipes/, ci/) and small YAML helpers.

The data folders sit at the repository's top level. A command finds them through ``--root`` (``--project``),
``G4BUILD_HOME``, the project the working directory is in, or, for an editable/source install, relative to this
file; commands that write data refuse the copy an installed wheel carries (``writable_root``).

A project found by walking up from the working directory is code, not just data (its patches go into wheels, its
recipes into launch scripts), so it is used only when it passes an ownership check like git's ``safe.directory``:
the project folder, its data folders and files (linked folders entered: what is read through a link is checked as
if it were here), and every folder walked from the working directory up to it are owned by the user running
g4build and writable by no one else (group-writable only where the group is the user's own, as a umask of 002
with user private groups leaves files: named as the user, with no other member, listed or by primary group). A
``patches/`` planted in ``/tmp`` or a shared parent folder is then passed over with a one-line note; naming a
project (``--root``, ``G4BUILD_HOME``) uses it as named. ``project_choice`` says which project is used and why
(``g4build doctor`` shows it, and the project passed over).
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any

from g4build.errors import ConfigError, UsageError
from g4build.util.yamlsafe import load_mapping

# A g4build project (the checkout or a copy of its data) is a folder holding both of these.
MARKERS = (Path("patches") / "pins.yaml", Path("patches") / "series.yaml")

_root_option: Path | None = None


def set_root_option(root: Path | None) -> None:
    """``g4build --root DIR``: the project for this command (set, or cleared, by the root callback)."""
    global _root_option
    _root_option = root
    _passed_over.clear()
    _checked.clear()


def is_project(folder: Path) -> bool:
    return all((folder / marker).is_file() for marker in MARKERS)


DATA_FOLDERS = ("patches", "recipes", "ci")
_passed_over: set[Path] = set()  # projects already named in a note, so a command says it once
_checked: dict[tuple[Path, Path], str | None] = {}  # (project, working directory) -> ownership_problem, per command


def find_project(start: Path) -> Path | None:
    """The nearest folder at or above ``start`` that is a g4build project, as git finds its repository."""
    here = start.resolve()
    for folder in (here, *here.parents):
        if is_project(folder):
            return folder
    return None


def _unsafe_entry(path: Path) -> str | None:
    """Why ``path`` is not the current user's alone (another owner, or writable by group or others), or None."""
    try:
        info = path.lstat()
    except OSError as exc:
        return f"{path} cannot be checked ({exc.strerror or exc})"
    if info.st_uid != os.geteuid():
        return f"{path} is owned by uid {info.st_uid}, not by you (uid {os.geteuid()})"
    if stat.S_ISLNK(info.st_mode):
        return None  # a link's own mode means nothing; its target is checked
    if info.st_mode & stat.S_IWOTH:
        return f"{path} is writable by others"
    if info.st_mode & stat.S_IWGRP and not _private_group(info.st_gid):
        return f"{path} is writable by its group (gid {info.st_gid}), which has other members"
    return None


def _private_group(gid: int) -> bool:
    """True for the user's own group (user private groups: a umask of 002 makes files group-writable, but the
    group is the user alone): named as the user, with no other member, listed or by primary group."""
    try:
        import grp
        import pwd
    except ImportError:
        return False
    try:
        me = pwd.getpwuid(os.geteuid())
        group = grp.getgrgid(gid)
    except KeyError:
        return False
    primary = {u.pw_name for u in pwd.getpwall() if u.pw_gid == gid}
    return group_is_private(me.pw_name, group.gr_name, set(group.gr_mem) | primary)


def group_is_private(user: str, group: str, members: set[str]) -> bool:
    """A group only ``user`` is in: named as the user, every member (listed, or by primary group) the user."""
    return group == user and members <= {user}


def _tree(folder: Path) -> list[Path]:
    """``folder`` and everything under it, entering linked folders (each real folder once, so a link loop ends):
    what a link points to is read as if it were here, so it is checked as if it were here."""
    out, seen, todo = [folder], set(), [folder]
    while todo:
        here = todo.pop()
        real = here.resolve()
        if real in seen or not real.is_dir():
            continue
        seen.add(real)
        try:
            children = sorted(here.iterdir())
        except OSError:
            continue  # _unsafe_entry reports what cannot be read
        out += children
        todo += [c for c in children if c.is_dir()]
    return out


def ownership_problem(project: Path, start: Path) -> str | None:
    """Why a project found at or above ``start`` must not be trusted, or None (see the module docstring).

    Checked: each folder from ``start`` up to ``project``, the project's data folders, and every file and folder
    under ``patches/`` and ``recipes/`` (what becomes code), linked folders entered; a link counts as its target
    too. Where the system has no POSIX owners (Windows), a found project is never trusted: name it instead.
    """
    if not hasattr(os, "geteuid"):
        return "this system has no POSIX file owners to check it by"
    here, top = start.resolve(), project.resolve()
    walked = [here, *(p for p in here.parents if p.is_relative_to(top))]
    for folder in walked:
        if problem := _unsafe_entry(folder):
            return problem
    for name in DATA_FOLDERS:
        data = top / name
        if not data.exists():
            continue
        entries = _tree(data) if name != "ci" else [data, *data.iterdir()]
        for entry in entries:
            if problem := _unsafe_entry(entry):
                return problem
            if entry.is_symlink() and (problem := _unsafe_entry(entry.resolve())):
                return f"{entry} links to {entry.resolve()}, and {problem}"
    return None


def _checkout() -> Path:
    return Path(__file__).resolve().parents[2]  # toolkit/g4build/data.py -> repository root


def _installed_data() -> Path:
    return Path(__file__).resolve().parent / "_data"  # an installed wheel: g4build/_data/{patches,recipes,ci}


def project_choice() -> tuple[Path, str]:
    """The project this command reads and writes, and why that one (for doctor and notes)."""
    if _root_option is not None:
        return _root_option, "named with --root"
    env = os.environ.get("G4BUILD_HOME")
    if env:
        return Path(env), "named by G4BUILD_HOME"
    cwd = Path.cwd()
    found = find_project(cwd)
    checkout = _checkout()
    if found is not None and found == checkout:
        return found, "the g4build checkout the working directory is in (this g4build's own source)"
    if found is not None:
        if (found, cwd) not in _checked:
            _checked[found, cwd] = ownership_problem(found, cwd)
        problem = _checked[found, cwd]
        if problem is None:
            return found, "the project the working directory is in (owned by you, writable by no one else)"
        if found not in _passed_over:
            _passed_over.add(found)
            print(f"note: not using the g4build project at {found}: {problem}; pass `g4build --root {found}` "
                  "(or set G4BUILD_HOME) to use it anyway", file=sys.stderr)
    if is_project(checkout):
        return checkout, "the g4build checkout this g4build runs from"
    return _installed_data(), "the data the installed g4build package carries"


def passed_over() -> tuple[Path, str] | None:
    """The project found from the working directory that ``project_choice`` passed over, and why; else None."""
    cwd = Path.cwd()
    for (found, start), problem in _checked.items():
        if start == cwd and problem is not None:
            return found, problem
    return None


def project_root() -> Path:
    """Where the data is read: ``--root``; ``G4BUILD_HOME``; the project the working directory is in when it
    passes the ownership check; the source checkout this module lives in (an editable install); else the
    read-only data the installed wheel carries."""
    return project_choice()[0]


def writable_root() -> Path:
    """``project_root()`` for a command that writes project data; never the installed package's own copy.

    Raises UsageError (exit 2) when no project is found, or when ``--root`` / ``G4BUILD_HOME`` names that copy:
    an upgrade would wipe data written into site-packages.
    """
    root = project_root()
    installed = _installed_data()
    if root.resolve() != installed:
        return root
    markers = " and ".join(m.as_posix() for m in MARKERS)
    named = (f"--root {_root_option}" if _root_option is not None
             else f"G4BUILD_HOME={os.environ['G4BUILD_HOME']}" if os.environ.get("G4BUILD_HOME") else None)
    if named is not None:
        raise UsageError(
            f"{named} is the data the installed g4build package carries ({installed}): it is read-only here, "
            "since a reinstall or upgrade of g4build replaces it and would drop what this command writes",
            hint=f"point it at your g4build checkout, or at a copy of that data elsewhere (a folder holding {markers}"
                 f", e.g. `cp -r {installed} ~/g4build-data`), and run the command again",
        )
    found = ("none" if not _passed_over else
             f"only {', '.join(map(str, sorted(_passed_over)))}, which is not yours alone (see the note above)")
    raise UsageError(
        f"no g4build project to write into: expected a folder holding {markers} at or above {Path.cwd()}, found "
        f"{found} (the installed package's data is read-only)",
        hint="run this inside your g4build checkout, or pass `g4build --root DIR` / set G4BUILD_HOME",
    )


def patches_dir() -> Path:
    return project_root() / "patches"


def recipes_dir() -> Path:
    return project_root() / "recipes"


def ci_dir() -> Path:
    return project_root() / "ci"


def load_yaml_mapping(path: Path) -> dict[str, Any]:
    """Read a YAML data file whose top level must be a mapping (the safe loader: see ``g4build.util.yamlsafe``)."""
    return load_mapping(path)


def require(mapping: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """Fetch ``mapping[key]`` and check its type, naming file and key in the error."""
    if not isinstance(mapping, dict):
        raise ConfigError(f"{where}: expected a mapping, found {type(mapping).__name__}")
    if key not in mapping:
        raise ConfigError(f"{where}: missing key '{key}'")
    value = mapping[key]
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ConfigError(f"{where}.{key}: expected {names}, found {type(value).__name__} ({value!r})")
    return value
