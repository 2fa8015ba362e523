"""The docs' one-line-per-command list (toolkit/docs/commands.md, once README's), generated from the CLI's own
command tree (names, arguments, options and the first line of each command's help), so it cannot drift:
tests/unit/cli/test_readme_commands.py compares the two, and ``G4BUILD_UPDATE_GOLDEN=1`` rewrites the page's block
between the markers."""

from __future__ import annotations

from typing import Any

import typer

from g4build.cli import app

START = "<!-- command reference: generated from the CLI, see tests/support/cli_reference.py -->"
END = "<!-- end of command reference -->"


def _param(p: Any) -> str | None:
    if getattr(p, "hidden", False) or p.name in ("help",):
        return None
    if p.param_type_name == "argument":
        word = (p.metavar or p.name).upper().strip("[]")
        word += "..." if p.nargs == -1 else ""
        return word if p.required else f"[{word}]"
    name = max(p.opts, key=len)
    if p.is_flag:
        word = f"{name}/{max(p.secondary_opts, key=len)}" if p.secondary_opts else name
    else:
        word = f"{name} {p.metavar or name.lstrip('-').upper().replace('-', '_')}"
        word += " ..." if p.multiple else ""
    return word if p.required else f"[{word}]"


def _lines(node: Any, path: list[str]) -> list[str]:
    commands = getattr(node, "commands", None)
    if commands:
        out: list[str] = []
        for name in sorted(commands):
            if not getattr(commands[name], "hidden", False):
                out += _lines(commands[name], [*path, name])
        return out
    usage = " ".join(filter(None, ("g4build", *path, *(_param(p) for p in node.params))))
    summary = " ".join((node.help or "").strip().split("\n\n", 1)[0].split())
    return [f"- `{usage}`: {summary}" if summary else f"- `{usage}`"]


def reference() -> str:
    """The block commands.md carries between START and END."""
    root = typer.main.get_command(app)
    options = " ".join(filter(None, (_param(p) for p in root.params)))
    head = f"- `g4build {options} COMMAND ...`: options for every command (each command also takes `-h`/`--help`)."
    return "\n".join([START, "", head, *_lines(root, []), "", END])
