"""`g4build recipe` commands: list, show, check, render launch recipes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from g4build.cli._common import JSON_OPTION, console, err_console, print_json, require_wheel_file
from g4build.cli.outpaths import output_file, writing
from g4build.errors import RecipeError, UsageError
from g4build.pins.model import load_pins
from g4build.recipes import (
    Finding,
    check_recipe,
    gather_context,
    load_recipe,
    raise_on_errors,
    recipe_names,
    render,
    script_filename,
    with_flashinfer_wheels,
    with_kernel_archs,
    write_script,
)
from g4build.recipes.argv import serve_argv
from g4build.recipes.context import read_wheel_info
from g4build.recipes.env_names import fit_env_to_pin, user_env_names
from g4build.recipes.env_policy import asked_names
from g4build.recipes.model import Recipe
from g4build.recipes.prefix_cache import fit_retention_to_pin
from g4build.recipes.rules import flashinfer_presence
from g4build.recipes.script import absolute_path_sets, drafter_follows_model, shell_name, wheel_ref
from g4build.recipes.vllm_args import SetsCheck, check_sets
from g4build.recipes.wheelfit import arch_warning, platform_finding

recipe_app = typer.Typer(
    name="recipe",
    help="Launch recipes: check them and render PowerShell / bash scripts that start `vllm serve` exactly.",
    no_args_is_help=True,
)

SET_OPTION = typer.Option(
    None, "--set", metavar="KEY=VALUE",
    help="Change a recipe field (repeatable): model=PATH, env.NAME=TEXT, args.max-model-len=65536, "
    "speculative.num_speculative_tokens=15, args.quantization=null (removes it).",
)
ALLOW_ENV_OPTION = typer.Option(
    None, "--allow-env", metavar="NAME",
    help="Let the recipe (or --set env.NAME=) set this environment variable although it is not on the allow-list "
    "of recipes/vllm-args/launch-env.yaml (repeatable; named in the output). Names on its deny-list stay refused.",
)
_STYLE = {"error": "bold red", "warning": "yellow", "info": "dim"}


def _check_sets(recipe: Recipe, sets: list[str] | None) -> SetsCheck:
    """--set names and values against the recipe's pinned vLLM; when that cannot be done, say so on stderr."""
    result = check_sets(sets or (), recipe.pin)
    if result.note:
        err_console.print(f"[yellow]warning:[/] {escape(result.note)}", highlight=False)
    return result


def _pin_follows_wheel(name: str, wheel: Path | None, sets: list[str]) -> list[str]:
    """With --wheel and no --set pin=, the pin is the one the wheel's build-manifest.json names (a 0.33.0 wheel
    rendered for the recipe's 0.21.0 would demand torch and transformers it cannot run with). A pin the user sets
    is kept: rule_pin then refuses a mismatch (exit 11)."""
    if wheel is None or any(item.split("=", 1)[0].strip() == "pin" for item in sets):
        return sets
    pin = read_wheel_info(wheel).pin
    if pin is None or pin not in load_pins().pins or load_recipe(name).pin == pin:  # nothing to follow
        return sets
    err_console.print(f"note: pin {pin} follows the wheel's build-manifest.json (--set pin=NAME to name it)",
                      highlight=False, markup=False)
    return [f"pin={pin}", *sets]


def _follow_model(name: str, sets: list[str]) -> list[str]:
    """--set model= moves the drafter the recipe keeps beside the target too (see drafter_follows_model)."""
    if not any(item.startswith("model=") for item in sets):
        return sets
    moved, note = drafter_follows_model(load_recipe(name), sets)
    if note:
        err_console.print(f"note: {note}", highlight=False, markup=False)
    return moved


def _launch_sets(name: str, sets: list[str] | None) -> list[str]:
    """--set as the script applies it, the same for `show` and `render`: relative paths made absolute (the script
    must open the same folders wherever it is started), and the drafter moved with the target."""
    return _follow_model(name, absolute_path_sets(sets or ()))


def _print_findings(findings: tuple[Finding, ...], *, stderr: bool) -> None:
    target = err_console if stderr else console
    for f in findings:
        style = _STYLE[f.severity]
        target.print(f"[{style}]{f.severity}[/] {escape(f'[{f.rule}] {f.message}')}", highlight=False)
        if f.hint:
            target.print(f"    hint: {f.hint}", highlight=False, markup=False)


def _one_wheel(wheel: Path | None, extra: list[str]) -> None:
    """Words past the recipe's name: a shell pattern for --wheel (dist/vllm-0.33.0+*.whl) that matched several
    wheels arrives as --wheel FIRST plus the others. Refused with every match named and the newest (by
    modification time) suggested, not picked: which wheel a script installs must be the user's choice."""
    if not extra:
        return
    if wheel is not None and all(word.endswith(".whl") for word in extra):
        found = [str(wheel), *extra]
        newest = max(found, key=lambda p: os.path.getmtime(p) if os.path.isfile(p) else float("-inf"))
        raise UsageError(f"--wheel takes one wheel, found {len(found)} (a pattern that matched several?): "
                         f"{', '.join(found)}",
                         hint=f"name one, e.g. the newest: --wheel {newest} "
                              "(in bash --wheel \"$(ls -t PATTERN | head -n 1)\" picks the newest match)")
    raise UsageError(f"unexpected argument(s) {' '.join(extra)}: expected one recipe name and options",
                     hint="quote a value that holds spaces; `g4build recipe render --help` lists the options")


@recipe_app.command("list")
def list_cmd(as_json: bool = JSON_OPTION) -> None:
    """List the recipes under recipes/."""
    rows: list[dict[str, Any]] = []
    for name in recipe_names():
        r = load_recipe(name)
        rows.append({
            "name": r.name, "description": r.description, "model": r.model, "speculative": r.method,
            "pin": r.pin, "needs_series": list(r.needs_series),
            "hardware": {"vram_gb": r.hardware.vram_gb, "arch": r.hardware.arch},
        })
    if as_json:
        print_json(rows)
        return
    table = Table()
    table.add_column("recipe", no_wrap=True)
    for column in ("speculative", "hardware", "pin"):
        table.add_column(column, no_wrap=True)
    table.add_column("description")
    for row in rows:
        hw = f"{row['hardware']['arch']} {row['hardware']['vram_gb']:g} GB"
        table.add_row(row["name"], row["speculative"] or "-", hw, row["pin"] or "-", escape(row["description"]))
    console.print(table)


@recipe_app.command("show")
def show_cmd(name: str = typer.Argument(..., help="Recipe name or path to a recipe .yaml."),
             sets: list[str] = SET_OPTION, as_json: bool = JSON_OPTION) -> None:
    """Show a recipe after --set, with the exact env and vllm arguments it launches."""
    sets = _launch_sets(name, sets)
    r = load_recipe(name, sets)
    _check_sets(r, sets)
    data = {**r.to_dict(), "argv": ["vllm", *serve_argv(r)]}
    if as_json:
        print_json(data)
        return
    for key, value in r.env.items():
        console.print(f"{key}={value!r}", highlight=False, markup=False)
    console.print(" ".join(repr(w) for w in data["argv"]), highlight=False, markup=False, soft_wrap=True)


@recipe_app.command("check", context_settings={"allow_extra_args": True})
def check_cmd(
    words: typer.Context,
    name: str = typer.Argument(..., help="Recipe name or path to a recipe .yaml."),
    model_dir: Path | None = typer.Option(None, "--model-dir", help="Checkpoint folder: read its config.json."),
    draft_dir: Path | None = typer.Option(
        None, "--draft-dir", help="Drafter folder (default: speculative.model when it is a local folder)."),
    wheel: Path | None = typer.Option(None, "--wheel", help="A wheel to check: the series its manifest carries."),
    sets: list[str] = SET_OPTION,
    allow_env: list[str] = ALLOW_ENV_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Apply the rules (exit 11 when one fails); with --model-dir read the checkpoint's and drafter's config."""
    _one_wheel(wheel, list(words.args))
    allowed = asked_names(allow_env)
    if wheel is not None:
        require_wheel_file(wheel)
    sets = _pin_follows_wheel(name, wheel, sets or [])
    r = load_recipe(name, sets)
    checked = _check_sets(r, sets)
    ctx = gather_context(r, model_dir=model_dir, draft_dir=draft_dir, wheel=wheel, allow_env=allowed)
    r, fitted = fit_env_to_pin(r, ctx, user_env_names(sets or ()))
    r = fit_retention_to_pin(r, ctx)
    findings = (*fitted, *check_recipe(r, ctx))
    ok = not any(f.severity == "error" for f in findings)
    if as_json:
        print_json({
            "recipe": r.name,
            "ok": ok,
            "sets": checked.to_dict(),
            "findings": [f.to_dict() for f in findings],
            "model": ctx.target.to_dict() if ctx.target else None,
            "drafter": ctx.drafter.to_dict() if ctx.drafter else None,
            "wheel": None if ctx.wheel is None else {"file": ctx.wheel.file, "pin": ctx.wheel.pin,
                                                      "series": ctx.wheel.series},
            "flashinfer": flashinfer_presence(ctx).to_dict(),
        })
    else:
        _print_findings(findings, stderr=False)
        console.print(f"{r.name}: " + ("[green]ok[/]" if ok else "[bold red]fails[/]"), highlight=False)
    if not ok:  # typer.Exit(code) would be swallowed by the root's standalone_mode=False: raise ours
        count = sum(1 for f in findings if f.severity == "error")
        raise RecipeError(f"recipe '{r.name}' breaks {count} rule(s)", hint="see the findings above")


@recipe_app.command("render", context_settings={"allow_extra_args": True})
def render_cmd(
    words: typer.Context,
    name: str = typer.Argument(..., help="Recipe name or path to a recipe .yaml."),
    shell: str = typer.Option(..., "--shell", help="powershell (or pwsh) or bash, any case."),
    out: Path | None = typer.Option(None, "--out", help="Write NAME.ps1 / NAME.sh into this folder (else stdout)."),
    sets: list[str] = SET_OPTION,
    wheel: Path | None = typer.Option(
        None, "--wheel", help="Install this wheel before serving (referenced beside the script when in --out)."),
    allow_env: list[str] = ALLOW_ENV_OPTION,
) -> None:
    """Render a launch script: env, GPU check, optional wheel install, then `vllm serve` with exact arguments."""
    _one_wheel(wheel, list(words.args))
    chosen = shell_name(shell)
    allowed = asked_names(allow_env)
    if wheel is not None:
        require_wheel_file(wheel)
    sets = _pin_follows_wheel(name, wheel, _launch_sets(name, sets))
    r = load_recipe(name, sets)
    _check_sets(r, sets)
    ctx = gather_context(r, wheel=wheel, ask_transformers=False, allow_env=allowed)
    r, fitted = fit_env_to_pin(r, ctx, user_env_names(sets))
    r = fit_retention_to_pin(r, ctx)
    findings = (*fitted, *check_recipe(r, ctx))
    if ctx.wheel is not None and wheel is not None:
        fits = (platform_finding(wheel.name, chosen), arch_warning(ctx.wheel, r.hardware.arch, wheel.name, str(wheel)))
        findings = (*findings, *(f for f in fits if f is not None))
    _print_findings(tuple(f for f in findings if f.severity != "info"), stderr=True)
    raise_on_errors(r, findings)
    info = ctx.wheel.flashinfer if ctx.wheel is not None else None
    if out is not None:  # checked before any script is made; the wheel's reference keeps --out as typed
        output_file(out / script_filename(r.name, chosen), "--out")
    ref = with_kernel_archs(with_flashinfer_wheels(wheel_ref(wheel, out), wheel, info), ctx.wheel)
    text = render(r, chosen, wheel=ref, sets=sets, flashinfer=info, pin=ctx.pin)
    if out is None:
        typer.echo(text, nl=False)
        return
    with writing(out / script_filename(r.name, chosen), "--out"):
        path = write_script(text, out / script_filename(r.name, chosen), chosen)
    err_console.print(f"wrote {path}", highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""
    app.add_typer(recipe_app, name="recipe")
