"""`g4build source fetch`: a verified vLLM source tree for a pin."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from g4build.cli._common import JSON_OPTION, console, err_console, lower_option, print_json
from g4build.cli.outpaths import output_folder
from g4build.pins.model import load_pins
from g4build.source.fetch import fetch_source

source_app = typer.Typer(help="Fetch and verify upstream vLLM source.", no_args_is_help=True)


@source_app.command("fetch")
def fetch(
    pin: str = typer.Option(None, "--pin", help="Pin name (default: the pins file's default)."),
    from_: str = typer.Option("sdist", "--from", help="sdist, git, or the path of an existing checkout."),
    dest: Path = typer.Option(None, "--dest", help="Where the work tree goes (default: the cache)."),
    remote: str = typer.Option(None, "--remote", help="With --from git: a mirror URL or path to clone from; "
                               "with --os: a mirror of the OS base's fork."),
    os_name: str = typer.Option(None, "--os", callback=lower_option,
                                help="The pin's base tree for this OS instead of upstream's "
                                "(windows: the Windows fork's changes forward-ported onto the pin)."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Download (or clone), verify and prepare the pin's source as a git work tree."""
    if dest is not None:
        output_folder(dest, "--dest")
    the_pin = load_pins().get(pin)
    with Progress(
        "[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        console=err_console, transient=True, disable=json_out,
    ) as progress:
        task = progress.add_task(f"{the_pin.sdist.file}", total=None)

        def hook(done: int, total: int | None) -> None:
            progress.update(task, completed=done, total=total)

        result = fetch_source(the_pin, from_, dest=dest, remote=remote, os_name=os_name, progress=hook)
    if json_out:
        print_json(result.to_dict())
        return
    state = "from cache" if result.cached else "fetched"
    console.print(f"[green]✓[/] {result.pin} ({result.source}, {state}) verified {result.verified}")
    console.print(f"  work tree: {result.path}", highlight=False)
    port = result.port
    if port:
        console.print(f"  {port['os']} base: fork {port['commit'][:12]} over {port['onto'][:12]} forward-ported: "
                      f"{len(port['taken'])} taken, {len(port['merged'])} merged, {len(port['added'])} added, "
                      f"{len(port['deleted'])} deleted, {len(port['already'])} already there, "
                      f"{len(port['kept_pin'])} kept at the pin ({len(port['fixups'])} fixup patch(es))",
                      highlight=False)
        for warning in port["warnings"]:
            err_console.print(f"[yellow]warning:[/] {escape(warning)}")


def register(app: typer.Typer) -> None:
    """Add `g4build source` to the root app."""
    app.add_typer(source_app, name="source")
