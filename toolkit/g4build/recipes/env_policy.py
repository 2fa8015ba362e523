"""Which environment variables a recipe may set: the allow- and deny-lists of ``recipes/vllm-args/launch-env.yaml``
(data; why in its header). A name outside ``allow`` is refused unless the command line names it
(``--allow-env NAME``); a name in ``deny`` is refused always. The file is read at the edge (``load_env_policy``);
the rule that applies it is ``env_names.rule_env_allowed``."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from g4build.data import load_yaml_mapping, recipes_dir
from g4build.errors import ConfigError, UsageError
from g4build.recipes.model import ENV_NAME_RE

POLICY_FILE = Path("vllm-args") / "launch-env.yaml"
Verdict = Literal["allowed", "asked", "denied", "unknown"]
_KEYS = ("allow", "deny", "pins")
_LIST_KEYS = ("prefixes", "names", "suffixes", "contains")
_FRAGMENT_RE = re.compile(r"^[A-Za-z0-9_]+$")  # a suffix or an inner part of a name (`_PATH`, `INSECURE`)


@dataclass(frozen=True, kw_only=True)
class NameList:
    """Names held exactly, by prefix, by suffix or by a part anywhere; all upper case, compared with the name
    upper-cased (Windows environment names are case-insensitive: ``Path`` is ``PATH`` there)."""

    prefixes: tuple[str, ...] = ()
    names: frozenset[str] = frozenset()
    suffixes: tuple[str, ...] = ()
    contains: tuple[str, ...] = ()

    def holds(self, name: str) -> bool:
        upper = name.upper()
        return (upper in self.names or upper.startswith(self.prefixes) or upper.endswith(self.suffixes)
                or any(part in upper for part in self.contains))


@dataclass(frozen=True, kw_only=True)
class EnvPolicy:
    source: str
    allow: NameList
    deny: NameList
    pins: Mapping[str, NameList] = field(default_factory=dict)

    def verdict(self, name: str, pin: str | None, asked: frozenset[str]) -> Verdict:
        if self.deny.holds(name):
            return "denied"
        extra = self.pins.get(pin) if pin is not None else None
        if self.allow.holds(name) or (extra is not None and extra.holds(name)):
            return "allowed"
        return "asked" if name.upper() in asked else "unknown"


def _unknown_keys(raw: dict[Any, Any], known: tuple[str, ...], where: str) -> None:
    """A misspelled key is an error: a `deny:` spelled `deney:` would otherwise deny nothing."""
    unknown = sorted(str(k) for k in raw if k not in known)
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1, cutoff=0.7)
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (expected only {', '.join(known)})",
                          hint=f"did you mean {close[0]!r}?" if close else f"use only {', '.join(known)}")


def _names(raw: Any, where: str) -> NameList:
    if raw is None:
        return NameList()
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping with {', '.join(_LIST_KEYS)}, found {raw!r}")
    _unknown_keys(raw, _LIST_KEYS, where)
    lists = {}
    for key in _LIST_KEYS:
        items = raw.get(key) or []
        pattern = ENV_NAME_RE if key in ("prefixes", "names") else _FRAGMENT_RE
        if not isinstance(items, list) or not all(isinstance(i, str) and pattern.fullmatch(i) for i in items):
            raise ConfigError(f"{where}.{key}: expected a list of environment variable names (or parts of names: "
                              f"letters, digits, _), found {items!r}")
        lists[key] = [i.upper() for i in items]
    return NameList(prefixes=tuple(lists["prefixes"]), names=frozenset(lists["names"]),
                    suffixes=tuple(lists["suffixes"]), contains=tuple(lists["contains"]))


def load_env_policy(root: Path | None = None, known_pins: tuple[str, ...] | None = None) -> EnvPolicy:
    """The lists from the project's data file; a project without the file allows nothing (fails closed).
    ``known_pins``: the pins of patches/pins.yaml, when given a ``pins:`` entry for another name is an error (a
    misspelled pin would add its names to no pin)."""
    path = (root if root is not None else recipes_dir()) / POLICY_FILE
    if not path.exists():
        return EnvPolicy(source=f"{path} (absent: no name allowed)", allow=NameList(), deny=NameList())
    data = load_yaml_mapping(path)
    _unknown_keys(data, _KEYS, str(path))
    pins = data.get("pins") or {}
    if not isinstance(pins, dict):
        raise ConfigError(f"{path}.pins: expected a mapping of pin name to names, found {pins!r}")
    if known_pins is not None:
        _unknown_keys(pins, known_pins, f"{path}.pins")
    return EnvPolicy(source=str(path), allow=_names(data.get("allow"), f"{path}.allow"),
                     deny=_names(data.get("deny"), f"{path}.deny"),
                     pins={str(k): _names(v, f"{path}.pins.{k}") for k, v in pins.items()})


def asked_names(values: list[str] | None) -> frozenset[str]:
    """``--allow-env`` values, checked as variable names (upper-cased, as the lists compare)."""
    out = set()
    for value in values or ():
        if not ENV_NAME_RE.fullmatch(value):
            raise UsageError(f"--allow-env {value!r}: expected an environment variable name (letters, digits, _)",
                             hint="name one variable per --allow-env, e.g. --allow-env MY_VAR")
        out.add(value.upper())
    return frozenset(out)
