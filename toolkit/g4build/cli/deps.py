"""`g4build deps list|check|apply|status`: build series for CMake dependencies and vLLM's own CMake."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from g4build.cli._common import JSON_OPTION, console, err_console, print_json
from g4build.errors import UsageError
from g4build.pins.index import cache_root
from g4build.pins.model import Pin, load_pins
from g4build.series.deps import BuildSeries, build_series_for, get_build_series, load_all_build

deps_app = typer.Typer(help="Build series: patches for CMake dependencies (vllm-flash-attn ...) and vLLM's CMake.",
                       no_args_is_help=True)


def _chosen(pin: Pin, names: list[str] | None) -> list[BuildSeries]:
    if not names:
        return build_series_for(pin)
    chosen = [get_build_series(n) for n in names]
    empty = [b.name for b in chosen if not b.applies_to(pin.name)]
    if empty:
        raise UsageError(f"build series {', '.join(empty)} has no patches for pin {pin.name}",
                         hint="`g4build deps list` shows the pins each build series covers")
    return chosen


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
            console.print(f"{b.name}: {d.family} ({d.cmake}, upstream {d.upstream}): {d.decision} — {escape(d.why)}")


@deps_app.command("check")
def check_cmd(
    tree: Path = typer.Option(..., "--tree", exists=True, file_okay=False,
                              help="The project's source tree (a dependency's copy, or the vLLM tree for `vllm`)."),
    series: str = typer.Option(..., "--series", help="Build series name."),
    pin: str | None = typer.Option(None, "--pin", help="Pin name (default: the pins file's default)."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Check a build series against a tree: its commit, the recorded files, every patch with zero fuzz (exit 8)."""
    from g4build.builder.depapply import check_dependency, require_ok

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
        None, "--write", help="The CMake initial-cache file `g4build prefetch --write` made: pointed at the patched "
                              "copies."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Apply the pin's build series: vLLM's own to the tree (one commit per patch), a dependency's to a patched
    copy of its prefetched clone, which the initial cache then names. Nothing half-done: a check runs first."""
    from g4build.builder.depapply import apply_build_series, patched_dependency, point_cache_at
    from g4build.builder.deps import find_deps, prefetch

    p = load_pins().get(pin)
    chosen = _chosen(p, series)
    cache = cache or cache_root() / "deps"
    rows = []
    text = write.read_text(encoding="utf-8") if write is not None else None
    deps = {d.name: d for d in find_deps(tree)}
    for b in chosen:
        if not b.is_dependency:
            check = apply_build_series(tree, b, p)
            rows.append({**b.record(p.name), "path": str(tree), "already_applied": check.applied})
            continue
        dep = deps.get(b.project)
        v = b.variant(p.name)
        if dep is None:
            raise UsageError(f"build series {b.name} patches {b.project}, which {tree}'s CMake does not declare",
                             hint=f"known: {', '.join(sorted(deps)) or 'none'}")
        if v is None or v.commit != dep.tag:
            raise UsageError(
                f"build series {b.name} v{b.version} is written for {b.project} {v.commit if v else '?'}, "
                f"{dep.declared_in} declares {dep.tag}",
                hint=f"port it: a variant for that commit under patches/deps/{b.name}/")
        with err_console.status(f"prefetch {dep.name} @ {dep.tag}"):
            pristine = prefetch(dep, cache)
        with err_console.status(f"patch {dep.name}: {b.name} v{b.version}"):
            copy = patched_dependency(pristine, [b], p)
        rows.append({**b.record(p.name), "path": str(copy)})
        if text is not None:
            text = point_cache_at(text, dep, copy, f"g4build deps: {b.name} v{b.version}")
    if write is not None and text is not None:
        tmp = write.with_name(write.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(write)
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
    from g4build.builder.depapply import read_patched_record
    from g4build.series.status import series_commits

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
