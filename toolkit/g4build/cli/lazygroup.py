"""The root command group, with each command's module imported only when that command is asked for.

Importing every command module (and through them GitPython, requests, the builder, the CI generator...) cost
about half a second at every start, most of `g4build overlay`'s wall time on the pinned wheel. The root group
knows its commands by name (``COMMANDS``, in the order help lists them) and imports a module when one of its
commands runs or is looked up: `g4build overlay ...` imports what the overlay needs and nothing else; help
(which lists every command with its summary) and shell completion import them all.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from typing import Any

import typer
from typer.core import TyperGroup

# command name -> the module of g4build.cli whose register(app) adds it, in the order help lists them: what a
# user runs first (the README's order), then the steps a build runs itself and the maintainers' commands
COMMANDS: dict[str, str] = {
    "doctor": "doctor",
    "overlay": "overlay",
    "recipe": "recipe",
    "wheel": "wheel",
    "validate": "validate",
    "pins": "pins",
    "index": "index",
    "source": "source",
    "patches": "patches",
    "deps": "deps",
    "prefetch": "wheel",
    "build-order": "wheel",
    "cuda-shim": "wheel",
    "flashinfer-wheels": "wheel",
    "flashinfer-aot": "flashinfer_aot",
    "manifest": "wheel",
    "build-check": "buildcheck",
    "ci": "ci",
    "image": "image",
}
USER_COMMANDS = ("doctor", "overlay", "recipe", "wheel", "validate", "pins", "index")
INTERNAL_PANEL = "Build steps and maintenance"  # help's second panel: the commands not in USER_COMMANDS


def flags_without_type(params: list[Any]) -> list[Any]:
    """``params`` with no type shown for on/off flags: typer's help writes ``<bool>`` beside them, which reads as
    if the flag took a value."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


def quiet_flags(command: Any) -> Any:
    """``command`` and its subcommands with ``flags_without_type`` applied to the parameters help lists."""
    original = command.get_params
    command.get_params = lambda ctx: flags_without_type(original(ctx))
    for sub in getattr(command, "commands", {}).values():
        quiet_flags(sub)
    return command


def module_commands(module: str) -> dict[str, Any]:
    """The click commands ``g4build.cli.<module>``'s ``register`` adds, by name (the module imported now)."""
    sub = typer.Typer()
    importlib.import_module(f"g4build.cli.{module}").register(sub)
    found = {name: quiet_flags(command) for name, command in typer.main.get_group(sub).commands.items()}
    for name, command in found.items():
        if name not in USER_COMMANDS:
            command.rich_help_panel = INTERNAL_PANEL
    return found


class LazyCommands(MutableMapping[str, Any]):
    """A group's commands by name: those of ``COMMANDS`` built from their module at the first lookup."""

    def __init__(self, eager: MutableMapping[str, Any] | None = None) -> None:
        self._built: dict[str, Any] = dict(eager or {})

    def __getitem__(self, name: str) -> Any:
        if name not in self._built and name in COMMANDS:
            for found, command in module_commands(COMMANDS[name]).items():
                self._built.setdefault(found, command)
        return self._built[name]

    def __setitem__(self, name: str, command: Any) -> None:
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        del self._built[name]

    def __iter__(self) -> Iterator[str]:
        yield from COMMANDS
        yield from (name for name in self._built if name not in COMMANDS)

    def __len__(self) -> int:
        return len(COMMANDS) + sum(1 for name in self._built if name not in COMMANDS)

    def __contains__(self, name: object) -> bool:
        return name in COMMANDS or name in self._built


class LazyGroup(TyperGroup):
    """typer's group, its commands a ``LazyCommands``."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.commands = LazyCommands(self.commands)

    def get_params(self, ctx: Any) -> list[Any]:
        return flags_without_type(super().get_params(ctx))
