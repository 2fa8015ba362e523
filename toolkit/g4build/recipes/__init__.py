"""Launch recipes: YAML data -> checked -> PowerShell / bash scripts that start ``vllm serve`` exactly.

Public surface (used by the CLI and by ``g4build wheel --recipes``):

- ``load_recipe(name_or_path, sets=())``: read ``recipes/NAME.yaml`` (or a file), apply ``--set`` items.
- ``check_recipe(recipe, ctx)``: the rules' findings (``rules.py``); ``gather_context`` builds ``ctx``.
- ``render(recipe, shell, wheel=None, sets=())``: the script text for ``bash`` or ``powershell``.
- ``render_for_wheel(recipe, shell, wheel_path)``: the script that sits beside a built wheel and installs it.
- ``script_filename(name, shell)`` and ``write_script(text, path, shell)``: how and where to save it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from g4build.errors import ConfigError, RecipeError, UsageError
from g4build.pins.model import Pin
from g4build.recipes.cards import card_for, parse_cards, with_card_args
from g4build.recipes.context import gather_context
from g4build.recipes.env_names import fit_env_to_pin
from g4build.recipes.findings import WheelInfo
from g4build.recipes.flashinfer import FlashInferInfo
from g4build.recipes.gpu_guard import parse_kernel_archs
from g4build.recipes.model import Recipe, load_recipe_data, parse_recipe, recipe_names
from g4build.recipes.overrides import apply_overrides
from g4build.recipes.prefix_cache import fit_retention_to_pin
from g4build.recipes.render_bash import render_bash
from g4build.recipes.render_powershell import render_powershell
from g4build.recipes.rules import CheckContext, Finding, check, errors
from g4build.recipes.script import SHELLS, LaunchPlan, WheelRef, plan_launch, script_filename, write_script

__all__ = [
    "SHELLS",
    "CheckContext",
    "Finding",
    "Recipe",
    "WheelRef",
    "check_recipe",
    "gather_context",
    "load_recipe",
    "raise_on_errors",
    "recipe_names",
    "render",
    "render_for_wheel",
    "script_filename",
    "with_flashinfer_wheels",
    "with_kernel_archs",
    "write_script",
]


def load_recipe(name_or_path: str, sets: Sequence[str] = (), *, root: Path | None = None) -> Recipe:
    """The recipe after --set, with the row of its cards table for hardware.vram_gb applied under the --set."""
    data, path = load_recipe_data(name_or_path, root)
    recipe = parse_recipe(data, str(path), source=path)  # the file itself must be valid before --set is blamed
    cards = parse_cards(data.get("cards"), f"{path}.cards")
    tabled = [item for item in sets if item.partition("=")[0].split(".")[0].strip() == "cards"]
    if tabled:
        raise UsageError(f"--set {tabled[0].partition('=')[0]}: the cards table is the recipe's, expected a "
                         "--set of hardware.vram_gb (which picks a row) or of args.*",
                         hint="set args.* for your card; they win over its row")
    if sets:
        try:
            recipe = parse_recipe(apply_overrides(data, sets), f"{path} (after --set)", source=path)
        except ConfigError as exc:
            raise UsageError(exc.message, hint=exc.hint or "check the --set values") from exc
    card = card_for(cards, recipe.hardware.vram_gb)
    if card is None:
        return recipe
    # the card's args over the file's, then the user's --set over both (already checked above)
    carded = parse_recipe(apply_overrides(with_card_args(data, card), sets), f"{path} (cards.{card.vram_gb:g})",
                          source=path)
    return dataclasses.replace(carded, card=card.describe(carded.args))


def check_recipe(recipe: Recipe, ctx: CheckContext) -> tuple[Finding, ...]:
    return check(recipe, ctx)


def raise_on_errors(recipe: Recipe, findings: tuple[Finding, ...]) -> None:
    bad = errors(findings)
    if bad:
        listed = "; ".join(f"[{f.rule}] {f.message}" for f in bad)
        hints = "; ".join(f.hint for f in bad if f.hint)
        raise RecipeError(f"recipe '{recipe.name}' breaks {len(bad)} rule(s): {listed}", hint=hints or None)


def render_plan(plan: LaunchPlan, shell: str) -> str:
    if shell == "bash":
        return render_bash(plan)
    if shell == "powershell":
        return render_powershell(plan)
    raise UsageError(f"unknown shell '{shell}': expected one of {', '.join(SHELLS)}")


def render(recipe: Recipe, shell: str, *, wheel: WheelRef | None = None, sets: Sequence[str] = (),
           flashinfer: FlashInferInfo | None = None, pin: Pin | None = None) -> str:
    """The script text; ``sets`` only names the overridden keys in the header (apply them with load_recipe);
    ``flashinfer``: what the wheel says about FlashInfer (absent: its switches are set off in the script);
    ``pin``: the release whose serving environment the script checks before serving."""
    return render_plan(plan_launch(recipe, wheel=wheel, overrides=sets, flashinfer=flashinfer, pin=pin), shell)


def with_flashinfer_wheels(ref: WheelRef | None, wheel: Path | None, info: FlashInferInfo | None) -> WheelRef | None:
    """``ref`` plus the FlashInfer wheels the wheel's build recorded, which must lie beside it."""
    if ref is None or wheel is None or info is None or not info.wheels:
        return ref
    missing = [name for name in info.wheels if not (wheel.parent / name).is_file()]
    if missing:
        raise RecipeError(f"{wheel.name} was built with the FlashInfer wheels {', '.join(info.wheels)}: expected "
                          f"them beside it in {wheel.parent}, found no {', '.join(missing)}",
                          hint="copy them there (the build's --out folder has them), then render again")
    return dataclasses.replace(ref, companions=info.wheels)


def with_kernel_archs(ref: WheelRef | None, info: WheelInfo | None) -> WheelRef | None:
    """``ref`` with the GPU archs a g4build build of the wheel compiled for (its manifest's record, checked: a
    malformed one is a RecipeError), so the script stops on a GPU they cannot run on; unchanged for any other
    wheel (no record: the script only warns)."""
    if ref is None or info is None or info.kernel_arch_list is None:
        return ref
    where = f"{info.file}'s build-manifest.json (its arch list)"
    return dataclasses.replace(ref, kernel_archs=parse_kernel_archs(info.kernel_arch_list, where))


def render_for_wheel(recipe: Recipe | str, shell: str, wheel_path: Path) -> str:
    """The launch script to write beside ``wheel_path`` (as ``script_filename(recipe.name, shell)``).

    It installs the wheel from its own folder, then serves. The rules run first with the wheel's
    build-manifest.json in view (so a wheel missing a series the recipe's pin needs is refused):
    raises ``RecipeError`` on an error finding.
    """
    chosen = load_recipe(recipe) if isinstance(recipe, str) else recipe
    ctx = gather_context(chosen, wheel=wheel_path, ask_transformers=False)
    chosen, _ = fit_env_to_pin(chosen, ctx)
    chosen = fit_retention_to_pin(chosen, ctx)
    raise_on_errors(chosen, check(chosen, ctx))
    info = ctx.wheel.flashinfer if ctx.wheel is not None else None
    ref = with_flashinfer_wheels(WheelRef(path=wheel_path.name, beside_script=True), wheel_path, info)
    ref = with_kernel_archs(ref, ctx.wheel)
    return render(chosen, shell, wheel=ref, flashinfer=info, pin=ctx.pin)
