"""Read an emitted PowerShell script through the real PowerShell grammar (tree-sitter): its top-level
statements in order, the guards (``if (...) { throw ... }``) with the message they throw, the commands with
their literal arguments, and the assignments. Tests judge the script by its syntax tree, not by substrings."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest


def parse(text: str) -> Any:
    ts = pytest.importorskip("tree_sitter")
    tsp = pytest.importorskip("tree_sitter_powershell")
    tree = ts.Parser(ts.Language(tsp.language())).parse(text.encode())
    assert not tree.root_node.has_error, "the script does not parse as PowerShell"
    return tree


def _walk(node: Any) -> Iterator[Any]:
    yield node
    for child in node.children:
        yield from _walk(child)


def _text(node: Any) -> str:
    return bytes(node.text).decode()


def string_value(node: Any) -> str | None:
    """The value of a single-quoted literal or of a ``'a' + 'b'`` chain of them; None for anything else."""
    literals = [n for n in _walk(node) if n.type == "string_literal"]
    others = [n for n in _walk(node) if n.type in ("variable", "expandable_string_literal", "command")]
    if not literals or others:
        return None
    parts = []
    for lit in literals:
        raw = _text(lit)
        if not (raw.startswith("'") and raw.endswith("'")):
            return None
        parts.append(raw[1:-1].replace("''", "'"))
    return "".join(parts)


@dataclass(frozen=True)
class Statement:
    index: int  # position among the script's top-level statements
    node: Any

    @property
    def text(self) -> str:
        return _text(self.node)


def statements(tree: Any) -> list[Statement]:
    body = next(c for c in tree.root_node.children if c.type == "statement_list")
    return [Statement(i, c) for i, c in enumerate(body.children) if c.is_named]


@dataclass(frozen=True)
class Guard:
    index: int
    condition: str
    message: str  # the thrown text (literal parts only; a variable part is shown as {$name})


def _message(node: Any) -> str:
    literal = string_value(node)
    if literal is not None:
        return literal
    out = []
    for n in _walk(node):
        if n.type == "string_literal":
            raw = _text(n)
            out.append(raw[1:-1].replace("''", "'") if raw.startswith("'") else raw[1:-1])
        elif n.type == "variable":
            out.append("{" + _text(n) + "}")
    return "".join(out)


def guards(tree: Any) -> list[Guard]:
    """Every ``if (cond) { ... throw X ... }`` of the script, outermost first, with the top-level index."""
    found = []
    for st in statements(tree):
        for node in _walk(st.node):
            if node.type != "if_statement":
                continue
            cond = next(c for c in node.children if c.type == "pipeline")
            block = next(c for c in node.children if c.type == "statement_block")
            for n in _walk(block):
                if n.type == "flow_control_statement" and _text(n).startswith("throw"):
                    found.append(Guard(st.index, _text(cond), _message(n.children[1])))
                    break
    return found


@dataclass(frozen=True)
class Command:
    index: int
    name: str
    args: tuple[str, ...]  # literal values; anything else as its source text


def commands(tree: Any) -> list[Command]:
    out = []
    for st in statements(tree):
        for node in _walk(st.node):
            if node.type != "command":
                continue
            name_node = next((c for c in node.children if c.type == "command_name_expr"), None)
            if name_node is None:
                name_node = next((c for c in node.children if c.type == "command_name"), None)
            if name_node is None:
                continue
            name = string_value(name_node) or _text(name_node).strip('"')  # "${env:X}\\tool.exe" as written
            elems = next((c for c in node.children if c.type == "command_elements"), None)
            args: list[str] = []
            for e in elems.children if elems is not None else []:
                if e.type == "command_argument_sep":
                    continue
                value = string_value(e)
                args.append(value if value is not None else _text(e))
            out.append(Command(st.index, name, tuple(args)))
    return out


@dataclass(frozen=True)
class Assignment:
    index: int
    target: str
    value: str
    literal: str | None  # the value of a single-quoted right side


def assignments(tree: Any) -> list[Assignment]:
    out = []
    for st in statements(tree):
        for node in _walk(st.node):
            if node.type == "assignment_expression":
                left = node.children[0]
                right = node.children[-1]
                out.append(Assignment(st.index, _text(left), _text(right), string_value(right)))
    return out
