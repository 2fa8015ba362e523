"""The ``g4build`` command line: a thin typer layer over the pipeline stages.

Each command group lives in its own module exposing ``register(app)``; this file only
assembles them and turns ``G4BuildError`` into a message and its exit code.
"""

from __future__ import annotations

import sys

import typer
from rich.markup import escape

from g4build import __version__
from g4build.cli import (
    ci,
    doctor,
    image,
    overlay,
    patches,
    pins,
    recipe,
    source,
    validate,
    wheel,
)
from g4build.cli._common import err_console
from g4build.errors import G4BuildError

app = typer.Typer(
    name="g4build",
    help="Build, patch and validate vLLM wheels for Gemma 4 + DFlash on SM120 (Windows, WSL, Linux).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

for _module in (pins, source, patches, wheel, validate, overlay, recipe, ci, image, doctor):
    _module.register(app)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"g4build {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """g4build: pin → source → patches → build → validate → emit."""


def main(argv: list[str] | None = None) -> None:
    try:
        # With standalone_mode=False click hands back typer.Exit's code instead of raising it.
        result = app(args=argv, standalone_mode=False)
        if isinstance(result, int) and result:
            sys.exit(result)
    except G4BuildError as exc:
        # messages quote user values (paths, names with brackets): never read them as rich markup
        err_console.print(f"[bold red]error:[/] {escape(exc.message)}", highlight=False)
        if exc.hint:
            err_console.print(f"[yellow]hint:[/] {escape(exc.hint)}", highlight=False)
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except Exception as exc:  # click's usage errors
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        raise
