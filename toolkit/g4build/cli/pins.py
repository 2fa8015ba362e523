"""`g4build pins list|show`: the pinned upstream releases."""

from __future__ import annotations

import typer
from rich.table import Table

from g4build.cli._common import JSON_OPTION, console, print_json
from g4build.pins import load_pins

pins_app = typer.Typer(help="The pinned upstream vLLM releases.", no_args_is_help=True)


@pins_app.command("list")
def list_pins(json_out: bool = JSON_OPTION) -> None:
    """List every pin."""
    pinset = load_pins()
    if json_out:
        print_json([p.to_dict() | {"default": p.name == pinset.default} for p in pinset.pins.values()])
        return
    table = Table(title=f"pins ({pinset.source.name})")
    for col in ("name", "version", "commit", "torch", "CUDA", "FlashInfer", "sdist sha256"):
        table.add_column(col)
    for p in pinset.pins.values():
        name = f"{p.name} [dim](default)[/]" if p.name == pinset.default else p.name
        table.add_row(name, p.version, p.upstream.commit[:12], p.torch, p.cuda, p.flashinfer, p.sdist.sha256[:16] + "…")
    console.print(table)


@pins_app.command("show")
def show_pin(name: str = typer.Argument(..., help="Pin name, e.g. vllm-0.21.0."), json_out: bool = JSON_OPTION) -> None:
    """Show one pin in full."""
    pin = load_pins().get(name)
    data = pin.to_dict()
    if json_out:
        print_json(data)
        return
    table = Table(show_header=False, title=pin.name)
    table.add_column(style="bold")
    table.add_column()
    for key, value in data.items():
        if isinstance(value, dict):
            value = "\n".join(f"{k}: {v}" for k, v in value.items()) or "-"
        table.add_row(key, str(value))
    console.print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(pins_app, name="pins")
