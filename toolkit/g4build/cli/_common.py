"""Shared CLI helpers: consoles and JSON output."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from g4build.errors import DownloadError, UsageError

# Width used when stdout is not a terminal: lines are never cut or wrapped for a pipe or a file.
_PIPE_WIDTH = 10_000
_ESCAPES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class _Console(Console):
    """A rich console that prints plain, untruncated text when its stream is not a terminal (like pip and uv).

    Tables lose their boxes and wrapping there (one row per line, columns separated by spaces); colours
    already follow rich's own rules (off for a pipe, ``NO_COLOR``), and ``--plain`` or ``G4BUILD_PLAIN=1`` force
    this mode.
    """

    def _plain(self) -> bool:
        return not self.is_terminal or _forced_plain or bool(os.environ.get("G4BUILD_PLAIN"))

    def print(self, *objects: Any, **kwargs: Any) -> None:
        if not self._plain():
            super().print(*objects, **kwargs)
            return
        for obj in objects:
            if isinstance(obj, Table):
                obj.box = None
                obj.show_edge = False
                obj.pad_edge = False
                obj.title_justify = "left"
                for column in obj.columns:
                    column.no_wrap = True
                    column.overflow = "ignore"
        # print(width=...) is capped at the console's width (80 for a pipe), so widen the console itself; its
        # public setter cannot restore "follow the terminal" (None), hence the saved private value
        saved = self._width
        self._width = _PIPE_WIDTH
        try:
            with self.capture() as captured:
                super().print(*objects, **kwargs)
        finally:
            self._width = saved
        text = _ESCAPES.sub("", captured.get())  # plain means plain: no styles, whatever the terminal
        lines = [line.rstrip() for line in text.split("\n")]
        self.file.write("\n".join(lines))
        self.file.flush()


_forced_plain = False  # g4build --plain (set per command by the CLI's root callback)


def set_plain(value: bool) -> None:
    global _forced_plain
    _forced_plain = value


console = _Console()
err_console = _Console(stderr=True)

JSON_OPTION = typer.Option(False, "--json", help="Print machine-readable JSON on stdout.")


_json_printed = False


def print_json(data: Any) -> None:
    """Write JSON to stdout without rich markup or wrapping."""
    global _json_printed
    typer.echo(json.dumps(data, indent=2, sort_keys=False, default=str))
    _json_printed = True


def reset_json_printed() -> None:
    """A new command starts with no JSON document written (main() may run several in one process)."""
    global _json_printed
    _json_printed = False


def json_already_printed() -> bool:
    """Whether this command already wrote its JSON document (a failing check's report, say): an error after it
    must not add a second document to stdout."""
    return _json_printed


def lower_option(value: str | None) -> str | None:
    """Option callback: OS names and the like are matched case-insensitively (``--os Windows``)."""
    return value.lower() if isinstance(value, str) else value


def require_wheel_file(path: Path) -> Path:
    """A wheel named on the command line must be there: missing is exit 5 (docs: file missing), as for every
    command that reads a wheel, before anything is written; a folder is a usage error (exit 2). Anything else that
    exists is the reader's to judge (a socket or an unreadable file gets its own report from validate)."""
    if path.is_dir():
        raise UsageError(f"{path}: expected a wheel file, found a folder", hint="pass the .whl file itself")
    if path.exists():
        return path
    raise DownloadError(f"{path}: expected a wheel file, found nothing there",
                        hint="check the path (a wheel is a file ending in .whl)")
