"""Editing hand-written series YAML without rewriting it: only the lines that change are replaced.

Series metadata is written by people (folded ``why`` text, quoting, comments). A refresh must change the version
and one pin's patch list and nothing else, so the diff a reviewer sees is exactly that. Each edit is checked by
loading the result and comparing it with the intended data; when the text is laid out in a way the line editor
does not understand, the file is dumped in full instead (still correct, only less tidy).
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from g4build.errors import ConfigError
from g4build.util.yamlsafe import Dumper, load_text

_BLANK_OR_COMMENT = re.compile(r"^\s*(#.*)?$")
_PLAIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")  # a patch path YAML reads back as the same string


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _content(line: str) -> bool:
    return not _BLANK_OR_COMMENT.match(line)


def _block_end(lines: list[str], start: int, parent_indent: int, *, list_at_parent: bool = False) -> int:
    """Index after the last content line that belongs under the key at ``start``."""
    end = start + 1
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if not _content(line):
            continue
        ind = _indent(line)
        if ind > parent_indent or (list_at_parent and ind == parent_indent and line.lstrip().startswith("- ")):
            end = i + 1
            continue
        break
    return end


def _find_key(lines: list[str], key: str, lo: int, hi: int, indent: int | None) -> int | None:
    """The line of mapping key ``key`` between ``lo`` and ``hi`` at exactly ``indent`` spaces."""
    pattern = re.compile(rf"^(\s*)(['\"]?){re.escape(key)}\2:(\s.*)?$")
    for i in range(lo, hi):
        m = pattern.match(lines[i].rstrip("\r\n"))
        if m and indent is not None and len(m.group(1)) == indent:
            return i
    return None


def _child_indent(lines: list[str], lo: int, hi: int) -> int | None:
    return next((_indent(ln) for ln in lines[lo:hi] if _content(ln)), None)


def _patch_lines(indent: str, patches: list[dict[str, str]]) -> list[str]:
    if not patches:
        return [f"{indent}patches: []\n"]
    out = [f"{indent}patches:\n"]
    for p in patches:
        file = p["file"] if _PLAIN.match(p["file"]) else json.dumps(p["file"])
        out.append(f"{indent}  - file: {file}\n")
        out.append(f"{indent}    subject: {json.dumps(p['subject'], ensure_ascii=False)}\n")
    return out


def _edit(text: str, pin: str, patches: list[dict[str, str]], version: int) -> str:
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    v = _find_key(lines, "version", 0, len(lines), 0)
    if v is None or _indent(lines[v]) != 0:
        raise ValueError("no top-level version")
    lines[v] = f"version: {version}\n"
    top = _find_key(lines, "pins", 0, len(lines), 0)
    if top is None or _indent(lines[top]) != 0 or lines[top].split(":", 1)[1].strip() not in ("", "{}"):
        raise ValueError("no block 'pins' mapping")
    pins_end = _block_end(lines, top, 0)
    key = _find_key(lines, pin, top + 1, pins_end, _child_indent(lines, top + 1, pins_end))
    if key is None:
        pad = " " * (_child_indent(lines, top + 1, pins_end) or 2)
        block = [f"{pad}{pin}:\n", *_patch_lines(pad + "  ", patches), f"{pad}  fingerprints: {{}}\n",
                 f'{pad}  note: ""\n']
        if lines[top].split(":", 1)[1].strip() == "{}":
            lines[top] = "pins:\n"
        return "".join(lines[:pins_end] + block + lines[pins_end:])
    pin_indent = _indent(lines[key])
    pin_end = _block_end(lines, key, pin_indent)
    sub = _find_key(lines, "patches", key + 1, pin_end, _child_indent(lines, key + 1, pin_end))
    if sub is None:
        raise ValueError("pin has no patches key")
    sub_indent = _indent(lines[sub])
    sub_end = _block_end(lines, sub, sub_indent, list_at_parent=True)
    return "".join(lines[:sub] + _patch_lines(" " * sub_indent, patches) + lines[sub_end:])


def set_pin_patches(text: str, pin: str, patches: list[dict[str, str]], version: int,
                    source: str = "series.yaml") -> str:
    """``text`` with ``version`` and ``pins[pin].patches`` replaced (the pin added when missing)."""
    data = load_text(text, source)
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, found {type(data).__name__}")
    pins = data.setdefault("pins", {}) or {}
    data["pins"] = pins
    variant = dict(pins.get(pin) or {})
    variant["patches"] = patches
    if pin not in pins:
        variant.update({"fingerprints": {}, "note": ""})
    pins[pin] = variant
    data["version"] = version
    try:
        edited = _edit(text, pin, patches, version)
        if load_text(edited, source) == data:
            return edited
    except (ValueError, ConfigError):
        pass
    return header(text) + dump(data)


def append_order(text: str, name: str, source: str = "series.yaml") -> str:
    """The top-level ``series.yaml`` with ``name`` appended to ``order``."""
    data = load_text(text, source) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, found {type(data).__name__}")
    data["order"] = [*(data.get("order") or []), name]
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    at = _find_key(lines, "order", 0, len(lines), 0)
    if at is not None and _indent(lines[at]) == 0:
        rest = lines[at].split(":", 1)[1].strip()
        if rest in ("[]", ""):
            end = _block_end(lines, at, 0, list_at_parent=True)
            items = [ln for ln in lines[at + 1:end] if _content(ln)]
            pad = " " * (_indent(items[0]) if items else 2)
            entry = dump([name])  # "- NAME", quoted where plain text would read as something else (yes, 1e5)
            new = ["order:\n", *lines[at + 1:end], f"{pad}{entry}"]
            edited = "".join(lines[:at] + new + lines[end:])
            try:
                if load_text(edited, source) == data:
                    return edited
            except ConfigError:
                pass
    return header(text) + dump(data)


def header(text: str) -> str:
    """The comment block at the top of a file."""
    out = ""
    for line in text.splitlines(keepends=True):
        if not line.startswith("#"):
            break
        out += line
    return out


def dump(data: dict[str, Any] | list[Any]) -> str:
    return yaml.dump(data, Dumper=Dumper, sort_keys=False, allow_unicode=True, width=110, default_flow_style=False)
