"""`g4build image` commands."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from g4build.cli._common import JSON_OPTION, console, err_console, print_json
from g4build.cli.outpaths import output_folder
from g4build.data import writable_root
from g4build.image import extract_series
from g4build.pins.model import load_pins
from g4build.source.fetch import fetch_source

image_app = typer.Typer(help="Turn a prepatched image's vLLM Python files into a series.", no_args_is_help=True)


@image_app.command("extract")
def extract(
    image: str = typer.Argument(..., help="Image reference (Docker engine), `docker save` tarball, or OCI layout."),
    pin: str = typer.Option(..., "--pin", help="The pin the image's vLLM corresponds to, e.g. vllm-0.21.0."),
    out: Path | None = typer.Option(None, "--out", help="Series folder to create (default: patches/<series>)."),
    series: str | None = typer.Option(None, "--series", help="Series name (default: image-<name>-<tag>)."),
    platform: str | None = typer.Option(None, "--platform", help="os/arch to take from a multi-platform image."),
    package_dir: str | None = typer.Option(
        None, "--package-dir", help="Path of the vllm package inside the image when it is not in site-packages."
    ),
    transformers: bool = typer.Option(
        False, "--transformers", help="Also diff transformers' Gemma 4 model files against the same release."
    ),
    source: str = typer.Option("sdist", "--source", help="Pristine tree: sdist, git, or a path to the pin's tree."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Diff the image's installed vLLM Python files against the pin and write them as a new series."""
    if out is not None:
        output_folder(out, "--out")
    chosen = load_pins().get(pin)
    if out is None:  # the new series goes under the project's patches/: never the installed package
        writable_root()
    with err_console.status(f"opening {image}") as live:

        def pristine_tree() -> Path:
            live.update(f"preparing the {chosen.name} source tree ({source})")
            return fetch_source(chosen, source).path

        result = extract_series(
            image=image, pin=chosen, tree=pristine_tree, series=series, out=out, platform=platform,
            package_dir=package_dir, with_transformers=transformers, status=lambda msg: live.update(msg),
        )
    if json_out:
        print_json(result.to_dict())
        return
    # Names, versions and paths come from the image: printed as text, never read as rich markup.
    info = result.image
    console.print(escape(f"image   {info.reference}  {info.digest}  ({info.kind}, {info.platform})"), highlight=False)
    console.print(escape(f"vllm    {result.package_path}  version {result.image_vllm_version or 'unknown'}"),
                  highlight=False)
    console.print(f"changes {len(result.changes.modified)} modified, {len(result.changes.added)} added, "
                  f"{len(result.changes.missing)} of the pin absent from the image (left alone)", highlight=False)
    for s in result.report.unsafe:
        console.print(f"[yellow]skipped[/] {escape(f'{s.layer}: {s.name}: {s.reason}')}", highlight=False)
    if result.transformers is not None:
        tf = result.transformers
        console.print(escape(f"transformers {tf.version}: {len(tf.modified)} Gemma 4 files modified, "
                             f"{len(tf.added)} added; {tf.note}"), highlight=False)
    for w in result.warnings:
        console.print(f"[yellow]warning:[/] {escape(w)}", highlight=False)
    if result.folder is None:
        console.print(f"the image's vLLM Python files equal {result.pin}'s; no series written")
    else:
        console.print(f"[green]wrote[/] {escape(f'series {result.series} in {result.folder}')}", highlight=False)
        console.print(escape(f"add '{result.series}' to patches/series.yaml's order to apply it in builds"),
                      highlight=False)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""
    app.add_typer(image_app, name="image")
