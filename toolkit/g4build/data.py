"""Where g4build's data lives (patches/, recipes/, ci/) and small YAML helpers.

The data folders sit at the repository's top level. An installed copy finds them through
``G4BUILD_HOME`` or, for an editable/source install, relative to this file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from g4build.errors import ConfigError
from g4build.yamlsafe import load_mapping


def project_root() -> Path:
    """``G4BUILD_HOME``; else the source checkout this module lives in; else the data the wheel carries."""
    env = os.environ.get("G4BUILD_HOME")
    if env:
        return Path(env)
    checkout = Path(__file__).resolve().parents[2]  # toolkit/g4build/data.py -> repository root
    if (checkout / "patches" / "pins.yaml").is_file():
        return checkout
    return Path(__file__).resolve().parent / "_data"  # an installed wheel: g4build/_data/{patches,recipes,ci}


def patches_dir() -> Path:
    return project_root() / "patches"


def recipes_dir() -> Path:
    return project_root() / "recipes"


def ci_dir() -> Path:
    return project_root() / "ci"


def load_yaml_mapping(path: Path) -> dict[str, Any]:
    """Read a YAML data file whose top level must be a mapping (the safe loader: see ``g4build.yamlsafe``)."""
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
