"""`g4build overlay` commands."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from g4build.cli._common import JSON_OPTION, console, err_console, print_json, require_wheel_file
from g4build.cli.outpaths import existing_folder, output_folder
from g4build.cli.progress import download_progress
from g4build.errors import IntegrityError, UsageError, ValidationError
from g4build.overlay.registry import cached_pin_wheel, fetch_pin_wheel, pin_wheel
from g4build.overlay.venv import overlay_venv, undo_venv
from g4build.overlay.wheel import OverlayResult, overlay_wheel, plan_overlay
from g4build.pins.index import Fetched
from g4build.pins.model import Pin, load_pins
from g4build.series.model import load_all

if TYPE_CHECKING:  # validate's modules are imported when the new wheel is validated (not with --no-validate)
    from g4build.validate.wheel import ValidationReport


def _fetch_with_progress(pin: Pin, *, quiet: bool) -> Fetched:
    """``fetch_pin_wheel`` with its progress on stderr (``download_progress``; none with --json)."""
    name = pin_wheel(pin).file  # a pin without this platform's wheel is refused before any bar shows
    with download_progress(name, quiet=quiet) as hook:
        return fetch_pin_wheel(pin, progress=hook)


def overlay(
    wheel: Path | None = typer.Argument(
        None,
        help="A vLLM wheel of the pin's version (default: the pin's registry wheel, fetched and verified).",
    ),
    pin: str | None = typer.Option(None, "--pin", help="Pin whose Python-only series are laid over."),
    out: Path = typer.Option(Path("dist"), "--out", help="Folder for the new wheel and build-manifest.json."),
    venv: Path | None = typer.Option(None, "--venv", file_okay=False, help="Patch this venv's vLLM in place."),
    undo: bool = typer.Option(False, "--undo", help="With --venv: restore the files the overlay changed."),
    force: bool = typer.Option(False, "--force", help="With --undo: restore even files changed after the overlay."),
    validate: bool = typer.Option(True, "--validate/--no-validate", help="Validate the new wheel."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Lay the pin's Python-only series over an existing vLLM wheel or venv, without compiling."""
    if undo and venv is None:
        raise UsageError("--undo needs --venv PATH")
    if force and not undo:
        raise UsageError("--force only applies to --undo (it restores files changed after the overlay)")
    if venv is not None and wheel is not None:
        raise UsageError("pass either a WHEEL or --venv PATH, not both")
    if wheel is not None:
        require_wheel_file(wheel)  # missing: exit 5, as for validate and recipe --wheel
    if venv is not None:
        existing_folder(venv, "--venv", "a virtual environment (a folder with pyvenv.cfg)")
        try:
            if undo:
                done = undo_venv(venv, force=force)
            else:
                done = overlay_venv(venv, plan_overlay(load_pins().get(pin), load_all()))
        except KeyboardInterrupt as exc:
            # the journal makes the next run finish or roll back; say so instead of a bare "aborted"
            err_console.print(f"{venv}: interrupted; run `g4build overlay --venv {venv} --undo` (or the same "
                              "command again): it finds the journal and rolls back or finishes the change",
                              markup=False, highlight=False)
            raise typer.Abort() from exc
        if as_json:
            print_json(done.to_dict())
        else:
            verb = "restored" if undo else f"patched (g4.{done.digest})"
            console.print(f"{venv}: {verb} {len(done.files)} file(s): {', '.join(done.files)}", markup=False)
        return
    output_folder(out, "--out")
    the_pin = load_pins().get(pin)
    plan = plan_overlay(the_pin, load_all())
    registry = wheel is None  # the pin's registry wheel: refused unless its sha256 as read is the pin's
    if wheel is None:
        wheel = cached_pin_wheel(the_pin) or _fetch_with_progress(the_pin, quiet=as_json).path
    reports: list[ValidationReport] = []

    def check(staged: Path) -> None:
        """Validate the finished wheel before it is renamed into --out: a failing one never appears there."""
        from g4build.cli.validate import show_report
        from g4build.validate.wheel import ValidateOptions, validate_wheel

        with console.status("validating", spinner="dots") if not as_json else nullcontext():
            report = validate_wheel(staged, ValidateOptions(pin=the_pin.name))
        if not as_json:
            show_report(report)
        if not report.ok:
            failed = ", ".join(f"{c.name}: {c.detail}" for c in report.failures())
            raise ValidationError(f"the overlaid wheel failed validation and was not written ({failed})")
        reports.append(report)

    def run(source: Path) -> OverlayResult:
        with console.status(f"overlaying {source.name}", spinner="dots") if not as_json else nullcontext():
            return overlay_wheel(source, plan, out, require_pin=registry, check=check if validate else None)

    try:
        try:
            result = run(wheel)
        except IntegrityError:
            if not registry:
                raise
            # the cached copy is not the pin's (damaged or replaced): fetched again (the fetch drops it and
            # verifies the download), then overlaid under the same condition
            result = run(_fetch_with_progress(the_pin, quiet=as_json).path)
    except KeyboardInterrupt as exc:
        # typer turns KeyboardInterrupt into a silent exit 130; Abort reaches main(), which says "aborted"
        raise typer.Abort() from exc
    for path in result.leftovers_removed:
        err_console.print(f"removed {path}: left by an interrupted overlay", markup=False, highlight=False)
    for path in result.leftovers_kept:
        err_console.print(f"left {path} in place: another overlay may be using it (remove it when none runs)",
                          markup=False, highlight=False)
    data = result.to_dict()
    if reports:
        data["validation"] = replace(reports[0], wheel=str(result.wheel)).to_dict()
    if as_json:
        print_json(data)
    else:
        console.print(f"wrote {result.wheel} (vLLM {result.version}); changed: {', '.join(result.changed)}",
                      markup=False)
        for outcome in result.files:  # per file: applied (zero fuzz), merged (three-way), already
            why = f" ({outcome.detail})" if outcome.how != "applied" else ""
            console.print(f"  {outcome.how}: {outcome.path}{why}", markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""
    app.command("overlay")(overlay)
