"""Which environment variables a recipe may set: the allow- and deny-lists of ``recipes/vllm-args/launch-env.yaml``
(data; why in its header). A name outside ``allow`` is refused unless the command line names it
(``--allow-env NAME``); a name in ``deny`` is refused always. The file is read at the edge (``load_env_policy``);
the rule that applies it is ``env_names.rule_env_allowed``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from g4build.data import load_yaml_mapping, recipes_dir
from g4build.errors import ConfigError, UsageError
from g4build.recipes.model import ENV_NAME_RE

POLICY_FILE = Path("vllm-args") / "launch-env.yaml"
Verdict = Literal["allowed", "asked", "denied", "unknown"]


@dataclass(frozen=True, kw_only=True)
class NameList:
    prefixes: tuple[str, ...] = ()
    names: frozenset[str] = frozenset()

    def holds(self, name: str) -> bool:
        upper = name.upper()
        return upper in self.names or upper.startswith(self.prefixes)


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


def _names(raw: Any, where: str) -> NameList:
    if raw is None:
        return NameList()
    if not isinstance(raw, dict) or set(raw) - {"prefixes", "names"}:
        raise ConfigError(f"{where}: expected a mapping with 'prefixes' and 'names', found {raw!r}")
    lists = {}
    for key in ("prefixes", "names"):
        items = raw.get(key) or []
        if not isinstance(items, list) or not all(isinstance(i, str) and ENV_NAME_RE.fullmatch(i) for i in items):
            raise ConfigError(f"{where}.{key}: expected a list of environment variable names, found {items!r}")
        lists[key] = [i.upper() for i in items]
    return NameList(prefixes=tuple(lists["prefixes"]), names=frozenset(lists["names"]))


def load_env_policy(root: Path | None = None) -> EnvPolicy:
    """The lists from the project's data file; a project without the file allows nothing (fails closed)."""
    path = (root if root is not None else recipes_dir()) / POLICY_FILE
    if not path.exists():
        return EnvPolicy(source=f"{path} (absent: no name allowed)", allow=NameList(), deny=NameList())
    data = load_yaml_mapping(path)
    pins = data.get("pins") or {}
    if not isinstance(pins, dict):
        raise ConfigError(f"{path}.pins: expected a mapping of pin name to names, found {pins!r}")
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
