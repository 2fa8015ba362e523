"""Every command the CLI's own messages tell a user to run (hints, findings, verdicts: a `g4build ...` in
backticks, or after "Build for it:", in the package's string literals other than docstrings) parses with the real
command tree: the command exists, its options exist, its required options and arguments are there. An f-string's
values stand as one word each (a file, a pin), as they do when printed."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
import typer
from tests.unit.cli.test_readme_commands import problems

from g4build.cli import app

REPO = Path(__file__).resolve().parents[3]
PACKAGE = REPO / "toolkit" / "g4build"
_SHOWN = re.compile(r"`(g4build [^`]+)`|Build for it: (g4build [^.;\n]+)")


def _text(node: ast.AST) -> str | None:
    """A string literal's text; an f-string's values as the word VALUE."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(str(v.value) if isinstance(v, ast.Constant) else "VALUE" for v in node.values)
    return None


def hinted_commands() -> dict[str, str]:
    """command -> where it is (file:line), for every g4build command a message of the package shows."""
    found: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        pieces = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
        # docstrings speak of options to the reader of the code, not commands to a user
        pieces |= {id(n.body[0].value) for n in ast.walk(tree)
                   if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
                   and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if id(node) in pieces:
                continue  # a piece of an f-string: read with it
            text = _text(node)
            if text is None or "g4build " not in text:
                continue
            for match in _SHOWN.finditer(text):
                command = " ".join((match.group(1) or match.group(2)).split())
                for part in re.split(r"&&|;|\|(?![^\[]*\])", command):
                    if part.strip().startswith("g4build "):
                        found.setdefault(part.strip(), f"{path.relative_to(REPO)}:{getattr(node, 'lineno', 0)}")
    return found


@pytest.fixture(scope="module")
def root() -> Any:
    return typer.main.get_command(app)


def test_every_hinted_command_parses(root: Any) -> None:
    commands = hinted_commands()
    assert len(commands) > 40  # the hints of every route
    # the ones the first hour hit, now whole: validate's verdict and render's arch warning name --os
    assert "g4build wheel --arch VALUE --os VALUE" in commands
    bad = {f"{where}: {c}": p for c, where in commands.items() if (p := problems(c, root))}
    assert bad == {}


def test_the_extraction_finds_a_broken_hint(tmp_path: Path, root: Any) -> None:
    # the check itself: a hint with an option the command lacks, or a required one left out, is caught
    assert problems("g4build wheel --arch VALUE", root) == ["required option --os missing"]
    assert problems("g4build validate VALUE --arch VALUE --osx", root) == ["no option --osx"]
    source = 'hint = f"run `g4build wheel --arch {arch}` again"\n'
    node = ast.parse(source).body[0]
    assert isinstance(node, ast.Assign) and _text(node.value) == "run `g4build wheel --arch VALUE` again"
