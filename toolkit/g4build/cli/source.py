"""`g4build source fetch`: a verified vLLM source tree for a pin."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from g4build.cli._common import JSON_OPTION, console, err_console, print_json
from g4build.pins import load_pins
from g4build.source import fetch_source

source_app = typer.Typer(help="Fetch and verify upstream vLLM source.", no_args_is_help=True)


@source_app.command("fetch")
def fetch(
    pin: str = typer.Option(None, "--pin", help="Pin name (default: the pins file's default)."),
    from_: str = typer.Option("sdist", "--from", help="sdist, git, or the path of an existing checkout."),
    dest: Path = typer.Option(None, "--dest", help="Where the work tree goes (default: the cache)."),
    remote: str = typer.Option(None, "--remote", help="With --from git: a mirror URL or path to clone from."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Download (or clone), verify and prepare the pin's source as a git work tree."""
    the_pin = load_pins().get(pin)
    with Progress(
        "[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        console=err_console, transient=True, disable=json_out,
    ) as progress:
        task = progress.add_task(f"{the_pin.sdist.file}", total=None)

        def hook(done: int, total: int | None) -> None:
            progress.update(task, completed=done, total=total)

        result = fetch_source(the_pin, from_, dest=dest, remote=remote, progress=hook)
    if json_out:
        print_json(result.to_dict())
        return
    state = "from cache" if result.cached else "fetched"
    console.print(f"[green]✓[/] {result.pin} ({result.source}, {state}) verified {result.verified}")
    console.print(f"  work tree: {result.path}", highlight=False)


def register(app: typer.Typer) -> None:
    app.add_typer(source_app, name="source")
