"""`g4build doctor` commands."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from g4build.builder.buildcosts import BUILD_ARCH, load_costs
from g4build.cli._common import JSON_OPTION, console, err_console, print_json, require_wheel_file
from g4build.data import passed_over, patches_dir, project_choice
from g4build.doctor import ROUTES, SystemProbe, run_doctor
from g4build.doctor.checks import Finding
from g4build.errors import DoctorFailed, UsageError
from g4build.pins.model import load_pins
from g4build.recipes.context import read_wheel_info


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


def _route_and_pin(route: str | None, pin: str | None, wheel: Path | None) -> tuple[str, str | None]:
    """--route (default: overlay with --wheel, which only serves it; else build) and --pin (default: the pin the
    wheel's build-manifest.json names; a different --pin is refused, as recipe render refuses it)."""
    if route is not None and route.lower() not in ROUTES:
        raise UsageError(f"--route {route}: expected one of {', '.join(ROUTES)}",
                         hint="build compiles a wheel; overlay and nightly only serve one")
    chosen = route.lower() if route is not None else "overlay" if wheel is not None else "build"
    if wheel is None:
        return chosen, pin
    require_wheel_file(wheel)
    from_wheel = read_wheel_info(wheel).pin
    if pin is not None and from_wheel is not None and pin != from_wheel:
        raise UsageError(f"--pin {pin}: the wheel {wheel.name} was built from pin {from_wheel} (its "
                         "build-manifest.json)", hint="leave --pin out (it follows the wheel), or pass its pin")
    return chosen, pin or from_wheel


def doctor(
    python: str | None = typer.Option(None, "--python", help="The Python you build or serve with (default: this one)."),
    pin: str | None = typer.Option(
        None, "--pin", help="Compare torch and transformers with this pin's (default: the wheel's with --wheel, else "
                            "the default pin)."),
    route: str | None = typer.Option(
        None, "--route", help="What this machine is for: build (compile a wheel: CUDA toolkit, compiler, RAM; the "
                              "default), overlay or nightly (serve a wheel: GPU, driver, the pin's torch)."),
    wheel: Path | None = typer.Option(
        None, "--wheel", help="The wheel you will serve: its pin (and, unless --route, the overlay route's checks)."),
    path: str = typer.Option(".", "--path", help="Where the build will run (free disk is measured there)."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Check this machine for the route you take: GPU, driver, Python, torch, transformers, disk; for a build also
    CUDA, MSVC, RAM, Docker."""
    workdir = _existing_folder(path)
    chosen_route, pin = _route_and_pin(route, pin, wheel)
    chosen = load_pins().get(pin)
    with err_console.status("checking") as live:
        report = run_doctor(SystemProbe(), python=python, pin_torch=chosen.torch, pin=chosen, workdir=workdir,
                            step=lambda name: live.update(f"checking {name}"), route=chosen_route,
                            costs=load_costs(patches_dir(), chosen.name, BUILD_ARCH))
    root, why = project_choice()
    used = Finding(check="project", status="ok", summary=f"g4build data from {root}: {why}",
                   fix="g4build --root DIR (or G4BUILD_HOME) names another", detail={"root": str(root), "why": why})
    skipped = passed_over()
    if skipped is not None:  # said here too, not only in a note on stderr
        used = dataclasses.replace(used, status="warn", summary=f"{used.summary}; not the project at {skipped[0]}: "
                                   f"{skipped[1]}", fix=f"make it yours alone, or name it: g4build --root {skipped[0]}",
                                   detail={**used.detail, "passed_over": str(skipped[0]), "problem": skipped[1]})
    report = dataclasses.replace(report, findings=(used, *report.findings))
    if json_out:
        print_json(report.to_dict())
    else:
        console.print(f"route {chosen_route}, pin {chosen.name} (vLLM {chosen.version}, torch {chosen.torch})",
                      highlight=False, markup=False)
        table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        for column in ("check", "status", "finding", "fix"):
            table.add_column(column, overflow="fold")
        for f in report.findings:
            table.add_row(f.check, _STYLE[f.status], escape(f.summary), escape(f.fix))  # tools' text, not markup
        console.print(table)
    if report.failed:
        names = ", ".join(sorted({f.check for f in report.failed}))
        raise DoctorFailed(f"{len(report.failed)} check(s) failed for the {chosen_route} route: {names}",
                           hint="apply the fixes listed above, then run g4build doctor again")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""
    app.command("doctor")(doctor)
