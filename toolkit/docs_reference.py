"""Write the docs site's command reference (toolkit/docs/reference.md) from the CLI's own command tree, so the
page cannot drift from the commands: every command, its usage line, its help, and each argument and option with
its help and default, in the order the CLI lists them.

    python toolkit/docs_reference.py            # rewrite toolkit/docs/reference.md
    python toolkit/docs_reference.py --check    # exit 1 (writing nothing) when the page is not the CLI's

tests/unit/docs/test_docs_site.py runs the check. Not part of the installed package: it documents it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import typer

from g4build.cli import app
from g4build.fsutil import write_atomic

PAGE = Path(__file__).resolve().parent / "docs" / "reference.md"
HEAD = """# Command reference

<!-- Generated from the CLI by toolkit/docs_reference.py: edit the commands' help, then run
     `python toolkit/docs_reference.py`; do not edit this page by hand. -->

Every command of `g4build`, as the command line itself describes it (`g4build COMMAND --help` prints the same).
Each command also takes `-h`/`--help`; the options before the command apply to all of them.
"""


def _text(text: str) -> str:
    """Help text as Markdown: one paragraph per blank-line block; outside code spans, ``<`` ``>`` ``|`` and ``*``
    are escaped so that ``<dir>`` or a ``|`` stay text (inside a span Markdown keeps them as they are)."""
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text.strip()) if p.strip()]
    out = []
    for para in paragraphs:
        parts = para.split("`")
        if len(parts) % 2 == 0:  # an unbalanced backtick: no code spans, all of it text
            parts = [para]
        for i in range(0, len(parts), 2):  # the even parts are outside code spans
            parts[i] = (parts[i].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
                        .replace("|", "\\|").replace("*", "\\*").replace("_", "\\_"))
        out.append("`".join(parts))
    return "\n\n".join(out)


def _cell(text: str) -> str:
    """A table cell: one line, and a ``|`` inside a code span escaped too (GitHub and Python-Markdown split on it)."""
    return _text(text).replace("\n\n", " ").replace("`|`", "`\\|`")


def _word(p: Any) -> str:
    """The parameter as it is typed: ``ARG``, ``--name VALUE``, ``--flag/--no-flag``."""
    if p.param_type_name == "argument":
        return str(p.metavar or p.name).upper().strip("[]") + ("..." if p.nargs == -1 else "")
    names = ", ".join(sorted(p.opts, key=len, reverse=True))
    if p.is_flag:
        return names + ("/" + ", ".join(p.secondary_opts) if p.secondary_opts else "")
    value = p.metavar or max(p.opts, key=len).lstrip("-").upper().replace("-", "_")
    return f"{names} {value}"


def _default(p: Any) -> str:
    if p.required:
        return "required"
    d = p.default
    if p.param_type_name == "option" and p.is_flag:
        if p.secondary_opts:
            name = max((p.opts if d else p.secondary_opts), key=len)
            return f"`{name}`"
        return ""
    if d is None or d == () or d == [] or d == "":
        return ""
    return f"`{d}`"


def _usage(p_list: list[Any], path: list[str]) -> str:
    words = ["g4build", *path]
    for p in p_list:
        if getattr(p, "hidden", False) or p.name == "help":
            continue
        if p.param_type_name == "argument":
            word = _word(p)
        else:
            word = max(p.opts, key=len)
            if not p.is_flag:
                word += " " + _word(p).rsplit(" ", 1)[1]
            word += " ..." if getattr(p, "multiple", False) else ""
        words.append(word if p.required else f"[{word}]")
    return " ".join(words)


def _params(params: list[Any]) -> list[str]:
    rows = [p for p in params if not getattr(p, "hidden", False) and p.name != "help"]
    if not rows:
        return []
    lines = ["| Argument or option | What it does | Default |", "|---|---|---|"]
    for p in rows:
        help_text = getattr(p, "help", None) or ""
        lines.append(f"| `{_word(p)}` | {_cell(help_text)} | {_default(p)} |")
    return [*lines, ""]


def _command(node: Any, path: list[str], depth: int) -> list[str]:
    lines = [f"{'#' * depth} g4build {' '.join(path)}", ""]
    if node.help:
        lines += [_text(node.help), ""]
    commands = getattr(node, "commands", None)
    if commands:
        visible = [name for name in commands if not getattr(commands[name], "hidden", False)]
        lines += [f"Sub-commands: {', '.join(f'`{name}`' for name in visible)}.", ""]
        for name in visible:
            lines += _command(commands[name], [*path, name], min(depth + 1, 4))
        return lines
    lines += ["```text", _usage(node.params, path), "```", ""]
    lines += _params(node.params)
    if node.epilog:
        lines += [_text(node.epilog), ""]
    return lines


def reference() -> str:
    """The whole page, as the CLI describes itself now."""
    root = typer.main.get_command(app)
    lines = [HEAD, "## Options for every command", "", "```text",
             "g4build [OPTIONS] COMMAND [ARGS]...", "```", "", *_params(root.params)]
    for name, node in getattr(root, "commands", {}).items():  # the order `g4build --help` lists them in
        if not getattr(node, "hidden", False):
            lines += _command(node, [name], 2)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str]) -> int:
    fresh = reference()
    if argv == ["--check"]:
        current = PAGE.read_text(encoding="utf-8") if PAGE.is_file() else ""
        if current != fresh:
            print(f"{PAGE.name} is not what the CLI says: run `python toolkit/docs_reference.py`", file=sys.stderr)
            return 1
        return 0
    if argv:
        print("usage: python toolkit/docs_reference.py [--check]", file=sys.stderr)
        return 2
    write_atomic(PAGE, fresh.encode("utf-8"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
