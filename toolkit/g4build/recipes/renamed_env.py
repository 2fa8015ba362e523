"""0.21.0's kernel-choice environment variables in the spelling of a pin that no longer reads them: the data file
``recipes/vllm-args/renamed-env.yaml`` says, per variable, which ``vllm serve`` option took its place and which
option value means the same as each variable value. Pure lookups once loaded; the file is read at the edge."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from g4build.data import load_yaml_mapping, recipes_dir
from g4build.errors import ConfigError

RENAMED_FILE = Path("vllm-args") / "renamed-env.yaml"


@dataclass(frozen=True, kw_only=True)
class Renamed:
    env: str
    option: str | None  # None: every listed value is the pin's default, nothing is written
    values: Mapping[str, str | None]  # the variable's value -> the option's value (None: write nothing)
    why: str


@dataclass(frozen=True, kw_only=True)
class Respelled:
    """One variable as a pin spells it: ``option`` set to ``value``, or nothing when ``value`` is None."""

    env: str
    was: str
    option: str | None
    value: str | None
    why: str


def _row(name: str, raw: Any, where: str) -> Renamed:
    if not isinstance(raw, dict) or not isinstance(raw.get("values"), dict):
        raise ConfigError(f"{where}.{name}: expected a mapping with 'values' (and 'option', 'why')")
    option = raw.get("option")
    values = {str(k): (None if v is None else str(v)) for k, v in raw["values"].items()}
    if option is not None and not isinstance(option, str):
        raise ConfigError(f"{where}.{name}.option: expected an option name, found {option!r}")
    if option is None and any(v is not None for v in values.values()):
        raise ConfigError(f"{where}.{name}: values name option values but no 'option' says which option")
    return Renamed(env=name, option=option, values=values, why=str(raw.get("why") or "").strip())


def load_renamed(root: Path | None = None) -> dict[str, Renamed]:
    """The rows of ``renamed-env.yaml`` by variable name (none when the file is absent)."""
    path = (root if root is not None else recipes_dir()) / RENAMED_FILE
    if not path.is_file():
        return {}
    data = load_yaml_mapping(path)
    return {str(name): _row(str(name), raw, str(path)) for name, raw in data.items()}


def respell(name: str, value: str, renamed: Mapping[str, Renamed], options: frozenset[str] | None) -> (
        Respelled | None):
    """``name=value`` in the spelling of a pin with serve ``options``; None when the file has no row for it, the
    value has no same-meaning spelling, or the pin lacks the option (None: its argument table is not here)."""
    row = renamed.get(name)
    key = value.strip().lower()
    if row is None or key not in row.values:
        return None
    mapped = row.values[key]
    if mapped is not None and (options is None or row.option not in options):
        return None
    return Respelled(env=name, was=value, option=row.option if mapped is not None else None, value=mapped,
                     why=row.why)


def respelling_hint(name: str, renamed: Mapping[str, Renamed], options: frozenset[str] | None) -> str:
    """What to write instead of ``name`` on a pin that does not read it (empty when the file says nothing)."""
    row = renamed.get(name)
    if row is None or row.option is None or options is None or row.option not in options:
        return ""
    listed = ", ".join(f"{k} -> {v}" for k, v in row.values.items() if v is not None)
    return f"this pin spells it --set args.{row.option}=VALUE ({listed}); "
