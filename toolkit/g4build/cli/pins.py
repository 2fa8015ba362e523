"""`g4build pins list|show|add`: the pinned upstream releases."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from g4build.cli._common import JSON_OPTION, console, print_json
from g4build.data import writable_root
from g4build.pins.add import Given, read_release
from g4build.pins.model import Pin, load_pins
from g4build.pins.pinsfile import render_entry, write_pin
from g4build.recipes.vllm_args import record_table
from g4build.recipes.vllm_envs import record_envs

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


@pins_app.command("add")
def add_pin(
    release: str = typer.Option(..., "--release", help="Upstream vLLM version on the package index, e.g. 0.33.0."),
    name: str | None = typer.Option(None, "--name", help="Pin name (default: vllm-X.Y.Z)."),
    commit: str | None = typer.Option(None, "--commit", help="Full upstream commit; must start with the sdist's id."),
    remote: str | None = typer.Option(None, "--remote", help="Upstream git remote (default: the existing pins')."),
    torch: str | None = typer.Option(None, "--torch", help="torch version, where the release records none."),
    cuda: str | None = typer.Option(None, "--cuda", help="CUDA X.Y, where the release records none."),
    flashinfer: str | None = typer.Option(None, "--flashinfer", help="FlashInfer version, where none is recorded."),
    wheel: list[str] = typer.Option([], "--wheel", help="Wheel file to pin where the index has several builds."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the entry; write nothing."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Pin an upstream release, read from the package index and its sdist, into patches/pins.yaml."""
    # A dry run may read the installed data; a write needs the user's own project (never site-packages).
    path = None if dry_run else writable_root() / "patches" / "pins.yaml"
    pinset = load_pins(path)
    given = Given(name=name, commit=commit, remote=remote, torch=torch, cuda=cuda, flashinfer=flashinfer,
                  wheels=tuple(wheel))
    proposal = read_release(release, given, pinset)
    written = None if dry_run else write_pin(proposal.pin, pinset)
    table, why = (None, "dry run") if written is None else _record_args(proposal.pin)
    envs = None if table is None else _record_envs(proposal.pin)
    if json_out:
        print_json(proposal.to_dict() | {"file": str(pinset.source), "written": written is not None,
                                         "args_table": None if table is None else str(table),
                                         "env_names": None if envs is None else str(envs)})
        return
    console.print(render_entry(proposal.pin), end="", markup=False, highlight=False)
    for key, where in proposal.sources.items():
        console.print(f"[dim]{key}: {where}[/]", highlight=False)
    for key, why in proposal.unread.items():
        console.print(f"[yellow]not read[/] {key}: {why}", highlight=False)
    for line in proposal.skipped:
        console.print(f"[dim]not pinned: {line}[/]", highlight=False)
    if written is None:
        console.print(f"dry run: nothing written to {pinset.source}", highlight=False)
    else:
        console.print(f"added pin {proposal.pin.name} to {written}; next: `g4build patches check --pin "
                      f"{proposal.pin.name}` (the series must be ported before the pin is usable)", highlight=False)
        if table is not None:
            console.print(f"recorded its vLLM argument names (recipe --set checks) in {table}", highlight=False)
            if envs is not None:
                console.print(f"recorded the environment variables it reads (recipe render/check) in {envs}",
                              highlight=False)
        else:
            console.print(f"[yellow]not recorded[/] its vLLM argument names: {why}", highlight=False)


def _record_args(pin: Pin) -> tuple[Path | None, str]:
    """The pin's vLLM argument table written into the project (recipes/vllm-args/), from the sdist `pins add`
    just verified; (None, why) when it cannot be read."""
    try:
        table = record_table(pin, writable_root())
    except ValueError as exc:
        return None, f"its sdist could not be read ({exc}); recipe --set names stay unchecked for it"
    return table, "" if table is not None else "its sdist is not in the cache"


def _record_envs(pin: Pin) -> Path | None:
    """The environment variables the pin's vLLM reads, recorded beside its argument table (render and check use
    them offline); None when its envs.py cannot be read (they then come from the cached sdist, if any)."""
    try:
        return record_envs(pin, writable_root())
    except ValueError:
        return None


def register(app: typer.Typer) -> None:
    """Add `g4build pins` to the root app."""
    app.add_typer(pins_app, name="pins")
