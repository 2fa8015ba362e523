"""`g4build ci` commands: the expanded wheel matrix, workflow rendering, and the nightly's target resolution."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from g4build.ci import (
    append_github_outputs,
    buildable,
    exclusion_notes,
    expand,
    github_outputs,
    latest_release,
    load_matrix,
    render_all,
    resolve_target,
    select_archs,
    stale_files,
    write_rendered,
)
from g4build.cli._common import JSON_OPTION, console, err_console, print_json
from g4build.cli.outpaths import output_file, writing
from g4build.data import writable_root
from g4build.errors import ConfigError, UsageError
from g4build.pins.model import load_pins

ci_app = typer.Typer(help="The CI wheel matrix (ci/matrix.yaml) and the workflows generated from it.",
                     no_args_is_help=True)

PIN_OPTION = typer.Option(None, "--pin", help="A pin from patches/pins.yaml.")
RELEASE_OPTION = typer.Option(None, "--release", help="An upstream vLLM release, e.g. 0.33.0.")
ARCH_OPTION = typer.Option("default", "--arch", help="default (non-optional archs), all, or one arch such as sm121.")


def _offline_default() -> str:
    pins = load_pins()
    return pins.get(None).version


@ci_app.command("matrix")
def matrix_cmd(
    pin: str | None = PIN_OPTION,
    release: str | None = RELEASE_OPTION,
    arch: str = ARCH_OPTION,
    json_out: bool = JSON_OPTION,
) -> None:
    """Show every cell: what it builds, its runner, its cache key (for the default pin unless told)."""
    spec = load_matrix()
    pins = load_pins()
    target = resolve_target(pins, pin=pin or (None if release else pins.default), release=release,
                            latest=_offline_default)
    cells, left_out = buildable(spec, expand(spec, select_archs(spec, arch)), target, pins)
    if json_out:
        print_json({
            "matrix": str(spec.source),
            "target": {"release": target.release, "pin": target.pin},
            "cells": [c.to_dict(target) for c in cells],
            "excluded": exclusion_notes(spec),
            "left_out": list(left_out),
        })
        return
    table = Table(title=f"{target.name} ({'pin ' + target.pin if target.pin else 'unpinned release'})")
    for column in ("cell", "role", "runner", "required", "sccache key"):
        table.add_column(column, no_wrap=True)
    for c in cells:
        table.add_row(c.id, c.role, c.runner, "yes" if c.required else "no", c.cache_key(target))
    console.print(table)
    for note in exclusion_notes(spec):
        console.print(f"excluded: {note}", highlight=False)
    for note in left_out:
        console.print(note, highlight=False)


@ci_app.command("render")
def render_cmd(
    check: bool = typer.Option(False, "--check", help="Write nothing; fail when the committed workflows are stale."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Regenerate .github/workflows/ from ci/matrix.yaml (or, with --check, prove they agree)."""
    if check:
        # the workflows live in a checkout: the installed package's data has none to compare with, and calling
        # them "stale" there would send the user to regenerate files that do not exist
        try:
            root = writable_root()
        except UsageError as exc:
            raise UsageError(
                "ci render --check compares a checkout's .github/workflows/ with ci/matrix.yaml: "
                + exc.message.replace("no g4build project to write into", "no g4build project to check"),
                hint=exc.hint) from exc
    else:
        root = writable_root()  # never write into the installed package
    spec = load_matrix()
    rendered = render_all(spec)
    stale = stale_files(root, rendered)
    if check:
        if json_out:
            print_json({"stale": stale, "ok": not stale})
        if stale:
            raise ConfigError(
                f"generated workflows are stale: {', '.join(stale)} differ from what {spec.source.name} renders",
                hint="run `g4build ci render` and commit the result (edit ci/matrix.yaml, never the workflows)",
            )
        if not json_out:
            console.print(f"{len(rendered)} workflows match {spec.source.name}")
        return
    write_rendered(root, rendered)
    if json_out:
        print_json({"written": [r.path.as_posix() for r in rendered], "changed": stale})
    else:
        for r in rendered:
            state = "updated" if r.path.as_posix() in stale else "unchanged"
            console.print(f"{r.path.as_posix()}: {state}", highlight=False)


@ci_app.command("resolve")
def resolve_cmd(
    pin: str | None = PIN_OPTION,
    release: str | None = RELEASE_OPTION,
    arch: str = ARCH_OPTION,
    github_output: Path | None = typer.Option(
        None, "--github-output", help="Append the results as GitHub output blocks (the nightly passes $GITHUB_OUTPUT)."
    ),
    json_out: bool = JSON_OPTION,
) -> None:
    """Pick what a nightly run builds: the pin or release given, else the newest release on the package index."""
    if github_output is not None:
        github_output = output_file(github_output, "--github-output")
    spec = load_matrix()
    pins = load_pins()
    target = resolve_target(pins, pin=pin, release=release, latest=latest_release)
    cells, left_out = buildable(spec, expand(spec, select_archs(spec, arch)), target, pins)
    outputs = github_outputs(spec, target, cells, left_out)
    if github_output is not None:
        github_output.parent.mkdir(parents=True, exist_ok=True)
        with writing(github_output, "--github-output"):
            append_github_outputs(github_output, outputs)
    for note in left_out:
        err_console.print(note, highlight=False)
    if json_out:
        print_json(outputs)
    else:
        how = f"pin {target.pin}" if target.pin else "no pin: the patch variants of the nearest pin"
        console.print(f"target: vLLM {target.release} ({how})", highlight=False)


def register(app: typer.Typer) -> None:
    """Add `g4build ci` to the root app."""
    app.add_typer(ci_app, name="ci")
