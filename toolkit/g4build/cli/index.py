"""`g4build index` commands: the package index users install nightly wheels from."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from g4build.cli._common import JSON_OPTION, console, print_json
from g4build.index.pages import SiteOptions
from g4build.index.site import IndexResult, build_index

index_app = typer.Typer(help="A PEP 503 package index (hashes, PEP 658 metadata) built from a folder of wheels.",
                        no_args_is_help=True)


def _show(result: IndexResult) -> None:
    table = Table(title=f"index written to {escape(str(result.site))}", title_justify="left")
    for column in ("wheel", "pin", "torch", "CUDA", "sha256"):
        table.add_column(column)
    for e in result.entries:
        b = e.build
        table.add_row(escape(e.filename), escape(b.pin if b else "-"), escape(b.torch if b else "-"),
                      escape(b.cuda if b else "-"), e.sha256)
    console.print(table)


@index_app.command("build")
def build(
    wheels: Path = typer.Argument(..., file_okay=False, help="The folder of wheels to serve."),
    out: Path = typer.Option(..., "--out", help="The site's folder (replaced whole; only a site index build "
                             "wrote, listing every file there, or an empty folder may be there)."),
    base_url: str | None = typer.Option(None, "--base-url", help="Where the site will be served (for the "
                                        "install commands its pages show)."),
    repo: str | None = typer.Option(None, "--repo", help="OWNER/NAME of the repository whose workflow attests "
                                    "the wheels (for the verify commands its pages show)."),
    files_url: str | None = typer.Option(None, "--files-url", help="Link the wheels and their .metadata files "
                                         "at this URL (e.g. a release's download URL) instead of the site's "
                                         "files/; upload SITE/files/* there."),
    torch_index: str | None = typer.Option(None, "--torch-index", help="The torch index (CUDA builds) the pages "
                                           "name beside ours; {cu} stands for the wheel's CUDA line (cu130, ...). "
                                           "Default: a placeholder naming PyTorch's index for that line."),
    pin: str | None = typer.Option(None, "--pin", help="Validate the wheels as made for this pin."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Validate every wheel in WHEELS and write a package index site: PEP 503 pages and PEP 691 JSON with
    sha256 fragments, each wheel's METADATA (PEP 658), and a page per wheel (pin, series, torch, CUDA)."""
    options = SiteOptions(base_url=base_url, repo=repo, files_url=files_url, torch_index=torch_index)
    with console.status("building the index", spinner="dots") if not as_json else nullcontext() as status:

        def say(text: str) -> None:
            if status is not None:
                status.update(escape(text))

        result = build_index(wheels, out, options, pin=pin, say=say)
    if as_json:
        print_json(result.to_dict())
    else:
        _show(result)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""
    app.add_typer(index_app, name="index")
