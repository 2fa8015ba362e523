"""`g4build deps list|check|apply|status`: build series for CMake dependencies and vLLM's own CMake."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from g4build.builder.depapply import apply_for_pin, check_dependency, read_patched_record, require_ok
from g4build.cli._common import JSON_OPTION, console, err_console, print_json
from g4build.cli.outpaths import output_file
from g4build.pins.model import load_pins
from g4build.series.deps import chosen_build_series, get_build_series, load_all_build
from g4build.series.status import series_commits

deps_app = typer.Typer(help="Build series: patches for CMake dependencies (vllm-flash-attn ...) and vLLM's CMake.",
                       no_args_is_help=True)


@deps_app.command("list")
def list_cmd(json_out: bool = JSON_OPTION) -> None:
    """The build series in apply order: project, pins with the dependency commit, patches, decisions."""
    found = load_all_build()
    if json_out:
        print_json({"build_series": [
            {**b.series.to_dict(), "project": b.project,
             "commits": {pin: v.commit for pin, v in b.variants.items()},
             "decisions": [d.to_dict() for d in b.decisions]} for b in found]})
        return
    if not found:
        console.print("no build series (patches/deps/series.yaml is absent or empty)")
        return
    table = Table(title="build series (applied by `g4build wheel`, never by an overlay)")
    for col in ("series", "version", "project", "title", "pins"):
        table.add_column(col)
    for b in found:
        pins = "\n".join(f"{pin}: {len(b.series.patches_for(pin))} patch(es)"
                         + (f" @ {v.commit[:12]}" if (v := b.variant(pin)) and v.commit else "")
                         for pin in b.series.pins)
        table.add_row(b.name, str(b.version), b.project, escape(b.series.title), pins or "-")
    console.print(table)
    for b in found:
        for d in b.decisions:
            left = escape(f" [left out in: {', '.join(d.left_out_in)}]") if d.left_out_in else ""
            console.print(f"{b.name}: {d.family} ({d.cmake}, upstream {d.upstream}): {d.decision}{left} — "
                          f"{escape(d.why)}")


@deps_app.command("check")
def check_cmd(
    tree: Path = typer.Option(..., "--tree", exists=True, file_okay=False,
                              help="The project's source tree (a dependency's copy, or the vLLM tree for `vllm`)."),
    series: str = typer.Option(..., "--series", help="Build series name."),
    pin: str | None = typer.Option(None, "--pin", help="Pin name (default: the pins file's default)."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Check a build series against a tree: its commit, the recorded files, every patch with zero fuzz (exit 8)."""
    p = load_pins().get(pin)
    b = get_build_series(series)
    result = check_dependency(tree, b, p)
    if json_out:
        print_json(result.to_dict())
    else:
        v = b.variant(p.name)
        console.print(f"{b.name} v{b.version} on {tree}: commit {result.commit or '-'} "
                      f"({result.commit_state}; series written for {v.commit if v and v.commit else 'the pin'})")
        for c in result.changed:
            console.print(f"  changed: {escape(c)}")
        for s in result.report.series:
            for pr in s.patches:
                console.print(f"  {escape(pr.file)}: {pr.status} — {escape(pr.detail)}")
    require_ok(result)


@deps_app.command("apply")
def apply_cmd(
    tree: Path = typer.Option(..., "--tree", exists=True, file_okay=False, help="The vLLM source tree."),
    pin: str | None = typer.Option(None, "--pin", help="Pin name (default: the pins file's default)."),
    series: list[str] | None = typer.Option(None, "--series", help="Only these build series (repeatable)."),
    cache: Path | None = typer.Option(None, "--cache", help="Where `g4build prefetch` keeps the dependencies."),
    write: Path | None = typer.Option(
        None, "--write", help="The CMake initial-cache file `g4build prefetch --tree SRC --write FILE` made: "
                              "pointed at the patched copies."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Apply the pin's build series: vLLM's own to the tree (one commit per patch), a dependency's to a patched
    copy of its prefetched clone, which the initial cache then names. Nothing half-done: a check runs first."""
    if write is not None:  # checked before any tree is touched: exit 2, not an OSError after the work
        output_file(write, "--write")
    p = load_pins().get(pin)
    rows = apply_for_pin(tree, chosen_build_series(p, series), p, cache=cache, write=write, status=err_console.status)
    if json_out:
        print_json({"pin": p.name, "applied": rows})
        return
    for r in rows:
        console.print(f"{r['name']} v{r['version']} ({r['project']}"
                      + (f" @ {r['commit'][:12]}" if r["commit"] else "") + f"): {r['path']}")


@deps_app.command("status")
def status_cmd(
    tree: Path = typer.Option(..., "--tree", exists=True, file_okay=False, help="A patched copy or the vLLM tree."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Which build series a tree carries (its commits' G4build-* trailers) and, for a patched dependency copy,
    the record written when it was made."""
    names = {b.name for b in load_all_build()}
    commits = [c for c in series_commits(tree) if c.series in names]
    record = read_patched_record(tree)
    if json_out:
        print_json({"tree": str(tree), "record": record,
                    "commits": [{"commit": c.commit, "series": c.series, "version": c.version, "patch": c.patch,
                                 "pin": c.pin} for c in commits]})
        return
    if not commits:
        console.print(f"{tree}: no build series applied")
    for c in commits:
        console.print(f"{c.commit[:12]} {c.series} v{c.version}: {c.patch} (pin {c.pin})")


def register(app: typer.Typer) -> None:
    """Add `g4build deps` to the root app."""
    app.add_typer(deps_app, name="deps")
