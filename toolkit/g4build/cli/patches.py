"""`g4build patches list|check|apply|status|refresh|new|port`: the patch series on a vLLM source tree."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import typer
from packaging.version import InvalidVersion, Version
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn
from rich.table import Table

from g4build.cli._common import JSON_OPTION, console, err_console, print_json
from g4build.data import writable_root
from g4build.errors import UsageError
from g4build.pins.index import Fetched, ProgressHook
from g4build.pins.model import load_pins
from g4build.series.apply import apply_stack
from g4build.series.check import StackReport, check_stack, conflict_error
from g4build.series.model import get_series, load_all, unmet_requirements
from g4build.series.port import plan_port, port, port_conflict_error
from g4build.series.refresh import RefreshResult, diff_patch, new_series, patches_from_commits, refresh
from g4build.series.status import tree_status
from g4build.source.fetch import fetch_source, pristine_files, read_version_file, release_tree
from g4build.source.gittree import pristine_commit

patches_app = typer.Typer(help="Patch series: list, check for drift, apply, status, refresh.", no_args_is_help=True)

_STYLE = {"needed": "green", "applies": "green", "merged": "green", "upstream": "cyan", "partial": "yellow",
          "conflict": "bold red"}

TREE_OPTION = typer.Option(..., "--tree", help="A vLLM source tree (a git work tree).", file_okay=False,
                           exists=True)
PIN_OPTION = typer.Option(..., "--pin", help="Pin name, e.g. vllm-0.21.0.")


def _paint(status: str) -> str:
    return f"[{_STYLE.get(status, 'white')}]{status}[/]"


@contextmanager
def _download_progress(label: str, quiet: bool) -> Iterator[ProgressHook]:
    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  console=err_console, transient=True, disable=quiet) as progress:
        task = progress.add_task(label, total=None)

        def hook(done: int, total: int | None) -> None:
            progress.update(task, completed=done, total=total)

        yield hook


@patches_app.command("list")
def list_series(json_out: bool = JSON_OPTION) -> None:
    """List the series in apply order, with their per-pin variants."""
    stack = load_all()
    if json_out:
        print_json({"series": [s.to_dict() for s in stack]})
        return
    if not stack:
        console.print("no series yet (patches/series.yaml has an empty order)")
        return
    table = Table(title="patch series (in apply order)")
    for col in ("#", "series", "version", "title", "python-only", "applied upstream", "pins"):
        table.add_column(col)
    for i, s in enumerate(stack, start=1):
        pins = "\n".join(
            f"{pin}: {len(v.patches)} patch(es)" if v.patches else f"{pin}: none ({escape(v.note) or 'not needed'})"
            for pin, v in s.pins.items()
        )
        table.add_row(str(i), s.name, str(s.version), escape(s.title), "yes" if s.python_only else "no",
                      s.applied_upstream or "-", pins or "-")
    console.print(table)


def _render(report: StackReport, tree_note: str) -> None:
    if report.target == "release":
        title = (f"release {report.name}: patch variants of {report.variant_pin} (the nearest pin), "
                 f"{tree_note}")
    else:
        title = f"{report.name}: {tree_note}"
    table = Table(title=title, show_lines=True)
    for col in ("series", "v", "status", "patch", "result", "detail"):
        table.add_column(col, overflow="fold")
    for s in report.series:
        if not s.patches:
            table.add_row(s.name, str(s.version), _paint(s.status), "-", "-", escape(s.note))
        for i, p in enumerate(s.patches):
            first = i == 0
            table.add_row(s.name if first else "", str(s.version) if first else "", _paint(s.status) if first else "",
                          escape(p.file), _paint(p.status), escape(p.detail))
    if not report.series:
        console.print(f"{title}: no series in patches/series.yaml")
        return
    console.print(table)


def _release_version(text: str) -> str:
    try:
        return str(Version(text))
    except InvalidVersion as exc:
        raise UsageError(f"--release: expected a version such as 0.33.0, found {text!r}") from exc


@patches_app.command("check")
def check(
    pin: str | None = typer.Option(None, "--pin", help="Pin name (default: the pins file's default)."),
    release: str | None = typer.Option(None, "--release", help="Check an unpinned upstream release X.Y.Z instead."),
    tree: Path | None = typer.Option(None, "--tree", help="Source tree to check (default: fetch the pin's sdist).",
                                     file_okay=False, exists=True),
    json_out: bool = JSON_OPTION,
) -> None:
    """Report, per series and patch, whether it applies (zero fuzz), is upstream, or conflicts."""
    if pin and release:
        raise UsageError("pass --pin or --release, not both")
    with tempfile.TemporaryDirectory(prefix="g4build-release-") as tmp:
        if release:
            report, note = _check_release(_release_version(release), tree, Path(tmp), json_out)
        else:
            report, note = _check_pin(pin, tree, json_out)
        if json_out:
            print_json(report.to_dict())
        else:
            _render(report, note)
        if not report.ok:
            raise conflict_error(report, tree_hint=str(tree or "<your tree>"))


def _checking(count: int, quiet: bool) -> AbstractContextManager[Any]:
    return nullcontext() if quiet else err_console.status(f"checking {count} series", spinner="dots")


def _check_pin(pin: str | None, tree: Path | None, quiet: bool) -> tuple[StackReport, str]:
    the_pin = load_pins().get(pin)
    stack = load_all()
    pristine = None
    if tree is None:
        with _download_progress(the_pin.sdist.file, quiet) as hook:
            tree = fetch_source(the_pin, "sdist", progress=hook).path
        pristine = pristine_commit(tree)  # the cached tree may carry commits (applied patches) on top
    found, _ = read_version_file(tree)
    note = f"tree {tree}" + (f" [yellow](its vllm/_version.py says {found})[/]"
                             if found and found != the_pin.version else "")
    with _checking(len(stack), quiet):
        report = check_stack(tree, stack, variant_pin=the_pin.name, version=the_pin.version, at_commit=pristine)
    return report, note


def _check_release(version: str, tree: Path | None, workdir: Path, quiet: bool) -> tuple[StackReport, str]:
    pinset = load_pins()
    stack = load_all()
    base = pinset.nearest(version)
    sha256 = None
    note = f"tree {tree}"
    if tree is None:
        tree, sha256 = release_tree(version, pinset.pins.values(), workdir,
                                    progress=lambda filename: _download_progress(filename, quiet),
                                    fetched=None if quiet else _verified)
        note = "the release sdist"
    with _checking(len(stack), quiet):
        report = check_stack(tree, stack, variant_pin=base.name, version=version, target="release", name=version)
    return dataclasses.replace(report, sdist_sha256=sha256), note


def _verified(filename: str, got: Fetched) -> None:
    err_console.print(f"{filename}: sha256 {got.sha256} ({'cached' if got.cached else 'downloaded'}, "
                      "verified against the index)", highlight=False)


@patches_app.command("apply")
def apply(
    pin: str = PIN_OPTION,
    tree: Path = TREE_OPTION,
    series: list[str] = typer.Option([], "--series", help="Apply only these series (repeatable; stack order kept)."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Apply every needed patch as one commit each, or leave the tree exactly as it was."""
    the_pin = load_pins().get(pin)
    stack = load_all()
    unknown = sorted(set(series) - {s.name for s in stack})
    if unknown:
        raise UsageError(f"unknown series {', '.join(unknown)}: expected one of {', '.join(s.name for s in stack)}",
                         hint="run `g4build patches list`")
    chosen = [s for s in stack if not series or s.name in series]
    unmet = unmet_requirements(chosen, stack, the_pin.name)
    if unmet:
        needs = "; ".join(f"{name} needs {req}" for name, req in unmet)
        add = " ".join(f"--series {req}" for req in sorted({req for _, req in unmet}))
        raise UsageError(f"on {the_pin.name} {needs} (series.yaml requires): a tree with one and not the other is "
                         "broken, so nothing was applied",
                         hint=f"add {add}, or leave --series out to apply every series")
    result = apply_stack(tree, chosen, pin=the_pin.name, version=the_pin.version)
    if json_out:
        print_json(result.to_dict())
        return
    table = Table(title=f"{the_pin.name} applied to {tree}")
    for col in ("series", "patch", "result"):
        table.add_column(col, overflow="fold")
    commits = {(a.series, a.file): a.commit for a in result.applied}
    for s in result.report.series:
        for p in s.patches:
            done = commits.get((s.name, p.file))
            table.add_row(s.name, p.file, f"committed {done[:12]}" if done else f"skipped: {escape(p.detail)}")
        if not s.patches:
            table.add_row(s.name, "-", f"nothing to apply: {escape(s.note)}")
    console.print(table)
    console.print(f"[green]✓[/] {len(result.applied)} commit(s): {result.head_before[:12]} → {result.head_after[:12]}")


@patches_app.command("status")
def status(
    tree: Path = TREE_OPTION,
    pin: str | None = typer.Option(None, "--pin", help="Pin whose fingerprints to look for (default: trailers)."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Which series and patches a tree carries (commit trailers; fingerprints for any tree)."""
    if pin:
        load_pins().get(pin)
    result = tree_status(tree, load_all(), pin=pin)
    if json_out:
        print_json(result.to_dict())
        return
    if not result.series:
        console.print(f"{tree} carries no g4build series")
        return
    table = Table(title=f"series in {tree}" + ("" if result.git else " (not a git tree: fingerprints only)"))
    for col in ("series", "tree version", "current", "state", "pin", "patches", "fingerprints"):
        table.add_column(col, overflow="fold")
    for s in result.series:
        patches = "\n".join(f"{c.patch or c.subject} ({c.commit[:12]})" for c in s.commits) or "-"
        state = s.state + (f" ({len(s.not_committed)} patch(es) not committed: upstream when applied)"
                           if s.not_committed else "")
        table.add_row(s.name, str(s.tree_version or "-"), str(s.known_version or "-"), state, s.pin or "-",
                      patches, s.fingerprints)
    console.print(table)


def _print_refresh(result: RefreshResult, json_out: bool) -> None:
    if json_out:
        print_json(result.to_dict())
    elif not result.changed:
        console.print(f"{result.series} for {result.pin}: unchanged (still v{result.new_version})")
    else:
        console.print(f"[green]✓[/] {result.series} for {result.pin}: v{result.old_version or '-'} → "
                      f"v{result.new_version}; wrote {', '.join(result.written)}"
                      + (f"; removed {', '.join(result.removed)}" if result.removed else ""))


@patches_app.command("refresh")
def refresh_cmd(
    series: str = typer.Argument(..., help="Series name."),
    pin: str = PIN_OPTION,
    tree: Path = TREE_OPTION,
    from_diff: bool = typer.Option(False, "--from-diff",
                                   help="Take the tree's uncommitted diff as the pin's whole variant (one patch)."),
    subject: str | None = typer.Option(None, "--subject", help="With --from-diff: patch subject (default: title)."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Regenerate a series' patches for a pin from the tree's series commits; bump its version."""
    writable_root()  # the series is rewritten in place: never in the installed package
    load_pins().get(pin)
    the_series = get_series(series)
    if from_diff:
        patches = [diff_patch(tree, pin, subject or the_series.title)]
    else:
        patches = patches_from_commits(tree, the_series, pin)
    _print_refresh(refresh(the_series, pin, patches), json_out)


@patches_app.command("new")
def new(
    name: str = typer.Argument(..., help="Name of the new series (its folder under patches/)."),
    pin: str = PIN_OPTION,
    tree: Path = TREE_OPTION,
    title: str = typer.Option(..., "--title", help="One line: what the series does."),
    why: str = typer.Option("", "--why", help="Why it is needed."),
    ref: list[str] = typer.Option([], "--ref", help="An upstream issue or PR, e.g. #41703 (repeatable)."),
    python_only: bool | None = typer.Option(None, "--python-only/--not-python-only",
                                     help="Default: python-only when the diff touches only .py files."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Start a new series from the tree's uncommitted diff (untracked files included)."""
    load_pins().get(pin)
    patch = diff_patch(tree, pin, title)
    result = new_series(writable_root() / "patches", name=name, pin=pin, patch=patch, title=title,
                        why=why, refs=ref, python_only=python_only)
    _print_refresh(result, json_out)


@patches_app.command("port")
def port_cmd(
    series: str | None = typer.Argument(None, help="Series to port (or --all)."),
    all_series: bool = typer.Option(False, "--all", help="Port every series of the order."),
    to: str = typer.Option(..., "--to", help="Pin to port to (add it first: `g4build pins add`)."),
    from_pin: str | None = typer.Option(None, "--from",
                                        help="Pin to port from (default: the nearest release with a variant)."),
    tree: Path | None = typer.Option(None, "--tree", help="The --to pin's source tree (default: its sdist).",
                                     file_okay=False, exists=True),
    dry_run: bool = typer.Option(False, "--dry-run", help="Report what would be written; write nothing."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Carry series from one pin to another: each patch applied, or merged three ways with the old pin's files, and
    rewritten for the new tree; a patch already there is dropped; a conflict stops with nothing written."""
    plan = plan_port(series, all_series=all_series, to=to, from_pin=from_pin, dry_run=dry_run)
    at_commit = None
    if tree is None:
        with _download_progress(plan.target.sdist.file, json_out) as hook:
            tree = fetch_source(plan.target, "sdist", progress=hook).path
        at_commit = pristine_commit(tree)  # the cached tree may carry applied patches on top

    def old_files(pin: str, paths: Sequence[str]) -> dict[str, bytes]:
        # the three-way merge's base and theirs: the old pin's own files, from its sha256-checked sdist
        the_pin = plan.pinset.get(pin)
        with _download_progress(the_pin.sdist.file, json_out) as hook:
            return pristine_files(the_pin, paths, progress=hook)

    ports = port(plan.stack, plan.chosen, to=to, from_pins=plan.from_pins, tree=tree, dry_run=dry_run,
                 pristine=old_files, at_commit=at_commit)
    not_tried = plan.not_tried(ports)
    if json_out:
        print_json({"to": to, "ok": all(p.ok for p in ports), "series": [p.to_dict() for p in ports],
                    "not_tried": not_tried})
    else:
        for p in ports:
            state = "written" if p.written else ("would be written" if p.ok else "not written")
            console.print(f"[bold]{p.series}[/] {p.from_pin} -> {p.to_pin}: {state}", highlight=False)
            for r in p.results:
                console.print(f"  {_paint(r.status)} {r.file}: {r.detail}", highlight=False)
            for rel, texts in p.lost_fingerprints.items():
                console.print(f"  [yellow]fingerprint lost[/] {rel}: {', '.join(texts)}", highlight=False)
    error = port_conflict_error(ports, to=to, not_tried=not_tried)
    if error is not None:
        raise error


def register(app: typer.Typer) -> None:
    """Add `g4build patches` to the root app."""
    app.add_typer(patches_app, name="patches")
