"""Shared CLI helpers: consoles and JSON output."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.console import Console

console = Console()
err_console = Console(stderr=True)

JSON_OPTION = typer.Option(False, "--json", help="Print machine-readable JSON on stdout.")


def print_json(data: Any) -> None:
    """Write JSON to stdout without rich markup or wrapping."""
    typer.echo(json.dumps(data, indent=2, sort_keys=False, default=str))
