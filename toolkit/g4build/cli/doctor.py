"""`g4build doctor` commands."""

from __future__ import annotations

import dataclasses
import os

import typer
from rich.markup import escape
from rich.table import Table

from g4build.cli._common import JSON_OPTION, console, err_console, print_json
from g4build.data import project_choice
from g4build.doctor import SystemProbe, run_doctor
from g4build.doctor.checks import Finding
from g4build.errors import DoctorFailed, UsageError
from g4build.pins.model import load_pins


def _existing_folder(path: str) -> str:
    """--path as an absolute folder that exists: free space measured at some parent instead would answer a
    question the user did not ask (a new folder may sit on another mount than its parent)."""
    where = os.path.abspath(path)
    if not os.path.exists(where):
        raise UsageError(f"--path {path}: expected an existing folder, found nothing there",
                         hint=f"create it first (mkdir {where}), or pass the folder the build will run in")
    if not os.path.isdir(where):
        raise UsageError(f"--path {path}: expected a folder, found a file",
                         hint="pass the folder the build will run in")
    return where


_STYLE = {"ok": "[green]ok[/]", "warn": "[yellow]warn[/]", "fail": "[bold red]fail[/]"}


def doctor(
    python: str | None = typer.Option(None, "--python", help="The Python you build with (default: this one)."),
    pin: str | None = typer.Option(
        None, "--pin", help="Compare torch and transformers with this pin's (default: the default pin)."),
    path: str = typer.Option(".", "--path", help="Where the build will run (free disk is measured there)."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Check this machine before a long build: GPU, driver, CUDA, MSVC, Python, torch, transformers, RAM, disk,
    Docker."""
    workdir = _existing_folder(path)
    chosen = load_pins().get(pin)
    with err_console.status("checking") as live:
        report = run_doctor(SystemProbe(), python=python, pin_torch=chosen.torch, pin=chosen, workdir=workdir,
                            step=lambda name: live.update(f"checking {name}"))
    root, why = project_choice()
    used = Finding(check="project", status="ok", summary=f"g4build data from {root}: {why}",
                   fix="g4build --root DIR (or G4BUILD_HOME) names another", detail={"root": str(root), "why": why})
    report = dataclasses.replace(report, findings=(used, *report.findings))
    if json_out:
        print_json(report.to_dict())
    else:
        table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        for column in ("check", "status", "finding", "fix"):
            table.add_column(column, overflow="fold")
        for f in report.findings:
            table.add_row(f.check, _STYLE[f.status], escape(f.summary), escape(f.fix))  # tools' text, not markup
        console.print(table)
    if report.failed:
        names = ", ".join(sorted({f.check for f in report.failed}))
        raise DoctorFailed(f"{len(report.failed)} check(s) failed: {names}",
                           hint="apply the fixes listed above, then run g4build doctor again")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""
    app.command("doctor")(doctor)
