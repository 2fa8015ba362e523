"""``--set KEY=VALUE``: change any recipe field before it is checked and rendered.

Keys are dotted paths into the recipe (``model``, ``env.VLLM_X``, ``args.max-model-len``,
``speculative.num_speculative_tokens``, ``hardware.vram_gb``). Values are typed like a YAML scalar, but
predictably: ``true``/``false``, ``null``/``~``, integers and decimals become those types; a value starting with
``'``, ``"``, ``[`` or ``{`` is read as YAML (a quoted string, a list, a mapping); anything else stays the exact
text given (``#``, ``:``, quotes and spaces inside are kept). ``env.*`` values are always text.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from g4build.errors import ConfigError, UsageError
from g4build.recipes.model import (
    CHECKPOINT_KEYS,
    ENV_NAME_RE,
    FOOTPRINT_KEYS,
    HARDWARE_KEYS,
    KV_KEYS,
    OPTION_RE,
    TOP_LEVEL_KEYS,
)
from g4build.util.safeload import MAX_NUMBER_CHARS
from g4build.util.yamlsafe import load_text, text_problem

_INT = re.compile(r"^[-+]?[0-9]+$")
_FLOAT = re.compile(r"^[-+]?([0-9]+\.[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$|^[-+]?[0-9]+[eE][-+]?[0-9]+$")
# Sub-keys each mapping field accepts: a tuple is a closed set, a pattern an open one.
_NESTED: dict[str, tuple[str, ...] | re.Pattern[str] | None] = {
    "env": ENV_NAME_RE,
    "args": OPTION_RE,
    "speculative": None,  # any key: it is vLLM's own JSON config
    "checkpoint": CHECKPOINT_KEYS,
    "hardware": HARDWARE_KEYS,
    "footprint": FOOTPRINT_KEYS,
}


@dataclass(frozen=True, kw_only=True)
class Override:
    path: tuple[str, ...]
    value: Any
    text: str  # as given, for messages

    @property
    def key(self) -> str:
        return ".".join(self.path)


def typed_value(text: str, *, raw: bool = False) -> Any:
    """Type ``text`` as described in the module docstring (``raw``: always a string unless quoted)."""
    if text[:1] in ("'", '"') or (not raw and text[:1] in ("[", "{")):
        try:
            return load_text(text, "--set value")  # the safe loader: no aliases, no duplicate keys
        except ConfigError as exc:
            problem = exc.message.splitlines()[0]
            raise UsageError(
                f"--set value {text!r} is not valid YAML ({problem})",
                hint="a value starting with a quote, [ or { is read as YAML (no anchors, aliases or repeated "
                     "keys); check its quotes and brackets",
            ) from exc
    if raw:
        return text
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("null", "~"):
        return None
    if (_INT.fullmatch(text) or _FLOAT.fullmatch(text)) and len(text) > MAX_NUMBER_CHARS:
        raise UsageError(f"--set value {text[:20]}... is a number of {len(text)} characters, more than the "
                         f"{MAX_NUMBER_CHARS} a recipe's number may have",
                         hint="give the value a recipe needs (e.g. args.max-model-len=65536); quote it "
                              "(--set \"KEY='...'\") if it is text")
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    return text


def _check_path(path: tuple[str, ...], given: str) -> None:
    head = path[0]
    if head not in TOP_LEVEL_KEYS:
        raise UsageError(
            f"--set {given}: unknown recipe field '{head}'",
            hint=f"fields: {', '.join(TOP_LEVEL_KEYS)}; nested ones with dots, e.g. args.max-model-len",
        )
    if len(path) == 1:
        return
    if head not in _NESTED and head != "footprint":
        raise UsageError(f"--set {given}: '{head}' has no sub-keys; write --set {head}=VALUE")
    rule = _NESTED[head]
    sub = path[1]
    if head == "footprint" and sub == "kv" and len(path) > 2:
        if len(path) != 3 or path[2] not in KV_KEYS:
            raise UsageError(f"--set {given}: unknown key; footprint.kv takes {', '.join(KV_KEYS)}")
        return
    if isinstance(rule, tuple) and sub not in rule:
        raise UsageError(f"--set {given}: unknown key '{sub}' under '{head}': expected one of {', '.join(rule)}")
    if isinstance(rule, re.Pattern) and not rule.fullmatch(sub):
        what = "an environment variable name" if head == "env" else "an option name in kebab case, no leading dashes"
        raise UsageError(f"--set {given!r}: {sub!r} is not {what}")
    if head != "speculative" and len(path) > 2:
        raise UsageError(f"--set {given}: '{head}.{sub}' has no sub-keys")


def parse_override(item: str) -> Override:
    key, sep, text = item.partition("=")
    if not sep or not key:
        raise UsageError(f"--set {item!r}: expected KEY=VALUE, e.g. --set args.max-model-len=65536")
    for what, text_part in (("key", key), ("value", text)):
        # A shell passes undecodable bytes as lone surrogates; NUL and control characters break the script.
        problem = text_problem(text_part)
        if problem:
            raise UsageError(f"--set {key!r}: the {what} holds {problem}",
                             hint="give plain Unicode text without control characters")
    path = tuple(key.split("."))
    if any(not part for part in path):
        raise UsageError(f"--set {item!r}: empty part in the dotted key '{key}'")
    _check_path(path, key)
    return Override(path=path, value=typed_value(text, raw=path[0] == "env"), text=text)


def apply_overrides(data: dict[str, Any], items: Sequence[str]) -> dict[str, Any]:
    """A copy of the raw recipe mapping with each ``KEY=VALUE`` applied in order."""
    result = copy.deepcopy(data)
    for item in items:
        override = parse_override(item)
        node = result
        for part in override.path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise UsageError(f"--set {override.key}: '{part}' holds {child!r}, not a mapping")
            node = child
        node[override.path[-1]] = override.value
    return result
