"""Where g4build's data lives (patches/, recipes/, ci/) and small YAML helpers.

The data folders sit at the repository's top level. A command finds them through ``--root``, ``G4BUILD_HOME``,
the project the working directory is in, or, for an editable/source install, relative to this file; commands
that write data refuse the copy an installed wheel carries (``writable_root``).
"""

from __future__ import annotations

import os
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


def is_project(folder: Path) -> bool:
    return all((folder / marker).is_file() for marker in MARKERS)


def find_project(start: Path) -> Path | None:
    """The nearest folder at or above ``start`` that is a g4build project, as git finds its repository."""
    here = start.resolve()
    for folder in (here, *here.parents):
        if is_project(folder):
            return folder
    return None


def _installed_data() -> Path:
    return Path(__file__).resolve().parent / "_data"  # an installed wheel: g4build/_data/{patches,recipes,ci}


def project_root() -> Path:
    """Where the data is read: ``--root``; ``G4BUILD_HOME``; the project the working directory is in; the source
    checkout this module lives in (an editable install); else the read-only data the installed wheel carries."""
    if _root_option is not None:
        return _root_option
    env = os.environ.get("G4BUILD_HOME")
    if env:
        return Path(env)
    found = find_project(Path.cwd())
    if found is not None:
        return found
    checkout = Path(__file__).resolve().parents[2]  # toolkit/g4build/data.py -> repository root
    if is_project(checkout):
        return checkout
    return _installed_data()


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
    raise UsageError(
        f"no g4build project to write into: expected a folder holding {markers} at or above {Path.cwd()}, found "
        "none (the installed package's data is read-only)",
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
