"""`g4build validate` commands."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from g4build.cli._common import JSON_OPTION, console, print_json, require_wheel_file
from g4build.errors import UsageError, ValidationError
from g4build.validate import cudatools
from g4build.validate.fatbin import Arch
from g4build.validate.wheel import ValidateOptions, ValidationReport, unreadable, validate_wheel


def parse_archs(values: list[str]) -> tuple[Arch, ...]:
    try:
        return tuple(Arch.parse(v) for v in values)
    except ValueError as exc:
        raise UsageError(str(exc), hint="use e.g. --arch sm120 (repeat --arch for several)") from exc


def show_report(report: ValidationReport) -> None:
    # Check names and details quote wheel members: text, never rich markup.
    table = Table(title=escape(Path(report.wheel).name), show_lines=False, title_justify="left")
    table.add_column("check")
    table.add_column("", width=4)
    table.add_column("detail", overflow="fold")
    for c in report.checks:
        table.add_row(escape(c.name), "[green]ok[/]" if c.ok else "[bold red]FAIL[/]", escape(c.detail))
    console.print(table)


def run_validation(wheels: list[Path], options: ValidateOptions, *, as_json: bool) -> list[ValidationReport]:
    """Validate each wheel, print the results, raise ValidationError when any check failed. A wheel that cannot
    be read (not a zip, no permission, not a wheel's name) gets a report of its own too: every wheel is
    reported, the others still checked."""
    reports = []
    for wheel in wheels:
        with console.status(f"validating {wheel.name}", spinner="dots") if not as_json else nullcontext():
            try:
                reports.append(validate_wheel(wheel, options))
            except (ValidationError, OSError) as exc:
                reports.append(unreadable(wheel, exc))
        if not as_json:
            show_report(reports[-1])
    if as_json:
        # one shape whatever the number of wheels, so a script reads it the same way for one or many
        print_json({"wheels": [r.to_dict() for r in reports], "ok": all(r.ok for r in reports)})
    failed = [r for r in reports if not r.ok]
    if failed:
        names = "; ".join(f"{Path(r.wheel).name}: {', '.join(c.name for c in r.failures())}" for r in failed)
        # a wheel's one verdict, or why it could not be read, is the thing to act on
        verdicts = [c.detail for r in failed for c in r.failures() if c.name.startswith("verdict ") or
                    c.name == "readable"]
        raise ValidationError(
            f"{len(failed)} of {len(reports)} wheel(s) failed validation ({names})",
            hint=verdicts[0] if len(verdicts) == 1 else "each failing check's detail says what is wrong and why",
        )
    return reports


def validate(
    wheels: list[Path] = typer.Argument(..., help="Wheel files to check (a missing one: exit 5)."),
    arch: list[str] = typer.Option([], "--arch", help="Require SASS for this GPU arch (e.g. sm120); repeatable."),
    pin: str | None = typer.Option(None, "--pin", help="Require the version (and series) of this pin."),
    smoke: bool = typer.Option(False, "--smoke", help="Install into a fresh venv (no deps) and import it."),
    cuobjdump: bool = typer.Option(
        True, "--cuobjdump/--no-cuobjdump", help="With --arch, cross-check fatbins with cuobjdump when found.",
    ),
    trust_fatbin: bool = typer.Option(
        False, "--trust-fatbin", help="With --arch and no cuobjdump: accept the fatbin headers alone (without "
        "it, an arch verdict no tool cross-checked fails).",
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Check wheels: filename tags, METADATA, RECORD hashes, series fingerprints, CUDA archs."""
    for wheel in wheels:  # a path that is no file: exit 5 (file missing), as the docs' exit codes say
        require_wheel_file(wheel)
    options = ValidateOptions(
        archs=parse_archs(arch), pin=pin, smoke=smoke,
        cuobjdump=cudatools.find_cuobjdump() if cuobjdump and arch else None, trust_fatbin=trust_fatbin,
    )
    run_validation(wheels, options, as_json=as_json)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""
    app.command("validate")(validate)
